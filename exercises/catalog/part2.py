"""Part 2: the memory hierarchy."""

from __future__ import annotations

from exercises import compare, cuda
from exercises.catalog.helpers import Output, close, inp, model, randn, uses
from exercises.engine import Exercise, Failure, Run

# ------------------------------------------------------------------------------------------- coalescing.2
_STRIDES = [(s, isz) for isz in (4, 2, 8, 1) for s in (1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 32, 33)]
sectors = Exercise(
    id="part2.coalescing.2", title="Sectors per warp load, for fp32, fp16 and other widths", difficulty=2,
    kind="model", files=("part2/sectors.py",),
    task="Redo the sector table for fp16 (2-byte) elements, and for any element size: how many 32-byte sectors "
         "does one warp-wide load touch when lane i reads element i * stride, and what fraction of the bytes "
         "read is used? From which stride on does every lane get a sector of its own?",
    hint="lane i reads bytes [i * stride * itemsize, + itemsize); its sector is that byte address // 32. Count "
         "the distinct sectors of the 32 lanes; the warp uses 32 * itemsize bytes of them",
    check=model(("sectors_per_request", _STRIDES), ("used_fraction", _STRIDES),
                ("first_stride_one_sector_per_lane", [(4,), (2,), (1,), (8,)])),
    planted={"ignores_itemsize": "sectors_per_request(1, 2)"},
)

# ------------------------------------------------------------------------------------------- bank-conflicts.1
conflicts = Exercise(
    id="part2.bank-conflicts.1", title="Conflict degree by the gcd rule", difficulty=1, kind="model",
    files=("part2/conflicts.py",),
    task="Predict the conflict degree of strides 6, 12, 24 and 48 (and every other stride) with the gcd rule: a "
         "warp reads one column of a float tile whose rows are `stride` words apart, lane i reading word "
         "i * stride. How many words fall in the busiest of the 32 banks?",
    hint="the bank of word w is w % 32; lanes i and j collide when (i - j) * stride is a multiple of 32, so "
         "gcd(stride, 32) lanes share each bank",
    check=model(("conflict_degree", [(s,) for s in range(1, 70)])),
    planted={"mod": "conflict_degree(3)"},
)

# ------------------------------------------------------------------------------------------- bank-conflicts.3
_PADS = [(32, 4), (64, 4), (33, 4), (16, 4), (32, 2), (64, 2), (48, 2), (32, 1), (31, 2), (8, 4)]
padding = Exercise(
    id="part2.bank-conflicts.3", title="The padding that makes column reads conflict-free", difficulty=3,
    kind="model", files=("part2/padding.py",),
    task="Padding a tile of float[32][32] by one word fixes column reads. What padding fixes column reads of a "
         "float[32][64] tile? Of a tile of half (2-byte) values, where two values share a bank word? Write "
         "column_degree() (the address model) and smallest_padding(): the fewest elements to add to each row of "
         "a 32-row tile so that a warp reading any one column (lane = row) never has two different words in one "
         "bank.",
    hint="element (row, col) of a tile with rows of `pitch` elements is at byte (row * pitch + col) * itemsize, "
         "in word byte // 4 and bank word % 32. Lanes reading the same word share it (a broadcast): count "
         "distinct words per bank. For half, one padding element is not always enough: try every column",
    check=model(("column_degree", [(32, 4, 0), (33, 4, 5), (32, 2, 1), (33, 2, 1), (33, 2, 0), (34, 2, 3),
                                   (64, 1, 2), (17, 4, 0)]),
                ("smallest_padding", _PADS)),
    planted={"always_one": "smallest_padding(32, 2)"},
)

# ------------------------------------------------------------------------------------------- matrix-add.5


def _check_matrix_add_strided(run: Run) -> None:
    mod = run.module()
    for m, n, bm, bn in ((20, 50, 16, 32), (3, 7, 16, 32), (33, 64, 16, 32)):
        with run.case(f"{m} x {n}: y and out are column slices of wider matrices"):
            x = randn(m, n, seed=6)
            y_wide = randn(m, n + 9, seed=7)
            y = y_wide[:, 4:4 + n]
            out = Output((m, n), run.device, row_pad=11, col_offset=3)
            yd = inp(y_wide, run.device)[:, 4:4 + n]
            mod.matrix_add(inp(x, run.device), yd, out.tensor, bm=bm, bn=bn)
            got = out.check()
            close("out", got, x + y, 0.0, 0.0)


matrix_add_strided = Exercise(
    id="part2.matrix-add.5", title="Matrix add into a column slice of a wider matrix (Triton)", difficulty=2,
    kind="triton", files=("part2/matrix_add_strided.py",),
    task="The kernels take a leading dimension (row stride) for every matrix. Write the Triton kernel's body so "
         "that x, y and out may each be a column slice of a wider matrix: load a (BM, BN) tile of x and of y "
         "with a 2-D mask, add, and store it into out, each with its own row stride.",
    hint="element (r, c) of a matrix with row stride ld is at ptr + r * ld + c; the mask is (rows < m) & "
         "(cols < n) with rows[:, None] and cols[None, :]. Use each matrix's own stride",
    check=_check_matrix_add_strided,
    planted={"ld_n": "outside out", "no_col_mask": "out-of-bounds|outside out"},
)

# ------------------------------------------------------------------------------------------- transpose.7
TRANSPOSE = cuda.Kernel("transpose_tiled", "const float* x, float* out, int m, int n")


