/*
 * part3.warp-primitives.2: A warp-level inclusive scan with `__shfl_up_sync`
 *
 * Chapter: docs/part3/warp-primitives.md, exercise 2. Difficulty 3 of 4 (write most of it).
 *
 * Write a warp-level inclusive scan (prefix sum) with __shfl_up_sync: each warp scans its 32
 * consecutive elements. Which lanes must not add in each step? It is checked against torch.cumsum
 * on each warp's worth of values (the CPU emulator runs shuffles as well).
 *
 * Check it:  python -m snippets exercise check part3.warp-primitives.2
 * (--solution checks the reference solution; exercise show part3.warp-primitives.2 gives the hint)
 */

// Each warp scans its own 32 consecutive elements: out[i] = x[w] + x[w + 1] + ... + x[i], w = 32 * (i / 32).
// Blocks of a multiple of 32 threads.
extern "C" __global__ void warp_inclusive_scan(const float* x, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int lane = threadIdx.x % 32;
    float v = i < n ? x[i] : 0.0f;  // every lane takes part in the shuffles, even past the end
    // YOUR CODE HERE: five steps d = 1, 2, 4, 8, 16 of __shfl_up_sync. Which lanes must not add?
    if (i < n) out[i] = v;
}
