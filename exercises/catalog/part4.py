"""Part 4: Triton. Six of the exercises are a ladder (puzzles 1 to 6), from a masked load to the online softmax."""

from __future__ import annotations

import numpy as np
import torch

from exercises import compare
from exercises.catalog.helpers import Output, close, inp, model, randn, require
from exercises.engine import Exercise, Failure, Run

LADDER = "Triton ladder"


# ------------------------------------------------------------------------------------------- puzzle 1
def _check_strided(run: Run) -> None:
    mod = run.module()
    for n, stride, block in ((100, 3, 64), (64, 1, 64), (5, 7, 4), (33, 2, 16)):
        with run.case(f"n = {n}, stride = {stride}, BLOCK = {block}"):
            x = randn((n - 1) * stride + 1, seed=20)
            out = Output((n,), run.device)
            mod.strided_copy(inp(x, run.device), out.tensor, stride, block=block)
            close("out", out.check(), x[::stride].contiguous(), 0.0, 0.0)


puzzle_load = Exercise(
    id="part4.programming-model.6", title=f"{LADDER} 1/6: a strided load with a mask", difficulty=1,
    kind="triton", files=("part4/p1_strided_copy.py",),
    task="out[i] = x[i * stride] for i < n, one program per BLOCK elements. Write the mask and the masked load "
         "and store: x has (n - 1) * stride + 1 elements, so the mask is about i, not about the address.",
    hint="offs = pid * BLOCK + tl.arange(0, BLOCK) indexes out; mask = offs < n; load x_ptr + offs * stride",
    check=_check_strided,
    planted={"mask_on_x": "out[34]", "no_stride": "out[1]"},
)


# ------------------------------------------------------------------------------------------- puzzle 2
def _check_outer(run: Run) -> None:
    mod = run.module()
    for m, n in ((20, 50), (16, 16), (3, 70)):
        with run.case(f"{m} x {n} into a column slice of a wider matrix"):
            x, y = randn(m, seed=21), randn(n, seed=22)
            out = Output((m, n), run.device, row_pad=5, col_offset=2)
            mod.outer_add(inp(x, run.device), inp(y, run.device), out.tensor, bm=16, bn=32)
            close("out", out.check(), x[:, None] + y[None, :], 0.0, 0.0)


puzzle_broadcast = Exercise(
    id="part4.programming-model.7", title=f"{LADDER} 2/6: a broadcast add", difficulty=2, kind="triton",
    files=("part4/p2_outer_add.py",),
    task="out[i, j] = x[i] + y[j] for x of m elements and y of n: each program computes a (BM, BN) tile of out "
         "from BM elements of x and BN of y. Write the 2-D offsets, the masks and the broadcast (out has a row "
         "stride of its own).",
    hint="rows[:, None] and cols[None, :] turn two vectors into a (BM, BN) grid; x needs the row mask, y the "
         "column mask, the store both",
    check=_check_outer,
    planted={"row_mask_only": "outside out", "y_mask_m": "out["},
)


# ------------------------------------------------------------------------------------------- puzzle 3
def _check_row_sum(run: Run) -> None:
    mod = run.module()
    for m, n in ((7, 100), (4, 128), (1, 3), (9, 33)):
        with run.case(f"row sums of a {m} x {n} matrix"):
            x = randn(m, n, seed=23)
            out = Output((m,), run.device)
            mod.row_sum(inp(x, run.device), out.tensor)
            close("out", out.check(), x.double().sum(1).float(), 1e-5, 1e-5)


puzzle_row_sum = Exercise(
    id="part4.programming-model.8", title=f"{LADDER} 3/6: a row sum", difficulty=2, kind="triton",
    files=("part4/p3_row_sum.py",),
    task="out[r] = x[r, 0] + ... + x[r, n - 1]: one program per row, BLOCK_N a power of two >= n. Load the row "
         "with a mask that adds nothing for the lanes past n, and reduce it with tl.sum.",
    hint="row r starts at x_ptr + r * stride_row; masked lanes must load 0.0 (other=0.0), the neutral element of "
         "a sum",
    check=_check_row_sum,
    planted={"row_stride_block": "out-of-bounds|out[1]", "no_mask": "out-of-bounds|out[0]"},
)


# ------------------------------------------------------------------------------------------- puzzle 4
def _check_softmax_rows(run: Run) -> None:
    mod = run.module()
    for m, n, scale in ((6, 100, 1.0), (3, 128, 1.0), (4, 50, 100.0), (2, 1, 1.0)):
        with run.case(f"softmax of {m} x {n} rows, values of size {scale:g}"):
            x = randn(m, n, seed=24, scale=scale)
            out = Output((m, n), run.device)
            mod.softmax(inp(x, run.device), out.tensor)
            close("out", out.check(), torch.softmax(x.double(), -1).float(), 1e-5, 1e-7)


puzzle_softmax = Exercise(
    id="part4.softmax.7", title=f"{LADDER} 4/6: a row softmax", difficulty=2, kind="triton",
    files=("part4/p4_softmax.py",),
    task="The one-pass row softmax of the chapter's v2, written yourself: one program per row (BLOCK_N >= n), "
         "subtract the row maximum, exponentiate, divide by the sum. It is checked on rows shorter than "
         "BLOCK_N and on logits of size 100, where exp overflows without the maximum.",
    hint="masked lanes must load -inf (exp(-inf) = 0 adds nothing to the sum, and -inf never wins the max); "
         "e = tl.exp(x - tl.max(x, axis=0)); out = e / tl.sum(e, axis=0)",
    check=_check_softmax_rows,
    planted={"no_max": "nan", "other_zero": "out[0, 0]"},
)


# ------------------------------------------------------------------------------------------- puzzle 5
def _check_matmul(run: Run) -> None:
    mod = run.module()
    for m, n, k in ((40, 24, 50), (16, 16, 16), (33, 65, 17)):
        with run.case(f"{m} x {k} by {k} x {n}, fp32"):
            a, b = randn(m, k, seed=25), randn(k, n, seed=26)
            out = Output((m, n), run.device)
            mod.matmul(inp(a, run.device), inp(b, run.device), out.tensor)
            close("c", out.check(), (a.double() @ b.double()).float(), 1e-5, 1e-6 * k + 1e-6)
    with run.case("B given as a transposed view (strides (1, k))"):
        a, bt = randn(24, 40, seed=27), randn(32, 40, seed=28)
        out = Output((24, 32), run.device)
        mod.matmul(inp(a, run.device), inp(bt, run.device).t(), out.tensor)
        close("c", out.check(), (a.double() @ bt.double().t()).float(), 1e-5, 1e-6 * 40 + 1e-6)


puzzle_matmul = Exercise(
    id="part4.matmul.8", title=f"{LADDER} 5/6: a tiled matmul with `tl.dot` (fp32)", difficulty=3, kind="triton",
    files=("part4/p5_matmul.py",),
    task="The tiled matrix multiply in Triton (the Triton half of the Part 3 project): each program computes a "
         "(BLOCK_M, BLOCK_N) tile of C, looping over K in steps of BLOCK_K with tl.dot on fp32 tiles (the CPU "
         "interpreter's bf16 dot is unreliable, so this exercise stays in fp32). Any shape, any strides.",
    hint="a's tile is a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak, b's is b_ptr + ks[:, None] * "
         "stride_bk + cols[None, :] * stride_bn; mask both on k < K (and rows < M, cols < N) with other=0.0; "
         "acc += tl.dot(a, b)",
    check=_check_matmul,
    planted={"b_stride": "out-of-bounds|c[", "no_k_mask": "out-of-bounds|c["},
    gpu="the comparison with cuBLAS and with the chapter's v3 (`python -m snippets bench matmul`)",
)