def _check_transpose(run: Run) -> None:
    src = run.path()
    cuda.compile_check(run, src, TRANSPOSE, shared=True)
    for m, n in ((70, 45), (32, 32)):
        x = randn(m, n, seed=8)
        grid = ((n + 31) // 32, (m + 31) // 32)
        cuda.run_everywhere(run, src, TRANSPOSE, grid, (32, 8), (x, cuda.Out((n, m)), m, n),
                            lambda outs, x=x: close("out", outs[1], x.t().contiguous(), 0.0, 0.0),
                            label=f"{m} x {n}")


transpose = Exercise(
    id="part2.transpose.7", title="The shared-memory transpose, written yourself", difficulty=4, kind="cuda",
    files=("part2/transpose.cu",),
    task="Write the tiled transpose of the chapter's v4: a block of 32 x 8 threads reads a 32 x 32 tile of x "
         "row by row (coalesced) into a padded __shared__ tile, waits for the whole block, and writes the tile "
         "to out row by row (coalesced), reading the shared tile by columns. Matrices of any shape: guard every "
         "global access.",
    hint="after the loads, __syncthreads() before any thread reads what others wrote; the block that read tile "
         "(by, bx) of x writes tile (bx, by) of out, so out's row is blockIdx.x * 32 + ... and its column "
         "blockIdx.y * 32 + threadIdx.x; out has m columns",
    check=_check_transpose,
    planted={"no_sync": "expected", "bounds_swapped": "past the end of out"},
    gpu="the run on a real GPU (CuPy), and the speed of the coalesced writes "
        "(`python -m snippets bench transpose`)",
)

# ------------------------------------------------------------------------------------------- memory-spaces.6
VECTOR_ADD_SHARED = cuda.Kernel("vector_add_shared", "const float* x, const float* y, float* out, int n")


def _check_vector_add_shared(run: Run) -> None:
    src = run.path("part2/vector_add_shared.cu")
    with run.case("the kernel stages x and y through the shared arrays xs and ys"):
        if not uses(src.read_text(), "xs", "ys"):
            raise Failure("xs or ys is declared but never used: the kernel does not go through shared memory",
                          hint="store x[i] into xs[threadIdx.x] and y[i] into ys[threadIdx.x], then add from xs "
                               "and ys")
    cuda.compile_check(run, src, VECTOR_ADD_SHARED, shared=True)
    for n in (1000, 256):
        x, y = randn(n, seed=1), randn(n, seed=2)
        cuda.run_everywhere(run, src, VECTOR_ADD_SHARED, ((n + 255) // 256,), (256,), (x, y, cuda.Out(n), n),
                            lambda outs, x=x, y=y: close("out", outs[2], x + y, 0.0, 0.0), label=f"n = {n}")
    mine, ref = run.module("part2/vector_add_shared.py"), run.solution("part2/vector_add_shared.py")
    hint = ("shared memory is on the chip: staging through it adds shared-memory traffic but removes no DRAM "
            "traffic, because no element is read twice. The bytes model predicts no speed-up")
    for name, cases in (("dram_bytes_plain", [(1000,), (1 << 24,)]), ("dram_bytes_shared", [(1000,), (1 << 24,)]),
                        ("shared_bytes", [(1000,), (1 << 24,)]), ("predicted_speedup", [()])):
        with run.case(f"your prediction: {name}()", hint=hint):
            compare.functions(name, getattr(mine, name, None), getattr(ref, name), cases)


vector_add_shared = Exercise(
    id="part2.memory-spaces.6", title="Project: add shared memory to vector add, and see why it does not help",
    difficulty=2, kind="cuda", files=("part2/vector_add_shared.cu", "part2/vector_add_shared.py"),
    task="A classic first project: make the vector add go through shared memory (each thread stores x[i] and "
         "y[i] in __shared__ arrays, then adds from them). Before you measure, predict with the bytes model: how "
         "many bytes cross DRAM with and without shared memory, how many go through shared memory, and what "
         "speed-up to expect. Write the kernel in the .cu file and the prediction in the .py file.",
    hint="the kernel must be correct and use its shared arrays; the prediction is checked numerically",
    check=_check_vector_add_shared,
    planted={"no_shared": "never used", "prediction_faster": "dram_bytes_shared(1000)"},
    gpu="the run on a real GPU and the measurement that confirms the prediction (time both kernels with "
        "CUDA events)",
)

# ------------------------------------------------------------------------------------------- constant-memory.3
halo = Exercise(
    id="part2.constant-memory.3", title="The cost of the halo", difficulty=1, kind="model",
    files=("part2/halo.py",),
    task="v3's halo costs k - 1 extra inputs per tile of outputs. Compute the fraction of extra reads at k = 63 "
         "for tiles of 256, 1024 and 4096 outputs (and any other k and tile).",
    hint="a tile of T outputs of a k-tap filter reads T + k - 1 inputs: k - 1 of them are extra",
    check=model(("tile_inputs", [(63, 256), (63, 1024), (63, 4096), (3, 128), (1, 64)]),
                ("extra_read_fraction", [(63, 256), (63, 1024), (63, 4096), (3, 128), (1, 64), (129, 1000)])),
    planted={"k_not_k_minus_1": "tile_inputs(63, 256)"},
)

EXERCISES = [sectors, conflicts, padding, matrix_add_strided, transpose, vector_add_shared, halo]
