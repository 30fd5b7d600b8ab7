"""The Part 8 W4A16 GEMM's v6 (int4_tc_wide: tensor cores up to M = 256, 128 weight rows per
program on two warpgroups, x read in its own k order and relabelled on chip): against float64
dequantise-then-multiply under the CPU interpreter at M = 1 to 256, N ragged against its 64 and
128 rows, one to four 128-deep slices, G = 128 and 256, zero points and symmetric codes, split-K
1, 2 and automatic, and the tile options the launcher takes; the relabelling of 128 rows and of
x's k checked against the reshape-permutes the kernel does; the dispatch to v2 bit for bit; the
refusals before any launch. Compiled for sm_90 on the CPU (Triton 3.6 and 3.9): at M = 128 the
dot takes the dequantised tile from registers with no layout conversion in the loop, x arrives
by 16-byte asynchronous copies, and its relabelling is one shared-memory round trip. On a GPU:
fp16 and bf16 at N = K = 8192 and every M of the sweep. v7 is v6's kernel with 64 weight rows on
one warpgroup: its tile leaves room for two programs an SM (compiled for sm_90), which its K
split counts on."""

from __future__ import annotations

import re

import pytest
import torch
from helpers import NoLaunch, assert_int4_matches, int4_operands, read_on_triton
from test_part8_int4_v4 import _loop_body, _ptx_loop

from conftest import DEVICE, HAS_GPU, poison_allocator
from snippets.common import introspect as ins
from snippets.part8 import int4_gemm as ig

HALF = torch.bfloat16 if HAS_GPU else torch.float16
_check = assert_int4_matches

# (M, N, K, G): M from 1 to 256 (several programs along M past 128), N ragged against 128 rows
# (72, 200) and whole (128), one to four slices of 128, G = 128 and 256
SHAPES = [(1, 72, 128, 128), (17, 200, 384, 128), (64, 128, 256, 256), (100, 200, 256, 128),
          (128, 72, 512, 128), (200, 72, 256, 128), (256, 130, 128, 128)]


def _operands(m, n, k, g, dtype=HALF, zero_point=False, seed=0):
    return int4_operands(m, n, k, g, dtype, DEVICE, zero_point, seed)


@pytest.mark.op("int4_gemm")
@pytest.mark.parametrize("m, n, k, g", SHAPES)
@pytest.mark.parametrize("zero_point", [False, True], ids=["sym", "zeros"])
def test_wide_matches_reference(m, n, k, g, zero_point):
    """Split-K 1 and 2 (2 of one to four slices leaves a range with one slice, or none)."""
    x, packed, scales, zeros = _operands(m, n, k, g, zero_point=zero_point)
    poison_allocator(4 * m * n * 4, DEVICE)
    for split in (1, 2):
        _check(ig.int4_tc_wide(x, packed, scales, zeros, split_k=split), x, packed, scales,
               zeros, f"v6 M={m} N={n} K={k} G={g} zeros={zero_point} split_k={split}")


@pytest.mark.op("int4_gemm")
@pytest.mark.parametrize("m, n, k, g", SHAPES[:4])
def test_relabelled_x_matches_reference(m, n, k, g):
    """v8's path (relabel_x_once): x relabelled before the launch and only transposed in the
    kernel, zero points, split-K 1 and 2, 64 and 128 weight rows."""
    x, packed, scales, zeros = _operands(m, n, k, g, zero_point=True)
    for split in (1, 2):
        for block_n in (64, 128):
            _check(ig.int4_tc_wide(x, packed, scales, zeros, split_k=split, block_n=block_n,
                                   relabel_x_once=True), x, packed, scales, zeros,
                   f"v8 M={m} N={n} K={k} split_k={split} block_n={block_n}")


