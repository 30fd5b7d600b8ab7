"""Hopper's descriptors on a CPU (snippets/part6/hopper.py): the wgmma matrix descriptor against
the PTX ISA's field layout (values worked out by hand and the worked examples of the PTX ISA's
"Canonical Layouts"), encode/decode round trips, the K-major leading and stride byte offsets of
each swizzle, every rule of cuTensorMapEncodeTiled that TensorMapSpec.validate checks, and the
GEMM host checks."""

from __future__ import annotations

import ast
import random
import re
from pathlib import Path

import pytest

from snippets.part6 import hopper
from snippets.part6.hopper import (
    SMEM_LIMIT_SM90,
    Interleave,
    Swizzle,
    TensorMapSpec,
    check_gemm_operands,
    decode_wgmma_descriptor,
    descriptor_base_offset,
    kmajor_offsets,
    wgmma_descriptor,
)

SOURCE = Path(hopper.__file__)


# ---------------------------------------------------------------------------- swizzle modes


def test_swizzle_encodings_follow_ptx_and_the_driver_api():
    # PTX ISA, Matrix Descriptor Format, bits 62-63: 0 none, 1 128B, 2 64B, 3 32B
    assert [s.layout_type for s in (Swizzle.NONE, Swizzle.B128, Swizzle.B64, Swizzle.B32)] \
        == [0, 1, 2, 3]
    # CUtensorMapSwizzle: NONE = 0, 32B, 64B, 128B
    assert [s.tensor_map_swizzle for s in (Swizzle.NONE, Swizzle.B32, Swizzle.B64, Swizzle.B128)] \
        == [0, 1, 2, 3]
    assert [s.span_bytes for s in Swizzle] == [16, 32, 64, 128]
    # the repeat boundaries of the PTX table: 256, 512, 1024 bytes
    assert [s.repeat_bytes for s in (Swizzle.B32, Swizzle.B64, Swizzle.B128)] == [256, 512, 1024]
    # CuTe's Swizzle<B,4,3>, B = 0..3 (mma_traits_sm90_gmma.hpp, copy_traits_sm90_tma_swizzle.hpp)
    assert [s.cute_swizzle for s in Swizzle] == [(0, 4, 3), (1, 4, 3), (2, 4, 3), (3, 4, 3)]


@pytest.mark.parametrize("spelling, mode", [
    ("128B", Swizzle.B128), ("128b", Swizzle.B128), (128, Swizzle.B128),
    ("swizzle_128b", Swizzle.B128),
    ("64B", Swizzle.B64), ("32B", Swizzle.B32), (32, Swizzle.B32), ("none", Swizzle.NONE),
    ("interleave", Swizzle.NONE), (0, Swizzle.NONE), (Swizzle.B64, Swizzle.B64),
])
def test_swizzle_spellings(spelling, mode):
    assert hopper.as_swizzle(spelling) is mode


@pytest.mark.parametrize("spelling", ["256B", "96", 48, None, 1.5, True])
def test_unknown_swizzle_is_refused(spelling):
    with pytest.raises(ValueError, match="unknown swizzle"):
        hopper.as_swizzle(spelling)


def test_interleave_spellings():
    assert hopper.as_interleave("32B") is Interleave.B32
    assert hopper.as_interleave("none") is Interleave.NONE
    assert [i.tensor_map_interleave for i in Interleave] == [0, 1, 2]
    with pytest.raises(ValueError, match="unknown interleave"):
        hopper.as_interleave("64B")


# ---------------------------------------------------------------------------- the descriptor


def test_matrix_descriptor_encode_keeps_18_bits_in_16_byte_units():
    assert hopper.matrix_descriptor_encode(0x1400) == 0x140
    assert hopper.matrix_descriptor_encode(0x3FFF0) == 0x3FFF
    assert hopper.matrix_descriptor_encode(0x40010) == 0x1  # bit 18 and above are dropped
    assert hopper.matrix_descriptor_encode(0x1F) == 0x1     # so are the 4 low bits


def test_each_field_lands_in_its_bits():
    """One field at a time at its largest value: exactly the PTX bit range is set."""
    def bits(lo, hi):
        return ((1 << (hi - lo + 1)) - 1) << lo

    top = hopper.SMEM_WINDOW - 16  # the largest 16-byte-aligned value: all 14 bits set
    assert wgmma_descriptor(top, 0, 0, "none") == bits(0, 13)
    assert wgmma_descriptor(0, top, 0, "none") == bits(16, 29)
    assert wgmma_descriptor(0, 0, top, "none") == bits(32, 45)
    assert wgmma_descriptor(0, 0, 0, "128B", base_offset=7) == bits(49, 51) | 1 << 62
    assert wgmma_descriptor(0, 0, 0, "32B") == bits(62, 63)


