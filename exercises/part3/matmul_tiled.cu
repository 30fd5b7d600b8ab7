/*
 * part3.sgemm.7: Project: the tiled matrix multiply in CUDA, and cuBLAS
 *
 * Chapter: docs/part3/sgemm.md, exercise 7. Difficulty 4 of 4 (write the kernel).
 *
 * Write the tiled matrix multiply of v3 yourself: a 16 x 16 block computes a 16 x 16 tile of C;
 * for each 16-wide slice of K it loads a tile of A and a tile of B into shared memory (zero
 * outside the matrices), waits, accumulates, and waits again before the next load. Any M, N, K. On
 * a GPU the check also times it against cuBLAS at 1024^3.
 *
 * Check it:  python -m snippets exercise check part3.sgemm.7
 * (--solution checks the reference solution; exercise show part3.sgemm.7 gives the hint)
 */

#define TILE 16

// C (m x n) = A (m x k) B (k x n), all row-major fp32. Blocks of TILE x TILE threads; grid
// (ceil(n / TILE), ceil(m / TILE)): block (bx, by) computes the tile of C at rows by * TILE.., columns bx * TILE..
extern "C" __global__ void matmul_tiled(const float* a, const float* b, float* c, int m, int n, int k) {
    // YOUR CODE HERE: the shared tiles of A and B, the loop over K in steps of TILE (load, wait, multiply,
    // wait), and the store of this thread's element of C
}
