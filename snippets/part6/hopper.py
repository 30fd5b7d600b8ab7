"""Hopper's two operand descriptions, modelled bit by bit on a CPU: the 64-bit shared-memory matrix
descriptor that ``wgmma.mma_async`` reads for each operand, and the rules that
``cuTensorMapEncodeTiled`` enforces on a TMA tensor map.

Neither instruction takes a pointer. ``wgmma`` reads a descriptor: where a tile starts in shared
memory, how far apart its core matrices (8 rows of 16 bytes) are, and which swizzle it was written
with. TMA reads a 128-byte tensor map that the host builds from the global tensor's shape and
strides, the box (tile) to copy and the same swizzle. A wrong field makes ``wgmma`` read garbage and
a wrong tensor map makes the driver answer ``CUDA_ERROR_INVALID_VALUE`` without saying why, so the
book's Hopper GEMM checks its configuration here, on the host, before anything is launched.

Sources, checked field by field:

- PTX ISA, "Asynchronous Warpgroup Level Matrix Shared Memory Layout": "Matrix Descriptor Format"
  (the bit fields, ``matrix-descriptor-encode``, the base offset), "Leading Dimension Byte Offset",
  "Stride Dimension Byte Offset" and "Canonical Layouts" (with their worked examples).
- CUDA Driver API, "Tensor Map Object Management": the requirements of ``cuTensorMapEncodeTiled``
  and the enums ``CUtensorMapSwizzle`` and ``CUtensorMapInterleave``.
- CUTLASS: CuTe's ``GmmaDescriptor`` union (``include/cute/arch/mma_sm90_desc.hpp``),
  ``make_gmma_desc`` (``include/cute/atom/mma_traits_sm90_gmma.hpp``) and the TMA swizzle enum
  (``include/cute/arch/copy_sm90_desc.hpp``).

Standard library only: no GPU is needed to build or check a descriptor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

# The most shared memory one block may use on compute capability 9.0 (H100, H200) after opting in:
# 227 KB (CUDA C++ Programming Guide, "Technical Specifications per Compute Capability").
SMEM_LIMIT_SM90 = 227 * 1024


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_int(name: str, value: object) -> None:
    if not _is_int(value):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")


# --8<-- [start:swizzle_modes]
class Swizzle(Enum):
    """The shared-memory swizzles that TMA writes and ``wgmma`` reads back.

    A swizzled tile is made of rows of ``span_bytes`` (one row per M or N index of a K-major
    operand) whose 16-byte chunks are permuted by an XOR with bits of the row index (with the 128B
    swizzle, chunk c of row r moves to c XOR r % 8); the pattern repeats every 8 rows,
    ``8 * span_bytes`` bytes. ``NONE`` permutes nothing; its "row" is the 16 bytes of one
    core-matrix row, and PTX calls this layout *interleave*.

    The same mode has two different numbers: the layout type in bits 62-63 of the ``wgmma``
    descriptor (PTX ISA, Matrix Descriptor Format: 1 = 128B, 2 = 64B, 3 = 32B) and the
    ``CUtensorMapSwizzle`` of the tensor map (1 = 32B, 2 = 64B, 3 = 128B). Mixing them up swaps
    32B and 128B silently.
    """

    #      label   span_bytes  layout_type (wgmma)  tensor_map_swizzle (CUtensorMapSwizzle)
    NONE = ("none", 16, 0, 0)
    B32 = ("32B", 32, 3, 1)
    B64 = ("64B", 64, 2, 2)
    B128 = ("128B", 128, 1, 3)

    def __init__(self, label: str, span_bytes: int, layout_type: int, tensor_map_swizzle: int):
        self.label = label
        self.span_bytes = span_bytes
        self.layout_type = layout_type
        self.tensor_map_swizzle = tensor_map_swizzle

    @property
    def repeat_bytes(self) -> int:
        """Bytes after which the pattern repeats: 8 rows of the span (PTX: 1024 bytes for 128B,
        512 for 64B, 256 for 32B). A swizzled tile starting on this boundary needs base offset 0."""
        return 8 * self.span_bytes

    @property
    def cute_swizzle(self) -> tuple[int, int, int]:
        """CuTe's name for the pattern, ``Swizzle<B, 4, 3>``: the B address bits from bit 7 up are
        XORed into the B bits from bit 4 up, the index of a 16-byte chunk."""
        return (int(math.log2(self.span_bytes // 16)), 4, 3)

    @classmethod
    def _missing_(cls, value: object) -> Swizzle | None:
        # Swizzle("128B") finds nothing among the tuples above: accept the labels and the usual
        # spellings ("128b", "128", 128, "swizzle_128b", "interleave").
        if not isinstance(value, str) and not _is_int(value):
            return None
        key = str(value).strip().lower().removeprefix("swizzle_").removesuffix("b")
        names = {"none": cls.NONE, "interleave": cls.NONE, "0": cls.NONE, "16": cls.NONE,
                 "32": cls.B32, "64": cls.B64, "128": cls.B128}
        return names.get(key)
# --8<-- [end:swizzle_modes]


class Interleave(Enum):
    """``CUtensorMapInterleave``: interleaved global layouts such as NC/8HWC8, where the innermost
    dimension is a 16- or 32-byte chunk of channels. A GEMM operand is never interleaved."""

    NONE = ("none", 0)
    B16 = ("16B", 1)
    B32 = ("32B", 2)

    def __init__(self, label: str, tensor_map_interleave: int):
        self.label = label
        self.tensor_map_interleave = tensor_map_interleave

    @classmethod
    def _missing_(cls, value: object) -> Interleave | None:
        if not isinstance(value, str):
            return None
        key = value.strip().lower().removeprefix("interleave_").removesuffix("b")
        return {"none": cls.NONE, "16": cls.B16, "32": cls.B32}.get(key)


def as_swizzle(value: Swizzle | str | int) -> Swizzle:
    """The Swizzle that ``value`` names ("none", "32B", "64B", "128B", a span, or a Swizzle)."""
    try:
        return Swizzle(value)
    except ValueError:
        raise ValueError(f"unknown swizzle {value!r}: use one of 'none', '32B', '64B', "
                         "'128B'") from None


def as_interleave(value: Interleave | str) -> Interleave:
    try:
        return Interleave(value)
    except ValueError:
        raise ValueError(f"unknown interleave {value!r}: use one of 'none', '16B', "
                         "'32B'") from None


# --8<-- [start:wgmma_desc]
# The shared memory of one CTA lies within an 18-bit window of byte addresses.
SMEM_WINDOW = 1 << 18


def matrix_descriptor_encode(x: int) -> int:
    """PTX's matrix-descriptor-encode: 18 bits of byte address in 16-byte units, 14 bits."""
    return (x & 0x3FFFF) >> 4


