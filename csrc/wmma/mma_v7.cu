// wmma_gemm v7: v6's kernel (csrc/part3/wmma_gemm.cu: the same 128 x 128 block tile, 4 warps of
// 64 x 64, three cp.async stages of 64-deep tiles, the same XOR swizzle, ldmatrix and mma.sync)
// with the work around the MMAs taken out of the K loop. In v6 every copy and every ldmatrix
// recomputes its row, its chunk, the swizzle, the bounds checks and a 64-bit address; the SASS of
// its loop holds more than three integer instructions for each MMA, and a Hopper SM issues one
// instruction per cycle per scheduler, MMAs and address arithmetic alike. v7 computes those
// addresses once per thread, works in 32-bit shared-window addresses (what cp.async and ldmatrix
// take), and drops the bounds checks on the tiles that need none: every tile of an interior block
// but a ragged last one in K. tests/test_part3_wmma_v7.py counts the loop's instructions in the
// SASS, and checks on the CPU that every address is v6's.
//
// It reuses v6's PTX wrappers for mma.sync and the cp.async group calls (MmaSync, cp_async_commit,
// cp_async_wait) from Part 3's wmma_gemm.cu; the kernels of that file compile along in the same
// module. This file lives outside csrc/part3 so that v1 to v6's measured results keep their
// source hashes (a Part 3 kernel's hash covers every file of csrc/part3).
#include "../part3/wmma_gemm.cu"

// v7's block tile, K step (elements), threads and pipeline depth (V7 in snippets/part3/wmma_v7.py;
// the launcher sizes the grid and the dynamic shared memory from the same numbers).
#ifndef V7_BM
#define V7_BM 128
#define V7_BN 128
#define V7_BK 64
#define V7_THREADS 128
#define V7_STAGES 3
#endif

// --8<-- [start:ptx]
// The same PTX as v6's wrappers, taking the 32-bit address of the shared-memory window instead of
// a generic pointer: the kernel converts its base once (__cvta_generic_to_shared) and adds offsets
// to it, and ptxas folds constant offsets into the instruction ([R + 0x800]).
__device__ __forceinline__ void ldmatrix_x4_at(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans_at(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// 16 bytes from global to shared memory; src_size 0 reads nothing and writes 16 zero bytes.
__device__ __forceinline__ void cp_async16_at(unsigned dst, const void* src, int src_size) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_size));
}
// --8<-- [end:ptx]

