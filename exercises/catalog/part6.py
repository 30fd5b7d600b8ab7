"""Part 6's exercises: layouts as functions, coalesce, complement, swizzles, FP8 scaling, the wgmma
descriptor (all Python, checked on a CPU against the book's own code)."""

from __future__ import annotations

import math
import random

import torch

from exercises import compare
from exercises.catalog.helpers import Output, gen, require
from exercises.engine import Exercise, Failure, Run
from snippets.part6 import hopper as book_hopper
from snippets.part6 import layout as book_layout
from snippets.part6.fp8 import format_facts, quantize_per_tensor


def _random_layout(rng: random.Random, depth: int = 2):
    """A (shape, stride) pair of up to 3 modes, nested up to ``depth``."""
    if depth == 0 or rng.random() < 0.5:
        return rng.randint(1, 5), rng.choice([0, 1, 2, 3, 4, 8, 16, 32])
    modes = [_random_layout(rng, depth - 1) for _ in range(rng.randint(1, 3))]
    return tuple(m[0] for m in modes), tuple(m[1] for m in modes)


def _coords(shape, rng: random.Random, k: int):
    """``k`` coordinates of ``shape``: 1-D ints, and congruent tuples at the top level."""

    def size(s):
        return s if isinstance(s, int) else math.prod(size(x) for x in s)

    out = [rng.randrange(size(shape)) for _ in range(k)]
    if not isinstance(shape, int):
        out += [tuple(rng.randrange(size(s)) for s in shape) for _ in range(k)]
    return out


# ------------------------------------------------------------------------------------------- layouts.4
def _check_crd2idx(run: Run) -> None:
    mine, ref = run.module(), run.solution()
    fixed = [
        (5, (4, 8), (1, 4)),
        ((1, 2), (4, 8), (8, 1)),
        ((5, 6), ((4, 2), (4, 2)), ((1, 16), (4, 32))),
        (((1, 1), (2, 1)), ((4, 2), (4, 2)), ((1, 16), (4, 32))),
        (3, 8, 32),
    ]
    with run.case(
        "the chapter's layouts",
        hint="a 1-D coordinate is split colexicographically: the first "
        "mode takes coord % size(mode 0), the rest goes on with coord // size(mode 0)",
    ):
        compare.functions("crd2idx", getattr(mine, "crd2idx", None), ref.crd2idx, fixed)
    rng = random.Random(61)
    cases = []
    for _ in range(300):
        shape, stride = _random_layout(rng)
        cases += [(c, shape, stride) for c in _coords(shape, rng, 2)]
    with run.case(
        f"{len(cases)} random coordinates of random nested layouts",
        hint="an int entry for a nested mode is itself a 1-D coordinate of that mode: recurse",
    ):
        compare.functions("crd2idx", getattr(mine, "crd2idx", None), ref.crd2idx, cases)


crd2idx = Exercise(
    id="part6.layouts.4",
    title="Coordinate to index, at any depth",
    difficulty=2,
    kind="model",
    files=("part6/crd2idx.py",),
    task="Write crd2idx(coord, shape, stride): the offset a layout shape:stride gives a coordinate. The "
    "coordinate may be an int (a 1-D coordinate, counted colexicographically over the whole shape) or a tuple "
    "congruent with the shape whose entries are ints or tuples (an int entry for a nested mode is a 1-D "
    "coordinate of that mode).",
    hint="three cases: an int shape (coord * stride); an int coordinate of a tuple shape (split it over the "
    "modes, first mode fastest); a tuple coordinate (the sum over the modes)",
    check=_check_crd2idx,
    planted={"row_major_split": "crd2idx(5, (4, 8), (1, 4))"},
)


# -------------------------------------------------------------------------------------- layout-algebra.4
def _check_coalesce(run: Run) -> None:
    mine, ref = run.module(), run.solution()
    fixed = [
        ((2, (1, 6)), (1, (6, 2))),
        ((4, 8), (8, 1)),
        (((2, 4), (3, 2)), ((1, 2), (8, 24))),
        ((1, 1), (3, 5)),
        ((4, 1, 2), (1, 7, 4)),
        (8, 2),
    ]
    with run.case(
        "the chapter's layouts",
        hint="merge when the previous mode's shape x stride equals this "
        "mode's stride; drop modes of size 1",
    ):
        compare.functions("coalesce", getattr(mine, "coalesce", None), ref.coalesce, fixed)
    rng = random.Random(62)
    cases = [_random_layout(rng) for _ in range(500)]
    with run.case(
        f"{len(cases)} random nested layouts",
        hint="flatten first; a layout with no mode left is (1, 0); one mode is a pair of ints",
    ):
        compare.functions("coalesce", getattr(mine, "coalesce", None), ref.coalesce, cases)


coalesce = Exercise(
    id="part6.layout-algebra.4",
    title="Coalesce",
    difficulty=3,
    kind="model",
    files=("part6/coalesce.py",),
    task="Write coalesce(shape, stride): the layout with the fewest modes that is the same function of the 1-D "
    "coordinate. Flatten the modes, drop those of size 1, merge a mode into the previous one when the "
    "previous shape times its stride equals this stride. Return ints for a single mode, (1, 0) when nothing "
    "is left, and flat tuples otherwise.",
    hint="walk the flattened modes once, keeping a list of (shape, stride): extend the last entry or append",
    check=_check_coalesce,
    planted={
        "keeps_size_one": "coalesce((2, (1, 6)), (1, (6, 2)))",
        "merges_wrong": "coalesce((2, (1, 6)), (1, (6, 2)))",
    },
)


# --------------------------------------------------------------------------------------------- swizzles.3
def _check_swizzle(run: Run) -> None:
    mine, ref = run.module(), run.solution()
    with run.case(
        "Swizzle<3,4,3> on the first 1024 byte offsets (Hopper's 128-byte swizzle)",
        hint="bits 7-9 (the row modulo 8) are XOR-ed into bits 4-6 (the 16-byte chunk)",
    ):
        compare.functions(
            "swizzle",
            getattr(mine, "swizzle", None),
            ref.swizzle,
            [(o, 3, 4, 3) for o in range(1024)],
        )
    cases = [
        (o, b, m, s)
        for b, m, s in ((2, 4, 3), (3, 3, 3), (1, 0, 5), (2, 2, -2), (3, 4, 4))
        for o in range(512)
    ]
    with run.case(
        "other swizzles, a negative shift among them",
        hint="for a negative S the read bits start at M and are shifted left by -S",
    ):
        compare.functions("swizzle", getattr(mine, "swizzle", None), ref.swizzle, cases)


swizzle = Exercise(
    id="part6.swizzles.3",
    title="The swizzle function",
    difficulty=1,
    kind="model",
    files=("part6/swizzle.py",),
    task="Write swizzle(offset, bits, base, shift), CuTe's Swizzle<B, M, S> on an offset: XOR the B bits that "
    "start at bit M + S into the B bits that start at bit M (for a negative S, the B bits at M into those at "
    "M - S). The lowest M bits never change.",
    hint="mask = ((1 << B) - 1) << (M + max(0, S)); offset ^ ((offset & mask) >> S)",
    check=_check_swizzle,
    planted={"wrong_mask": "swizzle(16, 3, 4, 3)"},
)



# -------------------------------------------------------------------------------------- layout-algebra.5
def _book_complement(shape, stride, cotarget=None):
    """snippets/part6/layout.py's complement as (shape, stride); a layout of size 1 is (1, 0)
    (its stride is never used)."""
    out = book_layout.complement(book_layout.Layout(shape, stride), cotarget)
    return (1, 0) if out.size == 1 else (out.shape, out.stride)


def _random_injective(rng: random.Random):
    """A flat layout whose modes do not overlap: strides built in a random order, each a multiple
    of the span below it (with gaps), some modes of size 1 or stride 0."""
    n = rng.randint(1, 4)
    sizes = [rng.randint(1, 4) for _ in range(n)]
    strides = [0] * n
    covered = 1
    for i in rng.sample(range(n), n):
        if rng.random() < 0.15:
            continue  # a broadcast mode: stride 0
        strides[i] = covered * rng.choice([1, 1, 2, 3, 4])
        covered = strides[i] * sizes[i]
    if n == 1:
        return sizes[0], strides[0]
    return tuple(sizes), tuple(strides)


def _check_complement(run: Run) -> None:
    mine = getattr(run.module(), "complement", None)
    fixed = [
        (4, 1, 24),
        (4, 2, 24),
        ((2, 2), (1, 6), 24),
        ((4, 6), (1, 4), None),
        ((2, 4), (8, 1), 64),
        (3, 0, 12),
        ((2, 1, 3), (3, 7, 1), 36),
    ]
    with run.case(
        "the chapter's layouts",
        hint="before a mode of stride d there is room for d // covered copies of what is covered: "
        "the complement's mode (d // covered):covered; then covered = d * size",
    ):
        compare.functions("complement", mine, _book_complement, fixed)
    rng = random.Random(65)
    cases = []
    for _ in range(400):
        shape, stride = _random_injective(rng)
        cosize = book_layout.Layout(shape, stride).cosize
        cases.append((shape, stride, rng.choice([None, cosize, 2 * cosize, 3 * cosize + 1])))
    with run.case(
        f"{len(cases)} random flat layouts, with and without a cotarget",
        hint="walk the modes by increasing stride, skipping sizes of 1 and strides of 0; the last "
        "mode is ceil(cotarget / covered):covered; coalesce the result",
    ):
        compare.functions("complement", mine, _book_complement, cases)
    with run.case(
        "overlapping modes are refused",
        hint="a stride smaller than the span the smaller strides already cover means overlap: "
        "raise ValueError",
    ):
        for shape, stride in (((2, 2), (1, 1)), ((4, 2), (1, 2)), ((3, 2), (2, 3))):
            try:
                got = mine(shape, stride, 24)
            except ValueError:
                continue
            raise Failure(f"complement({shape}, {stride}, 24) returned {got}: the modes overlap, "
                          "expected ValueError")


