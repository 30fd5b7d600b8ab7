"""Part 3: performance engineering."""

from __future__ import annotations

import math

import torch

from exercises import compare, cuda
from exercises.catalog.helpers import Output, close, inp, model, randn
from exercises.engine import Exercise, Failure, Run

# ------------------------------------------------------------------------------------------- measuring.4
_RECORDS = [(3 * 4 * (1 << 24), 1 << 24, 0.065), (201326592, 137438953472, 2.9), (8 * 1000, 2000, 0.004),
            (1 << 30, 0, 0.4)]
_ROOF = [r + peaks for r in _RECORDS[:3] for peaks in ((3350.0, 67.0), (4800.0, 989.0))]


def _check_metrics(run: Run) -> None:
    mine, ref = run.module(), run.solution()
    hint = ("GB/s = bytes / seconds / 1e9 and TFLOP/s = FLOPs / seconds / 1e12, with seconds = ms / 1000; "
            "intensity = FLOPs / bytes; the roof at that intensity is min(peak TFLOP/s, intensity x peak GB/s "
            "/ 1000)")
    with run.case("achieved() on records with known bytes, FLOPs and times", hint=hint):
        compare.functions("achieved", getattr(mine, "achieved", None), ref.achieved, _RECORDS)
    with run.case("roofline() against two GPUs' peaks", hint=hint):
        compare.functions("roofline", getattr(mine, "roofline", None), ref.roofline, _ROOF)
    with run.case("for_op() on the registry's vector_add and sgemm cost models", hint=hint):
        from snippets.op_index import load_all

        ops = load_all()  # registers every op (a fresh process has none yet)
        for name, ms in (("vector_add", 0.9), ("sgemm", 2.5)):
            op = ops[name]
            size, dtype = op.headline, op.dtypes[0]
            got = mine.for_op(op, size, dtype, ms)
            compare.value(f"for_op({name}, {size}, {dtype}, {ms})", got, ref.for_op(op, size, dtype, ms))
            # the harness's own rate for the op's metric must agree
            key = "gb_per_s" if op.metric == "GB/s" else "tflop_per_s"
            compare.number(f"for_op({name}, ...)[{key!r}] against the harness's Op.rate", got[key],
                           op.rate(size, dtype, ms), rel=1e-9)


metrics = Exercise(
    id="part3.measuring.4", title="Project: a new metric for the benchmarking harness", difficulty=2,
    kind="python", files=("part3/metrics.py",),
    task="Extend the harness with the metrics a roofline needs: from an op's cost model (bytes moved, FLOPs) "
         "and a measured median time in milliseconds, compute the achieved GB/s and TFLOP/s, the arithmetic "
         "intensity, the attainable rate under the roofline of a GPU with given peaks, the fraction of that "
         "roof, and which roof applies. Then apply it to a registered op (Op.bytes_moved, Op.flops).",
    hint="mind the units: the times are in milliseconds",
    check=_check_metrics,
    planted={"ms_as_s": "factor of 1/1000", "intensity_inverted": "['intensity']"},
)

# ------------------------------------------------------------------------------------------- roofline.4
_N = [(1 << 24, 4), (1000, 2), (5, 8)]
fused_intensity = Exercise(
    id="part3.roofline.4", title="How much fusion raises the intensity", difficulty=1, kind="model",
    files=("part3/fused_intensity.py",),
    task="relu(a * x + b) written as three PyTorch ops runs three kernels (a and b are scalars). Compute the "
         "bytes and FLOPs of the three together and of one fused kernel. By how much does fusion raise the "
         "intensity, and how much faster should the fused kernel be?",
    hint="each of the three kernels reads n elements and writes n, and does one operation per element (count "
         "the relu's max as one FLOP); the fused kernel reads x once and writes the result once, and does the "
         "same three operations",
    check=model(("unfused", _N), ("fused", _N), ("intensity_gain", _N), ("predicted_speedup", _N)),
    planted={"relu_free": "unfused(16777216, 4)"},
)

# ------------------------------------------------------------------------------------------- roofline.6
_GEMMS = [(16, 4096, 4096, 2), (16, 4096, 4096, 4), (4096, 4096, 4096, 2), (1, 8192, 8192, 2), (128, 1024, 512, 4)]
gemm_intensity = Exercise(
    id="part3.roofline.6", title="The intensity of a skinny GEMM", difficulty=2, kind="model",
    files=("part3/gemm_intensity.py",),
    task="A GEMM of M x K by K x N with M = 16 (one token's worth of rows, as in inference). Compute its "
         "intensity for N = K = 4096. Which roof applies, and what does that say about batching? Write the "
         "bytes (each operand read once, C written once), the FLOPs, the intensity and which roof bounds it.",
    hint="FLOPs = 2MNK; bytes = itemsize x (MK + KN + MN); the kernel is memory-bound when its intensity is "
         "below the ridge point, peak FLOP/s divided by peak bytes/s",
    check=model(("gemm_flops", [g[:3] for g in _GEMMS]), ("gemm_bytes", _GEMMS), ("intensity", _GEMMS),
                ("bound", [g + p for g in _GEMMS for p in ((989e12, 3.35e12), (67e12, 3.35e12))])),
    planted={"no_c_write": "gemm_bytes(", "ridge_inverted": "bound("},
)

# ------------------------------------------------------------------------------------------- scan.1
_POW2 = [(1 << e,) for e in range(1, 21)]
scan_work = Exercise(
    id="part3.scan.1", title="The additions of Kogge-Stone and Brent-Kung", difficulty=2, kind="model",
    files=("part3/scan_work.py",),
    task="Count the additions of Kogge-Stone and Brent-Kung for a 1024-element tile (and any power of two). At "
         "what tile size does Brent-Kung do ten times fewer?",
    hint="Kogge-Stone: at step d = 1, 2, 4, ..., n/2 every element i >= d adds, n - d additions. Brent-Kung: the "
         "up-sweep does n/2 + n/4 + ... + 1 = n - 1; the down-sweep of the chapter's inclusive scan does "
         "n - 1 - log2(n)",
    check=model(("kogge_stone_adds", _POW2), ("brent_kung_adds", _POW2), ("tenfold_tile", [()])),
    planted={"bk_no_downsweep": "brent_kung_adds(4)"},
)

# ------------------------------------------------------------------------------------------- warp-primitives.2
WARP_SCAN = cuda.Kernel("warp_inclusive_scan", "const float* x, float* out, int n")


