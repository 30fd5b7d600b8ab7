/*
 * part1.hello-gpu.3: Vector add in CUDA, with its bounds check
 *
 * The reference solution.
 *
 * Chapter: docs/part1/hello-gpu.md, exercise 3. Difficulty 1 of 4 (fill one line).
 *
 * Write the body of the vector-add kernel: one thread per element, its index from blockIdx,
 * blockDim and threadIdx. The grid is rounded up to whole blocks, so the last block has threads
 * past the end: the chapter's exercise removes the if (i < n) and asks why the bug can go
 * unnoticed. The CPU emulator notices it: it keeps guard elements around every buffer.
 *
 * Check it:  python -m snippets exercise check part1.hello-gpu.3
 */

extern "C" __global__ void vector_add(const float* x, const float* y, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] + y[i];
}