complement = Exercise(
    id="part6.layout-algebra.5",
    title="Complement of a flat layout",
    difficulty=3,
    kind="model",
    files=("part6/complement.py",),
    task="Write complement(shape, stride, cotarget): the layout of the offsets in [0, cotarget) that "
    "the flat layout shape:stride leaves out. Drop the modes of size 1 or stride 0, sort the rest by "
    "stride and walk them keeping covered, the span the modes so far tile with their holes filled: "
    "before a mode of stride d the complement gets a mode (d // covered):covered, and covered becomes "
    "d * size. A last mode ceil(cotarget / covered):covered repeats everything up to the cotarget (the "
    "whole span when cotarget is None). Raise ValueError when a stride falls inside the span already "
    "covered. Return the result coalesced.",
    hint="covered starts at 1; the cosize is 1 + the sum of (size - 1) * stride; coalesce() is given",
    check=_check_complement,
    planted={
        "no_gap_modes": "complement(4, 2, 24)",
        "unsorted": "complement((2, 4), (8, 1), 64)",
    },
)


# ------------------------------------------------------------------------------------------------ fp8.3
def _fp8_bits(q: torch.Tensor) -> torch.Tensor:
    return q.view(torch.uint8).to(torch.int16)


def _compare_fp8(name: str, got, expected: torch.Tensor) -> None:
    """Bit for bit: the same fp8 codes (NaN and the sign of zero included)."""
    if not isinstance(got, torch.Tensor) or got.dtype != expected.dtype:
        raise Failure(f"{name} should be a {expected.dtype} tensor, got "
                      f"{getattr(got, 'dtype', type(got).__name__)}")
    compare.tensors(f"{name} as fp8 values", got.float(), expected.float(), rtol=0, atol=0)
    compare.tensors(f"{name} as fp8 codes", _fp8_bits(got), _fp8_bits(expected), rtol=0, atol=0,
                    check_dtype=False)


def _check_fp8_scale(run: Run) -> None:
    mine = run.module()
    scale_fn, quant_fn = getattr(mine, "per_tensor_scale", None), getattr(mine, "quantize", None)
    if not callable(scale_fn) or not callable(quant_fn):
        raise Failure("per_tensor_scale and quantize must both be functions")
    g = torch.Generator().manual_seed(66)
    data = [
        ("randn", torch.randn(64, 96, generator=g)),
        ("with an outlier", torch.randn(33, 17, generator=g) * torch.where(
            torch.rand(33, 17, generator=g) < 0.01, 1e4, 1.0)),
        ("tiny values", torch.randn(7, 300, generator=g) * 1e-7),
        ("some zeros", torch.randn(50, generator=g).relu()),
        ("all zeros", torch.zeros(5, 5)),
        ("bf16", torch.randn(40, 24, generator=g).bfloat16() * 3),
    ]
    for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        label = str(dtype).removeprefix("torch.")
        with run.case(
            f"{label}: the scales of snippets/part6/fp8.py (random, outliers, tiny, zeros, bf16)",
            hint="scale = amax / the format's largest value, amax in fp32 and at least 1e-12 (all "
            "zeros)",
        ):
            for what, x in data:
                try:
                    scale = scale_fn(x, dtype)
                except NotImplementedError as exc:
                    raise Failure(f"per_tensor_scale is not written yet ({exc})") from exc
                compare.number(f"per_tensor_scale({what}, {label})", scale,
                               float(quantize_per_tensor(x, dtype)[1]), rel=1e-6)
        with run.case(
            f"{label}: the codes of snippets/part6/fp8.py, bit for bit",
            hint="divide by the scale in fp32, then cast",
        ):
            for what, x in data:
                q_ref, s_ref = quantize_per_tensor(x, dtype)
                try:
                    q = quant_fn(x, s_ref, dtype)
                except NotImplementedError as exc:
                    raise Failure(f"quantize is not written yet ({exc})") from exc
                _compare_fp8(f"quantize({what}, {label})", q, q_ref)
    with run.case(
        "an infinity or a NaN is refused by per_tensor_scale",
        hint="check torch.isfinite(x).all() first: an infinite amax makes the scale infinite",
    ):
        for bad in (float("inf"), float("-inf"), float("nan")):
            x = torch.randn(16, generator=g)
            x[3] = bad
            try:
                got = scale_fn(x, torch.float8_e4m3fn)
            except ValueError:
                continue
            raise Failure(f"per_tensor_scale of a tensor holding {bad} returned {got}, expected "
                          "ValueError")
    x = torch.randn(64, 64, generator=g) * 100
    x[0, :4] = torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0])
    for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        top = format_facts(dtype).max
        stale = torch.tensor(float(x[1:].abs().amax()) / top / 8)  # a scale 8 times too small
        expected = (x / stale).clamp(-top, top).to(dtype)
        label = str(dtype).removeprefix("torch.")
        with run.case(
            f"{label}: a stale scale and infinities saturate to +-{top:g} (NaN stays NaN)",
            hint="clamp x / scale to [-max, max] before the cast: a cast does not always saturate "
            "(e5m2 has infinities, so a value past 57344 becomes inf)",
        ):
            _compare_fp8(f"quantize(stale scale, {label}) (saturation)", quant_fn(x, stale, dtype),
                         expected)


fp8_scale = Exercise(
    id="part6.fp8.3",
    title="A per-tensor scale and a saturating cast",
    difficulty=2,
    kind="model",
    files=("part6/fp8_scale.py",),
    task="Write per_tensor_scale(x, dtype): the fp32 scale that maps the largest magnitude of x to the "
    "format's largest finite value (amax / max, amax kept at least 1e-12 so that a tensor of zeros gets "
    "a usable scale), raising ValueError when x holds an infinity or a NaN. Then quantize(x, scale, "
    "dtype): x / scale in fp32, clamped to [-max, max] before the cast, so that a stale scale or an "
    "infinity saturates to the largest value; NaN stays NaN.",
    hint="torch.finfo(dtype).max is the largest value (largest() is given); .clamp(-top, top) keeps NaN",
    check=_check_fp8_scale,
    planted={
        "inverted_scale": "per_tensor_scale(randn, float8_e4m3fn)",
        "no_zero_guard": "all zeros",
        "no_saturation": "saturation",
        "accepts_inf": "expected ValueError",
    },
)


# --------------------------------------------------------------------------------------------- hopper.3
def _check_wgmma_desc(run: Run) -> None:
    mine = getattr(run.module(), "descriptor", None)

    def book(smem_addr, lbo, sbo, layout_type, base_offset=0):
        swizzle = {s.layout_type: s for s in book_hopper.Swizzle}[layout_type]
        return book_hopper.wgmma_descriptor(smem_addr, lbo, sbo, swizzle, base_offset)

    lbo, sbo = book_hopper.kmajor_offsets(128, 128, "128B")
    with run.case(
        "a 128 x 64 bf16 K-major tile with the 128B swizzle, at byte 1024",
        hint="each of the three byte counts goes in as (x & 0x3FFFF) >> 4: encode() is given",
    ):
        compare.functions("descriptor", mine, book, [(1024, lbo, sbo, 1)])
    rng = random.Random(67)
    cases = []
    for _ in range(300):
        layout_type = rng.randrange(4)
        cases.append((rng.randrange(1 << 14) * 16, rng.randrange(1 << 14) * 16,
                      rng.randrange(1 << 14) * 16, layout_type,
                      rng.randrange(8) if layout_type else 0))
    with run.case(
        f"{len(cases)} random addresses, offsets, layout types and base offsets",
        hint="the fields sit at bits 0, 16, 32, 49 and 62; shift, then OR them together",
    ):
        compare.functions("descriptor", mine, book, cases)


wgmma_desc = Exercise(
    id="part6.hopper.3",
    title="The wgmma shared-memory descriptor",
    difficulty=1,
    kind="model",
    files=("part6/wgmma_desc.py",),
    task="Write descriptor(smem_addr, lbo, sbo, layout_type, base_offset): the 64-bit matrix descriptor "
    "of a wgmma operand. The start address, the leading byte offset and the stride byte offset are "
    "byte counts kept in 16-byte units, 14 bits each (encode() does that), at bits 0, 16 and 32; the "
    "base offset takes bits 49-51 and the layout type (0 none, 1 128B, 2 64B, 3 32B) bits 62-63.",
    hint="encode(smem_addr) | encode(lbo) << 16 | encode(sbo) << 32 | base_offset << 49 | "
    "layout_type << 62",
    check=_check_wgmma_desc,
    planted={
        "bytes_not_units": "descriptor(1024, 16, 1024, 1)",
        "swizzle_at_60": "descriptor(",
    },
)