# ------------------------------------------------------------------------------------------- puzzle 6
def _check_online(run: Run) -> None:
    mod = run.module()
    x_rising = torch.arange(300, dtype=torch.float32).reshape(2, 150) / 10
    for name, x, block in (("increasing rows (the max changes in every chunk)", x_rising, 32),
                           ("random rows of size 50", randn(3, 200, seed=29, scale=50.0), 64),
                           ("a row shorter than one chunk", randn(2, 10, seed=30), 64)):
        with run.case(f"{name}, BLOCK_N = {block}"):
            out = Output(tuple(x.shape), run.device)
            mod.softmax_online(inp(x, run.device), out.tensor, block_n=block)
            close("out", out.check(), torch.softmax(x.double(), -1).float(), 1e-5, 1e-7)


puzzle_online = Exercise(
    id="part4.softmax.2", title=f"{LADDER} 6/6: the online softmax", difficulty=3, kind="triton",
    files=("part4/p6_softmax_online.py",),
    task="Rewrite v4 so that each chunk is reduced to a single (m, s) pair with tl.max and tl.sum, with one "
         "exponential per element in the first pass: walk the row in chunks of BLOCK_N, keep the running "
         "maximum m and the running sum s of exp(x - m), and rescale s whenever m grows; a second pass writes "
         "exp(x - m) / s. (Measuring it in bf16 and fp32 at N = 2^16 is the GPU half of the chapter's exercise.)",
    hint="m_new = max(m, tl.max(chunk)); s = s * tl.exp(m - m_new) + tl.sum(tl.exp(chunk - m_new)); masked lanes "
         "load -inf. Start from m = -inf and s = 0",
    check=_check_online,
    planted={"no_rescale": "out[0, ", "no_update": "out[0, 0]"},
    gpu="the measurement in bf16 and fp32 at N = 2^16",
)


# ------------------------------------------------------------------------------------------- softmax.1
_MN = [(16384, 8192, 4), (16384, 8192, 2), (1, 1000, 4), (4096, 128, 8)]
softmax_bytes = Exercise(
    id="part4.softmax.1", title="The bytes of the three-pass softmax and of v4", difficulty=1, kind="model",
    files=("part4/softmax_bytes.py",),
    task="Compute the bytes of the three-pass softmax (max pass, sum pass, write pass) and of v4 (the online "
         "softmax: a pass for (m, s), a pass to write). At which fraction of the copy rate should each top out? "
         "The rate is reported as 2MN x itemsize over the time, as for every version.",
    hint="count whole passes over the (M, N) input: the three-pass kernel reads x three times and writes y "
         "once, v4 reads it twice and writes once. At the copy bandwidth, a kernel that moves B bytes reports a "
         "rate of (2MN x itemsize / B) of the copy rate",
    check=model(("bytes_three_pass", _MN), ("bytes_online", _MN), ("top_fraction_three_pass", _MN),
                ("top_fraction_online", _MN)),
    planted={"three_reads": "bytes_three_pass("},
)


# ------------------------------------------------------------------------------------------- softmax.6
def _check_softmax_bwd(run: Run) -> None:
    mod = run.module()
    for m, n in ((5, 100), (3, 128), (2, 7)):
        with run.case(f"backward of a {m} x {n} softmax"):
            x, g = randn(m, n, seed=31), randn(m, n, seed=32)
            y = torch.softmax(x, -1)
            xd = x.double().requires_grad_()
            torch.softmax(xd, -1).backward(g.double())
            out = Output((m, n), run.device)
            mod.softmax_backward(inp(y, run.device), inp(g, run.device), out.tensor)
            close("dx", out.check(), xd.grad.float(), 1e-5, 1e-6)
    with run.case("bytes_moved() of the one-pass backward"):
        compare.functions("bytes_moved", getattr(mod, "bytes_moved", None), run.solution().bytes_moved,
                          [(16384, 8192, 2), (10, 10, 4)])


softmax_backward = Exercise(
    id="part4.softmax.6", title="The backward of softmax in one pass", difficulty=3, kind="triton",
    files=("part4/softmax_backward.py",),
    task="Write the backward of softmax, dx = y * (g - <g, y>), as a one-pass Triton kernel (one program per "
         "row, the row in registers). What is its cost model, and what rate should it reach?",
    hint="the inner product is per row: dot = tl.sum(g * y, axis=0); masked lanes load 0.0 for both. It reads y "
         "and g and writes dx: three passes of M x N elements",
    check=_check_softmax_bwd,
    planted={"sum_g": "dx[", "bytes_two": "bytes_moved("},
)


# ------------------------------------------------------------------------------------------- debugging.3
def _check_row_max(run: Run) -> None:
    mod = run.module()
    cases = (("rows of negative numbers, shorter than BLOCK_N", -randn(4, 50, seed=33).abs() - 1),
             ("mixed signs", randn(5, 64, seed=34)), ("one column", -torch.ones(3, 1)))
    for name, x in cases:
        with run.case(name):
            out = Output((x.shape[0],), run.device)
            mod.row_max(_rows_then_huge(x, run.device), out.tensor)
            close("out", out.check(), x.max(1).values, 0.0, 0.0)


def _rows_then_huge(x: torch.Tensor, device: str) -> torch.Tensor:
    """On a GPU, ``x`` as the first columns of a wider matrix whose other columns hold a huge value, so a lane
    past the end of a row that is loaded without its mask wins the maximum (``inp``'s NaN tail does not: the
    GPU's max ignores a NaN). On the CPU, ``inp``: the interpreter's bounds checks flag the load."""
    if device == "cpu":
        return inp(x, device)
    m, n = x.shape
    wide = torch.full((m + 1, n + 64), 1e30, dtype=x.dtype, device=device)
    wide[:m, :n] = x.to(device)
    return wide[:m, :n]


row_max = Exercise(
    id="part4.debugging.3", title="A row-wise maximum, and the value of masked lanes", difficulty=2,
    kind="triton", files=("part4/row_max.py",),
    task="Write a kernel that computes a row-wise maximum (one program per row, BLOCK_N >= n). The chapter's "
         "exercise: with other=0.0 on the masked load it is wrong; find the input on which it is, and fix it. "
         "The check includes that input.",
    hint="a masked lane takes the value `other`; for a maximum it must be a value that never wins: "
         "float('-inf')",
    check=_check_row_max,
    planted={"other_zero": "out[0] = 0"},
)


# ------------------------------------------------------------------------------------------- dropout.1
def _check_dropout(run: Run) -> None:
    from snippets.common.dropout import rand_ref

    mod = run.module()
    for n, p, seed, base in ((1000, 0.3, 123, 0), (1000, 0.3, 123, 5000), (77, 0.5, 7, 1 << 20)):
        with run.case(f"n = {n}, p = {p}, seed = {seed}, base_offset = {base}"):
            x = randn(n, seed=35)
            keep = torch.from_numpy(rand_ref(seed, np.arange(base, base + n, dtype=np.int64)) >= np.float32(p))
            expected = torch.where(keep, x * np.float32(1 / (1 - p)), torch.zeros(()))
            out = Output((n,), run.device)
            mod.dropout(inp(x, run.device), out.tensor, p, seed, base)
            close("out", out.check(), expected, 1e-6, 0.0)
    with run.case("min_offset_gap(): how far apart two layers' offsets must be"):
        compare.functions("min_offset_gap", getattr(mod, "min_offset_gap", None), run.solution().min_offset_gap,
                          [(1000,), (4096 * 1024,), (1,)])


