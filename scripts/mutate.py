"""A mutation campaign over the kernels of Parts 1-5: plant one semantic bug at a time and check that the
tests notice.

Each mutant names a file, an exact piece of its text (found exactly once), the text that replaces it, and
the tests that should catch it (pytest arguments: files and a -k expression; CPU only, Triton under the
interpreter). The bugs are the ones kernels really have: a mask off by one (``<`` for ``<=``), a changed
eps, a missing max subtraction, a wrong scale factor (1/sqrt(d), 1/(1-p)), a narrower accumulator, index
arithmetic off by one or a stride swapped, a term dropped from a backward pass, a sign flipped.

The campaign copies the repository (tracked and untracked files, not the working tree's caches) into a
temporary directory per worker, applies each mutant to the copy, runs its tests there in a subprocess with
a timeout (``pytest -x``: the first failure kills the mutant), and restores the file. A crash or a timeout
counts as killed; a test run that collects nothing, or a selection that fails before any mutant is
applied (the baseline run), makes the mutant *broken*, which is neither. The working tree is never touched.

    python scripts/mutate.py                  # every mutant, 2 workers; a table and build/mutate.json
    python scripts/mutate.py --list           # the mutants, without running anything
    python scripts/mutate.py --only rmsnorm_eps --only softmax_no_max_v2 -j 1
    python scripts/mutate.py --check          # each original text found exactly once (no tests run)

Exit status: 0 when the share killed reaches ``--goal`` (95% by default) and nothing is broken.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    file: str           # relative to the repository root
    original: str       # exact text, found exactly once in the file
    replacement: str
    tests: tuple        # pytest arguments: test files and options (-k EXPR)
    bug: str            # the bug it stands for


def _m(name, file, original, replacement, tests, bug) -> Mutant:
    return Mutant(name, file, original, replacement, tuple(tests), bug)


def _sel(*files: str, k: str | None = None) -> tuple:
    return (*(f"tests/{f}" for f in files), *(("-k", k) if k else ()))


P1 = "snippets/part1/"
P2 = "snippets/part2/"
P3 = "snippets/part3/"
P4 = "snippets/part4/"
P5 = "snippets/part5/"
COMMON = "snippets/common/"

ELEMENTWISE = _sel("test_part1.py", "test_ops.py", k="vector_add or scale or relu or saxpy or test_part1")
RMSNORM = _sel("test_part5_rmsnorm.py", "test_reference_constants.py", "test_ops.py", k="rmsnorm")
LAYERNORM = _sel("test_part4_layernorm.py", "test_reference_constants.py", "test_ops.py", k="layernorm")
SOFTMAX = _sel("test_part4_softmax.py", "test_ops.py", k="softmax")
MATMUL = _sel("test_part4_matmul.py", "test_ops.py", k="matmul and not epilogue")
WMMA = _sel("test_part3_wmma.py", "test_ops.py", k="wmma or tf32")
DROPOUT = _sel("test_part4_dropout.py", "test_ops.py", k="dropout and not residual")
CROSS_ENTROPY = _sel("test_part5_cross_entropy.py", "test_reference_constants.py", "test_ops.py",
                     k="cross_entropy")
SWIGLU = _sel("test_part5_swiglu.py", "test_reference_constants.py", "test_ops.py", k="swiglu or geglu")
ROPE = _sel("test_part5_rope.py", "test_reference_constants.py", "test_ops.py", k="rope")
FLASH = _sel("test_part5_flash_attention.py", "test_reference_constants.py", "test_ops.py",
             k="flash or attention")
FUSION = _sel("test_part5_fusion.py", "test_ops.py", k="bias_gelu_dropout_residual or fusion")
COUNTER = _sel("test_part5_fusion.py", "test_reference_constants.py", "test_ops.py",
               k="counter or standardize")
EPILOGUE = _sel("test_part5_epilogue.py", "test_ops.py", k="epilogue")
LORA = _sel("test_part5_lora.py", "test_ops.py", k="lora")

MUTANTS: tuple[Mutant, ...] = (
    # ------------------------------------------------------------------ Part 1
    _m("add_mask_le", P1 + "elementwise.py",
       "    mask = offs < n  # the last program runs past the end unless BLOCK divides n",
       "    mask = offs <= n  # the last program runs past the end unless BLOCK divides n",
       ELEMENTWISE, "mask bound < -> <=: one element past the end is read and written"),
    _m("add_subtracts", P1 + "elementwise.py",
       "    out = x.to(tl.float32) + y.to(tl.float32)\n",
       "    out = x.to(tl.float32) - y.to(tl.float32)\n",
       ELEMENTWISE, "the wrong operation"),
    _m("relu_flipped", P1 + "elementwise.py",
       "        out = tl.where(x < 0, 0.0, x)",
       "        out = tl.where(x > 0, 0.0, x)",
       ELEMENTWISE, "comparison reversed"),
    _m("saxpy_scales_both", P1 + "elementwise.py",
       "        out = alpha * x + y\n",
       "        out = alpha * (x + y)\n",
       ELEMENTWISE, "precedence: alpha applied to y as well"),
    _m("divergence_path_a", P1 + "divergence.py",
       "        a = a * a - 0.5\n        b = b * 0.5 + 0.25\n    tl.store",
       "        a = a * a + 0.5\n        b = b * 0.5 + 0.25\n    tl.store",
       _sel("test_part1.py", "test_ops.py", k="divergence or two_paths"), "a sign flipped in one branch"),
    # ------------------------------------------------------------------ Part 2
    _m("matrix_add_stride_swap", P2 + "matrix_add.py",
       "        y = tl.load(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :], mask=mask)",
       "        y = tl.load(y_ptr + offs_m[:, None] * stride_xm + offs_n[None, :], mask=mask)",
       _sel("test_part2_matrix_add.py", "test_ops.py", k="matrix_add"), "x's row stride used for y"),
    _m("matrix_add_row_mask_le", P2 + "matrix_add.py",
       "        mask = (offs_m[:, None] < m) & mask_n[None, :]",
       "        mask = (offs_m[:, None] <= m) & mask_n[None, :]",
       _sel("test_part2_matrix_add.py", "test_ops.py", k="matrix_add"),
       "row mask rows <= M: a row past the end is read and written"),
    _m("transpose_out_stride", P2 + "transpose.py",
       "    tl.store(out_ptr + offs_n[:, None] * m + offs_m[None, :], tl.trans(tile), mask=mask_t)",
       "    tl.store(out_ptr + offs_n[:, None] * n + offs_m[None, :], tl.trans(tile), mask=mask_t)",
       _sel("test_part2_transpose.py", "test_ops.py", k="transpose"),
       "the output's row length taken from the input"),
    _m("transpose_store_mask_le", P2 + "transpose.py",
       "    mask_t = (offs_n[:, None] < n) & (offs_m[None, :] < m)",
       "    mask_t = (offs_n[:, None] <= n) & (offs_m[None, :] < m)",
       _sel("test_part2_transpose.py", "test_ops.py", k="transpose"), "store mask <= : writes past the end"),
    _m("conv1d_off_by_one", P2 + "conv1d.py",
       "        src = offs + (j - half)",
       "        src = offs + (j - half) + 1",
       _sel("test_part2_conv1d.py", "test_ops.py", k="conv1d"), "tap index off by one"),
    _m("conv1d_padding_drops_x0", P2 + "conv1d.py",
       "mask=(src >= 0) & (src < n), other=0.0)",
       "mask=(src > 0) & (src < n), other=0.0)",
       _sel("test_part2_conv1d.py", "test_ops.py", k="conv1d"), "padding mask > 0: x[0] never contributes"),
    _m("strided_copy_ignores_stride", P2 + "coalescing.py",
       "    vals = tl.load(src_ptr + offs * stride, mask=mask)",
       "    vals = tl.load(src_ptr + offs, mask=mask)",
       _sel("test_part2_coalescing.py", "test_ops.py", k="strided or offset_copy or coalescing"),
       "the stride left out of the index"),
    # ------------------------------------------------------------------ Part 3
    _m("histogram_drops_bin0", P3 + "histogram.py",
       "        v = tl.where(inb & (v >= 0) & (v < bins), v, bins)",
       "        v = tl.where(inb & (v > 0) & (v < bins), v, bins)",
       _sel("test_part3_histogram.py", "test_ops.py", k="histogram"), "range check > 0: bin 0 lost"),
    _m("histogram_atomic_mask_le", P3 + "histogram.py",
       "mask=(b < bins) & (acc != 0))",
       "mask=(b <= bins) & (acc != 0))",
       _sel("test_part3_histogram.py", "test_ops.py", k="histogram"),
       "atomic mask <= bins: the spare bin is added one past the end of counts"),
    _m("reduce_pads_with_one", P3 + "reduce.py",
       "    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)    # past the end: 0, the identity of +",
       "    x = tl.load(x_ptr + offs, mask=offs < n, other=1.0)    # past the end: 0, the identity of +",
       _sel("test_part3_reduce.py", "test_ops.py", k="reduce"), "padding is not the identity of +"),
    _m("reduce_fp16_accumulator", P3 + "reduce.py",
       "    tl.store(partial_ptr + pid, tl.sum(x.to(tl.float32), axis=0))",
       "    tl.store(partial_ptr + pid, tl.sum(x, axis=0))",
       _sel("test_part3_reduce.py", "test_ops.py", k="reduce"),
       "accumulator in the input dtype (fp16/bf16 sums) instead of fp32"),
    _m("scan_inclusive_carry", P3 + "scan.py",
       "        tl.store(sums_ptr + offs, tl.cumsum(v, axis=0) - v + carry, mask=offs < tiles)",
       "        tl.store(sums_ptr + offs, tl.cumsum(v, axis=0) + carry, mask=offs < tiles)",
       _sel("test_part3_scan.py", "test_ops.py", k="scan"), "inclusive instead of exclusive block offsets"),
    _m("gemm_k_stride", COMMON + "gemm.py",
       "        b_ptrs += BLOCK_K * stride_bk\n    c_ptrs = c_ptr + offs_m[:, None].to(tl.int64) * stride_cm",
       "        b_ptrs += BLOCK_K\n    c_ptrs = c_ptr + offs_m[:, None].to(tl.int64) * stride_cm",
       WMMA, "B advanced along N instead of K"),
    _m("gemm_fp16_accumulator", COMMON + "gemm.py",
       "        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)",
       "        acc = tl.dot(a, b, acc.to(a.dtype), input_precision=INPUT_PRECISION,\n"
       "                     out_dtype=a.dtype).to(tl.float32)",
       WMMA, "accumulator fp32 -> the input dtype (fp16 partial sums)"),
    # ------------------------------------------------------------------ Part 4
    _m("softmax_no_max_v2", P4 + "softmax.py",
       "    x = x - tl.max(x, axis=0)\n    e = tl.exp(x)\n    y = e / tl.sum(e, axis=0)",
       "    e = tl.exp(x)\n    y = e / tl.sum(e, axis=0)",
       SOFTMAX, "missing max subtraction: exp overflows for large logits"),
    _m("softmax_v3_normalised_by_max", P4 + "softmax.py",
       "        y = e * (1.0 / tl.sum(e, axis=0))",
       "        y = e * (1.0 / tl.max(e, axis=0))",
       SOFTMAX, "normalised by the wrong reduction"),
    _m("softmax_sum_in_fp16", P4 + "softmax.py",
       "    x = x - tl.max(x, axis=0)\n    e = tl.exp(x)\n    y = e / tl.sum(e, axis=0)",
       "    x = x - tl.max(x, axis=0)\n    e = tl.exp(x)\n"
       "    y = e / tl.sum(e.to(tl.float16), axis=0).to(tl.float32)",
       SOFTMAX, "accumulator fp32 -> fp16: the row sum added up in fp16"),
    _m("softmax_persistent_row_step", P4 + "softmax.py",
       "    for row in tl.range(pid, n_rows, tl.num_programs(0), num_stages=NUM_STAGES):",
       "    for row in tl.range(pid, n_rows, tl.num_programs(0) + 1, num_stages=NUM_STAGES):",
       SOFTMAX, "persistent grid stride off by one: some rows are never computed"),
    _m("softmax_online_no_rescale", P4 + "softmax.py",
       "        s = s * tl.exp(m - shift) + tl.exp(x - shift)\n        m = m_new\n    # Merge",
       "        s = s + tl.exp(x - shift)\n        m = m_new\n    # Merge",
       SOFTMAX, "online softmax: the running sum not rescaled when the max grows"),
    _m("softmax_online_lane_merge", P4 + "softmax.py",
       "    row_sum = tl.sum(s * tl.exp(m - row_max), axis=0)",
       "    row_sum = tl.sum(s, axis=0)",
       SOFTMAX, "online softmax: the lanes' sums merged without rescaling to the row max"),
    _m("softmax_online_chunk_index", P4 + "softmax.py",
       "        cols = (tl.cdiv(n_cols, BLOCK_N) - 1 - i) * BLOCK_N + offs",
       "        cols = (tl.cdiv(n_cols, BLOCK_N) - i) * BLOCK_N + offs",
       SOFTMAX, "pass 2 chunk index off by one: the first chunk is never written"),
    _m("matmul_b_stride_swap", P4 + "matmul.py",
       "        a_ptrs += BLOCK_K * stride_ak\n        b_ptrs += BLOCK_K * stride_bk\n    if HAS_SCALES:",
       "        a_ptrs += BLOCK_K * stride_ak\n        b_ptrs += BLOCK_K * stride_bn\n    if HAS_SCALES:",
       MATMUL, "stride swap: B advanced by its column stride"),
    _m("matmul_k_mask_off_by_one", P4 + "matmul.py",
       "        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < K - k0), other=0.0)",
       "        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < K - k0 - 1), other=0.0)",
       MATMUL, "K mask off by one: the last column of A never enters the sums"),
    _m("matmul_fp16_accumulator", P4 + "matmul.py",
       "        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)\n    for k0 in range(0, K, BLOCK_K):",
       "        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float16)\n    for k0 in range(0, K, BLOCK_K):",
       MATMUL, "accumulator fp32 -> fp16"),
    _m("matmul_store_mask_le", P4 + "matmul.py",
       "    c_ptrs = c_ptr + offs_m[:, None].to(tl.int64) * stride_cm + offs_n[None, :] * stride_cn\n"
       "    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty),\n"
       "             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))",
       "    c_ptrs = c_ptr + offs_m[:, None].to(tl.int64) * stride_cm + offs_n[None, :] * stride_cn\n"
       "    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty),\n"
       "             mask=(offs_m[:, None] <= M) & (offs_n[None, :] < N))",
       MATMUL, "store mask rows <= M: a row of C past the end is written"),
    _m("matmul_fp8_one_scale", P4 + "matmul.py",
       "    if HAS_SCALES:  # fp8: one multiply per element of C, not one per product\n"
       "        acc = acc * (tl.load(scale_a_ptr) * tl.load(scale_b_ptr))",
       "    if HAS_SCALES:  # fp8: one multiply per element of C, not one per product\n"
       "        acc = acc * tl.load(scale_a_ptr)",
       MATMUL, "fp8: B's scale forgotten"),
    _m("layernorm_padding_in_variance", P4 + "layernorm.py",
       "    xc = tl.where(mask, x - mean[:, None], 0.0)  # padding must not add (0 - mean)^2 to the variance",
       "    xc = x - mean[:, None]  # padding must not add (0 - mean)^2 to the variance",
       LAYERNORM, "padding lanes add mean^2 to the variance"),
    _m("layernorm_eps_outside_sqrt", P4 + "layernorm.py",
       "    rstd = 1.0 / tl.sqrt(var + eps)\n\n    # w and b",
       "    rstd = 1.0 / (tl.sqrt(var) + eps)\n\n    # w and b",
       LAYERNORM, "1/sqrt(var + eps) -> 1/(sqrt(var) + eps)"),
    _m("layernorm_eps", P4 + "layernorm.py",
       "EPS = 1e-5\n", "EPS = 1e-6\n",
       LAYERNORM, "eps 1e-5 -> 1e-6"),
    _m("layernorm_bwd_drops_mean_g", P4 + "layernorm.py",
       "        dx = rstd * (g - c_g - xhat * c_gx)",
       "        dx = rstd * (g - xhat * c_gx)",
       LAYERNORM, "backward: the mean(g) term dropped from dx"),
    _m("layernorm_bwd_dw", P4 + "layernorm.py",
       "        dw_acc += dy * xhat\n        db_acc += dy",
       "        dw_acc += dy\n        db_acc += dy",
       LAYERNORM, "backward: dw summed without xhat"),
    _m("layernorm_db_reads_dw", P4 + "layernorm.py",
       "        db += tl.load(db_part_ptr + offs, mask=mask, other=0.0)",
       "        db += tl.load(dw_part_ptr + offs, mask=mask, other=0.0)",
       LAYERNORM, "db summed from dw's partials"),
    _m("dropout_no_scale", COMMON + "dropout.py",
       "    y = tl.where(keep, x.to(tl.float32) * scale, 0.0)",
       "    y = tl.where(keep, x.to(tl.float32), 0.0)",
       DROPOUT, "kept elements not scaled by 1/(1-p)"),
    _m("dropout_scale_1_over_p", COMMON + "dropout.py",
       "    scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)",
       "    scale = 0.0 if p == 1.0 else 1.0 / p",
       DROPOUT, "scale 1/(1-p) -> 1/p"),
    _m("dropout4x_word_order", P4 + "dropout.py",
       "    u = tl.reshape(tl.join(tl.join(u0, u2), tl.join(u1, u3)), (BLOCK,))",
       "    u = tl.reshape(tl.join(tl.join(u0, u1), tl.join(u2, u3)), (BLOCK,))",
       DROPOUT, "the four Philox words assigned to the wrong elements"),
    _m("dropout_backward_no_scale", P4 + "dropout.py",
       "    dx = tl.where(keep, dy.to(tl.float32) * scale, 0.0)",
       "    dx = tl.where(keep, dy.to(tl.float32), 0.0)",
       DROPOUT, "backward: the 1/(1-p) factor dropped"),
    # ------------------------------------------------------------------ Part 5
    _m("rmsnorm_eps", P5 + "rmsnorm.py",
       "EPS = 1e-6\n", "EPS = 1e-5\n",
       RMSNORM, "eps 1e-6 -> 1e-5 (issue 15: passed all 99 RMSNorm tests)"),
    _m("rmsnorm_eps_outside_sqrt", P5 + "rmsnorm.py",
       "    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / N + eps)",
       "    rstd = 1.0 / (tl.sqrt(tl.sum(x * x, axis=1) / N) + eps)",
       RMSNORM, "1/sqrt(ms + eps) -> 1/(sqrt(ms) + eps) (issue 15: caught by one test)"),
    _m("rmsnorm_mean_over_block", P5 + "rmsnorm.py",
       "    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / N + eps)",
       "    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / BLOCK_N + eps)",
       RMSNORM, "mean over the padded block instead of N"),
    _m("rmsnorm_bwd_drops_term", P5 + "rmsnorm.py",
       "        dx = rstd * (g - xhat * c)",
       "        dx = rstd * g",
       RMSNORM, "backward: the xhat * mean(g * xhat) term dropped"),
    _m("rmsnorm_column_sum_mask_le", P5 + "rmsnorm.py",
       "        mask = (g < GROUPS)[:, None] & col_ok[None, :]",
       "        mask = (g <= GROUPS)[:, None] & col_ok[None, :]",
       RMSNORM, "group mask <= GROUPS: a partial row past the end is summed"),
    _m("swiglu_gelu_constant", P5 + "swiglu.py",
       "        k = 1.5957691216057308 * (a + 0.044715 * a * a * a)",
       "        k = 1.5957691216057308 * (a + 0.04715 * a * a * a)",
       SWIGLU, "GELU-tanh's 0.044715 mistyped"),
    _m("swiglu_bwd_drops_term", P5 + "swiglu.py",
       "    dact = s + act * (1.0 - s) * dk",
       "    dact = s * dk",
       SWIGLU, "backward: the a * s * (1 - s) term of silu' dropped"),
    _m("swiglu_bwd_db", P5 + "swiglu.py",
       "    tl.store(db_ptr + offs, (dc * act).to(db_ptr.dtype.element_ty), mask=mask)",
       "    tl.store(db_ptr + offs, (dc * s).to(db_ptr.dtype.element_ty), mask=mask)",
       SWIGLU, "backward: db = dc * sigmoid(a) instead of dc * silu(a)"),
    _m("rope_sign", P5 + "rope.py",
       "    y1 = x1 * c1[None, :] - x2 * sa[None, :]",
       "    y1 = x1 * c1[None, :] + x2 * sa[None, :]",
       ROPE, "rotation sign flipped"),
    _m("rope_backward_direction", P5 + "rope.py",
       "        sa = -s2\n",
       "        sa = s2\n",
       ROPE, "backward rotates by +theta for one half"),
    _m("rope_position", P5 + "rope.py",
       "    pos = token % S",
       "    pos = token // S",
       ROPE, "index arithmetic: position from the batch index"),
    _m("rope_theta", P5 + "rope.py",
       "BASE = 500000.0  # Llama 3's rope_theta", "BASE = 10000.0  # Llama 3's rope_theta",
       ROPE, "rope_theta 500000 (Llama 3) -> 10000 (Llama 2) in the tables"),
    _m("cross_entropy_onehot_sign", P5 + "cross_entropy.py",
       "                g = tl.where(cols == target, g - 1.0, g)",
       "                g = tl.where(cols == target, g + 1.0, g)",
       CROSS_ENTROPY, "gradient: the one-hot added instead of subtracted"),
    _m("cross_entropy_no_mean", P5 + "cross_entropy.py",
       "        inv_n = 1.0 / n_valid.to(COMPUTE)",
       "        inv_n = 1.0",
       CROSS_ENTROPY, "gradient of the sum, not of the mean"),
    _m("cross_entropy_smoothing_uniform_term", P5 + "cross_entropy.py",
       "                g = g - smoothing / n_cols\n",
       "",
       CROSS_ENTROPY, "label smoothing: the eps / V term of the gradient dropped"),
    _m("cross_entropy_lse_without_max", P5 + "cross_entropy.py",
       "        lse = row_max + tl.log(tl.sum(s * tl.exp(m - row_max), axis=0))",
       "        lse = tl.log(tl.sum(s * tl.exp(m - row_max), axis=0))",
       CROSS_ENTROPY, "log-sum-exp without adding the max back"),
    _m("cross_entropy_target_index", P5 + "cross_entropy.py",
       "        x_target = tl.load(x_row + target).to(COMPUTE)",
       "        x_target = tl.load(x_row + target + 1).to(COMPUTE)",
       CROSS_ENTROPY, "index +1: the loss takes the logit next to the target's"),
    _m("cross_entropy_ignore_index", P5 + "cross_entropy.py",
       "IGNORE_INDEX = -100\n", "IGNORE_INDEX = -1\n",
       CROSS_ENTROPY, "ignore_index -100 -> -1"),
    _m("attention_scale", P5 + "flash_attention.py",
       "        return 1.0 / math.sqrt(d)",
       "        return 1.0 / d",
       FLASH, "scale 1/sqrt(d) -> 1/d"),
    _m("attention_alpha_sign", P5 + "flash_attention.py",
       "        alpha = tl.exp2(m_i - m_new)",
       "        alpha = tl.exp2(m_new - m_i)",
       FLASH, "online softmax rescale factor inverted"),
    _m("attention_causal_diagonal", P5 + "flash_attention.py",
       "        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale\n        if MASKED:\n"
       "            keep = cols[None, :] < S\n            if CAUSAL:\n"
       "                keep = keep & (cols[None, :] <= offs_m[:, None])",
       "        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale\n        if MASKED:\n"
       "            keep = cols[None, :] < S\n            if CAUSAL:\n"
       "                keep = keep & (cols[None, :] < offs_m[:, None])",
       FLASH, "causal mask excludes the diagonal"),
    _m("attention_bwd_drops_delta", P5 + "flash_attention.py",
       "        ds_t = p_t * (dp_t - delta[None, :])",
       "        ds_t = p_t * dp_t",
       FLASH, "backward: dS = P * dP, the rowsum(dO * O) term dropped"),
    _m("attention_bwd_dq_scale", P5 + "flash_attention.py",
       "    tl.store(dq_ptr + base + q_offs, (dq * sm_scale).to(dq_ptr.dtype.element_ty),",
       "    tl.store(dq_ptr + base + q_offs, dq.to(dq_ptr.dtype.element_ty),",
       FLASH, "backward: dQ without the chain rule's scale"),
    _m("attention_bwd_delta_sum", P5 + "flash_attention.py",
       "    tl.store(delta_ptr + bh * S + offs_m, tl.sum(o * do, axis=1), mask=row_ok)",
       "    tl.store(delta_ptr + bh * S + offs_m, tl.sum(do, axis=1), mask=row_ok)",
       FLASH, "backward: delta = rowsum(dO) instead of rowsum(dO * O)"),
    _m("fusion_gelu_constant", P5 + "fusion.py",
       "    # exact GELU: h Phi(h), 0.707... = 1/sqrt(2)\n"
       "    g = 0.5 * h * (1.0 + tl.math.erf(h * 0.7071067811865476))",
       "    # exact GELU: h Phi(h), 0.707... = 1/sqrt(2)\n"
       "    g = 0.5 * h * (1.0 + tl.math.erf(h))",
       FUSION, "GELU: erf(h) instead of erf(h / sqrt(2))"),
    _m("fusion_dropout_scale", P5 + "fusion.py",
       "    y = r + tl.where(keep, g * scale, 0.0)",
       "    y = r + tl.where(keep, g, 0.0)",
       FUSION, "fused dropout without 1/(1-p)"),
    _m("fusion_standardize_eps", P5 + "fusion.py",
       "EPS = 1e-5  # F.layer_norm's default",
       "EPS = 1e-4  # F.layer_norm's default",
       COUNTER, "standardisation eps 1e-5 -> 1e-4"),
    _m("fusion_chan_merge", P5 + "fusion.py",
       "        m2 += c_m2 + delta * delta * count * c / total",
       "        m2 += c_m2",
       COUNTER, "chunk merge without the between-chunk term of the variance"),
    _m("epilogue_gelu_cubic", P5 + "epilogue.py",
       "        c = c * _sigmoid(1.5957691216057308 * (c + 0.044715 * c * c * c))  # 2 sqrt(2/pi)",
       "        c = c * _sigmoid(1.5957691216057308 * c)  # 2 sqrt(2/pi)",
       EPILOGUE, "GELU-tanh without its cubic term"),
    _m("epilogue_no_bias", P5 + "epilogue.py",
       "    c = acc + bias[None, :]",
       "    c = acc",
       EPILOGUE, "bias not added"),
    _m("epilogue_sigmoid_sign", P5 + "epilogue.py",
       "    return 1.0 / (1.0 + tl.exp(-z))",
       "    return 1.0 / (1.0 + tl.exp(z))",
       EPILOGUE, "sigmoid(-z) for sigmoid(z)"),
    _m("lora_project_scale", P5 + "lora.py",
       "    tl.store(u_ptrs, (acc * scale).to(u_ptr.dtype.element_ty),",
       "    tl.store(u_ptrs, acc.to(u_ptr.dtype.element_ty),",
       LORA, "LoRA: the projection's alpha/r scale dropped"),
    _m("lora_p_not_advanced", P5 + "lora.py",
       "            u_acc = tl.dot(a, p, u_acc, input_precision=PRECISION, out_dtype=ACC)\n"
       "            p_ptrs += BLOCK_K * stride_pk\n",
       "            u_acc = tl.dot(a, p, u_acc, input_precision=PRECISION, out_dtype=ACC)\n",
       LORA, "the low-rank factor's pointer not advanced along K"),
)


# ------------------------------------------------------------------------------------------------- checks

def check(root: Path = ROOT, mutants=MUTANTS) -> list[str]:
    """Problems that keep mutants from applying: a missing file, an original text found other than exactly
    once, a replacement equal to the original, a repeated name."""
    problems, names = [], set()
    for m in mutants:
        if m.name in names:
            problems.append(f"{m.name}: name used twice")
        names.add(m.name)
        path = root / m.file
        if not path.is_file():
            problems.append(f"{m.name}: no file {m.file}")
            continue
        count = path.read_text().count(m.original)
        if count != 1:
            problems.append(f"{m.name}: original text found {count} times in {m.file}")
        if m.original == m.replacement:
            problems.append(f"{m.name}: the replacement is the original")
        if not m.tests or not any(t.startswith("tests/") for t in m.tests):
            problems.append(f"{m.name}: no test files")
    return problems


def select(patterns: list[str] | None, mutants=MUTANTS) -> list[Mutant]:
    """The mutants whose name matches one of ``patterns`` (exact names or shell patterns), or all."""
    if not patterns:
        return list(mutants)
    chosen = [m for m in mutants if any(fnmatch.fnmatchcase(m.name, p) for p in patterns)]
    unknown = [p for p in patterns if not any(fnmatch.fnmatchcase(m.name, p) for m in mutants)]
    if unknown:
        raise SystemExit(f"no mutant matches {', '.join(unknown)}; see --list")
    return chosen


# ------------------------------------------------------------------------------------------------ running

def copy_repository(root: Path, dest: Path) -> Path:
    """Copy the files git sees (tracked, and untracked but not ignored) into ``dest``: no caches, no .venv,
    no build outputs. Returns ``dest``."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = root / rel
        if src.is_file():
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    return dest