# ---------------------------------------------------------------------------------- hopper-attention.12
def _store_order(d: int) -> dict[int, tuple[int, int]]:
    """Step 3's stores (flash_bwd.cu, FRAG), transcribed: float4 index -> (row, column) of its first
    value, for both consumers, every thread and register group of one 64 x d dQ tile."""
    half = d // 2
    out = {}
    for c in range(2):
        for t in range(128):
            warp, lane = t // 32, t % 32
            for j in range(half // 8):
                out[(c * (half // 8) + j) * 128 + t] = (16 * warp + lane // 4,
                                                        c * half + 8 * j + 2 * (lane % 4))
    return out


def _check_dq_frag(run: Run) -> None:
    mine = getattr(run.module(), "frag_coords", None)
    if not callable(mine):
        raise Failure("frag_coords is missing or not a function")
    for d in (64, 128):
        order = _store_order(d)
        with run.case(
            f"every float4 of a 64 x {d} tile, against the kernel's stores",
            hint="t = f % 128 is the storing thread and f // 128 its consumer's register group; "
            "the row comes from the warp and the lane's quad, the column from the group and the "
            "lane's pair",
        ):
            compare.functions("frag_coords", mine, lambda f, d, o=order: o[f],
                              [(f, d) for f in sorted(order)])
    with run.case(
        "indices outside the tile are refused",
        hint="a 64 x d tile holds 16 * d float4s: raise ValueError outside 0 .. 16 * d - 1",
    ):
        for f, d in ((-1, 64), (1024, 64), (2048, 128)):
            try:
                got = mine(f, d)
            except ValueError:
                continue
            raise Failure(f"frag_coords({f}, {d}) returned {got}: outside the tile, expected "
                          "ValueError")


dq_frag = Exercise(
    id="part6.hopper-attention.12",
    title="Step 3's fragment order, read back",
    difficulty=2,
    kind="model",
    files=("part6/dq_frag.py",),
    task="Write frag_coords(f, d): where the first value of float4 number f of one 64 x d dQ tile, in "
    "step 3's fragment order, belongs. Consumer c's thread t (0..127, warp t // 32, lane t % 32) "
    "stores its register group j (columns 8j.., of the c-th half of d) as float4 number "
    "(c * d / 16 + j) * 128 + t; the float4 holds rows r and r + 8 (r = 16 * warp + lane // 4) at "
    "columns col and col + 1 (col = c * d / 2 + 8j + 2 * (lane % 4)). Return (r, col). f outside the "
    "tile (f < 0 or f >= 16 * d) is a ValueError.",
    hint="t, group = f % 128, f // 128; c * d / 2 + 8j is 8 * group",
    check=_check_dq_frag,
    planted={
        "no_warp_offset": "frag_coords(",
        "columns_not_pairs": "frag_coords(",
        "no_range_check": "expected ValueError",
    },
)


# ------------------------------------------------------------------------------------------- tv-layouts
def _tv_positions(run: Run, fn_name: str, who: str, threads: int, values: int, rows: int, cols: int):
    """The learner's TV layout, checked to be a Layout of (threads, values) whose positions tile the
    column-major rows x cols tile, each element once; returns the layout and {(t, v): position}."""
    n = rows * cols
    with run.case(
        f"{fn_name}() is a Layout of {threads} {who}s x {values} values",
        hint=f"make_layout((thread_shape, value_shape), (thread_stride, value_stride)): mode 0 "
        f"the {who}, mode 1 the value",
    ):
        fn = getattr(run.module(), fn_name, None)
        if not callable(fn):
            raise Failure(f"{fn_name} is missing or not a function")
        tv = fn()
        if not isinstance(tv, book_layout.Layout):
            raise Failure(f"{fn_name}() returned {tv!r} ({type(tv).__name__}), expected a Layout "
                          "of snippets/part6/layout.py (make_layout(shape, stride))")
        if tv.rank != 2:
            raise Failure(f"{fn_name}() = {tv} has {tv.rank} top-level mode(s), expected 2: "
                          f"({who}, value)")
        for mode, what, size in ((0, who, threads), (1, "value", values)):
            if tv[mode].size != size:
                raise Failure(f"{fn_name}() = {tv}: mode {mode} (the {what}) has size "
                              f"{tv[mode].size}, expected {size}")
    pos = {(t, v): tv((t, v)) for t in range(threads) for v in range(values)}
    with run.case(
        f"every element of the {rows} x {cols} tile is held once",
        hint=f"a position is r + {rows} c (column-major); each sub-mode of the {who} and of the "
        f"value needs a stride of its own, and no two (t, v) may reach the same position: work "
        f"out by hand where {who} 0 and {who} 1 start and where each value moves them",
    ):
        for (t, v), p in pos.items():
            if not 0 <= p < n:
                raise Failure(f"{fn_name}() = {tv}: ({who} {t}, value {v}) lands on position {p}, "
                              f"outside the {rows} x {cols} tile (positions 0 to {n - 1})")
        holders: dict[int, list] = {}
        for tv_pair, p in pos.items():
            holders.setdefault(p, []).append(tv_pair)
        twice = [p for p in sorted(holders) if len(holders[p]) > 1]
        if twice:
            p = twice[0]
            pairs = " and ".join(f"({who} {t}, value {v})" for t, v in holders[p])
            raise Failure(f"{fn_name}() = {tv}: position {p} (row {p % rows}, column {p // rows}) "
                          f"is held by {pairs}; {len(twice)} positions are held more than once and "
                          f"{n - len(holders)} never")
    return tv, pos


def _check_tv_elements(run: Run, tv, pos: dict, who: str, rows: int, cols: int, expected,
                       diagnoses, hint: str, what: str) -> None:
    """Every (t, v) lands on ``expected(t, v)`` = (row, column); ``diagnoses`` are (test, text)
    pairs, ``test(got)`` on {(t, v): (row, column)}, the first that holds explains a mismatch."""
    with run.case(f"every ({who}, value) against {what}", hint=hint):
        got = {tv_pair: (p % rows, p // rows) for tv_pair, p in pos.items()}
        bad = [tv_pair for tv_pair in pos if got[tv_pair] != expected(*tv_pair)]
        if not bad:
            return
        t, v = bad[0]
        (r, c), (er, ec) = got[(t, v)], expected(t, v)
        why = next((text for test, text in diagnoses if test(got)), "")
        raise Failure(f"{tv}: {who} {t}, value {v} lands on position {pos[(t, v)]} = (row {r}, "
                      f"column {c}), expected position {er + rows * ec} = (row {er}, column {ec}); "
                      f"{len(bad)} of {len(pos)} ({who}, value) pairs differ{why}")


def _row_major(pos: dict, cols: int, expected) -> bool:
    """Whether every (t, v) landed on the row-major position (row * cols + column) of its element."""
    return all(p == cols * expected(*k)[0] + expected(*k)[1] for k, p in pos.items())


def _check_tv_addresses(run: Run, tv, who: str, rows: int, cols: int, expected, memories) -> None:
    """composition(memory, tv) gives each (t, v) the offset of its element in each memory layout
    (``memories``: (description, Layout of the rows x cols tile))."""
    for desc, memory in memories:
        with run.case(
            f"composed with {desc}, every ({who}, value) gets its element's address",
            hint="composition(memory, tv)((t, v)) == memory(tv((t, v))): a layout with the right "
            "positions composes; simplify its modes if composition refuses it",
        ):
            try:
                addr = book_layout.composition(memory, tv)
            except ValueError as exc:
                raise Failure(f"composition({memory}, {tv}) is refused: {exc}") from exc
            for t in range(tv[0].size):
                for v in range(tv[1].size):
                    r, c = expected(t, v)
                    if addr((t, v)) != memory((r, c)):
                        raise Failure(f"composition({memory}, {tv}) = {addr} gives ({who} {t}, "
                                      f"value {v}) the offset {addr((t, v))}, expected "
                                      f"{memory((r, c))} (row {r}, column {c})")


def _copy_element(t: int, v: int) -> tuple[int, int]:
    """Exercise 1, from its words: thread t loads row t / 4, columns 4 (t % 4) + v."""
    return t // 4, 4 * (t % 4) + v


def _check_tv_copy(run: Run) -> None:
    tv, pos = _tv_positions(run, "copy_tv", "thread", 32, 4, 8, 16)

    def down_first(got):  # thread t took row t % 8 and column group t / 8
        return all(got[(t, v)] == _copy_element(4 * (t % 8) + t // 8, v) for t, v in got)

    _check_tv_elements(
        run, tv, pos, "thread", 8, 16, _copy_element,
        [(lambda got: _row_major(pos, 16, _copy_element),
          " (every position is 16 r + c, the row-major offset: the TV layout's positions are "
          "those of the column-major tile, r + 8 c; the row-major memory comes in by composition)"),
         (down_first, " (the threads go down the rows first: along the row first means t % 4, "
          "the first sub-mode, picks the group of columns and t / 4 the row)")],
        hint="thread t = t0 + 4 t1 (a 1-D coordinate splits with its first mode fastest): t0 picks "
        "the group of 4 columns, t1 the row; one column over is 8 positions",
        what="the copy: thread t loads row t / 4, columns 4 (t % 4) + v",
    )
    row_major = book_layout.make_layout((8, 16), (16, 1))
    _check_tv_addresses(run, tv, "thread", 8, 16, _copy_element,
                        [("the row-major 8 x 16 tile", row_major),
                         ("a row-major 8 x 16 tile of a matrix with 40 floats per row",
                          book_layout.make_layout((8, 16), (40, 1)))])
    with run.case(
        "each thread's 4 values are one contiguous float4 of the row-major tile",
        hint="the value mode of composition(row_major, tv) should coalesce to 4:1",
    ):
        values = book_layout.coalesce(book_layout.composition(row_major, tv)[1])
        if (values.shape, values.stride) != (4, 1):
            raise Failure(f"the value mode of composition({row_major}, {tv}) is {values}, "
                          "expected 4:1 (four consecutive floats)")


tv_copy = Exercise(
    id="part6.tv-layouts.1",
    title="The TV layout of a tiled copy",
    difficulty=1,
    kind="model",
    files=("part6/tv_copy.py",),
    task="Return copy_tv(): the TV layout of a tiled copy in which 32 threads each load 4 consecutive "
    "floats of one row of an 8 x 16 row-major tile, the threads going along the row first, then down the "
    "rows (thread t loads row t / 4, columns 4 (t % 4) + v for its value v). Its positions are those of "
    "the column-major 8 x 16 tile, r + 8 c; mode 0 is the thread, mode 1 the value. It must cover each "
    "element once, and composed with the row-major tile each thread's values are one float4.",
    hint="thread t = t0 + 4 t1, t0 = t % 4: give t0, t1 and the value a stride each, in positions "
    "r + 8 c",
    check=_check_tv_copy,
    planted={
        "row_major_position": "row-major offset",
        "threads_down_rows_first": "down the rows first",
        "value_stride_one": "is held by",
    },
)


def _mma_b_element(l: int, v: int) -> tuple[int, int]:
    """The PTX ISA's B fragment of mma.m16n8k16 (fp16/bf16): lane l's value v is at row (k)
    2 (l % 4) + (v & 1) + 8 (v >> 1), column (n) l / 4."""
    return 2 * (l % 4) + (v & 1) + 8 * (v >> 1), l // 4


def _mma_c_element(l: int, v: int) -> tuple[int, int]:
    """The accumulator's fragment (the chapter's SM80_16x8_Row) on the same 16 x 8 tile: row
    l / 4 + 8 (v >> 1), column 2 (l % 4) + (v & 1)."""
    return l // 4 + 8 * (v >> 1), 2 * (l % 4) + (v & 1)


def _check_tv_mma_b(run: Run) -> None:
    tv, pos = _tv_positions(run, "b_fragment", "lane", 32, 4, 16, 8)

    def right_elements_wrong_order(got):
        return all({got[(l, v)] for v in range(4)} == {_mma_b_element(l, v) for v in range(4)}
                   for l in range(32))

    _check_tv_elements(
        run, tv, pos, "lane", 16, 8, _mma_b_element,
        [(lambda got: _row_major(pos, 8, _mma_b_element),
          " (every position is 8 k + n, the row-major position: over the column-major 16 x 8 "
          "tile, element (k, n) is position k + 16 n)"),
         (lambda got: all(got[k] == _mma_c_element(*k) for k in got),
          " (this is the accumulator's layout, SM80_16x8_Row: in the B fragment lane l / 4 picks "
          "the column and l % 4 the pair of rows)"),
         (right_elements_wrong_order,
          " (every lane holds the right four elements, in the wrong order: value bit 0 is the next "
          "row, value bit 1 the row 8 further down)")],
        hint="lane l = t0 + 4 t1 (t0 = l % 4: a 1-D coordinate splits with its first mode "
        "fastest): write the position k + 16 n of each lane's value 0, then what value bits 0 and 1 "
        "add",
        what="the PTX ISA's rule: row 2 (l % 4) + (v & 1) + 8 (v >> 1), column l / 4",
    )
    _check_tv_addresses(run, tv, "lane", 16, 8, _mma_b_element,
                        [("B column-major (the .col operand: K contiguous, columns 24 elements apart)",
                          book_layout.make_layout((16, 8), (1, 24))),
                         ("B stored K x N row-major (40 elements per row)",
                          book_layout.make_layout((16, 8), (40, 1)))])


tv_mma_b = Exercise(
    id="part6.tv-layouts.2",
    title="The B fragment of mma.m16n8k16 as a TV layout",
    difficulty=1,
    kind="model",
    files=("part6/tv_mma_b.py",),
    task="Return b_fragment(): the B operand's fragment of mma.m16n8k16 (B is 16 x 8, K x N) as a TV "
    "layout over the column-major 16 x 8 tile, element (k, n) at position k + 16 n. Lane l holds four "
    "values of column l / 4, at rows 2 (l % 4), 2 (l % 4) + 1, 2 (l % 4) + 8 and 2 (l % 4) + 9, in that "
    "order; mode 0 is the lane, mode 1 the value.",
    hint="lane l = t0 + 4 t1, t0 = l % 4; the value is two bits, each with a stride of its own: "
    "((4, 8), (2, 2)) is the shape",
    check=_check_tv_mma_b,
    planted={
        "strides_swapped": "is held by",
        "row_major_position": "row-major position",
        "value_modes_swapped": "wrong order",
        "accumulator_layout": "accumulator's layout",
    },
)


# -------------------------------------------------------------------------------------------- fp8-gemm.5
_E4M3 = torch.float8_e4m3fn
_SB = 128  # the scale block: 1 x 128 of A, 128 x 128 of B


def _fp8_values(rows: int, cols: int, g: torch.Generator) -> torch.Tensor:
    """e4m3 values over most of the format's range, as a quantised block's are."""
    return (torch.randn(rows, cols, generator=g) * 100).clamp(-448, 448).to(_E4M3)


def _spread_scales(rows: int, cols: int, g: torch.Generator) -> torch.Tensor:
    """fp32 scales that differ by powers of two from 2^-8 to 2^8 from block to block: a kernel that
    takes another block's scale, or one scale for all of K, is off by far more than rounding."""
    return (2.0 ** torch.randint(-8, 9, (rows, cols), generator=g)
            * (1 + torch.rand(rows, cols, generator=g))).float()


def _promoted(parts: torch.Tensor, a_sc: torch.Tensor, b_sc: torch.Tensor,
              carried: bool = False) -> torch.Tensor:
    """The sum over K-blocks kb of parts[kb] (that block's M x N product) times a_sc[m, kb] and
    b_sc[n, kb], in float64; ``carried``: each block's temporary still holds the earlier blocks'."""
    if carried:
        parts = parts.cumsum(0)
    return torch.einsum("kmn,mk,nk->mn", parts, a_sc, b_sc)


def _fp8_diagnosis(got, parts, rel, a_wide, b_wide, m, n, kb):
    """What a wrong C is, when it is one of the classic bugs: (text, hint) or None. ``a_wide`` and
    ``b_wide`` are the matrices the scales are views of (columns 1..kb; B's first ceil(N/128) rows)."""
    sizes = parts.abs()
    per_row = b_wide[:-(-n // _SB), 1:kb + 1].repeat_interleave(_SB, 0)[:n]  # column n: row n // 128
    a_sc = a_wide[:, 1:kb + 1]
    promote = ("each K-block's temporary is multiplied by a_scales[m, kb] * b_scales[n // 128, kb] "
               "before it is added into acc")
    candidates = [
        (a_sc, per_row, True,
         "C is what a temporary that keeps the earlier K-blocks' products gives: each block's sum "
         "was added to theirs and all of it promoted again with this block's scales (the temporary "
         "was not reset)",
         "tmp = tl.dot(a, b) starts from zero in every K-block (the CUDA kernel's first wgmma has "
         "scale-d = 0 for that); tl.dot(a, b, tmp) adds to the old one"),
        (a_wide[:, 2:kb + 2], per_row, False,
         "C is what A's scales of K-block kb + 1 give for the products of K-block kb: off by one",
         "K-block kb holds k = 128 kb .. 128 kb + 127, and its scale is a_scales[m, kb] "
         "(as_ptr + m * stride_asm + kb * stride_ask)"),
        (a_wide[:, 0:kb], per_row, False,
         "C is what A's scales of K-block kb - 1 give for the products of K-block kb: off by one",
         "K-block kb holds k = 128 kb .. 128 kb + 127, and its scale is a_scales[m, kb] "
         "(as_ptr + m * stride_asm + kb * stride_ask)"),
        (a_sc, b_wide[:n, 1:kb + 1], False,
         "C is what B's scales read from row n of b_scales give: b_scales has one row per 128 x 128 "
         "block of B, so column n of C takes row n // 128",
         "column n's scale is in row n // 128: bs_ptr + (offs_n // 128) * stride_bsn + kb * "
         "stride_bsk"),
        (a_sc, b_wide[:-(-n // _SB), 2:kb + 2].repeat_interleave(_SB, 0)[:n], False,
         "C is what B's scales of K-block kb + 1 give for the products of K-block kb: off by one",
         "b_scales[n // 128, kb] belongs to the products of K-block kb"),
        (a_sc, b_wide[:-(-n // _SB), 0:kb].repeat_interleave(_SB, 0)[:n], False,
         "C is what B's scales of K-block kb - 1 give for the products of K-block kb: off by one",
         "b_scales[n // 128, kb] belongs to the products of K-block kb"),
        (torch.ones_like(a_sc), torch.ones_like(per_row), False,
         "C is the product of the e4m3 values with no scale at all: " + promote, None),
    ]
    candidates += [
        (a_sc[:, j:j + 1].expand(m, kb), per_row[:, j:j + 1].expand(n, kb), False,
         f"C is the sum of all the e4m3 products times the scales of K-block {j} alone: the scales "
         "were applied once, as if per tensor. With block scales they differ from one K-block to the "
         "next, so only a block's own sum can be scaled at once: " + promote,
         "the scales go inside the K loop, one multiply per K-block: the promotion")
        for j in (0, kb - 1)]
    for a_s, b_s, carried, text, hint in candidates:
        want = _promoted(parts, a_s, b_s, carried)
        tol = rel * _promoted(sizes, a_s.abs(), b_s.abs(), carried)
        if bool(((got - want).abs() <= tol).all()):
            return text, hint
    return None


def _fp8_gemm_case(run: Run, what: str, m: int, n: int, k: int, seed: int,
                   a_m_major: bool = False, pad: int = 0) -> None:
    kb, nb = k // _SB, -(-n // _SB)
    label = (f"M = {m}, N = {n}, K = {k} ({kb} K-block{'s' if kb > 1 else ''}, {nb} block "
             f"row{'s' if nb > 1 else ''} of B's scales){what}")
    with run.case(label):
        fn = getattr(run.module(), "fp8_gemm_blockscaled", None)
        if not callable(fn):
            raise Failure("fp8_gemm_blockscaled is missing or not a function")
        g = gen(seed)
        a_rows, b_rows = _fp8_values(m, k + pad, g), _fp8_values(n, k + pad, g)  # rows padded by pad
        # A's scales are columns 1..kb of a wider matrix (row-major, or M-major as cuBLAS wants them)
        # and B's the first ceil(N / 128) rows of an N-row one: the kernel must use their strides,
        # and a scale read from the wrong K-block or from row n of B's stays inside the tensors, so
        # the check can say which one it was.
        a_store = _spread_scales(kb + 2, m, g) if a_m_major else _spread_scales(m, kb + 2, g)
        b_store = _spread_scales(n, kb + 2, g)
        dev = run.device
        a_d, b_d = a_rows.to(dev)[:, :k], b_rows.to(dev)[:, :k]
        a_wide_d = a_store.to(dev).t() if a_m_major else a_store.to(dev)
        out = Output((m, n), dev, row_pad=3, name="c")
        fn(a_d, a_wide_d[:, 1:kb + 1], b_d, b_store.to(dev)[:nb, 1:kb + 1], out.tensor)
        got = out.check().double()

        a_wide = (a_store.t() if a_m_major else a_store).double()
        b_wide = b_store.double()
        a8, b8 = a_rows[:, :k].double(), b_rows[:, :k].double()
        # The reference: dequantise (every element times its block's scales), one float64 product.
        a_deq = a8 * a_wide[:, 1:kb + 1].repeat_interleave(_SB, 1)
        b_deq = b8 * b_wide[:nb, 1:kb + 1].repeat_interleave(_SB, 0)[:n].repeat_interleave(_SB, 1)
        ref = a_deq @ b_deq.T
        # Rounding errors scale with the sum of the products' magnitudes. The interpreter sums a
        # block's 128 products in fp32; a GPU's tensor cores sum them in a narrower accumulator.
        rel = 2e-3 if run.on_gpu else 1e-5
        tol = rel * (a_deq.abs() @ b_deq.abs().T)
        bad = ~((got - ref).abs() <= tol)  # a NaN is bad
        if not bool(bad.any()):
            return
        where = bad.nonzero()
        i, j = (int(x) for x in where[0])
        gv, ev = float(got[i, j]), float(ref[i, j])
        why = (" (nan: an element the kernel never wrote, or a scale that is NaN)" if math.isnan(gv)
               else f" (|difference| {abs(gv - ev):.3g} > tolerance {float(tol[i, j]):.3g})")
        rows = sorted({int(r) for r in where[:, 0]})
        cols = sorted({int(c) for c in where[:, 1]})
        msg = (f"c[{i}, {j}] = {gv:.6g}, expected {ev:.6g}{why}; {where.shape[0]} of {m * n} "
               f"elements differ (rows {compare.span(rows)}, columns {compare.span(cols)})")
        hint = None
        if bool((got == 0).all()):
            msg += "; C is all zeros: nothing was added into acc"
        else:
            parts = torch.einsum("mkc,nkc->kmn", a8.reshape(m, kb, _SB), b8.reshape(n, kb, _SB))
            found = _fp8_diagnosis(got, parts, rel, a_wide, b_wide, m, n, kb)
            if found:
                msg += f"; {found[0]}"
                hint = found[1]
        raise Failure(msg, hint)


def _check_fp8_blockscaled(run: Run) -> None:
    _fp8_gemm_case(run, ", ragged tiles", 5, 72, 128, seed=70)
    _fp8_gemm_case(run, ", B's last block row short, rows of A and B padded to K + 16", 37, 300,
                   640, seed=71, pad=16)
    _fp8_gemm_case(run, ", A's scales M-major (strides (1, M))", 1, 129, 1024, seed=72,
                   a_m_major=True)
    _fp8_gemm_case(run, ", A's scales M-major, rows padded", 48, 256, 384, seed=73, a_m_major=True,
                   pad=32)


fp8_blockscaled = Exercise(
    id="part6.fp8-gemm.5",
    title="The block-scaled GEMM's K loop, promoted every 128",
    difficulty=3,
    kind="triton",
    files=("part6/fp8_blockscaled.py",),
    task="Write the K loop of the block-scaled FP8 GEMM (DeepSeek-V3's recipe, as v1's BLOCKWISE "
    "branch runs it): A is M x K e4m3 with one fp32 scale per 1 x 128 block (a_scales, M x K/128), B "
    "is N x K e4m3 with one per 128 x 128 block (b_scales, ceil(N/128) x K/128). For every K-block kb "
    "of 128, the block's product goes into a temporary that starts from zero and is promoted: "
    "multiplied by a_scale[m, kb] * b_scale[n // 128, kb] and added into the fp32 accumulator. C is "
    "checked against a float64 dequantise-then-multiply, on ragged M and N, one K-block and many, "
    "scales that differ by powers of two from block to block, read through their strides.",
    hint="per K-block: a (BLOCK_M, 128) tile of A and the (128, BLOCK_N) tile of B^T "
    "(b_ptr + n * stride_bn + k), masked on M and N; tmp = tl.dot(a, b); a_s = a_scales[offs_m, kb] "
    "and b_s = b_scales[offs_n // 128, kb] through their strides; acc += tmp * a_s[:, None] * "
    "b_s[None, :]",
    check=_check_fp8_blockscaled,
    planted={
        "b_scale_by_n": "row n of b_scales",
        "scales_once_per_tensor": "as if per tensor",
        "a_scale_next_block": "K-block kb + 1",
        "temporary_not_reset": "was not reset",
    },
)


# -------------------------------------------------------------------------------------------- fp8-gemm.7
def _lean_offsets(cfg, consumer: int, stage: int, slice_: int, kk: int) -> tuple[int, int]:
    """fp8_gemm v6's offsets from its two base descriptors, from the launcher's config: the stage's
    bytes, consumer c's 64 rows of A, slice p of B (block_n / 2 rows), the K step's 32 bytes."""
    row = cfg.block_k  # one byte per e4m3 value: a row of a K-block is block_k bytes
    s = stage * cfg.stage_bytes
    return ((s + consumer * 64 * row + kk * 32) // 16,
            (s + slice_ * (cfg.block_n // 2) * row + kk * 32) // 16)


def _largest_start(cfg, smem_limit: int) -> int:
    """The launcher's allocation (cfg.smem_bytes) placed as late as smem_limit allows, the tiles at
    the next 1024, then the last stage's second slice of B at the last K step."""
    base = -(-(smem_limit - cfg.smem_bytes) // 1024) * 1024
    return (base + (cfg.stages - 1) * cfg.stage_bytes + cfg.block_m * cfg.block_k
            + (cfg.block_n // 2) * cfg.block_k + (cfg.block_k // 32 - 1) * 32)


def _check_lean_offsets(run: Run) -> None:
    from snippets.part6.fp8_gemm import CudaConfig
    from snippets.part6.fp8_gemm_wide import SLICED_CONFIG, WIDE_CONFIG

    mod = run.module()
    configs = {"v6 (128 x 192, 5 stages)": SLICED_CONFIG, "blockscaled v6 (128 x 256, 4 stages)": WIDE_CONFIG,
               "128 x 128, 6 stages": CudaConfig()}
    for label, cfg in configs.items():
        with run.case(
            f"offsets() of {label}: both consumers, every stage, both slices, every K step",
            hint="a stage is (128 + block_n) rows of 128 bytes, A's rows first; consumer c's rows of A start "
            "c * 64 rows in, slice p of B starts p * block_n / 2 rows into B; a K step is 32 bytes of each "
            "row; everything divided by 16 at the end",
        ):
            cases = [(cfg.block_n, c, s, p, kk) for c in range(2) for s in range(cfg.stages)
                     for p in range(2) for kk in range(cfg.block_k // 32)]
            compare.functions("offsets", getattr(mod, "offsets", None),
                              lambda n, c, s, p, kk, cfg=cfg: _lean_offsets(cfg, c, s, p, kk), cases)
    limits = (book_hopper.SMEM_LIMIT_SM90, 220 * 1024, 216 * 1024 + 16)
    with run.case(
        f"largest_start() of the three at shared-memory limits {', '.join(map(str, limits))} bytes",
        hint="the allocation is stages * stage bytes + 1024 + 16 * stages; it starts at most at the limit "
        "minus that, the tiles at the next multiple of 1024 (round up), and the last descriptor is the "
        "last stage's second slice of B at the last K step",
    ):
        cases = [(cfg.block_n, cfg.stages, lim) for cfg in configs.values() for lim in limits
                 if cfg.smem_bytes <= lim]
        by_shape = {(cfg.block_n, cfg.stages): cfg for cfg in configs.values()}
        compare.functions("largest_start", getattr(mod, "largest_start", None),
                          lambda n, st, lim: _largest_start(by_shape[(n, st)], lim), cases)


lean_offsets = Exercise(
    id="part6.fp8-gemm.7",
    title="v6's descriptor offsets, and how far the window reaches",
    difficulty=2,
    kind="model",
    files=("part6/lean_offsets.py",),
    task="fp8_gemm v6 adds offsets to two base descriptors instead of building each one. Write "
    "offsets(block_n, consumer, stage, slice_, kk): the 16-byte units it adds to consumer 0's rows of A "
    "and to B's first slice (both of stage 0) for a consumer's rows, a stage, a slice and a K step; and "
    "largest_start(block_n, stages, smem_limit): the largest address in any descriptor when the dynamic "
    "shared memory starts as late as the limit allows. Checked against the launchers' configs.",
    hint="stage bytes (128 + block_n) * 128; A: stage + consumer * 64 * 128 + kk * 32; B: stage + slice * "
    "block_n / 2 * 128 + kk * 32; both // 16. The allocation's latest start rounds up to 1024",
    check=_check_lean_offsets,
    planted={
        "bytes_not_units": "offsets(",
        "slice_on_a": "offsets(",
        "floor_not_ceil": "largest_start(",
    },
)


# ------------------------------------------------------------------------------------------ hopper-gemm.9
_QUAD_MASKS = [1, 1, 2, 2]  # quad_transpose: round 1 two shuffles with lane q ^ 1, round 2 two with q ^ 2


def _kernel_rounds(words: list[list[int]]):
    """quad_transpose of hopper_gemm.cu, transcribed: for each round k = 1, 2, the lanes' words
    before it and the words each lane sends in it; and the lanes' words at the end."""
    w = [list(lane) for lane in words]
    rounds = []
    for k in (1, 2):
        before = [list(lane) for lane in w]
        sent: dict[int, list[int]] = {q: [] for q in range(4)}
        for s in range(4):
            if s & k:
                continue
            send = [w[q][s] if q & k else w[q][s ^ k] for q in range(4)]  # __shfl_xor_sync(.., k)
            for q in range(4):
                sent[q].append(send[q])
                if q & k:
                    w[q][s] = send[q ^ k]
                else:
                    w[q][s ^ k] = send[q ^ k]
        rounds.append((k, before, sent))
    return rounds, w


def _transposed(words: list[list[int]]) -> list[list[int]]:
    """What store_acc16 needs: lane q's slot p holds lane p's word of group 4g + q."""
    return [[words[p][q] for p in range(4)] for q in range(4)]


class _Shuffles:
    """An instrumented shfl_xor_sync(send, mask) for the quad: records every call (mask, what each
    lane passed) and, when ``track`` (the words all differ), refuses a word a lane does not hold:
    its own four and those earlier shuffles gave it."""

    def __init__(self, words: list[list[int]], who, track: bool = True):
        self.calls: list[tuple[int, list[int]]] = []
        self.held = [set(lane) for lane in words]
        self.who, self.track = who, track

    def __call__(self, send, mask):
        n = len(self.calls) + 1
        if not isinstance(mask, int) or not 0 <= mask < 4:
            raise Failure(f"shuffle {n} was called with mask {mask!r}: lane q ^ mask must be a lane of the "
                          "quad, so the mask is 1, 2 or 3", hint="shfl_xor_sync(send, k): k is the round's "
                          "lane offset, 1 in round 1 and 2 in round 2")
        try:
            send = list(send)
        except TypeError:
            send = [send]
        if len(send) != 4:
            raise Failure(f"shuffle {n} (mask {mask}) was passed {len(send)} word(s): every lane of the "
                          "quad takes part in every __shfl_xor_sync, so send holds 4 words, lane q's at "
                          "send[q]", hint="build send = [word lane 0 passes, ..., word lane 3 passes] and "
                          "call shfl_xor_sync(send, k) once for the whole quad")
        if self.track:
            for q, x in enumerate(send):
                if x not in self.held[q]:
                    raise Failure(f"in shuffle {n} (mask {mask}) lane {q} passed {self.who(x)}, a word it "
                                  "does not hold: a lane has only its own four words and those the "
                                  "shuffles gave it",
                                  hint=f"lane q passes one of its own registers, w[q][slot]; it "
                                  f"cannot read another lane's list (w[q ^ {mask}]): that is what the "
                                  "shuffle is for")
        got = [send[q ^ mask] for q in range(4)]
        for q in range(4):
            self.held[q].add(got[q])
        self.calls.append((mask, send))
        return list(got)


def _quad_lanes(got, call: str) -> list[list[int]]:
    if (not isinstance(got, (list, tuple)) or len(got) != 4
            or any(not isinstance(lane, (list, tuple)) or len(lane) != 4 for lane in got)):
        why = " (return the lanes' words at the end)" if got is None else ""
        raise Failure(f"{call} returned {got!r}{why}; expected the four lanes' words afterwards: a list "
                      "of 4 lists of 4 words, lane q's at index q")
    return [list(lane) for lane in got]


def _mask_text(masks: list[int]) -> str:
    return ", ".join(str(m) for m in masks) or "none"


def _quad_diagnosis(calls, words, mine, who) -> tuple[str, str]:
    """Why ``mine`` is not the transpose of ``words``, from the shuffles (masks already right):
    the first round in which a lane sent other words than the kernel's lane, or the last round's
    receiving. Returns (text, hint)."""
    rounds, _ = _kernel_rounds(words)
    rule = ("in round k, of each pair of slots (s, s ^ k), lane q sends the slot x with x & k != q & k "
            "(the slot its partner keeps) and receives into that same slot")
    for r, (k, before, sent) in enumerate(rounds):
        mine_sent = {q: [send[q] for _, send in calls[2 * r:2 * r + 2]] for q in range(4)}
        for q in range(4):
            if sorted(mine_sent[q]) == sorted(sent[q]):
                continue

            def slots(ws, q=q, before=before):
                return [before[q].index(x) if x in before[q] else None for x in ws]

            def desc(ws, q=q, before=before):
                return " and ".join(f"slot {before[q].index(x)} ({who(x)})" if x in before[q]
                                    else who(x) for x in ws)

            kept = sorted(x for x in range(4) if (x & k) == (q & k))
            text = (f"round {r + 1} (mask {k}): lane {q} sent {desc(mine_sent[q])}, expected "
                    f"{desc(sent[q])}")
            if sorted(s for s in slots(mine_sent[q]) if s is not None) == kept:
                text += (f": it sent slots {kept[0]} and {kept[1]}, the ones it keeps (their bit {k // 2} "
                         f"equals bit {k // 2} of lane {q}), so each lane overwrote the words its "
                         "partner needed")
            if r > 0:
                text += ("; every lane's sends in round 1 were right, so round 1 put a received word in "
                         "the wrong slot (a lane receives into the slot it sent), or round 2 sends the "
                         "wrong slots")
            return text, rule
    want = _transposed(words)
    q, p = next((q, p) for q in range(4) for p in range(4) if mine[q][p] != want[q][p])
    return (f"lane {q} ends with {who(mine[q][p])} in slot {p}, expected {who(want[q][p])}; every "
            "shuffle sent the right words, so the last round put a received word in the wrong slot (a "
            "lane receives into the slot it sent)", rule)


def _check_quad_transpose(run: Run) -> None:
    fn = getattr(run.module(), "quad_transpose", None)
    if not callable(fn):
        raise Failure("quad_transpose is missing or not a function")
    rng = random.Random(69)
    labels = rng.sample(range(1 << 32), 16)
    words = [[labels[4 * a + i] for i in range(4)] for a in range(4)]
    owner = {labels[4 * a + i]: (a, i) for a in range(4) for i in range(4)}

    def who(x) -> str:
        if x in owner:
            return f"lane {owner[x][0]}'s word of group 4g + {owner[x][1]}"
        return f"{x!r} (a word no lane held)"

    shfl = _Shuffles(words, who)
    call = "quad_transpose(16 different words)"
    with run.case(
        "two rounds of __shfl_xor_sync (masks 1, 1, 2, 2), each lane passing only words it holds",
        hint="round 1: for s in (0, 2), one shfl_xor_sync(send, 1) each; round 2: for s in (0, 1), "
        "one shfl_xor_sync(send, 2) each",
    ):
        mine = _quad_lanes(fn([list(lane) for lane in words], shfl_xor_sync=shfl), call)
        masks = [m for m, _ in shfl.calls]
        if not masks:
            raise Failure(f"{call} never called shfl_xor_sync: a lane sees only its own four registers, "
                          "and words move between lanes only through the shuffles",
                          hint="lane q may read w[q] only; every word it gets from another lane comes "
                          "back from a shfl_xor_sync(send, k) of the whole quad")
        if masks != _QUAD_MASKS:
            right = "the result is right" if mine == _transposed(words) else "the result is wrong"
            text = (f"{call} made {len(masks)} shuffle(s) with masks {_mask_text(masks)}, expected 4 "
                    "with masks 1, 1, 2, 2: round 1 trades with lane q ^ 1 (one shuffle per pair of "
                    "slots), round 2 with lane q ^ 2")
            if sorted(masks) == _QUAD_MASKS:
                text += (f" ({right}: each round swaps the bit k selects in the lane with that bit of the slot, so the "
                         "two rounds commute; but the kernel's round 1 is the one with lane q ^ 1, and "
                         "so is the chapter's answer for lane 2)")
            raise Failure(text, hint="for k in (1, 2): two shuffles with mask k, one for each pair of "
                          "slots (s, s ^ k) with s & k == 0")
        for q in range(4):
            for p in range(4):
                if mine[q][p] not in shfl.held[q]:
                    raise Failure(f"lane {q} ends with {who(mine[q][p])} in slot {p}, a word that never "
                                  "reached it through a shuffle: a lane sees only its own registers",
                                  hint="every word lane q ends with is one it had or one a "
                                  "shfl_xor_sync returned to it (got[q])")
    with run.case(
        "16 different words: lane q ends with lane p's word of group 4g + q in slot p",
        hint="in round k, of each pair (s, s ^ k), the upper lane (q & k set) sends slot s and receives "
        "into it, the lower lane sends slot s ^ k and receives into it",
    ):
        if mine != _transposed(words):
            text, hint = _quad_diagnosis(shfl.calls, words, mine, who)
            raise Failure(f"{call}: {text}", hint=hint)
    trials = 300
    with run.case(
        f"{trials} sets of random words, repeated values among them",
        hint="the words are data: which slot a lane sends and where it puts what it gets depend only "
        "on q, k and s",
    ):
        for t in range(trials):
            pool = [rng.getrandbits(32) for _ in range(3 if t % 3 == 0 else 16)] + [0, 0xFFFFFFFF]
            w = [[rng.choice(pool) for _ in range(4)] for _ in range(4)]
            got = _quad_lanes(fn([list(lane) for lane in w],
                                 shfl_xor_sync=_Shuffles(w, who, track=False)),
                              f"quad_transpose({w})")
            want = _transposed(w)
            if got != want:
                q, p = next((q, p) for q in range(4) for p in range(4) if got[q][p] != want[q][p])
                raise Failure(f"quad_transpose({w}) leaves {got[q][p]:#x} in lane {q}'s slot {p}, "
                              f"expected {want[q][p]:#x} (lane {p}'s word of group 4g + {q})")
    n = 256
    with run.case(
        f"store_acc16 with this quad_transpose: every 16-byte store of a 64 x {n} tile holds the 8 "
        "columns it writes, in order",
        hint="a word packs the bf16 of columns 2q and 2q + 1 (pack_bf16x2); after the transpose lane q "
        "stores slots 0..3 at columns 8 (4g + q) .. 8 (4g + q) + 7",
    ):
        for warp in range(4):
            for quad in range(8):
                r = 16 * warp + quad
                for g in range(n // 32):
                    for row in (r, r + 8):  # lo and hi: rows r and r + 8
                        # lane q's word of group 4g + i: columns 8 (4g + i) + 2q and + 1 of this row
                        w = [[(row * n + 8 * (4 * g + i) + 2 * q)
                              | (row * n + 8 * (4 * g + i) + 2 * q + 1) << 16 for i in range(4)]
                             for q in range(4)]
                        got = _quad_lanes(fn(w, shfl_xor_sync=_Shuffles(w, who, track=False)),
                                          "quad_transpose")
                        for q in range(4):
                            c = 8 * (4 * g + q)
                            held = [(e // n, e % n) for x in got[q] for e in (x & 0xFFFF, x >> 16)]
                            if held != [(row, c + j) for j in range(8)]:
                                raise Failure(f"warp {warp}, lane {4 * quad + q}: the store of row {row} "
                                              f"at columns {c}..{c + 7} holds (row, column) {held}")


quad_transpose = Exercise(
    id="part6.hopper-gemm.9",
    title="The quad transpose of store_acc16",
    difficulty=2,
    kind="model",
    files=("part6/quad_transpose.py",),
    task="Write quad_transpose(w): v9's two rounds of __shfl_xor_sync over the four lanes of a quad, as "
    "hopper_gemm.cu's quad_transpose does them. w[q][i] is lane q's word of group 4g + i (two bf16 of row "
    "r at columns 2q, 2q + 1 of that group of 8); afterwards lane q's slot p must hold lane p's word of "
    "group 4g + q, so that lane q has all 8 columns of one group for one 16-byte store. A lane sees only "
    "its own four words: words move between lanes only through shfl_xor_sync(send, mask), one "
    "__shfl_xor_sync of the whole quad (send[q] is what lane q passes; lane q gets lane q ^ mask's). "
    "Round 1 trades with lane q ^ 1, round 2 with lane q ^ 2, one shuffle per pair of slots (s, s ^ k) "
    "with s & k == 0: four shuffles in all, masks 1, 1, 2, 2. The check passes its own "
    "shfl_xor_sync, which records every shuffle.",
    hint="in round k, of each pair (s, s ^ k), lane q keeps the slot x with x & k == q & k and sends "
    "the other one (the slot its partner keeps); what comes back, got[q], goes into the slot it sent",
    check=_check_quad_transpose,
    planted={
        "rounds_swapped": "masks 2, 2, 1, 1",
        "sends_kept_slot": "the ones it keeps",
        "receives_into_kept_slot": "put a received word in the wrong slot",
        "reads_other_lanes": "never called shfl_xor_sync",
    },
)


# ------------------------------------------------------------------------------------------- cute-gemm.7
def _sw128_layout(block_m: int, block_k: int, stages: int, itemsize: int):
    """tile_to_shape(Layout_K_SW128_Atom<T>, (block_m, block_k, stages)) built with the book's layout
    algebra: the atom (8 rows of 128 bytes, K contiguous) padded to rank 3, a blocked product with the
    column-major layout of the copies (M first, then K, then stages), coalesced mode by mode; the
    swizzle acts on its offset times the element size."""
    width = 128 // itemsize
    atom = book_layout.make_layout((8, width, 1), (width, 1, 0))
    copies = book_layout.make_layout((block_m // 8, block_k // width, stages))
    tiled = book_layout.coalesce(book_layout.blocked_product(atom, copies), (1, 1, 1))
    swizzle = book_layout.Swizzle(3, 4, 3)
    return {
        "right": lambda m, k, s: swizzle(tiled((m, k, s)) * itemsize),
        "these are the offsets without the swizzle: row r of an atom must have its 16-byte chunks permuted "
        "(chunk c at c ^ r), which is what lets wgmma and TMA reach 8 rows without bank conflicts":
            lambda m, k, s: tiled((m, k, s)) * itemsize,
        "these are Swizzle<3,4,3> of the element offset, times the element size: the 128-byte swizzle acts on "
        "byte offsets (bits 4-6 name a 16-byte chunk, bits 7-9 a 128-byte row), so the element offset must "
        "become bytes before the swizzle":
            lambda m, k, s: swizzle(tiled((m, k, s))) * itemsize,
    }


def _check_smem_layout(run: Run) -> None:
    mine = getattr(run.module(), "smem_offset", None)
    # (what, block_m, block_k, stages, itemsize, the stages checked, hint)
    cases = (
        ("the chapter's SmemLayoutA: bf16, 128 x 64, 4 stages (every element of stages 0 and 2)", 128, 64, 4, 2,
         (0, 2), "one stage is 16 atoms of 8 rows x 128 bytes down M, 16 KiB, so stage s starts at s x 16384 "
                 "bytes; inside an atom, row r's 16-byte chunk c lands in chunk c ^ r (sw128 of the byte offset, "
                 "not of the element offset)"),
        ("SmemLayoutB: bf16, 256 x 64 (N x K), 4 stages (stages 1 and 3)", 256, 64, 4, 2, (1, 3),
         "a stage of B is 32 atoms, 32 KiB: stage s starts at s * block_m * block_k * itemsize bytes"),
        ("fp8: 128 x 128, 2 stages (one atom holds 128 one-byte elements along K)", 128, 128, 2, 1, (0, 1),
         "an atom row is 128 bytes whatever the type: 128 / itemsize elements"),
        ("bf16: 128 x 128, 3 stages (two atoms along K: tile_to_shape goes down M first)", 128, 128, 3, 2, (0, 2),
         "tile_to_shape's copies are in column-major order: atom (i, j) of a stage, i down M and j along K, is "
         "copy i + (block_m / 8) * j, so the second half of K starts after all of M's atoms"),
        ("fp32: 64 x 64, 2 stages (two atoms of 32 elements along K)", 64, 64, 2, 4, (0, 1),
         "32 fp32 make an atom row; k // 32 picks the atom column, k % 32 the element in it"),
    )
    for what, bm, bk, stages, itemsize, checked, hint in cases:
        models = _sw128_layout(bm, bk, stages, itemsize)
        ref = models.pop("right")
        calls = [(m, k, s, bm, bk, itemsize) for s in checked for m in range(bm) for k in range(bk)]
        with run.case(what, hint=hint):
            try:
                compare.functions("smem_offset", mine, lambda m, k, s, bm_, bk_, i_, f=ref: f(m, k, s), calls)
            except Failure as exc:
                for why, wrong in models.items():  # a classic mistake, recognised: say which
                    try:
                        if all(mine(*c) == wrong(*c[:3]) for c in calls):
                            raise Failure(f"{exc.message}: {why}") from exc
                    except Failure:
                        raise
                    except Exception:  # noqa: BLE001 (the learner's function raised: the first message says so)
                        break
                raise


smem_layout = Exercise(
    id="part6.cute-gemm.7",
    title="The byte offsets behind SmemLayoutA",
    difficulty=2,
    kind="model",
    files=("part6/smem_layout.py",),
    task="The CuTe kernel declares its shared memory as tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{}, "
    "(BLOCK_M, BLOCK_K, STAGES)) and never computes an address by hand. Compute what that type stands for: "
    "smem_offset(m, k, stage, block_m, block_k, itemsize), the byte offset from the buffer's 1024-byte "
    "aligned base of element (m, k) of a stage. The atom is 8 rows of 128 bytes (128 / itemsize elements "
    "along K, contiguous) under the 128-byte swizzle, Swizzle<3,4,3> on the byte offset (sw128, given); "
    "tile_to_shape repeats the atom down M first, then along K, then over the stages. The check compares "
    "every element of A's and B's layouts in bf16, and tiles in fp8 and fp32 and with two atoms along K, "
    "with the same layout built from the book's layout algebra (blocked_product, coalesce, Swizzle).",
    hint="width = 128 // itemsize; atom = m // 8 + (block_m // 8) * (k // width) + (block_m // 8) * "
    "(block_k // width) * stage; sw128(atom * 1024 + (m % 8) * 128 + (k % width) * itemsize)",
    check=_check_smem_layout,
    planted={
        "no_swizzle": "without the swizzle",
        "swizzle_elements": "element offset",
        "stage_elements": "stages 0 and 2",
        "k_first": "two atoms along K",
    },
)


# ------------------------------------------------------------------------------------------- fp8-attention.6
def _heads_data() -> list[tuple[str, torch.Tensor]]:
    """(B, H, S, D) tensors whose heads differ in magnitude, with the awkward cases of the top binade."""
    g = gen(68)
    mags = torch.tensor([1e-3, 1.0, 37.0, 5e3]).reshape(1, 4, 1, 1)
    outlier = torch.randn(2, 3, 40, 64, generator=g)
    outlier[1, 2, 7, 5] = 900.0  # one head's amax set by one value
    edges = torch.rand(1, 4, 8, 16, generator=g) * 100
    edges[0, 0, 0, 0] = 448.0  # exactly the top: scale 1
    edges[0, 1, 0, 0] = 224.0 * 2.0**-3  # the open end of a binade: 28 must map to 448 (scale 2^-4), not to 224
    edges[0, 1].clamp_(max=28.0)
    edges[0, 2, 0, 0] = 449.0  # just past the top: scale 2
    edges[0, 3] *= 2.0**-20  # small values: scale 2^-k
    zero_head = torch.randn(2, 2, 16, 64, generator=g)
    zero_head[0, 1] = 0.0
    return [
        ("4 heads of magnitudes 1e-3 to 5e3, S = 50, D = 64", torch.randn(1, 4, 50, 64, generator=g) * mags),
        ("randn, B = 2, H = 3, one outlier of 900 in head (1, 2)", outlier),
        ("heads whose largest magnitude is exactly 448, exactly 28 = 224 / 8 (it must map to 448: the binade is "
         "open at 224), just past 448, and tiny", edges),
        ("a head of zeros (its scale must stay a finite power of two)", zero_head),
        ("bf16 input, heads of magnitude 1 to 1000", (torch.randn(2, 2, 33, 128, generator=g)
                                                      * torch.tensor([1.0, 1e3]).reshape(1, 2, 1, 1)).bfloat16()),
    ]


def _check_heads(name: str, x: torch.Tensor, out) -> tuple[torch.Tensor, torch.Tensor]:
    """The learner's (x8, scale) for x: shapes and dtypes, one power of two per head that puts the head's amax
    in (224, 448], and the codes of x / scale."""
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise Failure(f"{name} should return (x8, scale), got {type(out).__name__}")
    x8, scale = out
    b, h = x.shape[:2]
    if not isinstance(scale, torch.Tensor) or tuple(scale.shape) != (b, h) or scale.dtype != torch.float32:
        raise Failure(f"{name}: scale should be an fp32 tensor of shape ({b}, {h}), one per (batch, head), got "
                      f"{getattr(scale, 'dtype', type(scale).__name__)} {tuple(getattr(scale, 'shape', ()))}")
    if not isinstance(x8, torch.Tensor) or x8.dtype != torch.float8_e4m3fn or x8.shape != x.shape:
        raise Failure(f"{name}: x8 should be a float8_e4m3fn tensor of shape {tuple(x.shape)}, got "
                      f"{getattr(x8, 'dtype', type(x8).__name__)} {tuple(getattr(x8, 'shape', ()))}")
    amax = x.double().abs().flatten(2).amax(dim=2)
    for i in range(b):
        for j in range(h):
            s = float(scale[i, j])
            if not (math.isfinite(s) and s > 0):
                raise Failure(f"{name}: scale[{i}, {j}] = {s!r}: a scale must be a finite positive number")
            mantissa, _ = math.frexp(s)
            if mantissa != 0.5:
                raise Failure(f"{name}: scale[{i}, {j}] = {s:.9g} is not a power of two: x8 * scale would need more "
                              "bits than bf16 has, so the bf16 versions v0 and v1 could not compute on the very "
                              "values the fp8 kernel sees (dequantising by a power of two is exact)")
            top = float(amax[i, j]) / s
            if amax[i, j] > 0 and not 224 < top <= 448:
                where = ("past 448: the largest values saturate (or overflow) in e4m3" if top > 448 else
                         "at or below 224: the head does not reach e4m3's top binade, (224, 448], and its small "
                         "values lose bits, or flush to zero, for nothing")
                raise Failure(f"{name}: head ({i}, {j}) has amax {float(amax[i, j]):.6g} and scale {s:.6g}: "
                              f"amax / scale = {top:.6g}, {where}. Each head's scale is the smallest power of two "
                              "at least amax / 448")
    expected = (x.float() / scale.reshape(b, h, *([1] * (x.dim() - 2)))).to(torch.float8_e4m3fn)
    _compare_fp8(f"{name}: x8 (the codes of x / scale)", x8, expected)
    return x8, scale


def _check_fp8_heads(run: Run) -> None:
    mine = run.module()
    require(mine, "quantize_heads", "quantize_attention_inputs")
    for what, x in _heads_data():
        with run.case(f"quantize_heads: {what}",
                      hint="amax per (batch, head) over the other dimensions; scale = 2^ceil(log2(amax / 448)); "
                           "x8 = (x / scale[b, h]) in fp32, cast to e4m3"):
            x_before = x.clone()
            _check_heads("quantize_heads(x)", x, mine.quantize_heads(x))
            if not torch.equal(x, x_before):
                raise Failure("quantize_heads changed its input")
    g = gen(69)
    shapes = ((1, 2, 40, 64), (2, 3, 17, 128))
    for b, h, s, d in shapes:
        with run.case(f"quantize_attention_inputs: B = {b}, H = {h}, S = {s}, D = {d}, q, k and v of different "
                      "magnitudes",
                      hint="q and k as quantize_heads gives them; V quantised the same way and then written "
                           "transposed: v8.transpose(-1, -2).contiguous(), (B, H, D, S) with S contiguous"):
            q = torch.randn(b, h, s, d, generator=g) * 3.0
            k = torch.randn(b, h, s, d, generator=g) * 0.02
            v = torch.randn(b, h, s, d, generator=g) * torch.arange(1, h + 1).reshape(1, h, 1, 1) * 10.0
            out = mine.quantize_attention_inputs(q, k, v)
            if not isinstance(out, (tuple, list)) or len(out) != 6:
                raise Failure("quantize_attention_inputs should return six tensors: (q8, k8, vt8, q_scale, "
                              "k_scale, v_scale)")
            q8, k8, vt8, sq, sk, sv = out
            _check_heads("q8, q_scale", q, (q8, sq))
            _check_heads("k8, k_scale", k, (k8, sk))
            if not isinstance(vt8, torch.Tensor) or tuple(vt8.shape) != (b, h, d, s):
                raise Failure(f"vt8 should have shape (B, H, D, S) = {(b, h, d, s)}, V transposed per head, got "
                              f"{tuple(getattr(vt8, 'shape', ()))}: fp8 wgmma reads the second product's B operand "
                              "K-major, and in P V the reduction runs over the keys")
            if not vt8.is_contiguous():
                raise Failure(f"vt8 has the shape (B, H, D, S) but strides {vt8.stride()}: a transposed view of "
                              "(B, H, S, D) memory, not V written transposed. The kernel reads the keys of a row "
                              "of vt8 as contiguous bytes: .contiguous() (or write it transposed)")
            _check_heads("vt8 transposed back, v_scale", v, (vt8.transpose(-1, -2), sv))


fp8_heads = Exercise(
    id="part6.fp8-attention.6",
    title="Power-of-two scales per head, and V written transposed",
    difficulty=2,
    kind="model",
    files=("part6/fp8_heads.py",),
    task="Write the quantisation step of the FP8 forward. quantize_heads(x), for x of shape (B, H, ...): one fp32 "
    "scale per (batch, head), the power of two that puts the head's largest magnitude in (224, 448], e4m3's top "
    "binade, and the e4m3 codes of x / scale (x ~= x8 * scale[b, h]); a head of zeros keeps a finite power of "
    "two. Then quantize_attention_inputs(q, k, v) -> (q8, k8, vt8, q_scale, k_scale, v_scale): each quantised "
    "per head, V written transposed, (B, H, D, S) with the sequence contiguous. The check reads every scale "
    "(a power of two, amax / scale in (224, 448]) and compares the codes bit for bit with torch's "
    "float8_e4m3fn cast, on heads of different magnitudes, the edges of the binade, a head of zeros and bf16 "
    "input.",
    hint="amax = x.float().abs().flatten(2).amax(dim=2), clamped away from 0; scale = torch.exp2(torch.ceil("
    "torch.log2(amax / 448))); divide by scale[:, :, None, ...] in fp32 and cast; vt8 = "
    "v8.transpose(-1, -2).contiguous()",
    check=_check_fp8_heads,
    planted={
        "amax_over_448": "not a power of two",
        "floor": "past 448",
        "per_tensor": "at or below 224",
        "times_scale": "codes of x / scale",
        "vt_view": "not V written transposed",
    },
)


EXERCISES = [crd2idx, coalesce, swizzle, complement, fp8_scale, wgmma_desc, dq_frag, tv_copy, tv_mma_b,
             fp8_blockscaled, lean_offsets, quad_transpose, smem_layout, fp8_heads]