dropout = Exercise(
    id="part4.dropout.1", title="Seeded dropout with a base offset", difficulty=2, kind="triton",
    files=("part4/dropout_offset.py",),
    task="Add a base_offset argument to seeded dropout that is added to every element index, and use it to give "
         "the layers of a model disjoint ranges of one stream. What must the offsets of two layers differ by?",
    hint="the Philox counter is the element's index: tl.rand(seed, base_offset + offs). Two layers' ranges "
         "[base, base + numel) must not overlap",
    check=_check_dropout,
    planted={"ignores_base": "base_offset = 5000", "half_gap": "min_offset_gap("},
)


# ------------------------------------------------------------------------------------------- layernorm.2
def _check_layernorm_stream(run: Run) -> None:
    mod = run.module()
    require(mod, "layernorm_stream")
    rising = torch.linspace(-3.0, 5.0, 1400).reshape(2, 700)
    tiny = randn(3, 200, seed=45, scale=1e-3)
    tiny[1] = 0.5  # a constant row: variance 0, rstd = 1 / sqrt(eps)
    # (name, x, BLOCK_N or None for the default, tolerance of y (rtol, atol), columns of padding after y's rows)
    cases = (
        ("1 row of 1000, BLOCK_N = 128 (7 whole chunks and a tail of 104)", randn(1, 1000, seed=40), 128,
         (1e-5, 1e-5), 0),
        ("37 rows of 300, BLOCK_N = 64, y a column slice of a wider matrix", randn(37, 300, seed=41, scale=2.0),
         64, (1e-5, 1e-5), 7),
        ("3 rows of 50, shorter than one chunk (BLOCK_N = 64)", randn(3, 50, seed=42), 64, (1e-5, 1e-5), 0),
        ("2 rows of 5000 with the default BLOCK_N = 4096 (a tail of 904)", randn(2, 5000, seed=43) + 1.0, None,
         (1e-5, 1e-5), 0),
        ("2 rows that rise along their length (every chunk has a mean of its own), BLOCK_N = 64", rising, 64,
         (1e-5, 1e-5), 0),
        # the chapter's rows: mean(x^2) - mean^2 is off by more than 1e-2 in y here; fp32 rounding of the mean
        # alone moves y by about 1e-4
        ("4 rows of 100 + N(0, 0.1^2), N = 777 (a large mean and a small spread), BLOCK_N = 128",
         randn(4, 777, seed=44, scale=0.1) + 100.0, 128, (0.0, 1e-3), 0),
        ("3 rows of variance 1e-6 or 0, below eps = 1e-5 (BLOCK_N = 64)", tiny, 64, (1e-5, 1e-5), 0),
        ("fp16: 5 rows of 300 (statistics in fp32, y rounded to fp16 once), BLOCK_N = 64",
         randn(5, 300, seed=46).half(), 64, (1e-3, 1e-3), 0),
    )
    for name, x, block, (y_rtol, y_atol), row_pad in cases:
        with run.case(name):
            m, n = x.shape
            w = (1.0 + randn(n, seed=47, scale=0.1)).to(x.dtype)
            b = randn(n, seed=48, scale=0.1).to(x.dtype)
            x64, w64, b64 = x.double(), w.double(), b.double()
            mean_ref = x64.mean(-1)
            rstd_ref = 1.0 / torch.sqrt(((x64 - mean_ref[:, None]) ** 2).mean(-1) + 1e-5)
            y_ref = (x64 - mean_ref[:, None]) * rstd_ref[:, None] * w64 + b64
            y = Output((m, n), run.device, dtype=x.dtype, row_pad=row_pad, name="y")
            mean, rstd = Output((m,), run.device, name="mean"), Output((m,), run.device, name="rstd")
            kwargs = {} if block is None else {"block_n": block}
            mod.layernorm_stream(inp(x, run.device), inp(w, run.device), inp(b, run.device), y.tensor,
                                 mean.tensor, rstd.tensor, **kwargs)
            close("mean", mean.check(), mean_ref.float(), 1e-6, 1e-6)
            close("rstd", rstd.check(), rstd_ref.float(), 2e-5, 0.0)
            close("y", y.check(), y_ref.to(x.dtype), y_rtol, y_atol)
    with run.case("bytes_moved() of the streaming forward"):
        compare.functions("bytes_moved", getattr(mod, "bytes_moved", None), run.solution().bytes_moved,
                          [(16384, 65536, 2), (1, 100000, 4), (1000, 4096, 2)])


layernorm_stream = Exercise(
    id="part4.layernorm.2", title="A streaming LayerNorm forward with Welford's update", difficulty=3,
    kind="triton", files=("part4/layernorm_welford.py",),
    task="Rows longer than MAX_N do not fit in registers. Write a forward that streams the row in chunks of "
         "BLOCK_N with Welford's update for mean and variance, and a second sweep for y: reduce each chunk to "
         "its count, its mean and its M2 (the sum of squared deviations from the chunk's own mean) with tl.sum, "
         "and merge them into the running count, mean and M2. The check includes the chapter's rows of "
         "100 + N(0, 0.1^2), where the one-pass mean(x^2) - mean^2 fails, and rows whose variance is below "
         "eps. Then say what the second read of x costs in the bytes model (bytes_moved).",
    hint="the chunk's real columns: n_b = min(n - start, BLOCK_N); mean_b = sum(x) / n_b, and M2_b sums "
         "(x - mean_b)^2 over the real columns only (tl.where: the padding loads 0, and 0 - mean_b is not 0). "
         "Merge with delta = mean_b - mean, total = count + n_b: mean += delta * n_b / total, "
         "M2 += M2_b + delta^2 * count * n_b / total. var = M2 / n (biased), rstd = 1 / sqrt(var + eps). The "
         "bytes: x read twice, w and b once, y written once",
    check=_check_layernorm_stream,
    planted={"unbiased": "rstd[", "tail_counted": "mean[", "padding_in_m2": "rstd[", "eps_outside": "rstd[",
             "no_delta_term": "rstd[", "one_pass": "a large mean", "bytes_one_read": "bytes_moved("},
    gpu="the comparison with the register version v3 across N (`python -m snippets bench layernorm`)",
)



# ------------------------------------------------------------------------------------------- spmv.6
def _combine(a: tuple[float, int], b: tuple[float, int]) -> tuple[float, int]:
    """v2's combine of two (value, row) pairs, in Python: add when both are of one row, else start again."""
    return (a[0] + b[0] if a[1] == b[1] else b[0]), b[1]


def _pairs(ps) -> str:
    return ", ".join(f"({float(v):g}, {int(r)})" for v, r in ps)


def _pairs_raw(ps) -> str:
    return ", ".join(f"({v!r}, {r!r})" for v, r in ps)


def _check_combine(run: Run, mod) -> None:
    # every pattern of equal and different rows among three pairs, sorted or not, with values whose sums are exact
    g = torch.Generator().manual_seed(60)
    triples = [tuple((float(torch.randint(-8, 9, (), generator=g)), int(r)) for r in rows)
               for rows in ((0, 0, 0), (0, 0, 1), (0, 1, 1), (0, 1, 2), (2, 1, 0), (1, 1, 0), (1, 0, 0),
                            (0, 1, 0), (3, 5, 3), (7, 7, 7), (4, 9, 9), (9, 4, 4))]
    got = mod.bracketings(triples, run.device)
    for (a, b, c), (left, right) in zip(triples, got):
        want_left, want_right = _combine(_combine(a, b), c), _combine(a, _combine(b, c))
        for what, g_, w in (("(a o b) o c", left, want_left), ("a o (b o c)", right, want_right)):
            if (float(g_[0]), int(g_[1])) != w:
                raise Failure(f"segment_add: {what} for a, b, c = {_pairs((a, b, c))} gives "
                              f"{_pairs([g_])}, expected {_pairs([w])} (a o b adds the values when a and b "
                              f"are of one row and is b otherwise; its row is b's)")


