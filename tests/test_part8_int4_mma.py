"""int4_gemm v9 (csrc/part8/int4_mma.cu, mma.sync on codes dequantised by bit tricks).

On a CPU: the dequantisation's constants, read from the .cu file, turn every code of a word into
code minus zero exactly, for bf16 and fp16 and every zero point (a mask that pushes a code's top
bit into the exponent, as bf16's would at bits 4..7, fails it); one slab of one warp transcribed
lane by lane (the words each lane loads, the pairs dequant8 makes, x regrouped by the byte
permutes, the m16n8k16 fragment layout of the PTX ISA) gives the slab's product, so the slot
relabelling and the permutes agree; the refusals come before any launch. On a GPU: bf16 and fp16
against float64 dequantise-then-multiply, M = 1 to 16, ragged N, G = 128 and 256, with and without
zero points, and the registered version's hand-over to v8 past its limits."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from helpers import assert_int4_matches, int4_operands

from conftest import DEVICE
from snippets import cuda
from snippets.part8 import int4_gemm as ig

CU = cuda.source_path(ig.MMA_CU_FILE).read_text()


def _traits(type_name: str) -> dict[str, int | float]:
    """The constants of ``Int4Type<type_name>`` as the .cu file writes them."""
    body = re.search(r"struct Int4Type<" + re.escape(type_name) + r"> \{(.*?)\};", CU, re.S)[1]
    values = {}
    for name, value in re.findall(r"static constexpr \w+ (\w+) = (0x[0-9a-f]+|[0-9.]+)u?f?;", body):
        values[name] = float(value) if "." in value else int(value, 0)
    return values


def _decode(bits: np.ndarray, kind: str) -> np.ndarray:
    """16-bit patterns as the float values they hold (bf16: the top half of a float32)."""
    bits = bits.astype(np.uint32)
    if kind == "bf16":
        return (bits << 16).view(np.float32).astype(np.float64)
    return bits.astype(np.uint16).view(np.float16).astype(np.float64)


def _dequant8(words: np.ndarray, zero: int, kind: str) -> np.ndarray:
    """dequant8 transcribed: (len(words), 4 registers, 2 halves) of code minus zero."""
    t = _traits("__nv_bfloat16" if kind == "bf16" else "__half")
    lo_z, hi_z = t["BASE"] + zero, t["HI_BASE"] + zero
    step = _decode(np.array([t["HI_STEP"] & 0xFFFF]), kind)[0]
    w = words.astype(np.uint64)
    w8 = w >> 8
    regs = [(w & 0x000F000F) | t["MAGIC"],
            ((w >> t["HI_SHIFT"]) & t["HI_MASK"]) | t["MAGIC"],
            (w8 & 0x000F000F) | t["MAGIC"],
            ((w8 >> t["HI_SHIFT"]) & t["HI_MASK"]) | t["MAGIC"]]
    out = np.empty((len(words), 4, 2))
    for r, reg in enumerate(regs):
        for half in range(2):
            v = _decode((reg >> (16 * half)) & 0xFFFF, kind)
            out[:, r, half] = v - lo_z if r % 2 == 0 else v * step - hi_z  # exact: no rounding
    return out


def _codes(words: np.ndarray) -> np.ndarray:
    return np.stack([(words.astype(np.uint64) >> (4 * i)) & 0xF for i in range(8)], axis=1).astype(np.int64)


@pytest.mark.parametrize("kind", ["bf16", "fp16"])
def test_dequant_constants_give_every_code_minus_zero(kind):
    """Every code at every position of a word, every zero point: out[r] = (c_r, c_{r+4}) - z."""
    rng = np.random.default_rng(0)
    # each code value at each of the 8 positions, and random words
    words = np.concatenate([
        np.array([sum(c << (4 * i) for i in range(8)) for c in range(16)], dtype=np.uint64),
        rng.integers(0, 2**32, 256, dtype=np.uint64)])
    codes = _codes(words)
    for zero in range(16):
        out = _dequant8(words, zero, kind)
        for r in range(4):
            np.testing.assert_array_equal(out[:, r, 0], codes[:, r] - zero, err_msg=f"{kind} r{r}")
            np.testing.assert_array_equal(out[:, r, 1], codes[:, r + 4] - zero,
                                          err_msg=f"{kind} r{r}")


def test_a_mask_into_the_exponent_would_fail():
    """The check above catches the tempting bf16 mistake: the odd code at bits 4..7 (0x00f0) under
    bf16's magic puts the code's top bit into the exponent."""
    t = _traits("__nv_bfloat16")
    word = np.array([0x90], dtype=np.uint64)  # code 9 at position 1
    wrong = _decode((word & 0x00F0) | t["MAGIC"] & 0xFFFF, "bf16")[0]
    assert wrong != 128 + 16 * 9
    assert _dequant8(word, 8, "bf16")[0, 1, 0] == 1  # the file's way: code 9 minus zero 8


def _byte_perm(a: int, b: int, selector: int) -> int:
    """CUDA's __byte_perm: result byte i is byte (selector >> 4i) & 7 of the 8 bytes b:a."""
    src = (b << 32) | a
    return sum(((src >> (8 * ((selector >> (4 * i)) & 7))) & 0xFF) << (8 * i) for i in range(4))


