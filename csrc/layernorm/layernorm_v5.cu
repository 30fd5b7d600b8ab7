// LayerNorm forward v5 (Part 4): one warp per row, the row held in registers as 16-byte vectors of
// its own type, the statistics summed by warp shuffles alone: no shared memory and no barrier.
// Loaded from Python by snippets/part4/layernorm_v5.py (CuPy/NVRTC), where it is version v5 of the
// layernorm op. It reuses v4's type helpers (to_float, from_float, Vec) from layernorm.cu, included
// whole.
//
// Why: Nsight Compute's counters of v4 (one block of up to 512 threads per row) show it does not
// wait on memory more than the Triton v3; it executes many more instructions for the same rows,
// most of them the block-wide reductions' shared-memory traffic and barriers. Here a row is one
// warp's: lane l holds vectors l, l + 32, l + 64, ... of the row (VECS of them, so that a warp's
// loads are 512 contiguous bytes at a time), every lane has all its loads in flight at once, a
// reduction is five shuffles, and an SM holds as many rows as it holds warps. The row stays in its
// storage type (16 bytes hold 8 bf16 values in four registers) and is converted to fp32 where it
// is used, so a 4096-element bf16 row costs a lane 64 registers.

#include "../part4/layernorm.cu"

#ifndef V5_WARPS
#define V5_WARPS 4  // warps, so rows, a block: the launcher's number (layernorm_v5.py)
#endif

// --8<-- [start:warp_kernel]
__device__ __forceinline__ float warp_sum(float v) {  // every lane gets the warp's sum
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// A row's 16-byte vectors are kept as raw words (uint4), the pairs of elements read out of word j
// (fp32: words 2j and 2j + 1) and converted to fp32 where they are used. Each pass over the row
// converts again, so the row stays packed in registers (a bf16 row of 4096 is 64 registers a
// lane). For bf16 the conversion is two bit operations (a bf16 is the top half of an fp32),
// written as volatile asm so that the compiler does not keep all three passes' converted floats
// alive instead (nvcc 13 did, and the registers that took cut the blocks an SM holds).
__device__ __forceinline__ unsigned word(const uint4& q, int j) {  // j: a constant once unrolled
    return j == 0 ? q.x : j == 1 ? q.y : j == 2 ? q.z : q.w;
}
template <typename T> struct Pairs;
template <> struct Pairs<float> {
    static __device__ __forceinline__ void get(const uint4& q, int j, float& a, float& b) {
        a = __uint_as_float(word(q, 2 * j)), b = __uint_as_float(word(q, 2 * j + 1));
    }
    static __device__ __forceinline__ void put(uint4& q, int j, float a, float b) {
        (j == 0 ? q.x : q.z) = __float_as_uint(a), (j == 0 ? q.y : q.w) = __float_as_uint(b);
    }
};
template <> struct Pairs<__half> {
    static __device__ __forceinline__ void get(const uint4& q, int j, float& a, float& b) {
        const unsigned u = word(q, j);
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&u));
        a = f.x, b = f.y;
    }
    static __device__ __forceinline__ void put(uint4& q, int j, float a, float b) {
        const __half2 h = __floats2half2_rn(a, b);
        (j == 0 ? q.x : j == 1 ? q.y : j == 2 ? q.z : q.w) = *reinterpret_cast<const unsigned*>(&h);
    }
};
template <> struct Pairs<__nv_bfloat16> {
    static __device__ __forceinline__ void get(const uint4& q, int j, float& a, float& b) {
        unsigned lo, hi;
        asm volatile("shl.b32 %0, %2, 16;\n\tand.b32 %1, %2, 0xffff0000;"
                     : "=r"(lo), "=r"(hi) : "r"(word(q, j)));
        a = __uint_as_float(lo), b = __uint_as_float(hi);
    }
    static __device__ __forceinline__ void put(uint4& q, int j, float a, float b) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
        (j == 0 ? q.x : j == 1 ? q.y : j == 2 ? q.z : q.w) = *reinterpret_cast<const unsigned*>(&h);
    }
};

