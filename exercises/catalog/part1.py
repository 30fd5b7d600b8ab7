"""Part 1: GPUs and first kernels."""

from __future__ import annotations

import torch

from exercises import compare, cuda
from exercises.catalog.helpers import Output, close, inp, model, randn
from exercises.engine import Exercise, Failure, Run

KB = 1024


# ------------------------------------------------------------------------------------------- why-gpus.2
littles_law = Exercise(
    id="part1.why-gpus.2", title="Little's law on an H200", difficulty=1, kind="model",
    files=("part1/littles_law.py",),
    task="Redo the Little's-law calculation for an H200, whose datasheet gives 4.8 TB/s, with the same assumed "
         "latency (500 ns). How many bytes must each of its 132 SMs keep in flight? With 2048 resident threads "
         "per SM, how many 16-byte loads must each thread have outstanding? Write the three functions; the check "
         "tries them on the H100 and H200 and on other GPUs, latencies and load widths.",
    hint="bytes in flight = bandwidth x latency (bytes/s x s); share it among the SMs, then among the threads of "
         "an SM, and round the loads per thread up: a thread cannot have half a load outstanding",
    check=model(
        ("bytes_in_flight", [(3.35e12, 500e-9), (4.8e12, 500e-9), (2.0e12, 800e-9), (900e9, 400e-9)]),
        ("bytes_per_sm", [(3.35e12, 500e-9, 132), (4.8e12, 500e-9, 132), (2.0e12, 800e-9, 108)]),
        ("loads_per_thread", [(3.35e12, 500e-9, 132), (4.8e12, 500e-9, 132), (4.8e12, 500e-9, 132, 1024, 4),
                              (2.0e12, 800e-9, 108, 2048, 4), (8.0e12, 600e-9, 148, 1024, 16)]),
        rel=1e-9),
    planted={"floor": "loads_per_thread(", "per_gpu": "bytes_per_sm("},
)


# ------------------------------------------------------------------------------------------- why-gpus.5
round_trips = Exercise(
    id="part1.why-gpus.5", title="k operations: PCIe round trips against data kept on the GPU", difficulty=2,
    kind="model", files=("part1/round_trips.py",),
    task="A program applies k element-wise operations (each reads n elements and writes n) to the same array. "
         "Write the time of doing it with a round trip over PCIe for each operation, and with the data kept on "
         "the GPU, using the bytes model. How large must k be before the one-time transfer costs less than the "
         "operations themselves?",
    hint="a round trip is an upload of n elements and a download of n, both over PCIe; the operation itself "
         "reads and writes n elements of device memory. The transfer costs 2n*itemsize/PCIe once, the k "
         "operations k*2n*itemsize/HBM: 'less than' is strict",
    check=model(
        ("time_round_trips", [(1 << 24, 1, 4, 63e9, 3.35e12), (1 << 20, 10, 2, 32e9, 2.0e12),
                              (1000, 3, 8, 63e9, 4.8e12)]),
        ("time_resident", [(1 << 24, 1, 4, 63e9, 3.35e12), (1 << 20, 10, 2, 32e9, 2.0e12),
                           (1000, 3, 8, 63e9, 4.8e12)]),
        ("smallest_k", [(63e9, 3.35e12), (32e9, 2.0e12), (50e9, 4.0e12), (63e9, 4.8e12), (25e9, 1.0e12)]),
        rel=1e-9),
    planted={"upload_only": "time_round_trips(", "ceil": "smallest_k("},
)


# ------------------------------------------------------------------------------------------- setting-up.2
def _check_mask(run: Run) -> None:
    mod = run.module()
    for n, block in ((1000, 128), (1024, 128), (5, 64), (129, 128)):
        with run.case(f"n = {n}, BLOCK = {block}"):
            x, y = randn(n, seed=1), randn(n, seed=2)
            out = Output((n,), run.device)
            mod.vector_add(inp(x, run.device), inp(y, run.device), out.tensor, block=block)
            close("out", out.check(), x + y, 0.0, 0.0)


