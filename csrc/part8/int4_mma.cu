// W4A16 for the few rows of decoding: y = x @ dequantised(w).T for M <= 16 rows of x, int4 codes
// dequantised in registers by bit tricks and multiplied on the tensor cores with mma.sync.
// Loaded from Python by snippets/part8/int4_gemm.py (CuPy/NVRTC), where it is version v9 of the
// int4_gemm op.
//
// Layout (the op's, unchanged): x (M, K) bf16 or fp16; packed (N, K / 2) bytes, byte j of row n the
// codes of k = 2j (low nibble) and 2j + 1 (high); scales (N, K / G) in x's type; zeros (N, K / G)
// uint8 codes or none (symmetric: zero 8). y (M, N) in x's type. G a multiple of 128.
//
// The work: a block owns 16 MT rows of the weight (MT m16 tiles of the MMA) and all of K; its warps
// take the 128-deep slabs of K in turn (warp w: slabs w, w + warps, ...), so that at any moment
// the block reads a few hundred contiguous bytes of each of its rows, and add their sums in shared
// memory at the end, in a fixed order. In a slab, lane (g, t) of the warp (g = lane / 4, t = lane
// % 4) copies 16 bytes (32 codes) of each of its rows (g, g + 8, g + 16, ...) at k = 32 t .. 32 t
// + 31 into its own slots of the warp's ring in shared memory, with cp.async: the bytes in flight
// cost no registers, so a ring of STAGES slabs keeps a warp's next loads issued while it computes
// one. x is read through the L1 cache one slab ahead, into registers.
//
// The weight is the MMA's A operand (16 rows x 16 k) and x its B operand (16 k x 8 columns, one
// column per row of x): at M = 1 seven of the eight columns are padding, which costs tensor-core
// time the kernel has plenty of; what it must not waste is bytes. The k of a fragment slot is free
// to choose, as long as A and B agree: the slots the MMA gives lane t hold whichever k the
// dequantisation makes convenient (code i with code i + 4 of a word), and x is permuted into the
// same order in registers.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

// fixed-width names without <stdint.h>, which NVRTC does not provide
typedef unsigned int u32;
typedef unsigned char u8;
typedef long long i64;

#ifndef STAGES
#define STAGES 3  // slabs of K per warp's ring: STAGES - 1 in flight while one is multiplied
#endif
#ifndef MAX_WARPS
#define MAX_WARPS 4  // warps a block (__launch_bounds__): the launcher passes its MMA_WARPS
#endif

// --8<-- [start:dequant]
// Per activation type, the float whose low mantissa bits take a code (the "magic" number): bf16
// 128.0 = 0x4300 has 7 mantissa bits, each worth 1 there, so 0x4300 | c is 128 + c, exact for
// c < 16; fp16 1024.0 = 0x6400 likewise, with 10 bits. The odd code of a byte (bits 4..7): fp16's
// ten bits take it where it is (1024 + 16 c); in bf16's seven its top bit would land in the
// exponent, so it goes in one bit lower (bits 3..6 after a shift by 1: 128 + 8 c).
template <typename T> struct Int4Type;
template <> struct Int4Type<__nv_bfloat16> {
    using T2 = __nv_bfloat162;
    static constexpr u32 MAGIC = 0x43004300u;  // (128, 128)
    static constexpr float BASE = 128.0f;
    static constexpr int HI_SHIFT = 1;         // (w >> 1) & 0x00780078: 128 + 8 c
    static constexpr u32 HI_MASK = 0x00780078u;
    static constexpr u32 HI_STEP = 0x3e003e00u;  // (1/8, 1/8)
    static constexpr float HI_BASE = 16.0f;      // 128 / 8
};
template <> struct Int4Type<__half> {
    using T2 = __half2;
    static constexpr u32 MAGIC = 0x64006400u;  // (1024, 1024)
    static constexpr float BASE = 1024.0f;
    static constexpr int HI_SHIFT = 0;         // w & 0x00f000f0: 1024 + 16 c
    static constexpr u32 HI_MASK = 0x00f000f0u;
    static constexpr u32 HI_STEP = 0x2c002c00u;  // (1/16, 1/16)
    static constexpr float HI_BASE = 64.0f;      // 1024 / 16
};

template <typename T2> __device__ __forceinline__ T2 as_pair(u32 u) {
    return *reinterpret_cast<T2*>(&u);
}
template <typename T2> __device__ __forceinline__ u32 as_word(T2 v) {
    return *reinterpret_cast<u32*>(&v);
}

