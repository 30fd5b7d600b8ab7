"""CuTe's layout algebra in plain Python: the book's own implementation of the operations Part 6
uses to tile matrices among blocks, warps and threads.

A layout is a pair of congruent nested tuples, a shape and a stride, read as a function from
coordinates to offsets. Every operation below follows CuTe's C++ (``include/cute/layout.hpp``
and ``include/cute/swizzle.hpp`` in CUTLASS) step by step, with every integer treated as a
compile-time constant, the way CuTe treats ``Int<N>``: so the results are the layouts CuTe prints
for static layouts. ``tests/test_part6_layout.py`` checks them against CuTe's C++ itself
(``csrc/part6/layout_oracle.cu``) and against an independent Python implementation.

Standard library only: the chapters run this on any machine, no GPU needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

# --8<-- [start:layout]
# An IntTuple is an int or a non-empty tuple of IntTuples: (4, (2, 3)) is one.


def is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def is_int_tuple(x) -> bool:
    if isinstance(x, tuple):
        return len(x) > 0 and all(is_int_tuple(e) for e in x)
    return is_int(x)


def congruent(a, b) -> bool:
    """Whether two IntTuples have the same nesting: both ints, or tuples of congruent entries."""
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(congruent(x, y) for x, y in zip(a, b))
    return is_int(a) and is_int(b)


def product(t) -> int:
    """The product of every int in ``t``: how many coordinates a shape has."""
    if is_int(t):
        return t
    n = 1
    for e in t:
        n *= product(e)
    return n


def leaves(t) -> list[int]:
    """The ints of ``t`` in order, the nesting forgotten."""
    return [t] if is_int(t) else [x for e in t for x in leaves(e)]


def fmt(t) -> str:
    """CuTe's notation for an IntTuple: ``(4,(2,3))``."""
    return str(t) if is_int(t) else "(" + ",".join(fmt(e) for e in t) + ")"


def crd2idx(coord, shape, stride) -> int:
    """The offset of ``coord`` in the layout ``shape:stride``.

    A tuple coordinate gives each mode its own entry, and the offset is the sum of entry times
    stride. An int is a *1-D coordinate*: for a mode with sub-modes it is split among them
    colexicographically (the first sub-mode fastest), like the digits of a mixed-radix number.
    The last sub-mode takes whatever is left, so a coordinate past the end continues along the
    last mode, as in CuTe.
    """
    if is_int(shape):
        if not is_int(coord):
            raise ValueError(f"coordinate {coord!r} has modes, but its shape {shape} has none")
        return coord * stride
    if is_int(coord):
        offset = 0
        for i, (s, d) in enumerate(zip(shape, stride)):
            if i == len(shape) - 1:
                offset += crd2idx(coord, s, d)  # the last mode takes the rest
            else:
                offset += crd2idx(coord % product(s), s, d)
                coord //= product(s)
        return offset
    if not isinstance(coord, tuple) or len(coord) != len(shape):
        raise ValueError(f"coordinate {coord!r} does not match the shape {fmt(shape)}: give an "
                         f"int or one entry per mode")
    return sum(crd2idx(c, s, d) for c, s, d in zip(coord, shape, stride))


