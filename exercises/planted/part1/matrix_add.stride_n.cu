/*
 * part1.elementwise.2: Matrix addition with a 2-D grid and padded rows
 *
 * A PLANTED WRONG SOLUTION ('stride_n'): the solution with a bug put in on purpose, for the
 * checker's tests (--planted stride_n checks it).
 *
 * Chapter: docs/part1/elementwise.md, exercise 2. Difficulty 3 of 4 (write most of it).
 *
 * Write matrix addition for a row-major m x n matrix with a two-dimensional grid: blockIdx.y picks
 * the row and blockIdx.x a range of columns. What bounds checks does it need? Make it work on a
 * matrix whose rows are padded (a row stride ld larger than n), and explain why the one-
 * dimensional kernel can no longer be used.
 *
 * Check it:  python -m snippets exercise check part1.elementwise.2
 */

// x, y and out hold m rows of n floats; row r starts at element r * ld (ld >= n: the rows may be padded).
// The launch: grid (ceil(n / blockDim.x), m), blocks of blockDim.x threads.
extern "C" __global__ void matrix_add(const float* x, const float* y, float* out, int m, int n, int ld) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    int row = blockIdx.y;
    if (row < m && col < n) {
        long long i = (long long)row * n + col;
        out[i] = x[i] + y[i];
    }
}