// The eight codes of one 32-bit word (code i in bits 4i .. 4i + 3) minus the zero point, as four
// registers of two halves, each exact: out[0] = (c0, c4), out[1] = (c1, c5), out[2] = (c2, c6),
// out[3] = (c3, c7). An AND-OR (one LOP3) puts two codes into two mantissas at once; the odd
// codes land 8 or 16 times too high and come back with one fused multiply-add by 1/8 or 1/16; one
// shift by 8 serves the upper byte of each half-word. Nine or eleven instructions for eight codes,
// and no integer-to-float conversion. zlo = BASE + z, zhi = HI_BASE + z in both halves.
template <typename T>
__device__ __forceinline__ void dequant8(u32 w, typename Int4Type<T>::T2 zlo,
                                         typename Int4Type<T>::T2 zhi, u32 out[4]) {
    using Ty = Int4Type<T>;
    using T2 = typename Ty::T2;
    const T2 step = as_pair<T2>(Ty::HI_STEP);
    const u32 w8 = w >> 8;
    out[0] = as_word(__hsub2(as_pair<T2>((w & 0x000f000fu) | Ty::MAGIC), zlo));
    out[1] = as_word(__hfma2(as_pair<T2>(((w >> Ty::HI_SHIFT) & Ty::HI_MASK) | Ty::MAGIC), step,
                             __hneg2(zhi)));
    out[2] = as_word(__hsub2(as_pair<T2>((w8 & 0x000f000fu) | Ty::MAGIC), zlo));
    out[3] = as_word(__hfma2(as_pair<T2>(((w8 >> Ty::HI_SHIFT) & Ty::HI_MASK) | Ty::MAGIC), step,
                             __hneg2(zhi)));
}
// --8<-- [end:dequant]

// --8<-- [start:mma]
// D = A B + C for one m16n8k16 tile, fp32 sums. a: rows (g, g + 8) x slots (2t, 2t + 1) and
// (2t + 8, 2t + 9); b: slots (2t, 2t + 1) and (2t + 8, 2t + 9) of column g; c, d: rows (g, g + 8) x
// columns (2t, 2t + 1).
template <typename T>
__device__ __forceinline__ void mma16816(float d[4], const u32 a[4], u32 b0, u32 b1);
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float d[4], const u32 a[4],
                                                        u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<__half>(float d[4], const u32 a[4], u32 b0,
                                                 u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// --8<-- [end:mma]

// --8<-- [start:kernel]
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
// wait until at most N of this thread's committed groups are still in flight
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// MT m16 tiles of weight rows per block, NT n8 tiles of x's rows (M <= 8 NT); ZEROS: per-group
// zero points (else 8). Dynamic shared memory: warps x STAGES x 2 MT x 512 bytes.
template <typename T, int MT, int NT, bool ZEROS>
__device__ __forceinline__ void int4_mma(const T* __restrict__ x, const u8* __restrict__ packed,
                                         const T* __restrict__ scales, const u8* __restrict__ zeros,
                                         T* __restrict__ y, int M, int N, int K, int G) {
    using T2 = typename Int4Type<T>::T2;
    constexpr int R = 2 * MT;  // rows per lane: g + 8 h
    extern __shared__ uint4 ring[];  // [warp][stage][row h][lane], 16 bytes each
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const int g = lane / 4, t = lane % 4;
    const int row0 = blockIdx.x * 16 * MT + g;
    i64 rows[R];
#pragma unroll
    for (int h = 0; h < R; ++h) rows[h] = min(row0 + 8 * h, N - 1);  // clamped: loads unmasked
    const int slabs = K / 128, groups = K / G;
    uint4* mine = ring + warp * STAGES * R * 32;
    // the row of x this lane supplies as column g of each n8 tile (past M: row M - 1 again; that
    // column of the result is never stored)
    const T* xrow[NT];
#pragma unroll
    for (int n = 0; n < NT; ++n) xrow[n] = x + (i64)min(g + 8 * n, M - 1) * K + t * 32;

    T scale[STAGES][R];  // each stage's scales and zeros, loaded with its codes
    u8 zero[STAGES][R];
    auto issue = [&](int stage, int s) {  // the copies of slab s into a stage, as one group
        if (s < slabs) {
            const int group = s * 128 / G;
#pragma unroll
            for (int h = 0; h < R; ++h) {
                cp_async16(mine + (stage * R + h) * 32 + lane,
                           packed + rows[h] * (K / 2) + s * 64 + t * 16);
                scale[stage][h] = scales[rows[h] * groups + group];
                zero[stage][h] = ZEROS ? zeros[rows[h] * groups + group] : u8(8);
            }
        }
        cp_async_commit();  // an empty group past the end keeps the count of groups uniform
    };
    auto load_x = [&](uint4 (&xv)[NT][4], int s) {  // 32 values of x a lane, 4 x 16 bytes
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int j = 0; j < 4; ++j)
                xv[n][j] = __ldg(
                    reinterpret_cast<const uint4*>(xrow[n] + min(s, slabs - 1) * 128 + j * 8));
    };

    float acc[MT][NT][4] = {};
    uint4 x_next[NT][4];
#pragma unroll
    for (int stage = 0; stage < STAGES - 1; ++stage) issue(stage, warp + stage * warps);
    load_x(x_next, warp);
    for (int first = warp; first < slabs; first += STAGES * warps) {
#pragma unroll
        for (int stage = 0; stage < STAGES; ++stage) {  // unrolled: the stage is a constant
            const int s = first + stage * warps;
            if (s >= slabs) break;  // the same for the whole warp
            issue((stage + STAGES - 1) % STAGES, s + (STAGES - 1) * warps);
            uint4 xv[NT][4];
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
                for (int j = 0; j < 4; ++j) xv[n][j] = x_next[n][j];
            load_x(x_next, s + warps);
            cp_async_wait<STAGES - 1>();  // slab s has landed (each lane reads only its own copies)
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                const uint4 q0 = mine[(stage * R + 2 * mt) * 32 + lane];
                const uint4 q1 = mine[(stage * R + 2 * mt + 1) * 32 + lane];
                const int z0 = zero[stage][2 * mt], z1 = zero[stage][2 * mt + 1];
                const T2 lo0 = T2{T(Int4Type<T>::BASE + z0), T(Int4Type<T>::BASE + z0)};
                const T2 hi0 = T2{T(Int4Type<T>::HI_BASE + z0), T(Int4Type<T>::HI_BASE + z0)};
                const T2 lo1 = T2{T(Int4Type<T>::BASE + z1), T(Int4Type<T>::BASE + z1)};
                const T2 hi1 = T2{T(Int4Type<T>::HI_BASE + z1), T(Int4Type<T>::HI_BASE + z1)};
                float part[NT][4] = {};
#pragma unroll
                for (int j = 0; j < 4; ++j) {  // word j: k = 32 t + 8 j + 0..7
                    u32 r0[4], r1[4];          // rows g and g + 8 of this tile
                    dequant8<T>(reinterpret_cast<const u32*>(&q0)[j], lo0, hi0, r0);
                    dequant8<T>(reinterpret_cast<const u32*>(&q1)[j], lo1, hi1, r1);
                    const u32 a04[4] = {r0[0], r1[0], r0[1], r1[1]};  // codes 0, 4 | 1, 5
                    const u32 a26[4] = {r0[2], r1[2], r0[3], r1[3]};  // codes 2, 6 | 3, 7
#pragma unroll
                    for (int n = 0; n < NT; ++n) {
                        // x's pairs (x0, x1) .. (x6, x7) regrouped into (x0, x4) .. (x3, x7)
                        const uint4 v = xv[n][j];
                        mma16816<T>(part[n], a04, __byte_perm(v.x, v.z, 0x5410),
                                    __byte_perm(v.x, v.z, 0x7632));
                        mma16816<T>(part[n], a26, __byte_perm(v.y, v.w, 0x5410),
                                    __byte_perm(v.y, v.w, 0x7632));
                    }
                }
                // the slab lies in one group (G is a multiple of 128): its sums are scaled once
                const float s0 = float(scale[stage][2 * mt]), s1 = float(scale[stage][2 * mt + 1]);
#pragma unroll
                for (int n = 0; n < NT; ++n) {
                    acc[mt][n][0] += s0 * part[n][0];
                    acc[mt][n][1] += s0 * part[n][1];
                    acc[mt][n][2] += s1 * part[n][2];
                    acc[mt][n][3] += s1 * part[n][3];
                }
            }
        }
    }
    // the warps' sums, added in warp order by warp 0 (deterministic) in the ring's memory, then
    // stored transposed: element (row r of the weight, column c of x's tile) is y[c, r]
    cp_async_wait<0>();
    __syncthreads();
    float(*partial)[MT * NT * 4][32] = reinterpret_cast<float(*)[MT * NT * 4][32]>(ring);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) partial[warp][(mt * NT + n) * 4 + i][lane] = acc[mt][n][i];
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                float sum = partial[0][(mt * NT + n) * 4 + i][lane];
                for (int w = 1; w < warps; ++w) sum += partial[w][(mt * NT + n) * 4 + i][lane];
                const int r = row0 + 16 * mt + (i >= 2 ? 8 : 0), c = 8 * n + 2 * t + i % 2;
                if (r < N && c < M) y[(i64)c * N + r] = T(sum);
            }
}
// --8<-- [end:kernel]

