// SGEMM, C = A @ B, row-major fp32 A (M x K), B (K x N), C (M x N), plain IEEE fp32 FMAs. Step 13
// of the ladder in docs/part3/sgemm.md, launched by snippets/part3/sgemm.py (CuPy/NVRTC).
//
// v13  v11's warp tiling (64 x 64 warp tiles, 8 x 4 lanes, 128 results a lane) fed by cp.async: the
//      global -> shared copies are 16-byte cp.async.cg into STAGES buffers of dynamic shared
//      memory, with no register staging, so the copies of tile t + STAGES - 1 are in flight while
//      tile t is multiplied. cp.async copies 16 contiguous bytes and cannot transpose, so the A
//      tile stays K-major (as in global memory); rows padded to BK + 4 floats and a lane layout
//      with rows 8 apart keep the warp's reads and the copies free of bank conflicts (sa_offset
//      and a_chunk below; tests/test_part3_sgemm.py models both).
//
// Every load and store is bounds-checked, and the parts of a tile outside the matrices are filled
// with zeros (which add nothing to a dot product), so any M, N, K >= 1 is correct. The 16-byte
// copies need rows that are a multiple of 4 floats and 16-byte-aligned bases (vec_ok); otherwise
// the same loop fills the stage with guarded scalar loads and plain shared stores. Sizes are 32-bit
// (the launcher checks them), offsets into the matrices are 64-bit (size_t).
#include "common.cuh"

// --8<-- [start:cp_async]
// cp.async (sm_80+): 16 bytes from global to shared memory without passing through registers. With
// src-size 0 nothing is read and the 16 bytes are zero-filled: that pads a chunk outside the matrix
// (the source address is then the matrix base, always valid). .cg caches in L2 only: every element
// is used from shared memory afterwards, not from L1.
__device__ __forceinline__ void cp_async16(float* smem, const float* gmem, bool inside) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    const int src_size = inside ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
                 "r"(src_size));
}

// Close the group of copies this thread issued since the last commit.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Wait until at most PENDING of this thread's committed groups are still in flight.
template <int PENDING>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING));
}
// --8<-- [end:cp_async]

// --8<-- [start:layout]
// The A stage is K-major: row r of the (BM, BK) tile at r * LDA floats, LDA = BK + 4. A row is
// then LDA / 4 = BK / 4 + 1 chunks of 16 bytes, an odd number, so 8 consecutive rows start in 8
// different chunk positions of a 128-byte line (32 banks): chunk r * (BK / 4 + 1) + k / 4 mod 8.
// Both sides of the stage touch 8 consecutive rows at one k / 4 per phase: a warp reads rows lm +
// 8 * i for its 8 values of lm, and a copy phase (8 threads) writes chunk c of 8 consecutive rows
// (a_chunk). Unpadded (LDA = BK = 16) the 8 rows would fall on 2 chunk positions: 4-way conflicts.
template <int BK>
__host__ __device__ __forceinline__ int sa_offset(int r, int k) {
    return r * (BK + 4) + k;
}

// Which chunk of the (BM, BK) A tile copy number idx fetches: 8 consecutive copies take chunk c
// of 8 consecutive rows (conflict-free shared stores, see above); a warp covers 8 rows x 4 chunks
// (8 rows x 64 bytes of A per request, the same 32-byte sectors as a row-by-row order).
template <int BK>
__host__ __device__ __forceinline__ void a_chunk(int idx, int& r, int& c) {
    constexpr int CPR = BK / 4;  // chunks per row
    r = idx % 8 + 8 * (idx / (8 * CPR));
    c = (idx / 8) % CPR * 4;
}
// --8<-- [end:layout]