def test_known_descriptors_computed_by_hand():
    # 128B-swizzled K-major bf16 tile at shared address 0: LBO 16 (encoded 1), SBO 1024 (64)
    assert wgmma_descriptor(0, 16, 1024, "128B") == 0x4000_0040_0001_0000
    # the same at 0x1400 = 5120 bytes: start field 5120 >> 4 = 0x140
    assert wgmma_descriptor(0x1400, 16, 1024, "128B") == 0x4000_0040_0001_0140
    # DeepGEMM's make_smem_desc default for K-major operands: LBO 0, SBO 1024, layout type B128
    assert wgmma_descriptor(0x8000, 0, 1024, Swizzle.B128) == (0x800 | 64 << 32 | 1 << 62)
    # a pattern starting 3 x 128 bytes past a 1024-byte boundary: base offset 3 in bits 49-51
    assert wgmma_descriptor(0x0580, 16, 1024, "128B", base_offset=3) \
        == 0x58 | 1 << 16 | 64 << 32 | 3 << 49 | 1 << 62


@pytest.mark.parametrize("lbo, sbo, swizzle, lbo_field, sbo_field", [
    (64 * 4, 32 * 4, "none", 16, 8),     # K-major, no swizzling, tf32
    (16, 64 * 4, "32B", 1, 16),          # K-major, 32B swizzling, tf32 (LBO "1 (assumed)")
    (128 * 2, 64 * 2, "none", 16, 8),    # MN-major, no swizzling, bf16
    (128 * 2, 256 * 2, "32B", 16, 32),   # MN-major, 32B swizzling, bf16
    (256 * 2, 512 * 2, "64B", 32, 64),   # MN-major, 64B swizzling, bf16
])
def test_ptx_isa_canonical_layout_examples(lbo, sbo, swizzle, lbo_field, sbo_field):
    """The encodings the PTX ISA's "Canonical Layouts" examples list for LBO and SBO."""
    d = decode_wgmma_descriptor(wgmma_descriptor(0, lbo, sbo, swizzle))
    desc = wgmma_descriptor(0, lbo, sbo, swizzle)
    assert (desc >> 16 & 0x3FFF, desc >> 32 & 0x3FFF) == (lbo_field, sbo_field)
    assert (d["leading_byte_offset"], d["stride_byte_offset"]) == (lbo, sbo)


def test_round_trip_over_random_valid_descriptors():
    rng = random.Random(90)
    for _ in range(3000):
        swizzle = rng.choice(list(Swizzle))
        fields = {
            "start_address": 16 * rng.randrange(1 << 14),
            "leading_byte_offset": 16 * rng.randrange(1 << 14),
            "stride_byte_offset": 16 * rng.randrange(1 << 14),
            "base_offset": 0 if swizzle is Swizzle.NONE else rng.randrange(8),
            "swizzle": swizzle,
        }
        desc = wgmma_descriptor(fields["start_address"], fields["leading_byte_offset"],
                                fields["stride_byte_offset"], swizzle, fields["base_offset"])
        assert 0 <= desc < 1 << 64
        assert decode_wgmma_descriptor(desc) == fields
        assert wgmma_descriptor(**{"smem_addr" if k == "start_address" else k: v
                                   for k, v in decode_wgmma_descriptor(desc).items()}) == desc


def test_moving_along_k_adds_to_the_start_field():
    """Kernels step a descriptor along K by adding (bytes >> 4) to it: the start field is the low
    bits, so 32 bytes further (one bf16 wgmma K-step) is the descriptor plus 2."""
    base = wgmma_descriptor(0x2000, 16, 1024, "128B")
    for step in range(4):
        assert wgmma_descriptor(0x2000 + 32 * step, 16, 1024, "128B") == base + 2 * step


