// Row-wise softmax of a contiguous (M, N) matrix, one block per row. Loaded from Python by
// snippets/part4/softmax.py (CuPy/NVRTC), where it is version v5 of the softmax op.
//
// Each block reads its row once into registers (VALUES_PER_THREAD fp32 values per thread at most),
// reduces the max and then the sum of exp(x - max) with warp shuffles and one shared-memory
// exchange between warps, and writes exp(x - max) / sum once: 2 N element transfers per row, the
// same plan as the Triton one-pass kernel.
//
// softmax_<type>_vec     16-byte loads and stores (4 floats, 8 bf16/fp16); needs
//                        N * sizeof(T) % 16 == 0 and a 16-byte aligned base pointer, so that every
//                        row starts on a 16-byte boundary
// softmax_<type>_scalar  one element per load, for any N
// with <type> f32 (float), bf16 (__nv_bfloat16) or f16 (__half). Math is fp32 for every type.
//
// The launcher gives each block blockDim.x = 32 * ceil(N / VALUES_PER_THREAD / 32) threads (whole
// warps, at most MAX_THREADS) and refuses N > VALUES_PER_THREAD * MAX_THREADS.

// NVRTC (through CuPy) finds cuda_fp16.h and cuda_bf16.h in the CUDA toolkit's include directory.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

// The launcher's numbers, passed by snippets/part4/softmax.py as -D options (the defaults let this
// file compile alone): fp32 values of the row per thread, and the most threads per block, so rows
// of up to VALUES_PER_THREAD * MAX_THREADS columns
#ifndef VALUES_PER_THREAD
#define VALUES_PER_THREAD 32
#endif
#ifndef MAX_THREADS
#define MAX_THREADS 512
#endif
constexpr int MAX_WARPS = MAX_THREADS / 32;
static_assert(MAX_THREADS % 32 == 0 && MAX_THREADS <= 1024, "whole warps, within a block's limit");

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

// VEC consecutive elements moved as one access: alignas makes a 16-byte pack one LDG.128 / STG.128.
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
    T v[VEC];
};

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// --8<-- [start:block_reduce]
// Max and sum over a warp with xor butterflies: after 5 steps every lane holds the result (a
// shfl_down tree would leave it in lane 0 only, and we need it in every thread of the row).
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// Over the whole block, result in every thread: each warp reduces its lanes, lane 0 parks the
// warp's result in shared memory, and every warp then reduces the (at most 16) parked values
// itself. The second barrier lets the next call reuse `parked`.
template <bool IS_MAX>
__device__ __forceinline__ float block_allreduce(float v, float* parked) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = IS_MAX ? warp_max(v) : warp_sum(v);
    if (lane == 0) parked[warp] = v;
    __syncthreads();
    // identity of max / + for the empty slots
    v = lane < warps ? parked[lane] : (IS_MAX ? neg_inf() : 0.f);
    v = IS_MAX ? warp_max(v) : warp_sum(v);
    __syncthreads();
    return v;
}
// --8<-- [end:block_reduce]

// --8<-- [start:softmax_row]
template <typename T, int VEC>
__device__ __forceinline__ void softmax_row(const T* __restrict__ x, T* __restrict__ y, int n) {
    constexpr int ITEMS = VALUES_PER_THREAD / VEC;  // packs per thread
    __shared__ float parked[MAX_WARPS];
    const long long start = (long long)blockIdx.x * n;  // 64-bit: M * N may pass 2^31
    const T* gX = x + start;  // (N,) this block's row, in global memory
    T* gY = y + start;        // (N,)
    float rX[ITEMS][VEC];     // (ITEMS, VEC) this thread's values, in registers

    // Pack i of thread t covers columns (i * blockDim.x + t) * VEC ...: consecutive threads,
    // consecutive 16-byte packs (coalesced). With VEC > 1 the launcher guarantees N % VEC == 0: a
    // pack is all in or out.
    float m = neg_inf();
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        const int col = (i * blockDim.x + threadIdx.x) * VEC;
        if (col < n) {
            const Pack<T, VEC> p = *reinterpret_cast<const Pack<T, VEC>*>(gX + col);
#pragma unroll
            for (int j = 0; j < VEC; ++j) rX[i][j] = to_float(p.v[j]);
        } else {
            // padding: exp(-inf - max) = 0 below
#pragma unroll
            for (int j = 0; j < VEC; ++j) rX[i][j] = neg_inf();
        }
#pragma unroll
        for (int j = 0; j < VEC; ++j) m = fmaxf(m, rX[i][j]);
    }
    m = block_allreduce<true>(m, parked);

    float s = 0.f;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
            // ex2.approx after a multiply by log2(e), as Triton's tl.exp
            rX[i][j] = __expf(rX[i][j] - m);
            s += rX[i][j];
        }
    }
    const float inv = 1.f / block_allreduce<false>(s, parked);

#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        const int col = (i * blockDim.x + threadIdx.x) * VEC;
        if (col < n) {
            Pack<T, VEC> p;
#pragma unroll
            for (int j = 0; j < VEC; ++j) p.v[j] = from_float<T>(rX[i][j] * inv);
            *reinterpret_cast<Pack<T, VEC>*>(gY + col) = p;
        }
    }
}
// --8<-- [end:softmax_row]

// __launch_bounds__(MAX_THREADS): ptxas may use up to 65536 / MAX_THREADS registers per thread,
// room for the VALUES_PER_THREAD row values and everything else without spilling.
#define SOFTMAX_KERNEL(NAME, T, VEC)                                                              \
    extern "C" __global__ void __launch_bounds__(MAX_THREADS)                                     \
        NAME(const T* __restrict__ x, T* __restrict__ y, int n) {                                 \
        softmax_row<T, VEC>(x, y, n);                                                             \
    }

SOFTMAX_KERNEL(softmax_f32_vec, float, 4)
SOFTMAX_KERNEL(softmax_f32_scalar, float, 1)
SOFTMAX_KERNEL(softmax_bf16_vec, __nv_bfloat16, 8)
SOFTMAX_KERNEL(softmax_bf16_scalar, __nv_bfloat16, 1)
SOFTMAX_KERNEL(softmax_f16_vec, __half, 8)
SOFTMAX_KERNEL(softmax_f16_scalar, __half, 1)
