// Sum of a float32 vector, step by step. Loaded from Python by
// snippets/part3/reduce.py (CuPy/NVRTC).
//
// reduce_v1  shared-memory tree, interleaved addressing: if (tid % (2*s) == 0) (divergent warps)
// reduce_v2  like v1, but the active threads are packed: index = 2*s*tid (no divergence; bank
//            conflicts)
// reduce_v3  like v2, but sequential addressing: s = BLOCK/2 down to 1, tid < s (no divergence, no
//            conflicts)
// reduce_v4  like v3, but each thread adds two elements while loading (half the blocks, no idle
//            half)
// reduce_v5  like v4, but the last warp's six steps run without __syncthreads (fewer barriers)
// reduce_v6  like v4, but every warp reduces in registers with __shfl_down_sync (one barrier, 32
//            floats of smem)
// reduce_v7  like v6, but a GPU-filling grid strides over the data with float4 loads, and each
//            block adds its sum to the output with one atomicAdd (one pass, one launch)
// reduce_cg  like v7, with the warp reduce written with cooperative groups (compiled with
//            -DREDUCE_WITH_CG)
//
// v1..v6 write one partial sum per block; the Python launcher runs them again on the partial sums
// until one value is left. All pointers are float32 and contiguous (the Python wrappers check
// that). Every block has BLOCK threads: the launcher's number, which it passes as a -D option.

#ifdef REDUCE_WITH_CG
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
namespace cg = cooperative_groups;
#endif

// THREADS of snippets/part3/reduce.py, passed as -D options with UNROLL below (the defaults let
// this file compile alone)
#ifndef BLOCK
#define BLOCK 256
#endif
static_assert(BLOCK % 64 == 0 && BLOCK <= 1024,
              "v5 unrolls the last warp from s = 32: BLOCK >= 64, whole warps");

// --8<-- [start:v1]
extern "C" __global__ void reduce_v1(const float* x, float* partial, long long n) {
    __shared__ float sdata[BLOCK];
    unsigned tid = threadIdx.x;
    long long i = (long long)blockIdx.x * BLOCK + tid;
    sdata[tid] = i < n ? x[i] : 0.f;  // past the end: 0, the identity of +
    __syncthreads();
    // Step s adds the element s away into every (2s)-th slot: 0+1, 2+3, ... then 0+2, 4+6, ... then
    // 0+4, ...
    for (unsigned s = 1; s < BLOCK; s *= 2) {
        if (tid % (2 * s) == 0) {  // active threads are scattered over every warp: divergence
            sdata[tid] += sdata[tid + s];
        }
        __syncthreads();
    }
    if (tid == 0) partial[blockIdx.x] = sdata[0];
}
// --8<-- [end:v1]

// --8<-- [start:v2]
extern "C" __global__ void reduce_v2(const float* x, float* partial, long long n) {
    __shared__ float sdata[BLOCK];
    unsigned tid = threadIdx.x;
    long long i = (long long)blockIdx.x * BLOCK + tid;
    sdata[tid] = i < n ? x[i] : 0.f;
    __syncthreads();
    for (unsigned s = 1; s < BLOCK; s *= 2) {
        // the same additions as v1, done by threads 0, 1, 2, ... (whole warps)
        unsigned index = 2 * s * tid;
        if (index < BLOCK) {
            // words 2s apart: a 2s-way bank conflict, capped by the active threads
            // (256 / 2s of them): 2, 4, 8, 8, 8, 4, 2, 1-way over the eight steps
            sdata[index] += sdata[index + s];
        }
        __syncthreads();
    }
    if (tid == 0) partial[blockIdx.x] = sdata[0];
}
// --8<-- [end:v2]

// --8<-- [start:v3]
extern "C" __global__ void reduce_v3(const float* x, float* partial, long long n) {
    __shared__ float sdata[BLOCK];
    unsigned tid = threadIdx.x;
    long long i = (long long)blockIdx.x * BLOCK + tid;
    sdata[tid] = i < n ? x[i] : 0.f;
    __syncthreads();
    // Fold the upper half onto the lower half: consecutive threads touch consecutive words
    // (32 banks).
    for (unsigned s = BLOCK / 2; s > 0; s >>= 1) {
        if (tid < s) {
            sdata[tid] += sdata[tid + s];
        }
        __syncthreads();
    }
    if (tid == 0) partial[blockIdx.x] = sdata[0];
}
// --8<-- [end:v3]

// --8<-- [start:load2]
// v4, v5 and v6 start the same way: each block covers 2 * BLOCK elements, and each thread adds its
// two while loading (both loads coalesced: the second is BLOCK elements after the first).
__device__ __forceinline__ float load_two(const float* x, long long n) {
    long long i = (long long)blockIdx.x * (2 * BLOCK) + threadIdx.x;
    float v = i < n ? x[i] : 0.f;
    if (i + BLOCK < n) v += x[i + BLOCK];
    return v;
}
// --8<-- [end:load2]

// --8<-- [start:v4]
extern "C" __global__ void reduce_v4(const float* x, float* partial, long long n) {
    __shared__ float sdata[BLOCK];
    unsigned tid = threadIdx.x;
    sdata[tid] = load_two(x, n);  // the first level of the tree, done in registers
    __syncthreads();
    for (unsigned s = BLOCK / 2; s > 0; s >>= 1) {
        if (tid < s) sdata[tid] += sdata[tid + s];
        __syncthreads();
    }
    if (tid == 0) partial[blockIdx.x] = sdata[0];
}
// --8<-- [end:v4]

