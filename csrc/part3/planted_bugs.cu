// Two bugs that run without a visible failure, planted for compute-sanitizer to find, and
// their fixes.
//
//   nvcc -std=c++17 -O2 -lineinfo -arch=native -I csrc/common -o planted_bugs
//       csrc/part3/planted_bugs.cu
//   ./planted_bugs oob                                      # looks fine
//   compute-sanitizer --tool memcheck ./planted_bugs oob
//                                   # "Invalid __global__ write of size 4 bytes"
//   compute-sanitizer --tool memcheck ./planted_bugs oob-fixed
//   compute-sanitizer --tool racecheck ./planted_bugs race
//                                   # "Race reported between Write access ... and Read"
//   compute-sanitizer --tool racecheck ./planted_bugs race-fixed
//
// oob:  a kernel whose bounds check is off by one, so the first thread past the end writes one
//       float past the end of a cudaMalloc'd buffer. The allocation is rounded up to a larger
//       granule, so without the tool nothing faults and every element the program reads back
//       is right.
// race: a shared-memory tree sum that leaves out the __syncthreads() between each thread's write of
//       its own element and the first step's read of a neighbour's element (in another warp). The
//       result may well come out right: the bug is a missing guarantee, not a wrong formula.
//
// The program prints what it observed and exits 0 even when the device reports an error (under
// memcheck, the oob kernel is stopped at the bad write and the next synchronising call fails): the
// verdict belongs to the tool, and a non-zero exit here would only hide the tool's report behind
// the program's. Exit 2 on bad usage, 1 when setting up (cudaMalloc, copies) fails.
// -lineinfo lets the tool name the source line of each bad access; it does not change the
// generated code.
#include <cstdio>
#include <cstring>
#include <vector>

#include "check.cuh"

// threads per block in both kernels: 8 warps, so the race crosses warps
constexpr int THREADS = 256;

// --8<-- [start:oob]
// out[i] = i for i < n. With OFF_BY_ONE, the guard is `i <= n`: thread n (in the last block, which
// the grid rounds up to a whole block) passes it and writes out[n], one float past the end of
// the buffer.
template <bool OFF_BY_ONE>
__global__ void iota(float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    bool inside = OFF_BY_ONE ? i <= n : i < n;  // the planted bug: <= instead of <
    if (inside) out[i] = (float)i;
}
// --8<-- [end:oob]

// --8<-- [start:race]
// One sum per block of THREADS elements. Every thread stores its element in shared memory, then the
// upper half of the active range is folded onto the lower half until one value is left. The first
// fold reads s[t + 128], written by a thread of another warp: without MISSING_SYNC's barrier,
// nothing orders that write before the read.
template <bool MISSING_SYNC>
__global__ void block_sum(const float* x, float* block_sums) {
    __shared__ float s[THREADS];
    int t = threadIdx.x;
    s[t] = x[blockIdx.x * THREADS + t];
    if (!MISSING_SYNC) __syncthreads();  // the planted bug removes this barrier
    for (int stride = THREADS / 2; stride > 0; stride /= 2) {
        if (t < stride) s[t] += s[t + stride];
        __syncthreads();  // every later fold is ordered: only the first read is unprotected
    }
    if (t == 0) block_sums[blockIdx.x] = s[0];
}
// --8<-- [end:race]

// Reports a CUDA error raised by the kernel itself (not by the setup) and returns whether the run
// went through.
static bool kernel_ok(cudaError_t err, const char* what) {
    if (err == cudaSuccess) return true;
    std::printf("%s: the device reported \"%s\" (%s); the tool's report says where\n", what,
                cudaGetErrorString(err), cudaGetErrorName(err));
    return false;
}

static int run_oob(bool bug) {
    const int n = 1000;  // not a multiple of THREADS: the last block has 24 threads past the end
    const int blocks = (n + THREADS - 1) / THREADS;
    float* d_out = nullptr;
    CUDA_CHECK(cudaMalloc(&d_out, n * sizeof(float)));  // exactly n floats: out[n] is past the end
    if (bug) {
        iota<true><<<blocks, THREADS>>>(d_out, n);
    } else {
        iota<false><<<blocks, THREADS>>>(d_out, n);
    }
    CUDA_CHECK_LAST();  // a bad launch configuration is a real error, whatever the mode
    std::vector<float> h(n);
    // Not CUDA_CHECK: under memcheck the planted bug stops the kernel, and this call returns
    // its error.
    if (!kernel_ok(cudaMemcpy(h.data(), d_out, n * sizeof(float), cudaMemcpyDeviceToHost),
                   "iota")) return 0;
    int wrong = 0;
    for (int i = 0; i < n; ++i) wrong += h[i] != (float)i;
    std::printf("%s: n = %d, %d blocks x %d threads, guard i %s n; "
                "elements not equal to their index: %d\n",
                bug ? "oob" : "oob-fixed", n, blocks, THREADS, bug ? "<=" : "<", wrong);
    CUDA_CHECK(cudaFree(d_out));
    return 0;
}

static int run_race(bool bug) {
    const int blocks = 4;
    const int n = blocks * THREADS;
    std::vector<float> h_x(n), h_sums(blocks);
    // small integers: every order of the sum is exact
    for (int i = 0; i < n; ++i) h_x[i] = (float)(i % 7);
    float *d_x = nullptr, *d_sums = nullptr;
    CUDA_CHECK(cudaMalloc(&d_x, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_sums, blocks * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(d_x, h_x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    if (bug) {
        block_sum<true><<<blocks, THREADS>>>(d_x, d_sums);
    } else {
        block_sum<false><<<blocks, THREADS>>>(d_x, d_sums);
    }
    CUDA_CHECK_LAST();
    if (!kernel_ok(cudaMemcpy(h_sums.data(), d_sums, blocks * sizeof(float),
                              cudaMemcpyDeviceToHost),
                   "block_sum")) {
        return 0;
    }
    int wrong = 0;
    for (int b = 0; b < blocks; ++b) {
        float expected = 0.0f;
        for (int t = 0; t < THREADS; ++t) expected += h_x[b * THREADS + t];
        wrong += h_sums[b] != expected;
    }
    std::printf("%s: %d blocks x %d threads, %s the first fold; "
                "block sums that differ from the host's: %d\n",
                bug ? "race" : "race-fixed", blocks, THREADS,
                bug ? "no barrier before" : "a barrier before", wrong);
    CUDA_CHECK(cudaFree(d_x));
    CUDA_CHECK(cudaFree(d_sums));
    return 0;
}

int main(int argc, char** argv) {
    const char* modes[] = {"oob", "oob-fixed", "race", "race-fixed"};
    int mode = -1;
    for (int m = 0; argc == 2 && m < 4; ++m) {
        if (std::strcmp(argv[1], modes[m]) == 0) mode = m;
    }
    if (mode < 0) {
        std::fprintf(stderr, "usage: %s oob|oob-fixed|race|race-fixed\n", argv[0]);
        return 2;
    }
    return mode < 2 ? run_oob(mode == 0) : run_race(mode == 2);
}
