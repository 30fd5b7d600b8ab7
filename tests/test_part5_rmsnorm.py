"""RMSNorm forward and backward beyond the generic reference check: the closed-form backward against autograd,
gradcheck in float64 through the interpreter, launch configurations (rows per program, number of groups),
determinism of the dw reduction, empty batches and clear refusal of bad input. bf16 and the headline size run
on the GPU only (``gpu`` marker)."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_close_within, assert_refuses

import snippets._checks as checks
from conftest import DEVICE, poison_allocator, skip_unavailable
from snippets.part5 import rmsnorm as rn


def _inputs(m, n, dtype=torch.float32, device=DEVICE, seed=0, shape=None):
    x, w, dy = rn._make_inputs_fwd_bwd({"m": m, "n": n}, dtype, device, torch.Generator().manual_seed(seed))
    if shape is not None:
        x, dy = x.reshape(shape), dy.reshape(shape)
    return x, w, dy


def _assert_close(out, ref, dtype, what):
    assert_close_within(out, ref, rn.TOLERANCES, dtype, what)


def _check_fwd_bwd(x, w, dy):
    outs = rn.rmsnorm_fwd_bwd_triton(x, w, dy)
    refs = rn.rmsnorm_fwd_bwd_ref(x.double(), w.double(), dy.double())
    for name, o, r in zip(("dx", "dw"), outs, refs):
        _assert_close(o, r, x.dtype, f"{name} {tuple(x.shape)} {x.dtype}")


def _bad_inputs(device):
    x = torch.randn(4, 8, device=device)
    w = torch.ones(8, device=device)
    return [
        ("float64 x", (x.double(), w), TypeError, "dtype"),
        ("int32 x", (x.int(), w.int()), TypeError, "dtype"),
        ("w of another dtype", (x, w.half()), TypeError, "w has dtype torch.float16"),
        ("w of the wrong length", (x, torch.ones(7, device=device)), ValueError, r"w must have shape \(8,\)"),
        ("w with a leading dimension", (x, w[None]), ValueError, r"w must have shape \(8,\)"),
        ("transposed x", (x.t(), torch.ones(4, device=device)), ValueError, "contiguous"),
        ("strided w", (x, torch.ones(16, device=device)[::2]), ValueError, "contiguous"),
        ("rows of length 0", (x[:, :0], w[:0]), ValueError, "length 0"),
        ("0-d x", (x[0, 0], w[:1]), ValueError, "at least one dimension"),
        ("not a tensor", (x.tolist(), w), TypeError, "torch.Tensor"),
    ]


# ---------------------------------------------------------------- reference and configs (no kernels)

@pytest.mark.op("rmsnorm")
def test_reference_matches_torch():
    x, w, _ = _inputs(7, 33, torch.float64, "cpu")
    torch.testing.assert_close(rn.rmsnorm_ref(x, w), torch.nn.functional.rms_norm(x, (33,), w, rn.EPS))


@pytest.mark.op("rmsnorm_fwd_bwd")
def test_closed_form_backward_matches_autograd():
    x, w, dy = _inputs(6, 19, torch.float64, "cpu", shape=(2, 3, 19))
    leaves = [t.clone().requires_grad_() for t in (x, w)]
    want = torch.autograd.grad(rn.rmsnorm_ref(*leaves), leaves, dy)
    for got, exp in zip(rn.rmsnorm_fwd_bwd_ref(x, w, dy), want):
        torch.testing.assert_close(got, exp)


@pytest.mark.op("rmsnorm")
@pytest.mark.parametrize("n", [1, 17, 1000, 1024, 1025, 4096, 16384, 65536])
def test_config_covers_the_row(n):
    block_n, cfg = rn.config_for(n)
    assert block_n >= n and block_n & (block_n - 1) == 0
    assert cfg.rows >= 1 and cfg.fwd_warps >= 1 and cfg.bwd_warps >= 1 and cfg.groups_per_sm >= 1
    assert cfg.rows * block_n <= max(4096, block_n), "a forward program holds at most one 4096-element tile"


@pytest.mark.op("rmsnorm_fwd_bwd")
def test_backward_groups():
    cpu = torch.device("cpu")
    assert rn.backward_groups(1, 64, cpu) == 1, "never more groups than rows"
    assert rn.backward_groups(10**6, 4096, cpu) == 4 * rn.CONFIGS[4096].groups_per_sm


# ---------------------------------------------------------------- Triton forward (CPU or GPU)

@pytest.mark.op("rmsnorm")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("m, n", [(1, 1), (2, 3), (7, 31), (64, 16), (3, 1024), (9, 1025), (1823, 21)])
def test_triton_forward(m, n, dtype, device):
    x, w, _ = _inputs(m, n, dtype, seed=m * n)
    poison_allocator(2 * x.numel() * x.element_size(), device)
    _assert_close(rn.rmsnorm_triton(x, w), rn.rmsnorm_ref(x.double(), w.double()), dtype, f"y ({m}, {n}) {dtype}")


@pytest.mark.op("rmsnorm")
def test_triton_forward_eps_and_zero_rows(device):
    """A row of zeros: rstd = 1/sqrt(eps), finite, and y = 0; a large eps changes the answer measurably."""
    x = torch.zeros(3, 40, device=device)
    w = torch.full((40,), 3.0, device=device)
    torch.testing.assert_close(rn.rmsnorm_triton(x, w), x)
    x = torch.randn(3, 40, device=device) * 1e-2
    y = rn.rmsnorm_triton(x, w, eps=1e-2)
    torch.testing.assert_close(y.double().cpu(), rn.rmsnorm_ref(x.double(), w.double(), eps=1e-2).cpu(),
                               rtol=1e-5, atol=1e-5)
    assert not torch.allclose(y, rn.rmsnorm_triton(x, w), atol=1e-2), "eps must reach the kernel"


@pytest.mark.op("rmsnorm")
def test_triton_forward_leading_dims_and_empty_batch(device):
    x, w, _ = _inputs(6, 24, shape=(2, 3, 24))
    y = rn.rmsnorm_triton(x, w)
    assert y.shape == (2, 3, 24)
    torch.testing.assert_close(y, rn.rmsnorm_triton(x.reshape(6, 24), w).reshape(2, 3, 24))
    torch.testing.assert_close(rn.rmsnorm_triton(x[0, 0], w), y[0, 0])  # a 1-D x is one row
    empty = rn.rmsnorm_triton(x[:0], w)
    assert empty.shape == (0, 3, 24) and empty.dtype == x.dtype


@pytest.mark.op("rmsnorm")
def test_triton_forward_rows_per_program(monkeypatch, device):
    """1000 rows of 64 at 16 rows a program (63 programs, the last holding 8 rows) and at 64 rows a program."""
    monkeypatch.setitem(rn.CONFIGS, 1024, rn.RowConfig(rows=1, fwd_warps=4, bwd_warps=4, groups_per_sm=1))
    assert rn.config_for(64)[1].rows == 16
    x, w, _ = _inputs(1000, 64, seed=2)
    want = rn.rmsnorm_ref(x.double(), w.double())
    _assert_close(rn.rmsnorm_triton(x, w), want, torch.float32, "y, 16 rows a program")
    monkeypatch.setitem(rn.CONFIGS, 1024, rn.RowConfig(rows=4, fwd_warps=4, bwd_warps=4, groups_per_sm=1))
    _assert_close(rn.rmsnorm_triton(x, w), want, torch.float32, "y, 64 rows a program")


@pytest.mark.op("rmsnorm")
@pytest.mark.parametrize("case", range(len(_bad_inputs("cpu"))))
def test_triton_refuses_bad_input(case, device):
    # the Function too: it accepts float64 x, but not with a float32 w
    assert_refuses(rn.rmsnorm_triton, _bad_inputs(device)[case], rn.RMSNormFunction.apply)


@pytest.mark.op("rmsnorm")
def test_triton_refuses_long_rows_and_other_devices(monkeypatch, device):
    x = torch.zeros(1, rn.MAX_N + 1, device=device)
    with pytest.raises(ValueError, match="do not fit in registers"):
        rn.rmsnorm_triton(x, x[0])
    monkeypatch.setattr(checks, "triton_interpreting", lambda: False)
    cpu = torch.zeros(2, 8)
    with pytest.raises(ValueError, match="cuda device"):
        rn.rmsnorm_triton(cpu, cpu[0])


# ---------------------------------------------------------------- Triton backward (CPU or GPU)

@pytest.mark.op("rmsnorm_fwd_bwd")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("m, n", [(1, 1), (1, 5), (4, 7), (37, 100), (9, 1025), (200, 33)])
def test_triton_backward(m, n, dtype, device):
    """M rows over 4 (interpreter SMs) x groups_per_sm groups: 1 row, fewer rows than groups, a short last
    group (37 rows), several rows per group (200)."""
    _check_fwd_bwd(*_inputs(m, n, dtype, seed=m + n))


@pytest.mark.op("rmsnorm_fwd_bwd")
@pytest.mark.parametrize("groups_per_sm", [1, 3, 64])
def test_triton_backward_any_number_of_groups(monkeypatch, groups_per_sm, device):
    monkeypatch.setitem(rn.CONFIGS, 1024, rn.RowConfig(rows=4, fwd_warps=4, bwd_warps=4, groups_per_sm=groups_per_sm))
    _check_fwd_bwd(*_inputs(150, 48, seed=groups_per_sm))


@pytest.mark.op("rmsnorm_fwd_bwd")
def test_triton_backward_matches_torch_autograd_fp32(device):
    """RMSNormFunction against PyTorch's rms_norm backward, with leading dimensions and a gradient arriving
    through a sum (an expanded, non-contiguous dy)."""
    x, w, dy = _inputs(12, 77, seed=3, shape=(3, 4, 77))
    ours = [t.clone().requires_grad_() for t in (x, w)]
    theirs = [t.clone().requires_grad_() for t in (x, w)]
    ((rn.RMSNormFunction.apply(*ours) * dy).sum() + rn.RMSNormFunction.apply(*ours).sum()).backward()
    ref = torch.nn.functional.rms_norm(theirs[0], (77,), theirs[1], rn.EPS)
    ((ref * dy).sum() + ref.sum()).backward()
    for a, t in zip(ours, theirs):
        torch.testing.assert_close(a.grad, t.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.op("rmsnorm_fwd_bwd")
@pytest.mark.parametrize("m, n", [(1, 3), (4, 6), (7, 13)])
def test_gradcheck_float64(m, n, device):
    x, w, _ = _inputs(m, n, torch.float64, seed=m * n)
    leaves = tuple(t.clone().requires_grad_() for t in (x, w))
    assert torch.autograd.gradcheck(lambda x, w: rn.RMSNormFunction.apply(x, w, rn.EPS), leaves,
                                    eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.op("rmsnorm_fwd_bwd")
def test_gradcheck_can_fail(monkeypatch, device):
    """A backward with the xhat * mean(g * xhat) term dropped: gradcheck must notice."""
    real = rn._rmsnorm_bwd

    def wrong(dy, x, w, rstd):
        dx, dw = real(dy, x, w, rstd)
        xhat = x * rstd[:, None]
        return dx + rstd[:, None] * xhat * (dy * w * xhat).mean(-1, keepdim=True), dw

    monkeypatch.setattr(rn, "_rmsnorm_bwd", wrong)
    x, w, _ = _inputs(3, 5, torch.float64, seed=1)
    leaves = tuple(t.clone().requires_grad_() for t in (x, w))
    assert not torch.autograd.gradcheck(lambda x, w: rn.RMSNormFunction.apply(x, w), leaves,
                                        raise_exception=False)


@pytest.mark.op("rmsnorm_fwd_bwd")
def test_backward_is_deterministic(device):
    x, w, dy = _inputs(300, 96, seed=4)
    first, second = rn.rmsnorm_fwd_bwd_triton(x, w, dy), rn.rmsnorm_fwd_bwd_triton(x, w, dy)
    assert all(torch.equal(a, c) for a, c in zip(first, second)), "fixed groups, fixed order: the same bits"


@pytest.mark.op("rmsnorm_fwd_bwd")
def test_forward_saves_only_x_w_and_rstd(device):
    x, w, _ = _inputs(5, 16)
    leaves = [t.clone().requires_grad_() for t in (x, w)]
    y = rn.RMSNormFunction.apply(*leaves)
    saved = y.grad_fn.saved_tensors
    assert len(saved) == 3 and saved[2].shape == (5,) and saved[2].dtype == torch.float32


@pytest.mark.op("rmsnorm_fwd_bwd")
def test_backward_empty_batch(device):
    x, w, dy = _inputs(3, 16)
    dx, dw = rn.rmsnorm_fwd_bwd_triton(x[:0], w, dy[:0])
    assert dx.shape == (0, 16) and torch.equal(dw, torch.zeros_like(w))


@pytest.mark.op("rmsnorm_fwd_bwd")
def test_fwd_bwd_refuses_bad_dy(device):
    x, w, dy = _inputs(3, 16)
    with pytest.raises(ValueError, match="dy has shape"):
        rn.rmsnorm_fwd_bwd_triton(x, w, dy[:2])
    with pytest.raises(TypeError, match="dy has dtype"):
        rn.rmsnorm_fwd_bwd_triton(x, w, dy.half())
    with pytest.raises(ValueError, match="contiguous"):
        rn.rmsnorm_fwd_bwd_triton(x, w, torch.randn(16, 3, device=device).t())


# ---------------------------------------------------------------- GPU only: bf16, headline, libraries

@pytest.mark.gpu
@pytest.mark.op("rmsnorm")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("m, n", [(1, 1), (5, 17), (123, 781), (64, 4096), (33, 8192), (4, 65536)])
def test_gpu_forward(m, n, dtype):
    x, w, _ = _inputs(m, n, dtype, "cuda", seed=n)
    poison_allocator(2 * x.numel() * x.element_size(), "cuda")
    _assert_close(rn.rmsnorm_triton(x, w), rn.rmsnorm_ref(x.double(), w.double()), dtype, f"y ({m}, {n}) {dtype}")


@pytest.mark.gpu
@pytest.mark.op("rmsnorm_fwd_bwd")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m, n", [(1, 1), (123, 781), (1000, 1024), (257, 4096), (40, 16384)])
def test_gpu_backward(m, n, dtype):
    _check_fwd_bwd(*_inputs(m, n, dtype, "cuda", seed=m))


@pytest.mark.gpu
@pytest.mark.op("rmsnorm_fwd_bwd")
def test_gpu_headline_fwd_bwd_and_determinism():
    """The headline, bf16: float64 closed-form gradients, dw no farther from them than twice eager PyTorch's
    error, and the same bits on a second run."""
    x, w, dy = _inputs(16384, 4096, torch.bfloat16, "cuda", seed=11)
    refs = rn.rmsnorm_fwd_bwd_ref(x.double(), w.double(), dy.double())
    ours = rn.rmsnorm_fwd_bwd_triton(x, w, dy)
    for name, o, r in zip(("dx", "dw"), ours, refs):
        _assert_close(o, r, torch.bfloat16, f"{name} headline")
    torch_err = (rn.rmsnorm_fwd_bwd_torch(x, w, dy)[1].double() - refs[1]).abs().max().item()
    assert (ours[1].double() - refs[1]).abs().max().item() <= max(2 * torch_err, 1e-2)
    assert all(torch.equal(a, c) for a, c in zip(ours, rn.rmsnorm_fwd_bwd_triton(x, w, dy)))


@pytest.mark.gpu
@pytest.mark.op("rmsnorm_fwd_bwd")
def test_gpu_fwd_bwd_peak_memory():
    """A training step through RMSNormFunction holds y, rstd, dx, dw and the (GROUPS, N) partials beyond its
    inputs: under 2.2 x the size of x at the headline (eager autograd's number is in the benchmark table)."""
    from snippets.bench.harness import peak_extra_bytes

    args = _inputs(16384, 4096, torch.bfloat16, "cuda", seed=1)
    assert peak_extra_bytes(rn.rmsnorm_fwd_bwd_triton, args) < 2.2 * args[0].nbytes


@pytest.mark.gpu
@pytest.mark.op("rmsnorm_fwd_bwd")
def test_gpu_liger_in_place_backward():
    """Liger-Kernel writes dx over dy: checked against a reference taken before the call."""
    if rn.liger_missing():
        skip_unavailable(rn.liger_missing())
    x, w, dy = _inputs(257, 4096, torch.bfloat16, "cuda", seed=5)
    refs = rn.rmsnorm_fwd_bwd_ref(x.double(), w.double(), dy.double())
    _assert_close(rn.rmsnorm_liger(x, w), rn.rmsnorm_ref(x.double(), w.double()), torch.bfloat16, "liger y")
    for name, o, r in zip(("dx", "dw"), rn.rmsnorm_fwd_bwd_liger(x, w, dy), refs):
        _assert_close(o, r, torch.bfloat16, f"liger {name}")


# ---------------------------------------------------------------- v4: v3 with w loaded before the sum

@pytest.mark.op("rmsnorm")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("m, n", [(1, 1), (7, 31), (3, 1024), (9, 1025), (1000, 64)])
def test_v4_is_v3_bit_for_bit(m, n, dtype, device):
    """The same arithmetic in the same order, and v3's launch table (rows per program included)."""
    from snippets.part5 import rmsnorm_v4 as r4

    x, w, _ = _inputs(m, n, dtype, device, seed=5)
    assert torch.equal(r4.rmsnorm_hoisted(x, w), rn.rmsnorm_triton(x, w))
    assert torch.equal(r4.rmsnorm_hoisted(x, w, eps=0.25), rn.rmsnorm_triton(x, w, eps=0.25))


@pytest.mark.op("rmsnorm")
def test_v4_loads_w_before_the_reduction():
    import inspect

    from snippets.part5 import rmsnorm_v4 as r4

    src = inspect.getsource(r4._rmsnorm_fwd_v4_kernel.fn)
    assert src.index("tl.load(w_ptr") < src.index("tl.sum(")


@pytest.mark.op("rmsnorm")
def test_v4_gives_gradients(device):
    """With a gradient to give, v4 takes v3's autograd path: x and w get theirs, as from the reference."""
    from snippets.part5 import rmsnorm_v4 as r4

    x, w, dy = _inputs(37, 100, device=device, seed=3)
    x.requires_grad_(True)
    w.requires_grad_(True)
    r4.rmsnorm_hoisted(x, w).backward(dy)
    want = rn.rmsnorm_fwd_bwd_ref(x.detach().double(), w.detach().double(), dy.double())
    _assert_close(x.grad, want[0], torch.float32, "dx through v4")
    _assert_close(w.grad, want[1], torch.float32, "dw through v4")


@pytest.mark.op("rmsnorm")
@pytest.mark.parametrize("case", range(len(_bad_inputs("cpu"))))
def test_v4_refuses_bad_input(case, device):
    from snippets.part5 import rmsnorm_v4 as r4

    assert_refuses(r4.rmsnorm_hoisted, _bad_inputs(device)[case])


@pytest.mark.op("rmsnorm")
def test_v4_launch_table():
    """v3's table but 8 warps a row at 8192 and 16384 elements."""
    from snippets.part5 import rmsnorm_v4 as r4

    for n in (1, 100, 1024, 2048, 4096, 32768, 65536):
        block_n, cfg = rn.config_for(n)
        assert r4.launch_config(n) == (block_n, cfg.rows, cfg.fwd_warps)
    assert r4.launch_config(8192) == (8192, 1, 8) and r4.launch_config(16384) == (16384, 1, 8)
    assert rn.config_for(16384)[1].fwd_warps == 16


@pytest.mark.op("rmsnorm")
@pytest.mark.parametrize("n", [5000, 16384])
def test_v4_long_rows(n, device):
    """Where v4's warps differ from v3's: against the float64 reference."""
    from snippets.part5 import rmsnorm_v4 as r4

    x, w, _ = _inputs(3, n, device=device, seed=4)
    _assert_close(r4.rmsnorm_hoisted(x, w), rn.rmsnorm_ref(x.double(), w.double()), torch.float32,
                  f"y, rows of {n}")