// --8<-- [start:v5]
extern "C" __global__ void reduce_v5(const float* x, float* partial, long long n) {
    __shared__ float sdata[BLOCK];
    unsigned tid = threadIdx.x;
    sdata[tid] = load_two(x, n);
    __syncthreads();
    // block-wide steps while more than one warp works
    for (unsigned s = BLOCK / 2; s > 32; s >>= 1) {
        if (tid < s) sdata[tid] += sdata[tid + s];
        __syncthreads();
    }
    if (tid < 32) {
        // One warp is left: no block barrier needed, only the warp's own ordering. Since Volta, the
        // threads of a warp are not guaranteed to run in lockstep, so every step reads, waits for
        // the whole warp (__syncwarp), writes, and waits again. volatile makes each access a real
        // shared-memory access.
        volatile float* vs = sdata;
        float v = vs[tid];
#pragma unroll
        for (unsigned s = 32; s > 0; s >>= 1) {
            v += vs[tid + s];
            __syncwarp();
            vs[tid] = v;
            __syncwarp();
        }
        if (tid == 0) partial[blockIdx.x] = v;
    }
}
// --8<-- [end:v5]

// --8<-- [start:warp_reduce]
// Sum of v over the 32 lanes of a warp, in registers: at each step lane i adds the value of lane
// i + offset. After 5 steps lane 0 holds the total (the other lanes hold partial sums). All 32
// lanes must call it.
__device__ __forceinline__ float warp_reduce_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_down_sync(0xffffffffu, v, offset);  // full mask: every lane takes part
    }
    return v;
}

// Sum of v over the whole block: each warp reduces with shuffles, lane 0 of each warp parks its sum
// in shared memory, and warp 0 reduces those BLOCK / 32 values. The result is valid in thread 0.
__device__ __forceinline__ float block_reduce_sum(float v) {
    __shared__ float warp_sums[BLOCK / 32];
    unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = warp_reduce_sum(v);
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < BLOCK / 32 ? warp_sums[lane] : 0.f;
        v = warp_reduce_sum(v);
    }
    return v;
}
// --8<-- [end:warp_reduce]

// --8<-- [start:v6]
extern "C" __global__ void reduce_v6(const float* x, float* partial, long long n) {
    float v = block_reduce_sum(load_two(x, n));  // one barrier in all, 32 bytes of shared memory
    if (threadIdx.x == 0) partial[blockIdx.x] = v;
}
// --8<-- [end:v6]

// --8<-- [start:v7]
// float4 loads in flight per thread per iteration (the Part 1 vector_add v5 pattern): the
// launcher's UNROLL
#ifndef UNROLL
#define UNROLL 4
#endif

// Each thread sums its share of x: the elements before the first 16-byte boundary (0 to 3 of them,
// when x is a view that starts mid-vector), then float4 groups over a grid-stride loop, then the 0
// to 3 left at the end.
__device__ __forceinline__ float thread_sum_vec4(const float* x, long long n) {
    long long tid = (long long)blockIdx.x * BLOCK + threadIdx.x;
    long long stride = (long long)gridDim.x * BLOCK;
    // x is 4-byte aligned
    long long head = (16 - (long long)((unsigned long long)x % 16)) % 16 / 4;
    if (head > n) head = n;
    float acc[UNROLL] = {};  // independent accumulators: UNROLL adds in flight, not one chain
    if (tid < head) acc[0] = x[tid];
    const float4* x4 = reinterpret_cast<const float4*>(x + head);  // 16-byte aligned now
    long long n4 = (n - head) / 4;
    for (long long base = tid; base < n4; base += stride * UNROLL) {
        float4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {  // all loads first, each one coalesced across the warp
            long long i = base + u * stride;
            v[u] = i < n4 ? x4[i] : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) acc[u] += (v[u].x + v[u].y) + (v[u].z + v[u].w);
    }
    for (long long i = head + 4 * n4 + tid; i < n; i += stride) acc[0] += x[i];
    float s = 0.f;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) s += acc[u];
    return s;
}

// out must hold 0.0f before the launch (the launcher allocates it with torch.zeros).
extern "C" __global__ void reduce_v7(const float* x, float* out, long long n) {
    float v = block_reduce_sum(thread_sum_vec4(x, n));
    // one atomic per block; the order of the adds varies run to run
    if (threadIdx.x == 0) atomicAdd(out, v);
}
// --8<-- [end:v7]

#ifdef REDUCE_WITH_CG
// --8<-- [start:cg]
// v7 with the block reduce written with cooperative groups: a tile of 32 threads is the warp, and
// cg::reduce is the shuffle loop of warp_reduce_sum (on sm_80+ it may use the hardware's redux
// instruction for integers).
extern "C" __global__ void reduce_cg(const float* x, float* out, long long n) {
    __shared__ float warp_sums[BLOCK / 32];
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    // every lane gets the warp's sum
    float v = cg::reduce(warp, thread_sum_vec4(x, n), cg::plus<float>());
    if (warp.thread_rank() == 0) warp_sums[warp.meta_group_rank()] = v;
    block.sync();
    if (warp.meta_group_rank() == 0) {
        v = warp.thread_rank() < warp.meta_group_size() ? warp_sums[warp.thread_rank()] : 0.f;
        v = cg::reduce(warp, v, cg::plus<float>());
        if (warp.thread_rank() == 0) atomicAdd(out, v);
    }
}
// --8<-- [end:cg]
#endif
