"""No book function drops gradients silently (issue 15).

A kernel launched from Python writes its output outside autograd. Called on inputs that require
grad, it returns a tensor that does not, and a loss built on it backpropagates without an error
but without the op: in a residual block ``rmsnorm(x, w) + x``, ``w.grad`` stays None and ``x.grad``
misses the norm's share. So every book version of every registered op, called with grad mode on
and floating-point inputs that require grad, must either

- refuse before it launches: a ``RuntimeError`` whose message names the problem (``grad``), as
  ``snippets._checks.refuse_grad`` raises for forward-only kernels and for forward + backward steps
  (whose returned gradients autograd cannot differentiate); or
- train: its outputs require grad, and a backward with a random upstream gradient gives the input
  gradients of the op's reference through torch autograd (in float64), within the tolerance of the
  op's forward + backward twin where it has one (else of the op) at that dtype.

Each version is tried with every floating-point input requiring grad and, where there are
several, with each one alone (``w`` alone is the residual block's case for a weight; a RoPE table
alone must be refused even though q and k train). Under ``torch.no_grad()`` the same inputs must
run and match the reference, and inputs that do not require grad must never be refused. Triton
versions run on the CPU under the interpreter; CUDA C and other GPU-only versions are marked
``gpu``.
"""

from __future__ import annotations

import pytest
import torch
from helpers import assert_matches_reference

from conftest import HAS_GPU
from snippets.bench.harness import as_tuple
from snippets.op_index import load_all
from snippets.registry import size_key

OPS = load_all()
# tried first: fp32 gives the gradient check its tightest tolerance; fp16 next (the interpreter has
# no bf16 arithmetic)
DTYPE_ORDER = (torch.float32, torch.float16, torch.bfloat16)
# the version whose gradients the op's are compared within the tolerance of, where it is not
# "<op>_fwd_bwd"
TWINS = {"flash_attention_fwd": "flash_attention_bwd"}


def _dtype(op, impl) -> torch.dtype | None:
    """The dtype a version is tried at: fp32 if it takes it, else fp16, bf16, then any floating
    dtype (fp8); None for a version with integer inputs only (nothing of it can require grad)."""
    dtypes = [d for d in op.dtypes if impl.supports(d) and d.is_floating_point]
    for d in DTYPE_ORDER:
        if d in dtypes:
            return d
    return dtypes[0] if dtypes else None


CASES = []
for op in OPS.values():
    for impl in op.impls.values():
        if impl.origin != "book":
            continue
        dtype = _dtype(op, impl)
        marks = [] if impl.runs_on("cpu") else [pytest.mark.gpu]
        for size in op.test_sizes[:2]:  # the two smallest: some first sizes are a single element
            ident = f"{op.name}-{impl.name}-{str(dtype)[6:]}-{size_key(size)}"
            CASES.append(pytest.param(op, impl, dtype, size, id=ident, marks=marks))


def _run_on(impl) -> str:
    return "cuda" if HAS_GPU and impl.runs_on("cuda") else "cpu"


def _inputs(op, impl, dtype, size):
    gen = torch.Generator().manual_seed(1234)
    return op.make_inputs(size, dtype, impl.input_device(_run_on(impl)), gen)


def _floating(args) -> list[int]:
    return [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.is_floating_point()]


def _subsets(args) -> list[tuple[int, ...]]:
    """Which inputs require grad, case by case: all the floating-point ones, then each alone."""
    idx = _floating(args)
    return [tuple(idx)] + ([(i,) for i in idx] if len(idx) > 1 else [])


def _tolerance(op, dtype) -> tuple[float, float]:
    twin = OPS.get(TWINS.get(op.name, f"{op.name}_fwd_bwd"))
    return (twin or op).tolerance(dtype)


def _skip_if_unavailable(op, impl, dtype):
    if dtype is None:
        pytest.skip(f"{op.name} {impl.name}: integer inputs only, none can require grad")
    reason = impl.unavailable()
    if reason:
        pytest.skip(f"{op.name} {impl.name}: {reason}")


def check_refuses_or_trains(op, impl, dtype, args, chosen) -> str:
    """Call ``impl`` with grad mode on and ``args[i]`` requiring grad for i in ``chosen``; assert
    it refused (a RuntimeError about grad) or trained like the reference. Returns "refused" or
    "trained"."""
    what = f"{op.name} {impl.name} {dtype}, grad on inputs {list(chosen)}"
    leaves = {i: args[i].detach().requires_grad_() for i in chosen}
    call = [leaves.get(i, a) for i, a in enumerate(args)]
    # the reference first, on float64 copies (no version that trains writes over its inputs, but
    # one that refuses too late might)
    ref_leaves = {i: args[i].detach().double().requires_grad_() for i in chosen}
    ref_args = [ref_leaves.get(i, a.double() if i in _floating(args) else a)
                for i, a in enumerate(args)]
    with torch.enable_grad():
        refs = as_tuple(op.reference(*ref_args))
        try:
            out = impl.fn(*call)
        except RuntimeError as e:
            assert "grad" in str(e), f"{what}: a RuntimeError that does not say why: {e}"
            return "refused"
        outs = as_tuple(out)
        assert len(outs) == len(refs), f"{what}: {len(outs)} outputs, the reference has {len(refs)}"
        assert any(isinstance(o, torch.Tensor) and o.requires_grad for o in outs), \
            f"{what}: returned outputs that do not require grad (the gradient is silently dropped)"
        gen = torch.Generator().manual_seed(7)
        loss, ref_loss = 0.0, 0.0
        for i, (o, r) in enumerate(zip(outs, refs)):
            if not (isinstance(r, torch.Tensor) and r.is_floating_point()):
                continue
            assert not r.requires_grad or o.requires_grad, \
                f"{what}: output {i} does not require grad, its reference does"
            dy = torch.randn(r.shape, generator=gen, dtype=torch.float64).to(r.device)
            if o.requires_grad:
                loss = loss + (o.double() * dy.to(o.device)).sum()
            if r.requires_grad:
                ref_loss = ref_loss + (r * dy).sum()
        grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
        ref_grads = (torch.autograd.grad(ref_loss, list(ref_leaves.values()), allow_unused=True)
                     if isinstance(ref_loss, torch.Tensor) else [None] * len(ref_leaves))
    rtol, atol = _tolerance(op, dtype)
    for i, g, ref, leaf in zip(chosen, grads, ref_grads, ref_leaves.values()):
        g = torch.zeros(leaf.shape, dtype=torch.float64) if g is None else g.double().cpu()
        ref = torch.zeros_like(leaf) if ref is None else ref
        ref = ref.cpu()
        torch.testing.assert_close(g, ref, rtol=rtol, atol=atol * max(1.0, ref.abs().max().item()),
                                   msg=lambda m: f"{what}: gradient of input {i}: {m}")
    return "trained"


