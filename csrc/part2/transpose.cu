// Matrix transpose, out = x^T, for a contiguous row-major fp32 matrix x of m rows and n columns;
// out is contiguous, n x m. Loaded from Python by snippets/part2/transpose.py (CuPy/NVRTC), one
// launcher for all.
//
// transpose_v1  one thread per element; a warp reads 32 consecutive floats of a row of x
//               (coalesced) and writes them down a column of out, 4*m bytes apart (strided)
// transpose_v2  like v1 with the mapping swapped: writes coalesced, reads strided
// transpose_v3  a 32x32 tile goes through shared memory: read coalesced, __syncthreads, write
//               coalesced; the column read of the [32][32] tile is a 32-way bank conflict
// transpose_v4  like v3, tile rows padded to 33 floats: the column read spreads over all 32 banks
// transpose_v5  like v3, no padding but an XOR swizzle (column c of row r stored at c ^ r):
//               no conflicts
// transpose_v6  like v4, 32x8 threads per 32x32 tile: each thread moves 4 elements
// transpose_v7  like v6, but 16-byte float4 global loads and stores, 8x8 threads per tile, 16
//               elements each; needs m and n multiples of 4 and a 16-byte-aligned x (the
//               launcher checks)
//
// Grid: one-dimensional, one block per tile; block b owns tile row b / tiles_n and tile column b %
// tiles_n. A 2-D grid would cap the number of tile rows at gridDim.y <= 65535; a 1-D grid allows
// 2^31 - 1 tiles. Every kernel checks bounds element by element, so any m, n >= 1 is correct
// (partial tiles at the edges). m, n and every row or column index are 64-bit: a dimension may come
// close to 2^31, and m * n can exceed it. Only the tile counts are 32-bit (there are fewer tiles
// than 2^31 blocks), so the division blockIdx.x / tiles_n that locates a thread's tile is a
// 32-bit one.

// The blocks of v1 and v2, BLOCK_X_Vn x BLOCK_Y_Vn threads: the launcher's numbers, which
// snippets/part2/transpose.py passes as -D options (the defaults let this file compile alone).
#ifndef BLOCK_X_V1
#define BLOCK_X_V1 32
#define BLOCK_Y_V1 8
#define BLOCK_X_V2 32
#define BLOCK_Y_V2 8
#endif

// --8<-- [start:naive]
// v1: a block of BLOCK_X_V1 x BLOCK_Y_V1 threads (32 x 8) covers BLOCK_Y_V1 rows and BLOCK_X_V1
// columns of x; threadIdx.x runs along a row of x.
extern "C" __global__ void transpose_v1(const float* __restrict__ x, float* __restrict__ out,
                                        long long m, long long n) {
    const unsigned tiles_n = (n + BLOCK_X_V1 - 1) / BLOCK_X_V1;
    // consecutive threads: consecutive columns of x
    const long long col = (long long)(blockIdx.x % tiles_n) * BLOCK_X_V1 + threadIdx.x;
    const long long row = (long long)(blockIdx.x / tiles_n) * BLOCK_Y_V1 + threadIdx.y;
    if (row < m && col < n) {
        // read x[row][col]: the warp's 32 addresses are consecutive (one 128-byte line)
        // write out[col][row]: the warp's 32 addresses are m floats apart (32 different lines)
        out[col * m + row] = x[row * n + col];
    }
}

// v2: like v1 with the roles of the two indices swapped: a block covers BLOCK_X_V2 rows and
// BLOCK_Y_V2 columns of x, and threadIdx.x runs down a column of x, which is along a row of out.
extern "C" __global__ void transpose_v2(const float* __restrict__ x, float* __restrict__ out,
                                        long long m, long long n) {
    const unsigned tiles_m = (m + BLOCK_X_V2 - 1) / BLOCK_X_V2;
    // consecutive threads: consecutive rows of x
    const long long row = (long long)(blockIdx.x % tiles_m) * BLOCK_X_V2 + threadIdx.x;
    const long long col = (long long)(blockIdx.x / tiles_m) * BLOCK_Y_V2 + threadIdx.y;
    if (row < m && col < n) {
        // read x[row][col]: n floats apart (strided); write out[col][row]: consecutive (coalesced)
        out[col * m + row] = x[row * n + col];
    }
}
// --8<-- [end:naive]