@dataclass(frozen=True, repr=False)
class Layout:
    """A function from coordinates to offsets. ``shape`` says which coordinates exist, ``stride``
    how far one step along each mode moves: ``(4,8):(1,4)`` is a column-major 4 x 8 matrix."""

    shape: int | tuple
    stride: int | tuple

    def __post_init__(self):
        for name, value in (("shape", self.shape), ("stride", self.stride)):
            if not is_int_tuple(value):
                raise TypeError(f"a layout's {name} is an int or a nested tuple of ints (no "
                                f"empty tuples), got {value!r}")
        if not congruent(self.shape, self.stride):
            raise ValueError(f"shape {fmt(self.shape)} and stride {fmt(self.stride)} are not "
                             f"congruent: they need the same nesting, one stride per shape entry")
        if any(s <= 0 for s in leaves(self.shape)):
            raise ValueError(f"every entry of a shape is positive, got {fmt(self.shape)}")

    @property
    def size(self) -> int:
        """How many coordinates the layout has."""
        return product(self.shape)

    @property
    def cosize(self) -> int:
        """One past the largest offset the layout produces: how much memory it spans."""
        steps = zip(leaves(self.shape), leaves(self.stride))
        return 1 + sum(max(0, (s - 1) * d) for s, d in steps)

    @property
    def rank(self) -> int:
        """How many top-level modes: an int shape is one mode, as in CuTe."""
        return 1 if is_int(self.shape) else len(self.shape)

    @property
    def depth(self) -> int:
        """How deeply the shape nests: 0 for an int, 1 for a flat tuple, ..."""
        def depth(t) -> int:
            return 0 if is_int(t) else 1 + max(depth(e) for e in t)
        return depth(self.shape)

    def __getitem__(self, i: int) -> Layout:
        """Mode ``i`` as a layout of its own (an int shape is its own mode 0)."""
        if is_int(self.shape):
            if i not in (0, -1):
                raise IndexError(f"{self} has one mode, asked for mode {i}")
            return self
        return Layout(self.shape[i], self.stride[i])

    def __call__(self, coord) -> int:
        return crd2idx(coord, self.shape, self.stride)

    def __repr__(self) -> str:
        return f"{fmt(self.shape)}:{fmt(self.stride)}"


def compact_col_major(shape, current: int = 1):
    """The strides that make ``shape`` compact with the first mode fastest (CuTe's LayoutLeft).
    A mode of size 1 gets stride 0, as CuTe gives it: its only coordinate is 0 anyway."""
    if is_int(shape):
        return 0 if shape == 1 else current
    strides = []
    for s in shape:
        strides.append(compact_col_major(s, current))
        current *= product(s)
    return tuple(strides)


def compact_row_major(shape, current: int = 1):
    """The strides that make ``shape`` compact with the last mode fastest (CuTe's LayoutRight)."""
    if is_int(shape):
        return 0 if shape == 1 else current
    strides = []
    for s in reversed(shape):
        strides.insert(0, compact_row_major(s, current))
        current *= product(s)
    return tuple(strides)


def make_layout(shape, stride=None) -> Layout:
    """``shape:stride``; without a stride, the compact column-major one."""
    if stride is None and is_int_tuple(shape):
        stride = compact_col_major(shape)
    return Layout(shape, stride)


def make_layout_row_major(shape) -> Layout:
    """``shape`` with the compact row-major stride."""
    return Layout(shape, compact_row_major(shape) if is_int_tuple(shape) else None)


def bundle(*modes: Layout) -> Layout:
    """The layout whose modes are ``modes``, in order (CuTe's ``make_layout(L0, L1, ...)``)."""
    return Layout(tuple(m.shape for m in modes), tuple(m.stride for m in modes))


def flatten(layout: Layout) -> Layout:
    """The same function of the 1-D coordinate, with every nested mode lifted to the top."""
    if is_int(layout.shape):
        return layout
    return Layout(tuple(leaves(layout.shape)), tuple(leaves(layout.stride)))
# --8<-- [end:layout]


# --8<-- [start:coalesce]
def coalesce(layout: Layout, profile=None) -> Layout:
    """The same function of the 1-D coordinate, with as few modes as possible.

    Walk the leaf modes in order. A mode of size 1 drops out: its only coordinate is 0. A mode
    whose stride is the previous mode's shape times its stride starts exactly where the
    previous one ends, so the two merge into one longer mode. With a ``profile`` (a tuple, such
    as ``(1, 1)``), each top-level mode is coalesced on its own and the layout keeps its modes:
    CuTe's by-mode coalesce.
    """
    if isinstance(profile, tuple):
        if len(profile) > layout.rank:
            raise ValueError(f"profile {profile} has more modes than {layout}")
        modes = [coalesce(layout[i], p) for i, p in enumerate(profile)]
        modes += [layout[i] for i in range(len(profile), layout.rank)]
        return bundle(*modes)
    shapes: list[int] = []
    strides: list[int] = []
    for s, d in zip(leaves(layout.shape), leaves(layout.stride)):
        if s == 1:
            continue
        if shapes and d == shapes[-1] * strides[-1]:
            shapes[-1] *= s  # continues the previous mode
        else:
            shapes.append(s)
            strides.append(d)
    return layout_of_modes(shapes, strides)


