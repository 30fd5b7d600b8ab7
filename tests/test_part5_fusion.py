"""Why fusion pays: bias + GELU + dropout + residual against a reference that reproduces the keep bits, the
check that replaces exact comparison for torch's own generator (and fails on outputs that are not this op), the
bytes model, horizontal fusion of two GEMVs, and the counter-example whose whole-row kernel spills on sm_90."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import triton

from conftest import HAS_GPU, poison_allocator
from snippets.part4.dropout import seeded_dropout4x
from snippets.part5 import fusion as f

CPU_DTYPES = [torch.float32, torch.float16]  # bf16 only on the GPU: the interpreter has no bf16 arithmetic
SHAPES = [(1, 1), (3, 17), (7, 123), (2, 1025), (5, 2049), (13, 781)]
TRITON = {"v2": f.bias_gelu_dropout_residual_unfused, "v3": f.bias_gelu_dropout_residual,
          "v4": f.bias_gelu_dropout_residual4x}
# the reference that reproduces each version's keep bits: v2 and v3 one Philox per element, v4 one per four
REFERENCE = {"v2": f.bias_gelu_dropout_residual_ref, "v3": f.bias_gelu_dropout_residual_ref,
             "v4": f.bias_gelu_dropout_residual4x_ref}


def _inputs(m, n, dtype, device, p=0.1, seed=1234):
    gen = torch.Generator().manual_seed(m * 1000 + n)
    x, bias, residual, _, _ = f._make_inputs({"m": m, "n": n}, dtype, device, gen)
    return x, bias, residual, p, seed


def _assert_exact(out, args, dtype, reference=f.bias_gelu_dropout_residual_ref):
    """Within the rounding tolerance of the float64 reference that uses the same keep bits."""
    ref = reference(*(a.double() if isinstance(a, torch.Tensor) else a for a in args))
    tol = f.tolerance(*args[:3], args[3], dtype)
    assert out.dtype == dtype and out.shape == args[0].shape
    assert not out.isnan().any(), "unwritten (NaN) outputs"
    err = (out.double() - ref).abs()
    assert (err <= tol).all(), f"max error over tolerance {float((err - tol).max()):.3g}"


# ---------------------------------------------------------------- the Triton versions, exactly

@pytest.mark.op("bias_gelu_dropout_residual")
@pytest.mark.parametrize("version", sorted(TRITON))
@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize("m, n", SHAPES)
def test_triton_versions_match_the_reference_mask(version, dtype, m, n, device):
    args = _inputs(m, n, dtype, device)
    poison_allocator(m * n * dtype.itemsize, device)
    _assert_exact(TRITON[version](*args), args, dtype, REFERENCE[version])


@pytest.mark.op("bias_gelu_dropout_residual")
def test_unfused_and_fused_drop_the_same_elements(device):
    args = _inputs(9, 1100, torch.float32, device, p=0.3, seed=2**40 + 5)
    a, b = f.bias_gelu_dropout_residual_unfused(*args), f.bias_gelu_dropout_residual(*args)
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_same_seed_same_output_other_seed_other_mask(device):
    args = _inputs(4, 1000, torch.float32, device)
    y1, y2 = f.bias_gelu_dropout_residual(*args), f.bias_gelu_dropout_residual(*args)
    assert torch.equal(y1, y2)
    y3 = f.bias_gelu_dropout_residual(*args[:4], args[4] + 1)
    assert (y1 != y3).sum() > 100  # about 2 p (1 - p) of 4000 elements differ


@pytest.mark.parametrize("version", sorted(TRITON))
def test_p_zero_keeps_everything_and_p_one_returns_the_residual(version, device):
    x, bias, residual, _, seed = _inputs(3, 300, torch.float32, device)
    fn = TRITON[version]
    torch.testing.assert_close(fn(x, bias, residual, 0.0, seed), residual + F.gelu(x + bias), rtol=1e-6, atol=1e-6)
    assert torch.equal(fn(x, bias, residual, 1.0, seed), residual)


def test_empty_input_gives_empty_output(device):
    x = torch.empty(0, 64, device=device)
    for fn in TRITON.values():
        assert fn(x, torch.zeros(64, device=device), x.clone(), 0.1, 0).shape == (0, 64)


# ---------------------------------------------------------------- v4: one Philox evaluation per four elements

# N % 4 == 0 takes v4's path of one tl.rand4x per four columns, any other N the path of one call per element;
# around one tile (1024 columns), odd M (tiles of 2 rows), one group of four
V4_SHAPES = [(1, 4), (3, 8), (5, 1028), (3, 2048), (7, 3076), (2, 1022), (9, 18), (4, 4097)]
V4_SEEDS = [0, 2**31 - 1, 2**40 + 5, 2**62 + 3]  # int32 and int64 seeds, a key with a high word


def _positive_chain(m, n, device, dtype=torch.float32):
    """x + bias >= 1 and residual 0: a kept element is gelu(x + b) / (1 - p) > 0.8, a dropped one exactly
    0 + 0, so the output's non-zeros are the keep mask."""
    g = torch.Generator().manual_seed(m * 7 + n)
    x = (1.0 + torch.rand(m, n, generator=g)).to(device=device, dtype=dtype)
    bias = torch.rand(n, generator=g).to(device=device, dtype=dtype)
    return x, bias, torch.zeros_like(x)