def _csr_case(lengths: list[int], n: int, seed: int, index_dtype: torch.dtype = torch.int32,
              dtype: torch.dtype = torch.float32, shuffle_cols: bool = False):
    """(crow, col, val, x, y_ref): a CSR matrix with the given row lengths, columns uniform in [0, n) (sorted
    within each row, or in random order), values and x uniform in [-1, 1], y_ref = A x in float64."""
    g = torch.Generator().manual_seed(seed)
    lengths_t = torch.tensor(lengths, dtype=torch.long)
    m, nnz = len(lengths), int(lengths_t.sum())
    crow = torch.zeros(m + 1, dtype=torch.long)
    crow[1:] = torch.cumsum(lengths_t, 0)
    rows = torch.repeat_interleave(torch.arange(m), lengths_t)
    col = torch.randint(0, n, (nnz,), generator=g)
    if nnz and not shuffle_cols:  # a row's columns are where the draw put them unless sorted here
        col = torch.sort(rows * n + col).values % n
    val = (torch.rand(nnz, generator=g) * 2 - 1).to(dtype)
    x = (torch.rand(n, generator=g) * 2 - 1).to(dtype)
    y_ref = torch.zeros(m, dtype=torch.float64).index_add_(0, rows, val.double() * x.double()[col])
    return crow.to(index_dtype), col.to(index_dtype), val, x, y_ref


def _check_spmv_segments(run: Run) -> None:
    mod = run.module()
    require(mod, "spmv_chunks", "bracketings", "counterexample")
    with run.case("segment_add on three pairs, both bracketings, every pattern of rows"):
        _check_combine(run, mod)
    uniform = torch.randint(0, 13, (300,), generator=torch.Generator().manual_seed(61)).tolist()
    # (name, row lengths, columns of x, CHUNK, index dtype, value dtype, columns in random order within rows)
    cases = (
        ("the chapter's matrix: rows of 3, 0, 700, 1, 0, 5 nonzeros (row 2 spans three chunks of 256)",
         [3, 0, 700, 1, 0, 5], 50, 256, torch.int32, torch.float32, False),
        ("CHUNK = 16: empty rows first and last, a row of exactly 16 and one of 50 (four chunks), int64 indices, "
         "columns unsorted within rows", [0, 0, 16, 3, 0, 50, 1, 0, 16, 0], 40, 16, torch.int64, torch.float32,
         True),
        ("CHUNK = 16: the last row the longest (70 nonzeros over five chunks), columns unsorted and repeated",
         [2, 0, 5, 70], 8, 16, torch.int32, torch.float32, True),
        ("CHUNK = 16: 300 rows of 0 to 12 nonzeros (many rows per chunk, rows across chunk boundaries)",
         uniform, 257, 16, torch.int32, torch.float32, False),
        ("a 1 x 1 matrix with one nonzero", [1], 1, 256, torch.int32, torch.float32, False),
        ("zero nonzeros: 5 empty rows, y stays 0", [0] * 5, 7, 256, torch.int64, torch.float32, False),
        ("fp16 values and x: a row of 2000 nonzeros and 20 short rows, products and sums in fp32",
         [3] * 10 + [2000] + [4] * 10, 300, 256, torch.int32, torch.float16, True),
    )
    for i, (name, lengths, n, chunk, index_dtype, dtype, shuffle) in enumerate(cases):
        with run.case(name):
            crow, col, val, x, y_ref = _csr_case(lengths, n, 62 + i, index_dtype, dtype, shuffle)
            y = Output((len(lengths),), run.device, name="y")
            y.tensor.zero_()
            mod.spmv_chunks(inp(crow, run.device), inp(col, run.device), inp(val, run.device),
                            inp(x, run.device), y.tensor, chunk=chunk)
            # the chapter's fp32 tolerance for every dtype: an fp16 product is exact in fp32, so only a sum
            # kept in fp16 misses it
            close("y", y.check(), y_ref.float(), 1e-5, 2e-5)
    with run.case("counterexample(): three pairs with unsorted rows whose two bracketings differ"):
        pairs = mod.counterexample()
        if (not isinstance(pairs, (tuple, list)) or len(pairs) != 3
                or not all(isinstance(p, (tuple, list)) and len(p) == 2 for p in pairs)):
            raise Failure(f"it should return three (value, row) pairs, got {pairs!r}")
        if not all(float(r) == int(r) for _, r in pairs):
            raise Failure(f"the rows must be integers, got {_pairs_raw(pairs)}")
        a, b, c = ((float(v), int(r)) for v, r in pairs)
        rows = [a[1], b[1], c[1]]
        if rows == sorted(rows) or rows == sorted(rows, reverse=True):
            raise Failure(f"the rows of {_pairs((a, b, c))} are sorted; on sorted rows the "
                          "combine is associative, so the two bracketings cannot differ",
                          hint="a row between two pairs of one other row cuts the first off in one bracketing "
                               "and not in the other: rows r0, r1, r0")
        [(left, right)] = mod.bracketings([(a, b, c)], run.device)
        if left == right:
            raise Failure(f"for a, b, c = {_pairs((a, b, c))} both bracketings give "
                          f"{_pairs([left])}; they must differ",
                          hint="rows r0, r1, r0 with a nonzero value in a: (a o b) o c drops a, a o (b o c) "
                               "keeps it")


spmv_segments = Exercise(
    id="part4.spmv.6", title="v2's segmented scan: the combine, the row sums and one atomic per row",
    difficulty=3, kind="triton", files=("part4/spmv_segments.py",),
    task="The segmented scan of v2 is tl.associative_scan over (value, row) pairs with a combine that adds two "
         "pairs of the same row and restarts at a new row. Write the combine (segment_add) and the part of v2's "
         "kernel after the binary search: the masked loads, the products in fp32, the reverse scan, and one "
         "atomic add per row and chunk from the lane that holds the row's first nonzero in the chunk. Then the "
         "chapter's question: why is the combine associative only on sorted rows? counterexample() gives three "
         "(value, row) pairs with unsorted rows where the two bracketings differ. The check runs matrices with "
         "empty rows, rows longer than a chunk, a long last row, no nonzeros at all, unsorted and repeated "
         "columns, int32 and int64 indices and fp16 values, against A x in float64.",
    hint="a o b is the sum of the values when r_a == r_b and v_b otherwise; its row is r_b. Padding lanes load 0 "
         "(mask=valid, other=0) so they add nothing; convert val and x[col] to fp32 before the product. With "
         "reverse=True the lane of a row's first nonzero in the chunk holds the row's partial sum: idx == "
         "crow[row], or the chunk's first lane for a row begun in an earlier chunk. A row split over chunks gets "
         "one atomic per chunk, so y must be added into, not stored. The counterexample: rows r0, r1, r0",
    check=_check_spmv_segments,
    planted={"no_row_test": "segment_add", "result_row_a": "segment_add", "no_chunk_start": "y[2]",
             "crow_next": "y[", "store_not_atomic": "y[2]", "fp16_sum": "fp16", "no_mask": "out-of-bounds|y[",
             "sorted_counterexample": "counterexample"},
)