# the kernel's byte permutes of x, in call order, and the registers of its two A fragments a word
PERMUTES = [(a, b, int(sel, 16)) for a, b, sel in
            re.findall(r"__byte_perm\(v\.(\w), v\.(\w), (0x[0-9a-f]+)\)", CU)]
A_REGS = [[(name, int(i)) for name, i in re.findall(r"(r[01])\[(\d)\]", re.search(
    r"const u32 " + a + r"\[4\] = \{(.*?)\};", CU)[1])] for a in ("a04", "a26")]


def test_one_slab_of_one_warp_transcribed():
    """The kernel's lane mapping for one 128-deep slab of 16 weight rows and 8 rows of x: what each
    lane loads, dequantises, permutes and hands to two MMAs a word, accumulated with the PTX ISA's
    m16n8k16 fragment layout, equals the slab's product of codes minus zero with x. The permutes'
    selectors and the fragments' registers are read from the .cu file."""
    assert len(PERMUTES) == 4 and [len(a) for a in A_REGS] == [4, 4]
    rng = np.random.default_rng(1)
    zero = 8
    packed = rng.integers(0, 256, (16, 64), dtype=np.uint8)  # 16 rows x 128 codes
    x = rng.integers(-4, 5, (8, 128)).astype(np.float64)     # small integers: exact sums
    codes = np.stack([packed & 0xF, packed >> 4], axis=2).reshape(16, 128).astype(np.float64)
    want = (codes - zero) @ x.T                               # (16 rows, 8 columns)

    words = packed.view("<u4")  # (16, 16): word w of a row holds k = 8w .. 8w + 7
    d = np.zeros((16, 8))
    for j in range(4):  # word j of each lane's 16 bytes
        a_frag, b_frag = {}, {}
        for lane in range(32):
            g, t = lane // 4, lane % 4
            w0, w1 = words[g, 4 * t + j], words[g + 8, 4 * t + j]  # rows g, g + 8
            r0 = _dequant8(np.array([w0], dtype=np.uint64), zero, "bf16")[0]
            r1 = _dequant8(np.array([w1], dtype=np.uint64), zero, "bf16")[0]
            base = 32 * t + 8 * j                                  # x at the lane's k
            xb = [int(v) & 0xFFFF for v in range(8)]               # 8 "bf16" x by index
            pairs = dict(x=xb[0] | xb[1] << 16, y=xb[2] | xb[3] << 16, z=xb[4] | xb[5] << 16,
                         w=xb[6] | xb[7] << 16)  # the uint4 of 8 x values
            perm = [_byte_perm(pairs[a], pairs[b], sel) for a, b, sel in PERMUTES]
            # which x index each half of each permuted register holds
            xidx = [(p & 0xFFFF, p >> 16) for p in perm]
            for mma in range(2):  # a04/(x04, x15), then a26/(x26, x37)
                regs = [{"r0": r0, "r1": r1}[name][i] for name, i in A_REGS[mma]]
                a_frag[(mma, lane)] = regs
                b_frag[(mma, lane)] = [x[g, base + i] for i in xidx[2 * mma]] + \
                                      [x[g, base + i] for i in xidx[2 * mma + 1]]
        for mma in range(2):
            # the PTX ISA's m16n8k16 layout: A a0 a1 (row g, k 2t, 2t+1), a2 a3 (row g+8),
            # a4 a5 (row g, k 2t+8, 2t+9), a6 a7 (row g+8); B b0 b1 (k 2t, 2t+1, column g),
            # b2 b3 (k 2t+8, 2t+9)
            A, B = np.zeros((16, 16)), np.zeros((16, 8))
            for lane in range(32):
                g, t = lane // 4, lane % 4
                regs = a_frag[(mma, lane)]
                for half in range(2):
                    A[g, 2 * t + half] = regs[0][half]
                    A[g + 8, 2 * t + half] = regs[1][half]
                    A[g, 2 * t + 8 + half] = regs[2][half]
                    A[g + 8, 2 * t + 8 + half] = regs[3][half]
                b = b_frag[(mma, lane)]
                B[2 * t, g], B[2 * t + 1, g], B[2 * t + 8, g], B[2 * t + 9, g] = b
            d += A @ B
    np.testing.assert_array_equal(d, want)


