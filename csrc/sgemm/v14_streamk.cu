// SGEMM v14 (Part 3): v11's warp-tiled loop in a persistent grid that shares out the last waves'
// work along K (stream-K). Loaded from Python by snippets/part3/sgemm_v14.py (CuPy/NVRTC), where it
// is version v14 of the sgemm op. It reuses the vector helpers and the tile loader of Part 3's
// sgemm/common.cuh.
//
// Why: a grid of one block per tile runs in waves of as many tiles as the GPU holds at once (S, the
// SMs times the blocks an SM fits). When the tile count T is not a multiple of S, the last wave is
// partly empty: at 4096^3 with 128 x 128 tiles, T = 1024 against S = 264 on an H200 is 3.88 waves
// run as 4, and the SMs idle for the missing 0.12 of a wave. Here the grid is exactly S blocks.
// Each takes whole tiles for all but the last two waves (data-parallel, as v11), and then an equal
// share of the remaining tiles' K-steps (T mod S + S tiles' worth, "stream-K"): every block does
// the same number of BK steps, so every SM finishes at about the same time.
//
// A tile whose K-steps fall to several blocks is summed at the end: each of its blocks writes its
// partial tile to a workspace and counts itself in on the tile's counter; the block that arrives
// last adds the partials in block order (not arrival order, so the result is the same on every
// run) and stores the tile. No block ever waits for another, so the grid may be any size.
//
// Every load and store is bounds-checked as in v11, so any M, N, K >= 1 is correct. Sizes are
// 32-bit (the launcher checks them), offsets 64-bit.
#include "../part3/sgemm/common.cuh"

// --8<-- [start:mainloop]
// v11's double-buffered loop over the K-steps [t0, t1) of one tile (BK each), added into rC. The
// warp and lane layout is v11's: warp tile WM x WN, lanes 8 x 4, MI x NI pieces of 4 x 4 a lane.
template <int BM, int BN, int BK, int WM, int WN, int MI, int NI, int NT, int PAD>
__device__ __forceinline__ void steps(float (*sAT)[BK][BM + PAD], float (*sB)[BK][BN],
                                      const float* __restrict__ A, const float* __restrict__ B,
                                      int M, int N, int K, int row0, int col0, int t0, int t1,
                                      bool vecA, bool vecB, float (&rC)[4 * MI][4 * NI]) {
    constexpr int TM = 4 * MI, TN = 4 * NI, WARPS_N = BN / WN;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int wm0 = (warp / WARPS_N) * WM, wn0 = (warp % WARPS_N) * WN;
    const int lm = lane / 4, ln = lane % 4;
    TileLoader<BM, BN, BK, NT> ld;
    float rA[TM], rB[TN];
    ld.load(A, B, M, N, K, row0, col0, t0 * BK, vecA, vecB, tid);
    __syncthreads();  // the previous tile's last step has been read by every warp
    ld.store(sAT[0], sB[0], tid);
    __syncthreads();
    for (int t = t0; t < t1; ++t) {
        const int cur = (t - t0) % 2;
        if (t + 1 < t1) ld.load(A, B, M, N, K, row0, col0, (t + 1) * BK, vecA, vecB, tid);
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
        if (t + 1 < t1) {
            ld.store(sAT[cur ^ 1], sB[cur ^ 1], tid);
            __syncthreads();
        }
    }
}
// --8<-- [end:mainloop]

// --8<-- [start:streamk]
// The first global K-step of block b's share of the stream-K part: I steps over P blocks, as
// evenly as integers allow (shares differ by at most one step; the launcher keeps I >= P, so none
// is empty).
__device__ __forceinline__ long long share_begin(int b, long long I, int P) {
    return (long long)b * I / P;
}
// The block whose share holds global step g: the largest b with share_begin(b) <= g.
__device__ __forceinline__ int share_owner(long long g, long long I, int P) {
    return (int)(((g + 1) * P + I - 1) / I) - 1;
}