@pytest.mark.op("bias_gelu_dropout_residual")
@pytest.mark.parametrize("seed", V4_SEEDS)
@pytest.mark.parametrize("m, n", V4_SHAPES)
def test_v4_keep_bits_are_the_numpy_philox_bit_for_bit(m, n, seed, device):
    """Element i = row * N + col is kept exactly when word i % 4 of the NumPy Philox at counter i // 4 is
    >= p: a wrong word order, a counter off by a row or a group, would flip some of these bits."""
    x, bias, residual = _positive_chain(m, n, device)
    poison_allocator(m * n * 4, device)
    kept = f.bias_gelu_dropout_residual4x(x, bias, residual, 0.5, seed) != 0
    assert torch.equal(kept.cpu(), f.keep4x_ref(seed, 0.5, (m, n)))


@pytest.mark.op("bias_gelu_dropout_residual")
@pytest.mark.parametrize("m, n", [(3, 1028), (5, 123)])
def test_v4_draws_part4_dropout_v3s_stream_not_v3s(m, n, device):
    """v4's mask is Part 4's dropout v3 applied to the flattened tensor, and not the mask of v3 (which draws
    one Philox per element): about 2 p (1 - p) of the elements differ."""
    x, bias, residual = _positive_chain(m, n, device)
    p, seed = 0.3, 77
    kept = (f.bias_gelu_dropout_residual4x(x, bias, residual, p, seed) != 0).cpu()
    dropout_v3 = seeded_dropout4x(torch.ones(m * n, device=device), p, seed) != 0
    assert torch.equal(kept.view(-1), dropout_v3.cpu())
    kept_v3 = (f.bias_gelu_dropout_residual(x, bias, residual, p, seed) != 0).cpu()
    assert (kept != kept_v3).float().mean() > p * (1 - p)  # 2 p (1 - p) = 0.42 expected


@pytest.mark.op("bias_gelu_dropout_residual")
@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize("m, n", V4_SHAPES)
def test_v4_matches_its_reference(m, n, dtype, device):
    args = _inputs(m, n, dtype, device, p=0.2, seed=2**40 + 5)
    poison_allocator(m * n * dtype.itemsize, device)
    _assert_exact(f.bias_gelu_dropout_residual4x(*args), args, dtype, f.bias_gelu_dropout_residual4x_ref)