# ------------------------------------------------------------------------------------------- convolution.5
def _inner_loop_problems(path, kernel: str) -> list[str]:
    """What the source of ``kernel`` still does per element in its innermost loop: a // or a %, or a test
    against the image's H or W. Empty when the K loop is two loops with the tap's arithmetic outside the inner
    one."""
    import ast

    tree = ast.parse(path.read_text())
    fn = next((f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == kernel), None)
    if fn is None:
        raise Failure(f"{kernel} is missing")
    loops = [n for n in ast.walk(fn) if isinstance(n, (ast.For, ast.While))]
    nested = [n for n in loops if any(isinstance(m, (ast.For, ast.While)) for b in n.body for m in ast.walk(b))]
    if not nested:
        raise Failure(f"{kernel} has no loop inside another: its K loop is still one loop, over the R * S * C "
                      "columns, so the tap and the channel of each column need a // and a % in it; the exercise "
                      "asks for two loops, over the taps and over C",
                      hint="for tap in range(0, R * S): r = tap // S; s = tap % S; ... then for c0 in "
                           "range(0, C, BLOCK_K): only the loads and tl.dot")
    inner = [n for n in loops if n not in nested]
    found = []
    for loop in inner:
        for node in (m for b in loop.body for m in ast.walk(b)):
            if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.FloorDiv, ast.Mod)):
                found.append(f"a {'//' if isinstance(node.op, ast.FloorDiv) else '%'} (line {node.lineno})")
            elif isinstance(node, ast.Compare) and any(isinstance(x, ast.Name) and x.id in ("H", "W")
                                                       for x in (node.left, *node.comparators)):
                found.append(f"a test against the image's H or W (line {node.lineno})")
    return list(dict.fromkeys(found))  # (ih < H) & (iw < W) on one line: said once


def _conv_ref(x: torch.Tensor, w: torch.Tensor, stride: int, padding: int) -> torch.Tensor:
    """The chapter's reference in float64: F.conv2d on NCHW-shaped views of NHWC x and (K, R, S, C) w."""
    import torch.nn.functional as F

    y = F.conv2d(x.double().permute(0, 3, 1, 2), w.double().permute(0, 3, 1, 2), stride=stride, padding=padding)
    return y.permute(0, 2, 3, 1)


def _check_conv_two_loops(run: Run) -> None:
    mod = run.module()
    require(mod, "conv2d_two_loops")
    # (what the case is about, (N, H, W, C, K, R, S, stride, padding), (BLOCK_M, BLOCK_N, BLOCK_K))
    cases = (
        ("batch 2, a 7 x 9 image, 3 x 3 filter, stride 1, padding 1, C = 20 (two steps of BLOCK_K = 16 per tap, "
         "the second ragged)", (2, 7, 9, 20, 17, 3, 3, 1, 1), (32, 16, 16)),
        ("batch 2, a 9 x 6 image, 3 x 3 filter, stride 2, padding 1, C = 5", (2, 9, 6, 5, 6, 3, 3, 2, 1),
         (32, 16, 16)),
        ("an 8 x 11 image, 3 x 2 filter (R != S), stride 2, padding 0, C = 7", (1, 8, 11, 7, 9, 3, 2, 2, 0),
         (32, 16, 16)),
        ("batch 2, a 5 x 6 image, 1 x 1 filter, stride 1, padding 0, C = 33 (three steps)",
         (2, 5, 6, 33, 19, 1, 1, 1, 0), (32, 16, 16)),
        ("batch 2, a 7 x 5 image, 1 x 1 filter, stride 2, padding 1 (the outputs on the border read only padding)",
         (2, 7, 5, 3, 4, 1, 1, 2, 1), (32, 16, 16)),
        ("a 6 x 8 image, 5 x 5 filter, stride 1, padding 2, C = 3", (1, 6, 8, 3, 4, 5, 5, 1, 2), (32, 16, 16)),
        ("batch 2, a 10 x 7 image, 5 x 5 filter, stride 2, padding 1, C = 16 (a multiple of BLOCK_K)",
         (2, 10, 7, 16, 8, 5, 5, 2, 1), (32, 16, 16)),
        ("batch 3, a 4 x 6 image, 3 x 3 filter, stride 1, padding 0, C = 20 with BLOCK_K = 32 (one ragged step) "
         "and 40 output channels over two tiles of BLOCK_N = 32", (3, 4, 6, 20, 40, 3, 3, 1, 0), (16, 32, 32)),
    )
    for i, (name, (n, h, wd, c, k, r, s, stride, pad), (bm, bn, bk)) in enumerate(cases):
        with run.case(name):
            x = randn(n, h, wd, c, seed=70 + i)
            w = randn(k, r, s, c, seed=80 + i, scale=(r * s * c) ** -0.5)  # y of size about 1
            ref = _conv_ref(x, w, stride, pad)
            y = Output(tuple(ref.shape), run.device, name="y")
            mod.conv2d_two_loops(inp(x, run.device), inp(w, run.device), y.tensor, stride, pad, block_m=bm,
                                 block_n=bn, block_k=bk)
            close("y", y.check(), ref.float(), 1e-5, 1e-5)
    with run.case("the K loop as two loops: no // or %, and no test against H or W, in the inner loop over C"):
        found = _inner_loop_problems(run.path(), "conv2d_two_loops_kernel")
        if found:
            raise Failure("the inner loop still does per element what depends only on the row and the tap: "
                          + "; ".join(found),
                          hint="r, s, ih, iw, the padding mask and the pointer to each row's pixel depend on "
                               "the tap, not on c: compute them in the loop over taps, before the loop over C")


conv_two_loops = Exercise(
    id="part4.convolution.5", title="The implicit GEMM's K loop as two loops, over the taps and over C",
    difficulty=3, kind="triton", files=("part4/conv_two_loops.py",),
    task="With C a multiple of BLOCK_K, every step of v2 lies inside one tap (r, s). Rewrite v2's K loop as two "
         "loops, over the RS taps and over C in BLOCK_K steps, so that the per-element operations that depend "
         "only on the row and the tap (the divisions and remainders by C and S that find r, s and c, the "
         "image-bounds test of the padding) leave the inner loop, which becomes a plain GEMM step; a ragged C "
         "keeps only the c < C mask. x is NHWC, w is (K, R, S, C), in fp32. The check compares y with F.conv2d "
         "in float64 at stride 1 and 2, padding 0, 1 and 2, 1 x 1, 3 x 3, 3 x 2 and 5 x 5 filters, non-square "
         "images, batches of up to 3 and C not a multiple of BLOCK_K, then reads the kernel: no // or % and no "
         "test against H or W in the inner loop.",
    hint="tap = r * S + s, so r = tap // S and s = tap % S, once per tap. The stride is already in ih0 and iw0: "
         "ih = ih0 + r, iw = iw0 + s, and the padding mask row_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W) "
         "is a (BLOCK_M,) vector. Each row's pixel starts at x_img + (ih * W + iw) * C, and the tap's columns "
         "of w viewed as K x KG start at tap * C. In the loop over c0, offs_c = c0 + tl.arange(0, BLOCK_K) "
         "and its mask offs_c < C apply to both tiles, A's along its columns and w^T's along its rows",
    check=_check_conv_two_loops,
    planted={"no_top_mask": "out-of-bounds|y[", "no_right_mask": "out-of-bounds|y[", "r_s_swapped": "y[",
             "stride_on_tap": "stride 2", "w_tap_missing": "y[", "w_tap_block_k": "C = 20",
             "no_c_mask_a": "out-of-bounds|y[", "one_loop": "no loop inside another",
             "tap_in_inner_loop": "the inner loop still does"},
)


# ------------------------------------------------------------------------------------------- custom-ops.2
def _inplace_op(mod):
    """The learner's operator NAMESPACE::dropout_, or a Failure that says what is missing."""
    ns = getattr(mod, "NAMESPACE", None)
    if not isinstance(ns, str):
        raise Failure("NAMESPACE is missing: the file defines it (keep it)")
    try:
        return getattr(torch.ops, ns).dropout_
    except (AttributeError, RuntimeError) as exc:
        raise Failure(f"no operator {ns}::dropout_ is registered: declare dropout_ with "
                      f"torch.library.custom_op(f\"{{NAMESPACE}}::dropout_\", mutates_args=...)") from exc


