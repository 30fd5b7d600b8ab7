"""wmma_gemm v7 (snippets/part3/wmma_v7.py, csrc/wmma/mma_v7.cu): v6's kernel with the address
arithmetic and bounds checks out of the K loop.

On the CPU: every shared-memory address v7 derives once per thread (its copies and its ldmatrix
reads) is the address v6 computes per access, for every thread, copy, warp, step and lane; and
the compiled loop (SASS, sm_90) issues the same MMAs and ldmatrix reads as v6's with far fewer
integer instructions. On the GPU: v7 gives v6's result bit for bit (the same MMAs on the same
fragments in the same order), at ragged and full sizes. The tests every CUDA version takes (sizes,
refusals, special values) are in tests/test_part3_wmma.py.
"""

from __future__ import annotations

import re
import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch

from conftest import poison_allocator
from snippets.part3 import wmma as w
from snippets.part3 import wmma_v7 as w7

BM, BN = w7.V7.tile
BK, NT = w7.V7_BK, w7.V7.threads
CA, CB = BK // 8, BN // 8          # 16-byte chunks per row of the A and B tiles
RA, RB = NT // CA, NT // CB        # rows one pass of the block's copies covers
WM = WN = 64
WARPS_N = BN // WN


def test_v7_launches_like_v6():
    """v7 changes the code around the MMAs, not the launch: v6's tile, threads, stages and bytes."""
    v6 = w.CONFIGS["v6"]
    assert (w7.V7.tile, w7.V7.threads, w7.V7.smem) == (v6.tile, v6.threads, v6.smem)
    assert (w7.V7_BK, w7.V7_STAGES) == (w.MMA_BK, w.MMA_STAGES)
    assert w.wmma_gemm.impls["v7"].lang == "CUDA"


# ---------------------------------------------------------------- CPU: the address plan is v6's

@pytest.mark.parametrize("operand", ["a", "b"])
def test_v7_copies_write_where_v6s_do(operand):
    """Copy i of thread tid: v7 takes one swizzled offset per thread and steps it by RA (RB) rows,
    with the row's XOR term computed once; v6 swizzles (tid + i NT) afresh. Same chunk of shared
    memory, same row and chunk of the operand, for every thread and copy."""
    per_row, rows_per_pass = (CA, RA) if operand == "a" else (CB, RB)
    copies = (BM if operand == "a" else BK) // rows_per_pass
    for tid in range(NT):
        r0, c = tid // per_row, tid % per_row
        base = r0 * per_row + (c ^ (r0 % 8))                   # v7: once per thread
        for i in range(copies):
            idx = tid + i * NT                                  # v6: per copy
            v6_row, v6_chunk = idx // per_row, idx % per_row
            assert (r0 + rows_per_pass * i, c) == (v6_row, v6_chunk), (operand, tid, i)
            v7_dst = base + i * rows_per_pass * per_row
            assert v7_dst == w.mma_swizzle(v6_row, v6_chunk, per_row), (operand, tid, i)