// extern "C" entry points (unmangled names for CuPy): int4_mma_<type>_m<M rows at most>[_zeros]:
// M <= 8 with one m16 tile a block, M <= 16 with two (x's fragments then serve twice the bytes)
#define INT4_MMA(NAME, T, MT, NT, ZEROS)                                                           \
    extern "C" __global__ void __launch_bounds__(MAX_WARPS * 32)                                   \
        NAME(const T* x, const u8* packed, const T* scales, const u8* zeros, T* y, int M, int N,   \
             int K, int G) {                                                                       \
        int4_mma<T, MT, NT, ZEROS>(x, packed, scales, zeros, y, M, N, K, G);                       \
    }
INT4_MMA(int4_mma_bf16_m8, __nv_bfloat16, 1, 1, false)
INT4_MMA(int4_mma_bf16_m16, __nv_bfloat16, 2, 2, false)
INT4_MMA(int4_mma_bf16_m8_zeros, __nv_bfloat16, 1, 1, true)
INT4_MMA(int4_mma_bf16_m16_zeros, __nv_bfloat16, 2, 2, true)
INT4_MMA(int4_mma_f16_m8, __half, 1, 1, false)
INT4_MMA(int4_mma_f16_m16, __half, 2, 2, false)
INT4_MMA(int4_mma_f16_m8_zeros, __half, 1, 1, true)
INT4_MMA(int4_mma_f16_m16_zeros, __half, 2, 2, true)
