/*
 * part2.transpose.7: The shared-memory transpose, written yourself
 *
 * Chapter: docs/part2/transpose.md, exercise 7. Difficulty 4 of 4 (write the kernel).
 *
 * Write the tiled transpose of the chapter's v4: a block of 32 x 8 threads reads a 32 x 32 tile of
 * x row by row (coalesced) into a padded __shared__ tile, waits for the whole block, and writes
 * the tile to out row by row (coalesced), reading the shared tile by columns. Matrices of any
 * shape: guard every global access.
 *
 * Check it:  python -m snippets exercise check part2.transpose.7
 * (--solution checks the reference solution; exercise show part2.transpose.7 gives the hint)
 */

#define TILE 32
#define ROWS 8  // a block is TILE x ROWS threads: each thread copies TILE / ROWS elements of the tile

// out (n x m) = transpose of x (m x n), both row-major. Grid: (ceil(n / TILE), ceil(m / TILE)).
extern "C" __global__ void transpose_tiled(const float* x, float* out, int m, int n) {
    __shared__ float tile[TILE][TILE + 1];  // + 1: column reads without bank conflicts
    // YOUR CODE HERE: read the TILE x TILE tile (blockIdx.y, blockIdx.x) of x row by row into `tile`, wait
    // for the whole block, then write it to tile (blockIdx.x, blockIdx.y) of out row by row, reading `tile`
    // by columns. Guard every global load and store.
}