def test_v7_ldmatrix_reads_where_v6s_do():
    """Every lane's ldmatrix address of every warp, 16-deep step and slab: v7's hoisted form
    (a per-lane base, 2 kk ^ c0 or 2 j ^ c0 with c0 = (l / 16) ^ (l % 8), constant offsets) equals
    v6's swizzle of the row and chunk it reads. An addition instead of the XOR, or c0 without the
    lane's half, fails here."""
    for warp in range(NT // 32):
        wm0, wn0 = (warp // WARPS_N) * WM, (warp % WARPS_N) * WN
        for lane in range(32):
            c0 = (lane // 16) ^ (lane % 8)
            a_ld = (wm0 + lane % 16) * CA
            b_ld = (lane % 16) * CB + wn0 // 8
            for kk in range(BK // 16):
                for i in range(WM // 16):
                    v7 = a_ld + i * 16 * CA + ((2 * kk) ^ c0)
                    v6 = w.mma_swizzle(wm0 + i * 16 + lane % 16, 2 * kk + lane // 16, CA)
                    assert v7 == v6, ("a", warp, lane, kk, i)
                for j in range(WN // 16):
                    v7 = b_ld + kk * 16 * CB + ((2 * j) ^ c0)
                    v6 = w.mma_swizzle(16 * kk + lane % 16, (wn0 + j * 16) // 8 + lane // 16, CB)
                    assert v7 == v6, ("b", warp, lane, kk, j)


def test_v7_takes_the_unchecked_path_only_on_whole_tiles():
    """The kernel drops the bounds checks for a tile when its block is interior (row0 + BM <= M,
    col0 + BN <= N) and the tile is whole in K (k0 + BK <= K). Those tiles never reach outside A or
    B: checked here for every block and K-step of shapes that cut the tile in every direction."""
    for m, n, k in [(4096, 4096, 4096), (1000, 2048, 4104), (128, 128, 64), (129, 264, 72)]:
        for row0 in range(0, m, BM):
            for col0 in range(0, n, BN):
                interior = row0 + BM <= m and col0 + BN <= n
                for t in range(-(-k // BK)):
                    if interior and t < k // BK:
                        assert row0 + BM <= m and col0 + BN <= n and t * BK + BK <= k


# ---------------------------------------------------------------- CPU: the compiled loop

INTEGER = ("IMAD", "LEA", "SHF", "IADD3", "VIADD", "LOP3", "SEL", "ISETP", "IABS", "PRMT")


def _k_loop(sass: str) -> Counter:
    """Opcode counts (without modifiers) of the K loop of one kernel's SASS: the innermost loop
    around its HMMAs."""
    from helpers import sass_loop

    return Counter(re.sub(r"^@!?U?P\w+\s+", "", i.strip()).split()[0].split(".")[0]
                   for i in sass_loop(sass, "HMMA"))


@pytest.fixture(scope="module")
def loops(tmp_path_factory) -> dict[str, Counter]:
    """The K loops of v6's and v7's fp16 kernels, compiled by this nvcc for sm_90 (mma_v7.cu
    includes wmma_gemm.cu, so one compile holds both)."""
    from helpers import nvcc_with_report, sass_by_function
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    out = tmp_path_factory.mktemp("v7") / "mma_v7.cubin"
    nvcc_with_report([shutil.which("nvcc"), "-std=c++17", "-cubin", "-arch=sm_90", "-I",
                      "csrc/common", "csrc/wmma/mma_v7.cu", "-o", str(out)],
                     Path(__file__).resolve().parent.parent)
    sass = sass_by_function(out)
    return {v: _k_loop(sass[f"mma_{v}_f16"]) for v in ("v6", "v7")}


def test_v7_loop_issues_v6s_mmas_and_reads(loops):
    """The work is the same: one 64-deep stage of a warp's 64 x 64 tile per iteration, 4 x 32
    mma.sync (HMMA.16816) and 4 x 8 ldmatrix.x4 (LDSM)."""
    for v in ("v6", "v7"):
        assert loops[v]["HMMA"] == 128 and loops[v]["LDSM"] == 32, (v, loops[v])


def test_v7_loop_has_two_fifths_of_v6s_integer_instructions(loops):
    """What v7 removes: v6's loop recomputes rows, chunks, the swizzle, bounds and 64-bit
    addresses for each of its 16 copies and 32 reads. v7's loop (both copy paths counted, the
    checked one included) has at most two fifths of v6's integer instructions, and at most 0.6 of
    its instructions in all."""
    ints = {v: sum(loops[v][op] for op in INTEGER) for v in ("v6", "v7")}
    total = {v: sum(loops[v].values()) for v in ("v6", "v7")}
    assert ints["v6"] > 2 * loops["v6"]["HMMA"], ints  # the chapter: more than two to one in v6
    assert ints["v7"] * 5 <= ints["v6"] * 2, ints
    assert total["v7"] <= 0.6 * total["v6"], total


# ---------------------------------------------------------------- GPU

def _operands(m, n, k, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, generator=g, device="cuda").to(dtype)
    b = torch.randn(k, n, generator=g, device="cuda").to(dtype)
    return a, b


@pytest.mark.gpu
@pytest.mark.op("wmma_gemm")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("m, n, k", [(1, 8, 8), (127, 136, 40), (129, 264, 72), (300, 8, 520),
                                     (256, 384, 512), (1000, 2048, 4104), (4096, 4096, 4096)])
def test_v7_is_v6_bit_for_bit(dtype, m, n, k):
    """The same MMAs on the same fragments in the same order: v7's C equals v6's exactly, on
    interior blocks (the unchecked copies), edge blocks, and a last K-step that is not whole."""
    a, b = _operands(m, n, k, dtype, seed=m * 7919 + n * 31 + k)
    poison_allocator(m * n * 2, "cuda")
    c7 = w7.wmma_mma_hoisted(a, b)
    assert not c7.isnan().any(), "unwritten (NaN) outputs"
    assert torch.equal(c7, w.wmma_mma(a, b))
    rtol, atol = w.tolerance_for(k, dtype)
    torch.testing.assert_close(c7.double(), a.double() @ b.double(), rtol=rtol, atol=atol)


@pytest.mark.gpu
@pytest.mark.op("wmma_gemm")
def test_v7_refuses_autograd_inputs():
    a, b = _operands(128, 128, 64, torch.float16, seed=1)
    with pytest.raises(RuntimeError, match="wmma_mma_hoisted"):
        w7.wmma_mma_hoisted(a.requires_grad_(), b)
