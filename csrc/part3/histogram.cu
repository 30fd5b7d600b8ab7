// Histogram kernels of Part 3, loaded from Python by snippets/part3/histogram.py (CuPy/NVRTC).
//
// hist_global   v1  one global atomicAdd per element (every increment goes to L2)
// hist_shared   v2  a private histogram per block in shared memory, then one global atomicAdd per
//                   bin per block (the L2 sees bins atomics per block)
// hist_warp     v3  like v2, but lanes of a warp holding the same value are combined with
//                   __match_any_sync first: one shared atomic per distinct value per warp
//                   (contention on one bin collapses)
//
// x holds int32 values; a value outside [0, bins) is skipped (not counted, not clamped). counts
// (int32, length bins) must be zeroed by the caller. All loops are block-uniform: every thread of a
// block runs the same number of iterations, which __match_any_sync with a full mask requires.

// --8<-- [start:global]
extern "C" __global__ void hist_global(const int* x, int* counts, long long n, int bins) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int v = x[i];
        // One unsigned compare tests 0 <= v < bins: a negative v becomes a huge unsigned number.
        if ((unsigned)v < (unsigned)bins) atomicAdd(&counts[v], 1);
    }
}
// --8<-- [end:global]

// --8<-- [start:count_one]
// Count value v into the block's shared histogram sCounts; WARP_AGG combines equal values within
// the warp first. v < 0 marks "nothing to count" (an out-of-range value or a lane past the end).
template <bool WARP_AGG>
__device__ __forceinline__ void count_one(int* sCounts, int v) {
    if constexpr (WARP_AGG) {
        // lanes whose v equals mine (including me)
        unsigned peers = __match_any_sync(0xffffffffu, v);
        int leader = __ffs(peers) - 1;  // the lowest of them does the one atomic
        if (v >= 0 && (int)(threadIdx.x & 31) == leader) atomicAdd(&sCounts[v], __popc(peers));
    } else {
        if (v >= 0) atomicAdd(&sCounts[v], 1);
    }
}
// --8<-- [end:count_one]

// --8<-- [start:shared]
// Grid-stride over x with 16-byte int4 loads (four values per load). x need not be 16-byte aligned:
// the 0-3 values before the first aligned address and the 0-3 after the last whole int4 are counted
// by block 0.
template <bool WARP_AGG>
__device__ __forceinline__ void hist_privatized(const int* x, int* counts, long long n, int bins) {
    extern __shared__ int sCounts[];  // (bins,) this block's private histogram
    for (int b = threadIdx.x; b < bins; b += blockDim.x) sCounts[b] = 0;
    __syncthreads();

    long long head = (long long)(((16u - ((unsigned)(unsigned long long)x & 15u)) & 15u) / 4u);
    if (head > n) head = n;
    long long n4 = (n - head) / 4;  // whole int4 groups after the head
    const int4* x4 = reinterpret_cast<const int4*>(x + head);
    long long stride = (long long)gridDim.x * blockDim.x;
    // base is the same for every thread of the block, so all lanes reach __match_any_sync together.
    for (long long base = (long long)blockIdx.x * blockDim.x; base < n4; base += stride) {
        long long i = base + threadIdx.x;
        int4 q = make_int4(-1, -1, -1, -1);
        if (i < n4) q = x4[i];
        int vals[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            int v = vals[k];
            count_one<WARP_AGG>(sCounts, (unsigned)v < (unsigned)bins ? v : -1);
        }
    }
    if (blockIdx.x == 0 && threadIdx.x < 32) {  // the ragged ends: at most 6 values, one warp
        long long tail = head + 4 * n4;
        int lane = threadIdx.x;
        long long i = lane < head ? lane : tail + (lane - head);
        int v = (lane < head + (n - tail)) ? x[i] : -1;
        count_one<WARP_AGG>(sCounts, (unsigned)v < (unsigned)bins ? v : -1);
    }
    __syncthreads();
    for (int b = threadIdx.x; b < bins; b += blockDim.x) {
        int c = sCounts[b];
        if (c != 0) atomicAdd(&counts[b], c);  // one global atomic per non-empty bin per block
    }
}

extern "C" __global__ void hist_shared(const int* x, int* counts, long long n, int bins) {
    hist_privatized<false>(x, counts, n, bins);
}

extern "C" __global__ void hist_warp(const int* x, int* counts, long long n, int bins) {
    hist_privatized<true>(x, counts, n, bins);
}
// --8<-- [end:shared]