@pytest.mark.parametrize("args, match", [
    ((8, 16, 1024, "128B"), "start address 8 is not 16-byte aligned"),
    ((1 << 18, 16, 1024, "128B"), "start address .* outside the 2\\^18-byte"),
    ((-16, 16, 1024, "128B"), "start address .* outside"),
    ((0, 24, 1024, "128B"), "leading byte offset 24 is not 16-byte aligned"),
    ((0, 1 << 18, 1024, "128B"), "leading byte offset .* outside"),
    ((0, 16, 1000, "128B"), "stride byte offset 1000 is not 16-byte aligned"),
    ((0, 16, 1 << 18, "128B"), "stride byte offset .* outside"),
    ((0, 16, 1024, "128B", 8), "base offset 8 does not fit its 3 bits"),
    ((0, 16, 1024, "128B", -1), "base offset -1 does not fit"),
    ((0, 256, 128, "none", 1), "base offset is valid only with a swizzled layout"),
    ((0, 16, 1024, "16x"), "unknown swizzle"),
])
def test_descriptor_rules(args, match):
    with pytest.raises(ValueError, match=match):
        wgmma_descriptor(*args)


def test_descriptor_fields_must_be_ints():
    with pytest.raises(TypeError, match="start address must be an int"):
        wgmma_descriptor(16.0, 16, 1024, "128B")
    with pytest.raises(TypeError, match="base offset must be an int"):
        wgmma_descriptor(16, 16, 1024, "128B", base_offset=True)


def test_decode_refuses_what_is_not_an_sm90_descriptor():
    with pytest.raises(ValueError, match="not a 64-bit value"):
        decode_wgmma_descriptor(1 << 64)
    with pytest.raises(ValueError, match="not a 64-bit value"):
        decode_wgmma_descriptor(-1)
    # bit 46 is the fixed 0b001 of sm_100's tcgen05 descriptor
    with pytest.raises(ValueError, match="tcgen05"):
        decode_wgmma_descriptor(wgmma_descriptor(0, 16, 1024, "128B") | 1 << 46)
    for reserved in (14, 15, 30, 31, 47, 48, 52, 61):
        with pytest.raises(ValueError, match="leaves zero"):
            decode_wgmma_descriptor(1 << reserved)


def test_base_offset_follows_the_ptx_formula():
    assert descriptor_base_offset(0x4000, "128B") == 0            # on a 1024-byte boundary
    assert descriptor_base_offset(0x4000 + 3 * 128, "128B") == 3  # (addr >> 7) & 7
    assert descriptor_base_offset(0x4200, "64B") == 0             # 512-byte boundary
    assert descriptor_base_offset(0x4100, "32B") == 0             # 256-byte boundary
    assert descriptor_base_offset(0x4080, "32B") == 1
    assert descriptor_base_offset(0x4080, "none") == 0
    for addr in range(0, 1 << 14, 128):
        expected = 0 if addr % 1024 == 0 else (addr >> 7) & 7
        assert descriptor_base_offset(addr, Swizzle.B128) == expected


# ---------------------------------------------------------------------------- K-major offsets


@pytest.mark.parametrize("rows, cols_bytes, swizzle, expected", [
    (64, 128, "128B", (16, 1024)),   # bf16 64 x 64: fast.cu, CUTLASS, DeepGEMM's SBO 1024
    (128, 256, "128B", (16, 1024)),  # two 128-byte panels: SBO stays one repeat
    (64, 64, "64B", (16, 512)),      # the chapter's first exercise
    (16, 32, "32B", (16, 256)),      # PTX: K-major, 32B swizzling, tf32: SBO 64 * 4
    (16, 64, "none", (256, 128)),    # PTX: K-major, no swizzling, tf32: LBO 64 * 4, SBO 32 * 4
    (64, 16, "none", (1024, 128)),
])
def test_kmajor_offsets(rows, cols_bytes, swizzle, expected):
    assert kmajor_offsets(rows, cols_bytes, swizzle) == expected
    lbo, sbo = expected
    wgmma_descriptor(0, lbo, sbo, swizzle)  # they encode


@pytest.mark.parametrize("rows, cols_bytes, swizzle, match", [
    (60, 128, "128B", "core matrices of 8 rows"),
    (0, 128, "128B", "core matrices of 8 rows"),
    (64, 96, "64B", "not a multiple of the 64B row of 64 bytes"),
    (64, 24, "none", "not a multiple of the none row of 16 bytes"),
])
def test_kmajor_offsets_rules(rows, cols_bytes, swizzle, match):
    with pytest.raises(ValueError, match=match):
        kmajor_offsets(rows, cols_bytes, swizzle)


# ---------------------------------------------------------------------------- tensor maps


def bf16_matrix(rows=8192, cols=8192, box=(64, 128), swizzle="128B", **kw) -> TensorMapSpec:
    """A row-major rows x cols bf16 matrix: innermost dimension (columns) first."""
    return TensorMapSpec(2, (cols, rows), (cols * 2,), box, swizzle=swizzle, **kw)