@pytest.mark.op("bias_gelu_dropout_residual")
@pytest.mark.parametrize("p", [0.0, 0.999, 1.0])
@pytest.mark.parametrize("m, n", [(4, 4096), (3, 4095)])
def test_v4_at_the_edges_of_p(p, m, n, device):
    """p = 0 keeps every element, p = 0.999 a dozen or so of 12K (each one where the reference keeps it),
    p = 1 returns the residual exactly."""
    args = _inputs(m, n, torch.float32, device, p=p, seed=12345)
    y = f.bias_gelu_dropout_residual4x(*args)
    _assert_exact(y, args, torch.float32, f.bias_gelu_dropout_residual4x_ref)
    kept = f.keep4x_ref(12345, p, (m, n))
    if p == 0.0:
        assert kept.all()
    elif p == 1.0:
        assert not kept.any() and torch.equal(y, args[2])
    else:
        assert 0 < int(kept.sum()) < 60
        x, bias, residual = _positive_chain(m, n, device)
        assert torch.equal((f.bias_gelu_dropout_residual4x(x, bias, residual, p, 12345) != 0).cpu(), kept)


@pytest.mark.op("bias_gelu_dropout_residual")
@pytest.mark.parametrize("m, n", [(3, 1028), (2, 8)])
def test_v4_both_paths_draw_the_same_numbers(m, n, device):
    """On an N that is a multiple of 4, the one-call-per-element path (the one a ragged N takes) gives the
    same output bit for bit as the one-call-per-four path."""
    x, bias, residual, p, seed = _inputs(m, n, torch.float32, device, p=0.4, seed=2**33 + 1)
    fast = f.bias_gelu_dropout_residual4x(x, bias, residual, p, seed)
    slow = torch.full_like(x, float("nan"))
    grid = (triton.cdiv(m, f.BLOCK_M), triton.cdiv(n, f.BLOCK_N))
    f._bias_gelu_dropout_residual4x_kernel[grid](x, bias, residual, slow, m, n, p, 1 / (1 - p), seed,
                                                 BLOCK_M=f.BLOCK_M, BLOCK_N=f.BLOCK_N, ROWS_OF_FOURS=False,
                                                 num_warps=f.NUM_WARPS)
    assert torch.equal(fast, slow)


@pytest.mark.op("bias_gelu_dropout_residual")
def test_v4_makes_a_quarter_of_v3s_philox_multiplies_on_sm90():
    """Compiled for sm_90 as the headline launches them (Triton of this machine): v3 forms the high half of a
    32-bit product 17 times per element (a full evaluation is 20; the compiler drops the products only the
    three unused words need), v4 4.75 with Triton 3.9 and 4.875 with 3.6 (19 per evaluation, one evaluation
    per four elements). Neither spills and both keep 16-byte loads and stores; a ragged N costs v4 a full
    evaluation per element."""
    for dtype in (torch.float32, torch.bfloat16):
        rep = f.philox_report(dtype)
        v3, v4, ragged = rep["v3"], rep["v4"], rep["v4 ragged N"]
        assert 15 <= v3["philox_per_element"] <= 20.5, rep
        assert 4 <= v4["philox_per_element"] <= 5.25 and 3 * v4["philox_per_element"] < v3["philox_per_element"], rep
        assert 15 <= ragged["philox_per_element"] <= 20.5, rep
        for r in (v3, v4, ragged):
            assert r["spill_stores"] == 0, rep
        assert 128 in v4["widths"]["ld"] and v4["widths"]["st"] == {128}, rep
        assert v4["registers"] <= v3["registers"], rep


def test_philox_high_products_reads_the_multipliers_from_ptx():
    """Every mul.hi.u32 counts (Triton 3.6 keeps the multiplier in a register); a 64-bit product only by a
    Philox multiplier (an address computation multiplies by an element size); low halves never."""
    ptx = """
        mul.hi.u32 \t%r5, %r4, -766435501;
        mul.hi.u32 \t%r8, %r9, %r10;
        mul.lo.s32 \t%r6, %r4, -766435501;
        mul.wide.u32 \t%rd3, %r7, -845247145;
        mul.wide.u32 \t%rd5, %r7, 2;
        mad.wide.u32 \t%rd6, %r7, 4, %rd1;
        mul.lo.s64 \t%rd4, %rd2, 3528531795;
        mul.lo.s64 \t%rd7, %rd2, %rd8;
        // mul.hi.u32 in a comment"""
    assert f.philox_high_products(ptx) == 4