@pytest.mark.parametrize("op, impl, dtype, size", CASES)
def test_refuses_or_trains_like_the_reference(op, impl, dtype, size):
    _skip_if_unavailable(op, impl, dtype)
    args = _inputs(op, impl, dtype, size)
    for chosen in _subsets(args):
        check_refuses_or_trains(op, impl, dtype, _inputs(op, impl, dtype, size), chosen)


@pytest.mark.parametrize("op, impl, dtype, size",
                         [c for c in CASES if c.values[3] == c.values[0].test_sizes[0]])
def test_no_grad_and_plain_inputs_run(op, impl, dtype, size):
    """Under torch.no_grad() inputs that require grad are only data: the version runs and matches
    the reference. With grad mode on, inputs that do not require grad are never refused, and the
    output does not require grad."""
    _skip_if_unavailable(op, impl, dtype)
    args = _inputs(op, impl, dtype, size)
    with_grad = [a.detach().requires_grad_() if i in _floating(args) else a
                 for i, a in enumerate(args)]
    with torch.no_grad():
        assert_matches_reference(op, impl, tuple(with_grad), dtype)
    with torch.enable_grad():
        outs = as_tuple(impl.fn(*_inputs(op, impl, dtype, size)))
    assert not any(isinstance(o, torch.Tensor) and o.requires_grad for o in outs)


def test_some_versions_train_and_some_refuse():
    """The walk above is not vacuous: the versions with an autograd.Function train, the
    forward-only kernels refuse (on the CPU, under the interpreter)."""
    seen = {}
    for name, version in [("rmsnorm", "v3"), ("layernorm", "v3"), ("swiglu", "v3"),
                          ("rope", "v3"), ("flash_attention_fwd", "v2"), ("lora_linear", "v2"),
                          ("lora_linear", "v3"), ("dropout", "v1"), ("softmax", "v4"),
                          ("matmul", "v1"), ("rmsnorm_fwd_bwd", "v3"), ("cross_entropy", "v4")]:
        op, impl = OPS[name], OPS[name].impls[version]
        dtype = _dtype(op, impl)
        args = _inputs(op, impl, dtype, op.test_sizes[1])
        # the first input alone: x, q, a or logits
        seen[name, version] = check_refuses_or_trains(op, impl, dtype, args, (_floating(args)[0],))
    refused = {k for k, v in seen.items() if v == "refused"}
    assert refused == {("softmax", "v4"), ("matmul", "v1"), ("rmsnorm_fwd_bwd", "v3"),
                       ("cross_entropy", "v4")}, seen


@pytest.mark.parametrize("x_grad", [True, False], ids=["x-and-w", "w-only"])
def test_rmsnorm_triton_in_a_residual_block(x_grad, device):
    """``(rmsnorm_triton(x, w) + x).sum().backward()`` gives the reference's x.grad and w.grad: the
    case that went wrong silently (w.grad None, x.grad the residual's ones only)."""
    from snippets.part5.rmsnorm import rmsnorm_ref, rmsnorm_triton

    gen = torch.Generator().manual_seed(3)
    x0 = torch.randn(6, 96, generator=gen)
    w0 = 1.0 + 0.1 * torch.randn(96, generator=gen)
    x = x0.clone().to(device).requires_grad_(x_grad)
    w = w0.clone().to(device).requires_grad_()
    (rmsnorm_triton(x, w) + x).sum().backward()
    xr = x0.double().requires_grad_(x_grad)
    wr = w0.double().requires_grad_()
    (rmsnorm_ref(xr, wr) + xr).sum().backward()
    assert w.grad is not None, "w.grad is None: the norm's gradient was dropped"
    torch.testing.assert_close(w.grad.double().cpu(), wr.grad, rtol=1e-4, atol=1e-4)
    if x_grad:
        torch.testing.assert_close(x.grad.double().cpu(), xr.grad, rtol=1e-4, atol=1e-4)


def test_refusal_message_names_the_function_and_the_way_out(device):
    from snippets.part4.softmax import softmax_online

    x = torch.randn(3, 17, device=device, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"softmax_online is forward-only: an input requires "
                                           r"grad.*torch\.no_grad\(\).*torch\.softmax"):
        softmax_online(x)
    with torch.inference_mode():
        softmax_online(x)
    with torch.no_grad():
        y = softmax_online(x)
    torch.testing.assert_close(y, torch.softmax(x.detach(), dim=-1))
