// Vector addition as a complete program: allocate, copy in, launch, check, copy out, verify,
// time, free.
//
//   nvcc -std=c++17 -O3 -arch=native -I csrc/common -o vector_add csrc/part1/vector_add_main.cu
//   ./vector_add            # n = 2^24
//   ./vector_add 1000003    # any n >= 1; not a multiple of the block size exercises the
//                           # bounds check
//
// The kernels that the Python side of the book calls live in elementwise.cu; this file is the same
// first kernel with all the host code around it that a framework otherwise hides.
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "check.cuh"

// --8<-- [start:kernel]
__global__ void vector_add(const float* x, const float* y, float* out, long long n) {
    // Global index of this thread. 64-bit: blockIdx.x * blockDim.x is computed in 32-bit unsigned
    // arithmetic and wraps around past 2^32 elements, so widen before multiplying.
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {  // the grid is rounded up to whole blocks, so the last block runs past the end
        out[i] = x[i] + y[i];
    }
}
// --8<-- [end:kernel]

// Deterministic pseudo-random floats in [-1, 1): the same inputs on every run, and not all zeros,
// so a kernel that writes nothing (or writes x instead of x + y) cannot pass by accident.
static void fill_random(std::vector<float>& v, uint32_t seed) {
    uint32_t state = seed;
    for (float& e : v) {
        state = state * 1664525u + 1013904223u;  // a 32-bit linear congruential generator
        // top 24 bits: exactly representable in float
        e = (float)(state >> 8) * (2.0f / 16777216.0f) - 1.0f;
    }
}

int main(int argc, char** argv) {
    const int threads = 256;  // threads per block: a multiple of the 32-thread warp
    // Largest n whose grid fits gridDim.x (2^31 - 1 blocks).
    const long long max_n = (long long)INT_MAX * threads;
    long long n = 1LL << 24;
    if (argc > 1) {
        errno = 0;
        char* end = nullptr;
        n = std::strtoll(argv[1], &end, 10);
        if (errno != 0 || end == argv[1] || *end != '\0' || n <= 0 || n > max_n) n = -1;
    }
    if (argc > 2 || n <= 0) {
        std::fprintf(stderr, "usage: %s [n in 1..%lld]\n", argv[0], max_n);
        return 2;
    }

    // --8<-- [start:alloc_copy]
    size_t bytes = (size_t)n * sizeof(float);
    std::vector<float> h_x(n), h_y(n), h_out(n);
    fill_random(h_x, 1);
    fill_random(h_y, 2);

    // Device memory is separate from host memory: the kernel can only dereference pointers from
    // cudaMalloc (or managed/mapped memory), and the data must be copied there explicitly.
    float *d_x = nullptr, *d_y = nullptr, *d_out = nullptr;
    CUDA_CHECK(cudaMalloc(&d_x, bytes));
    CUDA_CHECK(cudaMalloc(&d_y, bytes));
    CUDA_CHECK(cudaMalloc(&d_out, bytes));
    CUDA_CHECK(cudaMemcpy(d_x, h_x.data(), bytes, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_y, h_y.data(), bytes, cudaMemcpyHostToDevice));
    // --8<-- [end:alloc_copy]

    // --8<-- [start:launch_check]
    // Enough blocks to give every element a thread: ceil(n / threads), rounded up so the tail
    // is covered.
    unsigned blocks = (unsigned)((n + threads - 1) / threads);
    vector_add<<<blocks, threads>>>(d_x, d_y, d_out, n);
    CUDA_CHECK_LAST();  // launch errors (bad configuration, no kernel image for this GPU)
    // cudaMemcpy waits for the kernel, and reports any error the kernel hit while running.
    CUDA_CHECK(cudaMemcpy(h_out.data(), d_out, bytes, cudaMemcpyDeviceToHost));

    // The GPU rounds a float add exactly as the CPU does (IEEE 754, round to nearest even), so the
    // results must match bit for bit; any difference is a bug, not rounding.
    double max_err = 0.0;
    long long first_bad = -1;
    for (long long i = 0; i < n; ++i) {
        float expected = h_x[i] + h_y[i];
        double err = std::fabs((double)h_out[i] - (double)expected);
        // a NaN sticks: NaN > x is always false
        if (std::isnan(err) || err > max_err) max_err = err;
        if (first_bad < 0 && h_out[i] != expected) first_bad = i;
    }
    std::printf("max abs error: %g\n", max_err);
    if (first_bad >= 0) {
        std::printf("FAILED at i=%lld: got %.9g, expected %.9g\n", first_bad, h_out[first_bad],
                    h_x[first_bad] + h_y[first_bad]);
        return 1;  // the OS frees the device memory with the process
    }
    std::printf("PASSED n=%lld\n", n);
    // --8<-- [end:launch_check]

    // --8<-- [start:timing]
    // CUDA events are timestamps recorded on the GPU's own timeline, so they measure the kernel,
    // not the host's launch overhead. The first launch of a kernel pays one-time costs (module
    // load, clocks ramping up), so run it once untimed, then average several timed launches.
    const int reps = 10;
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    vector_add<<<blocks, threads>>>(d_x, d_y, d_out, n);  // warm-up
    CUDA_CHECK_LAST();
    CUDA_CHECK(cudaEventRecord(start));
    for (int r = 0; r < reps; ++r) vector_add<<<blocks, threads>>>(d_x, d_y, d_out, n);
    CUDA_CHECK_LAST();
    CUDA_CHECK(cudaEventRecord(stop));
    CUDA_CHECK(cudaEventSynchronize(stop));  // wait until the GPU has passed `stop`
    float total_ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&total_ms, start, stop));
    double ms = total_ms / reps;
    // Bytes that must cross DRAM: read x, read y, write out, 4 bytes each. This is a DRAM bandwidth
    // only when the arrays are much larger than the L2 cache (tens of MB); for small n the time is
    // mostly launch overhead.
    double gbps = 3.0 * (double)n * sizeof(float) / (ms * 1e-3) / 1e9;
    std::printf("kernel: %.4f ms, %.1f GB/s (3*n*4 bytes)\n", ms, gbps);
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    // --8<-- [end:timing]

    // --8<-- [start:cleanup]
    // Every cudaMalloc needs its cudaFree; in a long-running process (a training job, a server) a
    // leak here is a leak of GPU memory, which is far scarcer than host memory. The host vectors
    // free themselves.
    CUDA_CHECK(cudaFree(d_x));
    CUDA_CHECK(cudaFree(d_y));
    CUDA_CHECK(cudaFree(d_out));
    // --8<-- [end:cleanup]
    return 0;
}
