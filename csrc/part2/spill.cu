// ptxas: allow-spills
//
// Registers, local memory and spills, measured. Loaded from Python by snippets/part2/spills.py
// (CuPy/NVRTC). This file spills on purpose (chain_bounded_*), hence the marker above for the
// compile test.
//
// Every kernel computes the same function of each element x[i]:
//
//     a[0] = x[i],   a[k] = C * a[k-1] + D   (k = 1 .. SLOTS-1),
//     out[i] = a[0] + a[1] + ... + a[SLOTS-1]
//
// The sum visits the values in another order than the chain made them, so all SLOTS values are
// alive at once. The kernels differ only in where those values live:
//
// chain_registers_S  the sum visits a[S-1], a[S-2], ..., a[0]: every index is known at compile time
//                    and the loops unroll, so a[] becomes S registers.
// chain_local_S      the sum visits a[(k * step + offset) % S], with step and offset kernel
//                    arguments: a register cannot be named by a run-time index, so a[] lives in
//                    local memory (ptxas: "stack frame").
// chain_bounded_S    chain_registers with __launch_bounds__(256, 8): at most 65536 / (256 * 8) = 32
//                    registers per thread. When S values do not fit, ptxas spills some of them to
//                    local memory.
//
// All three are launched with THREADS = 256 threads per block (the launch bound of chain_bounded
// allows no more).

// --8<-- [start:chain]
// 31/32 and 1/16 are exact in fp32; |C| < 1 keeps the chain bounded: a[k] tends to D / (1 - C) = 2.
constexpr float C = 0.96875f;
constexpr float D = 0.0625f;

template <int SLOTS>
__device__ __forceinline__ void fill_chain(float (&a)[SLOTS], float x) {
    a[0] = x;
    // each value needs the one before it
#pragma unroll
    for (int k = 1; k < SLOTS; ++k) a[k] = fmaf(C, a[k - 1], D);
}

template <int SLOTS>
__device__ __forceinline__ void chain_registers(const float* x, float* out, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float a[SLOTS];  // (SLOTS,) registers: every index below is a compile-time constant
    fill_chain(a, x[i]);
    // the last value made is the first one summed: all SLOTS are alive here
    float s = a[SLOTS - 1];
#pragma unroll
    for (int k = SLOTS - 2; k >= 0; --k) s += a[k];
    out[i] = s;
}

template <int SLOTS>
__device__ __forceinline__ void chain_local(const float* x, float* out, long long n, int step,
                                            int offset) {
    static_assert((SLOTS & (SLOTS - 1)) == 0,
                  "SLOTS must be a power of two: then k * step + offset, taken "
                                              "mod SLOTS, visits every slot once for any odd step");
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float a[SLOTS];  // (SLOTS,) local memory: the reads below use an index known only at run time
    fill_chain(a, x[i]);
    float s = a[offset & (SLOTS - 1)];
#pragma unroll
    for (int k = 1; k < SLOTS; ++k) s += a[(k * step + offset) & (SLOTS - 1)];
    out[i] = s;
}
// --8<-- [end:chain]

// THREADS per block: the launcher's number, which snippets/part2/spills.py passes as a -D option
// (the default lets this file compile alone)
#ifndef THREADS
#define THREADS 256
#endif

// --8<-- [start:kernels]
// One extern "C" kernel per (variant, SLOTS), so that Python can name each one. The bounded variant
// is the register variant's code under a launch bound: 8 blocks of THREADS = 256 threads per SM
// leave 32 registers per thread.
#define CHAIN_KERNELS(S)                                                                          \
    extern "C" __global__ void chain_registers_##S(const float* x, float* out, long long n) {     \
        chain_registers<S>(x, out, n);                                                            \
    }                                                                                             \
    extern "C" __global__ void chain_local_##S(const float* x, float* out, long long n, int step, \
                                               int offset) {                                      \
        chain_local<S>(x, out, n, step, offset);                                                  \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(THREADS, 8)                                      \
        chain_bounded_##S(const float* x, float* out, long long n) {                              \
        chain_registers<S>(x, out, n);                                                            \
    }

CHAIN_KERNELS(8)
CHAIN_KERNELS(16)
CHAIN_KERNELS(32)
CHAIN_KERNELS(64)
// --8<-- [end:kernels]
