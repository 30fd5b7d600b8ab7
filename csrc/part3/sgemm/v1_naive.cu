// SGEMM, C = A @ B, row-major fp32 A (M x K), B (K x N), C (M x N), plain IEEE fp32 FMAs. Step 1 of
// the ladder in docs/part3/sgemm.md, launched by snippets/part3/sgemm.py (CuPy/NVRTC).
//
// v1  naive: one thread per element of C, threadIdx.x runs down a column of C (along the rows):
//     the warp's loads of A are K floats apart and its stores of C are N floats apart
//
// Every load and store is bounds-checked, and the tiled versions fill the parts of a tile outside
// the matrices with zeros (which add nothing to a dot product), so any M, N, K >= 1 is correct.
// Sizes are 32-bit (the launcher checks them), offsets into the matrices are 64-bit (size_t): M * K
// may pass 2^31.

// --8<-- [start:kernel]
// v1: block (32, 32); blockIdx.x and threadIdx.x pick the row of C, blockIdx.y and threadIdx.y
// the column.
extern "C" __global__ void sgemm_v1(const float* __restrict__ A, const float* __restrict__ B,
                                    float* __restrict__ C, int M, int N, int K) {
    // consecutive threads: consecutive ROWS of C
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    const int col = blockIdx.y * blockDim.y + threadIdx.y;
    if (row < M && col < N) {
        float acc = 0.f;
        for (int k = 0; k < K; ++k) {
            // A[row][k]: 32 addresses K floats apart (32 sectors); B[k][col]: one
            // address (broadcast)
            acc += A[(size_t)row * K + k] * B[(size_t)k * N + col];
        }
        C[(size_t)row * N + col] = acc;  // 32 addresses N floats apart
    }
}
// --8<-- [end:kernel]