# ---------------------------------------------------------------- the check used for torch's generator

@pytest.mark.op("bias_gelu_dropout_residual")
@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
def test_torch_eager_passes_the_check(dtype):
    args = _inputs(20, 500, dtype, "cpu")
    f.check_bias_gelu_dropout_residual(f.bias_gelu_dropout_residual_torch(*args), args, dtype)


def test_check_refuses_a_wrong_keep_rate(device):
    args = _inputs(20, 500, torch.float32, device)
    everything_kept = f.bias_gelu_dropout_residual(*args[:3], 0.0, args[4])  # valid values, p = 0 instead of 0.1
    with pytest.raises(AssertionError, match="neither"):  # kept values are not scaled by 1/(1 - 0.1)
        f.check_bias_gelu_dropout_residual(everything_kept, args, torch.float32)
    nothing_kept = args[2].clone()
    with pytest.raises(AssertionError, match="kept 0 of"):
        f.check_bias_gelu_dropout_residual(nothing_kept, args, torch.float32)


def test_check_refuses_a_wrong_value_and_nan(device):
    args = _inputs(20, 500, torch.float32, device)
    y = f.bias_gelu_dropout_residual(*args)
    bad = y.clone()
    bad[3, 7] += 0.25
    with pytest.raises(AssertionError, match="neither"):
        f.check_bias_gelu_dropout_residual(bad, args, torch.float32)
    bad = y.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(AssertionError, match="NaN"):
        f.check_bias_gelu_dropout_residual(bad, args, torch.float32)
    forgot_bias = f.bias_gelu_dropout_residual(args[0], torch.zeros_like(args[1]), *args[2:])
    with pytest.raises(AssertionError, match="neither"):
        f.check_bias_gelu_dropout_residual(forgot_bias, args, torch.float32)


# ---------------------------------------------------------------- bad input

def _ok(device="cpu"):
    return _inputs(4, 32, torch.float32, device)


@pytest.mark.parametrize("version", ["v0", *sorted(TRITON)])
@pytest.mark.parametrize("change, exc, match", [
    (lambda a: (a[0].long(), *a[1:]), TypeError, "dtype torch.int64"),
    (lambda a: (a[0], a[1].half(), *a[2:]), TypeError, "bias has dtype torch.float16"),
    (lambda a: (a[0], a[1][:31], *a[2:]), ValueError, r"bias must have shape \(32,\)"),
    (lambda a: (a[0], a[1], a[2][:3], *a[3:]), ValueError, "residual has shape"),
    (lambda a: (a[0].t().contiguous().t(), *a[1:]), ValueError, "contiguous"),
    (lambda a: (a[0].reshape(-1), a[1], a[2].reshape(-1), *a[3:]), ValueError, "2-D"),
    (lambda a: (*a[:3], 1.5, a[4]), ValueError, r"p must be in \[0, 1\]"),
    (lambda a: (*a[:3], float("nan"), a[4]), ValueError, "p must be"),
    (lambda a: (*a[:3], "0.1", a[4]), TypeError, "p must be a Python int or float"),
    (lambda a: (*a[:4], -1), ValueError, "seed must be >= 0"),
    (lambda a: (*a[:4], 2**63), ValueError, "below 2\\*\\*63"),
    (lambda a: (*a[:4], 1.0), TypeError, "seed must be a Python int"),
])
def test_bad_input_is_refused(version, change, exc, match, device):
    fn = {"v0": f.bias_gelu_dropout_residual_torch, **TRITON}[version]
    with pytest.raises(exc, match=match):
        fn(*change(_ok(device)))


