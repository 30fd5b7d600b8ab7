// SGEMM, C = A @ B, row-major fp32 A (M x K), B (K x N), C (M x N), plain IEEE fp32 FMAs. Step 6 of
// the ladder in docs/part3/sgemm.md, launched by snippets/part3/sgemm.py (CuPy/NVRTC).
//
// v6  like v5 with 16-byte float4 global loads, the A tile stored transposed (and padded) in shared
//     memory, and float4 shared-memory reads of both fragments
//
// Every load and store is bounds-checked, and the tiled versions fill the parts of a tile outside
// the matrices with zeros (which add nothing to a dot product), so any M, N, K >= 1 is correct.
// Sizes are 32-bit (the launcher checks them), offsets into the matrices are 64-bit (size_t): M * K
// may pass 2^31.
#include "common.cuh"

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
// v6: v5's tiling (BM = BN = 128, BK = 8, 8x8 per thread, 256 threads) with float4 everywhere it
// fits. PAD = 4: rows of sAT are BM + 4 floats. With BK = 8 a warp's transposed stores hit sAT[c +
// j][r] for r = 0..15 and c in {0, 4}: without padding, rows 128 words apart start in the same
// bank, and c = 0 and c = 4 collide (2-way); 132 = 4 (mod 32) shifts row c + j by 4(c + j) banks,
// so the two halves land on banks 0..15 and 16..31. 132 floats keep each row 16-byte aligned for
// the float4 reads.
template <int BM, int BN, int BK, int TM, int TN, int PAD, int NT>
__device__ __forceinline__ void sgemm_vec(const float* __restrict__ A, const float* __restrict__ B,
                                          float* __restrict__ C, int M, int N, int K) {
    static_assert((BM / TM) * (BN / TN) == NT, "one thread per TM x TN sub-tile");
    static_assert(TM % 4 == 0 && TN % 4 == 0 && PAD % 4 == 0,
                  "float4 fragments and 16-byte-aligned rows");
    __shared__ __align__(16) float sAT[BK][BM + PAD];  // (BK, BM + PAD): A tile, transposed
    __shared__ __align__(16) float sB[BK][BN];         // (BK, BN)
    const int tid = threadIdx.x;
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    const int tr = (tid / (BN / TN)) * TM, tc = (tid % (BN / TN)) * TN;
    const bool vecA = vec_ok(A, K), vecB = vec_ok(B, N), vecC = vec_ok(C, N);
    TileLoader<BM, BN, BK, NT> ld;
    float rC[TM][TN] = {{0.f}};  // (TM, TN)
    float rA[TM], rB[TN];
    for (int k0 = 0; k0 < K; k0 += BK) {
        ld.load(A, B, M, N, K, row0, col0, k0, vecA, vecB, tid);
        ld.store(sAT, sB, tid);
        __syncthreads();
#pragma unroll
        for (int k = 0; k < BK; ++k) {
#pragma unroll
            for (int i = 0; i < TM; i += 4) lds4(&rA[i], &sAT[k][tr + i]);
#pragma unroll
            for (int j = 0; j < TN; j += 4) lds4(&rB[j], &sB[k][tc + j]);
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
        for (int j = 0; j < TN; j += 4)
            store4(C, row0 + tr + i, col0 + tc + j, M, N, vecC,
                   make_float4(rC[i][j], rC[i][j + 1], rC[i][j + 2], rC[i][j + 3]));
}

extern "C" __global__ void __launch_bounds__(THREADS)
    sgemm_v6(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
             int M, int N, int K) {
    sgemm_vec<TILE_M, TILE_N, TILE_K, /*TM=*/8, /*TN=*/8, /*PAD=*/4, THREADS>(A, B, C, M, N, K);
}
// --8<-- [end:kernel]