// --8<-- [start:stage]
// Issue the copies of the K step starting at k0 into one stage: sA (BM, BK + 4) K-major, padded,
// sB (BK, BN) as it is. Thread tid copies chunks tid, tid + NT, ... of each tile, numbered along
// the rows (BK / 4 chunks a row of A, BN / 4 a row of B). Without the vector path the same chunks
// go through registers with guarded scalar loads (load4) and one 16-byte shared store.
template <int BM, int BN, int BK, int NT>
__device__ __forceinline__ void load_stage(float* sA, float* sB, const float* __restrict__ A,
                                           const float* __restrict__ B, int M, int N, int K,
                                           int row0, int col0, int k0, bool vecA, bool vecB,
                                           int tid) {
    constexpr int A4 = BM * BK / 4 / NT, B4 = BK * BN / 4 / NT;  // chunks per thread
    static_assert(A4 * 4 * NT == BM * BK && B4 * 4 * NT == BK * BN, "whole chunks per thread");
#pragma unroll
    for (int i = 0; i < A4; ++i) {
        int r, c;
        a_chunk<BK>(tid + i * NT, r, c);
        float* dst = sA + sa_offset<BK>(r, c);
        const int gr = row0 + r, gc = k0 + c;
        if (vecA) {
            const bool inside = gr < M && gc < K;
            cp_async16(dst, inside ? A + (size_t)gr * K + gc : A, inside);
        } else {
            *reinterpret_cast<float4*>(dst) = load4(A, gr, gc, M, K, false);
        }
    }
#pragma unroll
    for (int i = 0; i < B4; ++i) {
        const int idx = tid + i * NT, r = idx / (BN / 4), c = (idx % (BN / 4)) * 4;
        float* dst = sB + r * BN + c;
        const int gr = k0 + r, gc = col0 + c;
        if (vecB) {
            const bool inside = gr < K && gc < N;
            cp_async16(dst, inside ? B + (size_t)gr * N + gc : B, inside);
        } else {
            *reinterpret_cast<float4*>(dst) = load4(B, gr, gc, K, N, false);
        }
    }
}
// --8<-- [end:stage]

