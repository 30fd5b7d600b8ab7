"""Part 5: fusion and FlashAttention."""

from __future__ import annotations

import math

import torch

from exercises import compare
from exercises.catalog.helpers import Output, close, inp, model, randn
from exercises.engine import Exercise, Failure, Run

# ------------------------------------------------------------------------------------------- epilogue.1
_MNS = [(4096, 4096, 2), (8192, 1024, 4), (16, 4096, 2)]
residual_epilogue = Exercise(
    id="part5.epilogue.1", title="A residual in the epilogue: what it adds, what it saves", difficulty=1,
    kind="model", files=("part5/residual_bytes.py",),
    task="Add a residual to the epilogue: C = R + gelu(AB + b). What does it add to the fused kernel's traffic, "
         "and what does it save compared with a separate addition?",
    hint="fused, the epilogue reads R (M x N) and writes the same C as before. Separately, the GEMM writes C, and "
         "the addition reads C and R and writes the sum",
    check=model(("fused_extra_bytes", _MNS), ("separate_add_bytes", _MNS), ("bytes_saved", _MNS)),
    planted={"saved_all": "bytes_saved("},
)


# ------------------------------------------------------------------------------------------- norms-activations.1
def _rmsnorm_ref(x, r, w, eps):
    h = x.double() + r.double()
    y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * w.double()
    return h.float(), y.float()


def _check_add_rmsnorm(run: Run) -> None:
    mod = run.module()
    for m, n in ((5, 100), (3, 128), (2, 1)):
        with run.case(f"{m} x {n} rows"):
            x, r, w = randn(m, n, seed=40), randn(m, n, seed=41), randn(n, seed=42)
            h_out, y_out = Output((m, n), run.device, name="h"), Output((m, n), run.device, name="y")
            mod.add_rmsnorm(inp(x, run.device), inp(r, run.device), inp(w, run.device), h_out.tensor,
                            y_out.tensor, 1e-6)
            h, y = _rmsnorm_ref(x, r, w, 1e-6)
            close("h", h_out.check(), h, 1e-6, 1e-6)
            close("y", y_out.check(), y, 1e-5, 1e-5)
    with run.case("bytes_unfused() and bytes_fused()"):
        for name in ("bytes_unfused", "bytes_fused"):
            compare.functions(name, getattr(mod, name, None), getattr(run.solution(), name),
                              [(4096, 4096, 2), (8, 100, 4)])


add_rmsnorm = Exercise(
    id="part5.norms-activations.1", title="Residual add fused into RMSNorm", difficulty=3, kind="triton",
    files=("part5/add_rmsnorm.py",),
    task="Fuse the residual add into RMSNorm: h = x + r, y = rmsnorm(h) = h / sqrt(mean(h^2) + eps) * w, "
         "returning both h and y (one program per row). Count the bytes before and after (the backward when "
         "both outputs receive gradients is left to the chapter).",
    hint="normalise h, not x: compute h first, store it, and take the mean of h * h over the n real columns "
         "(masked lanes load 0.0 and the mean divides by n, not BLOCK_N). Unfused, the add writes h and the norm "
         "reads it back",
    check=_check_add_rmsnorm,
    planted={"norm_of_x": "y[", "mean_centered": "y["},
)