_GUARD, _GUARD_VALUE = 4096, 12345.0  # elements after x in its buffer, and what they hold


def _check_inplace_op(run: Run) -> None:
    mod = run.module()
    with run.case("the schema of NAMESPACE::dropout_"):
        op = _inplace_op(mod)
        schema = op.default._schema
        args = {a.name: a for a in schema.arguments}
        if "x" not in args:
            raise Failure(f"the schema {schema} has no argument x")
        if not (args["x"].alias_info and args["x"].alias_info.is_write):
            try:  # the opcheck test that catches the lie
                verdict = f"opcheck says: {torch.library.opcheck(op, (randn(100, seed=40).to(run.device), 0.5, 1))}"
            except Exception as exc:  # noqa: BLE001
                verdict = f"opcheck says: {str(exc).splitlines()[0]}"
            raise Failure(f"the schema {schema} does not mark x as mutable (Tensor(a!) x): the operator writes x "
                          f"but mutates_args does not say so, and the compiler may reorder, reuse or drop the "
                          f"call. {verdict}", hint="mutates_args names every input the operator writes: mutates_args=(\"x\",)")
        others = [a.name for a in schema.arguments if a.name != "x" and a.alias_info and a.alias_info.is_write]
        if others:
            raise Failure(f"the schema {schema} marks {others} as mutable: only x is written")
        if len(schema.returns):
            raise Failure(f"the schema {schema} returns something: an in-place operator returns None (-> None); "
                          f"returning x would alias an input, which a custom_op may not do")
    for n, p in ((1000, 0.5), (300, 0.0), (77, 0.9), (256, 0.5)):
        with run.case(f"torch.library.opcheck, {n} elements, p = {p}"):
            x = randn(n, seed=40).to(run.device)
            result = torch.library.opcheck(op, (x, p, 11))
            bad = {k: v for k, v in result.items() if v != "SUCCESS"}
            if bad:
                raise Failure(f"opcheck: {bad}")
    for n, p, seed in ((1000, 0.5, 3), (77, 0.9, 5), (300, 0.0, 8), (1 << 15, 0.3, 21)):
        with run.case(f"in place: {n} elements, p = {p}, seed = {seed}",
                      hint="the kernel and launch() are given: x[i] * (1 / (1 - p)) where tl.rand(seed, i) >= p, "
                           "else 0, stored back into x (restore them if they were edited)"):
            x0 = randn(n, seed=41).to(run.device)
            # x is the front of a longer buffer whose tail holds a guard value: a GPU does not fault on a store a
            # little past a tensor's end (the interpreter does), so the guard is what shows an unmasked tail
            buf = torch.full((n + _GUARD,), _GUARD_VALUE, device=run.device)
            x = buf[:n]
            x.copy_(x0)
            ptr = x.data_ptr()
            ret = op(x, p, seed)
            if ret is not None:
                raise Failure(f"the operator returned {type(ret).__name__}, not None")
            if x.data_ptr() != ptr or x.shape != x0.shape:
                raise Failure("x was not written in place")
            changed = int((buf[n:] != _GUARD_VALUE).sum())
            if changed:
                raise Failure(f"out-of-bounds stores: {changed} of the {_GUARD} elements just past the end of x "
                              f"changed (x is {n} elements, the front of a longer buffer): the last block's lanes "
                              f"past n must not store")
            got, ref = x.cpu(), x0.cpu()
            kept = got != 0
            expected = torch.where(kept, ref * np.float32(1 / (1 - p)), torch.zeros(()))
            close("x after dropout_ (kept entries x / (1 - p), the others 0)", got, expected, 1e-6, 0.0)
            if p == 0.0 and not bool(kept.all()):
                raise Failure(f"p = 0 dropped {int((~kept).sum())} element(s): it must keep every one")
            again = x0.clone()
            op(again, p, seed)
            if not torch.equal(again.cpu() != 0, kept):
                raise Failure("two calls with the same seed kept different elements")
            if p > 0:
                other = x0.clone()
                op(other, p, seed + 1)
                if torch.equal(other.cpu() != 0, kept):
                    raise Failure(f"seeds {seed} and {seed + 1} kept the same elements: the draw ignores the seed")
            frac = kept.double().mean().item()
            tol = 4 * ((p * (1 - p) / n) ** 0.5) + 1e-9
            if abs(frac - (1 - p)) > tol:
                raise Failure(f"kept a fraction {frac:.4f} of the elements, expected about 1 - p = {1 - p:.4f}")
    with run.case("torch.compile(fullgraph=True, backend=\"aot_eager\") of a function that calls it"):
        def f(t: torch.Tensor) -> torch.Tensor:
            y = t * 2
            op(y, 0.5, 9)
            return y + 1

        x = randn(500, seed=42).to(run.device)
        torch._dynamo.reset()
        got = torch.compile(f, fullgraph=True, backend="aot_eager")(x.clone())
        close("compiled f(x)", got.cpu(), f(x.clone()).cpu(), 1e-6, 0.0)


custom_op_inplace = Exercise(
    id="part4.custom-ops.2", title="An in-place custom op that declares what it writes", difficulty=2,
    kind="python", files=("part4/dropout_inplace_op.py",),
    task="Declare mutates_args=() on an operator that writes into its input (an in-place dropout), and find the "
         "opcheck test that catches the lie. Then declare it correctly and compile a function that calls it.",
    hint="@torch.library.custom_op(f\"{NAMESPACE}::dropout_\", mutates_args=(\"x\",)) on a function that returns "
         "None, and a register_fake that returns None too; the schema then reads Tensor(a!) x",
    check=_check_inplace_op,
    planted={"mutates_nothing": "mutable", "returns_x": "returns something|returned|alias",
             "scale_by_p": "x after dropout_", "tail_unmasked": "out-of-bounds"},
)


# ------------------------------------------------------------------------------------------- autotuning.7
_SMEM_LIMIT = 227 * 1024


def _cfg(bm: int, bn: int, bk: int, warps: int = 4, stages: int = 3, group_m: int = 8):
    import triton

    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m}, num_warps=warps,
                         num_stages=stages)


def _space(block_m=(64, 128, 256), block_n=(64, 128, 256), block_k=(32, 64, 128), warps=(4, 8),
           stages=(2, 3, 4, 5)) -> list:
    """The chapter's matmul_space as triton.Config objects: the product of the knobs' choices."""
    import itertools

    return [_cfg(bm, bn, bk, w, s) for bm, bn, bk, w, s in itertools.product(block_m, block_n, block_k, warps, stages)]


def _describe_cfg(c) -> str:
    kw = c.kwargs
    return (f"(BLOCK_M={kw['BLOCK_M']}, BLOCK_N={kw['BLOCK_N']}, BLOCK_K={kw['BLOCK_K']}, num_warps={c.num_warps}, "
            f"num_stages={c.num_stages})")


def _pow2_cap(extent: int) -> int:
    p = 16
    while p < extent:
        p *= 2
    return p


