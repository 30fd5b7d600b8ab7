// LayerNorm forward, y = (x - mean) * rstd * w + b over each row of x (M, N), in CUDA C: the same
// algorithm as the Triton kernel of snippets/part4/layernorm.py, written by hand, for the "Triton
// or CUDA?" comparison. Loaded from Python by snippets/part4/layernorm.py (CuPy/NVRTC); one
// launcher for every kernel.
//
// layernorm_fwd_<type>_v<VECS>   one block per row; thread t holds VECS 16-byte vectors of the
//                                row in registers (vector v of thread t covers elements
//                                (v * blockDim.x + t) * PER_VEC onwards, so a warp's loads are 512
//                                contiguous bytes); <type> is f32, f16 or bf16 (4, 8, 8 elements
//                                per vector), VECS is 1, 2 or 4.
//
// Statistics are fp32 and two-pass over the registers (the mean, then the mean of (x - mean)^2),
// each a warp shuffle reduction plus one shared-memory exchange between the warps. When the row
// length is a multiple of 16 bytes and every pointer is 16-byte aligned (the launcher checks,
// `aligned`), loads and stores are 16-byte vectors; otherwise the same registers are filled element
// by element with bounds checks. blockDim.x is a multiple of 32, at most 512, and blockDim.x *
// VECS * PER_VEC >= N (the launcher picks both): rows of up to 4 * 512 * 8 = 16384 bf16/fp16 or
// 8192 fp32 elements. __launch_bounds__(512) lets ptxas give a thread up to 128 registers; VECS = 4
// bf16 (32 floats of the row) uses well under that, while VECS = 8 (64 floats) spilled a few bytes
// for sm_80, and 1024 threads would cap a thread at 64 registers.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

// --8<-- [start:types]
// Conversions between the storage type and fp32, the only type arithmetic is done in.
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) {
    return __float2half_rn(v);
}
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}

// A 16-byte vector of T: what one ld.global.v4.b32 moves.
template <typename T>
struct alignas(16) Vec {
    static constexpr int N = 16 / sizeof(T);
    T v[N];
};
// --8<-- [end:types]

// --8<-- [start:block_sum]
// Sum of v over the block, returned to every thread. Each warp reduces with a butterfly
// (__shfl_xor_sync: every lane ends with the warp's sum), lane 0 parks it in shared memory, and
// every warp then adds the blockDim.x / 32 warp sums itself (at most 32 loads from shared memory, a
// broadcast: no bank conflicts). `shared` holds 32 floats; the trailing barrier lets the caller
// reuse it for the next sum.
__device__ __forceinline__ float block_sum(float v, float* shared) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    float total = 0.f;
    // the same order in every thread: the same bits
    for (int i = 0; i < warps; ++i) total += shared[i];
    __syncthreads();
    return total;
}
// --8<-- [end:block_sum]

// --8<-- [start:kernel]
template <typename T, int VECS>
__device__ void layernorm_fwd(const T* __restrict__ x, const T* __restrict__ w,
                              const T* __restrict__ b, T* __restrict__ y, int n, float eps,
                              bool aligned) {
    constexpr int PER_VEC = Vec<T>::N;
    __shared__ float shared[32];
    const size_t row = blockIdx.x;
    const T* gx = x + row * n;  // (N,) this block's row of x
    T* gy = y + row * n;        // (N,)
    float rx[VECS][PER_VEC];    // (VECS, PER_VEC) the thread's part of the row, in fp32

    // 1. Load: all VECS loads are issued before any is used, so each thread has VECS * 16 bytes
    // in flight.
#pragma unroll
    for (int v = 0; v < VECS; ++v) {
        const int col = (v * blockDim.x + threadIdx.x) * PER_VEC;
        // n is a multiple of PER_VEC: the vector is wholly inside the row
        if (aligned && col < n) {
            Vec<T> in = *reinterpret_cast<const Vec<T>*>(gx + col);
#pragma unroll
            for (int e = 0; e < PER_VEC; ++e) rx[v][e] = to_float(in.v[e]);
        } else {
#pragma unroll
            for (int e = 0; e < PER_VEC; ++e) rx[v][e] = col + e < n ? to_float(gx[col + e]) : 0.f;
        }
    }

    // 2. mean, then the variance of the centred values (padding is 0 and must stay out of the
    // variance).
    float s = 0.f;
#pragma unroll
    for (int v = 0; v < VECS; ++v)
#pragma unroll
        for (int e = 0; e < PER_VEC; ++e) s += rx[v][e];
    const float mean = block_sum(s, shared) / n;
    float ss = 0.f;
#pragma unroll
    for (int v = 0; v < VECS; ++v) {
        const int col = (v * blockDim.x + threadIdx.x) * PER_VEC;
#pragma unroll
        for (int e = 0; e < PER_VEC; ++e) {
            rx[v][e] = col + e < n ? rx[v][e] - mean : 0.f;
            ss += rx[v][e] * rx[v][e];
        }
    }
    const float rstd = rsqrtf(block_sum(ss, shared) / n + eps);

    // 3. Scale, shift, round once to T and store, with the same vectors as the loads. w and b are
    // read here, after the two barriers (L2 hits after the first rows).
#pragma unroll
    for (int v = 0; v < VECS; ++v) {
        const int col = (v * blockDim.x + threadIdx.x) * PER_VEC;
        if (aligned && col < n) {
            const Vec<T> wv = *reinterpret_cast<const Vec<T>*>(w + col);
            const Vec<T> bv = *reinterpret_cast<const Vec<T>*>(b + col);
            Vec<T> out;
#pragma unroll
            for (int e = 0; e < PER_VEC; ++e)
                out.v[e] = from_float<T>(rx[v][e] * rstd * to_float(wv.v[e]) + to_float(bv.v[e]));
            *reinterpret_cast<Vec<T>*>(gy + col) = out;
        } else {
#pragma unroll
            for (int e = 0; e < PER_VEC; ++e)
                if (col + e < n)
                    gy[col + e] = from_float<T>(rx[v][e] * rstd * to_float(w[col + e]) +
                                                to_float(b[col + e]));
        }
    }
}
// --8<-- [end:kernel]

// The most threads per block: CUDA_THREADS of snippets/part4/layernorm.py, which passes it as a -D
// option (the default lets this file compile alone)
#ifndef CUDA_THREADS
#define CUDA_THREADS 512
#endif

// One extern "C" entry point per (type, VECS), so that the launcher can find each by name.
#define LAYERNORM_ENTRY(SUFFIX, T, VECS)                                                          \
    extern "C" __global__ void __launch_bounds__(CUDA_THREADS)                                    \
        layernorm_fwd_##SUFFIX##_v##VECS(                                                         \
            const T* x, const T* w, const T* b, T* y, int n, float eps, int aligned) {            \
        layernorm_fwd<T, VECS>(x, w, b, y, n, eps, aligned != 0);                                 \
    }
#define LAYERNORM_ENTRIES(SUFFIX, T) \
    LAYERNORM_ENTRY(SUFFIX, T, 1) LAYERNORM_ENTRY(SUFFIX, T, 2) LAYERNORM_ENTRY(SUFFIX, T, 4)

LAYERNORM_ENTRIES(f32, float)
LAYERNORM_ENTRIES(f16, __half)
LAYERNORM_ENTRIES(bf16, __nv_bfloat16)