def test_a_bf16_matrix_with_a_128b_swizzled_box_is_valid():
    spec = bf16_matrix().validate()
    assert spec.element_strides == (1, 1) and spec.rank == 2
    assert spec.swizzle is Swizzle.B128 and spec.interleave is Interleave.NONE
    assert spec.smem_bytes() == 64 * 128 * 2 == 16384
    assert spec.expect_tx_bytes() == spec.smem_bytes()


def test_valid_maps_of_every_rank_and_swizzle():
    TensorMapSpec(4, (1000,), (), (64,)).validate()                           # rank 1
    TensorMapSpec(1, (128, 64, 32), (128, 128 * 64), (128, 8, 2), swizzle="128B").validate()
    TensorMapSpec(2, (64, 4, 4, 4, 4), (128, 512, 2048, 8192), (64, 1, 1, 1, 2)).validate()
    for sw in Swizzle:
        inner = sw.span_bytes // 2 if sw is not Swizzle.NONE else 128
        bf16_matrix(box=(inner, 64), swizzle=sw).validate()
    # a box narrower than the swizzle span is allowed
    bf16_matrix(box=(32, 64), swizzle="128B").validate()
    # a padded row (a slice of a wider matrix) is allowed
    TensorMapSpec(2, (1000, 64), (2048,), (64, 64), swizzle="128B").validate()


