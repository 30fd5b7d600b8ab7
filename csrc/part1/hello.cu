// The first CUDA program: every GPU thread prints its own coordinates.
//
//   nvcc -std=c++17 -O3 -arch=native -I csrc/common -o hello csrc/part1/hello.cu
//   ./hello            # 2 blocks x 4 threads
//   ./hello 3 5        # 3 blocks x 5 threads
//
// The order of the lines is not defined: blocks run in whatever order the hardware schedules them,
// and the lines within a block usually come out grouped by warp. Device printf writes into a
// fixed-size buffer (1 MiB by default) that the host drains at synchronization points, so a very
// large launch loses lines.
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>

#include "check.cuh"

// --8<-- [start:kernel]
// __global__: runs on the GPU, launched from the host. Every thread runs this same function; only
// the built-in coordinates blockIdx and threadIdx tell the threads apart.
__global__ void hello_kernel() {
    printf("Hello from block %u, thread %u\n", blockIdx.x, threadIdx.x);
}
// --8<-- [end:kernel]

// argv[i] as a positive int no larger than max_value, or -1 if it is not one (junk, zero, negative,
// too big).
static long parse_positive(const char* s, long max_value) {
    errno = 0;
    char* end = nullptr;
    long v = std::strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v <= 0 || v > max_value) return -1;
    return v;
}

// --8<-- [start:main]
int main(int argc, char** argv) {
    long blocks = 2, threads = 4;
    if (argc > 1) blocks = parse_positive(argv[1], INT_MAX);  // gridDim.x may go up to 2^31 - 1
    // 1024 threads per block on every GPU since 2010
    if (argc > 2) threads = parse_positive(argv[2], 1024);
    if (argc > 3 || blocks < 0 || threads < 0) {
        std::fprintf(stderr, "usage: %s [blocks > 0] [threads_per_block in 1..1024]\n", argv[0]);
        return 2;
    }

    // <<<blocks in the grid, threads per block>>>
    hello_kernel<<<(unsigned)blocks, (unsigned)threads>>>();
    CUDA_CHECK_LAST();                       // was the launch accepted?
    CUDA_CHECK(cudaDeviceSynchronize());     // wait for the kernel (and flush its printf output)

    std::printf("launched %ld blocks x %ld threads = %lld threads\n", blocks, threads,
                (long long)blocks * threads);
    return 0;
}
// --8<-- [end:main]
