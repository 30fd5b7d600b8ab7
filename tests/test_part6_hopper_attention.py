"""FlashAttention's forward on Hopper, step 1 (csrc/hopper_attn/flash_fwd.cu,
snippets/part6/hopper_attention.py).

On a CPU: the file compiles for sm_90a with the launcher's own nvcc command, without spills and
without ptxas serialising the wgmmas (C7515); its SASS holds HGMMA (the PV one with a register A
and a transposed B), UTMALDG and SYNCS; it compiles for sm_80 and plain sm_90 (bodies trap); its
constants are the launcher's; its descriptors are snippets/part6/hopper.py's; the register
fragments it relies on (the accumulator of S is the A operand of P V) agree with CuTe's layouts; a
transcription of its online softmax matches the float64 reference; bad inputs are refused before
a launch. On an H100 / H200 (marked ``gpu``): o and lse against the float64 reference, within twice
SDPA's own error; every element written; the same bits on every call."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from helpers import nvcc_with_report, sass_by_function
from test_cuda_compile import parse_ptxas, spilling_functions

from conftest import poison_allocator
from snippets.part6 import hopper_attention as ha
from snippets.part6.hopper import kmajor_offsets, wgmma_descriptor

pytestmark = pytest.mark.op("hopper_attention_fwd")

REPO_ROOT = Path(__file__).resolve().parents[1]
CU = REPO_ROOT / "csrc" / ha.CU_FILE
NVCC = shutil.which("nvcc")
requires_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")


@pytest.fixture(scope="module")
def cubin(tmp_path_factory) -> tuple[Path, str]:
    """The cubin built by the launcher's own nvcc command (plus ptxas's report), and that report."""
    if NVCC is None:
        pytest.skip("nvcc is not on PATH")
    out = tmp_path_factory.mktemp("hopper_attn") / "flash_fwd.cubin"
    return out, nvcc_with_report(ha.nvcc_command(out), REPO_ROOT)


# --------------------------------------------------------------------------------------------------
# The compiled kernels
# --------------------------------------------------------------------------------------------------

@requires_nvcc
def test_compiles_for_sm90a_without_spills(cubin):
    _, report = cubin
    functions = parse_ptxas(report)
    kernels = {name for name, f in functions.items() if f["entry"]}
    assert kernels == set(ha.KERNELS.values())
    assert not spilling_functions(functions), report
    assert "C7515" not in report, f"ptxas serialises the wgmmas of a kernel:\n{report}"
    assert "warning" not in report.lower(), report
    for name in ha.KERNELS.values():  # __launch_bounds__(384, 1) caps 65536 / 384
        assert functions[name]["registers"] <= min(255, 65536 // ha.THREADS)


@requires_nvcc
def test_sass_uses_wgmma_tma_and_mbarriers(cubin):
    """S = Q K^T is an HGMMA 64x128x16 with both operands from descriptors; O += P V is an HGMMA
    64xDx16 whose A is a register and whose B descriptor is transposed (tnspB); the tiles come by
    UTMALDG; the waits are SYNCS; setmaxnreg is USETMAXREG; nothing falls back to mma.sync."""
    sass = sass_by_function(cubin[0])
    assert set(sass) == set(ha.KERNELS.values())
    for d, name in ha.KERNELS.items():
        code = sass[name]
        qk = re.findall(r"HGMMA\.64x128x16\.F32\.BF16 R\d+, gdesc\[UR\d+\]", code)
        pv = re.findall(rf"HGMMA\.64x{d}x16\.F32\.BF16 R\d+, R\d+, gdesc\[UR\d+\]\.tnspB", code)
        assert qk, f"{name}: no shared-memory HGMMA for Q K^T"
        assert len(pv) == ha.BLOCK_N // 16, f"{name}: {len(pv)} register-A HGMMAs for P V"
        assert "UTMALDG.3D" in code, f"{name}: no 3-D TMA load (one head per box)"
        assert "SYNCS.PHASECHK" in code, f"{name}: no mbarrier wait"
        assert "USETMAXREG" in code, f"{name}: no setmaxnreg"
        assert "HMMA" not in code.replace("HGMMA", ""), f"{name}: falls back to mma.sync"


@requires_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_other_targets_compile_to_traps(arch, tmp_path):
    """Without sm_90a's features every kernel body is a trap, so the file still builds for the
    book's other targets (tests/test_cuda_compile.py builds every csrc file for them)."""
    cmd = [NVCC, "-std=c++17", "-c", f"-arch={arch}", str(CU), "-o", str(tmp_path / "f.o")]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in (proc.stderr + proc.stdout).lower(), proc.stderr


