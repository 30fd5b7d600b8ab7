// SGEMM, C = A @ B, row-major fp32 A (M x K), B (K x N), C (M x N), plain IEEE fp32 FMAs. Step 5 of
// the ladder in docs/part3/sgemm.md, launched by snippets/part3/sgemm.py (CuPy/NVRTC).
//
// v5  2-D register tiling: a 128x128 block tile, BK = 8, each thread computes an 8x8 sub-tile
//
// Every load and store is bounds-checked, and the tiled versions fill the parts of a tile outside
// the matrices with zeros (which add nothing to a dot product), so any M, N, K >= 1 is correct.
// Sizes are 32-bit (the launcher checks them), offsets into the matrices are 64-bit (size_t): M * K
// may pass 2^31.

// This step's launch configuration, CONFIGS in snippets/part3/sgemm.py, which passes it as -D
// options: the block tile TILE_M x TILE_N, its step TILE_K along K and the THREADS per block. The
// defaults let this file compile alone.
#ifndef TILE_M
#define TILE_M 128
#define TILE_N 128
#define TILE_K 8
#define THREADS 256
#endif

// --8<-- [start:kernel]
// v5: a BM x BN tile of C per block of (BM / TM) * (BN / TN) threads; thread (tr, tc) owns the TM x
// TN sub-tile at rows tr * TM.., columns tc * TN... Per k it reads TM values of A and TN of B from
// shared memory into registers and does TM * TN FMAs with them: (TM * TN) / (TM + TN) FMAs per
// shared load.
template <int BM, int BN, int BK, int TM, int TN, int NT>
__device__ __forceinline__ void sgemm_2d(const float* __restrict__ A, const float* __restrict__ B,
                                         float* __restrict__ C, int M, int N, int K) {
    static_assert((BM / TM) * (BN / TN) == NT, "one thread per TM x TN sub-tile");
    static_assert((BM * BK) % NT == 0 && (BK * BN) % NT == 0, "whole loads per thread");
    __shared__ float sA[BM][BK];  // (BM, BK)
    __shared__ float sB[BK][BN];  // (BK, BN)
    const int tid = threadIdx.x;
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    // this thread's sub-tile in the tile
    const int tr = (tid / (BN / TN)) * TM, tc = (tid % (BN / TN)) * TN;
    float rC[TM][TN] = {{0.f}};  // (TM, TN) accumulators
    float rA[TM], rB[TN];        // (TM,), (TN,) fragments of A and B for one k
    for (int k0 = 0; k0 < K; k0 += BK) {
        // consecutive threads: consecutive elements of a row
#pragma unroll
        for (int i = 0; i < BM * BK / NT; ++i) {
            const int idx = tid + i * NT, r = idx / BK, c = idx % BK;
            sA[r][c] = (row0 + r < M && k0 + c < K) ? A[(size_t)(row0 + r) * K + k0 + c] : 0.f;
        }
#pragma unroll
        for (int i = 0; i < BK * BN / NT; ++i) {
            const int idx = tid + i * NT, r = idx / BN, c = idx % BN;
            sB[r][c] = (k0 + r < K && col0 + c < N) ? B[(size_t)(k0 + r) * N + col0 + c] : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < BK; ++k) {
#pragma unroll
            for (int i = 0; i < TM; ++i) rA[i] = sA[tr + i][k];
#pragma unroll
            for (int j = 0; j < TN; ++j) rB[j] = sB[k][tc + j];
            // outer product of the fragments
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) rC[i][j] += rA[i] * rB[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int r = row0 + tr + i, c = col0 + tc + j;
            if (r < M && c < N) C[(size_t)r * N + c] = rC[i][j];
        }
}

extern "C" __global__ void __launch_bounds__(THREADS)
    sgemm_v5(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
             int M, int N, int K) {
    // 128 x 128 tile, BK = 8 and 256 threads from the launcher
    sgemm_2d<TILE_M, TILE_N, TILE_K, /*TM=*/8, /*TN=*/8, THREADS>(A, B, C, M, N, K);
}
// --8<-- [end:kernel]