def _env(copy: Path) -> dict:
    drop = ("REQUIRE_GPU", "PYTEST_ADDOPTS", "PYTHONPATH", "KM_SPLIT_PART", "INTERPRETER_BOUNDS")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1", TRITON_INTERPRET="1",
               CUDA_VISIBLE_DEVICES="")  # CPU only: the interpreter, as on a machine without a GPU
    return env


def run_tests(copy: Path, tests: tuple, timeout: float) -> dict:
    """Run ``pytest -x`` on ``tests`` in ``copy``; returns status (passed, failed, timeout, crashed,
    no_tests, error), the exit code, seconds and the last lines of output."""
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-o", "addopts=", "-p", "no:cacheprovider",
           "--no-header", "-W", "ignore", *tests]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=copy, env=_env(copy), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the whole session: pytest and anything it started
        out, _ = proc.communicate()
        rc = None
    seconds = round(time.monotonic() - start, 1)
    if rc is None:
        status = "timeout"
    elif rc < 0:
        status = "crashed"
    else:
        status = {0: "passed", 1: "failed", 5: "no_tests"}.get(rc, "error")
    tail = [line for line in out.splitlines() if line.strip()][-12:]
    return {"status": status, "rc": rc, "seconds": seconds, "tail": tail}


def _first_failure(tail: list[str]) -> str:
    for line in tail:
        if line.startswith(("FAILED", "ERROR")):
            return line[:200]
    return tail[-1][:200] if tail else ""


