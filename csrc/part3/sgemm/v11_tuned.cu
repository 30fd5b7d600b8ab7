// SGEMM, C = A @ B, row-major fp32 A (M x K), B (K x N), C (M x N), plain IEEE fp32 FMAs. Steps 11
// and 12 of the ladder in docs/part3/sgemm.md, launched by snippets/part3/sgemm.py (CuPy/NVRTC).
//
// v11  v8's double-buffered warp tiling made into one template over every tile size, used with
//      64x64 warp tiles: 128 results per thread instead of 64 (twice the FMAs per shared-memory
//      load), four warps a block
// v12  the same template at several tile configurations, one of which the launcher picks for each
//      shape by timing them all once (autotuning); the configurations include a grouped
//      ("swizzled") order of the blocks, which makes blocks that run at the same time share rows of
//      A and columns of B in L2
//
// Every load and store is bounds-checked, and the tiled versions fill the parts of a tile outside
// the matrices with zeros (which add nothing to a dot product), so any M, N, K >= 1 is correct.
// Sizes are 32-bit (the launcher checks them), offsets into the matrices are 64-bit (size_t): M * K
// may pass 2^31.
#include "common.cuh"

// --8<-- [start:template]
// A block of NT threads computes a BM x BN tile of C in steps of BK along K. Its warps each own a
// WM x WN warp tile, and the 32 lanes of a warp form an 8 x 4 grid: lane (lm, ln) owns MI x NI
// pieces of 4 x 4 results, at rows im * (WM / MI) + lm * 4 and columns jn * (WN / NI) + ln * 4 of
// the warp tile. Per k a warp reads MI runs of 128 contiguous bytes of the (transposed) A tile and
// NI runs of 64 bytes of the B tile: no bank conflicts, and each lane does 16 * MI * NI FMAs on 4 *
// (MI + NI) values it loaded. PAD floats at the end of each row of the transposed A tile spread its
// scattered stores over the banks (PAD = 4, as in v6); PAD = 0 saves the space where a BK = 16 tile
// would not fit in 48 KB otherwise. GROUP > 0 reorders the blocks: consecutive block indices walk
// down GROUP tile rows before moving one tile column to the right, so the blocks resident at one
// time reuse a few panels of A and B from L2.
template <int BM, int BN, int BK, int WM, int WN, int MI, int NI, int NT, int GROUP, int PAD>
__device__ __forceinline__ void sgemm_tuned(const float* __restrict__ A,
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

    ld.load(A, B, M, N, K, row0, col0, 0, vecA, vecB, tid);
    ld.store(sAT[0], sB[0], tid);
    __syncthreads();
    for (int t = 0; t < tiles; ++t) {
        const int cur = t % 2;
        if (t + 1 < tiles) ld.load(A, B, M, N, K, row0, col0, (t + 1) * BK, vecA, vecB, tid);
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
// One extern "C" kernel per configuration; the name spells it out: block tile BMxBN, step BK, warp
// tile WMxWN, threads, gG for a grouped block order of G tile rows, and the padding pP. A lane owns
// MI x NI = WM / 32 x WN / 16 pieces of 4x4 results: the warp tile over its 8 x 4 lanes.
#define SGEMM_TUNED(BM, BN, BK, WM, WN, NT, G, PAD)                                               \
    extern "C" __global__ void __launch_bounds__(NT)                                              \
        sgemm_t_##BM##x##BN##_k##BK##_w##WM##x##WN##_t##NT##_g##G##_p##PAD(                       \
            const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,      \
            int M, int N, int K) {                                                                \
        sgemm_tuned<BM, BN, BK, WM, WN, WM / 32, WN / 16, NT, G, PAD>(A, B, C, M, N, K);          \
    }

// The configurations: TUNED in snippets/part3/sgemm.py, which passes them as the -D option
// SGEMM_TUNED_CONFIGS, one SGEMM_TUNED(BM, BN, BK, WM, WN, NT, G, PAD) each. The default, v11's
// configuration alone (TUNED's first entry), lets this file compile alone.
#ifndef SGEMM_TUNED_CONFIGS
#define SGEMM_TUNED_CONFIGS SGEMM_TUNED(128, 128, 8, 64, 64, 128, 0, 4)
#endif
SGEMM_TUNED_CONFIGS
// --8<-- [end:configs]