def rule(spec: TensorMapSpec, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        spec.validate()


def test_box_inner_dimension_wider_than_the_swizzle_is_refused():
    rule(bf16_matrix(box=(128, 64)), "inner dimension is 256 bytes, more than the 128-byte span")
    rule(bf16_matrix(box=(64, 64), swizzle="64B"), "128 bytes, more than the 64-byte span")
    rule(bf16_matrix(box=(32, 64), swizzle="32B"), "64 bytes, more than the 32-byte span")
    bf16_matrix(box=(128, 64), swizzle="none").validate()  # no swizzle: no span


def test_global_stride_not_a_multiple_of_16_is_refused():
    rule(bf16_matrix(cols=8190), r"globalStrides\[0\] = 16380 bytes is not a multiple of 16")


def test_global_stride_of_2_to_the_40_is_refused():
    rule(TensorMapSpec(1, (64, 2, 2), (1 << 20, 1 << 40), (64, 1, 1)), "less than 2\\^40")
    TensorMapSpec(1, (64, 2, 2), (1 << 20, (1 << 40) - 16), (64, 1, 1)).validate()


def test_strides_must_cover_the_dimensions_below():
    rule(TensorMapSpec(2, (64, 64), (64,), (64, 64)), "less than the 128 bytes of the dimensions")
    rule(TensorMapSpec(2, (8, 4, 4), (16, 32), (8, 4, 4)),
         r"globalStrides\[1\] = 32 bytes is less than the 64 bytes")


@pytest.mark.parametrize("shape, strides, box, match", [
    ((), (), (), "tensorRank 0: must be 1 to 5"),
    ((16,) * 6, (32, 64, 128, 256, 512), (16,) * 6, "tensorRank 6"),
    ((64, 64), (), (64, 64), "1 globalStrides|0 globalStrides"),
    ((64, 64), (128,), (64,), "boxDim has 1 entries"),
])
def test_rank_and_array_lengths(shape, strides, box, match):
    rule(TensorMapSpec(2, shape, strides, box), match)


def test_element_strides_length():
    rule(TensorMapSpec(2, (64, 64), (128,), (64, 64), element_strides=(1,)),
         "elementStrides 1: need 2")


def test_global_dims_must_be_in_1_to_2_to_the_32():
    rule(TensorMapSpec(2, (64, 0), (128,), (64, 1)), r"globalDim\[1\] = 0")
    rule(TensorMapSpec(1, (64, (1 << 32) + 1), (64,), (64, 1)), r"globalDim\[1\] = 4294967297")
    TensorMapSpec(1, (64, 1 << 32), (64,), (64, 1)).validate()


def test_box_dims_must_be_in_1_to_256():
    rule(bf16_matrix(box=(64, 257)), r"boxDim\[1\] = 257: must be in 1..256")
    rule(bf16_matrix(box=(64, 0)), r"boxDim\[1\] = 0")
    bf16_matrix(box=(64, 256)).validate()


def test_box_inner_bytes_must_be_a_multiple_of_16():
    rule(TensorMapSpec(4, (64, 64), (256,), (2, 64)), "boxDim\\[0\\] \\* elementSize = 8 bytes")
    rule(bf16_matrix(box=(12, 64), swizzle="none"), "= 24 bytes is not a multiple of 16")


def test_element_strides_must_be_in_1_to_8():
    rule(bf16_matrix(element_strides=(1, 0)), r"elementStrides\[1\] = 0: must be in 1..8")
    rule(bf16_matrix(element_strides=(1, 9)), r"elementStrides\[1\] = 9")
    bf16_matrix(element_strides=(1, 8)).validate()


def test_element_strides_shrink_the_box_but_not_its_innermost_dimension():
    spec = bf16_matrix(box=(64, 128), element_strides=(4, 3)).validate()
    assert spec.box_elements() == (64, 43)  # ceil(128 / 3); dimension 0's stride is ignored
    assert spec.smem_bytes() == spec.expect_tx_bytes() == 64 * 43 * 2


def test_global_address_alignment():
    rule(bf16_matrix(global_address=0x1008), "globalAddress 0x1008 is not 16-byte aligned")
    bf16_matrix(global_address=0x1010).validate()


def test_element_size():
    rule(TensorMapSpec(3, (64, 64), (192,), (16, 64)), "element size 3 bytes")


def test_interleaved_layouts():
    nc8hwc8 = dict(dtype_bytes=2, global_shape=(8, 32, 32, 4), global_strides=(16, 512, 16384),
                   box_shape=(8, 8, 8, 1))
    TensorMapSpec(**nc8hwc8, interleave="16B").validate()
    rule(TensorMapSpec(2, (8, 32), (16,), (8, 8), interleave="16B"),
         "interleaved layout needs a rank of at least 3")
    c16 = dict(dtype_bytes=2, global_shape=(16, 32, 32, 4), global_strides=(32, 1024, 32768),
               box_shape=(16, 8, 8, 1), interleave="32B")
    TensorMapSpec(**c16, swizzle="32B").validate()
    rule(TensorMapSpec(**c16, swizzle="64B"), "interleave 32B requires swizzle 32B, not 64B")
    rule(TensorMapSpec(**c16, swizzle="32B", global_address=0x10), "not 32-byte aligned")
    rule(TensorMapSpec(2, (16, 33, 32, 4), (48, 1584, 50688), (16, 8, 8, 1), interleave="32B",
                       swizzle="32B"), r"globalStrides\[0\] = 48 bytes is not a multiple of 32")
    # interleaved: the box's inner bytes need not be a multiple of 16, its stride counts
    spec = TensorMapSpec(**nc8hwc8, interleave="16B", element_strides=(2, 1, 1, 1)).validate()
    assert spec.box_elements() == (4, 8, 8, 1)


def test_every_broken_rule_is_named_at_once():
    spec = TensorMapSpec(2, (8190, 8192), (16380,), (128, 300), swizzle="128B",
                         element_strides=(1, 12), global_address=8)
    with pytest.raises(ValueError) as info:
        spec.validate()
    msg = str(info.value)
    for piece in ("globalAddress", "not a multiple of 16", r"boxDim[1] = 300",
                  r"elementStrides[1] = 12", "more than the 128-byte span"):
        assert piece in msg
    assert msg.count(";") == 4


def test_spec_fields_are_normalised_and_checked():
    spec = TensorMapSpec(2, [64, 64], [128], [64, 64], swizzle="64b")
    assert spec.global_shape == (64, 64) and spec.swizzle is Swizzle.B64
    with pytest.raises(TypeError, match="global_shape must be an int"):
        TensorMapSpec(2, (64.0, 64), (128,), (64, 64))
    with pytest.raises(ValueError, match="unknown swizzle"):
        TensorMapSpec(2, (64, 64), (128,), (64, 64), swizzle="48B")


# ---------------------------------------------------------------------------- GEMM checks


def test_the_chapters_bf16_gemm_passes():
    ops = check_gemm_operands(8192, 8192, 8192, 2, 128, 256, 64, "128B")
    assert ops.a.global_shape == (8192, 8192) and ops.a.box_shape == (64, 128)
    assert ops.b.box_shape == (64, 256) and ops.a.global_strides == (16384,)
    assert (ops.leading_byte_offset, ops.stride_byte_offset) == (16, 1024)
    assert ops.stage_bytes == (128 + 256) * 64 * 2 == 49152
    assert ops.expect_tx_bytes == ops.stage_bytes
    assert ops.max_stages == SMEM_LIMIT_SM90 // 49152 == 4


def test_the_chapters_fp8_exercise():
    ops = check_gemm_operands(4096, 4096, 4096, 1, 128, 256, 128, "128B", stages=4)
    assert (ops.a.smem_bytes(), ops.b.smem_bytes()) == (16384, 32768)
    assert ops.expect_tx_bytes == 49152


def test_smaller_swizzles_take_narrower_k_blocks():
    ops = check_gemm_operands(1024, 1024, 1024, 2, 64, 64, 32, "64B")
    assert (ops.leading_byte_offset, ops.stride_byte_offset) == (16, 512)
    ops = check_gemm_operands(1024, 1024, 1024, 4, 64, 64, 8, "32B")  # tf32
    assert ops.stride_byte_offset == 256


@pytest.mark.parametrize("args, kw, match", [
    ((8192, 8192, 8190, 2, 128, 256, 64, "128B"), {}, "16380 bytes.*multiple of 16 bytes"),
    ((8192, 8192, 8191, 1, 128, 256, 128, "128B"), {}, "K a multiple of 16"),
    ((512, 512, 512, 2, 128, 256, 128, "128B"), {}, "256 bytes: must equal the 128-byte span"),
    ((512, 512, 512, 2, 128, 256, 32, "128B"), {}, "block_k = 64"),
    ((512, 512, 512, 2, 96, 128, 64, "128B"), {}, "block_m = 96"),
    ((512, 512, 512, 2, 320, 128, 64, "128B"), {}, "block_m = 320"),
    ((512, 512, 512, 2, 128, 264, 64, "128B"), {}, "block_n = 264.*up to 256"),
    ((512, 512, 512, 2, 128, 100, 64, "128B"), {}, "block_n = 100"),
    ((512, 512, 512, 2, 128, 128, 8, "none"), {}, "swizzle 'none'"),
    ((512, 512, 512, 3, 128, 128, 64, "128B"), {}, "dtype_bytes = 3"),
    ((512, 512, 512, 2, 128, 256, 64, "128B"), {"stages": 5}, "shared memory"),
    ((512, 512, 512, 2, 128, 256, 64, "128B"), {"stages": 4, "reserved_bytes": 40000},
     "exceed the 192448 bytes"),
    ((512, 512, 512, 2, 128, 256, 64, "128B"), {"a_address": 0x100008}, "globalAddress"),
    ((512, (1 << 32) + 8, 512, 2, 128, 256, 64, "128B"), {}, r"globalDim\[1\]"),
    ((0, 512, 512, 2, 128, 256, 64, "128B"), {}, "m = 0"),
    ((512, 512, 512, 2, 128, 256, 64, "128B"), {"stages": 0}, "stages = 0"),
    ((512, 512, 512, 2, 128, 256, 64, "96B"), {}, "unknown swizzle"),
])
def test_gemm_rules(args, kw, match):
    with pytest.raises(ValueError, match=match):
        check_gemm_operands(*args, **kw)


def test_gemm_names_every_broken_rule_at_once():
    with pytest.raises(ValueError) as info:
        check_gemm_operands(512, 512, 510, 2, 96, 264, 128, "128B")
    assert str(info.value).count(";") == 3


def test_the_largest_pipeline_that_fits():
    ops = check_gemm_operands(8192, 8192, 8192, 2, 128, 128, 64, "128B", stages=6)
    assert ops.stage_bytes == 32768 and ops.max_stages == 7
    check_gemm_operands(8192, 8192, 8192, 2, 128, 128, 64, "128B", stages=7)
    with pytest.raises(ValueError, match="8 stage"):
        check_gemm_operands(8192, 8192, 8192, 2, 128, 128, 64, "128B", stages=8)


# ---------------------------------------------------------------------------- the listing


def test_regions_for_the_chapter():
    text = SOURCE.read_text()
    for name in ("swizzle_modes", "wgmma_desc", "tma_rules", "gemm_checks"):
        start = re.findall(rf"^\s*# --8<-- \[start:{name}\]$", text, re.MULTILINE)
        end = re.findall(rf"^\s*# --8<-- \[end:{name}\]$", text, re.MULTILINE)
        assert len(start) == len(end) == 1, name
        assert text.index(start[0]) < text.index(end[0])


def test_standard_library_only():
    tree = ast.parse(SOURCE.read_text())
    modules = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
               for a in n.names}
    modules |= {n.module.split(".")[0] for n in ast.walk(tree)
                if isinstance(n, ast.ImportFrom) and n.module}
    assert modules <= {"__future__", "math", "dataclasses", "enum"}