@pytest.mark.skipif(HAS_GPU, reason="the interpreter's device (cpu) is the one tested here")
def test_wrong_device_is_refused():
    x, bias, residual, p, seed = _ok()
    with pytest.raises(ValueError, match="must be on a cpu device"):
        f.bias_gelu_dropout_residual(x.to("meta"), bias, residual, p, seed)
    with pytest.raises(ValueError, match="must be on a cpu device"):
        f.bias_gelu_dropout_residual_unfused(x, bias.to("meta"), residual, p, seed)
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        f.bias_gelu_dropout_residual_torch(x.numpy(), bias, residual, p, seed)


# ---------------------------------------------------------------- the bytes model

def test_chain_bytes_counts_every_round_trip():
    m, n, s = 1000, 300, 2
    c = f.chain_bytes(m, n, s, bandwidth_gbs=1000.0)
    e = m * n
    assert [b for _, b in c.steps] == [(2 * e + n) * s, 2 * e * s, 2 * e * s, 3 * e * s]
    assert c.unfused_bytes == (9 * e + n) * s and c.fused_bytes == (3 * e + n) * s and c.launches == 4
    assert c.unfused_s == pytest.approx(c.unfused_bytes / 1e12) and c.fused_s == pytest.approx(c.fused_bytes / 1e12)
    assert 2.99 < f.chain_bytes(16384, 8192, 2, 4800.0).ratio < 3.0
    with_mask = f.chain_bytes(m, n, s, 1000.0, mask_bytes=1)
    assert with_mask.unfused_bytes - c.unfused_bytes == e


def test_cost_model_is_the_fused_traffic():
    size = f.HEADLINE
    for dtype in (torch.bfloat16, torch.float32):
        assert f.fused_op.bytes_moved(size, dtype) == f.chain_bytes(size["m"], size["n"], dtype.itemsize, 1.0).fused_bytes  # noqa: E501


# ---------------------------------------------------------------- horizontal fusion

@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize("m, n", [(1, 1), (17, 300), (33, 513)])
def test_gemv_pair_matches_two_products(dtype, m, n, device):
    g = torch.Generator().manual_seed(m + n)
    a, u, v = (torch.randn(*s, generator=g).to(device=device, dtype=dtype) for s in ((m, n), (n,), (n,)))
    yu, yv = f.gemv_pair(a, u, v)
    tol = dict(rtol=1e-5, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-3, atol=2e-2)
    torch.testing.assert_close(yu.double(), a.double() @ u.double(), **tol)
    torch.testing.assert_close(yv.double(), a.double() @ v.double(), **tol)
    torch.testing.assert_close(f.gemv(a, u), yu, rtol=0, atol=0)  # the same sums in the same order


def test_gemv_refuses_mismatched_vectors(device):
    a = torch.randn(4, 8, device=device)
    with pytest.raises(ValueError, match="each vector"):
        f.gemv_pair(a, torch.randn(8, device=device), torch.randn(7, device=device))


def test_horizontal_bytes_saves_one_read_of_a():
    two, one = f.horizontal_bytes(4096, 4096, 2)
    assert two - one == 4096 * 4096 * 2  # exactly one read of A
    assert 1.99 < two / one < 2.0


# ---------------------------------------------------------------- when not to fuse

COUNTER = {"v0": f.standardize_torch, "v1": f.standardize_two_kernels, "v2": f.standardize_whole_row,
           "v3": f.standardize_two_loops}


@pytest.mark.op("fusion_counterexample")
@pytest.mark.parametrize("version", sorted(COUNTER))
@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize("m, n", [(1, 1), (2, 4095), (3, 4097), (5, 8193), (11, 781)])
def test_counterexample_versions_agree(version, dtype, m, n, device):
    (x,) = f._counter_inputs({"m": m, "n": n}, dtype, device, torch.Generator().manual_seed(n))
    poison_allocator(x.numel() * x.element_size(), device)
    rtol, atol = f.counter_op.tolerance(dtype)
    torch.testing.assert_close(COUNTER[version](x).double(), f.standardize_ref(x.double()), rtol=rtol, atol=atol)


