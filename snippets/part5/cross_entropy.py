"""Cross-entropy over a large vocabulary without keeping the logits: the loss and its gradient in
one kernel.

Two ops are registered, both a training step's forward *and* backward (the loss is the last layer,
so its backward always follows at once).

Versions of ``cross_entropy`` ((T, V) logits and T int64 targets -> (loss, dlogits); mean over the
targets that are not ``ignore_index = -100``; the loss is returned in the logits' dtype, as
``F.cross_entropy`` does):

- v0  eager PyTorch: ``F.cross_entropy(logits.float(), targets)`` then ``torch.autograd.grad``. The
      upcast to fp32 is what training code commonly does so that the log-softmax is not rounded to
      bf16; it costs three fp32 (T, V) tensors.
- v1  the same loss through ``torch.compile``; AOTAutograd compiles the backward with it.
- v2  Liger-Kernel's ``LigerCrossEntropyFunction``: one program per row, the gradient written over
  the logits.
- v3  Triton, this chapter's kernel: one program per row streams the row in chunks of BLOCK_V with
      the online softmax (running max and rescaled sum per lane, as Part 4's online softmax), then a
      second sweep writes ``(softmax - onehot) / n`` *over the logits*: no (T, V) buffer is
      allocated at all.
- v4  like v3, but the gradient goes to a new buffer: what a caller who still needs the logits pays
      (T * V * itemsize bytes more memory; the same traffic).

v2 and v3 overwrite their input (the returned dlogits *is* the logits tensor), so whoever checks
them must compute the reference first.

Versions of ``linear_cross_entropy`` (h (T, D), W (V, D), targets (T,) -> (loss, dh, dW) for
``loss = cross_entropy(h @ W.T, targets)``):

- v0  eager PyTorch: ``h @ W.T`` (all T x V logits), the fp32 loss of v0
  above, ``torch.autograd.grad``.
- v1  the same through ``torch.compile``.
- v2  Liger-Kernel's ``LigerFusedLinearCrossEntropyFunction`` (chunks of tokens, gradients in
  the forward).
- v3  :class:`LinearCrossEntropyFunction`: like v2 in plan, with this chapter's kernel. Tokens in
      chunks of CHUNK_TOKENS: logits chunk = h_chunk @ W.T (cuBLAS), the fused kernel of v3 above
      turns the chunk into dlogits in place, then dh_chunk = dlogits @ W and dW += dlogits.T @
      h_chunk (cuBLAS). Peak extra memory: one chunk of logits, plus the dh and dW that the
      backward returns.

Cost models: ``cross_entropy`` must read the logits and write dlogits, ``2 * T * V * itemsize``
bytes, and is measured against the copy ceiling (the kernel reads each row twice: 3 transfers per
element, not 2). ``linear_cross_entropy`` is three GEMMs of ``2 * T * V * D`` FLOPs each, measured
against cuBLAS's bf16 GEMM.

The goal, at 8192 tokens x 128256 vocabulary in bf16: the fused cross-entropy no slower than
``torch.compile`` with at most a quarter of its extra peak memory; the chapter's goal check
(docs/part5/cross-entropy.md) measures both, and its table eager PyTorch's, on every GPU with
results.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from snippets._checks import (
    GRADS_ONLY,
    check_int,
    check_scalar,
    check_tensors,
    describe,
    refuse_grad,
    triton_device,
)
from snippets.common.baselines import compiled, grads_through, liger, liger_missing, needs_gpu
from snippets.common.rows import ONLINE_BLOCK_N, ONLINE_NUM_WARPS, compute_dtype
from snippets.registry import Impl, Op, device_generator, register

# PyTorch's default: padding and prompt tokens carry this target and add nothing
IGNORE_INDEX = -100
FLOAT_TYPES = (torch.bfloat16, torch.float16, torch.float32)
# A row is indexed with int32 column offsets (tl.arange); a chunk may run one BLOCK_V past the end
# of the row before its mask stops it, so keep that much headroom below 2^31.
MAX_V = 2**30


# --8<-- [start:reference]
def cross_entropy_ref(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100,
                      label_smoothing: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean cross-entropy of the rows whose target is not ``ignore_index``, and its gradient,
    both in closed form (derived in the chapter): with p = softmax(x) per row, lse =
    log(sum(exp(x))) and n valid rows,
        loss   = (1/n) * sum over valid rows of (lse - x[target]),
        dlogits = (p - onehot(target)) / n on valid rows, 0 on ignored rows.
    With label smoothing eps the target distribution is (1 - eps) * onehot + eps / V: the loss gains
    eps * (lse - mean(x)) - eps * (lse - x[target]), and the gradient is p - (1 - eps) * onehot -
    eps / V. Computed in at least fp32, returned in the logits' dtype (the loss as a 0-d tensor).

    Fused, the op reads the T*V logits and writes T*V gradients. This chain makes about eight passes
    over (T, V) data: max, subtract, exp, sum, divide, the one-hot subtraction, the scaling and
    the gather."""
    x = logits.to(torch.promote_types(logits.dtype, torch.float32))
    valid = targets != ignore_index
    n = valid.sum()
    safe_t = torch.where(valid, targets, 0)  # a gather index for every row, ignored or not
    lse = torch.logsumexp(x, dim=-1)         # subtracts the row max inside: no overflow
    nll = lse - x.gather(1, safe_t[:, None])[:, 0]
    smooth = lse - x.mean(dim=-1)
    row_loss = torch.where(valid, (1 - label_smoothing) * nll + label_smoothing * smooth, 0.0)
    grad = torch.exp(x - lse[:, None])                       # p, the softmax of each row
    grad -= label_smoothing / x.shape[1]
    # - onehot
    grad.scatter_add_(1, safe_t[:, None], torch.full_like(nll[:, None], label_smoothing - 1))
    grad *= (valid / n.clamp_min(1))[:, None]                 # ignored rows: 0; the others: / n
    # 0 valid rows: loss 0/0 = NaN
    return (row_loss.sum() / n).to(logits.dtype), grad.to(logits.dtype)