def _check_warp_scan(run: Run) -> None:
    src = run.path()
    cuda.compile_check(run, src, WARP_SCAN)
    for n, block in ((200, 64), (32, 32)):
        x = randn(n, seed=9)
        pad = (-n) % 32
        chunks = torch.cat([x, torch.zeros(pad)]).view(-1, 32)
        expected = chunks.double().cumsum(1).reshape(-1)[:n].float()
        cuda.run_everywhere(run, src, WARP_SCAN, ((n + block - 1) // block,), (block,), (x, cuda.Out(n), n),
                            lambda outs, e=expected: close("out", outs[1], e, 1e-5, 1e-5),
                            label=f"n = {n}, blocks of {block}")


warp_scan = Exercise(
    id="part3.warp-primitives.2", title="A warp-level inclusive scan with `__shfl_up_sync`", difficulty=3,
    kind="cuda", files=("part3/warp_scan.cu",),
    task="Write a warp-level inclusive scan (prefix sum) with __shfl_up_sync: each warp scans its 32 consecutive "
         "elements. Which lanes must not add in each step? It is checked against torch.cumsum on each warp's "
         "worth of values (the CPU emulator runs shuffles as well).",
    hint="for d = 1, 2, 4, 8, 16: take the value d lanes to the left with __shfl_up_sync (every lane must call "
         "it), and add it only if lane >= d: for smaller lanes __shfl_up_sync returns the lane's own value",
    check=_check_warp_scan,
    planted={"all_lanes_add": "out[0]", "shfl_down": "out[1]"},
    gpu="the run on a real GPU (CuPy)",
)

# ------------------------------------------------------------------------------------------- reduction.6


def _check_atomic_sum(run: Run) -> None:
    mod = run.module()
    for n, block in ((1000, 256), (5000, 1024), (1, 64), (4096, 256)):
        with run.case(f"sum of {n} elements, BLOCK = {block}"):
            x = randn(n, seed=10)
            out = Output((1,), run.device)
            mod.total(inp(x, run.device), out.tensor, block=block)
            expected = x.double().sum().float().reshape(1)
            close("out", out.check(), expected, 1e-5, 1e-5 * math.sqrt(n))


atomic_sum = Exercise(
    id="part3.reduction.6", title="A one-launch Triton sum with `tl.atomic_add`", difficulty=2, kind="triton",
    files=("part3/atomic_sum.py",),
    task="Make the Triton reduction a single launch: each program loads its block, reduces it with tl.sum, and "
         "adds its partial sum into the single fp32 output with tl.atomic_add. (Is it faster at 2^28? At 2^20? "
         "That part is measured on a GPU.)",
    hint="masked lanes must add nothing: load with mask=offs < n and other=0.0; and every program must add into "
         "out, not overwrite it (tl.atomic_add, not tl.store)",
    check=_check_atomic_sum,
    planted={"store": "out[0]", "no_mask": "out-of-bounds|out[0]"},
    gpu="the timing at 2^28 and 2^20 against the two-pass version",
)

# ------------------------------------------------------------------------------------------- sgemm.7
MATMUL = cuda.Kernel("matmul_tiled", "const float* a, const float* b, float* c, int m, int n, int k")


def _cublas_note(run: Run, src) -> None:
    """On a GPU: time the learner's kernel against cuBLAS (torch.matmul, TF32 off) at 1024^3."""
    if cuda.gpu_unavailable():
        run.skip("comparison with cuBLAS: needs a GPU (CuPy and CUDA)")
        return
    m = n = k = 1024
    a, b = torch.randn(m, k, device="cuda"), torch.randn(k, n, device="cuda")
    c = torch.empty(m, n, device="cuda")
    fn = cuda.gpu_function(src.read_text(), MATMUL.name)
    import cupy
    import numpy as np

    args = (cupy.uint64(a.data_ptr()), cupy.uint64(b.data_ptr()), cupy.uint64(c.data_ptr()), np.int32(m),
            np.int32(n), np.int32(k))

    def mine():
        fn(((n + 15) // 16, (m + 15) // 16), (16, 16), args)

    def cublas():
        old = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            torch.matmul(a, b)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old

    times = {}
    for name, f in (("yours", mine), ("cuBLAS", cublas)):
        for _ in range(3):
            f()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            f()
        end.record()
        torch.cuda.synchronize()
        times[name] = start.elapsed_time(end) / 20
    flops = 2 * m * n * k
    run.note(f"at 1024^3 on this GPU: yours {flops / times['yours'] / 1e9:.2f} TFLOP/s, cuBLAS fp32 "
             f"{flops / times['cuBLAS'] / 1e9:.2f} TFLOP/s ({times['cuBLAS'] / times['yours']:.2f} of cuBLAS)")


def _check_matmul_cuda(run: Run) -> None:
    src = run.path()
    cuda.compile_check(run, src, MATMUL, shared=True, barrier=True)
    for m, n, k in ((37, 29, 45), (16, 16, 16), (5, 40, 70)):
        a, b = randn(m, k, seed=11), randn(k, n, seed=12)
        expected = (a.double() @ b.double()).float()
        grid = ((n + 15) // 16, (m + 15) // 16)
        cuda.run_everywhere(run, src, MATMUL, grid, (16, 16), (a, b, cuda.Out((m, n)), m, n, k),
                            lambda outs, e=expected, k=k: close("c", outs[2], e, 1e-5, 1e-6 * k + 1e-6),
                            label=f"{m} x {n} x {k}")
    _cublas_note(run, src)


matmul_cuda = Exercise(
    id="part3.sgemm.7", title="Project: the tiled matrix multiply in CUDA, and cuBLAS", difficulty=4, kind="cuda",
    files=("part3/matmul_tiled.cu",),
    task="Write the tiled matrix multiply of v3 yourself: a 16 x 16 block computes a 16 x 16 tile of C; for each "
         "16-wide slice of K it loads a tile of A and a tile of B into shared memory (zero outside the "
         "matrices), waits, accumulates, and waits again before the next load. Any M, N, K. On a GPU the check "
         "also times it against cuBLAS at 1024^3.",
    hint="two __syncthreads() per K step: one after the loads (before anyone reads the tiles), one after the "
         "products (before anyone overwrites them). Load 0.0f for elements outside A or B, and store only "
         "row < m && col < n",
    check=_check_matmul_cuda,
    planted={"no_second_sync": "c[", "no_load_bounds": "c["},
    gpu="the run on a real GPU and the comparison with cuBLAS (torch.matmul, TF32 off)",
)

# ------------------------------------------------------------------------------------------- sgemm.8


def _tf32(t: torch.Tensor) -> torch.Tensor:
    """Round fp32 to TF32 (10 mantissa bits), as a tensor core's TF32 mode reads its inputs."""
    i = t.contiguous().view(torch.int32)
    i = (i + 0x1000) & ~0x1FFF
    return i.view(torch.float32)


def _off_by_one_element(c: torch.Tensor) -> torch.Tensor:
    c = c.clone()
    c[1, 2] += 1.0
    return c


def _check_validate(run: Run) -> None:
    mod = run.module()
    validate, tolerance = getattr(mod, "validate", None), getattr(mod, "tolerance", None)
    if not callable(validate) or not callable(tolerance):
        raise Failure("validate() or tolerance() is missing")
    shapes = ((64, 16, 48), (32, 1024, 32), (16, 4096, 16))

    def call(c, a, b):
        try:
            return bool(validate(c, a, b))
        except NotImplementedError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise Failure(f"validate() raised {type(exc).__name__}: {exc} (it should return False for a wrong "
                          f"result, not fail)") from exc

    for m, k, n in shapes:
        a, b = randn(m, k, seed=13), randn(k, n, seed=14)
        exact = a.double() @ b.double()
        with run.case(f"accepts a correct fp32 product, k = {k}",
                      hint="a correct fp32 result differs from the float64 one by rounding, about 2^-24 x k x "
                           "|C|: the tolerance must allow that much (and an entry near 0 needs an atol)"):
            for label, c in (("a @ b", a @ b), ("the same product summed in 4 K-chunks",
                                                sum(a[:, i::4] @ b[i::4, :] for i in range(4)))):
                if not call(c, a, b):
                    err = (c.double() - exact).abs().max().item()
                    raise Failure(f"validate() rejected a correct fp32 product ({label}, max error {err:.3g})")
        wrong = {
            "a TF32 product (inputs rounded to 10 mantissa bits)": _tf32(a) @ _tf32(b),
            "a product that skips the last 16 of k": a[:, :k - 16] @ b[:k - 16, :] if k > 16 else a[:, :0] @ b[:0],
            "a product with one element off by 1.0": _off_by_one_element(a @ b),
            "the product of the wrong shape (transposed)": (a @ b).t().contiguous() if m != n else (a @ b)[:-1],
        }
        for label, c in wrong.items():
            with run.case(f"rejects {label}, k = {k}",
                          hint="a tolerance loose enough to accept TF32 or a missing tile is not a test of an "
                               "fp32 kernel: derive it from k and fp32's rounding (about 1e-6 x k)"):
                if call(c, a, b):
                    err = (c.double() - exact).abs().max().item() if c.shape == exact.shape else float("nan")
                    raise Failure(f"validate() accepted {label} at k = {k} (max error {err:.3g}; tolerance({k}) "
                                  f"= {tolerance(k)}): the tolerance lets a wrong kernel pass")
    with run.case("tolerance(k) grows with k (it is derived from the size)"):
        r16, r4096 = tolerance(16), tolerance(4096)
        if not (isinstance(r16, tuple) and len(r16) == 2):
            raise Failure(f"tolerance(16) = {r16!r}, expected a pair (rtol, atol)")
        if not r4096[1] > r16[1]:
            raise Failure(f"tolerance(16) = {r16}, tolerance(4096) = {r4096}: atol does not grow with k",
                          hint="the rounding error of a length-k fp32 sum grows with k: make atol a function of k")


validate = Exercise(
    id="part3.sgemm.8", title="Project: validate a kernel against a CPU reference", difficulty=2, kind="python",
    files=("part3/validate.py",),
    task="Write the comparison every kernel test of this book makes: validate(c, a, b) computes the float64 "
         "product on the CPU and compares with a tolerance derived from the size of the problem "
         "(tolerance(k) -> (rtol, atol)). It must accept any correct fp32 result, however its sums were ordered, "
         "and reject a TF32 result, a missing K tile, a single wrong element and a result of the wrong shape.",
    hint="see 'How close is close enough' in the chapter: the error of a length-k fp32 sum of terms of size ~1 "
         "grows like 2^-24 x k",
    check=_check_validate,
    planted={"fixed_loose": "accepted a TF32 product", "rtol_only": "rejected a correct fp32 product"},
)

# ------------------------------------------------------------------------------------------- atomics.3
HIST_PER_WARP = cuda.Kernel("hist_per_warp", "const int* x, int* counts, int n, int bins")
_HIST_MAX_BINS = 256  # MAX_BINS of the file: the checks stay within it


def _hist_input(n: int, bins: int, dist: str, seed: int) -> torch.Tensor:
    """n int32 values: "uniform" over [0, bins), "skewed" (90% of them bins // 2) or "equal" (all bins // 2);
    then 2% of them replaced by -1 or bins, and a few by values far outside [0, bins) (skipped, not clamped)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, bins, (n,), generator=g, dtype=torch.int32)
    if dist == "skewed":
        x[torch.rand(n, generator=g) < 0.9] = bins // 2
    elif dist == "equal":
        x[:] = bins // 2
    u = torch.rand(n, generator=g)
    x[u < 0.01] = -1
    x[(u >= 0.01) & (u < 0.02)] = bins
    far = torch.tensor([-(2**31), 2**31 - 1, -bins, 2 * bins, -(1 << 20), 1 << 20], dtype=torch.int32)
    picks = torch.randperm(n, generator=g)[:min(n // 50, far.numel())]
    x[picks] = far[:picks.numel()]
    return x


def _bincount(x: torch.Tensor, bins: int) -> torch.Tensor:
    x = x.long()
    return torch.bincount(x[(x >= 0) & (x < bins)], minlength=bins).to(torch.int32)


def _compare_counts(got: torch.Tensor, x: torch.Tensor, bins: int, stride: int) -> None:
    """counts against torch.bincount of x's in-range values; on a mismatch, what kind of mistake it looks like."""
    expected = _bincount(x, bins)
    if torch.equal(got, expected):
        return
    bad = (got != expected).nonzero().reshape(-1)
    b = int(bad[0])
    total, want = int(got.long().sum()), int(expected.long().sum())
    msg = (f"counts[{b}] = {int(got[b])}, expected {int(expected[b])}; {bad.numel()} of {bins} bins differ; "
           f"{total} values counted in all, ")
    if total < want:
        msg += f"expected {want} ({want - total} too few: increments were lost, or elements never counted)"
    elif total > want:
        msg += f"expected {want} ({total - want} too many: counted twice, or counts not starting from zero)"
    else:
        msg += "as many as expected, but in the wrong bins"
    n = x.numel()
    clamped = torch.bincount(x.long().clamp(0, bins - 1), minlength=bins).to(torch.int32)
    if torch.equal(got, clamped):
        msg += (". These are the counts with the out-of-range values clamped into bins 0 and bins - 1: a value "
                "outside [0, bins) must be skipped")
    for m in sorted({n - n % stride, n - n % 256, n - n % 32}, reverse=True):
        if 0 < n - m and torch.equal(got, _bincount(x[:m], bins)):
            msg += (f". These are the counts of x[:{m}]: the last {n - m} elements (the tail, n = {n} with a grid "
                    f"stride of {stride}) were not counted")
            break
    raise Failure(msg)


def _atomic_spaces(run: Run, src) -> tuple[set[str], str]:
    """The memory spaces the kernel's atomics work on ("shared", "global", "generic"), from nvcc's PTX; without
    nvcc, guessed from the source (an atomic on counts is global, any other shared)."""
    import re

    ptx = cuda.ptx(src)
    if ptx is None:
        code = re.sub(r"//[^\n]*|/\*.*?\*/", "", src.read_text(), flags=re.S)
        spaces = {"global" if re.search(r"\bcounts\b", arg) else "shared"
                  for arg in re.findall(r"\batomic[A-Z]\w*\s*\(([^,]*),", code)}
        return spaces, "the source (nvcc is not on PATH)"
    body = ptx.read_text().split(f".entry {HIST_PER_WARP.name}(", 1)[-1].split(".entry ", 1)[0]
    spaces = set()
    for suffix in re.findall(r"^\s*(?:@!?%\w+\s+)?(?:atom|red)((?:\.[\w:]+)+)", body, flags=re.M):
        spaces.add("shared" if ".shared" in suffix else "global" if ".global" in suffix else "generic")
    return spaces, "nvcc's PTX"


def _check_hist_per_warp(run: Run) -> None:
    src = run.path()
    cuda.compile_check(run, src, HIST_PER_WARP, shared=True, barrier=True)
    # (n, bins, distribution, threads per block, blocks): n a multiple of the grid's stride or not, n below one
    # block, a grid that strides over x several times, blocks of 8 warps and of 4, bins = MAX_BINS or fewer
    cases = ((4096, 256, "uniform", 256, 4), (3001, 100, "uniform", 256, 2), (2500, 256, "skewed", 128, 3),
             (777, 8, "equal", 256, 4), (100, 256, "uniform", 256, 1), (5000, 37, "skewed", 64, 5))
    for seed, (n, bins, dist, block, blocks) in enumerate(cases):
        assert bins <= _HIST_MAX_BINS and block <= 256
        x = _hist_input(n, bins, dist, seed=20 + seed)
        counts = torch.zeros(bins, dtype=torch.int32)
        stride = block * blocks
        cuda.run_everywhere(run, src, HIST_PER_WARP, (blocks,), (block,), (x, counts, n, bins),
                            lambda outs, x=x, bins=bins, stride=stride: _compare_counts(outs[1], x, bins, stride),
                            label=f"{dist}, n = {n}, {bins} bins, {blocks} block(s) of {block // 32} warp(s)")
    hint = ("the CPU emulator runs one thread at a time, so it cannot lose an increment; a GPU does: 32 lanes of a "
            "warp increment one copy at once (atomicAdd on shared memory), and every block adds into counts at "
            "once (atomicAdd on global memory)")
    with run.case("the counts are atomic where threads can collide (the race a CPU run cannot show)", hint=hint):
        spaces, where = _atomic_spaces(run, src)
        if not spaces & {"shared", "generic"}:
            raise Failure(f"the count into the warp's private copy is not atomic: {where} has no atomic on shared "
                          f"memory, and two lanes of a warp holding the same value both read a count of 7 and "
                          f"both write 8")
        if not spaces & {"global", "generic"}:
            raise Failure(f"the merge into counts is not atomic: {where} has no atomic on global memory, and "
                          f"blocks that add the same bin at the same time lose each other's counts")


hist_per_warp = Exercise(
    id="part3.atomics.3", title="A per-block histogram with one private copy per warp", difficulty=3,
    kind="cuda", files=("part3/hist_per_warp.cu",),
    task="Give v2 several private copies per block: one per warp (bins * warps counters in shared memory). Each "
         "warp counts its elements of x into its own copy with shared-memory atomics, skipping values outside "
         "[0, bins); at the end the copies are summed bin by bin and each non-empty bin is added to counts with "
         "one global atomic. It is checked against torch.bincount on uniform, skewed and all-equal data with "
         "out-of-range values, n not a multiple of the block or of the grid. On a GPU, measure uniform and "
         "skewed data: where does the extra shared memory start to cost occupancy?",
    hint="three steps with a __syncthreads() between each two: zero bins 0 .. bins - 1 of every warp's copy; count "
         "x[i] for i from blockIdx.x * blockDim.x + threadIdx.x in steps of gridDim.x * blockDim.x while i < n, "
         "with atomicAdd(&copies[warp][v], 1) only when (unsigned)v < (unsigned)bins; then each thread takes "
         "bins threadIdx.x, threadIdx.x + blockDim.x, ..., sums the bin over the copies and adds the sum to counts "
         "with atomicAdd",
    check=_check_hist_per_warp,
    planted={"no_sync_before_merge": "too few", "not_zeroed": "too many", "tail_skipped": "the tail",
             "clamped": "clamped",
             # on a GPU the race itself shows first, as lost increments; on a CPU only the PTX's atomics can
             "non_atomic": "private copy is not atomic|increments were lost",
             "merge_not_atomic": "merge into counts is not atomic|increments were lost"},
    gpu="the run on a real GPU (CuPy), and the measurement of uniform against skewed data and of the occupancy",
)


# ------------------------------------------------------------------------------------------- profiling.7
_STALL_METRIC = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
# (what the launch is like, DRAM bandwidth and its unit, duration and its unit, stall reasons in cycles per
# issued instruction (None: ncu printed n/a), k): made-up counters in the units ncu prints
_NCU_CASES = (
    ("a streaming kernel", (3.1, "Tbyte/second"), (180.5, "usecond"),
     {"long_scoreboard": 14.2, "selected": 1.0, "not_selected": 0.9, "wait": 0.6, "barrier": 0.3,
      "mio_throttle": None}, 2),
    ("a look-back scan", (912.4, "Gbyte/second"), (1.25, "msecond"),
     {"barrier": 41.0, "long_scoreboard": 9.5, "selected": 1.0, "wait": 0.7, "lg_throttle": 0.2}, 2),
    ("a compute-bound GEMM", (153.2, "Gbyte/second"), (4.07, "msecond"),
     {"math_pipe_throttle": 1.9, "selected": 1.0, "wait": 0.95, "not_selected": 0.8, "short_scoreboard": 0.4,
      "lg_throttle": None}, 3),
    ("printed in base units (--print-units base)", (2.2e12, "byte/second"), (1234567.0, "nsecond"),
     {"short_scoreboard": 6.5, "mio_throttle": 5.25, "selected": 1.0, "long_scoreboard": 3.0}, 1),
    ("a small copy", (850000.0, "Mbyte/second"), (0.002, "second"),
     {"long_scoreboard": 20.0, "selected": 1.0}, 2),
    ("a tiny kernel", (40000.0, "Kbyte/second"), (3.5, "usecond"),
     {"wait": 2.5, "no_instruction": 4.0, "selected": 1.0, "branch_resolving": 0.5}, 4),
)
_TO_BYTES = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_TO_SECONDS = {"nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0}


def _ncu_metrics(rate, duration, stalls) -> dict:
    """A launch's metrics as parse_ncu_csv returns them: {name: (value, unit)}, with others around."""
    measured = [v for v in stalls.values() if v is not None]
    metrics = {"gpu__time_duration.sum": duration, "dram__bytes.sum.per_second": rate,
               "dram__throughput.avg.pct_of_peak_sustained_elapsed": (61.5, "%"),
               "sm__warps_active.avg.pct_of_peak_sustained_active": (48.0, "%"),
               "launch__registers_per_thread": (40.0, "register/thread"),
               "smsp__average_warp_latency_per_inst_issued.ratio": (sum(measured), "")}
    metrics.update({_STALL_METRIC.format(reason): (v, "") for reason, v in stalls.items()})
    return metrics


def _check_ncu_counters(run: Run) -> None:
    mod = run.module()
    with run.case("dram_bytes(): the bandwidth times the duration, in bytes",
                  hint="convert both to base units first: a Gbyte/second is 1e9 bytes per second (ncu's prefixes "
                       "are decimal, like the harness's GB/s), a usecond 1e-6 s"):
        fn = getattr(mod, "dram_bytes", None)
        if not callable(fn):
            raise Failure("dram_bytes is missing or not a function")
        for what, rate, duration, stalls, _ in _NCU_CASES:
            want = rate[0] * _TO_BYTES[rate[1].removesuffix("byte/second")] * duration[0] * _TO_SECONDS[duration[1]]
            where = f"dram_bytes() of {what}: {rate[0]:g} {rate[1]} for {duration[0]:g} {duration[1]}"
            try:
                got = fn(_ncu_metrics(rate, duration, stalls))
            except NotImplementedError as exc:
                raise Failure(f"dram_bytes is not written yet ({exc})") from exc
            if isinstance(got, (int, float)) and not isinstance(got, bool) and want and got:
                for k in (1, 2, 3, 4):
                    for r in (1.024 ** k, 1.024 ** -k):
                        if math.isclose(got / want, r, rel_tol=1e-9):
                            raise Failure(f"{where} = {got:.6g}, expected {want:.6g}: off by a factor of 1.024^{k} "
                                          f"= (1024/1000)^{k}, binary prefixes. ncu's K, M, G and T are decimal "
                                          f"(1 Gbyte = 1e9 bytes)")
            compare.number(where, got, want)
    with run.case("top_stalls(): the largest stall reasons, largest first",
                  hint="the reason is the part of the metric's name between 'stalled_' and '_per_issue_active"
                       ".ratio'; skip the values that are None and the reason 'selected', sort by value, "
                       "largest first, keep k"):
        fn = getattr(mod, "top_stalls", None)
        if not callable(fn):
            raise Failure("top_stalls is missing or not a function")
        for what, rate, duration, stalls, k in _NCU_CASES:
            want = sorted(((r, v) for r, v in stalls.items() if v is not None and r != "selected"),
                          key=lambda rv: -rv[1])[:k]
            where = f"top_stalls(<{what}>, k={k})"
            try:
                got = fn(_ncu_metrics(rate, duration, stalls), k)
            except NotImplementedError as exc:
                raise Failure(f"top_stalls is not written yet ({exc})") from exc
            if not isinstance(got, (list, tuple)) or not all(isinstance(g, (list, tuple)) and len(g) == 2
                                                             for g in got):
                raise Failure(f"{where} should be a list of (reason, value) pairs, got {got!r}")
            got = [tuple(g) for g in got]
            if any(g[0] == "selected" for g in got):
                raise Failure(f"{where} = {got} includes 'selected': that is the cycle in which the warp issues "
                              f"(about 1 per instruction), not a reason it waited; expected {want}")
            if any(g[1] is None for g in got):
                raise Failure(f"{where} = {got} includes a reason ncu did not measure (n/a, None)")
            compare.value(where, got, want)
    with run.case("issue_fraction(): W warps each issuing once every C cycles",
                  hint="W / C instructions per cycle, but one scheduler issues at most one instruction per cycle: "
                       "min(1, W / C)"):
        fn = getattr(mod, "issue_fraction", None)
        if not callable(fn):
            raise Failure("issue_fraction is missing or not a function")
        for w, c in ((4, 16.0), (3, 12.5), (2, 37.5), (8, 8.0), (16, 4.0), (12, 1.5)):
            where = f"issue_fraction({w}, {c:g})"
            try:
                got = fn(w, c)
            except NotImplementedError as exc:
                raise Failure(f"issue_fraction is not written yet ({exc})") from exc
            if isinstance(got, (int, float)) and got > 1 + 1e-12:
                raise Failure(f"{where} = {got:.6g}: more than one instruction per cycle, but a scheduler issues "
                              f"at most one per cycle. With C < W more warps are ready than there are issue "
                              f"slots: every cycle issues, and the fraction is 1")
            compare.number(where, got, min(1.0, w / c))


ncu_counters = Exercise(
    id="part3.profiling.7", title="Read a kernel's counters as Nsight Compute prints them", difficulty=2,
    kind="python", files=("part3/ncu_counters.py",),
    task="From the metrics of one profiled launch, as parse_ncu_csv returns them ({name: (value, unit)}), compute "
         "the bytes the kernel moved through DRAM (dram__bytes.sum.per_second times gpu__time_duration.sum, each "
         "in the unit ncu printed it in), to be compared with the op's cost model; the k largest warp stall "
         "reasons, the hypothesis to test (leave out 'selected'); and, from the chapter's note, the share of "
         "cycles in which a scheduler holding W warps, each issuing once every C cycles, issues an instruction. "
         "The check feeds them made-up counters in the units ncu prints.",
    hint="a bandwidth unit is byte/second with an optional decimal prefix K, M, G or T (1e3 ... 1e12), a duration "
         "one of nsecond, usecond, msecond and second; the stall reason is the middle of the metric's name; "
         "a scheduler issues at most one instruction per cycle",
    check=_check_ncu_counters,
    planted={"binary_prefix": "decimal", "selected_kept": "includes 'selected'", "no_cap": "at most one per cycle"},
)

# ------------------------------------------------------------------------------------------- streams.8
def _pipeline_case(fn, args: tuple, want: float, why: str) -> None:
    """pipeline_time(*args) against ``want``; on a mismatch, what the learner's timeline got wrong."""
    where = compare.call_signature("pipeline_time", args, {})
    try:
        got = fn(*args)
    except NotImplementedError as exc:
        raise Failure(f"pipeline_time is not written yet ({exc})") from exc
    chunks = args[3]
    if (isinstance(got, (int, float)) and chunks > 1 and not math.isclose(got, want, rel_tol=1e-9)
            and math.isclose(got, want * chunks, rel_tol=1e-9)):
        raise Failure(f"{where} = {got:.6g}, expected {want:.6g}, {chunks} times too long: each chunk's stage "
                      f"took the whole buffer's time. A chunk is 1/{chunks} of the buffer, so its upload takes "
                      f"t_h / {chunks}", hint="chunk c's stages take t_h / C, t_k / C and t_d / C")
    if isinstance(got, (int, float)) and not isinstance(got, bool) and not math.isclose(got, want, rel_tol=1e-9):
        raise Failure(f"{where} = {got:.6g}, expected {want:.6g}: {why}")
    compare.number(where, got, want)


def _check_pipeline_time(run: Run) -> None:
    mod = run.module()
    with run.case("overlap_bound(): the sum of the stages over the slowest"):
        fn = getattr(mod, "overlap_bound", None)
        for args in ((8.0, 8.0, 8.0), (1.0, 10.0, 1.0), (2.0, 5.0, 3.0), (0.5, 0.25, 0.5)):
            compare.functions("overlap_bound", fn, lambda h, k, d: (h + k + d) / max(h, k, d), [args])
    fn = getattr(mod, "pipeline_time", None)
    if not callable(fn):
        raise Failure("pipeline_time is missing or not a function")
    with run.case("one stream, or one chunk: nothing overlaps, the time is t_h + t_k + t_d",
                  hint="a stream runs its work in order: on one stream chunk c + 1's upload waits for chunk c's "
                       "download (the chapter's v1: chunking alone buys nothing)"):
        for h, k, d, c, s in ((8.0, 8.0, 8.0, 4, 1), (8.0, 8.0, 8.0, 16, 1), (2.0, 5.0, 3.0, 7, 1),
                              (1.0, 10.0, 1.0, 1, 4)):
            _pipeline_case(fn, (h, k, d, c, s), h + k + d,
                           "faster than t_h + t_k + t_d, yet on one stream nothing overlaps: chunk c + 1's upload "
                           "is queued behind chunk c's download" if s == 1 else
                           "one chunk passes through the three stages one after the other")
    with run.case("3 streams or more: the chapter's T_C = (t_h + t_k + t_d) / C + (C - 1) / C max(t_h, t_k, t_d)",
                  hint="each unit does one chunk's stage at a time: the first chunk passes through all three "
                       "stages, then the slowest stage sets the pace, one chunk per max(t_h, t_k, t_d) / C"):
        for h, k, d, c, s in ((8.0, 8.0, 8.0, 4, 4), (8.0, 8.0, 8.0, 16, 16), (2.0, 5.0, 3.0, 7, 7),
                              (1.0, 10.0, 1.0, 4, 4), (8.0, 8.0, 8.0, 16, 3), (2.0, 5.0, 3.0, 10, 3),
                              (6.0, 1.0, 2.0, 5, 8), (5.0, 2.0, 5.0, 9, 4)):
            t_c = (h + k + d) / c + (c - 1) / c * max(h, k, d)
            _pipeline_case(fn, (h, k, d, c, s), t_c,
                           "each unit does one chunk's stage at a time (one H2D engine, one D2H engine, the SMs): "
                           "no schedule beats T_C, and with 3 streams or more nothing makes it wait longer")
    with run.case("2 streams, equal stages: (3C/2 + 1) chunk stages for an even number C of chunks",
                  hint="each stream does its chunks' stages in order: chunk c + 2's upload waits for chunk c's "
                       "download, so at most two chunks are in flight and at most two units busy"):
        for t, c in ((8.0, 4), (8.0, 16), (3.0, 6)):
            _pipeline_case(fn, (t, t, t, c, 2), (3 * c / 2 + 1) * t / c,
                           "with two streams chunk c + 2's upload waits for chunk c's download on the same stream")
    with run.case("2 streams, unequal stages, against the solution's timeline"):
        ref = run.solution().pipeline_time
        for args in ((2.0, 5.0, 3.0, 10, 2), (1.0, 10.0, 1.0, 8, 2), (6.0, 1.0, 2.0, 5, 2), (4.0, 1.0, 1.0, 7, 2)):
            _pipeline_case(fn, args, ref(*args), "the timeline differs from the solution's")


pipeline_time = Exercise(
    id="part3.streams.8", title="The timeline of a chunked copy-compute-copy pipeline", difficulty=3,
    kind="model", files=("part3/pipeline_time.py",),
    task="Model the chapter's pipeline on a timeline: the upload of the whole buffer takes t_h, the kernel t_k and "
         "the download t_d; the buffer is split into C equal chunks, chunk c goes to stream c mod S, and each "
         "stream queues its chunk's upload, kernel and download. A stream runs its work in order, and each of "
         "the three units (the H2D copy engine, the SMs, the D2H copy engine) does one chunk's stage at a time, "
         "in the order the chunks were queued. When does the last download end? Compare with the chapter's bound "
         "(the check holds the timeline to T_C from 3 streams up, and to the serial time on one stream), and "
         "answer exercise 2's question: why do 3 streams do as well as 4, and 8 no better?",
    hint="keep when each unit and each stream is free again; walk the chunks in order and, for each, its three "
         "stages: a stage starts at max(its unit free, its stream free), takes t / C, and then both are busy "
         "until it ends",
    check=_check_pipeline_time,
    planted={"no_stream_order": "one stream", "units_unlimited": "one chunk's stage at a time",
             "whole_buffer_stages": "whole buffer"},
)

# ------------------------------------------------------------------------------------------- tensor-cores.13
def _v6_chunk(row: int, chunk: int, per_row: int) -> int:
    """Where v6 stores chunk ``chunk`` of row ``row`` of a tile (csrc/part3/wmma_gemm.cu, swizzle)."""
    return row * per_row + (chunk ^ (row % 8))


def _call(fn, name: str, *args):
    try:
        return fn(*args)
    except NotImplementedError as exc:
        raise Failure(f"{name} is not written yet ({exc})") from exc


def _check_hoisted_ldmatrix(run: Run) -> None:
    mod = run.module()
    for name in ("lane_c0", "a_offset", "b_offset"):
        if not callable(getattr(mod, name, None)):
            raise Failure(f"{name} is missing or not a function")
    with run.case("lane_c0: one XOR term per lane for every step kk",
                  hint="2 kk is even, so 2 kk + h = 2 kk ^ h for h = lane // 16; XOR is associative"):
        for lane in range(32):
            c0 = _call(mod.lane_c0, "lane_c0", lane)
            for kk in range(4):
                want = (2 * kk + lane // 16) ^ (lane % 8)
                if (2 * kk) ^ c0 != want:
                    raise Failure(f"lane {lane}, kk = {kk}: (2 kk) ^ lane_c0 = {(2 * kk) ^ c0}, but v6 reads chunk "
                                  f"(2 kk + lane // 16) ^ (lane % 8) = {want}: lane_c0 must carry the lane's half "
                                  f"(lane // 16) as well as its row's XOR term (lane % 8)")
    with run.case("a_offset: every lane, slab and step of both warp rows, against v6's swizzle",
                  hint="the base (wm0 + lane % 16) * CA does not change; slab i adds 16 i rows; the chunk is "
                       "(2 kk) ^ c0, an XOR, not a sum"):
        for wm0 in (0, 64):
            for lane in range(32):
                for i in range(4):
                    for kk in range(4):
                        got = _call(mod.a_offset, "a_offset", wm0, lane, i, kk)
                        want = _v6_chunk(wm0 + 16 * i + lane % 16, 2 * kk + lane // 16, 8)
                        if got != want:
                            raise Failure(f"a_offset(wm0={wm0}, lane={lane}, i={i}, kk={kk}) = {got}, v6 reads "
                                          f"chunk {want} (row {wm0 + 16 * i + lane % 16}, chunk "
                                          f"{2 * kk + lane // 16} before the swizzle)")
    with run.case("b_offset: 64 x 64 warp tiles (wn0 = 0, 64) and 64 x 32 ones (wn0 = 32, 96)",
                  hint="the XOR permutes the 8 chunks of a 128-byte line: split (wn0 + 16 j) / 8 into the line, "
                       "(wn0 / 8) & ~7, which the XOR leaves alone, and the chunk in it, which it permutes"):
        for wn0, slabs in ((0, 4), (64, 4), (32, 2), (96, 2)):
            for lane in range(32):
                for j in range(slabs):
                    for kk in range(4):
                        got = _call(mod.b_offset, "b_offset", wn0, lane, j, kk)
                        want = _v6_chunk(16 * kk + lane % 16, (wn0 + 16 * j) // 8 + lane // 16, 16)
                        if got != want:
                            tiles = "64 x 32 warp tiles (wn0 not a multiple of 64)" if wn0 % 64 else "64 x 64"
                            raise Failure(f"b_offset(wn0={wn0}, lane={lane}, j={j}, kk={kk}) = {got}, v6 reads "
                                          f"chunk {want}, with {tiles}: the XOR acts on the chunk within its "
                                          f"128-byte line, so a part of wn0 / 8 below 8 must go inside it")


hoisted_ldmatrix = Exercise(
    id="part3.tensor-cores.13", title="v7's ldmatrix addresses, planned once per lane", difficulty=3,
    kind="python", files=("part3/hoisted_ldmatrix.py",),
    task="v6 computes every ldmatrix address from scratch: lane l reads row r of a tile at 16-byte chunk c, stored "
         "at chunk r * per_row + (c ^ (r % 8)). v7 plans them once per lane: a base, constants, and one XOR with a "
         "per-lane term c0. Write c0 and the planned A and B offsets so that they equal v6's for every warp, lane, "
         "step and slab; b_offset must also hold for 64 x 32 warp tiles (exercise 12).",
    hint="c0 = (lane // 16) ^ (lane % 8); A: (wm0 + lane % 16) * 8 + 128 i + ((2 kk) ^ c0); B: the row "
         "(lane % 16) * 16 + 256 kk, the line (wn0 // 8) & ~7, and inside it ((wn0 // 8) & 7) ^ (2 j) ^ c0",
    check=_check_hoisted_ldmatrix,
    planted={"plus_not_xor": "a_offset(", "c0_without_half": "lane's half", "wn0_outside_xor": "64 x 32 warp tiles"},
)


# ------------------------------------------------------------------------------------------- tensor-cores.14
# The PTX ISA's fragment layouts of mma.sync.m16n8k16 (f16 inputs, f32 sums), with g = lane // 4, t = lane % 4;
# what snippets/part3/mma_rate.py's reference uses and the GPU confirms (tests/test_ops.py on mma_rate).
_MMA_LAYOUTS = {
    "c_coords": ("sum e of C (16 x 8)", (16, 8), [(lane, e) for lane in range(32) for e in range(4)],
                 lambda lane, e: (lane // 4 + 8 * (e // 2), 2 * (lane % 4) + e % 2),
                 "sums e = 0, 1 are row g, columns 2t and 2t + 1; e = 2, 3 the same columns of row g + 8"),
    "a_coords": ("half h of register r of A (16 x 16)", (16, 16),
                 [(lane, r, h) for lane in range(32) for r in range(4) for h in range(2)],
                 lambda lane, r, h: (lane // 4 + 8 * (r % 2), 2 * (lane % 4) + 8 * (r // 2) + h),
                 "registers 0 and 1 are rows g and g + 8 at k = 2t, 2t + 1; registers 2 and 3 the same rows at "
                 "k + 8: the row changes first"),
    "b_coords": ("half h of register r of B (16 x 8)", (16, 8),
                 [(lane, r, h) for lane in range(32) for r in range(2) for h in range(2)],
                 lambda lane, r, h: (2 * (lane % 4) + 8 * r + h, lane // 4),
                 "B is read by columns: lane (g, t) holds column g, at k = 2t, 2t + 1 (register 0) and k + 8 "
                 "(register 1)"),
}


def _check_mma_layout(run: Run) -> None:
    mod = run.module()
    for name in _MMA_LAYOUTS:
        if not callable(getattr(mod, name, None)):
            raise Failure(f"{name} is missing or not a function")
    for name, (what, shape, args, isa, hint) in _MMA_LAYOUTS.items():
        with run.case(f"{name}: {what}, every lane", hint=hint):
            seen: dict[tuple[int, int], tuple] = {}
            for a in args:
                got = _call(getattr(mod, name), name, *a)
                if (not isinstance(got, tuple) or len(got) != 2
                        or not all(isinstance(v, int) and not isinstance(v, bool) for v in got)):
                    raise Failure(f"{name}{a} returned {got!r}: a (row, column) tuple of two ints")
                if not (0 <= got[0] < shape[0] and 0 <= got[1] < shape[1]):
                    raise Failure(f"{name}{a} = {got}, outside the {shape[0]} x {shape[1]} tile")
                if got in seen:
                    raise Failure(f"{name}{seen[got]} and {name}{a} are both {got}: each element of the tile "
                                  "is held by exactly one lane and register")
                seen[got] = a
                want = isa(*a)
                if got != want:
                    lane = a[0]
                    raise Failure(f"{name}{a} = {got}, the PTX ISA puts element {want} there (lane {lane}: "
                                  f"g = {lane // 4}, t = {lane % 4})")


mma_layout = Exercise(
    id="part3.tensor-cores.14", title="Where mma.sync's fragments live", difficulty=2, kind="python",
    files=("part3/mma_layout.py",),
    task="mma.sync.m16n8k16 takes A (16 x 16), B (16 x 8) and C (16 x 8) spread over the 32 lanes of a warp, each "
         "element at a place the PTX ISA fixes in terms of g = lane // 4 and t = lane % 4. Write the (row, column) "
         "that each lane's sums of C, and each half of its registers of A and B, hold.",
    hint="C: (g + 8 (e // 2), 2t + e % 2); A: (g + 8 (r % 2), 2t + 8 (r // 2) + h); B: (2t + 8 r + h, g)",
    check=_check_mma_layout,
    planted={"c_rows_by_t": "the PTX ISA puts element", "a_regs_k_first": "a_coords(",
             "b_as_rows": "b_coords("},
)


# ------------------------------------------------------------------------------------------- scan.10
def _check_striped_scan(run: Run) -> None:
    import numpy as np

    mine, ref = run.module(), run.solution()
    fn = getattr(mine, "striped_scan", None)
    if fn is None:
        raise Failure("striped_scan() is missing")
    order = ("each lane's four in order; the warp's inclusive scan of the lanes' last sums; the lane before's "
             "value (0 for lane 0) added to the running total of the rows before, and that onto the lane's four; "
             "then lane 31's inclusive value onto the running total")
    with run.case("striped_scan() on integers: the exact prefix sums (one row, and v11's 24 rows)",
                  hint="every element gets the sum of all elements up to it: " + order):
        for rows, seed in ((1, 0), (24, 1)):
            x = np.random.default_rng(seed).integers(-1000, 1000, rows * 128).astype(np.int32)
            got = np.asarray(fn(x.copy()))
            want = np.cumsum(x.astype(np.int64))
            if got.shape != x.shape:
                raise Failure(f"{rows} row(s): the result has shape {got.shape}, the segment {x.shape}")
            if not np.array_equal(got.astype(np.int64), want):
                bad = int(np.flatnonzero(got.astype(np.int64) != want)[0])
                raise Failure(f"{rows} row(s): wrong from element {bad} (row {bad // 128}, lane {bad % 128 // 4})")
    with run.case("striped_scan() on float32: v11's sums bit for bit (the same additions in the same order)",
                  hint="integers cannot tell orders apart, rounding can: " + order):
        x = np.random.default_rng(2).standard_normal(24 * 128).astype(np.float32)
        got = np.asarray(fn(x.copy()))
        want = ref.striped_scan(x.copy())
        if got.dtype != np.float32:
            raise Failure(f"the result is {got.dtype}, not float32: v11 adds in float32")
        if not np.array_equal(got.view(np.int32), want.view(np.int32)):
            bad = int(np.flatnonzero(got.view(np.int32) != want.view(np.int32))[0])
            raise Failure(f"element {bad} (row {bad // 128}, lane {bad % 128 // 4}) is {got[bad]!r}, v11 computes "
                          f"{want[bad]!r}: right within rounding, but not v11's order of additions")


striped_scan = Exercise(
    id="part3.scan.10", title="v11's order of additions, bit for bit", difficulty=3, kind="python",
    files=("part3/striped_scan.py",),
    task="v11 scans a warp's segment where its 16-byte loads put it: row k is 128 consecutive elements, lane l "
         "holding elements 4l .. 4l + 3 of it. Write the segment's inclusive prefix sums in exactly v11's order of "
         "additions (the listing's step 2), so that float32 results equal the kernel's bit for bit.",
    hint="rows = segment.reshape(-1, 32, 4); per row: the lane's running sums over its four, incl = "
         "warp_inclusive_scan(the lanes' last sums), excl = incl shifted down one lane (0 for lane 0), "
         "before = seg + excl added to the four, then seg = seg + incl[31]",
    check=_check_striped_scan,
    planted={"no_row_chain": "wrong from element 128", "lane_inclusive": "wrong from element 0",
             "carry_last": "not v11's order of additions"},
)


EXERCISES = [metrics, fused_intensity, gemm_intensity, scan_work, warp_scan, atomic_sum, matmul_cuda, validate,
             hist_per_warp, ncu_counters, pipeline_time, hoisted_ldmatrix, striped_scan, mma_layout]
