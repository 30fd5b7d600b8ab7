"""Part 2: the memory hierarchy."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import torch

from exercises import compare, cuda
from exercises.catalog.helpers import Output, close, inp, model, randn, uses
from exercises.engine import Exercise, Failure, Run, Skip, rel

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

# ------------------------------------------------------------------------------------------- registers.6
CHAIN_UPTO = cuda.Kernel("chain_upto", "const float* x, float* out, long long n, int slots")
_MAX_SLOTS = 16  # MAX_SLOTS in part2/chain_upto.cu
_LOCAL_ARCH = "sm_90"  # the chapter's H100/H200
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def _runtime_index_in_source(text: str) -> str | None:
    """Without nvcc, a guess from the source: a loop bounded by slots, or an index of a that involves slots."""
    code = re.sub(r"//[^\n]*|/\*.*?\*/", "", text, flags=re.S)
    for loop in re.finditer(r"\bfor\s*\([^;]*;[^;]*;", code):
        if re.search(r"\bslots\b", loop.group(0)):
            return f"a loop bounded by slots ({' '.join(loop.group(0).split())} ...)"
    index = re.search(r"\ba\s*\[[^\]]*\bslots\b[^\]]*\]", code)
    return f"an index of a that involves slots ({index.group(0)})" if index else None


def _ptx_and_ptxas(src: Path) -> tuple[str, str] | None:
    """nvcc's PTX for ``src`` (sm_90, cuda.ptx) and ptxas's -v report of compiling that PTX, cached beside it;
    None without nvcc."""
    ptx = cuda.ptx(src, _LOCAL_ARCH)
    if ptx is None:
        return None
    report = ptx.with_name("ptxas.txt")
    if not report.exists():
        r = subprocess.run([cuda.nvcc(), "-cubin", f"-arch={_LOCAL_ARCH}", "-Xptxas", "-v", str(ptx), "-o",
                            str(ptx.with_name("kernel.cubin"))], capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise Failure(f"ptxas could not assemble the PTX of {rel(src)}: {(r.stderr or r.stdout).strip()[:600]}")
        tmp = ptx.with_name("ptxas.tmp")
        tmp.write_text(r.stderr + r.stdout)
        tmp.replace(report)
    return ptx.read_text(), report.read_text()


def _check_in_registers(run: Run, src: Path) -> None:
    """The chapter's two signs of local memory, both absent: ld.local/st.local in the PTX (a run-time index: the
    front end gave a an address) and a stack frame or spills in ptxas's report."""
    name = CHAIN_UPTO.name
    compiled = _ptx_and_ptxas(src)
    if compiled is None:
        guess = _runtime_index_in_source(src.read_text())
        if guess:
            raise Failure(f"the source has {guess} (guessed from the source: nvcc is not on PATH). A run-time "
                          f"index puts a in local memory, with a stack frame in the ptxas report, unless the "
                          f"compiler rescues a small array with comparisons and selects")
        raise Skip("nvcc is not on PATH: whether a stays in registers was guessed from the source only (no loop "
                   "bounded by slots, no index of a with slots in it)")
    ptx, report = compiled
    body = ptx.split(f".entry {name}(", 1)[-1].split(".entry ", 1)[0]
    loads, stores = (len(re.findall(rf"\b{op}\.local\b", body)) for op in ("ld", "st"))
    tail = report.split(f"Compiling entry function '{name}'", 1)[-1]
    m, used = _FRAME.search(tail), re.search(r"Used (\d+) registers", tail)
    frame, spill_st, spill_ld = (int(g) for g in m.groups()) if m else (0, 0, 0)
    run.note(f"ptxas ({_LOCAL_ARCH}): {used.group(1) if used else '?'} registers, {frame} bytes stack frame, "
             f"{spill_st} bytes spill stores, {spill_ld} bytes spill loads; PTX: {loads} ld.local, {stores} "
             f"st.local")
    if loads or stores:
        msg = (f"a is in local memory: the PTX of {name} ({_LOCAL_ARCH}) has {loads} ld.local and {stores} "
               f"st.local, so some index of a is known only at run time")
        if frame:
            msg += f", and ptxas reports a {frame}-byte stack frame (a is {4 * _MAX_SLOTS} bytes)"
        else:
            msg += (". ptxas got a back into registers this time (no stack frame), as the chapter's note on "
                    "chain_local_8 describes: with comparisons and selects on every access, instructions that a "
                    "compile-time index does not need, and a rescue that no compiler promises")
        raise Failure(msg)
    if frame or spill_st or spill_ld:
        raise Failure(f"ptxas ({_LOCAL_ARCH}) reports a {frame}-byte stack frame, {spill_st} bytes spill stores "
                      f"and {spill_ld} bytes spill loads for {name}: part of a lives in local memory",
                      hint=f"{_MAX_SLOTS} values and a few indices fit in registers easily: look for a launch "
                           f"bound or a -maxrregcount that caps them, or a value kept alive needlessly")


