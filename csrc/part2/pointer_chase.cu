// Memory latency, measured by pointer chasing: one thread follows next = buf[cur] through a random
// cycle, so every load's address is the previous load's result and no two loads overlap. Time /
// loads = latency. Loaded from Python by snippets/part2/latency.py (CuPy/NVRTC), which launches,
// per call:
//
//   1. chain_check   the whole grid reads every word of buf once: any word outside [0, words) marks
//                    the chain invalid (out[0] = -1), and whatever of buf fits in L2 is left
//                    there, warm
//   2. chase_ca (v1) or chase_cg (v2): one block; its threads first read the slot heads of the
//                    first warm_words words (filling this SM's L1 for v1), then thread 0 alone
//                    chases iters steps and writes the index it ends on (or leaves -1 if step 1
//                    found an invalid chain).
//
// chase_ca  plain loads (ld.global, cached in L1 and L2)
// chase_cg  __ldcg loads (ld.global.cg: cached in L2 only, L1 bypassed)

// 128 bytes between the words the chain visits: one L1/L2 cache line each. The launcher's number,
// which snippets/part2/latency.py passes as a -D option (the default lets this file compile alone).
#ifndef SLOT_WORDS
#define SLOT_WORDS 32
#endif

// --8<-- [start:check]
extern "C" __global__ void chain_check(const int* buf, long long words, int* out) {
    bool bad = false;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride) {
        // Unsigned compare: a negative entry wraps to a huge index and fails too.
        bad |= (unsigned long long)(unsigned)__ldcg(buf + i) >= (unsigned long long)words;
    }
    if (bad) out[0] = -1;  // every writer writes the same value: the race is harmless
}
// --8<-- [end:check]

// --8<-- [start:chase]
struct LoadDefault {  // ld.global: the default, cached in L1 and L2
    __device__ __forceinline__ int operator()(const int* p) const { return *p; }
};
struct LoadL2Only {  // ld.global.cg: "cache global", L2 only
    __device__ __forceinline__ int operator()(const int* p) const { return __ldcg(p); }
};

template <class Load>
__device__ __forceinline__ void chase(const int* buf, long long warm_words, long long iters,
                                      int* out, Load load) {
    // Warm-up: the block reads one word per 128-byte line of the first warm_words words, with the
    // same kind of load as the chase. For v1 that fills this SM's L1 (empty at kernel start), so
    // the timed steps below measure a warm cache from the first step on; the empty asm makes the
    // loads happen though nothing uses them.
    for (long long i = (long long)threadIdx.x * SLOT_WORDS; i < warm_words;
         i += (long long)blockDim.x * SLOT_WORDS) {
        int v = load(buf + i);
        asm volatile("" ::"r"(v));
    }
    __syncthreads();
    // one thread chases; none if chain_check rejected buf
    if (threadIdx.x != 0 || __ldcg(out) != 0) return;

    unsigned cur = 0;  // word index; slot 0 is on the cycle, as every slot is
    for (long long k = 0; k < iters; ++k) {
        // the next address is this load's result: nothing can overlap
        cur = (unsigned)load(buf + cur);
    }
    out[0] = (int)cur;  // the chase's result is stored, so the compiler cannot drop the loop
}

extern "C" __global__ void chase_ca(const int* buf, long long warm_words, long long iters,
                                    int* out) {
    chase(buf, warm_words, iters, out, LoadDefault{});
}

extern "C" __global__ void chase_cg(const int* buf, long long warm_words, long long iters,
                                    int* out) {
    chase(buf, warm_words, iters, out, LoadL2Only{});
}
// --8<-- [end:chase]