def linear_cross_entropy_ref(h: torch.Tensor, w: torch.Tensor, targets: torch.Tensor,
                             ignore_index: int = -100, label_smoothing: float = 0.0):
    """loss = cross_entropy(h @ W.T), and its gradients by the chain rule through the linear layer:
    dh = dlogits @ W (T x D) and dW = dlogits.T @ h (V x D). Three GEMMs of 2*T*V*D FLOPs each."""
    loss, dlogits = cross_entropy_ref(h @ w.T, targets, ignore_index, label_smoothing)
    return loss, dlogits @ w, dlogits.T @ h
# --8<-- [end:reference]


# --8<-- [start:sizes]
def logits_bytes(t: int, v: int) -> dict[str, int]:
    """Bytes of the (T, V) tensors a training step's loss layer can hold, by the formulas of the
    chapter: the bf16 logits, an fp32 copy of them (``logits.float()``), an fp32 log-softmax or
    gradient, the bf16 gradient, and one chunk of CHUNK_TOKENS rows of bf16 logits (what the chunked
    version holds instead)."""
    return {"bf16 logits": 2 * t * v, "fp32 copy": 4 * t * v, "fp32 log-softmax": 4 * t * v,
            "fp32 gradient": 4 * t * v, "bf16 gradient": 2 * t * v,
            f"bf16 chunk of {CHUNK_TOKENS} tokens": 2 * CHUNK_TOKENS * v}
# --8<-- [end:sizes]


# --------------------------------------------------------------------------------------------------
# The fused kernel: loss and gradient of each row in two sweeps
# --------------------------------------------------------------------------------------------------

# --8<-- [start:kernel]
@triton.jit
def _row_offset(row, stride):
    # int64 before the multiply: row * stride counts elements up to T * V, which passes 2^31 - 1
    # from 16744 tokens of a 128256-word vocabulary (in bytes, at 8192 tokens of bf16 already). In
    # int32 the product would wrap to a negative offset and the program would read and write another
    # row's memory.
    return row.to(tl.int64) * stride