def _chain_fp32(x: torch.Tensor, slots: int) -> torch.Tensor:
    """The given kernel's arithmetic, rounded as it rounds: a[k] = fmaf(C, a[k - 1], D) (computed in float64,
    where C * a[k - 1] + D is exact for these inputs, then rounded once to fp32), summed in fp32 from a[slots - 1]
    down to a[0]."""
    from snippets.part2.spills import C, D

    a = [x.float()]
    for _ in range(1, slots):
        a.append((C * a[-1].double() + D).float())
    s = a[slots - 1].clone()
    for k in range(slots - 2, -1, -1):
        s = s + a[k]
    return s


def _compare_chain(got: torch.Tensor, x: torch.Tensor, slots: int) -> None:
    from snippets.part2.spills import chain_sum_ref

    # the tolerance of the book's register_spill op, against its float64 reference
    want = chain_sum_ref(x.double(), slots)
    if not bool(((got.double() - want).abs() <= 1e-3 + 1e-5 * want.abs()).all()):
        for m in range(1, _MAX_SLOTS + 2):
            if m != slots and torch.allclose(got.double(), chain_sum_ref(x.double(), m), rtol=1e-5, atol=1e-3):
                raise Failure(f"out is the sum of the first {m} values of the chain, not of slots = {slots}",
                              hint="the guard decides which iterations count: a[k] is summed exactly when "
                                   "k < slots, and the loop visits every k from MAX_SLOTS - 1 down to 0")
        close("out", got, want.float(), 1e-5, 1e-3)
    same = got.view(torch.int32) == _chain_fp32(x, slots).view(torch.int32)
    if not bool(same.all()):
        k = int((~same).nonzero()[0])
        raise Failure(f"out is right within rounding but not bit for bit the given kernel's (first at out[{k}]: "
                      f"{float(got[k])!r} against {float(_chain_fp32(x, slots)[k])!r}): the order of the sum or "
                      f"the chain's rounding changed",
                      hint="moving a into registers changes no arithmetic: keep fmaf(C, a[k - 1], D), and sum from "
                           "a[slots - 1] down to a[0] as chain_registers does (s = 0.0f, then 0 + a[slots - 1] is "
                           "exact)")


