// Element-wise kernels of Part 1, loaded from Python by snippets/part1/elementwise.py (CuPy/NVRTC).
//
// vector_add_v1  one thread per element, bounds check (the first kernel anyone writes)
// vector_add_v2  like v1, but a fixed grid strides over the array (grid size no longer tied to n)
// vector_add_v3  like v2, but each thread moves 16 bytes per load (float4) (a quarter of the load
//                instructions)
// vector_add_v5  like v3, but each thread issues VEC4_UNROLL float4 loads per array before its
//                first store (VEC4_UNROLL times the bytes in flight per thread)
// scale / relu / saxpy: the v5 pattern with another body.
//
// All pointers are float32 and contiguous; the Python wrappers check that, and use the vectorized
// kernels only when every pointer is 16-byte aligned (a view such as x[1:] is contiguous but
// not aligned).

// --8<-- [start:naive]
extern "C" __global__ void vector_add_v1(const float* x, const float* y, float* out, long long n) {
    // Global index of this thread. 64-bit: blockIdx.x * blockDim.x overflows int past
    // 2^31 elements.
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {  // the last block runs past the end when n is not a multiple of blockDim.x
        out[i] = x[i] + y[i];
    }
}
// --8<-- [end:naive]

// --8<-- [start:grid_stride]
extern "C" __global__ void vector_add_v2(const float* x, const float* y, float* out, long long n) {
    long long stride = (long long)gridDim.x * blockDim.x;  // threads in the whole grid
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = x[i] + y[i];
    }
}
// --8<-- [end:grid_stride]

// --8<-- [start:vectorized]
// out[i] = f(x[i], y[i]) for n elements: 16-byte float4 loads and stores over a grid-stride loop,
// then a scalar tail. NIN = 1 makes a unary op: y is never read and f's second argument is x again.
// UNROLL float4 groups per thread per step, one grid apart (so each load instruction stays
// coalesced across the warp): all UNROLL loads are issued before the first store, so UNROLL times
// more bytes are in flight. Requires x, y and out to be 16-byte aligned (checked by the caller).
template <int NIN, int UNROLL, class F>
__device__ __forceinline__ void map_vec4(const float* x, const float* y, float* out, long long n,
                                         F f) {
    static_assert(NIN == 1 || NIN == 2, "map_vec4 handles unary and binary ops");
    static_assert(UNROLL >= 1 && UNROLL <= 8, "registers: 8 float4 per array per thread is plenty");
    long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    long long n4 = n / 4;  // whole float4 groups
    const float4* x4 = reinterpret_cast<const float4*>(x);
    // unused (and may be null) when NIN == 1
    const float4* y4 = reinterpret_cast<const float4*>(y);
    float4* out4 = reinterpret_cast<float4*>(out);
    for (long long base = tid; base < n4; base += stride * UNROLL) {
        float4 a[UNROLL], b[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {  // loads first: one 128-bit LDG.E.128 each
            long long i = base + u * stride;
            if (i < n4) {
                a[u] = x4[i];
                b[u] = a[u];
                if constexpr (NIN == 2) b[u] = y4[i];
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {  // then the math and the stores
            long long i = base + u * stride;
            if (i < n4) {
                out4[i] = make_float4(f(a[u].x, b[u].x), f(a[u].y, b[u].y), f(a[u].z, b[u].z),
                                      f(a[u].w, b[u].w));
            }
        }
    }
    for (long long i = 4 * n4 + tid; i < n; i += stride) {  // at most 3 leftover elements
        out[i] = NIN == 2 ? f(x[i], y[i]) : f(x[i], x[i]);
    }
}

extern "C" __global__ void vector_add_v3(const float* x, const float* y, float* out, long long n) {
    map_vec4<2, 1>(x, y, out, n, [](float a, float b) { return a + b; });
}

// v5 and scale/relu/saxpy unroll by UNROLL of snippets/part1/elementwise.py, which passes it as
// -DVEC4_UNROLL (the default lets this file compile alone)
#ifndef VEC4_UNROLL
#define VEC4_UNROLL 4
#endif

extern "C" __global__ void vector_add_v5(const float* x, const float* y, float* out, long long n) {
    map_vec4<2, VEC4_UNROLL>(x, y, out, n, [](float a, float b) { return a + b; });
}
// --8<-- [end:vectorized]

// --8<-- [start:others]
extern "C" __global__ void scale_vec4(const float* x, float* out, long long n, float alpha) {
    map_vec4<1, VEC4_UNROLL>(x, nullptr, out, n, [=](float a, float) { return alpha * a; });
}

extern "C" __global__ void relu_vec4(const float* x, float* out, long long n) {
    // a < 0 ? 0 : a keeps NaN as NaN, like torch.relu; fmaxf(a, 0.f) would turn NaN into 0.
    map_vec4<1, VEC4_UNROLL>(x, nullptr, out, n, [](float a, float) { return a < 0.f ? 0.f : a; });
}

extern "C" __global__ void saxpy_vec4(const float* x, const float* y, float* out, long long n,
                                      float alpha) {
    map_vec4<2, VEC4_UNROLL>(x, y, out, n, [=](float a, float b) { return fmaf(alpha, a, b); });
}
// --8<-- [end:others]