def wgmma_descriptor(smem_addr: int, leading_byte_offset: int, stride_byte_offset: int,
                     swizzle: Swizzle | str, base_offset: int = 0) -> int:
    """The 64-bit shared-memory matrix descriptor of one ``wgmma`` operand (PTX ISA,
    "Asynchronous Warpgroup Level Matrix Shared Memory Layout", Matrix Descriptor Format):

    ====== ===== =====================================================================
    bits   width field
    ====== ===== =====================================================================
    0-13   14    start address in shared memory, in 16-byte units
    16-29  14    leading dimension byte offset (LBO), in 16-byte units
    32-45  14    stride dimension byte offset (SBO), in 16-byte units
    49-51  3     matrix base offset: where the swizzle pattern starts (0 when aligned)
    62-63  2     swizzle mode: 0 none, 1 128B, 2 64B, 3 32B
    ====== ===== =====================================================================

    The bits in between are zero. CuTe's ``GmmaDescriptor`` union has the same fields at the same
    places. For a K-major operand, LBO is the distance between core matrices along K and SBO the
    distance between groups of 8 rows (see :func:`kmajor_offsets`).
    """
    sw = as_swizzle(swizzle)
    for name, value in (("start address", smem_addr), ("leading byte offset", leading_byte_offset),
                        ("stride byte offset", stride_byte_offset)):
        _check_int(name, value)
        if value % 16:
            raise ValueError(f"{name} {value} is not 16-byte aligned: the descriptor keeps it in "
                             "16-byte units")
        if not 0 <= value < SMEM_WINDOW:
            raise ValueError(f"{name} {value} is outside the 2^18-byte shared-memory window that "
                             "14 bits of 16-byte units can encode")
    _check_int("base offset", base_offset)
    if not 0 <= base_offset <= 7:
        raise ValueError(f"base offset {base_offset} does not fit its 3 bits (0..7)")
    if base_offset and sw is Swizzle.NONE:
        raise ValueError("a base offset is valid only with a swizzled layout, not with 'none'")
    return (matrix_descriptor_encode(smem_addr)                       # bits 0-13
            | matrix_descriptor_encode(leading_byte_offset) << 16     # bits 16-29
            | matrix_descriptor_encode(stride_byte_offset) << 32      # bits 32-45
            | base_offset << 49                                       # bits 49-51
            | sw.layout_type << 62)                                   # bits 62-63
