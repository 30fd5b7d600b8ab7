// SGEMM v15: v12's template (csrc/part3/sgemm/v11_tuned.cu, copied here whole so that v0 to
// v14's measured results keep their source hashes: a Part 3 kernel's hash covers every file of
// csrc/part3) with one change, the unchecked loads of the region "interior" below. v12's loop
// spends issue slots in every K-step of every block on its loads' bookkeeping (bounds compares,
// the branch to the scalar fallback, the addresses recomputed from the thread index); in a loop
// that is nearly all FFMAs, each slot another instruction takes is one an FFMA does not get.
// Those checks are needed at the edges of C only. Launched by snippets/part3/sgemm_v15.py, which
// autotunes over v12's configurations.
#include "../part3/sgemm/common.cuh"

// --8<-- [start:template]
// v12's template (see v11_tuned.cu for the tiling): a block of NT threads computes a BM x BN tile
// of C in steps of BK, warps of WM x WN, lanes of MI x NI pieces of 4 x 4 results; GROUP > 0
// orders the blocks in groups of GROUP tile rows; PAD pads the transposed A tile's rows.
template <int BM, int BN, int BK, int WM, int WN, int MI, int NI, int NT, int GROUP, int PAD>
__device__ __forceinline__ void sgemm_interior(const float* __restrict__ A,
                                            const float* __restrict__ B, float* __restrict__ C,
                                            int M, int N, int K) {
    constexpr int LANES_M = 8, LANES_N = 4;
    constexpr int TM = 4 * MI, TN = 4 * NI;  // results per lane in each direction
    static_assert(WM == MI * 4 * LANES_M && WN == NI * 4 * LANES_N,
                  "warp tile = MI x NI pieces of 4x4 per lane");
    static_assert(BM % WM == 0 && BN % WN == 0, "whole warp tiles in a block tile");
    static_assert((BM / WM) * (BN / WN) * 32 == NT, "one warp per warp tile");
    static_assert(2 * BK * (BM + PAD + BN) * 4 <= 48 * 1024,
                  "static shared memory is limited to 48 KB");
    constexpr int WARPS_N = BN / WN;
    __shared__ __align__(16) float sAT[2][BK][BM + PAD];  // (2, BK, BM + PAD): A tiles, transposed
    __shared__ __align__(16) float sB[2][BK][BN];         // (2, BK, BN)

    int bm = blockIdx.y, bn = blockIdx.x;  // this block's tile row and column
    if constexpr (GROUP > 0) {
        const int pid = blockIdx.y * gridDim.x + blockIdx.x, per_group = GROUP * gridDim.x;
        const int first = (pid / per_group) * GROUP, rows = min((int)gridDim.y - first, GROUP);
        bm = first + (pid % per_group) % rows;
        bn = (pid % per_group) / rows;
    }
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int row0 = bm * BM, col0 = bn * BN;
    const int wm0 = (warp / WARPS_N) * WM, wn0 = (warp % WARPS_N) * WN;
    const int lm = lane / LANES_N, ln = lane % LANES_N;
    const bool vecA = vec_ok(A, K), vecB = vec_ok(B, N), vecC = vec_ok(C, N);
    TileLoader<BM, BN, BK, NT> ld;
    float rC[TM][TN] = {{0.f}};  // (TM, TN) accumulators
    float rA[TM], rB[TN];
    const int tiles = (K + BK - 1) / BK;

    // --8<-- [start:interior]
    // What v15 adds: a block whose tile lies inside C, with 16-byte aligned rows, loads
    // every whole K-step of A and B with plain float4 loads, no check and no branch. A
    // thread's float4s of one step are NT / (BK / 4) rows of A (NT / (BN / 4) rows of B)
    // apart, at a column that does not change, so one pointer per operand, planned here,
    // steps by a constant. Other tiles (an edge block, a ragged last step, rows not
    // 16-byte aligned) take TileLoader::load, as in v12.
    const bool interior = vecA && vecB && row0 + BM <= M && col0 + BN <= N;
    const float* pa = A + (size_t)(row0 + tid / (BK / 4)) * K + (tid % (BK / 4)) * 4;
    const float* pb = B + (size_t)(tid / (BN / 4)) * N + col0 + (tid % (BN / 4)) * 4;
    const size_t step_a = (size_t)(NT / (BK / 4)) * K, step_b = (size_t)(NT / (BN / 4)) * N;
    auto load = [&](int k0) {
        if (interior && k0 + BK <= K) {
            const float* qa = pa + k0;
            const float* qb = pb + (size_t)k0 * N;
#pragma unroll
            for (int i = 0; i < ld.A4; ++i, qa += step_a)
                ld.rA[i] = *reinterpret_cast<const float4*>(qa);
#pragma unroll
            for (int i = 0; i < ld.B4; ++i, qb += step_b)
                ld.rB[i] = *reinterpret_cast<const float4*>(qb);
        } else {
            ld.load(A, B, M, N, K, row0, col0, k0, vecA, vecB, tid);
        }
    };
    // --8<-- [end:interior]

    load(0);
    ld.store(sAT[0], sB[0], tid);
    __syncthreads();
    for (int t = 0; t < tiles; ++t) {
        const int cur = t % 2;
        if (t + 1 < tiles) load((t + 1) * BK);
#pragma unroll
        for (int k = 0; k < BK; ++k) {
#pragma unroll
            for (int im = 0; im < MI; ++im)
                lds4(&rA[im * 4], &sAT[cur][k][wm0 + im * (WM / MI) + lm * 4]);
#pragma unroll
            for (int jn = 0; jn < NI; ++jn)
                lds4(&rB[jn * 4], &sB[cur][k][wn0 + jn * (WN / NI) + ln * 4]);
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) rC[i][j] += rA[i] * rB[j];
        }
        if (t + 1 < tiles) {
            // read last in step t - 1, before the last barrier
            ld.store(sAT[cur ^ 1], sB[cur ^ 1], tid);
            __syncthreads();
        }
    }
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int r = row0 + wm0 + (i / 4) * (WM / MI) + lm * 4 + i % 4;
#pragma unroll
        for (int jn = 0; jn < NI; ++jn)
            store4(C, r, col0 + wn0 + jn * (WN / NI) + ln * 4, M, N, vecC,
                   make_float4(rC[i][jn * 4], rC[i][jn * 4 + 1], rC[i][jn * 4 + 2],
                               rC[i][jn * 4 + 3]));
    }
}
// --8<-- [end:template]

// --8<-- [start:configs]
// One extern "C" kernel per configuration, named like v12's with sgemm_i_ for sgemm_t_.
#define SGEMM_INTERIOR(BM, BN, BK, WM, WN, NT, G, PAD)                                            \
    extern "C" __global__ void __launch_bounds__(NT)                                              \
        sgemm_i_##BM##x##BN##_k##BK##_w##WM##x##WN##_t##NT##_g##G##_p##PAD(                       \
            const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,      \
            int M, int N, int K) {                                                                \
        sgemm_interior<BM, BN, BK, WM, WN, WM / 32, WN / 16, NT, G, PAD>(A, B, C, M, N, K);       \
    }

// The configurations: TUNED in snippets/part3/sgemm.py, passed by snippets/part3/sgemm_v15.py as
// the -D option SGEMM_INTERIOR_CONFIGS. The default, TUNED's first entry alone, lets this file
// compile alone.
#ifndef SGEMM_INTERIOR_CONFIGS
#define SGEMM_INTERIOR_CONFIGS SGEMM_INTERIOR(128, 128, 8, 64, 64, 128, 0, 4)
#endif
SGEMM_INTERIOR_CONFIGS
// --8<-- [end:configs]
