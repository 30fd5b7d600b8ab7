// Launch overhead: the same tiny work item (add 1 to one int32 of out) done by N launches, or by
// one launch. Loaded from Python by snippets/part3/streams.py (CuPy/NVRTC):
//
// add_one_at          one work item per launch, launched <<<1, 1>>> N times (v2 of
//                     launch_overhead); the CUDA graph of v4 and the round-trip measurement replay
//                     or launch the same kind of tiny kernel
// add_one_persistent  one launch for all N items (v5): a grid sized to the GPU, one thread per
//                     block, and each block claims the next item from a work counter in device
//                     memory until none is left
//
// out is int32 and contiguous; next is one zeroed 64-bit word (the wrapper allocates it for
// every launch).

// --8<-- [start:add_one]
// The work item, shared by both kernels so the comparison is fair: one 4-byte load, one add, one
// 4-byte store.
__device__ __forceinline__ void add_one(int* out, long long i) { out[i] += 1; }

extern "C" __global__ void add_one_at(int* out, long long i) {
    add_one(out, i);  // a grid of one block of one thread: everything else in a launch is overhead
}
// --8<-- [end:add_one]

// --8<-- [start:persistent]
extern "C" __global__ void add_one_persistent(int* out, long long n, unsigned long long* next) {
    // Launched with one thread per block and as many blocks as fit on the GPU at once. A block does
    // not own a fixed set of items: it claims the next unclaimed one (atomicAdd returns the
    // counter's old value, so no two claims get the same item) and comes back for more, so a block
    // that finishes early takes more work. No block ever waits for another, so the kernel is
    // correct for any grid size, resident or not; the grid size only decides how many claims run
    // at once.
    for (;;) {
        unsigned long long item = atomicAdd(next, 1ULL);
        if (item >= (unsigned long long)n) return;  // every item is claimed: this block is done
        add_one(out, (long long)item);
    }
}
// --8<-- [end:persistent]