# --8<-- [end:wgmma_desc]


_FIELD14 = (1 << 14) - 1
_DEFINED_BITS = _FIELD14 | _FIELD14 << 16 | _FIELD14 << 32 | 0b111 << 49 | 0b11 << 62
_BY_LAYOUT_TYPE = {s.layout_type: s for s in Swizzle}


def decode_wgmma_descriptor(desc: int) -> dict:
    """The fields of a ``wgmma`` descriptor, in bytes: the inverse of :func:`wgmma_descriptor`."""
    _check_int("descriptor", desc)
    if not 0 <= desc < 1 << 64:
        raise ValueError(f"descriptor {desc:#x} is not a 64-bit value")
    if desc & ~_DEFINED_BITS:
        raise ValueError(f"descriptor {desc:#018x} sets bits that sm_90's matrix descriptor leaves "
                         "zero (14-15, 30-31, 46-48, 52-61); a tcgen05 descriptor of sm_100, which "
                         "sets bit 46, is not a wgmma descriptor")
    return {
        "start_address": (desc & _FIELD14) << 4,
        "leading_byte_offset": (desc >> 16 & _FIELD14) << 4,
        "stride_byte_offset": (desc >> 32 & _FIELD14) << 4,
        "base_offset": desc >> 49 & 0b111,
        "swizzle": _BY_LAYOUT_TYPE[desc >> 62],
    }


def descriptor_base_offset(pattern_start: int, swizzle: Swizzle | str) -> int:
    """The base offset field for a swizzled tile whose pattern starts at shared-memory address
    ``pattern_start``: 0 when it starts on the pattern's repeat boundary (1024 bytes for 128B),
    else ``(pattern_start >> 7) & 7`` (PTX ISA, Matrix Descriptor Format). Kernels align their
    tiles to the boundary so that this stays 0, as CuTe's ``make_gmma_desc`` assumes."""
    sw = as_swizzle(swizzle)
    _check_int("pattern start", pattern_start)
    if sw is Swizzle.NONE or pattern_start % sw.repeat_bytes == 0:
        return 0
    return (pattern_start >> 7) & 0x7


