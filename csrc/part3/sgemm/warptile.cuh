// The warp-tiled SGEMM main loop shared by v7 (one shared-memory buffer) and v8 (two).
//
// Every load and store is bounds-checked, and the tiled versions fill the parts of a tile outside
// the matrices with zeros (which add nothing to a dot product), so any M, N, K >= 1 is correct.
// Sizes are 32-bit (the launcher checks them), offsets into the matrices are 64-bit (size_t): M * K
// may pass 2^31.
#pragma once
#include "common.cuh"

// --8<-- [start:warp_tiling]
// v7 and v8: the block tile is split among warps, WARPS_M x WARPS_N warp tiles of WM x WN. Inside a
// warp tile the 32 lanes form an 8 x 4 grid (LANES_M x LANES_N); lane (lm, ln) owns the 4x4 pieces
// at rows im * (WM / 2) + lm * 4 and columns jn * (WN / 2) + ln * 4, for im, jn in {0, 1}: 8x8
// results in all. Per k, a warp's A reads are 8 distinct consecutive float4s (128 bytes) and its B
// reads 4 (64 bytes): no bank conflicts, every other lane's read is a broadcast. STAGES = 2
// double-buffers the shared tiles: the next tile's global loads are issued before the current
// tile's FMAs and land in the other buffer after.
template <int BM, int BN, int BK, int WM, int WN, int PAD, int STAGES, int NT>
__device__ __forceinline__ void sgemm_warp(const float* __restrict__ A, const float* __restrict__ B,
                                           float* __restrict__ C, int M, int N, int K) {
    constexpr int LANES_M = 8, LANES_N = 4;                  // 32 lanes
    constexpr int TM = 2 * 4, TN = 2 * 4;                    // two 4-wide pieces in each direction
    static_assert(WM == 2 * 4 * LANES_M && WN == 2 * 4 * LANES_N,
                  "warp tile = 2x2 pieces of 4x4 per lane");
    static_assert(BM % WM == 0 && BN % WN == 0, "whole warp tiles in a block tile");
    static_assert(STAGES == 1 || STAGES == 2, "single or double buffering");
    constexpr int WARPS_N = BN / WN;
    static_assert((BM / WM) * WARPS_N * 32 == NT, "one warp per warp tile");
    __shared__ __align__(16) float sAT[STAGES][BK][BM + PAD];  // (STAGES, BK, BM + PAD)
    __shared__ __align__(16) float sB[STAGES][BK][BN];         // (STAGES, BK, BN)
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    // this warp's tile in the block tile
    const int wm0 = (warp / WARPS_N) * WM, wn0 = (warp % WARPS_N) * WN;
    const int lm = lane / LANES_N, ln = lane % LANES_N;
    const bool vecA = vec_ok(A, K), vecB = vec_ok(B, N), vecC = vec_ok(C, N);
    TileLoader<BM, BN, BK, NT> ld;
    float rC[TM][TN] = {{0.f}};  // (TM, TN): rows {0..3, WM/2 .. WM/2+3} + lm*4, same for columns
    float rA[TM], rB[TN];
    const int tiles = (K + BK - 1) / BK;

    ld.load(A, B, M, N, K, row0, col0, 0, vecA, vecB, tid);
    ld.store(sAT[0], sB[0], tid);
    __syncthreads();
    for (int t = 0; t < tiles; ++t) {
        const int cur = STAGES == 2 ? t % 2 : 0;  // the buffer holding tile t
        // fetch tile t + 1 into registers; it arrives during the FMAs
        if constexpr (STAGES == 2) if (t + 1 < tiles)
            ld.load(A, B, M, N, K, row0, col0, (t + 1) * BK, vecA, vecB, tid);
#pragma unroll
        for (int k = 0; k < BK; ++k) {
#pragma unroll
            for (int im = 0; im < 2; ++im)
                lds4(&rA[im * 4], &sAT[cur][k][wm0 + im * (WM / 2) + lm * 4]);
#pragma unroll
            for (int jn = 0; jn < 2; ++jn)
                lds4(&rB[jn * 4], &sB[cur][k][wn0 + jn * (WN / 2) + ln * 4]);
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) rC[i][j] += rA[i] * rB[j];
        }
        if (t + 1 < tiles) {
            if constexpr (STAGES == 2) {
                // buffer cur ^ 1 was last read in step t - 1, which every thread finished before
                // the barrier that ended it: safe to overwrite without another barrier
                ld.store(sAT[cur ^ 1], sB[cur ^ 1], tid);
            } else {
                __syncthreads();  // everyone is done reading the single buffer
                ld.load(A, B, M, N, K, row0, col0, (t + 1) * BK, vecA, vecB, tid);
                ld.store(sAT[0], sB[0], tid);
            }
            __syncthreads();  // the next tile is complete before anyone reads it
        }
    }
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int r = row0 + wm0 + (i / 4) * (WM / 2) + lm * 4 + i % 4;
#pragma unroll
        for (int jn = 0; jn < 2; ++jn) {
            const int j = jn * 4;
            store4(C, r, col0 + wn0 + jn * (WN / 2) + ln * 4, M, N, vecC,
                   make_float4(rC[i][j], rC[i][j + 1], rC[i][j + 2], rC[i][j + 3]));
        }
    }
}
// --8<-- [end:warp_tiling]
