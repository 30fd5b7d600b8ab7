// cublas_sgemm.cu: the SGEMM chapter's baseline (v0) without PyTorch. One C = A B in IEEE fp32
// through cublasSgemm for square M = N = K matrices, timed with CUDA events, checked against a CPU
// dot product in double precision.
//
// It lives in csrc/standalone/, not csrc/part3/: every file under csrc/part3/ is in the hash of
// Part 3's measured results (snippets/hashing.py), and this program is no part of them.
//
//   nvcc -std=c++17 -O2 -arch=native -I csrc/common -o cublas_sgemm      (one command line)
//        csrc/standalone/cublas_sgemm.cu -lcublas
//   ./cublas_sgemm [N] [WARMUP] [REPS]        # defaults: 4096 5 20
//
// The matrices are row-major (C's convention, and torch's); cuBLAS is column-major (Fortran's).
// The program keeps row-major storage and asks cuBLAS for the transposed product instead: see
// `sgemm_row_major`.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "check.cuh"

// --8<-- [start:check]
// cuBLAS calls return cublasStatus_t, not cudaError_t: the same idea as CUDA_CHECK, its own type.
#define CUBLAS_CHECK(call)                                                                     \
    do {                                                                                       \
        cublasStatus_t st_ = (call);                                                           \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                                    \
            std::fprintf(stderr, "cuBLAS error at %s:%d: %s failed: %s\n", __FILE__, __LINE__, \
                         #call, cublasGetStatusString(st_));                                   \
            std::exit(1);                                                                      \
        }                                                                                      \
    } while (0)
// --8<-- [end:check]

// Deterministic inputs in [-0.5, 0.5): a 32-bit integer hash of the index (no RNG state, so the CPU
// check can recompute any element without keeping a copy of the matrix).
static float fill_value(unsigned long long i, unsigned seed) {
    unsigned h = static_cast<unsigned>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    return static_cast<float>(h & 0xFFFFFF) / 16777216.0f - 0.5f;
}

static long parse_positive(const char* text, const char* what, long max) {
    char* end = nullptr;
    long v = std::strtol(text, &end, 10);
    if (end == text || *end != '\0' || v <= 0 || v > max) {
        std::fprintf(stderr, "cublas_sgemm: %s must be an integer in 1..%ld, got '%s'\n", what, max,
                     text);
        std::exit(2);
    }
    return v;
}

// --8<-- [start:row_major_call]
// Row-major A (M x K), B (K x N), C (M x N). Read column-major, the same bytes are A^T (K x M),
// B^T (N x K) and C^T (N x M). Since C^T = B^T A^T, asking cuBLAS for the column-major product of
// "B" (N x K, leading dimension N) and "A" (K x M, leading dimension K) writes C^T column-major,
// which is C row-major. No copy and no transpose flag: the operands swap places, and so do M and N.
static void sgemm_row_major(cublasHandle_t handle, int m, int n, int k, const float* dA,
                            const float* dB, float* dC) {
    const float alpha = 1.0f, beta = 0.0f;
    CUBLAS_CHECK(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N,
                             n, m, k,        // C^T is n x m, the inner dimension is k
                             &alpha, dB, n,  // B^T: n x k column-major, leading dimension n
                             dA, k,          // A^T: k x m column-major, leading dimension k
                             &beta, dC, n)); // C^T: n x m column-major, leading dimension n
}
// --8<-- [end:row_major_call]

