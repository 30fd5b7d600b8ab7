/*
 * part2.memory-spaces.6: Project: add shared memory to vector add, and see why it does not help
 *
 * A PLANTED WRONG SOLUTION ('no_shared'): the solution with a bug put in on purpose, for the
 * checker's tests (--planted no_shared checks it).
 *
 * Chapter: docs/part2/memory-spaces.md, exercise 6. Difficulty 2 of 4 (write a few lines).
 *
 * A classic first project: make the vector add go through shared memory (each thread stores x[i]
 * and y[i] in __shared__ arrays, then adds from them). Before you measure, predict with the bytes
 * model: how many bytes cross DRAM with and without shared memory, how many go through shared
 * memory, and what speed-up to expect. Write the kernel in the .cu file and the prediction in the
 * .py file.
 *
 * Check it:  python -m snippets exercise check part2.memory-spaces.6
 */

#define BLOCK 256  // the launch uses blocks of BLOCK threads

extern "C" __global__ void vector_add_shared(const float* x, const float* y, float* out, int n) {
    __shared__ float xs[BLOCK];
    __shared__ float ys[BLOCK];
    int i = blockIdx.x * BLOCK + threadIdx.x;
    if (i < n) out[i] = x[i] + y[i];
}