def layout_of_modes(shapes: list[int], strides: list[int]) -> Layout:
    """A flat layout from its modes: an int mode when there is one, 1:0 when there is none."""
    if not shapes:
        return Layout(1, 0)
    if len(shapes) == 1:
        return Layout(shapes[0], strides[0])
    return Layout(tuple(shapes), tuple(strides))
# --8<-- [end:coalesce]


# --8<-- [start:composition]
def composition(a: Layout, b) -> Layout:
    """The layout ``R`` with ``R(c) == a(b(c))`` for every coordinate ``c`` of ``b``.

    ``b`` picks which 1-D coordinates of ``a`` to visit and in what order; ``a`` says where
    they are. ``b`` is a Layout (whatever its rank, its offsets are 1-D coordinates of ``a``),
    an int ``n`` (the layout ``n:1``, the first n elements), None (``a`` unchanged), or a tuple
    of these, a *tiler*, applied mode by mode to ``a`` (modes of ``a`` beyond the tuple are
    dropped, as in CuTe).

    Each mode of ``b`` is composed on its own (the divisibility conditions are checked mode by
    mode) and the results are added, which is ``a o b`` only when adding never carries from one
    mode of ``a`` into the next: ``b``'s modes must not overlap within ``a``'s. CuTe assumes
    this and does not check it.
    """
    if b is None:
        return a
    if isinstance(b, tuple):
        if len(b) > a.rank:
            raise ValueError(f"tiler {b} has more modes than {a}")
        return bundle(*(composition(a[i], b_i) for i, b_i in enumerate(b)))
    if is_int(b):
        b = Layout(b, 1)
    if not isinstance(b, Layout):
        raise TypeError(f"composition takes a Layout, an int, None or a tuple of them, got {b!r}")
    shapes, strides = modes_for_composition(a)
    return compose_modes(shapes, strides, b.shape, b.stride)


def modes_for_composition(a: Layout) -> tuple[list[int], list[int]]:
    """``a``'s leaf modes merged as coalesce merges them, but keeping the last mode even when its
    size is 1: a 1-D coordinate past the end of ``a`` continues along the last mode, so its
    stride is part of the function."""
    pairs = list(zip(leaves(a.shape), leaves(a.stride)))
    shapes: list[int] = []
    strides: list[int] = []
    for i, (s, d) in enumerate(pairs):
        if s == 1 and i < len(pairs) - 1:
            continue
        if shapes and d == shapes[-1] * strides[-1]:
            shapes[-1] *= s
        else:
            shapes.append(s)
            strides.append(d)
    return shapes, strides


