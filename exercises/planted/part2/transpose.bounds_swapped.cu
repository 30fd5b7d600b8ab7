/*
 * part2.transpose.7: The shared-memory transpose, written yourself
 *
 * A PLANTED WRONG SOLUTION ('bounds_swapped'): the solution with a bug put in on purpose, for the
 * checker's tests (--planted bounds_swapped checks it).
 *
 * Chapter: docs/part2/transpose.md, exercise 7. Difficulty 4 of 4 (write the kernel).
 *
 * Write the tiled transpose of the chapter's v4: a block of 32 x 8 threads reads a 32 x 32 tile of
 * x row by row (coalesced) into a padded __shared__ tile, waits for the whole block, and writes
 * the tile to out row by row (coalesced), reading the shared tile by columns. Matrices of any
 * shape: guard every global access.
 *
 * Check it:  python -m snippets exercise check part2.transpose.7
 */

#define TILE 32
#define ROWS 8  // a block is TILE x ROWS threads: each thread copies TILE / ROWS elements of the tile

// out (n x m) = transpose of x (m x n), both row-major. Grid: (ceil(n / TILE), ceil(m / TILE)).
extern "C" __global__ void transpose_tiled(const float* x, float* out, int m, int n) {
    __shared__ float tile[TILE][TILE + 1];  // + 1: column reads without bank conflicts
    int col = blockIdx.x * TILE + threadIdx.x;
    int row0 = blockIdx.y * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += ROWS)
        if (row0 + j < m && col < n) tile[threadIdx.y + j][threadIdx.x] = x[(long long)(row0 + j) * n + col];
    __syncthreads();
    int out_col = blockIdx.y * TILE + threadIdx.x;  // a row of out is a column of x
    int out_row0 = blockIdx.x * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += ROWS)
        if (out_row0 + j < m && out_col < n)
            out[(long long)(out_row0 + j) * m + out_col] = tile[threadIdx.x][threadIdx.y + j];
}