def kmajor_offsets(rows: int, cols_bytes: int, swizzle: Swizzle | str) -> tuple[int, int]:
    """(LBO, SBO) in bytes for a K-major operand tile of ``rows`` rows (M or N) of ``cols_bytes``
    bytes of K each, stored densely in the canonical layout of its swizzle mode.

    The unit is the core matrix: 8 rows of 16 bytes. What LBO and SBO mean depends on the layout
    (PTX ISA, "Leading Dimension Byte Offset", "Stride Dimension Byte Offset", "Canonical Layouts";
    CuTe's ``make_gmma_desc<Major::K>``):

    - Swizzled (32B, 64B, 128B): every row is one swizzle span wide, so 8 consecutive rows form
      one repeat of the pattern, ``8 * span`` bytes, and SBO, the step from one group of 8 rows to
      the next, is that: 1024 bytes for 128B. Along K the instruction walks inside the swizzled
      row itself, so LBO is not used; PTX says it is "assumed to be 1", and CuTe encodes 1 (16
      bytes), which is what this returns. A tile wider than the span is stored as panels of
      ``rows x span`` bytes (one TMA box each); the kernel moves to the next panel by moving the
      start address.
    - None (interleave): every core matrix is 128 contiguous bytes. Stacked down a column of
      16-byte panels, the next 8 rows are SBO = 128 bytes further and the next 16 bytes of K are
      a whole panel, LBO = ``rows * 16`` bytes, further (the PTX example: 16 rows of 64 bytes give
      LBO 256, SBO 128). A plain TMA box wider than 16 bytes is not in this layout.
    """
    sw = as_swizzle(swizzle)
    _check_int("rows", rows)
    _check_int("cols_bytes", cols_bytes)
    if rows <= 0 or rows % 8:
        raise ValueError(f"rows = {rows}: a K-major tile is made of core matrices of 8 rows")
    if cols_bytes <= 0 or cols_bytes % sw.span_bytes:
        raise ValueError(f"cols_bytes = {cols_bytes} is not a multiple of the {sw.label} row of "
                         f"{sw.span_bytes} bytes")
    if sw is Swizzle.NONE:
        return rows * 16, 128
    return 16, 8 * sw.span_bytes


def _dims(name: str, values) -> tuple[int, ...]:
    out = tuple(values)
    for v in out:
        _check_int(f"an entry of {name}", v)
    return out


