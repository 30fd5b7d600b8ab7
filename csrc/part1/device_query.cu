// Print the numbers about a GPU that the rest of the book reasons with.
//
//   nvcc -std=c++17 -O3 -arch=native -I csrc/common -o device_query csrc/part1/device_query.cu
//   ./device_query      # every device
//   ./device_query 0    # device 0 only
//
// Output is one `key: value` line per fact, with stable key names, so scripts and tests can parse
// it (split each line at its first ':'). Devices are separated by a blank line and start with a
// `device:` line.
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>

#include "check.cuh"

// One aligned `key: value` line. The key column is padded so the values line up for a human reader.
// The format attribute lets the host compiler check each call's arguments against its format, as
// for printf.
__attribute__((format(printf, 2, 3))) static void print_kv(const char* key, const char* fmt, ...) {
    std::printf("%-28s ", key);
    va_list args;
    va_start(args, fmt);
    std::vprintf(fmt, args);
    va_end(args);
    std::printf("\n");
}

// An integer attribute of `device`. cudaDeviceGetAttribute is the stable interface for these: CUDA
// 13 removed several cudaDeviceProp fields (clockRate, memoryClockRate among them) but kept
// the attributes.
static int attribute(cudaDeviceAttr attr, int device) {
    int value = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&value, attr, device));
    return value;
}

static void query_device(int device) {
    // --8<-- [start:query]
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    // Free memory is a property of the moment, not of the device: make `device` current (this
    // creates its context, which itself takes a few hundred MiB) and ask.
    CUDA_CHECK(cudaSetDevice(device));
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    int sm_clock_khz = attribute(cudaDevAttrClockRate, device);          // peak SM clock, kHz
    int mem_clock_khz = attribute(cudaDevAttrMemoryClockRate, device);   // peak memory clock, kHz
    int bus_width_bits = attribute(cudaDevAttrGlobalMemoryBusWidth, device);

    print_kv("device:", "%d", device);
    print_kv("name:", "%s", prop.name);
    print_kv("compute_capability:", "%d.%d", prop.major, prop.minor);  // sm_90 is 9.0, sm_80 is 8.0
    print_kv("sm_count:", "%d", prop.multiProcessorCount);
    // resident, across all blocks
    print_kv("max_threads_per_sm:", "%d", prop.maxThreadsPerMultiProcessor);
    print_kv("max_threads_per_block:", "%d", prop.maxThreadsPerBlock);
    print_kv("warp_size:", "%d", prop.warpSize);
    // 32-bit registers, shared by resident threads
    print_kv("regs_per_sm:", "%d", prop.regsPerMultiprocessor);
    print_kv("regs_per_block:", "%d", prop.regsPerBlock);
    print_kv("smem_per_sm_bytes:", "%zu", prop.sharedMemPerMultiprocessor);
    // A block gets 48 KiB of shared memory by default; more (up to the opt-in limit) only after
    // cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes).
    print_kv("smem_per_block_bytes:", "%zu", prop.sharedMemPerBlock);
    print_kv("smem_per_block_optin_bytes:", "%zu", prop.sharedMemPerBlockOptin);
    print_kv("l2_bytes:", "%d", prop.l2CacheSize);
    print_kv("global_mem_bytes:", "%zu", prop.totalGlobalMem);
    print_kv("free_mem_bytes:", "%zu", free_bytes);
    print_kv("sm_clock_mhz:", "%d", sm_clock_khz / 1000);
    print_kv("mem_clock_mhz:", "%d", mem_clock_khz / 1000);
    print_kv("mem_bus_width_bits:", "%d", bus_width_bits);
    // --8<-- [end:query]

    // --8<-- [start:bandwidth]
    // Theoretical peak DRAM bandwidth, in GB/s (1 GB = 1e9 bytes):
    //
    //   peak = 2 * mem_clock_hz * (bus_width_bits / 8) / 1e9
    //
    // 2 because DRAM transfers data on both edges of the clock (double data rate), and
    // bus_width_bits / 8 is the bytes moved per transfer across the whole bus. Example: an H200
    // reports 3201 MHz and 6016 bits, giving 2 * 3.201e9 * 752 B = 4814 GB/s, its datasheet's
    // 4.8 TB/s.
    //
    // Caveat: the clock that the driver reports is a convention, and for HBM it is not always the
    // one that the datasheet's figure is computed from, so on some GPUs this formula is off from
    // the datasheet by a factor. Either way no kernel reaches it: the book's roofline uses the
    // bandwidth of a large device-to-device copy, measured on the GPU at hand, and quotes this
    // number only for comparison.
    if (mem_clock_khz > 0 && bus_width_bits > 0) {
        double peak_gbps = 2.0 * (mem_clock_khz * 1000.0) * (bus_width_bits / 8.0) / 1e9;
        print_kv("peak_dram_gbps:", "%.1f", peak_gbps);
    } else {
        print_kv("peak_dram_gbps:", "n/a");  // some platforms report no memory clock
    }
    // --8<-- [end:bandwidth]
}

int main(int argc, char** argv) {
    int count = 0;
    // fails (and says why) when there is no GPU or no driver
    CUDA_CHECK(cudaGetDeviceCount(&count));

    int first = 0, last = count - 1;
    if (argc > 1) {
        errno = 0;
        char* end = nullptr;
        long d = std::strtol(argv[1], &end, 10);
        if (argc > 2 || errno != 0 || end == argv[1] || *end != '\0' || d < 0 || d >= count) {
            std::fprintf(stderr, "usage: %s [device in 0..%d]\n", argv[0], count - 1);
            return 2;
        }
        first = last = (int)d;
    }
    for (int d = first; d <= last; ++d) {
        if (d != first) std::printf("\n");
        query_device(d);
    }
    return 0;
}
