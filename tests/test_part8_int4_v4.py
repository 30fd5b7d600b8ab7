"""The Part 8 W4A16 GEMV (int4_gemm v4): against float64 dequantise-then-multiply under the CPU
interpreter at M = 1, 2, 3, 8, every group size (the scale-once path and the scale-per-element
one, G = 12 with words that straddle groups), with and without zero points, ragged N, K with a
partial last slice, split-K of 1, 3 and the automatic choice; its refusals before any launch; the
version's dispatch to v2. v5 (tensor cores, the weight as wgmma's register operand) the same way
at M = 1 to 64, and its relabelling of rows and k checked against the reshape-permute it undoes.
Compiled for sm_90 on the CPU (Triton 3.9): what v2's loop does at M = 1 (byte loads, shared
memory, mma.sync); that v4's loop has 16-byte loads of the weight and no shared memory or
tensor-core instruction; that v5's dot takes the dequantised tile from registers with no layout
conversion in the loop. On a GPU: bf16 and fp16 at the benchmark's K."""

from __future__ import annotations

import re

import pytest
import torch
import triton
from helpers import NoLaunch, assert_int4_matches, int4_operands, read_on_triton

from conftest import DEVICE, HAS_GPU, poison_allocator
from snippets.common import introspect as ins
from snippets.common.gemm import tolerance_for
from snippets.part8 import int4_gemm as ig
from snippets.part8.quant import pack_int4

HALF = torch.bfloat16 if HAS_GPU else torch.float16
# (M, N, K, G). Under the interpreter v4 takes 64-deep slices and 16 rows: N = 37 and 40 leave a
# partial block of rows, K = 96 and 144 a partial last slice, G = 32 and 48 do not divide the
# slice (a scale per element), G = 12 puts a group edge inside an int32 word of 8 codes
SHAPES = [(1, 64, 128, 32), (1, 37, 96, 32), (3, 40, 256, 128), (8, 33, 256, 64),
          (2, 48, 144, 48), (5, 20, 96, 12), (8, 16, 64, 64),
          # a K tail and whole row blocks with the GPU's blocks too (BLOCK_K 32, BLOCK_N 256 and 128)
          (2, 256, 120, 12), (3, 256, 512, 128)]


def _operands(m, n, k, g, dtype=HALF, zero_point=False, seed=0):
    return int4_operands(m, n, k, g, dtype, DEVICE, zero_point, seed)


_check = assert_int4_matches


@pytest.mark.op("int4_gemm")
@pytest.mark.parametrize("m, n, k, g", SHAPES)
@pytest.mark.parametrize("zero_point", [False, True], ids=["sym", "zeros"])
def test_gemv_matches_reference(m, n, k, g, zero_point):
    x, packed, scales, zeros = _operands(m, n, k, g, zero_point=zero_point)
    poison_allocator(4 * m * n * 4, DEVICE)
    for split in (1, None, 3):
        _check(ig.int4_gemv(x, packed, scales, zeros, split_k=split), x, packed, scales, zeros,
               f"M={m} N={n} K={k} G={g} zeros={zero_point} split_k={split}")


@pytest.mark.op("int4_gemm")
def test_shapes_run_both_scale_paths_and_partial_slices():
    """SHAPES has group sizes the interpreter's slice divides and does not, a partial last slice
    and a partial block of rows (so a test above fails if the tail or the row clamp is wrong)."""
    paths, tails, ragged = set(), set(), set()
    for m, n, k, g in SHAPES:
        cfg = ig.gemv_config(m, n, k, g)
        paths.add(g % cfg["BLOCK_K"] == 0)
        tails.add(k % cfg["BLOCK_K"] != 0)
        ragged.add(n % cfg["BLOCK_N"] != 0)
    assert paths == tails == ragged == {True, False}