// --8<-- [start:tiled]
// one warp spans a tile row: 32 floats = 128 bytes = one pass over the 32 banks. TILE, like each
// version's ROWS below, is the launcher's number (snippets/part2/transpose.py passes it as a -D
// option); the default lets this file compile alone.
#ifndef TILE
#define TILE 32
#endif

// One TILE x TILE tile per block of TILE x ROWS threads: each thread moves TILE / ROWS elements.
// The tile goes through shared memory with rows of TILE + PAD floats; SWIZZLE stores column c of
// row r at column c ^ r instead (XOR with a row index below 32 permutes the 32 columns of
// that row).
template <int ROWS, int PAD, bool SWIZZLE>
__device__ __forceinline__ void transpose_tiled(const float* __restrict__ x,
                                                float* __restrict__ out, long long m, long long n) {
    static_assert(TILE % ROWS == 0,
                  "each thread moves TILE / ROWS elements: ROWS must divide TILE");
    static_assert(!(SWIZZLE && PAD), "the swizzle replaces the padding; use one or the other");
    static_assert(!SWIZZLE || TILE == 32,
                  "c ^ r permutes a row's columns onto the 32 banks only for 32-wide rows");
    __shared__ float sT[TILE][TILE + PAD];  // (TILE, TILE + PAD)

    const unsigned tiles_n = (n + TILE - 1) / TILE;
    // this tile: rows r0 .. r0 + TILE - 1 and columns c0 .. c0 + TILE - 1 of x
    const long long r0 = (long long)(blockIdx.x / tiles_n) * TILE;
    const long long c0 = (long long)(blockIdx.x % tiles_n) * TILE;
    const float* gX = x + r0 * n + c0;  // (TILE, TILE) tile of x, row stride n
    float* gOut = out + c0 * m + r0;    // (TILE, TILE) tile of out, row stride m
    const int tx = threadIdx.x, ty = threadIdx.y;
    // where column c of row r is stored
    auto col = [](int r, int c) { return SWIZZLE ? (c ^ r) : c; };

    // 1. global -> shared. Warp ty reads row i of the tile: 32 consecutive floats of x (coalesced),
    //    and writes row i of sT: 32 consecutive words, 32 different banks.
#pragma unroll
    for (int k = 0; k < TILE / ROWS; ++k) {
        const int i = ty + k * ROWS;
        if (r0 + i < m && c0 + tx < n) sT[i][col(i, tx)] = gX[i * n + tx];
    }
    // every element of the tile is in sT before any thread reads another thread's element
    __syncthreads();
    // 2. shared -> global. Row i of the out tile is column i of sT: warp ty reads sT[0..31][i] and
    //    writes 32 consecutive floats of out (coalesced). The column read is where the bank
    //    conflicts are.
#pragma unroll
    for (int k = 0; k < TILE / ROWS; ++k) {
        const int i = ty + k * ROWS;
        if (c0 + i < n && r0 + tx < m) gOut[i * m + tx] = sT[tx][col(tx, i)];
    }
}
// --8<-- [end:tiled]

// --8<-- [start:tiled_versions]
// Version n's block is TILE x ROWS_Vn threads: ROWS_Vn is the threads along y of its launch
// config, which the launcher passes as a -D option.
#ifndef ROWS_V3
#define ROWS_V3 32
#define ROWS_V4 32
#define ROWS_V5 32
#define ROWS_V6 8
#define ROWS_V7 8
#endif
extern "C" __global__ void transpose_v3(const float* __restrict__ x, float* __restrict__ out,
                                        long long m, long long n) {
    // sT[32][32]
    transpose_tiled<ROWS_V3, /*PAD=*/0, /*SWIZZLE=*/false>(x, out, m, n);
}
extern "C" __global__ void transpose_v4(const float* __restrict__ x, float* __restrict__ out,
                                        long long m, long long n) {
    // sT[32][33]
    transpose_tiled<ROWS_V4, /*PAD=*/1, /*SWIZZLE=*/false>(x, out, m, n);
}
extern "C" __global__ void transpose_v5(const float* __restrict__ x, float* __restrict__ out,
                                        long long m, long long n) {
    // sT[32][32], swizzled
    transpose_tiled<ROWS_V5, /*PAD=*/0, /*SWIZZLE=*/true>(x, out, m, n);
}
extern "C" __global__ void transpose_v6(const float* __restrict__ x, float* __restrict__ out,
                                        long long m, long long n) {
    // 4 elements per thread
    transpose_tiled<ROWS_V6, /*PAD=*/1, /*SWIZZLE=*/false>(x, out, m, n);
}
// --8<-- [end:tiled_versions]