def _cu_constants() -> dict[str, int]:
    text = CU.read_text()
    return {name: int(value) for name, value in re.findall(r"\b([A-Z][A-Z0-9_]*) = (\d+);", text)}


def test_constants_match_the_launcher():
    c = _cu_constants()
    assert (c["BLOCK_M"], c["BLOCK_N"], c["STAGES"]) == (ha.BLOCK_M, ha.BLOCK_N, ha.STAGES)
    assert (c["PANEL_COLS"], c["BOX_ROWS"], c["SWIZZLE_REPEAT"]) == (ha.PANEL_COLS, ha.BOX_ROWS,
                                                                     ha.SWIZZLE_REPEAT)
    assert (1 + c["CONSUMERS"]) * c["WG_THREADS"] == ha.THREADS
    text = CU.read_text()
    for d, name in ha.KERNELS.items():
        assert re.search(rf"__launch_bounds__\({ha.THREADS}, 1\)\s*{name}\(", text)
        assert f"ha::flash_fwd<{d}>" in text
        # Smem<D>::LAUNCH_BYTES: Q + STAGES x (K + V) + the barriers + the alignment slack
        tile = c["BOX_ROWS"] * d * 2
        assert ha.smem_bytes(d) == (tile * (1 + 2 * c["STAGES"]) + (1 + 2 * c["STAGES"]) * 8
                                    + c["SWIZZLE_REPEAT"])


# --------------------------------------------------------------------------------------------------
# Descriptors and register fragments, on paper
# --------------------------------------------------------------------------------------------------

def _enc(x: int) -> int:
    return (x & 0x3FFFF) >> 4


def _c_desc(addr: int, lbo: int, sbo: int) -> int:
    """make_desc of flash_fwd.cu, transcribed."""
    return _enc(addr) | _enc(lbo) << 16 | _enc(sbo) << 32 | 1 << 62