@dataclass(frozen=True)
class TensorMapSpec:
    """The arguments of ``cuTensorMapEncodeTiled`` that decide whether it succeeds, in the driver's
    order: dimensions innermost (contiguous) first. A row-major R x C matrix has
    ``global_shape = (C, R)`` and ``global_strides = (C * dtype_bytes,)``: a stride for every
    dimension but the innermost, in bytes."""

    dtype_bytes: int
    global_shape: tuple[int, ...]
    global_strides: tuple[int, ...]
    box_shape: tuple[int, ...]
    element_strides: tuple[int, ...] | None = None  # None: all ones
    swizzle: Swizzle = Swizzle.NONE
    interleave: Interleave = Interleave.NONE
    global_address: int = 0

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise the fields once, here
        _check_int("dtype_bytes", self.dtype_bytes)
        _check_int("global_address", self.global_address)
        set_(self, "global_shape", _dims("global_shape", self.global_shape))
        set_(self, "global_strides", _dims("global_strides", self.global_strides))
        set_(self, "box_shape", _dims("box_shape", self.box_shape))
        es = (1,) * len(self.global_shape) if self.element_strides is None else self.element_strides
        set_(self, "element_strides", _dims("element_strides", es))
        set_(self, "swizzle", as_swizzle(self.swizzle))
        set_(self, "interleave", as_interleave(self.interleave))

    @property
    def rank(self) -> int:
        return len(self.global_shape)

    # --8<-- [start:tma_rules]
    def validate(self) -> TensorMapSpec:
        """Raise ValueError naming every requirement of ``cuTensorMapEncodeTiled`` (CUDA Driver
        API) that this tensor map breaks; return it unchanged when there is none."""
        rank, elem = self.rank, self.dtype_bytes
        dims, strides, box, es = (self.global_shape, self.global_strides, self.box_shape,
                                  self.element_strides)
        sw, il = self.swizzle, self.interleave
        bad: list[str] = []
        if elem not in (1, 2, 4, 8):
            bad.append(f"element size {elem} bytes: tensor map types are 1, 2, 4 or 8 bytes")
        if not 1 <= rank <= 5:
            bad.append(f"tensorRank {rank}: must be 1 to 5")
        if il is not Interleave.NONE and rank < 3:
            bad.append(f"tensorRank {rank}: an interleaved layout needs a rank of at least 3")
        if len(strides) != rank - 1:
            bad.append(f"{len(strides)} globalStrides: one is needed per dimension but the "
                       f"innermost ({rank - 1})")
        if len(box) != rank or len(es) != rank:
            bad.append(f"boxDim has {len(box)} entries, elementStrides {len(es)}: need {rank}")
        if bad:  # the arrays do not line up: the per-entry rules below would mean nothing
            raise ValueError("cuTensorMapEncodeTiled would refuse this tensor map: "
                             + "; ".join(bad))

        align = 32 if il is Interleave.B32 else 16
        if self.global_address % align:
            bad.append(f"globalAddress {self.global_address:#x} is not {align}-byte aligned")
        for i, d in enumerate(dims):
            if not 1 <= d <= 1 << 32:
                bad.append(f"globalDim[{i}] = {d}: must be in 1..2^32")
        stride_align = 32 if il is Interleave.B32 else 16
        for i, s in enumerate(strides):
            if s % stride_align:
                bad.append(f"globalStrides[{i}] = {s} bytes is not a multiple of {stride_align}")
            if s >= 1 << 40:
                bad.append(f"globalStrides[{i}] = {s} bytes: must be less than 2^40")
        # Each stride covers the dimensions below it (the driver API's layout equation:
        # globalStrides[0] = globalDim[0] * elementSize + padding, and so on upwards).
        covered = dims[0] * elem
        for i, s in enumerate(strides):
            if s < covered:
                bad.append(f"globalStrides[{i}] = {s} bytes is less than the {covered} bytes of "
                           "the dimensions below it")
            covered = s * dims[i + 1]
        for i, b in enumerate(box):
            if not 1 <= b <= 256:
                bad.append(f"boxDim[{i}] = {b}: must be in 1..256")
        inner_bytes = box[0] * elem
        if il is Interleave.NONE and inner_bytes % 16:
            bad.append(f"boxDim[0] * elementSize = {inner_bytes} bytes is not a multiple of 16")
        for i, e in enumerate(es):
            if not 1 <= e <= 8:
                bad.append(f"elementStrides[{i}] = {e}: must be in 1..8")
        if il is Interleave.NONE and sw is not Swizzle.NONE and inner_bytes > sw.span_bytes:
            bad.append(f"the box's inner dimension is {inner_bytes} bytes, more than the "
                       f"{sw.span_bytes}-byte span of the {sw.label} swizzle")
        if il is Interleave.B32 and sw is not Swizzle.B32:
            bad.append(f"interleave 32B requires swizzle 32B, not {sw.label}")
        if bad:
            raise ValueError("cuTensorMapEncodeTiled would refuse this tensor map: "
                             + "; ".join(bad))
        return self
    # --8<-- [end:tma_rules]

    def box_elements(self) -> tuple[int, ...]:
        """Elements TMA writes along each dimension: ``ceil(boxDim[i] / elementStrides[i])``, except
        that without interleave the innermost element stride is ignored (TMA has no stride for
        dimension 0)."""
        out = [math.ceil(b / e) for b, e in zip(self.box_shape, self.element_strides)]
        if self.interleave is Interleave.NONE:
            out[0] = self.box_shape[0]
        return tuple(out)

    def smem_bytes(self) -> int:
        """Bytes one box occupies in shared memory."""
        return self.dtype_bytes * math.prod(self.box_elements())

    def expect_tx_bytes(self) -> int:
        """Transaction bytes an ``mbarrier`` must expect (``mbarrier.expect_tx``) for one box load.
        TMA completes a load by counting the bytes it writes to shared memory, and it writes the
        whole box, out-of-bounds elements (filled) included: so this is the box's size wherever
        the box lies. A count that is too high leaves the consumer waiting forever."""
        return self.smem_bytes()


@dataclass(frozen=True)
class GemmOperands:
    """What a Hopper GEMM's host code needs once its configuration has passed
    :func:`check_gemm_operands`: the two tensor maps (one box per operand tile) and the numbers
    the kernel is compiled with."""

    a: TensorMapSpec  # A, M x K row-major: boxes of block_m x block_k
    b: TensorMapSpec  # B stored N x K row-major (K-major): boxes of block_n x block_k
    leading_byte_offset: int  # of both operands' wgmma descriptors
    stride_byte_offset: int
    stage_bytes: int  # shared memory of one pipeline stage: an A tile and a B tile
    max_stages: int  # stages that fit in SMEM_LIMIT_SM90 beside the reserved bytes

    @property
    def expect_tx_bytes(self) -> int:
        """Transaction bytes one stage's mbarrier expects: both boxes."""
        return self.a.expect_tx_bytes() + self.b.expect_tx_bytes()