// --8<-- [start:template]
// A block of NT threads computes a BM x BN tile of C in steps of BK along K. Its warps each own a
// WM x WN warp tile and the 32 lanes of a warp form an 8 x 4 grid, as in v11; lane (lm, ln) owns
// rows lm + 8 * i (i < TM) of the warp tile, and, as in v11, NI runs of 4 columns at jn * (WN / NI)
// + ln * 4. (v11 gives a lane 4 consecutive rows, lm * 4 + i % 4: right for a transposed A tile,
// where one float4 is 4 rows at one k; here one float4 is 4 k of one row, and rows 8 apart keep
// the warp's reads on 8 consecutive rows, conflict-free in the padded layout.) Per 4 k a lane loads
// TM float4s of A and 4 * NI float4s of B for 4 * TM * TN FMAs: as many loads as v11.
//
// The pipeline: STAGES - 1 tiles are requested before the loop. At step t a thread waits until its
// own copies of tile t have landed (at most STAGES - 2 newer groups pending), and the barrier makes
// everyone's copies visible and ends everyone's reads of tile t - 1; the copies of tile t + STAGES
// - 1 then go into that tile's stage, (t - 1) % STAGES, while tile t is multiplied. One barrier a
// step. A group is committed every step, empty past the last tile, so that "at most STAGES - 2
// pending" always means "tile t has landed".
template <int BM, int BN, int BK, int WM, int WN, int MI, int NI, int NT, int STAGES, int GROUP>
__device__ __forceinline__ void sgemm_async(const float* __restrict__ A,
                                            const float* __restrict__ B, float* __restrict__ C,
                                            int M, int N, int K) {
    constexpr int LANES_M = 8, LANES_N = 4;
    constexpr int TM = 4 * MI, TN = 4 * NI;  // results per lane in each direction
    static_assert(WM == TM * LANES_M && WN == NI * 4 * LANES_N,
                  "warp tile = TM rows x NI runs of 4 columns per lane");
    static_assert(BM % WM == 0 && BN % WN == 0, "whole warp tiles in a block tile");
    static_assert((BM / WM) * (BN / WN) * 32 == NT, "one warp per warp tile");
    static_assert(BK % 4 == 0 && BM % 8 == 0, "whole chunks; a_chunk takes rows 8 at a time");
    static_assert(STAGES >= 2, "at least one tile in flight while one is multiplied");
    constexpr int WARPS_N = BN / WN;
    constexpr int SA = BM * (BK + 4), SB = BK * BN;  // floats per stage of A and of B
    extern __shared__ __align__(16) float smem[];
    float* sA = smem;                   // (STAGES, BM, BK + 4): K-major A tiles, padded rows
    float* sB = smem + STAGES * SA;     // (STAGES, BK, BN)

    int bm = blockIdx.y, bn = blockIdx.x;  // this block's tile row and column
    if constexpr (GROUP > 0) {             // v12's grouped block order
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
    float rC[TM][TN] = {{0.f}};  // (TM, TN) accumulators
    const int tiles = (K + BK - 1) / BK;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < tiles)
            load_stage<BM, BN, BK, NT>(sA + s * SA, sB + s * SB, A, B, M, N, K, row0, col0,
                                       s * BK, vecA, vecB, tid);
        cp_async_commit();
    }
    for (int t = 0; t < tiles; ++t) {
        cp_async_wait<STAGES - 2>();  // this thread's copies of tile t have landed
        __syncthreads();              // everyone's have; everyone is done with tile t - 1
        const int next = t + STAGES - 1;
        if (next < tiles) {
            const int s = next % STAGES;
            load_stage<BM, BN, BK, NT>(sA + s * SA, sB + s * SB, A, B, M, N, K, row0, col0,
                                       next * BK, vecA, vecB, tid);
        }
        cp_async_commit();
        const float* a = sA + (t % STAGES) * SA + sa_offset<BK>(wm0 + lm, 0);  // this lane's rows
        const float* b = sB + (t % STAGES) * SB + wn0 + ln * 4;               // and columns
#pragma unroll
        for (int kc = 0; kc < BK; kc += 4) {
            float rA[TM][4];  // (TM, 4): A[row lm + 8 i][kc .. kc + 3]
#pragma unroll
            for (int i = 0; i < TM; ++i) lds4(rA[i], &a[sa_offset<BK>(8 * i, kc)]);
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                float rB[TN];  // (TN,): B[kc + kk][the lane's columns]
#pragma unroll
                for (int jn = 0; jn < NI; ++jn)
                    lds4(&rB[jn * 4], &b[(kc + kk) * BN + jn * (WN / NI)]);
#pragma unroll
                for (int i = 0; i < TM; ++i)
#pragma unroll
                    for (int j = 0; j < TN; ++j) rC[i][j] += rA[i][kk] * rB[j];
            }
        }
    }
    cp_async_wait<0>();  // nothing is left in flight when the block exits
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int r = row0 + wm0 + lm + 8 * i;
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
// tile WMxWN, threads, sS for S stages, gG for a grouped block order of G tile rows. The dynamic
// shared memory, STAGES * (BM * (BK + 4) + BK * BN) * 4 bytes, is passed at launch.
#define SGEMM_ASYNC(BM, BN, BK, WM, WN, NT, S, G)                                                 \
    extern "C" __global__ void __launch_bounds__(NT)                                              \
        sgemm_a_##BM##x##BN##_k##BK##_w##WM##x##WN##_t##NT##_s##S##_g##G(                         \
            const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,      \
            int M, int N, int K) {                                                                \
        sgemm_async<BM, BN, BK, WM, WN, WM / 32, WN / 16, NT, S, G>(A, B, C, M, N, K);            \
    }

// The configurations: ASYNC in snippets/part3/sgemm.py, which passes them as the -D option
// SGEMM_ASYNC_CONFIGS, one SGEMM_ASYNC(BM, BN, BK, WM, WN, NT, STAGES, G) each; the default is the
// same list (with no space between the calls, as Python joins them), so this file alone compiles
// the kernels the launcher uses.
#ifndef SGEMM_ASYNC_CONFIGS
#define SGEMM_ASYNC_CONFIGS                                                                       \
    SGEMM_ASYNC(128, 128, 16, 64, 64, 128, 4, 8)SGEMM_ASYNC(128, 256, 16, 64, 64, 256, 3, 8)
#endif
SGEMM_ASYNC_CONFIGS
// --8<-- [end:configs]