// --8<-- [start:vec4]
// v7: a 32 x 32 tile per block of TILE / 4 x VROWS threads (8 x 8); every global access is a
// 16-byte float4.
// Thread (tx, ty) loads 4 consecutive floats of a row of x (columns 4tx .. 4tx+3), and later stores
// 4 consecutive floats of a row of out, which come from 4 consecutive rows of sT (rows 4tx ..
// 4tx+3). A warp is 4 rows of 8 threads, so each warp instruction touches 4 full 128-byte rows.
// Shared memory stays scalar with rows of 33 floats: 33 = 1 (mod 32) puts word (r, c) in bank
// (r + c) % 32.
//   store sT[r][4tx + j]: r takes 4 consecutive values and 4tx the 8 multiples of 4: 32 different
//                         banks;
//   load  sT[4tx + j][c]: the same sum with the roles swapped: 32 different banks.
// Requires: n % 4 == 0 and m % 4 == 0 (so every row of x and of out starts on a 16-byte boundary)
// and x, out 16-byte aligned. A float4 is then either wholly inside the matrix or wholly
// outside it.
// 8 x 8 = 64 threads by default; each moves TILE / VROWS = 4 float4s, 16 elements
constexpr int VROWS = ROWS_V7;

extern "C" __global__ void transpose_v7(const float* __restrict__ x, float* __restrict__ out,
                                        long long m, long long n) {
    static_assert(TILE == 32,
                  "8 threads x 4 floats span one tile row; the bank argument needs 32-wide rows");
    static_assert(TILE % VROWS == 0 && VROWS % 4 == 0,
        "each warp must cover 4 whole tile rows (32 threads / 8 per row) for the bank argument");
    __shared__ float sT[TILE][TILE + 1];  // (TILE, TILE + 1)

    const unsigned tiles_n = (n + TILE - 1) / TILE;
    const long long r0 = (long long)(blockIdx.x / tiles_n) * TILE;
    const long long c0 = (long long)(blockIdx.x % tiles_n) * TILE;
    const float* gX = x + r0 * n + c0;  // (TILE, TILE) tile of x, row stride n
    float* gOut = out + c0 * m + r0;    // (TILE, TILE) tile of out, row stride m
    const int tx = threadIdx.x, ty = threadIdx.y;  // tx: which float4 of a tile row; ty: which row

    float4 rX[TILE / VROWS];  // (TILE / VROWS) float4s: all loads are issued before any is used
#pragma unroll
    for (int k = 0; k < TILE / VROWS; ++k) {
        const int i = ty + k * VROWS;
        // outside the matrix: a defined value, never stored
        rX[k] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r0 + i < m && c0 + 4 * tx < n)
            rX[k] = *reinterpret_cast<const float4*>(gX + i * n + 4 * tx);
    }
#pragma unroll
    for (int k = 0; k < TILE / VROWS; ++k) {
        const int i = ty + k * VROWS;
        // unguarded: the zeros of a float4 outside the matrix land in sT, and the store below skips
        // exactly the elements that came from outside
        sT[i][4 * tx + 0] = rX[k].x;
        sT[i][4 * tx + 1] = rX[k].y;
        sT[i][4 * tx + 2] = rX[k].z;
        sT[i][4 * tx + 3] = rX[k].w;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < TILE / VROWS; ++k) {
        const int i = ty + k * VROWS;  // row i of the out tile = column i of sT
        if (c0 + i < n && r0 + 4 * tx < m) {
            const float4 v = make_float4(sT[4 * tx + 0][i], sT[4 * tx + 1][i], sT[4 * tx + 2][i],
                                         sT[4 * tx + 3][i]);
            *reinterpret_cast<float4*>(gOut + i * m + 4 * tx) = v;
        }
    }
}
// --8<-- [end:vec4]