# ---------------------------------------------------------------- refusals, before any launch

def _no_launch(*args, **kwargs):
    raise AssertionError("a kernel was launched on input that must be refused")


def _bad_inputs():
    x, packed, scales, zeros = int4_operands(4, 32, 256, 128, torch.float16, DEVICE, True)
    x17, _, _, _ = int4_operands(17, 32, 256, 128, torch.float16, DEVICE)
    x64, packed64, scales64, _ = int4_operands(2, 32, 256, 64, torch.float16, DEVICE)
    shifted = torch.zeros(4 * 256 + 4, dtype=torch.float16, device=DEVICE)[4:].view(4, 256)
    shifted.copy_(x)
    packed_off = torch.zeros(32 * 128 + 4, dtype=torch.uint8, device=DEVICE)[4:].view(32, 128)
    return [
        ("M = 17", (x17, packed, scales), ValueError, "M <= 16"),
        ("G = 64", (x64, packed64, scales64), ValueError, "multiple of 128"),
        ("fp32 x", (x.float(), packed, scales.float()), TypeError, "bfloat16 or float16"),
        ("x off 16 bytes", (shifted, packed, scales), ValueError, "16-byte boundary"),
        ("packed off 16 bytes", (x, packed_off, scales), ValueError, "16-byte boundary"),
        ("zeros shape", (x, packed, scales, zeros[:, :1].contiguous()), ValueError,
         "zeros must have"),
        ("x not 2-D", (x[0], packed, scales), ValueError, "2-D"),
    ]


BAD = _bad_inputs()


@pytest.mark.op("int4_gemm")
@pytest.mark.parametrize("label, args, exc, words", BAD, ids=[b[0] for b in BAD])
def test_refuses_before_launch(label, args, exc, words, monkeypatch):
    monkeypatch.setattr(cuda, "kernel", _no_launch)
    monkeypatch.setattr(cuda, "launch", _no_launch)
    with pytest.raises(exc, match=words):
        ig.int4_mma(*args)


@pytest.mark.op("int4_gemm")
def test_refuses_grad():
    x, packed, scales, _ = int4_operands(2, 16, 128, 128, torch.float16, DEVICE)
    with pytest.raises(RuntimeError, match="forward-only"):
        ig.int4_mma(x.requires_grad_(), packed, scales)


@pytest.mark.op("int4_gemm")
def test_v9_registration():
    v9 = ig.int4_gemm_op.impls["v9"]
    assert v9.lang == "CUDA" and v9.device == "cuda" and v9.origin == "book"
    assert cuda.source_path(ig.MMA_CU_FILE) in v9.sources and ig.int4_mma in v9.sources
    # the launch's numbers are the file's -D options
    assert ig.MMA_OPTIONS == cuda.defines(ig.MMA_CU_FILE, STAGES=ig.MMA_STAGES,
                                          MAX_WARPS=ig.MMA_WARPS)


# ---------------------------------------------------------------- on a GPU

MMA_SHAPES = [(1, 64, 128, 128), (5, 40, 256, 128), (8, 100, 512, 256), (9, 8200, 1024, 128),
              (16, 33, 384, 128), (12, 4096, 8192, 128), (1, 8192, 8192, 128)]


@pytest.mark.gpu
@pytest.mark.op("int4_gemm")
@pytest.mark.parametrize("m, n, k, g", MMA_SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("zero_point", [False, True], ids=["sym", "zeros"])
def test_mma_matches_reference(m, n, k, g, dtype, zero_point):
    """M = 1 to 16 (one and two tiles of rows a block), N ragged against 16 and 32 rows, one to 64
    slabs (fewer slabs than warps, and rings that wrap), G = 128 and 256."""
    x, packed, scales, zeros = int4_operands(m, n, k, g, dtype, "cuda", zero_point)
    assert_int4_matches(ig.int4_mma(x, packed, scales, zeros), x, packed, scales, zeros,
                        f"v9 M={m} N={n} K={k} G={g} {dtype} zeros={zero_point}")


@pytest.mark.gpu
@pytest.mark.op("int4_gemm")
@pytest.mark.parametrize("m, g", [(17, 128), (4, 64)], ids=["M=17", "G=64"])
def test_v9_hands_what_the_kernel_refuses_to_v8(m, g):
    x, packed, scales, _ = int4_operands(m, 64, 256, g, torch.bfloat16, "cuda")
    y = ig.int4_gemm_op.impls["v9"].fn(x, packed, scales)
    assert torch.equal(y, ig.int4_gemm_op.impls["v8"].fn(x, packed, scales))
