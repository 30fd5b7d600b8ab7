// Error checking for the CUDA runtime API, used by every standalone program in csrc/.
//
// Almost every CUDA runtime call returns a cudaError_t, and almost every bug in a first CUDA
// program shows up as one of them being ignored: a failed cudaMalloc, a launch with too many
// threads, an illegal address. The program then carries on, prints garbage, and the real error
// surfaces much later, far from its cause. Wrapping each call makes the program stop at the first
// failure and say where it was.
#pragma once

// Under NVRTC (CuPy's RawModule, snippets/cuda.py) there is no host code and no <cstdio>; a kernel
// file that includes this header must still compile there, so the host-side macros exist only under
// nvcc/host compilers.
#if !defined(__CUDACC_RTC__)

#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

// --8<-- [start:check_macro]
// Run `call` (any expression returning cudaError_t); on failure print where and why, and exit.
// do { ... } while (0) makes the macro a single statement, so
// `if (x) CUDA_CHECK(...); else ...` works.
#define CUDA_CHECK(call)                                                                       \
    do {                                                                                       \
        cudaError_t err_ = (call);                                                             \
        if (err_ != cudaSuccess) {                                                             \
            std::fprintf(stderr, "CUDA error at %s:%d: %s failed: %s (%s)\n", __FILE__,        \
                         __LINE__, #call, cudaGetErrorString(err_), cudaGetErrorName(err_));   \
            std::exit(1);                                                                      \
        }                                                                                      \
    } while (0)

// A kernel launch returns nothing, so check it right after with CUDA_CHECK_LAST(). This catches
// errors in the launch itself (a bad configuration such as 2048 threads per block, too much shared
// memory, no kernel image for this GPU). It does NOT wait for the kernel: an error while it runs
// (an out-of-bounds access, say) is asynchronous and is reported by the next call that
// synchronizes, so follow with CUDA_CHECK(cudaDeviceSynchronize()) when you want to know that the
// kernel itself succeeded.
#define CUDA_CHECK_LAST() CUDA_CHECK(cudaGetLastError())
// --8<-- [end:check_macro]

#endif  // !defined(__CUDACC_RTC__)