vector_add_mask = Exercise(
    id="part1.setting-up.2", title="The mask of the Triton vector add", difficulty=1, kind="triton",
    files=("part1/vector_add_mask.py",),
    task="The last program of the vector add runs past the end of the arrays unless BLOCK divides n. Write the "
         "mask that keeps its extra lanes from loading and storing. (The chapter's exercise: change the mask to "
         "offs <= n and see which tests catch it; here you write the right one, and the planted wrong solution "
         "is that one.)",
    hint="a lane may touch memory only if its offset is a valid index: 0 <= offs < n",
    check=_check_mask,
    planted={"off_by_one": "out-of-bounds|outside out", "block_mask": "out-of-bounds|outside out"},
)


# ------------------------------------------------------------------------------------------- execution-model.1
_OCC = [(256, 32), (256, 64), (256, 40), (256, 33), (256, 32, 48 * KB), (128, 72), (1024, 32), (1024, 33),
        (96, 255), (32, 16), (512, 128, 1000), (128, 32, 57 * KB), (1000, 20), (64, 24, 100 * KB)]
occupancy = Exercise(
    id="part1.execution-model.1", title="Occupancy from registers, shared memory and block size", difficulty=2,
    kind="model", files=("part1/occupancy.py",),
    task="Compute the occupancy, on Hopper, of a kernel with 128-thread blocks that uses 72 registers per thread "
         "and no shared memory. Write resident_blocks() and occupancy() from the chapter's formula (registers "
         "allocated per warp in units of 256, 1 KB of shared memory reserved per block); the check tries them on "
         "the worked example, this question, exercise 2's 1024-thread blocks at 32 and 33 registers, and more.",
    hint="B = min(64 // warps, 65536 // (warps x 256 x ceil(32 r / 256)), 228 KB // (S + 1 KB), 32), with warps = "
         "ceil(threads / 32); occupancy = B x warps / 64",
    check=model(("resident_blocks", _OCC), ("occupancy", _OCC)),
    planted={"no_rounding": "resident_blocks(256, 33)", "no_reserved": "58368"},
)


# ------------------------------------------------------------------------------------------- hello-gpu.3
VECTOR_ADD = cuda.Kernel("vector_add", "const float* x, const float* y, float* out, int n")


def _check_cuda_vector_add(run: Run) -> None:
    src = run.path()
    cuda.compile_check(run, src, VECTOR_ADD)
    for n, block in ((1000, 256), (37, 32)):
        x, y = randn(n, seed=1), randn(n, seed=2)
        grid = (n + block - 1) // block
        cuda.run_everywhere(run, src, VECTOR_ADD, (grid,), (block,), (x, y, cuda.Out(n), n),
                            lambda outs, x=x, y=y: close("out", outs[2], x + y, 0.0, 0.0),
                            label=f"n = {n}, {grid} blocks of {block}")


vector_add_cuda = Exercise(
    id="part1.hello-gpu.3", title="Vector add in CUDA, with its bounds check", difficulty=1, kind="cuda",
    files=("part1/vector_add.cu",),
    task="Write the body of the vector-add kernel: one thread per element, its index from blockIdx, blockDim and "
         "threadIdx. The grid is rounded up to whole blocks, so the last block has threads past the end: the "
         "chapter's exercise removes the if (i < n) and asks why the bug can go unnoticed. The CPU emulator "
         "notices it: it keeps guard elements around every buffer.",
    hint="int i = blockIdx.x * blockDim.x + threadIdx.x; and nothing happens for i >= n",
    check=_check_cuda_vector_add,
    planted={"no_bounds_check": "past the end of out", "thread_index": "out[256]"},
    gpu="the run on a real GPU (CuPy); without one the kernel runs on the CPU emulator only",
)


# ------------------------------------------------------------------------------------------- elementwise.1
def _check_gelu(run: Run) -> None:
    mod = run.module()
    for n, scale in ((1000, 3.0), (7, 1.0), (4096, 10.0)):
        with run.case(f"gelu on {n} elements of scale {scale:g}"):
            x = randn(n, seed=3, scale=scale)
            out = Output((n,), run.device)
            mod.gelu(inp(x, run.device), out.tensor)
            close("out", out.check(), torch.nn.functional.gelu(x.double()).float(), 1e-5, 1e-6)
    with run.case("bytes_moved() against the bytes model"):
        compare.functions("bytes_moved", getattr(mod, "bytes_moved", None), run.solution().bytes_moved,
                          [(1 << 20, 4), (1000, 2), (3, 8)])