// Rows of n elements, n a multiple of the vector's 16 / sizeof(T) and every pointer 16-byte
// aligned (the launcher checks both); VECS * 32 vectors cover a row.
template <typename T, int VECS>
__device__ __forceinline__ void layernorm_warp(const T* __restrict__ x, const T* __restrict__ w,
                                               const T* __restrict__ b, T* __restrict__ y, int m,
                                               int n, float eps) {
    constexpr int PAIRS = 16 / sizeof(T) / 2;  // pairs of elements a vector
    const int lane = threadIdx.x % 32;
    const long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= m) return;  // a whole warp: no shuffle is left half-attended
    const int nv = n / (2 * PAIRS);  // vectors in a row
    const uint4* gx = reinterpret_cast<const uint4*>(x + row * n);
    uint4 rx[VECS];  // this lane's vectors, as loaded

    // 1. every load issued before any is used; zeros past the row add nothing
#pragma unroll
    for (int v = 0; v < VECS; ++v) {
        const int i = v * 32 + lane;
        rx[v] = i < nv ? gx[i] : make_uint4(0u, 0u, 0u, 0u);
    }
    // 2. the mean, then the mean of squared deviations (two passes over the registers, fp32)
    float s = 0.f;
#pragma unroll
    for (int v = 0; v < VECS; ++v)
#pragma unroll
        for (int j = 0; j < PAIRS; ++j) {
            float a, c;
            Pairs<T>::get(rx[v], j, a, c);
            s += a + c;
        }
    const float mean = warp_sum(s) / n;
    float ss = 0.f;
#pragma unroll
    for (int v = 0; v < VECS; ++v)
        if (v * 32 + lane < nv)
#pragma unroll
            for (int j = 0; j < PAIRS; ++j) {
                float a, c;
                Pairs<T>::get(rx[v], j, a, c);
                ss += (a - mean) * (a - mean) + (c - mean) * (c - mean);
            }
    const float rstd = rsqrtf(warp_sum(ss) / n + eps);
    // 3. scale, shift, round once to T; w and b are read here (L1 and L2 hits after the first rows)
    const uint4* gw = reinterpret_cast<const uint4*>(w);
    const uint4* gb = reinterpret_cast<const uint4*>(b);
    uint4* gy = reinterpret_cast<uint4*>(y + row * n);
#pragma unroll
    for (int v = 0; v < VECS; ++v) {
        const int i = v * 32 + lane;
        if (i < nv) {
            const uint4 wv = gw[i], bv = gb[i];
            uint4 out;
#pragma unroll
            for (int j = 0; j < PAIRS; ++j) {
                float a, c, wa, wc, ba, bc;
                Pairs<T>::get(rx[v], j, a, c);
                Pairs<T>::get(wv, j, wa, wc);
                Pairs<T>::get(bv, j, ba, bc);
                Pairs<T>::put(out, j, (a - mean) * rstd * wa + ba, (c - mean) * rstd * wc + bc);
            }
            gy[i] = out;
        }
    }
}
// --8<-- [end:warp_kernel]

// One extern "C" entry point per (type, VECS): layernorm_warp_<type>_v<VECS>, up to 32 vectors a
// lane (4096 fp32 or 8192 fp16 and bf16 elements a row). The second launch bound (at least three
// blocks an SM, so at most 170 registers) is there for ptxas: without it, it left 4 bytes of spill
// at 16 vectors; with it, none, at the same register count.
#define LAYERNORM_WARP(SUFFIX, T, VECS)                                                           \
    extern "C" __global__ void __launch_bounds__(32 * V5_WARPS, 3)                                \
        layernorm_warp_##SUFFIX##_v##VECS(                                                        \
            const T* x, const T* w, const T* b, T* y, int m, int n, float eps) {                  \
        layernorm_warp<T, VECS>(x, w, b, y, m, n, eps);                                           \
    }
#define LAYERNORM_WARPS(SUFFIX, T)                                                                \
    LAYERNORM_WARP(SUFFIX, T, 1) LAYERNORM_WARP(SUFFIX, T, 2) LAYERNORM_WARP(SUFFIX, T, 4)        \
    LAYERNORM_WARP(SUFFIX, T, 8) LAYERNORM_WARP(SUFFIX, T, 16) LAYERNORM_WARP(SUFFIX, T, 32)

LAYERNORM_WARPS(f32, float)
LAYERNORM_WARPS(f16, __half)
LAYERNORM_WARPS(bf16, __nv_bfloat16)