def _prune_verdicts(configs: list, m: int, n: int, k: int, itemsize: int) -> list[tuple[bool, str]]:
    """For each configuration: (kept, why), the chapter's rule applied one configuration at a time."""
    need = [c.num_stages * (c.kwargs["BLOCK_M"] + c.kwargs["BLOCK_N"]) * c.kwargs["BLOCK_K"] * itemsize
            for c in configs]
    fits = [c for c, b in zip(configs, need) if b <= _SMEM_LIMIT]
    smallest = {key: min((c.kwargs[key] for c in fits), default=0) for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K")}
    min_stages = min((c.num_stages for c in fits), default=0)
    out = []
    for c, b in zip(configs, need):
        kw = c.kwargs
        if b > _SMEM_LIMIT:
            out.append((False, f"needs {c.num_stages} x ({kw['BLOCK_M']} + {kw['BLOCK_N']}) x {kw['BLOCK_K']} x "
                               f"{itemsize} = {b} bytes of shared memory, more than SMEM_LIMIT = {_SMEM_LIMIT}"))
            continue
        why, reasons = None, [f"needs {b} bytes of shared memory (<= {_SMEM_LIMIT})"]
        for key, dim, extent in (("BLOCK_M", "M", m), ("BLOCK_N", "N", n), ("BLOCK_K", "K", k)):
            cap = _pow2_cap(extent)
            if kw[key] <= cap:
                reasons.append(f"{key} = {kw[key]} <= {cap} ({dim} = {extent} rounded up to a power of two, at "
                               "least 16)")
            elif kw[key] == smallest[key]:
                reasons.append(f"{key} = {kw[key]} is the smallest of the configurations that fit, so it survives "
                               f"the shape rule although {dim} = {extent}")
            elif why is None:
                why = (f"has {key} = {kw[key]} for {dim} = {extent}: past {cap} ({dim} rounded up to a power of "
                       "two, at least 16) a block computes only zeros")
        steps = -(-k // kw["BLOCK_K"])
        if c.num_stages <= steps:
            reasons.append(f"num_stages = {c.num_stages} <= {steps} iteration(s) of the K loop "
                           f"(cdiv({k}, {kw['BLOCK_K']}))")
        elif c.num_stages == min_stages:
            reasons.append(f"num_stages = {c.num_stages} is the smallest of the configurations that fit, so it "
                           f"survives although the K loop has {steps} iteration(s)")
        elif why is None:
            why = (f"has num_stages = {c.num_stages} for a K loop of cdiv({k}, {kw['BLOCK_K']}) = {steps} "
                   "iteration(s): nothing left to prefetch")
        out.append((False, why) if why is not None else (True, "; ".join(reasons)))
    return out


def _check_prune_case(fn, configs: list, m: int, n: int, k: int, dtype, device: str) -> None:
    a = torch.empty(min(m, 8), min(k, 8), dtype=dtype, device=device)
    itemsize = a.element_size()
    named = {"a_ptr": a, "b_ptr": a, "c_ptr": a, "M": m, "N": n, "K": k, "stride_am": k, "stride_bk": n,
             "stride_cm": n}
    call = f"early_config_prune({len(configs)} configs, M={m}, N={n}, K={k}, a_ptr {str(dtype).removeprefix('torch.')})"
    try:
        got = fn(list(configs), named, INPUT_PRECISION="tf32")
    except NotImplementedError as exc:
        raise Failure(f"early_config_prune is not written yet ({exc})") from exc
    verdicts = _prune_verdicts(configs, m, n, k, itemsize)
    expected = [c for c, (keep, _) in zip(configs, verdicts) if keep]
    if not isinstance(got, (list, tuple)):
        raise Failure(f"{call} returned {type(got).__name__}, expected a list of the triton.Config objects kept")
    ids = {id(c): i for i, c in enumerate(configs)}
    for c in got:
        if id(c) not in ids:
            raise Failure(f"{call} returned {c!r}, which is not one of the Config objects passed in: return the "
                          "kept ones themselves (Triton compiles what you return)")
    for i, c in enumerate(configs):
        keep, why = verdicts[i]
        if keep and id(c) not in {id(g) for g in got}:
            raise Failure(f"{call} dropped {_describe_cfg(c)}, which it must keep: it {why}")
        if not keep and id(c) in {id(g) for g in got}:
            raise Failure(f"{call} kept {_describe_cfg(c)}, which {why}")
    if [id(c) for c in got] != [id(c) for c in expected]:
        raise Failure(f"{call} kept the right {len(expected)} configurations, but not once each in their "
                      "original order")


def _check_prune(run: Run) -> None:
    mod = run.module()
    require(mod, "smem_bytes", "early_config_prune", "make_tuner", "launched_tile")

    def smem_ref(cfg, itemsize):
        return cfg.num_stages * (cfg.kwargs["BLOCK_M"] + cfg.kwargs["BLOCK_N"]) * cfg.kwargs["BLOCK_K"] * itemsize

    cases = [(_cfg(128, 128, 64, 8, 3), 2), (_cfg(256, 64, 32, 4, 5), 4), (_cfg(64, 256, 128, 4, 2), 1),
             (_cfg(16, 32, 64, 2, 1), 2)]
    with run.case("smem_bytes() of four configurations, bf16, fp32 and fp8",
                  hint="each stage holds a BLOCK_M x BLOCK_K tile of A and a BLOCK_K x BLOCK_N tile of B"):
        for cfg, itemsize in cases:
            try:
                got = mod.smem_bytes(cfg, itemsize)
            except NotImplementedError as exc:
                raise Failure(f"smem_bytes is not written yet ({exc})") from exc
            compare.number(f"smem_bytes({_describe_cfg(cfg)}, itemsize={itemsize})", got, smem_ref(cfg, itemsize))
    space = _space()
    problems = (
        ("the chapter's 216 configurations at 4096^3 in fp16", space, 4096, 4096, 4096, torch.float16),
        ("the same at 4096^3 in fp32 (twice the bytes per stage)", space, 4096, 4096, 4096, torch.float32),
        ("the same at 4096^3 in fp8 e4m3 (half the bytes)", space, 4096, 4096, 4096, torch.float8_e4m3fn),
        ("M = 100, N = 300, K = 100 in fp16 (sizes that are not powers of two)", space, 100, 300, 100,
         torch.float16),
        ("a small problem, 40 x 40 x 40 in fp16: only 64 x 64 tiles with 2 stages are left", space, 40, 40,
         40, torch.float16),
        ("a 1 x 1 x 1 problem in fp32", space, 1, 1, 1, torch.float32),
        ("four hand-picked configurations in fp32 whose smallest tile (64 x 64 x 64, 8 stages) does not fit, "
         "M = N = 16, K = 48", [_cfg(64, 64, 64, 4, 8), _cfg(128, 64, 32, 4, 2), _cfg(128, 128, 32, 8, 3),
                                _cfg(256, 128, 64, 8, 2)], 16, 16, 48, torch.float32),
    )
    for name, configs, m, n, k, dtype in problems:
        with run.case(name):
            _check_prune_case(mod.early_config_prune, configs, m, n, k, dtype, run.device)
    with run.case("a space where nothing fits: ValueError",
                  hint="Triton needs at least one configuration back: say why there is none"):
        huge = [_cfg(256, 256, 256, 8, 6), _cfg(256, 256, 128, 8, 5)]
        a = torch.empty(4, 4, dtype=torch.float32, device=run.device)
        try:
            got = mod.early_config_prune(huge, {"a_ptr": a, "M": 4096, "N": 4096, "K": 4096})
        except ValueError:
            pass
        except NotImplementedError as exc:
            raise Failure(f"early_config_prune is not written yet ({exc})") from exc
        else:
            raise Failure(f"early_config_prune on two configurations of 1.5 MiB and more returned {got!r}, "
                          "expected a ValueError")
    with run.case("triton.autotune calls it: at K = 16 of two configurations the 64-deep one goes, and the "
                  "tuner launches the other",
                  hint="the tuner passes the kernel's arguments by name: named_args['M'], named_args['a_ptr']"):
        tuner = mod.make_tuner([_cfg(16, 16, 16, 1, 1), _cfg(16, 16, 64, 1, 1)])
        a = torch.zeros(20, 16, dtype=torch.float16, device=run.device)
        tile = mod.launched_tile(tuner, a, 20, 24, 16)
        compare.value("the tile the tuner launched (BLOCK_M, BLOCK_N, BLOCK_K)", tile, (16, 16, 16))


prune_configs = Exercise(
    id="part4.autotuning.7", title="Prune the search space before anything compiles", difficulty=2,
    kind="python", files=("part4/prune_configs.py",),
    task="Write the chapter's pruning rule in the form triton.autotune calls it, early_config_prune(configs, "
         "named_args, **kwargs): keep, in their order, the triton.Config objects whose shared-memory estimate "
         "num_stages x (BLOCK_M + BLOCK_N) x BLOCK_K x itemsize fits in SMEM_LIMIT (itemsize: the element size of "
         "the tensor a_ptr), then drop among those a block larger than its dimension rounded up to a power of two "
         "(at least 16), and more stages than the K loop has iterations, except that the smallest BLOCK_M, "
         "BLOCK_N, BLOCK_K and num_stages of the configurations that fit always pass the shape rule. Raise "
         "ValueError when nothing fits. smem_bytes(cfg, itemsize) is the estimate. The check compares what you "
         "keep with the rule applied one configuration at a time, on the chapter's 216-configuration space in "
         "fp16, fp32 and fp8 and on small and ragged problems, then runs a triton.autotune that calls your "
         "function.",
    hint="cfg.kwargs['BLOCK_M'] and cfg.num_stages read a Config; named_args['a_ptr'].element_size() is the "
         "itemsize. fits = the configs within SMEM_LIMIT; the smallest values are taken over fits; cap(x) = "
         "max(16, triton.next_power_of_2(x)); the stage rule is num_stages <= triton.cdiv(K, BLOCK_K)",
    check=_check_prune,
    planted={"one_stage": "smem_bytes(", "itemsize_two": "fp32", "no_round_up": "rounded up",
             "no_smallest": "smallest", "min_over_all": "smallest", "stages_floor": "iteration"},
)


# ------------------------------------------------------------------------------------------- triton-or-cuda.7
def _atomics_in_loops(path, kernel: str) -> tuple[int, list[int], bool]:
    """(number of tl.atomic_add calls in ``kernel``, the lines of those inside a loop, whether it has a loop)."""
    import ast

    tree = ast.parse(path.read_text())
    fn = next((f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == kernel), None)
    if fn is None:
        raise Failure(f"{kernel} is missing")

    def is_atomic(node) -> bool:
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "atomic_add")

    loops = [n for n in ast.walk(fn) if isinstance(n, (ast.For, ast.While))]
    inside = sorted({m.lineno for loop in loops for b in loop.body for m in ast.walk(b) if is_atomic(m)})
    return sum(is_atomic(n) for n in ast.walk(fn)), inside, bool(loops)


def _check_grid_stride_sum(run: Run) -> None:
    import math

    mod = run.module()
    require(mod, "grid_stride_sum")
    g = torch.Generator().manual_seed(90)
    # (what the case is about, x, programs, BLOCK)
    cases = (
        ("10000 fp32 elements, 4 programs of BLOCK = 256 (10 trips of the loop each, the last block ragged)",
         randn(10000, seed=91), 4, 256),
        ("4096 fp32 elements, 4 programs of BLOCK = 256 (whole blocks: 4 trips each)", randn(4096, seed=92), 4, 256),
        ("100 elements, 8 programs of BLOCK = 64 (6 programs find nothing to do)", randn(100, seed=93), 8, 64),
        ("1 element, 3 programs of BLOCK = 16", randn(1, seed=94), 3, 16),
        ("30001 elements, 1 program of BLOCK = 1024 (one program walks everything)", randn(30001, seed=95), 1, 1024),
        ("50000 fp16 values in [0, 1), 2 programs of BLOCK = 64: each lane adds about 390 of them, and past 128 "
         "fp16 numbers are 0.125 apart, so the sums must be kept in fp32", torch.rand(50000, generator=g).half(), 2,
         64),
    )
    for name, x, programs, block in cases:
        with run.case(name):
            out = Output((1,), run.device)
            out.tensor.fill_(float("nan"))  # the kernel adds into out: the launcher must zero it first
            mod.grid_stride_sum(inp(x, run.device), out.tensor, programs=programs, block=block)
            got = out.check()
            if bool(torch.isnan(got).any()) and not bool(torch.isnan(x).any()):
                raise Failure("out[0] = nan: out holds NaN before the call here, and the kernel adds into it, so the "
                              "launcher must zero it first (out.zero_())")
            expected = x.double().sum().float().reshape(1)
            close("out", got, expected, 1e-5, 1e-5 * math.sqrt(x.numel()))
    with run.case("one tl.atomic_add per program, after the grid-stride loop (v7's one atomicAdd per block)"):
        count, inside, has_loop = _atomics_in_loops(run.path(), "grid_stride_sum_kernel")
        if not has_loop:
            raise Failure("grid_stride_sum_kernel has no loop: a fixed grid of programs covers any n only by "
                          "walking it, start = pid * BLOCK, pid * BLOCK + programs * BLOCK, ...")
        if count == 0:
            raise Failure("grid_stride_sum_kernel has no tl.atomic_add: how do the programs' sums meet?")
        if inside:
            raise Failure(f"tl.atomic_add is called inside the loop (line {', '.join(map(str, inside))}): one atomic "
                          "per block of BLOCK elements, not one per program. Accumulate in the loop, reduce and "
                          "add once after it",
                          hint="acc += the masked load (in fp32) in the loop; tl.atomic_add(out_ptr, tl.sum(acc, "
                               "axis=0)) after it")


grid_stride_sum = Exercise(
    id="part4.triton-or-cuda.7", title="reduce_sum v7's design in Triton: a fixed grid, a grid-stride loop, one "
                                       "atomic", difficulty=2,
    kind="triton", files=("part4/grid_stride_sum.py",),
    task="The CUDA v7 launches a grid sized to the GPU, not to the data: each thread walks the input with a "
         "grid-stride loop, the block reduces its threads' sums with shuffles, and one thread adds the block's sum "
         "to the output with one atomicAdd. Write the same design in Triton: `programs` programs, each walking the "
         "input in steps of programs x BLOCK elements into a BLOCK-wide fp32 accumulator (x may be fp32 or fp16), "
         "then one tl.sum and one tl.atomic_add per program, after the loop; the host function zeroes out and "
         "launches the grid. The check sums ragged sizes, more programs than blocks, one program for everything "
         "and fp16 input against float64, then reads the kernel for the atomic's place.",
    hint="step = tl.num_programs(0) * BLOCK; acc = tl.zeros([BLOCK], dtype=tl.float32); for start in "
         "range(pid * BLOCK, n, step): offs = start + tl.arange(0, BLOCK); acc += tl.load(x_ptr + offs, "
         "mask=offs < n, other=0.0).to(tl.float32); after the loop tl.atomic_add(out_ptr, tl.sum(acc, axis=0)). "
         "On the host: out.zero_(), then kernel[(programs,)]",
    check=_check_grid_stride_sum,
    planted={"step_block": "out[0]", "no_mask": "out-of-bounds|out[0]", "atomic_in_loop": "inside the loop",
             "store": "out[0]", "fp16_acc": "fp16", "no_zero": "zero it first"},
)


EXERCISES = [puzzle_load, puzzle_broadcast, puzzle_row_sum, puzzle_softmax, puzzle_matmul, puzzle_online,
             softmax_bytes, softmax_backward, row_max, dropout, layernorm_stream, spmv_segments,
             conv_two_loops, custom_op_inplace, prune_configs, grid_stride_sum]
