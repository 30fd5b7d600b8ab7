// Shared-memory bank conflicts, measured: every warp reads 32 words of a shared array per step, one
// per lane, at word addresses chosen by the layout. Loaded from Python by
// snippets/part2/banks.py (CuPy/NVRTC).
//
// Shared memory is 32 banks of 4 bytes: word w lives in bank w % 32, and each bank serves one word
// per clock. A warp-wide load whose 32 addresses fall in distinct banks takes one pass; if k
// distinct words share a bank it takes k passes (a k-way conflict). Lanes reading the *same* word
// do not conflict (it is broadcast).
//
// smem_read_linear    lane reads word lane * pitch + c    (pitch = stride, or stride + 1 for the
//                     padded layout)
// smem_read_swizzled  lane reads word lane * pitch + (c ^ lane)   (pitch a multiple of 32: an
//                     XOR swizzle)
//
// for c = 0 .. 31, REPS times over. Each thread writes the sum of (c + 1) * word over its reads
// (unsigned, wrapping), which the PyTorch reference reproduces exactly. The Python wrapper checks
// that every address is below SMEM_WORDS.

// SMEM_WORDS words of shared memory (8 KiB: 32 rows of up to 64 words, so pitches up to 64 need no
// wrap-around) and COLS words read by each lane per step: the launcher's numbers, which
// snippets/part2/banks.py passes as -D options (the defaults let this file compile alone)
#ifndef SMEM_WORDS
#define SMEM_WORDS 2048
#define COLS 32
#endif

// The value stored in word w for a block whose seed is s: not linear in w, so a kernel that reads
// the right number of words from the wrong addresses gets a different sum.
__device__ __forceinline__ unsigned word_value(unsigned w, unsigned s) { return (w * w) ^ s; }

// --8<-- [start:kernel]
template <bool SWIZZLE>
__device__ __forceinline__ void smem_read(const int* seed, unsigned* out, int pitch, int reps) {
    __shared__ unsigned sWords[SMEM_WORDS];  // (SMEM_WORDS,)
    unsigned s = (unsigned)seed[blockIdx.x];
    for (int w = threadIdx.x; w < SMEM_WORDS; w += blockDim.x) sWords[w] = word_value(w, s);
    __syncthreads();

    // volatile: every read below really happens, once per step. Otherwise the compiler would notice
    // that the same 32 words are read on every step and load them only once.
    const volatile unsigned* sv = sWords;
    int lane = threadIdx.x % 32;
    // Swizzled: lane * pitch has its low 5 bits clear, so lane * pitch + (c ^ lane) ==
    // (lane * pitch + lane) ^ c, one XOR per read. Linear: lane * pitch + c, a constant offset
    // from base once the c loop is unrolled.
    int base = SWIZZLE ? lane * pitch + lane : lane * pitch;
    unsigned acc = 0;
    for (int r = 0; r < reps; ++r) {
#pragma unroll
        for (int c = 0; c < COLS; ++c) {
            // One warp-wide LDS: 32 lanes, 32 addresses. Weighted by c + 1 so the sum depends on
            // which word is read at which column: a swizzle only reorders a row, and a plain sum
            // could not tell.
            acc += (c + 1) * sv[SWIZZLE ? (base ^ c) : (base + c)];
        }
    }
    out[(long long)blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

extern "C" __global__ void smem_read_linear(const int* seed, unsigned* out, int pitch, int reps) {
    smem_read<false>(seed, out, pitch, reps);
}

extern "C" __global__ void smem_read_swizzled(const int* seed, unsigned* out, int pitch, int reps) {
    smem_read<true>(seed, out, pitch, reps);
}
// --8<-- [end:kernel]
