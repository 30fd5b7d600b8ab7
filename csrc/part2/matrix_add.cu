// Matrix addition, out = x + y, for row-major fp32 matrices of m rows and n columns, with a 2-D
// grid. Loaded from Python by snippets/part2/matrix_add.py (CuPy/NVRTC), one launcher for
// both versions.
//
// matrix_add_v1  threadIdx.x along a row (columns): a warp reads 32 consecutive floats (coalesced)
// matrix_add_v2  the same kernel with the thread-to-element mapping swapped: threadIdx.x down a
//                column (rows), so a warp touches 32 different rows, 4 * ld bytes
//                apart (uncoalesced)
//
// Element (r, c) of a matrix with leading dimension ld lives at p[r * ld + c]: ld is the distance
// in elements between the starts of two consecutive rows. A contiguous matrix has ld = n; a column
// slice x[:, :n] of a wider matrix keeps the wider matrix's ld. Columns must be unit-stride (the
// launcher checks). m, n, the leading dimensions and every index are 64-bit: r * ld passes 2^31 in
// a matrix of 8 GiB.
//
// gridDim.y is at most 65535, so the y dimension of the grid is a grid-stride loop: a launch with
// fewer blocks in y than the rows (v1) or columns (v2) need covers the rest by looping. gridDim.x
// allows 2^31 - 1.

// --8<-- [start:coalesced]
extern "C" __global__ void matrix_add_v1(const float* __restrict__ x, const float* __restrict__ y,
                                         float* __restrict__ out, long long m, long long n,
                                         long long ldx, long long ldy, long long ldo) {
    // threadIdx.x runs along a row: consecutive threads, consecutive columns, consecutive addresses
    const long long col = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= n) return;  // the last column of blocks runs past the right edge unless 32 divides n
    const long long row_step = (long long)gridDim.y * blockDim.y;
    for (long long row = (long long)blockIdx.y * blockDim.y + threadIdx.y; row < m;
         row += row_step) {
        out[row * ldo + col] = x[row * ldx + col] + y[row * ldy + col];
    }
}
// --8<-- [end:coalesced]

// --8<-- [start:uncoalesced]
// Same arithmetic, same block shape; only which index threadIdx.x runs along has changed.
extern "C" __global__ void matrix_add_v2(const float* __restrict__ x, const float* __restrict__ y,
                                         float* __restrict__ out, long long m, long long n,
                                         long long ldx, long long ldy, long long ldo) {
    // threadIdx.x runs down a column: consecutive threads, consecutive rows, addresses ld
    // floats apart
    const long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= m) return;
    const long long col_step = (long long)gridDim.y * blockDim.y;
    for (long long col = (long long)blockIdx.y * blockDim.y + threadIdx.y; col < n;
         col += col_step) {
        out[row * ldo + col] = x[row * ldx + col] + y[row * ldy + col];
    }
}
// --8<-- [end:uncoalesced]

// --8<-- [start:vectorized]
// Like v1, but each thread adds 4 consecutive columns with 16-byte loads and stores, and a block is
// 64 x 4 threads: a warp covers 512 contiguous bytes of a row instead of 128. Requires n and every
// leading dimension to be multiples of 4 and the base pointers 16-byte aligned (checked by the
// caller, which otherwise runs v1).
extern "C" __global__ void matrix_add_v4(const float* __restrict__ x, const float* __restrict__ y,
                                         float* __restrict__ out, long long m, long long n,
                                         long long ldx, long long ldy, long long ldo) {
    const long long col = 4 * ((long long)blockIdx.x * blockDim.x + threadIdx.x);
    if (col >= n) return;
    const long long row_step = (long long)gridDim.y * blockDim.y;
    for (long long row = (long long)blockIdx.y * blockDim.y + threadIdx.y; row < m;
         row += row_step) {
        const float4 a = *reinterpret_cast<const float4*>(x + row * ldx + col);
        const float4 b = *reinterpret_cast<const float4*>(y + row * ldy + col);
        *reinterpret_cast<float4*>(out + row * ldo + col) = make_float4(a.x + b.x, a.y + b.y,
                                                                        a.z + b.z, a.w + b.w);
    }
}
// --8<-- [end:vectorized]