# ------------------------------------------------------------------------------------------- norms-activations.4
def _check_swiglu(run: Run) -> None:
    mod = run.module()
    for m, n, block in ((4, 100, 64), (3, 7168 // 64, 32), (1, 5, 64)):
        with run.case(f"h of {m} x {2 * n}, out of {m} x {n}"):
            h = randn(m, 2 * n, seed=43)
            a, b = h[:, :n].double(), h[:, n:].double()
            out = Output((m, n), run.device)
            mod.swiglu_fused(inp(h, run.device), out.tensor, block=block)
            close("out", out.check(), (torch.nn.functional.silu(a) * b).float(), 1e-5, 1e-6)


swiglu = Exercise(
    id="part5.norms-activations.4", title="SwiGLU on the fused output [a, b] of one GEMM", difficulty=2,
    kind="triton", files=("part5/swiglu_fused.py",),
    task="Write a SwiGLU variant that takes the fused [a | b] output of one GEMM, shape (M, 2N), instead of two "
         "tensors: out = silu(a) * b with a = h[:, :N] and b = h[:, N:]. (Whether the strided access costs "
         "anything at N = 7168 is the GPU half of the chapter's exercise.)",
    hint="a row of h has 2N elements: a[r, c] is at h_ptr + r * stride_h + c and b[r, c] at the same address + "
         "N; silu(a) = a * sigmoid(a), computed in fp32",
    check=_check_swiglu,
    planted={"row_stride_n": "out[1, 0]", "sigmoid_only": "out[0, 0]"},
    gpu="the timing at N = 7168 against the two-tensor kernel",
)


# ------------------------------------------------------------------------------------------- norms-activations.6
def _interleaved_ref(x, cos, sin):
    x = x.double()
    xe, xo = x[:, 0::2], x[:, 1::2]
    out = torch.empty_like(x)
    out[:, 0::2] = xe * cos.double() - xo * sin.double()
    out[:, 1::2] = xe * sin.double() + xo * cos.double()
    return out.float()


def _check_rope(run: Run) -> None:
    mod = run.module()
    for t, d in ((10, 64), (3, 16)):
        with run.case(f"{t} tokens of head dimension {d}"):
            x = randn(t, d, seed=44)
            ang = torch.arange(t)[:, None] * (10000.0 ** (-torch.arange(d // 2) / (d // 2)))[None, :]
            cos, sin = torch.cos(ang).float(), torch.sin(ang).float()
            out = Output((t, d), run.device)
            mod.rope_interleaved(inp(x, run.device), inp(cos, run.device), inp(sin, run.device), out.tensor)
            close("out", out.check(), _interleaved_ref(x, cos, sin), 1e-5, 1e-6)


rope = Exercise(
    id="part5.norms-activations.6", title="Interleaved RoPE", difficulty=2, kind="triton",
    files=("part5/rope_interleaved.py",),
    task="Implement the interleaved RoPE layout: pair i of a head is (x[2i], x[2i + 1]), rotated by the angle "
         "of table column i (out[2i] = x[2i] cos - x[2i + 1] sin, out[2i + 1] = x[2i] sin + x[2i + 1] cos). "
         "One program per token. (Showing that it equals the rotate-half layout after permuting the columns of "
         "W_q and W_k is the pen-and-paper half of the chapter's exercise.)",
    hint="load the even elements at offsets 2 * i and the odd ones at 2 * i + 1 for i in tl.arange(0, D // 2), "
         "and the table row of the token at i",
    check=_check_rope,
    planted={"rotate_half": "out[0, 1]", "sign": "out[1, 0]"},
)


# ------------------------------------------------------------------------------------------- cross-entropy.6
def _ce_ref(x, t, z):
    x = x.double()
    lse = torch.logsumexp(x, -1)
    loss = lse - x.gather(1, t[:, None])[:, 0] + z * lse ** 2
    grad = torch.softmax(x, -1) * (1 + 2 * z * lse)[:, None]
    grad[torch.arange(x.shape[0]), t] -= 1
    return loss.float(), grad.float()


def _check_zloss(run: Run) -> None:
    mod = run.module()
    for m, v, z, scale in ((6, 100, 1e-4, 3.0), (3, 128, 0.05, 3.0), (4, 50, 1e-4, 100.0)):
        with run.case(f"{m} rows of {v} logits of size {scale:g}, z = {z:g}"):
            x = randn(m, v, seed=45, scale=scale)
            t = torch.randint(0, v, (m,), generator=torch.Generator().manual_seed(46))
            loss_out, grad_out = Output((m,), run.device, name="loss"), Output((m, v), run.device, name="grad")
            mod.cross_entropy_zloss(inp(x, run.device), inp(t, run.device), z, loss_out.tensor, grad_out.tensor)
            loss, grad = _ce_ref(x, t, z)
            close("loss", loss_out.check(), loss, 1e-5, 1e-5)
            close("grad", grad_out.check(), grad, 1e-5, 1e-7)


zloss = Exercise(
    id="part5.cross-entropy.6", title="Cross-entropy with a z-loss, and its gradient", difficulty=3,
    kind="triton", files=("part5/cross_entropy_zloss.py",),
    task="Add a z-loss term z * lse^2 (PaLM's auxiliary loss, z = 1e-4) to a row-wise cross-entropy kernel and "
         "derive its gradient: loss = lse - x[target] + z * lse^2 per row, and the kernel writes the loss and "
         "d loss / d x of each row.",
    hint="d lse / d x = softmax(x), so the z-term adds 2 z lse softmax(x): grad = softmax(x) (1 + 2 z lse) - "
         "onehot(target). Compute lse = m + log(sum(exp(x - m))) with the row max m",
    check=_check_zloss,
    planted={"no_z_grad": "grad[", "lse_no_max": "inf"},
)


# ------------------------------------------------------------------------------------------- flash-attention.7
_GQA = [(1, 32, 4096, 128, 2, 4), (8, 64, 1024, 64, 2, 8), (2, 8, 100, 16, 4, 1), (1, 4, 16, 16, 2, 4)]
gqa_bytes = Exercise(
    id="part5.flash-attention.7", title="The bytes grouped-query attention saves", difficulty=1, kind="model",
    files=("part5/gqa_bytes.py",),
    task="Grouped-query attention shares one K, V head among G query heads. With the forward's bytes model "
         "(read Q, K and V once, write O once), count the bytes for H query heads with and without sharing, "
         "and the bytes saved.",
    hint="Q and O keep H heads; K and V have H / G heads. Each head is S x D elements",
    check=model(("forward_bytes", _GQA), ("bytes_saved", _GQA)),
    planted={"shares_q": "forward_bytes("},
)


# ------------------------------------------------------------------------------------------- flash-attention.9
def _check_flash(run: Run) -> None:
    mod = run.module()
    for bh, s, d, scale in ((2, 40, 16, 1.0), (1, 64, 32, 1.0), (1, 20, 16, 8.0)):
        with run.case(f"{bh} head(s), S = {s}, D = {d}, values of size {scale:g}"):
            q, k, v = (randn(bh, s, d, seed=47 + i, scale=scale) for i in range(3))
            out = Output((bh, s, d), run.device)
            mod.attention(inp(q, run.device), inp(k, run.device), inp(v, run.device), out.tensor)
            p = torch.softmax(q.double() @ k.double().transpose(1, 2) / math.sqrt(d), -1)
            close("out", out.check(), (p @ v.double()).float(), 1e-4, 1e-5)


flash = Exercise(
    id="part5.flash-attention.9", title="Write the FlashAttention forward", difficulty=4, kind="triton",
    files=("part5/flash_forward.py",),
    task="Write the FlashAttention forward (non-causal, fp32 so that the CPU interpreter's tl.dot is exact "
         "enough): a program owns BLOCK_M queries of one head, walks the keys in blocks of BLOCK_N, and keeps "
         "the running row max m, the running sum l and the unnormalised output acc, rescaling l and acc by "
         "exp(m_old - m_new) whenever the max grows. S need not be a multiple of the blocks.",
    hint="s = tl.dot(q, tl.trans(k)) * scale; keys past S get -inf; m_new = max(m, max(s)); alpha = exp(m - "
         "m_new); p = exp(s - m_new[:, None]); l = l * alpha + sum(p); acc = acc * alpha[:, None] + tl.dot(p, "
         "v); finally out = acc / l[:, None]",
    check=_check_flash,
    planted={"no_rescale": "out[", "no_final_div": "out["},
    gpu="the speed against torch's SDPA (`python -m snippets bench flash_attention_fwd` is the book's version)",
)


# ------------------------------------------------------------------------------------------- lora.3
def _check_lora_extra_step(run: Run) -> None:
    mod = run.module()
    for m, n, k, r in ((37, 45, 29, 5), (16, 16, 16, 1), (50, 33, 64, 16)):
        with run.case(f"{m} x {n} x {k}, r = {r}"):
            a, b = randn(m, k, seed=50), randn(k, n, seed=51)
            u, q = randn(m, r, seed=52), randn(r, n, seed=53)
            c = Output((m, n), run.device, row_pad=3, name="c")
            mod.lora_matmul(inp(a, run.device), inp(b, run.device), inp(u, run.device), inp(q, run.device),
                            c.tensor)
            want = (a.double() @ b.double() + u.double() @ q.double()).float()
            close("c", c.check(), want, 1e-5, 1e-5)


lora_extra_step = Exercise(
    id="part5.lora.3", title="LoRA's extra step as rank-one updates on the CUDA cores", difficulty=2,
    kind="triton", files=("part5/lora_extra_step.py",),
    task="Add U @ Q to the accumulator of a tiled GEMM as R rank-one updates, acc += U[:, j] Q[j, :] for "
         "j = 0 .. R - 1, instead of a tensor-core dot: no shared memory for Q's tile. (Comparing the two forms' "
         "shared memory and speed inside v4's kernel is the GPU half of the chapter's exercise.)",
    hint="R is a constexpr, so tl.static_range(R) unrolls the loop; column j of U is u_ptr + offs_m * stride_um + j "
         "(one value per row of the tile), row j of Q is q_ptr + j * stride_qr + offs_n (one per column); "
         "u_j[:, None] * q_j[None, :] is the rank-one tile to add",
    check=_check_lora_extra_step,
    # q_transposed reads past Q: the interpreter stops at the first out-of-bounds load, a GPU reads on and its
    # products come out wrong
    planted={"range_short": "c[0, 0]", "q_transposed": "out-of-bounds|c[0, 0]", "u_row_for_column": "c[0, 0]"},
    gpu="compiling the two forms of v4's extra step for sm_90 and timing them against Part 4's kernel",
)


# ------------------------------------------------------------------------------------------- torch-compile.8
def _explain(fn, *args):
    """torch._dynamo.explain of fn on args, from a clean cache and without Dynamo's warnings in the report."""
    import logging

    log = logging.getLogger("torch._dynamo")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        torch._dynamo.reset()
        return torch._dynamo.explain(fn)(*args)
    finally:
        log.setLevel(level)
        torch._dynamo.reset()


def _why_break(reason: str) -> str:
    """What a graph break's reason means, in the chapter's words."""
    if "item()" in reason:
        return (".item() turns a tensor into a Python number on the host, which the trace does not have: keep the "
                "value a tensor (torch.clamp, torch.where)")
    if "nonzero" in reason or "ynamic shape" in reason:
        return ("indexing with a boolean mask gives a tensor whose size depends on the values (aten.nonzero), a "
                "data-dependent shape: keep every element and zero the unwanted ones with torch.where")
    if "jump" in reason or "ata-dependent" in reason or "bool" in reason:
        return ("a Python if on a tensor's value branches on data the trace does not have: write the branch as "
                "arithmetic on tensors (torch.clamp, torch.where)")
    return "whatever Dynamo cannot trace ends the graph"


def _check_no_graph_break(run: Run) -> None:
    mod = run.module()
    g = torch.Generator().manual_seed(60)
    x = torch.randn(1000, generator=g)
    norm = torch.linalg.vector_norm(x.double()).item()
    clip_cases = (("norm above max_norm", x, norm / 4), ("norm below max_norm", x, norm * 2),
                  ("norm equal to max_norm", x, norm), ("all zeros", torch.zeros(100), 1.0),
                  ("a 2-D tensor, norm above max_norm", torch.randn(30, 40, generator=g), 3.0))
    mean_cases = (("half of them positive", x), ("one positive", torch.tensor([-1.0, 2.5, -3.0, 0.0])),
                  ("none positive: nan", -x.abs()), ("a 2-D tensor", torch.randn(30, 40, generator=g)))

    def clip_ref(t, max_norm):
        n = torch.linalg.vector_norm(t.double())
        return (t.double() * (max_norm / n if n > max_norm else 1.0)).float()

    def clip_values(fn, what, t, max_norm):
        call = f"clip_by_norm(x, {max_norm:.6g}) ({what}, |x| = {torch.linalg.vector_norm(t.double()).item():.6g})"
        got = fn(t.clone(), max_norm)
        if torch.is_tensor(got) and got.shape == t.shape:
            got_norm = torch.linalg.vector_norm(got.double()).item()
            want_norm = min(torch.linalg.vector_norm(t.double()).item(), max_norm)
            if not math.isclose(got_norm, want_norm, rel_tol=1e-5, abs_tol=1e-6):
                how = (": x came back unscaled" if torch.equal(got, t) else
                       ": x was scaled up" if got_norm > want_norm else "")
                raise Failure(f"{call} has norm {got_norm:.6g}, expected min(|x|, max_norm) = {want_norm:.6g}{how}. "
                              f"The factor is min(1, max_norm / |x|)")
        close(call, got, clip_ref(t, max_norm), 1e-5, 1e-6)

    def mean_ref(t):
        return t.double()[t > 0].mean().float()

    def mean_values(fn, what, t):
        call = f"positive_mean(x) ({what})"
        got, want = fn(t.clone()), mean_ref(t)
        if not torch.is_tensor(got) or got.numel() != 1:
            raise Failure(f"{call} should be a tensor of one element, got {got!r}")
        g, w = got.item(), want.item()
        if math.isnan(w) and not math.isnan(g):
            raise Failure(f"{call} = {g:.6g}, expected nan: no element is positive, and the mean of none is 0 / 0")
        if not math.isnan(w) and not math.isclose(g, w, rel_tol=1e-5, abs_tol=1e-6):
            over_all = torch.where(t > 0, t.double(), 0.0).mean().item()
            how = (": that is the sum of the positive elements over all n elements; divide by the number of "
                   "positive ones" if math.isclose(g, over_all, rel_tol=1e-5) else "")
            raise Failure(f"{call} = {g:.6g}, expected {w:.6g}{how}")

    for name, check_values, cases in (("clip_by_norm", clip_values, clip_cases),
                                      ("positive_mean", mean_values, mean_cases)):
        fn = getattr(mod, name, None)
        if not callable(fn):
            raise Failure(f"{name} is missing or not a function")
        for what, *args in cases:
            with run.case(f"{name}: the eager values, {what}"):
                check_values(fn, what, *args)
        with run.case(f"{name}: one graph, no graph break (torch._dynamo.explain)",
                      hint="under torch.compile the tensors hold no values, only shapes and dtypes: whatever "
                           "depends on the values (a Python if, .item(), a boolean index) must stay a tensor "
                           "operation"):
            ex = _explain(fn, *cases[0][1:])
            if ex.graph_break_count or ex.graph_count != 1:
                reason = str(ex.break_reasons[0].reason) if ex.break_reasons else "(no reason given)"
                first = " ".join(reason.split())[:200]
                raise Failure(f"{name} compiles to {ex.graph_count} graphs with {ex.graph_break_count} graph "
                              f"break(s): {_why_break(reason)}. Dynamo says: {first}")
        with run.case(f"{name}: torch.compile(fullgraph=True) gives the eager values"):
            torch._dynamo.reset()
            compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
            for what, *args in cases:
                check_values(compiled, what, *args)
            torch._dynamo.reset()


no_graph_break = Exercise(
    id="part5.torch-compile.8", title="Two functions without a graph break", difficulty=2, kind="python",
    files=("part5/no_graph_break.py",),
    task="clip_by_norm_eager and positive_mean_eager are correct in eager mode, and each is two graphs under "
         "torch.compile: a .item() that feeds a Python if, and a boolean mask whose result has a size that "
         "depends on the data, end the graph there. Write clip_by_norm and positive_mean, with the same values, "
         "so that Dynamo captures each in one graph (torch._dynamo.explain counts the graphs and names the "
         "breaks): what the data decides must stay in tensors.",
    hint="clip: multiply by torch.clamp(max_norm / norm, max=1.0), a factor that is 1 when the norm is small "
         "enough; mean: sum torch.where(x > 0, x, 0.0) and divide by the number of positive elements, a tensor "
         "too",
    check=_check_no_graph_break,
    planted={"tensor_if": "graph break", "clamp_min": "min(|x|, max_norm)", "mask_index": "data-dependent shape",
             "mean_of_all": "positive ones"},
)

# ------------------------------------------------------------------------------------------- why-fusion.8
def _backward_ref(dy, x, b, p, seed):
    """dL/dx and dL/db of y = r + dropout_p(gelu(x + b)) in float64 by autograd, with the forward's keep bits
    (element i = row * N + col kept when rand(seed, i) >= p), and the keep bits themselves."""
    from snippets.common.dropout import keep_ref

    keep = torch.from_numpy(keep_ref(seed, p, x.numel())).view(x.shape)
    xd, bd = x.double().requires_grad_(), b.double().requires_grad_()
    scale = 0.0 if p == 1 else 1.0 / (1.0 - p)
    y = torch.where(keep, torch.nn.functional.gelu(xd + bd) * scale, 0.0)
    dx, db = torch.autograd.grad(y, (xd, bd), dy.double())
    return dx.float(), db.float(), keep


def _diagnose_dx(got, dy, x, b, p, keep, want) -> None:
    """When dx is wrong, which of the backward's three factors is: the keep bits, the 1 / (1 - p), gelu'."""
    if torch.allclose(got, want, rtol=1e-5, atol=1e-6):
        return
    nonzero = got != 0
    if not bool(nonzero.any()):
        raise Failure(f"dx is 0 everywhere; expected, for instance, dx[0, 0] = {float(want[0, 0]):.6g} (is the "
                      f"kernel written yet?)")
    lost, extra = int((keep & ~nonzero).sum()), int((~keep & nonzero).sum())
    if lost + extra > keep.numel() // 50:
        raise Failure(f"dx is 0 at {lost} element(s) the forward kept and nonzero at {extra} it dropped (of "
                      f"{keep.numel()}): the keep bits are not the forward's. Regenerate them with the forward's "
                      f"counter, the element's flat index row * N + col, and the same seed and p",
                      hint="offs = rows[:, None] * N + cols[None, :] is both the address and the Philox counter: "
                           "tl.rand(seed, offs) >= p")
    kept = keep & (want.abs() > 1e-6)
    if bool(kept.any()) and 0 < p < 1 and torch.allclose(got[kept], want[kept] * (1 - p), rtol=1e-5, atol=1e-6):
        raise Failure(f"dx is (1 - p) = {1 - p:g} times the expected value wherever the element was kept: the "
                      f"forward scaled the kept elements by 1 / (1 - p), so the backward must too")
    h = x.double() + b.double()
    phi_only = torch.where(keep, dy.double() * 0.5 * (1 + torch.erf(h / math.sqrt(2))) / (1 - p), 0.0)
    if torch.allclose(got.double(), phi_only, rtol=1e-5, atol=1e-6):
        raise Failure("dx is dy * Phi(h) / (1 - p) where kept: gelu(h) = h Phi(h), so by the product rule "
                      "gelu'(h) = Phi(h) + h phi(h), with phi(h) = exp(-h^2 / 2) / sqrt(2 pi)")


def _check_fused_backward(run: Run) -> None:
    mod = run.module()
    for m, n, p, seed, blocks in ((3, 100, 0.3, 2024, (2, 64)), (5, 257, 0.5, 7, (2, 64)),
                                  (4, 64, 0.1, 123, (4, 32)), (1, 1, 0.3, 9, (2, 64)),
                                  (2, 300, 0.0, 5, (2, 128))):
        with run.case(f"{m} x {n}, p = {p}, seed = {seed}, tiles of {blocks[0]} x {blocks[1]}"):
            x, dy = randn(m, n, seed=70, scale=2.0), randn(m, n, seed=71)
            b = randn(n, seed=72)
            want, want_db, keep = _backward_ref(dy, x, b, p, seed)
            dx = Output((m, n), run.device, name="dx")
            db = mod.bias_gelu_dropout_backward(inp(dy, run.device), inp(x, run.device), inp(b, run.device), p,
                                                seed, dx.tensor, block_m=blocks[0], block_n=blocks[1])
            got = dx.check()
            _diagnose_dx(got, dy, x, b, p, keep, want)
            close("dx", got, want, 1e-5, 1e-6)
            close("db (the column sum of dx)", db.cpu(), want_db, 1e-5, 1e-5)


fused_backward = Exercise(
    id="part5.why-fusion.8", title="The fused backward of bias, GELU and dropout", difficulty=3, kind="triton",
    files=("part5/fused_backward.py",),
    task="Write the kernel of the fused op's backward (the chapter's exercise 2) for the gradient that needs one: "
         "dL/dx = dL/dy * k * gelu'(x + b) / (1 - p), where k is the forward's keep bit, regenerated from the "
         "seed with the forward's counter, and gelu'(h) = Phi(h) + h phi(h) for the exact GELU h Phi(h). "
         "(dL/dr is dL/dy itself, and dL/db the column sum of dL/dx, which the launcher takes.) Only the seed "
         "and the inputs are needed: the forward saves no mask. The check compares with autograd through the "
         "chapter's reference in float64.",
    hint="offs = rows[:, None] * N + cols[None, :] is the address and the forward's Philox counter: keep = "
         "tl.rand(seed, offs) >= p. With h = x + b in fp32, Phi(h) = 0.5 * (1 + tl.math.erf(h / sqrt(2))) and "
         "phi(h) = tl.exp(-0.5 * h * h) / sqrt(2 pi); dx = tl.where(keep, dy * (Phi + h * phi) * scale, 0.0)",
    check=_check_fused_backward,
    planted={"tile_counter": "flat index", "no_scale": "1 / (1 - p)", "phi_only": "product rule"},
)

EXERCISES = [residual_epilogue, add_rmsnorm, swiglu, rope, zloss, gqa_bytes, flash, lora_extra_step,
             no_graph_break, fused_backward]