template <int BM, int BN, int BK, int WM, int WN, int MI, int NI, int NT, int GROUP, int PAD>
__device__ __forceinline__ void sgemm_streamk(const float* __restrict__ A,
                                              const float* __restrict__ B, float* __restrict__ C,
                                              int M, int N, int K, float* __restrict__ work,
                                              int* __restrict__ arrived, int dp_waves) {
    constexpr int TM = 4 * MI, TN = 4 * NI, WARPS_N = BN / WN;
    static_assert(WM == MI * 32 && WN == NI * 16, "warp tile = MI x NI pieces of 4x4 a lane");
    static_assert((BM / WM) * (BN / WN) * 32 == NT, "one warp per warp tile");
    static_assert(2 * BK * (BM + PAD + BN) * 4 <= 48 * 1024, "static shared memory: 48 KB");
    __shared__ __align__(16) float sAT[2][BK][BM + PAD];
    __shared__ __align__(16) float sB[2][BK][BN];

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int wm0 = (warp / WARPS_N) * WM, wn0 = (warp % WARPS_N) * WN;
    const int lm = lane / 4, ln = lane % 4;
    const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
    const int steps_per_tile = (K + BK - 1) / BK;
    const int P = gridDim.x, b = blockIdx.x;
    const bool vecA = vec_ok(A, K), vecB = vec_ok(B, N), vecC = vec_ok(C, N);

    // tile index -> (tile row, tile column), v11's grouped order: GROUP tile rows, then right
    auto origin = [&](int tile, int& row0, int& col0) {
        int bm = tile / tiles_n, bn = tile % tiles_n;
        if constexpr (GROUP > 0) {
            const int per_group = GROUP * tiles_n, first = (tile / per_group) * GROUP;
            const int rows = min(tiles_m - first, GROUP);
            bm = first + (tile % per_group) % rows;
            bn = (tile % per_group) / rows;
        }
        row0 = bm * BM, col0 = bn * BN;
    };
    // result (i, j) of this lane: row i / 4 * (WM / MI) + lm * 4 + i % 4, column j / 4 * (WN / NI)
    // + ln * 4 + j % 4 of the warp tile; stored a float4 (four columns) at a time
    auto row_of = [&](int row0, int i) {
        return row0 + wm0 + (i / 4) * (WM / MI) + lm * 4 + i % 4;
    };
    auto col_of = [&](int col0, int jn) { return col0 + wn0 + jn * (WN / NI) + ln * 4; };
    auto store_tile = [&](int row0, int col0, const float (&rC)[TM][TN]) {
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int jn = 0; jn < NI; ++jn)
                store4(C, row_of(row0, i), col_of(col0, jn), M, N, vecC,
                       make_float4(rC[i][jn * 4], rC[i][jn * 4 + 1], rC[i][jn * 4 + 2],
                                   rC[i][jn * 4 + 3]));
    };

    // 1. data-parallel waves: tile w * P + b, all of K
    for (int w = 0; w < dp_waves; ++w) {
        int row0, col0;
        origin(w * P + b, row0, col0);
        float rC[TM][TN] = {{0.f}};
        steps<BM, BN, BK, WM, WN, MI, NI, NT, PAD>(sAT, sB, A, B, M, N, K, row0, col0, 0,
                                                   steps_per_tile, vecA, vecB, rC);
        store_tile(row0, col0, rC);
    }
    // 2. stream-K: the remaining tiles' K-steps, numbered g = tile * steps_per_tile + k, cut
    // into P consecutive shares
    const int first_sk = dp_waves * P;
    const long long I = (long long)(tiles_m * tiles_n - first_sk) * steps_per_tile;
    const long long begin = share_begin(b, I, P), end = share_begin(b + 1, I, P);
    for (long long g = begin; g < end;) {
        const int tile = (int)(g / steps_per_tile);
        const int t0 = (int)(g % steps_per_tile);
        const int t1 = (int)min((long long)steps_per_tile, t0 + (end - g));
        g += t1 - t0;
        int row0, col0;
        origin(first_sk + tile, row0, col0);
        float rC[TM][TN] = {{0.f}};
        steps<BM, BN, BK, WM, WN, MI, NI, NT, PAD>(sAT, sB, A, B, M, N, K, row0, col0, t0, t1,
                                                   vecA, vecB, rC);
        if (t0 == 0 && t1 == steps_per_tile) {  // the whole tile fell to this block
            store_tile(row0, col0, rC);
            continue;
        }
        // a split tile: publish this block's partial in its slot (2 b: the tile its share starts
        // in, 2 b + 1: the one it ends in), float4 i of thread tid at i * NT + tid (coalesced)
        const long long tile_g0 = (long long)tile * steps_per_tile;
        const int lo = share_owner(tile_g0, I, P);
        const int hi = share_owner(tile_g0 + steps_per_tile - 1, I, P);
        auto slot = [&](int owner) {
            return work + ((size_t)2 * owner + (share_begin(owner, I, P) >= tile_g0 ? 0 : 1)) *
                              (BM * BN);
        };
        float4* mine = reinterpret_cast<float4*>(slot(b));
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int jn = 0; jn < NI; ++jn)
                mine[(i * NI + jn) * NT + tid] = make_float4(rC[i][jn * 4], rC[i][jn * 4 + 1],
                                                             rC[i][jn * 4 + 2], rC[i][jn * 4 + 3]);
        __threadfence();  // the partial is visible GPU-wide before the count says so
        __syncthreads();
        // thread 0 counts the block in; the barrier tells every thread whether it was the last
        const bool last = __syncthreads_or(tid == 0 && atomicAdd(&arrived[tile], 1) == hi - lo);
        if (!last) continue;
        __threadfence();
        // the last block sums the partials of blocks lo .. hi in that order and stores the tile
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int jn = 0; jn < NI; ++jn) {
                float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
                for (int owner = lo; owner <= hi; ++owner) {
                    const float4* part = reinterpret_cast<const float4*>(slot(owner));
                    const float4 p = __ldcg(part + (i * NI + jn) * NT + tid);  // L2, not L1
                    s.x += p.x, s.y += p.y, s.z += p.z, s.w += p.w;
                }
                store4(C, row_of(row0, i), col_of(col0, jn), M, N, vecC, s);
            }
    }
}
// --8<-- [end:streamk]