gelu = Exercise(
    id="part1.elementwise.1", title="A GELU op in Triton, and its bytes", difficulty=2, kind="triton",
    files=("part1/gelu.py",),
    task="Add a GELU op with the triton_map pattern: GELU(x) = x * Phi(x) = 0.5 x (1 + erf(x / sqrt(2))), "
         "computed in fp32. Write the kernel's arithmetic (the loads, the mask and the store are given) and "
         "bytes_moved(n, itemsize): how many bytes does it move? Predict its rate from the chapter's tables "
         "before measuring it (python -m snippets bench is the measuring part, on a GPU).",
    hint="tl.math.erf exists; it is the exact GELU, torch.nn.functional.gelu's default. An element-wise op with "
         "one input and one output moves each element twice",
    check=_check_gelu,
    planted={"wrong_constant": "out[", "bytes_three": "bytes_moved("},
)


# ------------------------------------------------------------------------------------------- elementwise.2
MATRIX_ADD = cuda.Kernel("matrix_add", "const float* x, const float* y, float* out, int m, int n, int ld")


def _check_matrix_add(run: Run) -> None:
    src = run.path()
    cuda.compile_check(run, src, MATRIX_ADD)
    for m, n, ld, block in ((5, 70, 80, 32), (3, 33, 33, 64)):
        x, y = randn(m, ld, seed=4), randn(m, ld, seed=5)
        expected = torch.full((m, ld), float("nan"))
        expected[:, :n] = x[:, :n] + y[:, :n]

        def check(outs, expected=expected, n=n):
            got = outs[2]
            close("out", got[:, :n], expected[:, :n], 0.0, 0.0)
            pad = got[:, n:]
            if pad.numel() and not bool(torch.isnan(pad).all()):
                r, c = (~torch.isnan(pad)).nonzero()[0].tolist()
                raise Failure(f"the kernel wrote out[{r}, {n + c}], in the padding of row {r} (columns {n} to "
                              f"{pad.shape[1] + n - 1} are not part of the matrix)",
                              hint="a thread must check its column against n, not against the row stride ld")

        grid = ((n + block - 1) // block, m)
        cuda.run_everywhere(run, src, MATRIX_ADD, grid, (block,), (x, y, cuda.Out((m, ld)), m, n, ld), check,
                            label=f"{m} x {n}, row stride {ld}")


matrix_add_cuda = Exercise(
    id="part1.elementwise.2", title="Matrix addition with a 2-D grid and padded rows", difficulty=3, kind="cuda",
    files=("part1/matrix_add.cu",),
    task="Write matrix addition for a row-major m x n matrix with a two-dimensional grid: blockIdx.y picks the "
         "row and blockIdx.x a range of columns. What bounds checks does it need? Make it work on a matrix whose "
         "rows are padded (a row stride ld larger than n), and explain why the one-dimensional kernel can no "
         "longer be used.",
    hint="element (row, col) is at row * ld + col; a thread does work only if row < m and col < n (the padding "
         "between n and ld is not part of the matrix)",
    check=_check_matrix_add,
    planted={"stride_n": "out[4, 30]", "no_col_check": "past the end of out|padding"},
    gpu="the run on a real GPU (CuPy); without one the kernel runs on the CPU emulator only",
)


# ------------------------------------------------------------------------------------------- elementwise.4
fusion_bytes = Exercise(
    id="part1.elementwise.4", title="The bytes of x * y + z, two kernels against one", difficulty=1, kind="model",
    files=("part1/fusion_bytes.py",),
    task="out = x * y + z written in PyTorch runs two kernels. Count the bytes of the two-kernel version and of "
         "a fused kernel, and predict the speed-up of fusing from the bytes alone.",
    hint="the first kernel reads x and y and writes the product t; the second reads t and z and writes out. The "
         "fused kernel never writes t",
    check=model(("bytes_two_kernels", [(1 << 24, 4), (1000, 2), (7, 8)]),
                ("bytes_fused", [(1 << 24, 4), (1000, 2), (7, 8)]),
                ("predicted_speedup", [(1 << 24, 4), (1000, 2)])),
    planted={"forgot_intermediate": "bytes_two_kernels("},
)

EXERCISES = [littles_law, round_trips, vector_add_mask, occupancy, vector_add_cuda, gelu, matrix_add_cuda,
             fusion_bytes]
