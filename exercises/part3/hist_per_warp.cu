/*
 * part3.atomics.3: A per-block histogram with one private copy per warp
 *
 * Chapter: docs/part3/atomics.md, exercise 3. Difficulty 3 of 4 (write most of it).
 *
 * Give v2 several private copies per block: one per warp (bins * warps counters in shared memory).
 * Each warp counts its elements of x into its own copy with shared-memory atomics, skipping values
 * outside [0, bins); at the end the copies are summed bin by bin and each non-empty bin is added
 * to counts with one global atomic. It is checked against torch.bincount on uniform, skewed and
 * all-equal data with out-of-range values, n not a multiple of the block or of the grid. On a GPU,
 * measure uniform and skewed data: where does the extra shared memory start to cost occupancy?
 *
 * Check it:  python -m snippets exercise check part3.atomics.3
 * (--solution checks the reference solution; exercise show part3.atomics.3 gives the hint)
 */

#define WARPS 8       // at most WARPS warps per block: blocks of 32 to 256 threads, a multiple of 32
#define MAX_BINS 256  // bins <= MAX_BINS: the copies take WARPS * MAX_BINS * 4 bytes = 8 KB

// counts (bins int32) is zeroed by the caller; values of x outside [0, bins) are skipped. Any grid:
// the blocks stride over x together.
extern "C" __global__ void hist_per_warp(const int* x, int* counts, int n, int bins) {
    __shared__ int copies[WARPS][MAX_BINS];  // copies[w]: the private histogram of warp w
    int warp = threadIdx.x / 32;
    int warps = blockDim.x / 32;
    // YOUR CODE HERE: (1) zero bins 0 .. bins - 1 of every warp's copy, (2) count this block's share of x (a
    // grid-stride loop) into copies[warp], skipping values outside [0, bins), (3) add each bin, summed over
    // the copies, to counts. Between which steps must the whole block wait? Which counters can two threads
    // increment at the same time?
}