@pytest.mark.parametrize("d", ha.HEAD_DIMS)
def test_descriptors_are_hopper_py_descriptors(d):
    """Q's and K's descriptors (K-major: LBO 16, SBO 1024, + 32 bytes per 16 of D inside a panel,
    + a panel of 16 KB per 64 of D) are those hopper.py encodes for a 128B-swizzled K-major tile;
    V's (MN-major) use LBO = one panel (the next 64 columns of D) and SBO = 1024 (the next 8 keys),
    + 2048 bytes per 16 keys."""
    lbo, sbo = kmajor_offsets(ha.BOX_ROWS, ha.PANEL_COLS * 2, "128B")
    assert (lbo, sbo) == (16, 1024)
    panel = ha.BOX_ROWS * ha.PANEL_COLS * 2
    for base in (0, 1024, 32 * 1024, 160 * 1024):
        for kk in range(d // 16):
            for half in (0, 64 * 128):  # consumer 1's rows of Q
                addr = base + half + (kk // 4) * panel + (kk % 4) * 32
                assert _c_desc(addr, 16, 1024) == wgmma_descriptor(addr, lbo, sbo, "128B")
        for kk in range(ha.BLOCK_N // 16):
            addr = base + kk * 16 * 128
            assert addr % 1024 == 0  # base offset 0 stays right
            assert _c_desc(addr, panel, 1024) == wgmma_descriptor(addr, panel, 1024, "128B")


def _cute(shape, stride, t: int, v: int) -> int:
    """A CuTe layout ((4, 8, 4), (v0, v1, v2)) : ((...), (...)) at thread t, value v (column-major
    coordinates, as CuTe flattens them)."""
    (ts, vs), (tst, vst) = shape, stride
    out = 0
    for sizes, strides, idx in ((ts, tst, t), (vs, vst, v)):
        for n, st in zip(sizes, strides):
            out += (idx % n) * st
            idx //= n
    return out


def _acc_coord(n: int, t: int, i: int) -> tuple[int, int]:
    """(row, column) of accumulator register i of thread t, as flash_fwd.cu reads it (the
    fragments comment): the GEMM's store_acc layout."""
    warp, lane = divmod(t, 32)
    j, h, e = i // 4, (i // 2) % 2, i % 2
    return warp * 16 + lane // 4 + 8 * h, 8 * j + 2 * (lane % 4) + e


@pytest.mark.parametrize("n", [64, 128])
def test_accumulator_layout_is_cutes(n):
    """The kernel's reading of the accumulators is CuTe's CLayout_64xN (index = row + 64 * col)."""
    shape, stride = ((4, 8, 4), (2, 2, n // 8)), ((128, 1, 16), (64, 8, 512))
    for t in range(128):
        for i in range(n // 2):
            r, c = _acc_coord(n, t, i)
            assert _cute(shape, stride, t, i) == r + 64 * c


def test_p_fragment_is_the_register_a_operand():
    """P's A fragment for keys 16kk..16kk+15 is accumulator registers 8kk..8kk+7, paired in order:
    value v of the A operand (CuTe's ALayout_64x16: 8 bf16 values a thread, 4 b32 registers) is
    accumulator register 8kk + v, at the same row and at column 16kk + (its column)."""
    a_shape, a_stride = ((4, 8, 4), (2, 2, 2)), ((128, 1, 16), (64, 8, 512))
    for t in range(128):
        for kk in range(ha.BLOCK_N // 16):
            for v in range(8):
                idx = _cute(a_shape, a_stride, t, v)
                row, col = idx % 64, idx // 64
                assert _acc_coord(ha.BLOCK_N, t, 8 * kk + v) == (row, 16 * kk + col)


def _kernel_transcription(q, k, v, causal, scale):
    """flash_fwd.cu's arithmetic in float32 on one (S, D) head: tiles of 128 keys, scores in log2
    units, the last tile masked (keys >= S, keys right of the diagonal), m = -inf guarded, p
    rounded to bf16 before P V, l summed from the unrounded p, lse = (m + log2 l) ln 2."""
    s, d = q.shape
    q, k, v = q.float(), k.float(), v.float()
    o = torch.empty(s, d)
    lse = torch.empty(s)
    for m0 in range(0, s, ha.BLOCK_M):
        rows = torch.arange(m0, min(m0 + ha.BLOCK_M, s))
        acc = torch.zeros(len(rows), d)
        m = torch.full((len(rows),), float("-inf"))
        l_sum = torch.zeros(len(rows))
        key_tiles = -(-s // ha.BLOCK_N)
        n_tiles = min(key_tiles, m0 // ha.BLOCK_M + 1) if causal else key_tiles
        for t in range(n_tiles):
            keys = torch.arange(t * ha.BLOCK_N, min((t + 1) * ha.BLOCK_N, s))
            sc = (q[rows] @ k[keys].T) * (scale * ha.LOG2E)
            if t == n_tiles - 1 and causal:
                sc = sc.masked_fill(keys[None, :] > rows[:, None], float("-inf"))
            mx = torch.maximum(m, sc.max(dim=1).values)
            m_use = torch.where(mx == float("-inf"), torch.zeros_like(mx), mx)
            alpha = torch.exp2(m - m_use)
            p = torch.exp2(sc - m_use[:, None])
            l_sum = l_sum * alpha + p.sum(dim=1)
            m = mx
            acc = acc * alpha[:, None] + p.bfloat16().float() @ v[keys]
        o[rows] = acc / l_sum[:, None]
        lse[rows] = (m + torch.log2(l_sum)) * math.log(2)
    return o.bfloat16(), lse


@pytest.mark.parametrize("s, d, causal", [(1, 64, False), (77, 64, True), (300, 128, False),
                                          (300, 128, True), (256, 64, True)])
def test_kernel_arithmetic_matches_reference(s, d, causal):
    """The online softmax as the kernel does it (a CPU transcription) against the float64
    reference: within bf16's rounding of P and of o."""
    gen = torch.Generator().manual_seed(s + d)
    q, k, v = (torch.randn(1, 1, s, d, generator=gen).bfloat16() for _ in range(3))
    o_ref, lse_ref = ha.attention_ref(q, k, v, causal)
    o, lse = _kernel_transcription(q[0, 0], k[0, 0], v[0, 0], causal, 1 / math.sqrt(d))
    torch.testing.assert_close(o.double(), o_ref[0, 0], rtol=0, atol=2e-2)
    torch.testing.assert_close(lse.double(), lse_ref[0, 0], rtol=0, atol=1e-4)


def test_reference_is_part5s():
    """attention_ref's o is Part 5's attention_ref (in float64); its lse is each row's
    logsumexp."""
    from snippets.part5.flash_attention import attention_ref as part5_ref
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, 37, 64, generator=gen, dtype=torch.float64) for _ in range(3))
    for causal in (False, True):
        o, lse = ha.attention_ref(q, k, v, causal)
        torch.testing.assert_close(o, part5_ref(q, k, v, causal))
        scores = q @ k.transpose(-1, -2) / 8.0
        if causal:
            scores = scores.masked_fill(torch.ones(37, 37, dtype=torch.bool).triu(1), -math.inf)
        torch.testing.assert_close(lse, torch.logsumexp(scores, -1))


# --------------------------------------------------------------------------------------------------
# Refusals, before any launch (no GPU needed)
# --------------------------------------------------------------------------------------------------

def _qkv(*shape, dtype=torch.bfloat16):
    return tuple(torch.randn(*shape).to(dtype) for _ in range(3))


def _misaligned():
    flat = torch.randn(1 * 1 * 8 * 64 + 1).bfloat16()
    q = flat[1:].view(1, 1, 8, 64)
    return q, q.clone(), q.clone()


BAD = [
    (lambda: _qkv(1, 1, 8, 64, dtype=torch.float16), TypeError, "bfloat16"),
    (lambda: ([[1.0]], *_qkv(1, 1, 8, 64)[1:]), TypeError, "torch.Tensor"),
    (lambda: _qkv(1, 8, 64), ValueError, "4-D"),
    (lambda: _qkv(1, 1, 8, 96), ValueError, "head dim D = 96"),
    (lambda: _qkv(1, 1, 8, 32), ValueError, "head dim D = 32"),
    (lambda: _qkv(1, 1, 0, 64), ValueError, "empty"),
    (lambda: (*_qkv(1, 1, 8, 64)[:2], torch.randn(1, 1, 9, 64).bfloat16()), ValueError,
     "one shape"),
    (lambda: tuple(t.transpose(1, 2) for t in _qkv(1, 2, 2, 64)), ValueError, "contiguous"),
    (_misaligned, ValueError, "16-byte aligned"),
]


@pytest.mark.parametrize("make, error, match", BAD)
def test_bad_input_is_refused_before_launch(make, error, match):
    q, k, v = make()
    with pytest.raises(error, match=match) as info:
        ha.flash_fwd_hopper(q, k, v)
    assert "flash_fwd_hopper" in str(info.value)


def test_bad_flags_are_refused():
    q, k, v = _qkv(1, 1, 8, 64)
    with pytest.raises(TypeError, match="causal must be a bool"):
        ha.flash_fwd_hopper(q, k, v, causal=1)
    with pytest.raises(ValueError, match="finite"):
        ha.flash_fwd_hopper(q, k, v, scale=float("inf"))
    with pytest.raises(TypeError, match="scale"):
        ha.flash_fwd_hopper(q, k, v, scale="0.1")


def test_requires_grad_is_refused():
    q, k, v = _qkv(1, 1, 8, 64)
    q.requires_grad_(True)
    with pytest.raises(RuntimeError, match="forward-only"):
        ha.flash_fwd_hopper(q, k, v)


def test_cpu_tensors_are_refused():
    """Good CPU tensors: a clear RuntimeError (here, or on a GPU machine), not a crash."""
    q, k, v = _qkv(1, 1, 8, 64)
    with pytest.raises(RuntimeError, match="CUDA tensors"):
        ha.flash_fwd_hopper(q, k, v)


def test_tensor_maps_are_valid():
    """The three maps: (D, S, B*H) bf16, boxes of 64 x 128 x 1 under the 128B swizzle (a box's
    inner dimension may not pass the 128-byte span: D = 128 is two boxes per tile), 16 KB per box,
    one head per box (rows past S are TMA's zeros, not the next head's)."""
    for d in ha.HEAD_DIMS:
        for heads, s in ((1, 1), (2, 77), (8, 1024), (4 * 32, 4096)):
            spec = ha.tensor_map_spec(heads, s, d, 0)
            assert spec.box_shape == (64, 128, 1) and spec.swizzle.label == "128B"
            assert spec.global_shape == (d, s, heads) and spec.global_strides == (2 * d, 2 * d * s)
            assert spec.expect_tx_bytes() * (d // 64) == 128 * d * 2  # one tile's expect_tx
        assert ha.smem_bytes(d) <= 227 * 1024


# --------------------------------------------------------------------------------------------------
# On a Hopper GPU
# --------------------------------------------------------------------------------------------------

def _skip_unless_sm90():
    reason = ha.needs_sm90()
    if reason:
        pytest.skip(reason)


def _inputs(b, h, s, d, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return tuple(torch.randn(b, h, s, d, device="cuda", generator=gen).bfloat16()
                 for _ in range(3))


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", ha.HEAD_DIMS)
@pytest.mark.parametrize("s", [1, 77, 128, 300, 1024])
@pytest.mark.parametrize("b, h", [(1, 1), (1, 4), (2, 1), (2, 4)])
def test_matches_float64_reference(b, h, s, d, causal):
    """o within twice the error of torch's SDPA (same bf16 inputs, same float64 reference) plus
    1e-3; lse within 1e-3 of the float64 logsumexp."""
    _skip_unless_sm90()
    q, k, v = _inputs(b, h, s, d, seed=b * 1000 + h * 100 + s + d + causal)
    o, lse = ha.flash_fwd_hopper(q, k, v, causal)
    torch.cuda.synchronize()
    assert o.shape == q.shape and o.dtype == torch.bfloat16
    assert lse.shape == (b, h, s) and lse.dtype == torch.float32
    o_ref, lse_ref = ha.attention_ref(q, k, v, causal)
    # lse first: it depends on Q K^T and the softmax only, so a right lse with a wrong o points at
    # P V (P's register fragment, V's transposed descriptor)
    torch.testing.assert_close(lse.double(), lse_ref, rtol=0, atol=1e-3)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    sdpa_err = (sdpa.double() - o_ref).abs().max().item()
    err = (o.double() - o_ref).abs().max().item()
    assert err <= 2 * sdpa_err + 1e-3, f"max error {err:.3g}, SDPA's {sdpa_err:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("d", ha.HEAD_DIMS)
def test_pv_operand_layout(d):
    """P V alone, with exact numbers: q = 0 makes every score 0 and every p exactly 1. With
    v[j, c] = c each output row is 0, 1, ..., D-1 (V's columns: the panels, LBO); causal with
    v[j, c] = j, row i is the mean of keys 0..i, i / 2 (V's rows: SBO, the 16-key steps, and the
    key order of P's fragment)."""
    _skip_unless_sm90()
    s = 128
    q = torch.zeros(1, 1, s, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 1, s, d, device="cuda").bfloat16()
    cols = torch.arange(d, device="cuda", dtype=torch.float32).expand(s, d)
    o, _ = ha.flash_fwd_hopper(q, k, cols.bfloat16().view(1, 1, s, d).contiguous())
    torch.testing.assert_close(o[0, 0].float(), cols, rtol=0, atol=0)
    keys = torch.arange(s, device="cuda", dtype=torch.float32)[:, None].expand(s, d)
    o, _ = ha.flash_fwd_hopper(q, k, keys.bfloat16().view(1, 1, s, d).contiguous(), causal=True)
    torch.testing.assert_close(o[0, 0].float(), keys / 2, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("d", ha.HEAD_DIMS)
def test_scale_is_applied(d):
    _skip_unless_sm90()
    q, k, v = _inputs(1, 2, 200, d, seed=7)
    for causal in (False, True):
        o, lse = ha.flash_fwd_hopper(q, k, v, causal, scale=0.3)
        o_ref, lse_ref = ha.attention_ref(q, k, v, causal, scale=0.3)
        torch.testing.assert_close(o.double(), o_ref, rtol=0, atol=2e-2)
        torch.testing.assert_close(lse.double(), lse_ref, rtol=0, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", ha.HEAD_DIMS)
def test_every_element_is_written_and_repeatable(d, causal):
    """o starts as NaN (a stale row would show; lse, whose block the allocator may not hand back,
    is checked against the reference instead); two calls give identical bits."""
    _skip_unless_sm90()
    b, h, s = 2, 3, 333
    q, k, v = _inputs(b, h, s, d, seed=11)
    poison_allocator(b * h * s * d * 2, "cuda")
    o1, lse1 = ha.flash_fwd_hopper(q, k, v, causal)
    poison_allocator(b * h * s * d * 2, "cuda")
    o2, lse2 = ha.flash_fwd_hopper(q, k, v, causal)
    torch.cuda.synchronize()
    assert not o1.isnan().any() and not lse1.isnan().any()
    assert torch.equal(o1, o2) and torch.equal(lse1, lse2)
    o_ref, lse_ref = ha.attention_ref(q, k, v, causal)
    torch.testing.assert_close(o1.double(), o_ref, rtol=0, atol=2e-2)
    torch.testing.assert_close(lse1.double(), lse_ref, rtol=0, atol=1e-3)


@pytest.mark.gpu
def test_misaligned_view_is_refused_on_gpu():
    _skip_unless_sm90()
    flat = torch.randn(64 * 64 + 1, device="cuda").bfloat16()
    q = flat[1:].view(1, 1, 64, 64)
    with pytest.raises(ValueError, match="16-byte aligned"):
        ha.flash_fwd_hopper(q, q.clone(), q.clone())