@triton.jit(do_not_specialize=["n_valid"])
def _cross_entropy_kernel(x_ptr, dx_ptr, t_ptr, loss_ptr, stride_x, stride_dx, n_cols, n_valid,
                          smoothing, ignore_index, BLOCK_V: tl.constexpr, SMOOTH: tl.constexpr,
                          COMPUTE: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + _row_offset(row, stride_x)
    # may be x_row itself: the gradient overwrites the logits
    dx_row = dx_ptr + _row_offset(row, stride_dx)
    target = tl.load(t_ptr + row)
    offs = tl.arange(0, BLOCK_V)
    n_chunks = tl.cdiv(n_cols, BLOCK_V)
    if target == ignore_index:
        # An ignored row adds nothing to the loss, and its gradient is zero: it must still be
        # written, since in place the buffer holds this row's logits.
        for i in range(0, n_chunks):
            cols = i * BLOCK_V + offs
            tl.store(dx_row + cols, tl.zeros((BLOCK_V,), COMPUTE).to(dx_ptr.dtype.element_ty),
                     mask=cols < n_cols)
        tl.store(loss_ptr + row, 0.0)
    else:
        # Sweep 1, the online softmax lane by lane (Part 4's v4): lane j keeps the running max m of
        # the columns it has seen (j, j + BLOCK_V, ...) and the sum s of exp(x - m), rescaled
        # whenever m grows.
        m = tl.full((BLOCK_V,), -float("inf"), COMPUTE)
        s = tl.zeros((BLOCK_V,), COMPUTE)
        x_sum = tl.zeros((BLOCK_V,), COMPUTE)  # for label smoothing only
        for i in range(0, n_chunks):
            cols = i * BLOCK_V + offs
            mask = cols < n_cols
            x = tl.load(x_row + cols, mask=mask, other=-float("inf")).to(COMPUTE)
            m_new = tl.maximum(m, x)
            # a lane of padding only: no -inf - -inf
            shift = tl.where(m_new == -float("inf"), 0.0, m_new)
            s = s * tl.exp(m - shift) + tl.exp(x - shift)
            m = m_new
            if SMOOTH:
                x_sum += tl.where(mask, x, 0.0)
        row_max = tl.max(m, axis=0)
        lse = row_max + tl.log(tl.sum(s * tl.exp(m - row_max), axis=0))
        x_target = tl.load(x_row + target).to(COMPUTE)  # one element: the target's logit
        loss = lse - x_target
        if SMOOTH:
            loss = (1 - smoothing) * loss + smoothing * (lse - tl.sum(x_sum, axis=0) / n_cols)
        tl.store(loss_ptr + row, loss.to(loss_ptr.dtype.element_ty))
        inv_n = 1.0 / n_valid.to(COMPUTE)  # the mean's 1/n, folded into the gradient
        # Sweep 2: read x again, write (p - onehot) / n. Last chunk first: the columns sweep 1 read
        # most recently, the likeliest to be still in L2. Every element is loaded and stored by the
        # same thread (one layout for both), so writing over x never clobbers a value not yet read.
        for i in range(0, n_chunks):
            cols = (n_chunks - 1 - i) * BLOCK_V + offs
            mask = cols < n_cols
            x = tl.load(x_row + cols, mask=mask, other=0.0).to(COMPUTE)
            g = tl.exp(x - lse)
            if SMOOTH:
                g = g - smoothing / n_cols
                g = tl.where(cols == target, g - (1 - smoothing), g)
            else:
                g = tl.where(cols == target, g - 1.0, g)
            tl.store(dx_row + cols, (g * inv_n).to(dx_ptr.dtype.element_ty), mask=mask)
# --8<-- [end:kernel]


# --8<-- [start:checks]
def _check_logits(logits, targets, dtypes, device: str) -> tuple[int, int]:
    """logits (T, V) of a float dtype, targets (T,) int64, one device, both contiguous, T and V
    >= 1."""
    check_tensors(("logits",), (logits,), dtypes=dtypes, device=device)
    check_tensors(("targets",), (targets,), dtypes=(torch.int64,), device=device)
    if logits.device != targets.device:
        raise ValueError(f"targets is on {targets.device} but logits is on {logits.device}")
    if logits.dim() != 2:
        raise ValueError("logits must be 2-D (tokens, vocabulary), got shape "
                         f"{tuple(logits.shape)}; flatten the batch and sequence dimensions first")
    t, v = logits.shape
    if targets.shape != (t,):
        raise ValueError(f"targets must have shape ({t},), one class index per row of logits "
                         f"{tuple(logits.shape)}, got {tuple(targets.shape)}")
    if t == 0 or v == 0:
        raise ValueError(f"logits is empty ({describe(logits)}): a mean over no tokens or no "
                         "classes")
    if v > MAX_V:
        raise ValueError(f"a vocabulary of {v} classes is more than the {MAX_V} these kernels "
                         "index with int32")
    return t, v


def count_targets(targets: torch.Tensor, v: int, ignore_index: int) -> int:
    """The number of rows that count (targets != ignore_index), after checking every other target is
    a class in [0, V). The checks run on the device and one small tensor comes back to the host (one
    synchronisation): a target out of range would make the kernel read outside its row, so it must
    be refused before launch."""
    valid = targets != ignore_index
    # ignored rows count as class 0, which is always in range
    classes = torch.where(valid, targets, 0)
    lo, hi, n = torch.stack([classes.amin(), classes.amax(), valid.sum()]).tolist()
    if lo < 0 or hi >= v:
        bad = lo if lo < 0 else hi
        raise ValueError(f"targets holds the class index {bad}, outside [0, {v}) for logits of {v} "
                         f"classes (ignore_index={ignore_index} marks rows to skip)")
    return n
# --8<-- [end:checks]


# --8<-- [start:host]
# BLOCK_V and warps: Part 4's online softmax streams rows in chunks of 4096 over 8 warps (16 values
# per thread, four 16-byte fp32 loads in flight each; snippets.common.rows); this kernel keeps the
# same per-lane state (x, m, s) plus the sum for label smoothing, so the same shape fits.
BLOCK_V = ONLINE_BLOCK_N
NUM_WARPS = ONLINE_NUM_WARPS


def _launch(x, dx, targets, row_loss, n_valid: int, ignore_index: int, label_smoothing: float,
            block_v: int | None) -> None:
    """One program per row of the checked (rows, V) ``x``; ``dx`` may be ``x`` (in place)."""
    rows, v = x.shape
    block = block_v or min(BLOCK_V, triton.next_power_of_2(v))
    _cross_entropy_kernel[(rows,)](
        x, dx, targets, row_loss, x.stride(0), dx.stride(0), v, max(n_valid, 1), label_smoothing,
        ignore_index, BLOCK_V=block, SMOOTH=label_smoothing > 0, COMPUTE=compute_dtype(x.dtype),
        num_warps=NUM_WARPS)


def _check_options(ignore_index, label_smoothing, block_v) -> tuple[int, float]:
    ignore_index = check_int("ignore_index", ignore_index, -2**63)
    label_smoothing = check_scalar("label_smoothing", label_smoothing)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    if block_v is not None:
        block_v = check_int("block_v", block_v, 1)
        if block_v & (block_v - 1):
            raise ValueError(f"block_v must be a power of two, got {block_v}")
    return ignore_index, label_smoothing


def cross_entropy_fwd_bwd(logits: torch.Tensor, targets: torch.Tensor, *, inplace: bool = False,
                          ignore_index: int = IGNORE_INDEX, label_smoothing: float = 0.0,
                          block_v: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean cross-entropy of ``logits`` (T, V) against ``targets`` (T,) and its gradient, in
    one launch.

    Returns ``(loss, dlogits)``: the loss as a 0-d fp32 tensor, dlogits in the logits' dtype. With
    ``inplace=True`` the gradient is written over ``logits`` and the returned dlogits *is*
    ``logits``: no (T, V) memory is allocated, and the logits are gone. Use it when nothing else
    needs them, as in a training step where the logits are the loss layer's private intermediate.
    ``block_v`` (a power of two) overrides the chunk width, for tests. Logits that require grad
    are refused (with grad mode on): CrossEntropyFunction below is the version that trains."""
    refuse_grad("cross_entropy_fwd_bwd", logits, instead="CrossEntropyFunction.apply",
                why=GRADS_ONLY)
    ignore_index, label_smoothing = _check_options(ignore_index, label_smoothing, block_v)
    _, v = _check_logits(logits, targets, FLOAT_TYPES + (torch.float64,), triton_device())
    n_valid = count_targets(targets, v, ignore_index)
    dlogits = logits if inplace else torch.empty_like(logits)
    row_loss = torch.empty(logits.shape[0], dtype=torch.float64 if logits.dtype == torch.float64
                           else torch.float32, device=logits.device)
    _launch(logits, dlogits, targets, row_loss, n_valid, ignore_index, label_smoothing, block_v)
    return row_loss.sum() / n_valid if n_valid else row_loss.sum() * float("nan"), dlogits
# --8<-- [end:host]


# --8<-- [start:function]
class CrossEntropyFunction(torch.autograd.Function):
    """Cross-entropy that trains, computed whole in the forward: the forward runs the fused kernel
    and saves only dlogits (the logits are not needed again); the backward scales it by the incoming
    gradient, which for a loss is 1 (then nothing is done). ``inplace=True`` writes dlogits over the
    logits tensor (the Liger trick): only for logits nobody else reads afterwards, and never under
    gradcheck, which calls the forward again on the same input."""

    @staticmethod
    def forward(ctx, logits, targets, inplace=False, ignore_index=IGNORE_INDEX,
                label_smoothing=0.0):
        loss, dlogits = cross_entropy_fwd_bwd(logits.detach(), targets, inplace=inplace,
                                              ignore_index=ignore_index,
                                              label_smoothing=label_smoothing)
        ctx.save_for_backward(dlogits)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        (dlogits,) = ctx.saved_tensors
        # the usual case, a loss at the end of the graph: no (T, V) multiply
        if bool(grad_loss == 1):
            return dlogits, None, None, None, None
        return dlogits * grad_loss.to(dlogits.dtype), None, None, None, None
# --8<-- [end:function]


# --------------------------------------------------------------------------------------------------
# The linear layer and the loss, chunk by chunk
# --------------------------------------------------------------------------------------------------

# --8<-- [start:linear_checks]
# Tokens per chunk of v3. One chunk of logits is CHUNK_TOKENS * V elements (525 MB of bf16 at V =
# 128256); each GEMM of a chunk is still (2048 x 4096) x (4096 x 128256), thousands of output tiles,
# enough to fill every SM. Smaller chunks hold less memory but make the dW update (dW += dlogits.T @
# h, which reads and writes all of dW) more frequent; larger ones the opposite. The chapter's chunk
# sweep measures the trade.
CHUNK_TOKENS = 2048


def _check_linear(h, w, targets, device: str) -> tuple[int, int, int]:
    """h (T, D), W (V, D) of one float dtype, targets (T,) int64, one device, contiguous,
    nothing empty."""
    check_tensors(("h", "W"), (h, w), dtypes=FLOAT_TYPES + (torch.float64,), device=device,
                  same_shape=False)
    check_tensors(("targets",), (targets,), dtypes=(torch.int64,), device=device)
    if targets.device != h.device:
        raise ValueError(f"targets is on {targets.device} but h is on {h.device}")
    if h.dim() != 2 or w.dim() != 2:
        raise ValueError("h must be (tokens, hidden) and W (vocabulary, hidden), got shapes "
                         f"{tuple(h.shape)} and {tuple(w.shape)}")
    (t, d), (v, d_w) = h.shape, w.shape
    if d != d_w:
        raise ValueError(f"h has hidden size {d} but W has {d_w} (W must be (vocabulary, hidden), "
                         f"as nn.Linear stores it), shapes {tuple(h.shape)} and {tuple(w.shape)}")
    if targets.shape != (t,):
        raise ValueError(f"targets must have shape ({t},), one class index per row of h, got "
                         f"{tuple(targets.shape)}")
    if t == 0 or v == 0 or d == 0:
        raise ValueError(f"empty input: h {tuple(h.shape)}, W {tuple(w.shape)}")
    if v > MAX_V:
        raise ValueError(f"a vocabulary of {v} classes is more than the {MAX_V} these kernels "
                         "index with int32")
    return t, v, d
# --8<-- [end:linear_checks]


# --8<-- [start:linear]
def linear_cross_entropy_grads(h: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, *,
                               chunk_tokens: int = CHUNK_TOKENS, ignore_index: int = IGNORE_INDEX,
                               label_smoothing: float = 0.0, need_dw: bool = True,
                               block_v: int | None = None):
    """loss (0-d fp32), dh (T, D) and dW (V, D) of ``cross_entropy(h @ W.T, targets)``, never
    holding more than ``chunk_tokens`` rows of logits. dW is None when ``need_dw`` is False (a
    frozen W)."""
    refuse_grad("linear_cross_entropy_grads", h, w, instead="LinearCrossEntropyFunction.apply",
                why=GRADS_ONLY)
    ignore_index, label_smoothing = _check_options(ignore_index, label_smoothing, block_v)
    chunk_tokens = check_int("chunk_tokens", chunk_tokens, 1)
    t, v, _ = _check_linear(h, w, targets, triton_device())
    n_valid = count_targets(targets, v, ignore_index)
    chunk = min(chunk_tokens, t)
    f64 = h.dtype == torch.float64
    row_loss = torch.empty(t, dtype=torch.float64 if f64 else torch.float32, device=h.device)
    dh = torch.empty_like(h)
    dw = torch.empty_like(w) if need_dw else None
    # the one (chunk, V) buffer, reused
    logits = torch.empty((chunk, v), dtype=h.dtype, device=h.device)
    for start in range(0, t, chunk):
        end = min(start + chunk, t)
        h_c, z = h[start:end], logits[:end - start]
        torch.matmul(h_c, w.T, out=z)           # logits of the chunk (cuBLAS)
        _launch(z, z, targets[start:end], row_loss[start:end], n_valid, ignore_index,
                label_smoothing, block_v)       # z now holds dlogits
        torch.matmul(z, w, out=dh[start:end])   # dh rows of the chunk
        if dw is not None:
            if start == 0:
                torch.matmul(z.T, h_c, out=dw)  # the first chunk initialises dW
            else:
                dw.addmm_(z.T, h_c)             # dW += dlogits.T @ h_chunk
    loss = row_loss.sum() / n_valid if n_valid else row_loss.sum() * float("nan")
    return loss, dh, dw


class LinearCrossEntropyFunction(torch.autograd.Function):
    """``cross_entropy(h @ W.T, targets)`` that trains without the (T, V) logits.

    The forward already computes dh and dW (chunk by chunk: it needs each chunk's softmax, which is
    the gradient up to the one-hot term) and saves them; the backward only scales them by the
    incoming gradient. So what stays alive between forward and backward is dh and dW (T*D + V*D
    elements) instead of h, W and the logits or their softmax (T*V). That is the right trade for the
    last layer of a network: its backward comes right after its forward, so computing early wastes
    nothing, and dh and dW must be allocated by the backward anyway."""

    @staticmethod
    def forward(ctx, h, w, targets, chunk_tokens=CHUNK_TOKENS, ignore_index=IGNORE_INDEX,
                label_smoothing=0.0):
        loss, dh, dw = linear_cross_entropy_grads(
            h.detach(), w.detach(), targets, chunk_tokens=chunk_tokens, ignore_index=ignore_index,
            label_smoothing=label_smoothing, need_dw=ctx.needs_input_grad[1])
        ctx.save_for_backward(dh, dw)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        dh, dw = ctx.saved_tensors
        if not bool(grad_loss == 1):  # a scaled loss (fp16 loss scaling, a weighted sum of losses)
            dh = dh * grad_loss.to(dh.dtype)
            dw = dw * grad_loss.to(dw.dtype) if dw is not None else None
        return dh, dw, None, None, None, None
# --8<-- [end:linear]


# --------------------------------------------------------------------------------------------------
# The registered versions
# --------------------------------------------------------------------------------------------------

# --8<-- [start:baselines]
def _eager_loss(x, targets):
    """The loss as training code often writes it: upcast the logits to fp32,
    then F.cross_entropy."""
    return F.cross_entropy(x.float(), targets, ignore_index=IGNORE_INDEX)


def _eager_linear_loss(h, w, targets):
    return _eager_loss(h @ w.T, targets)


_compiled_loss = compiled(_eager_loss)
_compiled_linear_loss = compiled(_eager_linear_loss)


def _grads(loss_fn, inputs, targets):
    """One training step through ``loss_fn`` (grads_through: fresh leaves, the forward, then
    ``torch.autograd.grad``). Returns the loss in the first input's dtype and the gradients."""
    loss, *grads = grads_through(lambda *leaves: loss_fn(*leaves, targets), inputs,
                                 with_output=True)
    return (loss.to(inputs[0].dtype), *grads)


def cross_entropy_torch(logits, targets):
    """v0: eager autograd through the fp32 loss."""
    return _grads(_eager_loss, (logits,), targets)


def cross_entropy_compiled(logits, targets):
    """v1: the same loss through torch.compile (forward and backward compiled)."""
    return _grads(_compiled_loss, (logits,), targets)


def cross_entropy_liger(logits, targets):
    """v2: LigerCrossEntropyFunction as LigerCrossEntropyLoss calls it; its forward writes the
    gradient over the logits (so the returned dlogits is the input buffer), its backward hands that
    buffer back."""
    fn = liger("cross_entropy").LigerCrossEntropyFunction.apply
    return _grads(lambda x, t: fn(x, t, None, IGNORE_INDEX)[0], (logits,), targets)


def cross_entropy_inplace(logits, targets):
    """v3: the fused kernel, the gradient written over the logits."""
    refuse_grad("cross_entropy_inplace", logits, instead="CrossEntropyFunction.apply",
                why=GRADS_ONLY)
    loss, dlogits = cross_entropy_fwd_bwd(logits, targets, inplace=True)
    return loss.to(logits.dtype), dlogits


def cross_entropy_new_buffer(logits, targets):
    """v4: the fused kernel, the gradient in a new (T, V) tensor."""
    refuse_grad("cross_entropy_new_buffer", logits, instead="CrossEntropyFunction.apply",
                why=GRADS_ONLY)
    loss, dlogits = cross_entropy_fwd_bwd(logits, targets, inplace=False)
    return loss.to(logits.dtype), dlogits


def linear_cross_entropy_torch(h, w, targets):
    """v0: eager: all T x V logits, the fp32 loss, autograd for dh and dW."""
    return _grads(_eager_linear_loss, (h, w), targets)


def linear_cross_entropy_compiled(h, w, targets):
    """v1: the same through torch.compile."""
    return _grads(_compiled_linear_loss, (h, w), targets)


def linear_cross_entropy_liger(h, w, targets):
    """v2: LigerFusedLinearCrossEntropyFunction with its defaults (dW accumulated in W's dtype)."""
    fn = liger("fused_linear_cross_entropy").LigerFusedLinearCrossEntropyFunction.apply
    return _grads(lambda h, w, t: fn(h, w, t, None, None, IGNORE_INDEX)[0], (h, w), targets)


def linear_cross_entropy_chunked(h, w, targets):
    """v3: LinearCrossEntropyFunction through autograd, as a training step calls it."""
    refuse_grad("linear_cross_entropy_chunked", h, w,
                instead="LinearCrossEntropyFunction.apply", why=GRADS_ONLY)
    return _grads(LinearCrossEntropyFunction.apply, (h, w), targets)
# --8<-- [end:baselines]


# --------------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------------

def _targets(t: int, v: int, device: str, gen: torch.Generator) -> torch.Tensor:
    """Uniform classes, with every 7th token (from the 4th) set to ignore_index, as padding would
    be: fixed positions, so that even a 1-token input has a valid row and every input from 4 tokens
    up has an ignored one."""
    targets = torch.randint(0, v, (t,), generator=gen, device=device)
    ignored = torch.arange(t, device=device) % 7 == 3
    return torch.where(ignored, IGNORE_INDEX, targets)


def _make_inputs(size, dtype, device, gen):
    """logits ~ N(0, 2^2) (a peaked softmax, as a trained model's is) and targets."""
    g = device_generator(gen, device)
    t, v = size["t"], size["v"]
    logits = 2.0 * torch.randn(t, v, generator=g, device=device)
    return logits.to(dtype), _targets(t, v, device, g)


def _make_linear_inputs(size, dtype, device, gen):
    """h ~ N(0, 1) and W ~ N(0, 4 / D): logits h @ W.T ~ N(0, 2^2), as for ``cross_entropy``."""
    g = device_generator(gen, device)
    t, v, d = size["t"], size["v"], size["d"]
    h = torch.randn(t, d, generator=g, device=device)
    w = torch.randn(v, d, generator=g, device=device) * (2.0 / d**0.5)
    return h.to(dtype), w.to(dtype), _targets(t, v, device, g)


def _bytes(size, dtype) -> int:
    """Read the logits, write dlogits (the 8 bytes a token of targets are noise next to 2 * V
    * itemsize)."""
    return 2 * size["t"] * size["v"] * dtype.itemsize


def _linear_bytes(size, dtype) -> int:
    """Read h and W, write dh and dW."""
    t, v, d = size["t"], size["v"], size["d"]
    return 2 * (t * d + v * d) * dtype.itemsize


def _linear_flops(size, dtype) -> int:
    """Three GEMMs: logits = h @ W.T, dh = dlogits @ W, dW = dlogits.T @ h, each 2 * T * V * D."""
    return 6 * size["t"] * size["v"] * size["d"]


# Vocabularies of real models: GPT-2 (50257), Llama 2 (32000), Llama 3 (128256), Qwen2 (151936).
# 8192 tokens of the largest in bf16 is 2.5 GB of logits; the float64 reference the harness checks
# against needs several times 8 bytes an element, which still fits an 80 GB GPU.
VOCABS = (32000, 50257, 128256, 151936)
HEADLINE = {"t": 8192, "v": 128256}
SWEEP = [{"t": 8192, "v": v} for v in VOCABS]
LINEAR_HEADLINE = {"t": 8192, "v": 128256, "d": 4096}  # Llama-3-8B's output layer, 8192 tokens
LINEAR_SWEEP = [{"t": 8192, "v": v, "d": 4096} for v in VOCABS]
TEST_SIZES = [{"t": 1, "v": 1}, {"t": 1, "v": 17}, {"t": 5, "v": 4097}, {"t": 37, "v": 1000},
              {"t": 123, "v": 781}]
LINEAR_TEST_SIZES = [{"t": 1, "v": 3, "d": 8}, {"t": 9, "v": 4097, "d": 16},
                     {"t": 37, "v": 1000, "d": 64}, {"t": 123, "v": 781, "d": 33}]
# Against float64, every sum in fp32. The loss is near log V (up to ~7 here), held to a relative
# error: one rounding to the output type (fp16 2^-11, bf16 2^-8; the CPU interpreter truncates to
# bf16, up to 2^-7) and a few fp32 ulp from the exponentials and the row sums. The gradients are
# (p - onehot) / n: their tiny entries (p / n, down to 1e-10 at V = 4097) are also held to the
# relative error; the atol only covers fp16 subnormals (spaced 6e-8).
TOLERANCES = {torch.float32: (1e-5, 1e-9), torch.float16: (2e-3, 1e-7),
              torch.bfloat16: (1.6e-2, 1e-7)}
# linear_cross_entropy in fp16/bf16 rounds the logits themselves (h @ W.T) to the input type before
# the softmax: a logit near 8 moves by up to 2^-11 * 8 (fp16) or 2^-8 * 8 (bf16), and p with it, so
# dh = (E_p[W] - W_target) / n and dW inherit errors of about that relative size, and, where the
# terms cancel, of about that size against the largest entry. Measured at the test sizes on the CPU,
# eager PyTorch (v0) is off by up to 6e-4 (fp16) and 3e-3 (bf16) of the largest |dh|, |dW|; the atol
# below is about the largest entry (~0.2) times that, with room for the CPU interpreter's truncation
# to bf16. One rounding of dW per chunk of tokens adds little. fp32: the GEMMs' sums of up to 4097
# terms, a few 1e-7 of the largest entry.
LINEAR_TOLERANCES = {torch.float32: (1e-5, 1e-6), torch.float16: (5e-3, 2e-4),
                     torch.bfloat16: (3e-2, 3e-3)}
# The module file is a source of every Triton version: their speed depends on constants (BLOCK_V,
# NUM_WARPS, CHUNK_TOKENS) whose values a function's source text would not show.
SOURCES = (_cross_entropy_kernel, _row_offset, _launch, cross_entropy_fwd_bwd, count_targets,
           _check_logits, "snippets/part5/cross_entropy.py")
LINEAR_SOURCES = (*SOURCES, linear_cross_entropy_grads, LinearCrossEntropyFunction.forward,
                  LinearCrossEntropyFunction.backward, _grads)

cross_entropy = register(Op(
    name="cross_entropy", part=5, chapter="part5/cross-entropy.md",
    title="Cross-entropy, forward + backward", reference=cross_entropy_ref,
    make_inputs=_make_inputs, bytes_moved=_bytes, flops=lambda s, d: 6 * s["t"] * s["v"],
    metric="GB/s", ceiling="copy", headline=HEADLINE, sweep=SWEEP, dtypes=FLOAT_TYPES,
    bench_dtypes=(torch.bfloat16,), test_sizes=TEST_SIZES, sweep_axis="v", tolerances=TOLERANCES,
    measure_memory=True))
cross_entropy.add(Impl("v0", cross_entropy_torch, "PyTorch",
                       "F.cross_entropy(logits.float()) + autograd", (_eager_loss, _grads),
                       device="any"))
cross_entropy.add(Impl("v1", cross_entropy_compiled, "PyTorch", "torch.compile of v0's loss",
                       (_eager_loss, _grads), device="cuda", requires=needs_gpu, origin="library"))
cross_entropy.add(Impl("v2", cross_entropy_liger, "Triton",
                       "Liger-Kernel 0.8.5 LigerCrossEntropyFunction", (liger, _grads),
                       device="cuda", requires=liger_missing, origin="library"))
cross_entropy.add(Impl("v3", cross_entropy_inplace, "Triton",
                       "fused, online softmax, gradient over the logits", SOURCES, device="any"))
cross_entropy.add(Impl("v4", cross_entropy_new_buffer, "Triton",
                       "fused, online softmax, gradient to a new buffer", SOURCES, device="any"))

linear_cross_entropy = register(Op(
    name="linear_cross_entropy", part=5, chapter="part5/cross-entropy.md",
    title="Linear layer + cross-entropy, forward + backward", reference=linear_cross_entropy_ref,
    make_inputs=_make_linear_inputs, bytes_moved=_linear_bytes, flops=_linear_flops,
    metric="TFLOP/s", ceiling="gemm_bf16", headline=LINEAR_HEADLINE, sweep=LINEAR_SWEEP,
    dtypes=FLOAT_TYPES, bench_dtypes=(torch.bfloat16,), test_sizes=LINEAR_TEST_SIZES,
    sweep_axis="v", tolerances=LINEAR_TOLERANCES, measure_memory=True))
linear_cross_entropy.add(Impl("v0", linear_cross_entropy_torch, "PyTorch",
                              "h @ W.T, fp32 F.cross_entropy, autograd",
                              (_eager_linear_loss, _eager_loss, _grads), device="any"))
linear_cross_entropy.add(Impl("v1", linear_cross_entropy_compiled, "PyTorch",
                              "torch.compile of v0's loss",
                              (_eager_linear_loss, _eager_loss, _grads), device="cuda",
                              requires=needs_gpu, origin="library"))
linear_cross_entropy.add(Impl("v2", linear_cross_entropy_liger, "Triton",
                              "Liger-Kernel 0.8.5 LigerFusedLinearCrossEntropyFunction",
                              (liger, _grads), device="cuda", requires=liger_missing,
                              origin="library"))
linear_cross_entropy.add(Impl("v3", linear_cross_entropy_chunked, "Triton",
                              "token chunks: cuBLAS GEMMs + fused kernel in place", LINEAR_SOURCES,
                              device="any"))


# --------------------------------------------------------------------------------------------------
# The chunk-size sweep (GPU only): python scripts/capture_linear_ce_chunks.py OUT.txt
# --------------------------------------------------------------------------------------------------

# --8<-- [start:chunk_sweep]
def sweep_chunks(t: int = 8192, v: int = 128256, d: int = 4096,
                 chunks: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192)) -> list[dict]:
    """Time linear_cross_entropy_grads (bf16) at each chunk size, and the peak memory it allocates
    beyond its inputs. Every chunk size's gradients are first compared with the 2048-token run's."""
    from snippets.bench.timing import time_device

    if not torch.cuda.is_available():
        raise SystemExit("the chunk sweep needs a CUDA GPU")
    gen = torch.Generator().manual_seed(0)
    h, w, targets = _make_linear_inputs({"t": t, "v": v, "d": d}, torch.bfloat16, "cuda", gen)
    _, dh_ref, dw_ref = linear_cross_entropy_grads(h, w, targets, chunk_tokens=2048)
    rows = []
    for chunk in chunks:
        loss, dh, dw = linear_cross_entropy_grads(h, w, targets, chunk_tokens=chunk)
        torch.testing.assert_close(dh, dh_ref, rtol=3e-2, atol=1e-4)
        torch.testing.assert_close(dw, dw_ref, rtol=3e-2, atol=1e-4)
        del loss, dh, dw
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = linear_cross_entropy_grads(h, w, targets, chunk_tokens=chunk)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        del out
        timing = time_device(lambda: linear_cross_entropy_grads(h, w, targets, chunk_tokens=chunk),
                             [()], budget_ms=1000)
        rows.append({"chunk": chunk, "ms": timing.median,
                     "tflops": 6 * t * v * d / (timing.median * 1e-3) / 1e12, "peak_gb": peak / 1e9,
                     "chunk_logits_gb": 2 * chunk * v / 1e9})
    return rows


def format_sweep(rows: list[dict], t: int = 8192, v: int = 128256, d: int = 4096) -> str:
    lines = [f"linear_cross_entropy_grads, bf16, T={t} V={v} D={d} "
             f"({torch.cuda.get_device_name(0)}, torch {torch.__version__}, triton "
             f"{triton.__version__})",
             f"{'chunk':>6} {'ms':>8} {'TFLOP/s':>8} {'peak extra GB':>14} {'logits chunk GB':>16}"]
    for r in rows:
        lines.append(f"{r['chunk']:>6} {r['ms']:>8.2f} {r['tflops']:>8.1f} {r['peak_gb']:>14.2f} "
                     f"{r['chunk_logits_gb']:>16.3f}")
    return "\n".join(lines) + "\n"
# --8<-- [end:chunk_sweep]