def _check_chain_upto(run: Run) -> None:
    src = run.path()
    cuda.compile_check(run, src, CHAIN_UPTO)
    with run.case(f"a stays in registers: no ld.local/st.local in the PTX, no stack frame and no spills in the "
                  f"ptxas report ({_LOCAL_ARCH})"):
        _check_in_registers(run, src)
    for seed, (n, slots, block) in enumerate(((1000, 16, 256), (1000, 5, 256), (77, 1, 64), (513, 11, 128),
                                              (300, 2, 96))):
        x = randn(n, seed=40 + seed, scale=2.0)
        cuda.run_everywhere(run, src, CHAIN_UPTO, ((n + block - 1) // block,), (block,),
                            (x, cuda.Out(n), n, slots),
                            lambda outs, x=x, slots=slots: _compare_chain(outs[1], x, slots),
                            label=f"slots = {slots}, n = {n}, blocks of {block}")


chain_upto = Exercise(
    id="part2.registers.6", title="The chain with a run-time number of slots, its array in registers",
    difficulty=2, kind="cuda", files=("part2/chain_upto.cu",),
    task="chain_registers takes its number of slots as a template parameter: spill.cu compiles one kernel per "
         "value. The given chain_upto takes it at run time, as the kernel argument slots (1 to MAX_SLOTS = 16). "
         "Its results are right, but its loops run to slots and its sum starts at a[slots - 1]: a has indices "
         "known only at run time, so it lives in local memory (ptxas reports a stack frame). Rewrite it so that "
         "every index of a is a compile-time constant and a stays in registers, with the same results bit for "
         "bit: the sum keeps chain_registers' order, a[slots - 1] first. The check compiles it for sm_90 and "
         "wants no ld.local or st.local in the PTX and no stack frame and no spills in the -Xptxas -v report, "
         "then runs it on the CPU emulator for several numbers of slots against the book's chain_sum_ref.",
    hint="run every loop that touches a to MAX_SLOTS under #pragma unroll, and let slots decide inside the loop "
         "which iterations count (if (k < slots) s += a[k]), starting the sum at s = 0.0f; making all MAX_SLOTS "
         "values of the chain costs a few FMAs, an address costs local memory",
    check=_check_chain_upto,
    planted={"sum_runtime_bound": "stack frame", "fill_runtime_bound": "stack frame",
             "sum_starts_at_runtime_index": "comparisons and selects", "unguarded_sum": "the first 16 values",
             "guard_off_by_one": "the first 6 values", "forward_sum": "bit for bit"},
    gpu="the run on a real GPU (CuPy), and the time of chain_upto against the given kernel at 16 slots",
)

# -------------------------------------------------------------------------------- managing-memory.6
_MiB = 1 << 20
_PINNED = [(256 * _MiB, 53e9, 1e-5), (_MiB, 53e9, 1e-5), (4096, 25e9, 5e-6), (1 << 30, 400e9, 2e-6)]
# (nbytes, link, memcpy, chunk, overhead): copies of one chunk or less, then copies of many chunks
# (the last one partial in the last two, with the CPU slower, then faster, than the link)
_ONE_CHUNK = [(64 * 1024, 53e9, 20e9, 2 * _MiB, 1e-5), (2 * _MiB, 53e9, 20e9, 2 * _MiB, 1e-5),
              (1000, 25e9, 8e9, 4096, 5e-6), (1, 25e9, 8e9, 4096, 0.0)]
_MANY_CHUNKS = [(256 * _MiB, 53e9, 20e9, 2 * _MiB, 1e-5), (256 * _MiB, 53e9, 80e9, 2 * _MiB, 1e-5),
                (5 * _MiB + 123, 25e9, 8e9, _MiB, 5e-6), (3 * _MiB, 25e9, 40e9, 2 * _MiB, 0.0)]
# (..., pin_rate): every ratio of the pin's cost to the saving per copy is far from a whole number
_PAY_OFF = [(1 << 30, 53e9, 16e9, 2 * _MiB, 1e-5, 3e9), (1 << 30, 53e9, 80e9, 2 * _MiB, 1e-5, 3e9),
            (256 * _MiB, 53e9, 20e9, 2 * _MiB, 1e-5, 5e9), (1 << 30, 25e9, 10e9, _MiB, 5e-6, 1.5e9),
            (64 * 1024, 53e9, 20e9, 2 * _MiB, 1e-5, 3e9), (_MiB, 25e9, 12e9, 256 * 1024, 8e-6, 2e9)]


def _check_staging(run: Run) -> None:
    mine, ref = run.module(), run.solution()
    for name, what, cases, hint in (
        ("pinned_time", "one DMA transfer and the fixed cost of the call", _PINNED,
         "a pinned copy is the fixed cost of a call plus nbytes at the link's rate, in seconds"),
        ("pageable_time", "copies of one chunk or less, where nothing can overlap", _ONE_CHUNK,
         "with a single chunk the DMA engine can start only when the CPU has copied all of it: "
         "the two stages follow each other, overhead + nbytes / memcpy + nbytes / link. Only a "
         "second chunk can overlap"),
        ("pageable_time", "copies of many chunks, some with a partial last chunk", _MANY_CHUNKS,
         "the stages overlap: while the DMA engine moves chunk i, the CPU copies chunk i + 1. "
         "Follow the chunks one by one: the CPU finishes chunk i at cpu += size / memcpy; its "
         "DMA starts when both that copy and the previous DMA are done, dma = max(dma, cpu) + "
         "size / link. The last chunk holds what is left"),
        ("transfers_to_pay_off", "pinning once against k pageable copies", _PAY_OFF,
         "each pinned copy saves pageable_time - pinned_time over a pageable one, and pinning "
         "costs nbytes / pin_rate once: the smallest k with k * saving > pin cost. The pinned "
         "copies cost time too: pinning is paid back by what each of them saves, not by what it "
         "costs"),
    ):
        with run.case(f"{name}(): {what}", hint=hint):
            compare.functions(name, getattr(mine, name, None), getattr(ref, name), cases)


staging = Exercise(
    id="part2.managing-memory.6",
    title="Pageable against pinned: the staging pipeline, and when pinning pays",
    difficulty=3, kind="model", files=("part2/staging.py",),
    task="Model the two kinds of host-to-device copy, with the link's rate, the CPU's memcpy "
         "rate, the chunk size and the fixed cost of a call as parameters. A copy from pinned "
         "memory is one DMA transfer. A copy from pageable memory goes through the staging "
         "buffer: the CPU copies chunk after chunk while the DMA engine moves the previous one. "
         "Write the time of each, then the number of transfers of the same buffer after which "
         "pinning it pays for itself. Why does a copy smaller than one chunk gain nothing from "
         "the overlap? Why does pinning pay for itself after a few transfers when the CPU copies "
         "more slowly than the link, but only after many more when it copies faster?",
    hint="pinned: overhead + nbytes / link. Pageable: a two-stage pipeline over the chunks (CPU "
         "memcpy, then DMA), so the slower stage sets the pace, and the first chunk's other stage "
         "is not hidden. Pinning pays back through what each copy saves, not through what it "
         "costs",
    check=_check_staging,
    planted={"serial_staging": "pageable_time(268435456,",
             "slower_stage_only": "pageable_time(65536,",
             "divides_by_pinned_time": "transfers_to_pay_off(1073741824,"},
)

EXERCISES = [sectors, conflicts, padding, matrix_add_strided, transpose, vector_add_shared, halo,
             chain_upto, staging]