int main(int argc, char** argv) {
    // 32768^2 floats is 4 GiB per matrix: the three fit an 80 GB GPU, and the index fits 64 bits.
    const long n = argc > 1 ? parse_positive(argv[1], "N", 32768) : 4096;
    const int warmup = argc > 2 ? static_cast<int>(parse_positive(argv[2], "WARMUP", 1000)) : 5;
    const int reps = argc > 3 ? static_cast<int>(parse_positive(argv[3], "REPS", 10000)) : 20;
    const int m = static_cast<int>(n), k = static_cast<int>(n);
    const size_t elems = static_cast<size_t>(n) * static_cast<size_t>(n);

    std::vector<float> hA(elems), hB(elems), hC(elems, NAN);
    for (size_t i = 0; i < elems; ++i) {
        hA[i] = fill_value(i, 0x1234u);
        hB[i] = fill_value(i, 0xABCDu);
    }
    float *dA, *dB, *dC;
    CUDA_CHECK(cudaMalloc(&dA, elems * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&dB, elems * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&dC, elems * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(dA, hA.data(), elems * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dB, hB.data(), elems * sizeof(float), cudaMemcpyHostToDevice));
    // all bits set is a NaN: an element cuBLAS did not write fails the check
    CUDA_CHECK(cudaMemset(dC, 0xFF, elems * sizeof(float)));

    // --8<-- [start:setup]
    cublasHandle_t handle;
    CUBLAS_CHECK(cublasCreate(&handle));
    // IEEE fp32 on the FMA pipes, as the book's kernels compute and as torch.matmul with TF32 off:
    // the default math mode. CUBLAS_TF32_TENSOR_OP_MATH (or NVIDIA_TF32_OVERRIDE=1 in the
    // environment) would let cuBLAS round every input to TF32's 10-bit mantissa, and the check
    // below would fail.
    CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));
    // --8<-- [end:setup]

    // --8<-- [start:timing]
    // Warm-up calls pick cuBLAS's kernel for the shape and load it; then one event between two
    // calls, the median of `reps` calls reported (events time the GPU's stream, not the host).
    for (int i = 0; i < warmup; ++i) sgemm_row_major(handle, m, m, k, dA, dB, dC);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<cudaEvent_t> marks(reps + 1);
    for (auto& e : marks) CUDA_CHECK(cudaEventCreate(&e));
    CUDA_CHECK(cudaEventRecord(marks[0]));
    for (int i = 0; i < reps; ++i) {
        sgemm_row_major(handle, m, m, k, dA, dB, dC);
        CUDA_CHECK(cudaEventRecord(marks[i + 1]));
    }
    CUDA_CHECK(cudaEventSynchronize(marks[reps]));
    CUDA_CHECK(cudaGetLastError());
    std::vector<float> ms(reps);
    for (int i = 0; i < reps; ++i) CUDA_CHECK(cudaEventElapsedTime(&ms[i], marks[i], marks[i + 1]));
    std::sort(ms.begin(), ms.end());
    const double median_ms = ms[reps / 2], best_ms = ms[0];
    const double nd = static_cast<double>(n);
    const double flops = 2.0 * nd * nd * nd;  // one multiply and one add per (i, j, k)
    // --8<-- [end:timing]

    CUDA_CHECK(cudaMemcpy(hC.data(), dC, elems * sizeof(float), cudaMemcpyDeviceToHost));

    // --8<-- [start:check_result]
    // A few elements (the corners, the middle, a spread of others) against a dot product in double.
    // The bound is the classic one for a length-K dot product in fp32, K * eps * sum |a_i b_i| with
    // eps = FLT_EPSILON (twice the unit roundoff): any summation order cuBLAS picks stays inside
    // it; TF32 inputs (2^13 times coarser) or a wrong leading dimension do not.
    const long picks[][2] = {{0, 0}, {0, n - 1}, {n - 1, 0}, {n - 1, n - 1}, {n / 2, n / 3},
                             {n / 3, n / 2}, {(7 * n) / 8, n / 5}, {n / 7, (5 * n) / 6}};
    int bad = 0;
    double worst = 0.0;
    for (const auto& p : picks) {
        const long r = p[0], c = p[1];
        double ref = 0.0, mag = 0.0;
        for (long i = 0; i < n; ++i) {
            const double prod = static_cast<double>(hA[r * n + i]) * hB[i * n + c];
            ref += prod;
            mag += std::fabs(prod);
        }
        const double got = hC[r * n + c], err = std::fabs(got - ref);
        const double bound = static_cast<double>(n) * FLT_EPSILON * mag;
        worst = std::max(worst, bound > 0 ? err / bound : err);
        if (!(err <= bound)) {  // also catches NaN
            std::fprintf(stderr, "C[%ld][%ld] = %.9g, reference %.9g, error %.3g > bound %.3g\n",
                         r, c, got, ref, err, bound);
            ++bad;
        }
    }
    // --8<-- [end:check_result]

    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    int version = 0;
    CUBLAS_CHECK(cublasGetVersion(handle, &version));
    std::printf("device: %s, cuBLAS %d\n", prop.name, version);
    std::printf("sgemm %ld x %ld x %ld fp32 (default math: no TF32), row-major via C^T = B^T A^T\n",
                n, n, n);
    std::printf("%d warm-up calls, %d timed calls\n", warmup, reps);
    std::printf("median %.3f ms  %.2f TFLOP/s\n", median_ms, flops / (median_ms * 1e-3) / 1e12);
    std::printf("best   %.3f ms  %.2f TFLOP/s\n", best_ms, flops / (best_ms * 1e-3) / 1e12);
    std::printf("check: %zu elements against a double-precision dot product, worst error %.3f of "
                "the bound: %s\n", sizeof(picks) / sizeof(picks[0]), worst, bad ? "FAILED" : "ok");

    for (auto& e : marks) CUDA_CHECK(cudaEventDestroy(e));
    CUBLAS_CHECK(cublasDestroy(handle));
    CUDA_CHECK(cudaFree(dA));
    CUDA_CHECK(cudaFree(dB));
    CUDA_CHECK(cudaFree(dC));
    return bad ? 1 : 0;
}