def compose_modes(shapes: list[int], strides: list[int], b_shape, b_stride) -> Layout:
    """The flat layout ``shapes:strides`` composed with ``b_shape:b_stride``."""
    if isinstance(b_shape, tuple):  # one mode of b at a time: R's modes are a o b's modes
        return bundle(*(compose_modes(shapes, strides, s, d) for s, d in zip(b_shape, b_stride)))
    if b_stride == 0:  # b repeats one element of a
        return Layout(b_shape, 0)
    if len(shapes) == 1:  # a is one mode: its stride scales b's
        return Layout(b_shape, b_stride * strides[0])
    # b = n:d visits n elements of a, d apart. Walk a's modes: a mode whose size divides d is
    # stepped over whole (d shrinks by that size); otherwise b moves inside the mode, d apart,
    # and keeps there as many of its n elements as fit, the rest continuing in the next mode.
    out_shapes: list[int] = []
    out_strides: list[int] = []
    rest_shape, rest_stride = b_shape, b_stride
    for s, d in zip(shapes[:-1], strides[:-1]):
        step = abs(rest_stride)
        if step % s != 0 and step > s:
            raise ValueError(f"composition is not admissible (stride divisibility condition): "
                             f"stride {rest_stride} is neither a multiple of the mode size {s} "
                             f"of the first layout nor smaller than it")
        if step % s != 0 and s % step != 0 and rest_shape > ceil_div(s, step):
            # CuTe's own check lets this through and returns a layout that is not a o b
            raise ValueError(f"composition is not admissible (stride divisibility condition): "
                             f"stride {rest_stride} does not divide the mode size {s} of the "
                             f"first layout, and the {rest_shape} elements left run past it")
        next_shape = ceil_div(s, step)  # elements of this mode b lands on
        next_stride = ceil_div(step, s) * (-1 if rest_stride < 0 else 1)
        if next_shape == 1 or rest_shape == 1:
            rest_stride = next_stride  # b steps over this mode entirely
            continue
        new_shape = min(next_shape, rest_shape)
        if rest_shape % new_shape != 0:
            raise ValueError(f"composition is not admissible (shape divisibility condition): "
                             f"{rest_shape} elements are left to place, and the mode of size {s} "
                             f"holds {new_shape} of them, which does not divide {rest_shape}")
        out_shapes.append(new_shape)
        out_strides.append(rest_stride * d)
        rest_shape //= new_shape
        rest_stride = next_stride
    if not out_shapes:  # everything lands in a's last mode
        return Layout(rest_shape, rest_stride * strides[-1])
    if rest_shape == 1:
        return layout_of_modes(out_shapes, out_strides)
    return Layout(tuple(out_shapes) + (rest_shape,),
                  tuple(out_strides) + (rest_stride * strides[-1],))


