// mma_rate: how fast mma.sync itself runs on this GPU, with nothing else in the loop. Each warp
// holds v7's 64 x 64 block of fp32 sums (4 x 8 m16n8 tiles, 128 registers a lane) and, every
// step, issues v7's 32 mma.sync.m16n8k16 into them, the same products again and again:
//   v1  mma_rate_registers  the fragments loaded once into registers: MMAs only;
//   v2  mma_rate_ldmatrix   every step re-reads the fragments from shared memory with v7's 8
//                           ldmatrix.x4 per 32 MMAs, into two register buffers (step s + 1's reads
//                           in flight while step s's MMAs run).
// No global memory in the loop, no barrier, no copies: what is left is the tensor pipe, the issue
// slots and (v2) the shared-memory reads. v7 issues all of v2's instructions and more.
//
// The operands are four 16 x 16 tiles of A (A[i], row-major) and one 16 x 64 B (row-major, K x N:
// eight m16n8 column tiles). After `steps` steps warp 0 of block 0 writes its sums: lane l's
// 128 floats at out[128 l + 4 (8 i + j) + e], where acc[i][j] = steps * A[i] @ B[:, 8j : 8j + 8]
// in the m16n8 accumulator layout. The other warps compute the same and write nothing.
#include "mma_v7.cu"  // ldmatrix_x4_at, ldmatrix_x4_trans_at; v6's MmaSync

#ifndef RATE_THREADS
#define RATE_THREADS 128
#endif

namespace mma_rate {
constexpr int MI = 4, NI = 8;  // v7's warp tile: 4 x 8 m16n8 tiles

__device__ __forceinline__ void mma_all(float (&acc)[MI][NI][4], const unsigned (&a)[MI][4],
                                        const unsigned (&b)[NI / 2][4]) {
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j) {
            const unsigned bj[2] = {b[j / 2][2 * (j % 2)], b[j / 2][2 * (j % 2) + 1]};
            MmaSync<__half>::mma(acc[i][j], a[i], bj);
        }
}

__device__ __forceinline__ void write_sums(const float (&acc)[MI][NI][4], float* out) {
    if (blockIdx.x != 0 || threadIdx.x >= 32) return;
    float* o = out + 128 * threadIdx.x;
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[4 * (NI * i + j) + e] = acc[i][j][e];
}

// two 16-bit values as one 32-bit register, lo in the low half (the fragments' packing)
__device__ __forceinline__ unsigned pack2(const __half* lo, const __half* hi) {
    return unsigned(__half_as_ushort(*lo)) | unsigned(__half_as_ushort(*hi)) << 16;
}
}  // namespace mma_rate

// --8<-- [start:registers]
extern "C" __global__ void __launch_bounds__(RATE_THREADS)
    mma_rate_registers(const __half* __restrict__ A, const __half* __restrict__ B,
                       float* __restrict__ out, int steps) {
    using namespace mma_rate;
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    // The PTX ISA's fragment layouts for m16n8k16, read straight from global memory: a lane holds
    // A[g][2t..2t+1], A[g+8][2t..], A[g][2t+8..], A[g+8][2t+8..] and, per column tile j,
    // B[2t..2t+1][8j+g] and B[2t+8..2t+9][8j+g] (packed in the ldmatrix.trans register order).
    unsigned a[MI][4], b[NI / 2][4];
#pragma unroll
    for (int i = 0; i < MI; ++i) {
        const __half* Ai = A + 256 * i;
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const __half* p = Ai + (g + 8 * (r % 2)) * 16 + 2 * t + 8 * (r / 2);
            a[i][r] = pack2(p, p + 1);
        }
    }
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const __half* p = B + (2 * t + 8 * r) * 64 + 8 * j + g;
            b[j / 2][2 * (j % 2) + r] = pack2(p, p + 64);
        }

    float acc[MI][NI][4] = {};
    for (int s = 0; s < steps; ++s) mma_all(acc, a, b);
    write_sums(acc, out);
}
// --8<-- [end:registers]

// --8<-- [start:ldmatrix]
extern "C" __global__ void __launch_bounds__(RATE_THREADS)
    mma_rate_ldmatrix(const __half* __restrict__ A, const __half* __restrict__ B,
                      float* __restrict__ out, int steps) {
    using namespace mma_rate;
    // Eight 16 x 16 tiles (A[0..3], then B's columns 16q .. 16q + 15 for q = 0..3), each stored as
    // its two 16 x 8 halves one after the other: 16-byte chunk (h, r) holds row r, columns
    // 8h .. 8h + 7, at chunk 16 h + r. Lane l's ldmatrix row is then chunk l of a tile (lanes
    // 8m .. 8m + 7 give matrix m: rows 0-7 or 8-15 of half 0 or 1), and each phase's 8 chunks
    // are consecutive: no bank conflict.
    __shared__ __align__(128) __half tiles[8][256];
    for (int c = threadIdx.x; c < 8 * 32; c += blockDim.x) {  // c: tile c / 32, chunk c % 32
        const int q = c / 32, h = (c % 32) / 16, r = c % 16;
        const __half* src =
            q < MI ? A + 256 * q + 16 * r + 8 * h : B + 64 * r + 16 * (q - MI) + 8 * h;
#pragma unroll
        for (int e = 0; e < 8; ++e) tiles[q][8 * (c % 32) + e] = src[e];
    }
    __syncthreads();
    const unsigned base = static_cast<unsigned>(__cvta_generic_to_shared(tiles)) +
                          16 * (threadIdx.x % 32);

    unsigned a[2][MI][4], b[2][NI / 2][4];  // two buffers of fragments
    auto load = [&](int buf) {
#pragma unroll
        for (int i = 0; i < MI; ++i) ldmatrix_x4_at(a[buf][i], base + 512 * i);
#pragma unroll
        for (int q = 0; q < NI / 2; ++q) ldmatrix_x4_trans_at(b[buf][q], base + 512 * (MI + q));
    };
    float acc[MI][NI][4] = {};
    load(0);
    for (int s = 0; s < steps; s += 2) {  // two steps per trip: the buffers alternate
        load(1);  // step s + 1's fragments (read, never used, past the last step)
        mma_all(acc, a[0], b[0]);
        if (s + 1 == steps) break;
        if (s + 2 < steps) load(0);
        mma_all(acc, a[1], b[1]);
    }
    write_sums(acc, out);
}
// --8<-- [end:ldmatrix]