def test_relabel_x_is_the_kernels_permutation():
    """relabel_x puts k = 32 a + 2 b + c of each 128-deep slice at 8 b + 2 a + c: the row of x^T
    that v6's kernel builds on chip (its reshape-permute, replayed here on the indices)."""
    m, k = 3, 256
    x = torch.arange(m * k, dtype=torch.float32).view(m, k)
    got = ig.relabel_x(x)
    for sl in range(k // 128):
        for a in range(4):
            for b in range(16):
                for c in range(2):
                    assert torch.equal(got[:, 128 * sl + 8 * b + 2 * a + c],
                                       x[:, 128 * sl + 32 * a + 2 * b + c])
    # v6's on-chip form: reshape (M, 4, 16, 2), permute (2, 1, 3, 0), reshape (128, M) = x^T's rows
    tile = x[:, :128]
    on_chip = tile.reshape(m, 4, 16, 2).permute(2, 1, 3, 0).reshape(128, m)
    assert torch.equal(ig.relabel_x(tile).T, on_chip)


@pytest.mark.op("int4_gemm")
def test_the_automatic_split(monkeypatch):
    """With 3 SMs (the interpreter's count, forced here so the GPU run checks the same rule)
    M = 128, N = 72, K = 512 is one tile and four slices: the automatic choice is 2 ranges, and
    the result is right; more tiles or fewer slices, 1."""
    with monkeypatch.context() as mp:
        mp.setattr(ig, "triton_interpreting", lambda: True)
        assert ig.wide_split_k(128, 72, 512, 128, 128) == 2
        assert ig.wide_split_k(128, 200, 512, 128, 128) == 1   # 2 tiles: 4 programs > 3 SMs
        assert ig.wide_split_k(1, 72, 256, 16, 128) == 1       # 2 slices: no range of fewer than 2
        # v7: two programs an SM (4 warps) make room for twice the ranges
        assert ig.wide_split_k(128, 200, 512, 128, 128, per_sm=2) == 2
        assert ig.wide_split_k(128, 72, 512, 128, 64, per_sm=2) == 2   # 2 tiles x 2 <= 6
        assert ig.wide_split_k(128, 40, 1024, 128, 64, per_sm=2) == 4  # 1 tile: 4 <= 6, 8 > 6
    x, packed, scales, zeros = _operands(128, 72, 512, 128, zero_point=True)
    poison_allocator(4 * 128 * 72 * 4, DEVICE)
    _check(ig.int4_tc_wide(x, packed, scales, zeros), x, packed, scales, zeros, "v6 automatic")


@pytest.mark.op("int4_gemm")
@pytest.mark.parametrize("options", [dict(block_n=64), dict(block_n=64, num_warps=8),
                                     dict(block_m=16), dict(block_m=64, num_stages=1),
                                     dict(block_n=64, block_m=32, num_stages=4)],
                         ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_wide_tile_options(options):
    """Every tile the launcher accepts: 64-row programs (one relabelled half; N = 72 leaves a
    partial second one), x cut into several blocks of rows (M = 100 against 16, 32 and 64), with
    zero points and split-K."""
    x, packed, scales, zeros = _operands(100, 72, 256, 128, zero_point=True)
    for split in (1, 2):
        _check(ig.int4_tc_wide(x, packed, scales, zeros, split_k=split, **options), x, packed,
               scales, zeros, f"v6 {options} split_k={split}")


@pytest.mark.op("int4_gemm")
def test_wide_relabelling_is_the_reshape_permute():
    """The kernel's reshape-permutes, done by torch on index tiles: row r of the 128-row weight
    tile as the dot holds it is row 64 (r // 64) + _relabel_rows(r % 64) as loaded (v5's map in
    each half), and row k of x^T is column _relabel_ks(k) of the x tile as loaded, the k map of
    the weight: the products pair the same weight and activation."""
    tile = torch.arange(128 * 128).reshape(128, 128)
    moved = tile.reshape(2, 2, 4, 8, 4, 16, 2).permute(0, 2, 1, 3, 5, 4, 6).reshape(128, 128)
    r = torch.arange(128)
    rows = 64 * (r // 64) + ig._relabel_rows.fn(r % 64)
    ks = ig._relabel_ks.fn(torch.arange(128))
    assert sorted(rows.tolist()) == list(range(128))
    assert torch.equal(moved, tile[rows][:, ks])
    x = torch.arange(48 * 128).reshape(48, 128)
    xt = x.reshape(48, 4, 16, 2).permute(2, 1, 3, 0).reshape(128, 48)
    assert torch.equal(xt, x[:, ks].T)


WIDE_OPTIONS = {"v6": {}, "v7": dict(block_n=64),   # what each registered version launches
                "v8": dict(block_n=64, relabel_x_once=True)}


@pytest.mark.op("int4_gemm")
@pytest.mark.parametrize("version", list(WIDE_OPTIONS))
@pytest.mark.parametrize("m, g", [(257, 128), (16, 64), (200, 32)],
                         ids=["M=257", "G=64", "G=32"])
def test_registered_hands_what_the_wide_kernel_refuses_to_v2(m, g, version):
    x, packed, scales, _ = _operands(m, 24, 256, g)
    y = ig.int4_gemm_op.impls[version].fn(x, packed, scales)
    assert torch.equal(y, ig.int4_gemm(x, packed, scales, split_k=None))


@pytest.mark.op("int4_gemm")
@pytest.mark.parametrize("version", list(WIDE_OPTIONS))
def test_registered_takes_what_the_wide_kernel_takes(version):
    """At M = 256 and G = 128 the registered v6 and v7 are int4_tc_wide with their tile, bit
    for bit."""
    x, packed, scales, _ = _operands(256, 72, 256, 128)
    y = ig.int4_gemm_op.impls[version].fn(x, packed, scales)
    assert torch.equal(y, ig.int4_tc_wide(x, packed, scales, **WIDE_OPTIONS[version]))


@pytest.mark.op("int4_gemm")
@pytest.mark.parametrize("version", list(WIDE_OPTIONS))
def test_wide_registration(version):
    impl = ig.int4_gemm_op.impls[version]
    assert impl.lang == "Triton" and impl.device == "any" and impl.origin == "book"
    for fn in (ig._int4_tc_wide_kernel, ig.int4_tc_wide, ig.wide_split_k, ig._relabel_rows,
               ig._unpack_words, ig._nibble):
        assert fn in impl.sources, fn


def test_v7_launches_64_rows_on_one_warpgroup(monkeypatch):
    """The registered v7 passes block_n=64 (and so 4 warps and two programs an SM)."""
    seen = {}

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return "launched"
    monkeypatch.setattr(ig, "int4_tc_wide", spy)
    x, packed, scales, _ = _operands(16, 72, 256, 128)
    assert ig.int4_gemm_op.impls["v7"].fn(x, packed, scales) == "launched"
    assert seen == {"block_n": 64}


@pytest.mark.op("int4_gemm")
def test_wide_empty_m():
    x, packed, scales, _ = _operands(1, 16, 128, 128)
    assert ig.int4_tc_wide(x[:0], packed, scales).shape == (0, 16)


def _bad_inputs():
    x, packed, scales, zeros = _operands(4, 32, 256, 128, zero_point=True)
    x257, _, _, _ = _operands(257, 32, 256, 128)
    x64, packed64, scales64, _ = _operands(2, 8, 256, 64)
    offset = torch.zeros(32 * 128 + 2, dtype=torch.uint8, device=DEVICE)[2:].view(32, 128)
    ok = (x, packed, scales)
    return [
        ("M = 257", (x257, packed, scales), {}, ValueError, "M <= 256"),
        ("G = 64", (x64, packed64, scales64), {}, ValueError, "multiple of 128"),
        ("packed not word-aligned", (x, offset, scales), {}, ValueError, "4-byte boundary"),
        ("scales dtype", (x, packed, scales.float()), {}, TypeError, "scales must have x's dtype"),
        ("zeros shape", (x, packed, scales, zeros[:, :1].contiguous()), {}, ValueError,
         "zeros must have"),
        ("split_k 0", ok, dict(split_k=0), ValueError, "split_k"),
        ("split_k bool", ok, dict(split_k=True), ValueError, "split_k"),
        ("block_n 96", ok, dict(block_n=96), ValueError, "block_n must be 64 or 128"),
        ("block_n float", ok, dict(block_n=128.0), ValueError, "block_n must be 64 or 128"),
        ("block_m 256", ok, dict(block_m=256), ValueError, "block_m must be"),
        ("block_m 48", ok, dict(block_m=48), ValueError, "block_m must be"),
        ("128 rows on 4 warps", ok, dict(num_warps=4), ValueError, "at least 8"),
        ("num_warps 2", ok, dict(block_n=64, num_warps=2), ValueError, "num_warps must be"),
        ("num_stages 0", ok, dict(num_stages=0), ValueError, "num_stages"),
        ("num_stages 6", ok, dict(num_stages=6), ValueError, "num_stages"),
        ("relabel_x_once 1", ok, dict(relabel_x_once=1), TypeError, "relabel_x_once"),
    ]


BAD = _bad_inputs()


@pytest.mark.op("int4_gemm")
@pytest.mark.parametrize("label, args, kwargs, exc, words", BAD, ids=[b[0] for b in BAD])
def test_wide_refuses_before_launch(label, args, kwargs, exc, words, monkeypatch):
    monkeypatch.setattr(ig, "_int4_tc_wide_kernel", NoLaunch())
    monkeypatch.setattr(ig, "_sum_splits_kernel", NoLaunch())
    with pytest.raises(exc, match=words):
        ig.int4_tc_wide(*args, **kwargs)


@pytest.mark.op("int4_gemm")
def test_wide_refuses_grad():
    x, packed, scales, _ = _operands(16, 16, 128, 128)
    with pytest.raises(RuntimeError, match="forward-only"):
        ig.int4_tc_wide(x.requires_grad_(), packed, scales)


# ---------------------------------------------------------------- compiled for sm_90, on the CPU

needs_checked_triton = read_on_triton({(3, 6), (3, 9)}, "the compiled code of v6 to v8: layouts "
                                      "and instruction choices differ between versions",
                                      env="INT4_COMPILE_CHECK")


def _signature(dtype):
    return {"x_ptr": f"*{dtype}", "w_ptr": "*i32", "s_ptr": f"*{dtype}", "z_ptr": "*u8",
            "y_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32", "K_PER_SPLIT": "i32",
            "stride_xm": "i32", "stride_wn": "i32", "stride_sn": "i32", "stride_ys": "i32",
            "stride_ym": "i32"}


# a launch at N = K = 8192 is specialised on: aligned pointers, the sizes and the strides in
# elements (8192, 1024 words, 64 scales, 128 * 8192) multiples of 16; M = 128 as it comes
_DIVISIBLE = ("x_ptr", "w_ptr", "s_ptr", "z_ptr", "y_ptr", "N", "K", "K_PER_SPLIT", "stride_xm",
              "stride_wn", "stride_sn", "stride_ys", "stride_ym")


def _job(dtype, block_n=128, num_warps=8, zeros=False, relabelled=False):
    """int4_tc_wide's launch at M = 128: 128 rows of x, block_n weight rows, 3 stages."""
    consts = dict(GROUP_SIZE=128, HAS_ZEROS=zeros, BLOCK_M=128, BLOCK_N=block_n,
                  BLOCK_K=ig.TC_BLOCK_K, X_RELABELLED=relabelled)
    return (ig._int4_tc_wide_kernel, _signature(dtype), consts,
            dict(num_warps=num_warps, num_stages=3, divisible=_DIVISIBLE))


JOBS = {"fp16": _job("fp16"), "bf16 zeros": _job("bf16", zeros=True),
        "fp16 128 rows on 4 warps": _job("fp16", num_warps=4),
        "fp16 64 rows on 4 warps": _job("fp16", block_n=64, num_warps=4),       # v7
        "bf16 zeros 64 rows on 4 warps": _job("bf16", block_n=64, num_warps=4, zeros=True),
        "v8 fp16": _job("fp16", block_n=64, num_warps=4, relabelled=True),
        "v8 bf16 zeros": _job("bf16", block_n=64, num_warps=4, zeros=True, relabelled=True)}


@pytest.fixture(scope="module")
def built():
    return dict(zip(JOBS, ins.compile_many(JOBS.values())))


@needs_checked_triton
@pytest.mark.op("int4_gemm")
@pytest.mark.parametrize("name", ["fp16", "bf16 zeros"])
def test_v6_dot_takes_the_dequantised_tile_from_registers(built, name):
    """At M = 128 with 128 weight rows on 8 warps: the loop's warp_group_dot takes a (128, 128)
    register tensor in the dot_op layout as its first operand, and nothing in the loop converts a
    layout; in its PTX two warpgroups each run 8 wgmma m64n128k16 per slice, with no ldmatrix or
    stmatrix; nothing spills."""
    k = built[name]
    loop = _loop_body(k.ttgir)
    dot = re.search(r"ttng\.warp_group_dot %\S+, %\S+, .*? : tensor<128x128x(f16|bf16), "
                    r"#ttg\.dot_op<\{opIdx = 0", loop)
    assert dot, ins.excerpt(loop, r"warp_group_dot")
    assert "ttg.convert_layout" not in loop, ins.excerpt(loop, r"convert_layout")
    ptx_loop = _ptx_loop(k.ptx)
    wgmma = ins.tensor_core_ops(ptx_loop)
    assert list(wgmma) == [f"wgmma.mma_async.sync.aligned.m64n128k16.f32.{dot.group(1)}."
                           f"{dot.group(1)}"] and sum(wgmma.values()) == 8, wgmma
    assert not re.search(r"\b(ldmatrix|stmatrix)", ptx_loop)
    assert k.spill_stores == 0 and k.spill_loads == 0


@needs_checked_triton
@pytest.mark.op("int4_gemm")
@pytest.mark.parametrize("name", ["fp16", "bf16 zeros"])
def test_v6_reads_x_in_16_byte_copies_and_relabels_it_on_chip(built, name):
    """x's (128, 128) tile and the packed words are the loop's two large global reads, both copied
    asynchronously to shared memory 16 bytes a thread (cp.async.cg ... 0x10: 8 copies of x and 2
    of words per thread and slice; the TTGIR's async copy of x has contiguity 8 halves). The
    relabelling of x is the loop's one shared-memory round trip besides the pipeline: x read back
    into registers (a local_load, 16-byte ld.shared), permuted there, and written once (the one
    local_alloc, 4-byte st.shared: pairs of k stay together) into the layout wgmma reads."""
    k = built[name]
    loop = _loop_body(k.ttgir)
    copies = re.findall(r"ttg\.async_copy_global_to_local .*?\{contiguity = (\d+) : i32\} : "
                        r"tensor<128x(\d+)x!tt\.ptr<(\w+)>", loop)
    assert sorted(copies) == [("4", "16", "i32"), ("8", "128", "f16" if "fp16" in name
                                                    else "bf16")], copies
    assert loop.count("ttg.local_load") == 2 and loop.count("ttg.local_alloc") == 1
    # every other global load of the loop is a row's scale (or zero): (128, 1)
    assert "ttg.local_store" not in loop
    assert set(re.findall(r"tt\.load %\S+ : tensor<(\d+x\d+)x", loop)) == {"128x1"}
    ptx_loop = _ptx_loop(k.ptx)
    sixteen = re.findall(r"cp\.async\.cg\.shared\.global \[[^]]+\], \[[^]]+\], (?:16|0x10)\b",
                         ptx_loop)
    assert len(sixteen) == ins.async_copies(ptx_loop)["cp.async.cg.shared.global"] == 10
    assert ins.load_store_widths(ptx_loop, "shared") == {"ld": {128}, "st": {32}}
    shared = ins.shared_memory_ops(ptx_loop)
    assert shared["ld.shared.v4.b32"] == 10 and shared["st.shared.b32"] == 32, shared


@needs_checked_triton
@pytest.mark.op("int4_gemm")
def test_128_rows_on_one_warpgroup_convert_and_spill(built):
    """Why int4_tc_wide refuses block_n = 128 with 4 warps: one warpgroup then holds both halves,
    the relabelled tile is not the fragment layout, and the loop converts it (convert_layout)
    and spills."""
    k = built["fp16 128 rows on 4 warps"]
    assert "ttg.convert_layout" in _loop_body(k.ttgir)
    assert k.spill_stores > 0


@needs_checked_triton
@pytest.mark.op("int4_gemm")
@pytest.mark.parametrize("name", ["v8 fp16", "v8 bf16 zeros"])
def test_v8_copies_x_straight_to_the_dot(built, name):
    """v8's loop, compiled for sm_90 at M = 128: x's tile, copied asynchronously to shared memory
    16 bytes a thread, is the dot's second operand as it lies there (transposed): no local_alloc,
    no st.shared and no convert_layout in the loop, one local_load (the packed words, which are
    dequantised in registers), and the dot still takes the weight from registers; no spills."""
    k = built[name]
    loop = _loop_body(k.ttgir)
    assert "ttg.local_alloc" not in loop and "ttg.convert_layout" not in loop
    assert loop.count("ttg.local_load") == 1
    assert re.search(r"ttng\.warp_group_dot %\S+, %\S+, .*? : tensor<64x128x(f16|bf16), "
                     r"#ttg\.dot_op<\{opIdx = 0", loop), ins.excerpt(loop, r"warp_group_dot")
    ptx_loop = _ptx_loop(k.ptx)
    shared = ins.shared_memory_ops(ptx_loop)
    assert not any(op.startswith("st.shared") for op in shared), shared
    assert k.spill_stores == 0 and k.spill_loads == 0
    v7 = _loop_body(built["fp16 64 rows on 4 warps"].ttgir)
    assert v7.count("ttg.local_alloc") == 1   # what v8 removes: v7's relabelled copy of x


# an H100's SM: 228 KiB of shared memory, 1 KiB of it reserved per resident program; 64 K registers
SM90_SHARED_PER_SM, SM90_RESERVED_PER_PROGRAM, SM90_REGISTERS_PER_SM = 228 * 1024, 1024, 65536


@needs_checked_triton
@pytest.mark.op("int4_gemm")
@pytest.mark.parametrize("name", ["fp16 64 rows on 4 warps", "bf16 zeros 64 rows on 4 warps"])
def test_v7_tile_lets_two_programs_share_an_sm(built, name):
    """What v7's K split counts on (wide_split_k's per_sm = 2 at 4 warps): at M = 128 with 64
    weight rows on one warpgroup, two programs fit an SM's shared memory and register file, with
    no spills, and v6's 8-warp tile does not leave room for a second; the dot is still the
    register-operand wgmma, with no layout conversion in the loop."""
    k = built[name]
    assert 2 * (k.shared + SM90_RESERVED_PER_PROGRAM) <= SM90_SHARED_PER_SM, k.shared
    assert 2 * k.registers * 4 * 32 <= SM90_REGISTERS_PER_SM, k.registers
    assert k.spill_stores == 0 and k.spill_loads == 0
    v6 = built["fp16"]
    assert 2 * v6.registers * 8 * 32 > SM90_REGISTERS_PER_SM, v6.registers
    loop = _loop_body(k.ttgir)
    assert re.search(r"ttng\.warp_group_dot %\S+, %\S+, .*? : tensor<64x128x(f16|bf16), "
                     r"#ttg\.dot_op<\{opIdx = 0", loop), ins.excerpt(loop, r"warp_group_dot")
    assert "ttg.convert_layout" not in loop, ins.excerpt(loop, r"convert_layout")


# ---------------------------------------------------------------- GPU: fp16/bf16, the layer's size

@pytest.mark.gpu
@pytest.mark.op("int4_gemm")
@pytest.mark.parametrize("m", [s["m"] for s in ig.SWEEP] + [256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_wide_benchmark_size(m, dtype):
    x, packed, scales, zeros = _operands(m, 8192, 8192, 128, dtype=dtype, zero_point=True)
    for split in (1, None):
        _check(ig.int4_tc_wide(x, packed, scales, zeros, split_k=split), x, packed, scales,
               zeros, f"GPU v6 M={m} {dtype} split_k={split}")


@pytest.mark.gpu
@pytest.mark.op("int4_gemm")
@pytest.mark.parametrize("options", [dict(block_n=64), dict(block_m=64), dict(num_stages=4),
                                     dict(block_n=64, num_warps=8)],
                         ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_gpu_wide_variants_at_m128(options):
    """The variants worth timing at M = 128, checked before they are timed."""
    x, packed, scales, zeros = _operands(128, 8192, 8192, 128, dtype=torch.bfloat16,
                                         zero_point=True)
    for split in (None, 4):
        _check(ig.int4_tc_wide(x, packed, scales, zeros, split_k=split, **options), x, packed,
               scales, zeros, f"GPU v6 {options} split_k={split}")


@pytest.mark.gpu
@pytest.mark.op("int4_gemm")
@pytest.mark.parametrize("version", ["v6", "v7", "v8"])
def test_gpu_registered_at_the_sweep_sizes(version):
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16):
        for size in ig.int4_gemm_op.sweep:
            x, packed, scales, dense = ig.make_inputs(size, dtype, "cuda", gen)
            y = ig.int4_gemm_op.impls[version].fn(x, packed, scales, dense)
            _check(y, x, packed, scales, None, f"GPU {version} {size} {dtype}")
