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

// Rows of n elements, n a multiple of the vector's 16 / sizeof(T) and every pointer 16-byte
// aligned (the launcher checks both); VECS * 32 vectors cover a row.
template <typename T, int VECS>
__device__ __forceinline__ void layernorm_warp(const T* __restrict__ x, const T* __restrict__ w,
                                               const T* __restrict__ b, T* __restrict__ y, int m,
                                               int n, float eps) {
    constexpr int PER = Vec<T>::N;
    const int lane = threadIdx.x % 32;
    const long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= m) return;  // a whole warp: no shuffle is left half-attended
    const int nv = n / PER;  // vectors in a row
    const Vec<T>* gx = reinterpret_cast<const Vec<T>*>(x + row * n);
    Vec<T> rx[VECS];  // this lane's vectors, as loaded

    // 1. every load issued before any is used
#pragma unroll
    for (int v = 0; v < VECS; ++v) {
        const int i = v * 32 + lane;
        if (i < nv) {
            rx[v] = gx[i];
        } else {
#pragma unroll
            for (int e = 0; e < PER; ++e) rx[v].v[e] = from_float<T>(0.f);  // adds nothing
        }
    }
    // 2. the mean, then the mean of squared deviations (two passes over the registers, fp32)
    float s = 0.f;
#pragma unroll
    for (int v = 0; v < VECS; ++v)
#pragma unroll
        for (int e = 0; e < PER; ++e) s += to_float(rx[v].v[e]);
    const float mean = warp_sum(s) / n;
    float ss = 0.f;
#pragma unroll
    for (int v = 0; v < VECS; ++v)
        if (v * 32 + lane < nv)
#pragma unroll
            for (int e = 0; e < PER; ++e) {
                const float d = to_float(rx[v].v[e]) - mean;
                ss += d * d;
            }
    const float rstd = rsqrtf(warp_sum(ss) / n + eps);
    // 3. scale, shift, round once to T; w and b are read here (L1 and L2 hits after the first rows)
    const Vec<T>* gw = reinterpret_cast<const Vec<T>*>(w);
    const Vec<T>* gb = reinterpret_cast<const Vec<T>*>(b);
    Vec<T>* gy = reinterpret_cast<Vec<T>*>(y + row * n);
#pragma unroll
    for (int v = 0; v < VECS; ++v) {
        const int i = v * 32 + lane;
        if (i < nv) {
            const Vec<T> wv = gw[i], bv = gb[i];
            Vec<T> out;
#pragma unroll
            for (int e = 0; e < PER; ++e)
                out.v[e] = from_float<T>((to_float(rx[v].v[e]) - mean) * rstd *
                                         to_float(wv.v[e]) + to_float(bv.v[e]));
            gy[i] = out;
        }
    }
}
// --8<-- [end:warp_kernel]

// One extern "C" entry point per (type, VECS): layernorm_warp_<type>_v<VECS>. bf16 stops at 16
// vectors a lane (4096 elements a row): at 32, ptxas spills (the bf16 -> fp32 conversions are kept
// live across the passes, 8 floats a vector); fp32 and fp16 go to 32 (4096 and 8192 elements).
#define LAYERNORM_WARP(SUFFIX, T, VECS)                                                           \
    extern "C" __global__ void __launch_bounds__(32 * V5_WARPS) layernorm_warp_##SUFFIX##_v##VECS( \
        const T* x, const T* w, const T* b, T* y, int m, int n, float eps) {                      \
        layernorm_warp<T, VECS>(x, w, b, y, m, n, eps);                                           \
    }
#define LAYERNORM_WARPS(SUFFIX, T)                                                                \
    LAYERNORM_WARP(SUFFIX, T, 1) LAYERNORM_WARP(SUFFIX, T, 2) LAYERNORM_WARP(SUFFIX, T, 4)        \
    LAYERNORM_WARP(SUFFIX, T, 8) LAYERNORM_WARP(SUFFIX, T, 16)

LAYERNORM_WARPS(f32, float) LAYERNORM_WARP(f32, float, 32)
LAYERNORM_WARPS(f16, __half) LAYERNORM_WARP(f16, __half, 32)
LAYERNORM_WARPS(bf16, __nv_bfloat16)
