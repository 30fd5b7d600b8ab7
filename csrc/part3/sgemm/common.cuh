// Helpers shared by the vectorized SGEMM steps (v6 onwards): float4 loads and stores with a guarded
// scalar fallback, and a loader that stages one BK step of the A and B tiles in registers.
//
// The float4 paths need a row length that is a multiple of 4 and a 16-byte-aligned base; otherwise
// (and for the last, partial float4 of a row) the same code falls back to guarded scalar accesses.
//
// Every load and store is bounds-checked, and the tiled versions fill the parts of a tile outside
// the matrices with zeros (which add nothing to a dot product), so any M, N, K >= 1 is correct.
// Sizes are 32-bit (the launcher checks them), offsets into the matrices are 64-bit (size_t): M * K
// may pass 2^31.
#pragma once

// --8<-- [start:vec_helpers]
// Four consecutive floats of row r of a rows x cols row-major matrix p, starting at column c (a
// multiple of 4 on the vector path), with zeros outside the matrix. vec: cols % 4 == 0 and p is
// 16-byte aligned, so the float4 is either wholly inside the row or wholly outside it.
__device__ __forceinline__ float4 load4(const float* __restrict__ p, int r, int c, int rows,
                                        int cols, bool vec) {
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (r >= rows) return v;
    const float* q = p + (size_t)r * cols + c;
    if (vec) {
        if (c < cols) v = *reinterpret_cast<const float4*>(q);  // one 16-byte load
    } else {                                                       // guarded scalar fallback
        if (c + 0 < cols) v.x = q[0];
        if (c + 1 < cols) v.y = q[1];
        if (c + 2 < cols) v.z = q[2];
        if (c + 3 < cols) v.w = q[3];
    }
    return v;
}

__device__ __forceinline__ void store4(float* __restrict__ p, int r, int c, int rows, int cols,
                                       bool vec, float4 v) {
    if (r >= rows) return;
    float* q = p + (size_t)r * cols + c;
    if (vec) {
        if (c < cols) *reinterpret_cast<float4*>(q) = v;
    } else {
        if (c + 0 < cols) q[0] = v.x;
        if (c + 1 < cols) q[1] = v.y;
        if (c + 2 < cols) q[2] = v.z;
        if (c + 3 < cols) q[3] = v.w;
    }
}

// Four floats from 16-byte-aligned shared memory into four registers, with one 16-byte shared load.
__device__ __forceinline__ void lds4(float* dst, const float* src) {
    const float4 v = *reinterpret_cast<const float4*>(src);
    dst[0] = v.x, dst[1] = v.y, dst[2] = v.z, dst[3] = v.w;
}

__device__ __forceinline__ bool vec_ok(const void* p, int cols) {
    return cols % 4 == 0 && (reinterpret_cast<size_t>(p) & 15) == 0;
}

// Global -> registers for one BK step: the (BM, BK) tile of A and the (BK, BN) tile of B
// as float4s.
template <int BM, int BN, int BK, int NT>
struct TileLoader {
    static constexpr int A4 = BM * BK / 4 / NT, B4 = BK * BN / 4 / NT;  // float4s per thread
    static_assert(BK % 4 == 0 && BN % 4 == 0, "float4s along the rows of both tiles");
    static_assert(A4 * 4 * NT == BM * BK && B4 * 4 * NT == BK * BN, "whole float4s per thread");
    float4 rA[A4], rB[B4];  // (A4,), (B4,) staged float4s

    __device__ __forceinline__ void load(const float* __restrict__ A, const float* __restrict__ B,
                                         int M, int N, int K, int row0, int col0, int k0, bool vecA,
                                         bool vecB, int tid) {
#pragma unroll
        for (int i = 0; i < A4; ++i) {  // a row of the A tile is BK / 4 float4s
            const int idx = tid + i * NT, r = idx / (BK / 4), c = (idx % (BK / 4)) * 4;
            rA[i] = load4(A, row0 + r, k0 + c, M, K, vecA);
        }
        // a warp reads 32 consecutive float4s of a row of B: 512 bytes
#pragma unroll
        for (int i = 0; i < B4; ++i) {
            const int idx = tid + i * NT, r = idx / (BN / 4), c = (idx % (BN / 4)) * 4;
            rB[i] = load4(B, k0 + r, col0 + c, K, N, vecB);
        }
    }
    // Registers -> shared: A transposed into sAT[BK][BM + PAD] (so that a column of A, which the
    // inner loop reads, is contiguous), B as it is into sB[BK][BN].
    template <int LDA>
    __device__ __forceinline__ void store(float (*sAT)[LDA], float (*sB)[BN], int tid) const {
#pragma unroll
        for (int i = 0; i < A4; ++i) {
            const int idx = tid + i * NT, r = idx / (BK / 4), c = (idx % (BK / 4)) * 4;
            sAT[c + 0][r] = rA[i].x;
            sAT[c + 1][r] = rA[i].y;
            sAT[c + 2][r] = rA[i].z;
            sAT[c + 3][r] = rA[i].w;
        }
#pragma unroll
        for (int i = 0; i < B4; ++i) {
            const int idx = tid + i * NT, r = idx / (BN / 4), c = (idx % (BN / 4)) * 4;
            *reinterpret_cast<float4*>(&sB[r][c]) = rB[i];
        }
    }
};
// --8<-- [end:vec_helpers]