@pytest.mark.op("int4_gemm")
@pytest.mark.parametrize("split", [2, 3, 5])
def test_split_k_equals_no_split(split):
    """K = 320 is 5 slices of 64 under the interpreter: 3 ranges leave the last one short."""
    x, packed, scales, zeros = _operands(3, 40, 320, 64, dtype=torch.float32, zero_point=True)
    one = ig.int4_gemv(x, packed, scales, zeros, split_k=1)
    torch.testing.assert_close(ig.int4_gemv(x, packed, scales, zeros, split_k=split), one,
                               rtol=1e-5, atol=1e-4)


@pytest.mark.op("int4_gemm")
def test_fp32_activations_agree_to_fp32_rounding():
    """The codes minus the zero are exact in fp32 and so is the trick that makes them floats: with
    fp32 x the GEMV agrees with float64 to fp32 rounding, far inside the GEMM tolerance."""
    x, packed, scales, zeros = _operands(4, 33, 192, 32, dtype=torch.float32, zero_point=True)
    y = ig.int4_gemv(x, packed, scales, zeros)
    ref = ig.int4_gemm_ref(x.double(), packed, scales.double(), zeros)
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-4)


@pytest.mark.op("int4_gemm")
@pytest.mark.parametrize("g", [32, 64], ids=["scale-per-element", "scale-once"])
def test_every_code_at_every_position_of_a_word(g):
    """Row r of the weight holds code (r + k) mod 16 at k, so each of the 16 codes sits at each of
    the 8 positions of a word; x is one-hot at k = 0..7, 8..15 and 56..63. y is the dequantised
    weight itself: a code taken from the wrong nibble, half-word or word fails at its k."""
    k = 64
    codes = ((torch.arange(16)[:, None] + torch.arange(k)[None, :]) % 16).to(torch.uint8)
    gen = torch.Generator().manual_seed(1)
    scales = (torch.rand(16, k // g, generator=gen) + 0.5).to(DEVICE)
    zeros = torch.randint(0, 16, (16, k // g), generator=gen, dtype=torch.uint8).to(DEVICE)
    packed = pack_int4(codes).to(DEVICE)
    for first in (0, 8, 56):
        x = torch.eye(k)[first:first + 8].contiguous().to(DEVICE)
        y = ig.int4_gemv(x, packed, scales, zeros)
        ref = ig.int4_gemm_ref(x.double(), packed, scales.double(), zeros)
        torch.testing.assert_close(y.double(), ref, rtol=1e-6, atol=0)


@pytest.mark.op("int4_gemm")
def test_a_wrong_nibble_order_is_caught():
    x, packed, scales, zeros = _operands(2, 32, 128, 32)
    swapped = ((packed & 0xF) << 4) | (packed >> 4)
    with pytest.raises(AssertionError):
        _check(ig.int4_gemv(x, swapped, scales, zeros), x, packed, scales, zeros, "swapped")


@pytest.mark.op("int4_gemm")
def test_empty_m():
    x, packed, scales, _ = _operands(1, 16, 64, 32)
    assert ig.int4_gemv(x[:0], packed, scales).shape == (0, 16)


# ---------------------------------------------------------------- the registered version

@pytest.mark.op("int4_gemm")
@pytest.mark.parametrize("m, k", [(9, 128), (16, 128), (4, 36)], ids=["M=9", "M=16", "K=36"])
def test_v4_hands_what_the_gemv_refuses_to_v2(m, k):
    """More than 8 rows, or K not a multiple of 8: v4 is v2's kernel, bit for bit."""
    g = 12 if k % 8 else 32
    x, packed, scales, _ = _operands(m, 24, k, g)
    y = ig.int4_gemm_op.impls["v4"].fn(x, packed, scales)
    assert torch.equal(y, ig.int4_gemm(x, packed, scales, split_k=None))
    _check(y, x, packed, scales, None, f"v4 M={m} K={k}")


@pytest.mark.op("int4_gemm")
def test_v4_registration():
    v4 = ig.int4_gemm_op.impls["v4"]
    assert v4.lang == "Triton" and v4.device == "any" and v4.origin == "book"
    assert ig._int4_gemv_kernel in v4.sources and ig.int4_gemv in v4.sources


# ---------------------------------------------------------------- refusals, before any launch

def _bad_inputs():
    x, packed, scales, zeros = _operands(4, 32, 128, 32, zero_point=True)
    x9, _, _, _ = _operands(9, 32, 128, 32)
    x12, packed12, scales12, _ = _operands(2, 8, 36, 12)
    offset = torch.zeros(32 * 64 + 2, dtype=torch.uint8, device=DEVICE)[2:].view(32, 64)
    return [
        ("x not a tensor", (x.tolist(), packed, scales), TypeError, "x must be a torch.Tensor"),
        ("scales dtype", (x, packed, scales.float()), TypeError, "scales must have x's dtype"),
        ("packed wrong K", (x, packed[:, :32].contiguous(), scales), ValueError,
         r"packed must be \(N, K / 2\)"),
        ("zeros shape", (x, packed, scales, zeros[:, :2].contiguous()), ValueError,
         "zeros must have"),
        ("M = 9", (x9, packed, scales), ValueError, "M <= 8"),
        ("K = 36", (x12, packed12, scales12), ValueError, "multiple of 8"),
        ("packed not word-aligned", (x, offset, scales), ValueError, "4-byte boundary"),
        ("split_k 0", (x, packed, scales, None, 0), ValueError, "split_k"),
        ("split_k bool", (x, packed, scales, None, True), ValueError, "split_k"),
    ]


BAD = _bad_inputs()


@pytest.mark.op("int4_gemm")
@pytest.mark.parametrize("label, args, exc, words", BAD, ids=[b[0] for b in BAD])
def test_refuses_before_launch(label, args, exc, words, monkeypatch):
    monkeypatch.setattr(ig, "_int4_gemv_kernel", NoLaunch())
    monkeypatch.setattr(ig, "_sum_splits_kernel", NoLaunch())
    with pytest.raises(exc, match=words):
        ig.int4_gemv(*args)


@pytest.mark.op("int4_gemm")
def test_refuses_grad():
    x, packed, scales, _ = _operands(2, 16, 64, 32)
    with pytest.raises(RuntimeError, match="forward-only"):
        ig.int4_gemv(x.requires_grad_(), packed, scales)


# ---------------------------------------------------------------- v5: tensor cores

TC_SHAPES = [(16, 64, 128, 128), (1, 100, 256, 128), (9, 70, 384, 128), (33, 64, 256, 256),
             (64, 130, 256, 128)]


@pytest.mark.op("int4_gemm")
@pytest.mark.parametrize("m, n, k, g", TC_SHAPES)
@pytest.mark.parametrize("zero_point", [False, True], ids=["sym", "zeros"])
def test_tc_matches_reference(m, n, k, g, zero_point):
    """v5 at M = 1 to 64, N ragged against its 64 rows, one to three 128-deep slices, G = 128 and
    256, split-K 1, 2 and automatic."""
    x, packed, scales, zeros = _operands(m, n, k, g, zero_point=zero_point)
    poison_allocator(4 * m * n * 4, DEVICE)
    for split in (1, None, 2):
        _check(ig.int4_tc(x, packed, scales, zeros, split_k=split), x, packed, scales, zeros,
               f"v5 M={m} N={n} K={k} G={g} zeros={zero_point} split_k={split}")


@pytest.mark.op("int4_gemm")
def test_tc_relabelling_is_the_reshape_permute():
    """Element (r, k) of the relabelled tile is element (_relabel_rows(r), _relabel_ks(k)) of the
    tile as unpacked: the maps that index x and y are the inverse of what the kernel does to the
    weight tile, and both are permutations."""
    tile = torch.arange(64 * 128).reshape(64, 128)
    moved = tile.reshape(2, 4, 8, 4, 16, 2).permute(1, 0, 2, 4, 3, 5).reshape(64, 128)
    rows = ig._relabel_rows.fn(torch.arange(64))
    ks = ig._relabel_ks.fn(torch.arange(128))
    assert sorted(rows.tolist()) == list(range(64)) and sorted(ks.tolist()) == list(range(128))
    assert torch.equal(moved, tile[rows][:, ks])


@pytest.mark.op("int4_gemm")
@pytest.mark.parametrize("fn, m, n", [(ig.int4_tc, 20, 64), (ig.int4_tc_wide, 40, 130)],
                         ids=["v5", "v6"])
def test_tc_fp32_activations_agree_to_fp32_rounding(fn, m, n):
    x, packed, scales, zeros = _operands(m, n, 256, 128, dtype=torch.float32, zero_point=True)
    y = fn(x, packed, scales, zeros)
    ref = ig.int4_gemm_ref(x.double(), packed, scales.double(), zeros)
    if HAS_GPU:  # fp32 operands go through the tensor cores in TF32
        rtol, atol = tolerance_for(256, torch.float32)
    else:
        rtol, atol = 1e-5, 1e-4
    torch.testing.assert_close(y.double(), ref, rtol=rtol, atol=atol)


@pytest.mark.op("int4_gemm")
@pytest.mark.parametrize("m, g", [(65, 128), (16, 64), (4, 32)], ids=["M=65", "G=64", "G=32"])
def test_v5_hands_what_the_tc_kernel_refuses_to_v2(m, g):
    x, packed, scales, _ = _operands(m, 24, 256, g)
    y = ig.int4_gemm_op.impls["v5"].fn(x, packed, scales)
    assert torch.equal(y, ig.int4_gemm(x, packed, scales, split_k=None))


def _tc_bad_inputs():
    x, packed, scales, zeros = _operands(4, 32, 256, 128, zero_point=True)
    x65, _, _, _ = _operands(65, 32, 256, 128)
    x64, packed64, scales64, _ = _operands(2, 8, 256, 64)
    offset = torch.zeros(32 * 128 + 2, dtype=torch.uint8, device=DEVICE)[2:].view(32, 128)
    return [
        ("M = 65", (x65, packed, scales), ValueError, "M <= 64"),
        ("G = 64", (x64, packed64, scales64), ValueError, "multiple of 128"),
        ("packed not word-aligned", (x, offset, scales), ValueError, "4-byte boundary"),
        ("split_k 0", (x, packed, scales, None, 0), ValueError, "split_k"),
        ("scales dtype", (x, packed, scales.float()), TypeError, "scales must have x's dtype"),
        ("zeros shape", (x, packed, scales, zeros[:, :1].contiguous()), ValueError,
         "zeros must have"),
    ]


TC_BAD = _tc_bad_inputs()


@pytest.mark.op("int4_gemm")
@pytest.mark.parametrize("label, args, exc, words", TC_BAD, ids=[b[0] for b in TC_BAD])
def test_tc_refuses_before_launch(label, args, exc, words, monkeypatch):
    monkeypatch.setattr(ig, "_int4_tc_kernel", NoLaunch())
    monkeypatch.setattr(ig, "_sum_splits_kernel", NoLaunch())
    with pytest.raises(exc, match=words):
        ig.int4_tc(*args)


@pytest.mark.op("int4_gemm")
def test_tc_refuses_grad():
    x, packed, scales, _ = _operands(16, 16, 128, 128)
    with pytest.raises(RuntimeError, match="forward-only"):
        ig.int4_tc(x.requires_grad_(), packed, scales)


# ---------------------------------------------------------------- compiled for sm_90, on the CPU

needs_checked_triton = read_on_triton({(3, 9)}, "the compiled code: layouts and instruction "
                                      "choices differ between versions", env="INT4_COMPILE_CHECK")

_SIG = {"x_ptr": "*bf16", "w_ptr": "*i32", "s_ptr": "*bf16", "z_ptr": "*u8", "y_ptr": "*fp32",
        "M": "i32", "N": "i32", "K": "i32", "K_PER_SPLIT": "i32", "stride_xm": "i32",
        "stride_wn": "i32", "stride_sn": "i32", "stride_ys": "i32", "stride_ym": "i32"}
# what a launch at N = K = 8192 is specialised on: aligned pointers, the sizes and the strides in
# elements (8192, 1024 words, 4096) multiples of 16; M = 1 and stride_sn = 64 as they come
_DIVISIBLE = ("x_ptr", "w_ptr", "s_ptr", "z_ptr", "y_ptr", "N", "K", "K_PER_SPLIT", "stride_xm",
              "stride_wn", "stride_sn", "stride_ys", "stride_ym")


def _gemv_job(m, g, zeros):
    cfg = ig.gemv_gpu_config(g)
    consts = dict(GROUP_SIZE=g, HAS_ZEROS=zeros, BLOCK_M=triton.next_power_of_2(m),
                  BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"])
    return (ig._int4_gemv_kernel, _SIG, consts,
            dict(num_warps=cfg["num_warps"], num_stages=1, divisible=_DIVISIBLE))


_V2_SIG = {"x_ptr": "*bf16", "w_ptr": "*u8", "s_ptr": "*bf16", "z_ptr": "*bf16", "y_ptr": "*fp32",
           "M": "i32", "N": "i32", "K": "i32", "K_PER_SPLIT": "i32", "stride_xm": "i32",
           "stride_wn": "i32", "stride_sn": "i32", "stride_ys": "i32", "stride_ym": "i32"}
_V2_DIVISIBLE = ("x_ptr", "w_ptr", "s_ptr", "z_ptr", "y_ptr", "N", "K", "K_PER_SPLIT",
                 "stride_xm", "stride_wn", "stride_ys", "stride_ym")
# v2's launch_config at M = 1, G = 128 on a GPU: 16 x 64 tiles, 128-deep slices, 4 warps, 4 stages
_V2_JOB = (ig._int4_gemm_kernel, _V2_SIG,
           dict(GROUP_SIZE=128, HAS_ZEROS=False, SCALE_AFTER=True, BLOCK_M=16, BLOCK_N=64,
                BLOCK_K=128),
           dict(num_warps=4, num_stages=4, divisible=_V2_DIVISIBLE))
JOBS = {"v2 M=1": _V2_JOB, **{f"v4 M={m} G={g} zeros={z}": (m, g, z)
                              for m, g, z in ((1, 128, False), (8, 128, True), (1, 64, True),
                                              (4, 32, False))},
        # v5 as int4_tc launches it: BLOCK_M = 16 for M <= 16, 64 x 128 slices, 4 warps, 3 stages
        **{f"v5 M={m} zeros={z}": (ig._int4_tc_kernel, _SIG,
                                   dict(GROUP_SIZE=128, HAS_ZEROS=z, BLOCK_M=max(16, m),
                                        BLOCK_N=ig.TC_BLOCK_N, BLOCK_K=ig.TC_BLOCK_K),
                                   dict(num_warps=4, num_stages=3, divisible=_DIVISIBLE))
           for m, z in ((16, False), (64, True))}}


@pytest.fixture(scope="module")
def built():
    jobs = [_gemv_job(*job) if name.startswith("v4") else job for name, job in JOBS.items()]
    return dict(zip(JOBS, ins.compile_many(jobs)))


def _loop_body(ttgir: str) -> str:
    """The TTGIR of the main K loop: from its scf.for to the scf.yield at the loop's own depth."""
    lines = ttgir.splitlines()
    start = next(i for i, line in enumerate(lines) if "scf.for" in line)
    depth = len(lines[start]) - len(lines[start].lstrip())
    end = next(i for i in range(start + 1, len(lines))
               if lines[i].strip().startswith("}") and
               len(lines[i]) - len(lines[i].lstrip()) == depth)
    return "\n".join(lines[start:end])


def _ptx_loop(ptx: str) -> str:
    """The PTX of the main loop: the longest stretch from a label to a branch back to it."""
    lines = ptx.splitlines()
    seen, loops = {}, []
    for i, line in enumerate(lines):
        label = re.match(r"^(\$L__\w+):", line.strip())
        if label:
            seen[label.group(1)] = i
        back = re.search(r"\bbra(?:\.uni)?\s+(\$L__\w+);", line)
        if back and back.group(1) in seen:
            loops.append(lines[seen[back.group(1)]:i + 1])
    assert loops, "no loop in the PTX"
    return "\n".join(max(loops, key=len))


@needs_checked_triton
@pytest.mark.op("int4_gemm")
def test_v2_loop_loads_bytes_and_goes_through_shared_memory(built):
    """What v2 compiles to at M = 1 (the chapter's table): the (64, 64) tile of packed bytes is
    loaded one byte per instruction, stored to shared memory and read back in the tensor cores'
    operand layout at every K step, synchronously (no cp.async); the MMA is Ampere's mma.sync
    with 16 rows, 15 of them padding at M = 1."""
    k = built["v2 M=1"]
    loop = _loop_body(k.ttgir)
    assert "ld.global.b8" in k.ptx and ins.load_store_widths(k.ptx)["ld"] <= {8, 16}
    assert loop.count("ttg.local_alloc") >= 1 and loop.count("ttg.local_load") >= 1
    ptx_loop = _ptx_loop(k.ptx)  # the check v4's test makes, failing here
    assert ins.shared_memory_ops(ptx_loop) and "bar.sync" in ptx_loop
    assert not ins.async_copies(k.ptx)
    mma = ins.tensor_core_ops(k.ptx)
    assert mma and all(op.startswith("mma.sync.aligned.m16n8k16") for op in mma), mma


@needs_checked_triton
@pytest.mark.op("int4_gemm")
@pytest.mark.parametrize("name", [n for n in JOBS if n.startswith("v4")])
def test_v4_loop_reads_16_byte_vectors_and_stays_in_registers(built, name):
    """v4's words are loaded 4 to a thread (16 bytes: ld.global.v4.b32), and the loop has no shared
    memory in it (no ld/st.shared, ldmatrix, stmatrix, barrier: the layout changes the compiler
    keeps, between equivalent layouts, move nothing), no dot, and nothing spilled."""
    k = built[name]
    loop = _loop_body(k.ttgir)
    words = re.search(r"tt\.load %\S+ : tensor<\d+x(\d+)x!tt\.ptr<i32>, (#\w+)>", loop)
    assert words, ins.excerpt(loop, r"tt\.load")
    layout = ins.layouts(k.ttgir)[words.group(2)]
    assert "sizePerThread = [1, 4]" in layout, layout
    for op in ("ttg.local_alloc", "ttg.local_load", "ttg.local_store", "tt.dot", "async_copy"):
        assert op not in loop, (op, ins.excerpt(loop, op))
    ptx_loop = _ptx_loop(k.ptx)
    assert re.search(r"ld\.global(\.\w+)*\.v4\.b32", ptx_loop), ins.excerpt(ptx_loop, r"ld\.global")
    assert not ins.shared_memory_ops(ptx_loop) and "bar.sync" not in ptx_loop, \
        ins.shared_memory_ops(ptx_loop)
    assert not ins.tensor_core_ops(k.ptx) and not ins.async_copies(k.ptx)
    assert k.spill_stores == 0 and k.spill_loads == 0


@needs_checked_triton
@pytest.mark.op("int4_gemm")
@pytest.mark.parametrize("name", [n for n in JOBS if n.startswith("v5")])
def test_v5_dot_takes_the_dequantised_tile_from_registers(built, name):
    """v5's loop: the wgmma's first operand is a register tensor (a dot_op layout, not a shared
    memory descriptor) and nothing converts the dequantised tile's layout on the way (no
    convert_layout in the loop, no ldmatrix or stmatrix in its PTX). The packed words reach the
    registers through the pipeliner's asynchronous 16-byte copies (cp.async.cg ..., 0x10) and one
    16-byte shared load per thread and word row; x^T, wgmma's second operand, is read from shared
    memory as wgmma requires."""
    k = built[name]
    loop = _loop_body(k.ttgir)
    dot = re.search(r"ttng\.warp_group_dot (%\S+), (%\S+), .*? : (tensor<64x128x\w+, "
                    r"#ttg\.dot_op<\{opIdx = 0)", loop)
    assert dot, ins.excerpt(loop, r"warp_group_dot")
    assert "ttg.convert_layout" not in loop, ins.excerpt(loop, r"convert_layout")
    ptx_loop = _ptx_loop(k.ptx)
    assert re.search(r"wgmma\.mma_async\S*\.bf16\.bf16", ptx_loop)
    assert not re.search(r"\b(ldmatrix|stmatrix)", ptx_loop)
    assert re.search(r"cp\.async\.cg\.shared\.global \[[^]]+\], \[[^]]+\], (16|0x10)\b", ptx_loop)
    assert k.spill_stores == 0 and k.spill_loads == 0


# ---------------------------------------------------------------- GPU: bf16/fp16, the benchmark K

@pytest.mark.gpu
@pytest.mark.op("int4_gemm")
@pytest.mark.parametrize("m", [1, 2, 4, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_gemv_benchmark_k(m, dtype):
    x, packed, scales, zeros = _operands(m, 4096, 8192, 128, dtype=dtype, zero_point=True)
    for split in (1, None):
        _check(ig.int4_gemv(x, packed, scales, zeros, split_k=split), x, packed, scales, zeros,
               f"GPU M={m} {dtype} split_k={split}")


@pytest.mark.gpu
@pytest.mark.op("int4_gemm")
@pytest.mark.parametrize("g, k", [(32, 4096), (64, 4096), (48, 48 * 86), (12, 24 * 170),
                                  (256, 4096)])
def test_gpu_gemv_group_sizes(g, k):
    """Every slice depth gemv_config picks on a GPU (128, 64, 32, 16, and 32 with a scale per
    element for G = 12), ragged N (1000 rows against 128 and 256), a partial last slice (G = 12:
    K = 4080 against 32-deep slices)."""
    x, packed, scales, zeros = _operands(3, 1000, k, g, dtype=torch.bfloat16, zero_point=True)
    _check(ig.int4_gemv(x, packed, scales, zeros), x, packed, scales, zeros, f"GPU G={g} K={k}")


@pytest.mark.gpu
@pytest.mark.op("int4_gemm")
def test_gpu_v4_at_the_sweep_sizes():
    """The registered v4 at the benchmark's sizes, on the benchmark's inputs."""
    gen = torch.Generator().manual_seed(0)
    for size in ig.int4_gemm_op.sweep:
        x, packed, scales, dense = ig.make_inputs(size, torch.bfloat16, "cuda", gen)
        y = ig.int4_gemm_op.impls["v4"].fn(x, packed, scales, dense)
        _check(y, x, packed, scales, None, f"GPU v4 {size}")


@pytest.mark.gpu
@pytest.mark.op("int4_gemm")
@pytest.mark.parametrize("m", [1, 16, 33, 64])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_tc_benchmark_k(m, dtype):
    x, packed, scales, zeros = _operands(m, 4096, 8192, 128, dtype=dtype, zero_point=True)
    for split in (1, None):
        _check(ig.int4_tc(x, packed, scales, zeros, split_k=split), x, packed, scales, zeros,
               f"GPU v5 M={m} {dtype} split_k={split}")


@pytest.mark.gpu
@pytest.mark.op("int4_gemm")
def test_gpu_v5_at_the_sweep_sizes():
    gen = torch.Generator().manual_seed(0)
    for size in ig.int4_gemm_op.sweep:
        x, packed, scales, dense = ig.make_inputs(size, torch.bfloat16, "cuda", gen)
        y = ig.int4_gemm_op.impls["v5"].fn(x, packed, scales, dense)
        _check(y, x, packed, scales, None, f"GPU v5 {size}")