def test_counterexample_statistics_survive_a_large_mean(device):
    """sum(x^2) - N mean^2 would lose every digit here; the chunk-merged statistics do not."""
    x = (1e4 + torch.randn(3, 9000, generator=torch.Generator().manual_seed(0))).to(device)
    for fn in (f.standardize_two_kernels, f.standardize_two_loops):
        torch.testing.assert_close(fn(x).double(), f.standardize_ref(x.double()), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("fn", list(COUNTER.values()), ids=list(COUNTER))
def test_counterexample_refuses_bad_input(fn, device):
    with pytest.raises(ValueError, match="2-D"):
        fn(torch.randn(8, device=device))
    with pytest.raises(TypeError, match="dtype torch.int32"):
        fn(torch.ones(2, 8, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="empty"):
        fn(torch.empty(0, 8, device=device))
    with pytest.raises(ValueError, match="contiguous"):
        fn(torch.randn(8, 4, device=device).t())


@pytest.mark.op("fusion_counterexample")
def test_whole_row_kernel_spills_on_sm90_and_the_chunked_ones_do_not():
    """The mechanism behind the counter-example, from ptxas: at 128K columns the whole-row kernel runs 32
    warps (1024 threads), ptxas caps it at 64 registers a thread (64K per SM / 1024) and each thread must hold
    128 values: it spills. At 8K columns it fits. The chunked kernels hold one chunk at any N."""
    wide, narrow = f.spill_report(131072), f.spill_report(8192)
    v2 = wide["v2 whole row"]
    assert v2["threads"] == 1024 and v2["registers"] <= 64
    assert v2["spill_stores"] > 1000 and v2["spill_loads"] > 1000, v2
    assert narrow["v2 whole row"]["spill_stores"] == 0, narrow
    for name in ("v1 statistics", "v1 apply", "v3 two loops"):
        assert wide[name]["spill_stores"] == 0 and wide[name] == narrow[name], (name, wide[name], narrow[name])


# ---------------------------------------------------------------- GPU only

@pytest.mark.gpu
@pytest.mark.parametrize("version", sorted(TRITON))
@pytest.mark.parametrize("m, n", [(3, 17), (37, 8192), (1000, 1823)])
def test_bf16_matches_the_reference_mask_on_gpu(version, m, n):
    args = _inputs(m, n, torch.bfloat16, "cuda")
    _assert_exact(TRITON[version](*args), args, torch.bfloat16, REFERENCE[version])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_torch_compile_passes_the_check_on_gpu(dtype):
    args = _inputs(256, 4096, dtype, "cuda")
    f.check_bias_gelu_dropout_residual(f.bias_gelu_dropout_residual_compiled(*args), args, dtype)


@pytest.mark.gpu
def test_fused_allocates_only_its_output_on_gpu():
    args = _inputs(1024, 4096, torch.bfloat16, "cuda")
    out_bytes = 1024 * 4096 * 2
    for fn, most in ((f.bias_gelu_dropout_residual, out_bytes), (f.bias_gelu_dropout_residual4x, out_bytes),
                     (f.bias_gelu_dropout_residual_unfused, 4 * out_bytes)):
        fn(*args)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn(*args)
        torch.cuda.synchronize()
        assert torch.cuda.max_memory_allocated() - before <= most
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    f.bias_gelu_dropout_residual_unfused(*args)
    assert torch.cuda.max_memory_allocated() - before >= 2 * out_bytes  # intermediates were materialized


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("m, n", [(1024, 8192), (513, 1822)])
def test_v4_keep_bits_are_the_numpy_philox_on_gpu(dtype, m, n):
    """The compiled kernel (both paths, 16-byte vectors) keeps exactly the reference's elements."""
    x, bias, residual = _positive_chain(m, n, "cuda", dtype)
    kept = f.bias_gelu_dropout_residual4x(x, bias, residual, 0.1, 2**40 + 5) != 0
    assert torch.equal(kept.cpu(), f.keep4x_ref(2**40 + 5, 0.1, (m, n)))