// --8<-- [start:configs]
// One extern "C" kernel per configuration, named like v11's: block tile BMxBN, step BK, warp tile
// WMxWN, threads, gG for the grouped order of G tile rows, and the padding pP.
#define SGEMM_STREAMK(BM, BN, BK, WM, WN, NT, G, PAD)                                              \
    extern "C" __global__ void __launch_bounds__(NT)                                              \
        sgemm_sk_##BM##x##BN##_k##BK##_w##WM##x##WN##_t##NT##_g##G##_p##PAD(                      \
            const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,      \
            int M, int N, int K, float* work, int* arrived, int dp_waves) {                       \
        sgemm_streamk<BM, BN, BK, WM, WN, WM / 32, WN / 16, NT, G, PAD>(A, B, C, M, N, K, work,   \
                                                                        arrived, dp_waves);       \
    }

// The configurations: STREAMK in snippets/part3/sgemm_v14.py, passed as the -D option
// SGEMM_STREAMK_CONFIGS. The default, the first of them, lets this file compile alone.
#ifndef SGEMM_STREAMK_CONFIGS
#define SGEMM_STREAMK_CONFIGS SGEMM_STREAMK(128, 128, 8, 64, 64, 128, 8, 4)
#endif
SGEMM_STREAMK_CONFIGS
// --8<-- [end:configs]
