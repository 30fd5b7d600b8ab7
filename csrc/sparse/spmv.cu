// y = A x with A in CSR (row pointers crow, column indices col, values val), one warp per row
// ("CSR-vector", Bell and Garland 2009). Loaded from Python by snippets/part4/spmv.py
// (CuPy/NVRTC), where it is version v3 of the spmv op.
//
// Lane l of the warp for row r reads nonzeros crow[r] + l, crow[r] + l + 32, ...: 32 consecutive
// values and column indices per step, so those reads are coalesced (one warp-wide access covers
// 128 bytes of fp32 values and 128 bytes of int32 indices), unlike one thread per row, whose lanes
// read 32 different rows. The x[col] reads stay a gather. Each lane sums its products in fp32, and
// five __shfl_down_sync steps add the 32 partial sums into lane 0, which writes y[r].
//
// spmv_warp_<type>_<index>, <type> f32 (float), bf16 (__nv_bfloat16) or f16 (__half), <index> i32
// or i64 (crow and col). The launcher gives each block WARPS_PER_BLOCK warps (one row each) and
// ceil(M / WARPS_PER_BLOCK) blocks.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

// Rows per block, passed by snippets/part4/spmv.py as a -D option (the default lets this file
// compile alone).
#ifndef WARPS_PER_BLOCK
#define WARPS_PER_BLOCK 8
#endif
static_assert(WARPS_PER_BLOCK >= 1 && WARPS_PER_BLOCK <= 32, "a block holds at most 32 warps");

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half from_float<__half>(float v) {
    return __float2half_rn(v);
}

// --8<-- [start:warp_row]
template <typename T, typename I>
__device__ __forceinline__ void spmv_warp_row(const I* __restrict__ crow,
                                              const I* __restrict__ col,
                                              const T* __restrict__ val,
                                              const T* __restrict__ x, T* __restrict__ y,
                                              int m) {
    const int lane = threadIdx.x % 32;
    const int row = blockIdx.x * WARPS_PER_BLOCK + threadIdx.x / 32;
    if (row >= m) return;  // the whole warp leaves together: the shuffles below stay full-warp
    const long long start = crow[row];
    const long long end = crow[row + 1];
    float sum = 0.0f;
    for (long long j = start + lane; j < end; j += 32) {
        // val[j], col[j]: 32 consecutive entries per step, coalesced; x[col[j]]: a gather
        sum += to_float(val[j]) * to_float(__ldg(&x[col[j]]));
    }
    // tree reduction over the warp: after 5 steps lane 0 holds the row's sum
    for (int offset = 16; offset > 0; offset /= 2) {
        sum += __shfl_down_sync(0xffffffffu, sum, offset);
    }
    if (lane == 0) y[row] = from_float<T>(sum);
}
// --8<-- [end:warp_row]

#define SPMV_KERNEL(NAME, T, I)                                                                   \
    extern "C" __global__ void __launch_bounds__(32 * WARPS_PER_BLOCK)                            \
        NAME(const I* crow, const I* col, const T* val, const T* x, T* y, int m) {                \
        spmv_warp_row<T, I>(crow, col, val, x, y, m);                                             \
    }

SPMV_KERNEL(spmv_warp_f32_i32, float, int)
SPMV_KERNEL(spmv_warp_f32_i64, float, long long)
SPMV_KERNEL(spmv_warp_bf16_i32, __nv_bfloat16, int)
SPMV_KERNEL(spmv_warp_bf16_i64, __nv_bfloat16, long long)
SPMV_KERNEL(spmv_warp_f16_i32, __half, int)
SPMV_KERNEL(spmv_warp_f16_i64, __half, long long)