// --8<-- [start:kernel]
template <typename T>
__device__ __forceinline__ void mma_hoisted(const T* __restrict__ A, const T* __restrict__ B,
                                            T* __restrict__ C, int M, int N, int K) {
    constexpr int BM = V7_BM, BN = V7_BN, BK = V7_BK, NT = V7_THREADS, STAGES = V7_STAGES;
    constexpr int WM = 64, WN = 64, WARPS_N = BN / WN;  // warps of 64 x 64, as in v6
    constexpr int MI = WM / 16, NI = WN / 8;            // 4 x 8 m16n8 tiles per warp
    constexpr int V = 8;                                // halves per 16-byte chunk
    constexpr int CA = BK / V, CB = BN / V;             // chunks per row: 8 (A), 16 (B)
    constexpr int RA = NT / CA, RB = NT / CB;           // rows one pass of the block copies
    constexpr int A_COPIES = BM / RA, B_COPIES = BK / RB;           // passes per stage
    constexpr int A_STAGE = BM * CA * 16, B_STAGE = BK * CB * 16;   // bytes per stage
    static_assert(sizeof(T) == 2, "16-bit inputs: mma.m16n8k16 and ldmatrix.b16");
    static_assert((BM / WM) * WARPS_N * 32 == NT, "one warp per 64 x 64 part of the tile");
    static_assert(CA == 8 && CB % 8 == 0, "rows of whole 128-byte lines: the XOR swizzle's period");
    static_assert(NT % CB == 0 && RA % 8 == 0 && RB % 8 == 0,
                  "a thread's copies 8k rows apart: the same chunk, the same XOR term");
    static_assert(A_COPIES * RA == BM && B_COPIES * RB == BK, "whole passes per stage");
    static_assert(STAGES >= 2, "a pipeline needs two stages at least");

    extern __shared__ __align__(128) uint4 smem[];
    const unsigned sA = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    const unsigned sB = sA + STAGES * A_STAGE;

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    const int wm0 = (warp / WARPS_N) * WM, wn0 = (warp % WARPS_N) * WN;

    // The copies, planned once. Thread tid copies chunk ac = tid % CA of rows ar + RA i of the A
    // tile (and chunk bc of rows br + RB i of B). RA and RB are multiples of 8, so every one of
    // its rows has the same row % 8, the same XOR term: one swizzled offset per operand, stepped
    // by a constant per copy; and one global pointer, stepped by RA rows of A (RB rows of B).
    const int ar = tid / CA, ac = tid % CA, br = tid / CB, bc = tid % CB;
    const unsigned a_dst = sA + (ar * CA + (ac ^ (ar % 8))) * 16;
    const unsigned b_dst = sB + (br * CB + (bc ^ (br % 8))) * 16;
    const T* a_src = A + (size_t)(row0 + ar) * K + ac * V;
    const T* b_src = B + (size_t)br * N + col0 + bc * V;
    const size_t a_step = (size_t)RA * K, b_step = (size_t)RB * N;
    unsigned a_rows = 0;  // bit i: row ar + RA i of the tile lies inside A
#pragma unroll
    for (int i = 0; i < A_COPIES; ++i) a_rows |= (row0 + ar + RA * i < M ? 1u : 0u) << i;
    const bool b_inside = col0 + bc * V < N;
    const bool interior = row0 + BM <= M && col0 + BN <= N;

    // One BK step into stage s. A whole tile (an interior block, k0 + BK <= K) needs no check at
    // all; the others keep v6's: a chunk outside the matrices is zero-filled (src-size 0).
    auto load_tiles = [&](int s, int k0, bool whole) {
        const T* pa = a_src + k0;
        const T* pb = b_src + (size_t)k0 * N;
        const unsigned da = a_dst + s * A_STAGE, db = b_dst + s * B_STAGE;
        if (whole) {
#pragma unroll
            for (int i = 0; i < A_COPIES; ++i, pa += a_step)
                cp_async16_at(da + i * RA * CA * 16, pa, 16);
#pragma unroll
            for (int i = 0; i < B_COPIES; ++i, pb += b_step)
                cp_async16_at(db + i * RB * CB * 16, pb, 16);
        } else {
#pragma unroll
            for (int i = 0; i < A_COPIES; ++i, pa += a_step) {
                const bool in = ((a_rows >> i) & 1) && k0 + ac * V < K;
                cp_async16_at(da + i * RA * CA * 16, in ? pa : A, in ? 16 : 0);
            }
#pragma unroll
            for (int i = 0; i < B_COPIES; ++i, pb += b_step) {
                const bool in = b_inside && k0 + br + RB * i < K;
                cp_async16_at(db + i * RB * CB * 16, in ? pb : B, in ? 16 : 0);
            }
        }
    };

    // The ldmatrix addresses, planned once. Lane l reads row l % 16 of a 16-row slab at chunk
    // 2 kk + l / 16 (A), or row 16 kk + l % 16 at chunk wn0 / 8 + 2 j + l / 16 (B); each such
    // row is a multiple of 8 plus l % 8, so the XOR term is l % 8, and since 2 kk, 2 j and wn0 / 8
    // leave bit 0 free, (2 kk + l / 16) ^ (l % 8) = 2 kk ^ c0 with c0 = (l / 16) ^ (l % 8).
    const int c0 = (lane / 16) ^ (lane % 8);
    const unsigned a_ld = sA + (wm0 + lane % 16) * CA * 16;
    const unsigned b_ld = sB + ((lane % 16) * CB + wn0 / V) * 16;

    float acc[MI][NI][4];  // this warp's 64 x 64 fp32 sums, as in v6
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

    auto mma_tiles = [&](int s) {
        const unsigned tA = a_ld + s * A_STAGE, tB = b_ld + s * B_STAGE;
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
            unsigned a[MI][4], b[NI / 2][4];
#pragma unroll
            for (int i = 0; i < MI; ++i)
                ldmatrix_x4_at(a[i], tA + i * 16 * CA * 16 + ((2 * kk) ^ c0) * 16);
#pragma unroll
            for (int j = 0; j < NI / 2; ++j)
                ldmatrix_x4_trans_at(b[j], tB + kk * 16 * CB * 16 + ((2 * j) ^ c0) * 16);
#pragma unroll
            for (int i = 0; i < MI; ++i)
#pragma unroll
                for (int j = 0; j < NI; ++j) {
                    const unsigned bj[2] = {b[j / 2][2 * (j % 2)], b[j / 2][2 * (j % 2) + 1]};
                    MmaSync<T>::mma(acc[i][j], a[i], bj);
                }
        }
    };

    // v6's pipeline, with the stage indices stepped instead of taken modulo STAGES.
    const int tiles = (K + BK - 1) / BK, whole_tiles = K / BK;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < tiles) load_tiles(s, s * BK, interior && s < whole_tiles);
        cp_async_commit();
    }
    int s_read = 0, s_write = STAGES - 1;
    for (int t = 0; t < tiles; ++t) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        const int next = t + STAGES - 1;
        if (next < tiles) load_tiles(s_write, next * BK, interior && next < whole_tiles);
        cp_async_commit();
        mma_tiles(s_read);
        s_read = s_read + 1 == STAGES ? 0 : s_read + 1;
        s_write = s_write + 1 == STAGES ? 0 : s_write + 1;
    }

    // v6's epilogue: lane (g, t) writes columns 2t, 2t + 1 of rows g and g + 8 of each m16n8 tile.
    const int g = lane / 4, t4 = lane % 4;
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j) {
            const int col = col0 + wn0 + j * 8 + 2 * t4;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = row0 + wm0 + i * 16 + g + 8 * h;
                if (row < M && col < N)
                    *reinterpret_cast<decltype(MmaSync<T>::pack(0.f, 0.f))*>(
                        C + (size_t)row * N + col) =
                        MmaSync<T>::pack(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
            }
        }
}
// --8<-- [end:kernel]

// --8<-- [start:instances]
#define MMA_V7_KERNEL(NAME, T)                                                                    \
    extern "C" __global__ void __launch_bounds__(V7_THREADS, 2)                                   \
        NAME(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C, int M, int N,   \
             int K) {                                                                             \
        mma_hoisted<T>(A, B, C, M, N, K);                                                         \
    }

MMA_V7_KERNEL(mma_v7_f16, __half)
MMA_V7_KERNEL(mma_v7_bf16, __nv_bfloat16)
// --8<-- [end:instances]
