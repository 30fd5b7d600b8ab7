/*
 * part3.atomics.3: A per-block histogram with one private copy per warp
 *
 * The reference solution.
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
 */

#define WARPS 8       // at most WARPS warps per block: blocks of 32 to 256 threads, a multiple of 32
#define MAX_BINS 256  // bins <= MAX_BINS: the copies take WARPS * MAX_BINS * 4 bytes = 8 KB

// counts (bins int32) is zeroed by the caller; values of x outside [0, bins) are skipped. Any grid:
// the blocks stride over x together.
extern "C" __global__ void hist_per_warp(const int* x, int* counts, int n, int bins) {
    __shared__ int copies[WARPS][MAX_BINS];  // copies[w]: the private histogram of warp w
    int warp = threadIdx.x / 32;
    int warps = blockDim.x / 32;

    // 1. zero every warp's copy (a copy is left over from whatever ran before)
    for (int b = threadIdx.x; b < bins; b += blockDim.x)
        for (int w = 0; w < warps; ++w) copies[w][b] = 0;
    __syncthreads();  // zeroed before any warp counts into them

    // 2. count this block's share of x into this warp's copy: the lanes of a warp share the copy, so
    //    the increment must be atomic (a shared-memory atomic, in the SM)
    int stride = gridDim.x * blockDim.x;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int v = x[i];
        if ((unsigned)v < (unsigned)bins) atomicAdd(&copies[warp][v], 1);
    }
    __syncthreads();  // every warp has finished counting before the copies are read

    // 3. merge: sum bin b over the warps' copies, then one global atomic per non-empty bin
    for (int b = threadIdx.x; b < bins; b += blockDim.x) {
        int c = 0;
        for (int w = 0; w < warps; ++w) c += copies[w][b];
        if (c != 0) atomicAdd(&counts[b], c);
    }
}