# --8<-- [start:gemm_checks]
def check_gemm_operands(m: int, n: int, k: int, dtype_bytes: int, block_m: int, block_n: int,
                        block_k: int, swizzle: Swizzle | str, *, stages: int = 1,
                        reserved_bytes: int = 0, a_address: int = 0,
                        b_address: int = 0) -> GemmOperands:
    """Check a Hopper GEMM's operands and tiles before launch; raise ValueError naming each rule
    broken. Both operands are K-major, A as M x K and B as N x K, row-major: the layout ``wgmma``
    reads for every input type (only its f16 and bf16 forms take the transpose flags, so fp8, int8
    and tf32 have no other). Each stage loads one TMA box per operand whose rows are exactly one
    swizzle span of K, the layout :func:`kmajor_offsets` describes."""
    for name, v in (("m", m), ("n", n), ("k", k), ("dtype_bytes", dtype_bytes),
                    ("block_m", block_m), ("block_n", block_n), ("block_k", block_k),
                    ("stages", stages)):
        _check_int(name, v)
        if v < 1:
            raise ValueError(f"{name} = {v}: must be at least 1")
    for name, v in (("reserved_bytes", reserved_bytes), ("a_address", a_address),
                    ("b_address", b_address)):
        _check_int(name, v)
    sw = as_swizzle(swizzle)
    bad: list[str] = []
    if dtype_bytes not in (1, 2, 4):
        bad.append(f"dtype_bytes = {dtype_bytes}: wgmma takes 1-byte (fp8, int8), 2-byte (fp16, "
                   "bf16) or 4-byte (tf32) inputs")
    row_bytes = k * dtype_bytes
    if row_bytes % 16:
        bad.append(f"rows of A and B are K * dtype_bytes = {row_bytes} bytes: TMA needs row "
                   f"strides that are a multiple of 16 bytes (K a multiple of "
                   f"{16 // math.gcd(16, dtype_bytes)})")
    if block_m % 64 or block_m > 256:
        bad.append(f"block_m = {block_m}: a multiple of 64 (one wgmma per warpgroup is 64 rows) "
                   "and at most 256 (a TMA box)")
    if block_n % 8 or block_n > 256:
        bad.append(f"block_n = {block_n}: a multiple of 8 up to 256 (wgmma's N, a TMA box)")
    if sw is Swizzle.NONE:
        bad.append("swizzle 'none': an unswizzled box wider than 16 bytes is not a layout wgmma "
                   "reads; use 32B, 64B or 128B")
    elif block_k * dtype_bytes != sw.span_bytes:
        bad.append(f"block_k * dtype_bytes = {block_k * dtype_bytes} bytes: must equal the "
                   f"{sw.span_bytes}-byte span of the {sw.label} swizzle (one swizzled row per "
                   f"tile row: block_k = {sw.span_bytes // dtype_bytes or 1})")
    stage_bytes = (block_m + block_n) * block_k * dtype_bytes
    budget = SMEM_LIMIT_SM90 - reserved_bytes
    if stages * stage_bytes > budget:
        bad.append(f"{stages} stage(s) of {stage_bytes} bytes exceed the {budget} bytes of "
                   f"shared memory left of the {SMEM_LIMIT_SM90} one block may use on sm_90")
    if bad:
        raise ValueError("this GEMM configuration cannot run: " + "; ".join(bad))

    def operand(rows: int, block_rows: int, address: int) -> TensorMapSpec:
        return TensorMapSpec(dtype_bytes, (k, rows), (row_bytes,), (block_k, block_rows),
                             swizzle=sw, global_address=address).validate()

    a, b = operand(m, block_m, a_address), operand(n, block_n, b_address)
    lbo, sbo = kmajor_offsets(block_m, block_k * dtype_bytes, sw)
    return GemmOperands(a, b, lbo, sbo, stage_bytes, budget // stage_bytes)
# --8<-- [end:gemm_checks]
