"""Part 5: fusion and FlashAttention."""

from __future__ import annotations

import math

import torch

from exercises import compare
from exercises.catalog.helpers import Output, close, inp, model, randn
from exercises.engine import Exercise, Run

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
    planted={"range_short": "c[0, 0]", "q_transposed": "out-of-bounds", "u_row_for_column": "c[0, 0]"},
    gpu="compiling the two forms of v4's extra step for sm_90 and timing them against Part 4's kernel",
)


EXERCISES = [residual_epilogue, add_rmsnorm, swiglu, rope, zloss, gqa_bytes, flash, lora_extra_step]
