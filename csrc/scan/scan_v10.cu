// Scan v10: v8's kernel (scan_lookback_v7 of Part 3's scan.cu, included whole: 256 threads x 32
// elements, 16-byte vectors, the tile's sum published early, a warp-wide look-back) with two
// changes, both to how the kernel sits on the SM rather than to what it computes:
//
// - Five blocks an SM, more than v8's registers allow it. A block's seven other warps wait at a
//   barrier while its warp 0 looks back (Nsight Compute names the barrier as the warps' largest
//   stall); more resident blocks give the SM other tiles' loads and stores to run meanwhile.
//   __launch_bounds__(V10_THREADS, V10_BLOCKS) caps the registers at what five blocks fit
//   (65536 / (5 x 256), rounded down), which the kernel fits without spilling; five blocks' shared
//   memory fits too.
// - Streaming hints on the full tiles' loads and stores (STREAM: __ldcs / __stcs): each element is
//   touched once, so it is the first to leave L2.
//
// Within a tile the additions are v8's, in v8's order. The carry, as in v8, is a sum of the
// predecessors' published values back to the nearest inclusive prefix, and which predecessors had
// published theirs when a tile looked back depends on timing: fp32 results can differ in their last
// bits from run to run (int32 results are exact).
// Launched by snippets/part3/scan_v10.py.
#include "../part3/scan.cu"

#ifndef V10_THREADS
#define V10_THREADS 256  // the launcher's numbers (snippets/part3/scan_v10.py), as -D options
#define V10_ITEMS 32
#define V10_BLOCKS 5
#endif

// --8<-- [start:kernel]
#define INSTANTIATE_V10(T, S)                                                                     \
    extern "C" __global__ void __launch_bounds__(V10_THREADS, V10_BLOCKS)                         \
        scan_lookback_v10_##S(const T* x, T* out, unsigned long long* state, long long n) {       \
        scan_lookback_v7<T, V10_THREADS, V10_ITEMS, true>(x, out, state, n);                      \
    }

INSTANTIATE_V10(float, f32)
INSTANTIATE_V10(int, i32)
// --8<-- [end:kernel]
