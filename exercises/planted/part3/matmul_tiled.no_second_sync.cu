/*
 * part3.sgemm.7: Project: the tiled matrix multiply in CUDA, and cuBLAS
 *
 * A PLANTED WRONG SOLUTION ('no_second_sync'): the solution with a bug put in on purpose, for the
 * checker's tests (--planted no_second_sync checks it).
 *
 * Chapter: docs/part3/sgemm.md, exercise 7. Difficulty 4 of 4 (write the kernel).
 *
 * Write the tiled matrix multiply of v3 yourself: a 16 x 16 block computes a 16 x 16 tile of C;
 * for each 16-wide slice of K it loads a tile of A and a tile of B into shared memory (zero
 * outside the matrices), waits, accumulates, and waits again before the next load. Any M, N, K. On
 * a GPU the check also times it against cuBLAS at 1024^3.
 *
 * Check it:  python -m snippets exercise check part3.sgemm.7
 */

#define TILE 16

// C (m x n) = A (m x k) B (k x n), all row-major fp32. Blocks of TILE x TILE threads; grid
// (ceil(n / TILE), ceil(m / TILE)): block (bx, by) computes the tile of C at rows by * TILE.., columns bx * TILE..
extern "C" __global__ void matmul_tiled(const float* a, const float* b, float* c, int m, int n, int k) {
    __shared__ float as[TILE][TILE];
    __shared__ float bs[TILE][TILE];
    int tx = threadIdx.x, ty = threadIdx.y;
    int row = blockIdx.y * TILE + ty, col = blockIdx.x * TILE + tx;
    float acc = 0.0f;
    for (int k0 = 0; k0 < k; k0 += TILE) {
        as[ty][tx] = (row < m && k0 + tx < k) ? a[(long long)row * k + k0 + tx] : 0.0f;
        bs[ty][tx] = (k0 + ty < k && col < n) ? b[(long long)(k0 + ty) * n + col] : 0.0f;
        __syncthreads();  // the tiles are complete
        for (int j = 0; j < TILE; ++j) acc += as[ty][j] * bs[j][tx];
    }
    if (row < m && col < n) c[(long long)row * n + col] = acc;
}
