// SGEMM, C = A @ B, row-major fp32 A (M x K), B (K x N), C (M x N), plain IEEE fp32 FMAs. Step 2 of
// the ladder in docs/part3/sgemm.md, launched by snippets/part3/sgemm.py (CuPy/NVRTC).
//
// v2  like v1 with threadIdx.x along a row of C: loads of B and stores of C coalesced, A broadcast
//
// Every load and store is bounds-checked, and the tiled versions fill the parts of a tile outside
// the matrices with zeros (which add nothing to a dot product), so any M, N, K >= 1 is correct.
// Sizes are 32-bit (the launcher checks them), offsets into the matrices are 64-bit (size_t): M * K
// may pass 2^31.

// --8<-- [start:kernel]
// v2: the same arithmetic, with the thread mapping turned round: threadIdx.x runs along a row of C.
extern "C" __global__ void sgemm_v2(const float* __restrict__ A, const float* __restrict__ B,
                                    float* __restrict__ C, int M, int N, int K) {
    // consecutive threads: consecutive COLUMNS of C
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    const int row = blockIdx.y * blockDim.y + threadIdx.y;
    if (row < M && col < N) {
        float acc = 0.f;
        for (int k = 0; k < K; ++k) {
            // A[row][k]: one address (broadcast); B[k][col]: 32 consecutive floats (coalesced)
            acc += A[(size_t)row * K + k] * B[(size_t)k * N + col];
        }
        C[(size_t)row * N + col] = acc;  // 32 consecutive floats
    }
}
// --8<-- [end:kernel]