class Worker:
    """One copy of the repository; mutants are applied to it one at a time and undone after."""

    def __init__(self, root: Path, base: Path, index: int):
        self.copy = copy_repository(root, base / f"worker{index}")

    def run(self, m: Mutant, timeout: float) -> dict:
        path = self.copy / m.file
        text = path.read_text()
        if text.count(m.original) != 1:
            return {"name": m.name, "status": "broken", "detail": "original text not found exactly once"}
        path.write_text(text.replace(m.original, m.replacement))
        try:
            res = run_tests(self.copy, m.tests, timeout)
        finally:
            path.write_text(text)
        outcome = {"failed": "killed", "timeout": "killed", "crashed": "killed", "passed": "survived"}
        status = outcome.get(res["status"], "broken")
        return {"name": m.name, "status": status, "how": res["status"], "seconds": res["seconds"],
                "detail": _first_failure(res["tail"]) if status != "survived" else "",
                "tail": res["tail"] if status == "broken" else []}


def interpreter_problem() -> str | None:
    """Why Triton's CPU interpreter cannot run the tests here (tests/interpreter_guard.py), or None."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("interpreter_guard", ROOT / "tests" / "interpreter_guard.py")
    guard = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(guard)
    return guard.version_problem()


def campaign(mutants: list[Mutant], jobs: int = 2, timeout: float = 600, baseline: bool = True,
             root: Path = ROOT, progress=None) -> dict:
    """Run ``mutants`` on copies of ``root``: the unmutated baseline of each distinct test selection
    first (a selection that fails there breaks its mutants), then every mutant. Returns the report
    (also what --json writes)."""
    problems = check(root, mutants)
    if problems:
        raise SystemExit("mutants do not apply:\n  " + "\n  ".join(problems))
    problem = interpreter_problem()
    if problem:
        raise SystemExit(f"mutate: the tests run under Triton's interpreter, and {problem}")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mutate-") as tmp:
        workers = [Worker(root, Path(tmp), i) for i in range(max(1, jobs))]
        free = list(range(len(workers)))
        results: dict[str, dict] = {}
        bad_selections: dict[tuple, dict] = {}
        lock = threading.Lock()

        def on(fn, items):
            """Run fn(worker, item) for every item, each task on a free worker (its own copy)."""

            def task(item):
                with lock:
                    w = free.pop()
                try:
                    return item, fn(workers[w], item)
                finally:
                    with lock:
                        free.append(w)

            with futures.ThreadPoolExecutor(len(workers)) as pool:
                yield from (f.result() for f in futures.as_completed([pool.submit(task, i) for i in items]))

        if baseline:
            selections = sorted({m.tests for m in mutants})
            for sel, res in on(lambda w, s: run_tests(w.copy, s, timeout), selections):
                if progress:
                    progress(f"baseline {' '.join(sel)}: {res['status']} ({res['seconds']} s)")
                if res["status"] != "passed":
                    bad_selections[sel] = res
        todo = []
        for m in mutants:
            if m.tests in bad_selections:
                res = bad_selections[m.tests]
                results[m.name] = {"name": m.name, "status": "broken", "how": "baseline " + res["status"],
                                   "detail": _first_failure(res["tail"]), "tail": res["tail"]}
            else:
                todo.append(m)
        for m, res in on(lambda w, m: w.run(m, timeout), todo):
            results[m.name] = res
            if progress:
                progress(f"{res['status']:8} {m.name} ({res.get('seconds', 0)} s) {res.get('detail', '')}")
    rows = []
    for m in mutants:
        r = results[m.name]
        rows.append({"name": m.name, "file": m.file, "bug": m.bug, "tests": list(m.tests),
                     **{k: r.get(k) for k in ("status", "how", "seconds", "detail", "tail")}})
    killed = sum(r["status"] == "killed" for r in rows)
    return {"total": len(rows), "killed": killed, "survived": sum(r["status"] == "survived" for r in rows),
            "broken": sum(r["status"] == "broken" for r in rows),
            "score": round(killed / len(rows), 4) if rows else 0.0,
            "seconds": round(time.monotonic() - start, 1), "mutants": rows}


def table(rows: list[dict], with_status: bool = True) -> str:
    lines = []
    width = max((len(r["name"]) for r in rows), default=4)
    for r in rows:
        status = f"{r['status']:9} {r.get('how') or '':8} {r.get('seconds') or 0:6.1f} s  " if with_status else ""
        lines.append(f"{r['name']:{width}}  {status}{r['file'].removeprefix('snippets/'):28} {r['bug']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="list the mutants and their tests; run nothing")
    ap.add_argument("--check", action="store_true", help="check that every mutant applies; run nothing")
    ap.add_argument("--only", action="append", metavar="NAME", help="only this mutant (a name or a shell "
                    "pattern; repeatable)")
    ap.add_argument("-j", "--jobs", type=int, default=2, help="workers, each with its own copy (default 2)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per test run (default 600)")
    ap.add_argument("--no-baseline", action="store_true", help="skip the unmutated run of each selection")
    ap.add_argument("--json", default=str(ROOT / "build" / "mutate.json"), help="where to write the report "
                    "(default build/mutate.json; '-' for stdout)")
    ap.add_argument("--goal", type=float, default=0.95, help="the share killed to pass (default 0.95)")
    args = ap.parse_args(argv)
    chosen = select(args.only)
    if args.list:
        for m in chosen:
            print(f"{m.name}\n    {m.file}: {m.bug}\n    tests: {' '.join(m.tests)}")
        print(f"{len(chosen)} mutants")
        return 0
    if args.check:
        problems = check(ROOT, chosen)
        print("\n".join(problems) or f"all {len(chosen)} mutants apply")
        return 1 if problems else 0
    report = campaign(chosen, args.jobs, args.timeout, not args.no_baseline,
                      progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(table(report["mutants"]))
    print(f"\nkilled {report['killed']} of {report['total']} ({100 * report['score']:.1f}%), survived "
          f"{report['survived']}, broken {report['broken']}, in {report['seconds']:.0f} s")
    for r in report["mutants"]:
        if r["status"] == "survived":
            print(f"SURVIVED {r['name']}: {r['bug']} ({r['file']})")
        elif r["status"] == "broken":
            print(f"BROKEN {r['name']}: {r['how']}: {r['detail']}")
    text = json.dumps(report, indent=1)
    if args.json == "-":
        print(text)
    else:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text + "\n")
    return 0 if report["score"] >= args.goal and not report["broken"] else 1


if __name__ == "__main__":
    sys.exit(main())
