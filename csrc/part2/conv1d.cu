// 1-D convolution (cross-correlation, "same" size, zero padding) of a long fp32 signal with a
// short filter:
//
//     out[i] = sum_{j=0}^{k-1} w[j] * x[i + j - k/2]
//              (x[m] = 0 outside 0 <= m < n; k odd, k <= MAX_K)
//
// Loaded from Python by snippets/part2/conv1d.py (CuPy/NVRTC).
//
// conv1d_global        one thread per output; the filter and the signal read from global memory
// conv1d_constant      like conv1d_global, but the filter in __constant__ memory: all 32 threads of
//                      a warp read the same w[j] at the same time, which the constant cache serves
//                      as one broadcast
// conv1d_shared        each block copies the filter and its input tile (with a halo of k/2 on each
//                      side) into shared memory once, then every thread computes 4 outputs from
//                      shared memory
// conv1d_shared_const  like conv1d_shared, but the filter from __constant__ memory and only x in
//                      shared memory
//
// The constant-memory filter c_filter is one array per loaded module: the host copies the filter
// into it (on the launch's stream, so the copy is ordered before the launch) before every launch of
// the *_const kernels.

// odd filter lengths up to 63: the filter fits c_filter and the halo is at most 31 per side. MAX_K
// and the block shape below are the launcher's numbers, passed by snippets/part2/conv1d.py as -D
// options (the defaults let this file compile alone).
#ifndef MAX_K
#define MAX_K 63
#endif

// --8<-- [start:constant]
// 64 floats = 256 bytes of the 64 KB constant bank. Set from the host (cudaMemcpyToSymbol in a CUDA
// program; from Python, through the module's global "c_filter").
__constant__ float c_filter[MAX_K + 1];
// --8<-- [end:constant]

// --8<-- [start:global]
extern "C" __global__ void conv1d_global(const float* x, const float* w, float* out, long long n,
                                         int k) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int half = k / 2;
    float acc = 0.f;
    for (int j = 0; j < k; ++j) {
        long long src = i + j - half;
        if (src >= 0 && src < n) acc = fmaf(w[j], x[src], acc);  // outside the signal: zero padding
    }
    out[i] = acc;
}
// --8<-- [end:global]

// --8<-- [start:constant_kernel]
extern "C" __global__ void conv1d_constant(const float* x, float* out, long long n, int k) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int half = k / 2;
    float acc = 0.f;
    for (int j = 0; j < k; ++j) {
        long long src = i + j - half;
        // c_filter[j]: one address for the whole warp, served by the constant cache in
        // one broadcast
        if (src >= 0 && src < n) acc = fmaf(c_filter[j], x[src], acc);
    }
    out[i] = acc;
}
// --8<-- [end:constant_kernel]

// --8<-- [start:shared]
// blocks of THREADS threads, PER_THREAD outputs per thread: as many accumulators share each filter
// value read
#ifndef THREADS
#define THREADS 256
#define PER_THREAD 4
#endif
// outputs per block; its input tile is TILE + k - 1 values
constexpr int TILE = THREADS * PER_THREAD;

template <bool CONST_FILTER>
__device__ __forceinline__ void conv1d_tile(const float* x, const float* w, float* out, long long n,
                                            int k) {
    __shared__ float sW[MAX_K + 1];              // (k,)  unused when CONST_FILTER
    __shared__ float sX[TILE + MAX_K - 1];       // (TILE + k - 1,)  outputs' inputs, halo included
    int half = k / 2;
    long long base = (long long)blockIdx.x * TILE;  // first output of this block
    if (!CONST_FILTER) {
        for (int j = threadIdx.x; j < k; j += THREADS) sW[j] = w[j];
    }
    // Coalesced copy of x[base - half, base + TILE + half) into shared memory, zeros past
    // either end.
    for (int t = threadIdx.x; t < TILE + k - 1; t += THREADS) {
        long long src = base - half + t;
        sX[t] = (src >= 0 && src < n) ? x[src] : 0.f;
    }
    // the whole tile must be in shared memory before any thread reads its neighbours' part
    __syncthreads();

    float acc[PER_THREAD] = {};  // (PER_THREAD,) registers
    for (int j = 0; j < k; ++j) {
        // same address for the whole warp: a broadcast
        float wj = CONST_FILTER ? c_filter[j] : sW[j];
#pragma unroll
        for (int r = 0; r < PER_THREAD; ++r) {
            // Output threadIdx.x + r * THREADS of the tile needs sX[that + j]: consecutive threads
            // read consecutive words, 32 different banks, no conflict.
            acc[r] = fmaf(wj, sX[threadIdx.x + r * THREADS + j], acc[r]);
        }
    }
#pragma unroll
    for (int r = 0; r < PER_THREAD; ++r) {
        long long i = base + threadIdx.x + r * THREADS;
        if (i < n) out[i] = acc[r];
    }
}

extern "C" __global__ void __launch_bounds__(THREADS)
    conv1d_shared(const float* x, const float* w, float* out, long long n, int k) {
    conv1d_tile<false>(x, w, out, n, k);
}

extern "C" __global__ void __launch_bounds__(THREADS)
    conv1d_shared_const(const float* x, float* out, long long n, int k) {
    conv1d_tile<true>(x, nullptr, out, n, k);
}
// --8<-- [end:shared]