def ceil_div(a: int, b: int) -> int:
    """``a / b`` rounded up, for positive ints."""
    return -(-a // b)
# --8<-- [end:composition]


# --8<-- [start:complement]
def complement(layout: Layout, cotarget=None) -> Layout:
    """The layout of the offsets ``layout`` leaves out, up to ``cotarget``.

    Walk the layout's modes by increasing stride, keeping ``covered``: the modes so far, with
    the holes filled, tile the offsets ``[0, covered)``. Before a mode of stride ``d`` there is
    room for ``d // covered`` copies of what is covered: one mode of the complement, of stride
    ``covered``. After the last mode, the complement repeats everything until ``cotarget`` (an
    int, or a shape, divided mode by mode) is reached. The complement's offsets increase, and
    none but 0 is an offset of ``layout``. When each stride of ``layout`` is a multiple of the
    span below it and ``cotarget`` is a multiple of the whole span, ``(layout, complement)`` is
    a bijection onto ``[0, cotarget)``.
    """
    # Broadcast modes (stride 0) and modes of size 1 take no room: drop them.
    pairs = list(zip(leaves(layout.shape), leaves(layout.stride)))
    if any(d < 0 for _, d in pairs):
        raise ValueError(f"complement needs non-negative strides, got {layout}")
    kept = coalesce(Layout(tuple(1 if d == 0 else s for s, d in pairs),
                           tuple(d for _, d in pairs)))
    if cotarget is None:
        cotarget = kept.cosize
    if not is_int_tuple(cotarget) or any(c <= 0 for c in leaves(cotarget)):
        raise ValueError(f"the cotarget of a complement is a positive int or shape, got "
                         f"{cotarget!r}")
    if kept.stride == 0:  # nothing but broadcasts: the complement is all of cotarget
        return make_layout(product(cotarget))
    modes = sorted(zip(leaves(kept.shape), leaves(kept.stride)), key=lambda mode: mode[1])
    shapes: list[int] = []
    strides: list[int] = []
    covered = 1
    for s, d in modes:
        if d < covered:
            raise ValueError(f"no complement: the modes of {layout} overlap (stride {d} is "
                             f"inside the {covered} offsets its smaller strides already span)")
        shapes.append(d // covered)
        strides.append(covered)
        covered = d * s
    rest = product(ceil_div_shape(cotarget, covered))  # repeat everything up to cotarget
    shapes.append(rest)
    strides.append(covered)
    return coalesce(Layout(tuple(shapes), tuple(strides)))


def ceil_div_shape(shape, n: int):
    """``shape`` divided by ``n`` from the left, rounding up: CuTe's ``ceil_div`` of a shape."""
    if is_int(shape):
        return ceil_div(shape, n)
    out = []
    for s in shape:
        out.append(ceil_div_shape(s, n))
        n = ceil_div(n, product(s))
    return tuple(out)
# --8<-- [end:complement]


# --8<-- [start:divide]
def by_mode(op, layout: Layout, tiler: tuple) -> Layout:
    """A tuple tiler, for divide and product alike: ``op`` applied to each mode of ``layout``
    with its element of the tiler; the layout's modes past the tuple are kept as they are."""
    if len(tiler) > layout.rank:
        raise ValueError(f"tiler {tiler} has more modes than {layout}")
    modes = [op(layout[i], t) for i, t in enumerate(tiler)]
    return bundle(*modes, *(layout[i] for i in range(len(tiler), layout.rank)))


def tiler_layout(tiler) -> Layout:
    """A tiler that is one Layout: itself, or ``n:1`` for an int ``n``."""
    if is_int(tiler):
        return make_layout(tiler)
    if not isinstance(tiler, Layout):
        raise TypeError(f"a tiler is a Layout, an int, None or a tuple of them, got {tiler!r}")
    return tiler


def logical_divide(layout: Layout, tiler) -> Layout:
    """Split ``layout`` into (tile, rest): mode 0 walks the elements the tiler picks, mode 1
    walks from one tile to the next. A Layout tiler ``T`` gives ``layout o (T, T*)``, with
    ``T*`` the complement of ``T`` up to the layout's (coalesced) shape; an int ``n`` is the
    tiler ``n:1``; a tuple tiler divides mode by mode (the layout's other modes are kept)."""
    if tiler is None:
        return layout
    if isinstance(tiler, tuple):
        return by_mode(logical_divide, layout, tiler)
    tiler = tiler_layout(tiler)
    rest = complement(tiler, coalesce(layout).shape)
    return composition(layout, bundle(tiler, rest))


def zipped_divide(layout: Layout, tiler) -> Layout:
    """``logical_divide`` with the tiles gathered into mode 0 and the rests into mode 1:
    ``((TileM, TileN), (RestM, RestN, ...))``, so coordinate ``(i, t)`` is element ``i`` of
    tile ``t``."""
    divided = logical_divide(layout, tiler)
    return Layout(zip2_by(divided.shape, tiler), zip2_by(divided.stride, tiler))


def zip2_by(t, tiler):
    """Turn ``((A, a), (B, b), x)`` into ``((A, B), (a, b, x))``, following the tiler's
    nesting to find the (tile, rest) pairs."""
    if not isinstance(tiler, tuple):
        if not (isinstance(t, tuple) and len(t) == 2):
            raise ValueError(f"{fmt(t)} is not a (tile, rest) pair: divide that mode by a tiler")
        return t  # one (tile, rest) pair already
    pairs = [zip2_by(t[i], g) for i, g in enumerate(tiler)]
    return (tuple(p[0] for p in pairs), tuple(p[1] for p in pairs) + t[len(tiler):])


def tiled_divide(layout: Layout, tiler) -> Layout:
    """``zipped_divide`` with the rest modes unpacked: ``((TileM, TileN), RestM, RestN, ...)``."""
    zipped = zipped_divide(layout, tiler)
    tile, rest = zipped[0], zipped[1]
    if rest.rank == 1:
        return zipped
    return bundle(tile, *(rest[i] for i in range(rest.rank)))
# --8<-- [end:divide]


# --8<-- [start:product]
def logical_product(block: Layout, tiler) -> Layout:
    """``(block, block* o tiler)``: the block once, then the tiler's arrangement of copies of
    it, ``block*`` being the complement of the block that has room for ``cosize(tiler)``
    copies. An int tiler ``n`` is ``n:1``; a tuple tiler works mode by mode."""
    if tiler is None:
        return block
    if isinstance(tiler, tuple):
        return by_mode(logical_product, block, tiler)
    tiler = tiler_layout(tiler)
    copies = complement(block, block.size * tiler.cosize)
    return bundle(block, composition(copies, tiler))


def blocked_product(block: Layout, tiler: Layout) -> Layout:
    """Mode i of the result is (block's mode i, tiler's mode i): each copy of the block stays
    contiguous, and the copies are arranged as the tiler says."""
    inner, outer = product_modes(block, tiler)
    return zip_layouts(inner, outer)


def raked_product(block: Layout, tiler: Layout) -> Layout:
    """Mode i of the result is (tiler's mode i, block's mode i): the copies are interleaved, so
    a block's elements are spread one per tile."""
    inner, outer = product_modes(block, tiler)
    return zip_layouts(outer, inner)


def product_modes(block: Layout, tiler: Layout) -> tuple[Layout, Layout]:
    """The two modes of the logical product of block and tiler, both padded with 1:0 modes to
    the same rank, so that their modes can be paired."""
    if not (isinstance(block, Layout) and isinstance(tiler, Layout)):
        raise TypeError(f"blocked and raked products take two Layouts, got {block!r}, {tiler!r}")
    rank = max(block.rank, tiler.rank)
    result = logical_product(pad_rank(block, rank), pad_rank(tiler, rank))
    return result[0], result[1]


def pad_rank(layout: Layout, rank: int) -> Layout:
    """``layout`` with modes 1:0 appended up to ``rank`` modes."""
    if layout.rank == rank:
        return layout
    modes = [layout[i] for i in range(layout.rank)] + [Layout(1, 0)] * (rank - layout.rank)
    return bundle(*modes)


def zip_layouts(a: Layout, b: Layout) -> Layout:
    """``((a0, b0), (a1, b1), ...)``; two one-mode layouts give ``((a, b))``."""
    if is_int(a.shape):
        return Layout(((a.shape, b.shape),), ((a.stride, b.stride),))
    if a.rank != b.rank:
        raise ValueError(f"cannot pair the modes of {a} and {b}: their ranks differ")
    return bundle(*(bundle(a[i], b[i]) for i in range(a.rank)))
# --8<-- [end:product]


# --8<-- [start:inverse]
def right_inverse(layout: Layout) -> Layout:
    """The layout ``R`` with ``layout(R(i)) == i`` for every ``i < R.size``: for each offset
    that ``layout`` reaches contiguously from 0, the 1-D coordinate that reaches it.

    Take the coalesced modes by increasing stride. A mode whose stride is exactly where the
    offsets covered so far end (1 at first) extends the covered run: in the inverse, that run
    of offsets steps through the mode, whose 1-D coordinates move by the product of the shapes
    before it. Other modes (gaps, broadcasts) are skipped.
    """
    flat = coalesce(layout)
    shapes, strides = leaves(flat.shape), leaves(flat.stride)
    before = [prod(shapes[:i]) for i in range(len(shapes))]  # 1-D coordinate steps
    out_shapes, out_strides = [1], [0]
    covered = 1
    for i in sorted(range(len(shapes)), key=lambda i: strides[i]):
        if strides[i] == covered:
            out_shapes.append(shapes[i])
            out_strides.append(before[i])
            covered = shapes[i] * strides[i]
    return coalesce(Layout(tuple(out_shapes), tuple(out_strides)))


def left_inverse(layout: Layout) -> Layout:
    """A layout ``L`` with ``L(layout(c)) == c`` for every 1-D coordinate ``c`` of an
    injective ``layout``: from an offset back to the coordinate that produced it.

    Take the coalesced modes by increasing stride and read an offset as a mixed-radix number
    whose place values are those strides: the offsets below the smallest stride are not reached
    (they go to coordinate 0, stride 0); between one stride and the next, the offset counts
    steps of the first of the two modes, each moving the 1-D coordinate by the product of the
    shapes before that mode; the last mode counts up to its own size. CuTe requires each stride
    to be a multiple of the one before it (the left inverse divisibility condition).
    """
    flat = coalesce(layout)
    shapes, strides = leaves(flat.shape), leaves(flat.stride)
    before = [prod(shapes[:i]) for i in range(len(shapes))]  # 1-D coordinate steps
    order = sorted(range(len(shapes)), key=lambda i: strides[i])
    out_shapes, out_strides = [], [0]
    for i in order:
        if strides[i] == 0:
            continue
        spanned = prod(out_shapes)
        if strides[i] % spanned != 0:
            raise ValueError(f"no left inverse of {layout} (left inverse divisibility "
                             f"condition): stride {strides[i]} is not a multiple of {spanned}")
        out_shapes.append(strides[i] // spanned)
        out_strides.append(before[i])
    out_shapes.append(shapes[order[-1]])
    return coalesce(Layout(tuple(out_shapes), tuple(out_strides)))


def max_common_vector(a: Layout, b: Layout) -> int:
    """How many elements, from coordinate 0 on, ``a`` and ``b`` both store contiguously and in
    the same order: the widest vector a copy from one layout to the other can move at once."""
    common = coalesce(composition(a, right_inverse(b)))
    first = common[0]
    return first.shape if first.stride == 1 else 1
# --8<-- [end:inverse]


# --8<-- [start:swizzle]
@dataclass(frozen=True, repr=False)
class Swizzle:
    """CuTe's ``Swizzle<B, M, S>``, a permutation of offsets by XOR.

    In binary, an offset is ``...YYY...ZZZ[M bits]``: the lowest ``base`` (M) bits stay as
    they are, ``bits`` (B) bits ZZZ start at bit M, and the B bits YYY start ``shift`` (S) bits
    higher. The swizzle replaces ZZZ by ZZZ xor YYY. A negative S puts YYY below ZZZ.
    """

    bits: int
    base: int
    shift: int

    def __post_init__(self):
        if not all(is_int(v) for v in (self.bits, self.base, self.shift)):
            raise TypeError(f"Swizzle takes three ints, got {self.bits!r}, {self.base!r}, "
                            f"{self.shift!r}")
        if self.bits < 0 or self.base < 0 or abs(self.shift) < self.bits:
            raise ValueError(f"Swizzle<{self.bits},{self.base},{self.shift}> needs bits >= 0, "
                             f"base >= 0 and |shift| >= bits (the two bit fields must not "
                             f"overlap)")

    @property
    def yyy_mask(self) -> int:
        """The bits read: B bits, M + max(0, S) from the bottom."""
        return ((1 << self.bits) - 1) << (self.base + max(0, self.shift))

    @property
    def zzz_mask(self) -> int:
        """The bits changed: B bits, M - min(0, S) from the bottom."""
        return ((1 << self.bits) - 1) << (self.base - min(0, self.shift))

    def __call__(self, offset: int) -> int:
        yyy = offset & self.yyy_mask
        moved = yyy >> self.shift if self.shift >= 0 else yyy << -self.shift
        return offset ^ moved

    def __repr__(self) -> str:
        return f"Sw<{self.bits},{self.base},{self.shift}>"


@dataclass(frozen=True, repr=False)
class ComposedLayout:
    """A swizzle after a layout: coordinate -> ``swizzle(layout(coordinate))``."""

    swizzle: Swizzle
    layout: Layout

    @property
    def shape(self):
        return self.layout.shape

    @property
    def size(self) -> int:
        return self.layout.size

    def __call__(self, coord) -> int:
        return self.swizzle(self.layout(coord))

    def __repr__(self) -> str:
        return f"{self.swizzle} o {self.layout}"


def swizzled(layout: Layout, swizzle: Swizzle) -> ComposedLayout:
    return ComposedLayout(swizzle, layout)
# --8<-- [end:swizzle]
