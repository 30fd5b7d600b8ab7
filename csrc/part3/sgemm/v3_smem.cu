// SGEMM, C = A @ B, row-major fp32 A (M x K), B (K x N), C (M x N), plain IEEE fp32 FMAs. Step 3 of
// the ladder in docs/part3/sgemm.md, launched by snippets/part3/sgemm.py (CuPy/NVRTC).
//
// v3  32x32 tiles of A and B staged in shared memory: each global element is loaded once per tile
//     instead of once per thread that uses it
//
// Every load and store is bounds-checked, and the tiled versions fill the parts of a tile outside
// the matrices with zeros (which add nothing to a dot product), so any M, N, K >= 1 is correct.
// Sizes are 32-bit (the launcher checks them), offsets into the matrices are 64-bit (size_t): M * K
// may pass 2^31.

// This step's launch configuration, CONFIGS in snippets/part3/sgemm.py, which passes it as -D
// options: the block tile TILE_M x TILE_N, its step TILE_K along K and the THREADS per block. The
// defaults let this file compile alone.
#ifndef TILE_M
#define TILE_M 32
#define TILE_N 32
#define TILE_K 32
#define THREADS 1024
#endif

// --8<-- [start:kernel]
// v3: block (32, 32) computes a 32x32 tile of C, walking K in steps of 32. Each step, every thread
// loads one element of A's tile and one of B's (both coalesced), the block waits, and every thread
// does 32 FMAs out of shared memory. Threads outside the matrices still load (zeros) and reach
// both barriers.
constexpr int S3 = TILE_K;  // a square tile and block: TILE_M = TILE_N = TILE_K, THREADS = S3 * S3
static_assert(TILE_M == S3 && TILE_N == S3 && THREADS == S3 * S3, "one element per thread");

extern "C" __global__ void sgemm_v3(const float* __restrict__ A, const float* __restrict__ B,
                                    float* __restrict__ C, int M, int N, int K) {
    __shared__ float sA[S3][S3];  // (BM, BK) tile of A
    __shared__ float sB[S3][S3];  // (BK, BN) tile of B
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row = blockIdx.y * S3 + ty, col = blockIdx.x * S3 + tx;
    float acc = 0.f;
    for (int k0 = 0; k0 < K; k0 += S3) {
        sA[ty][tx] = (row < M && k0 + tx < K) ? A[(size_t)row * K + k0 + tx] : 0.f;  // zero padding
        sB[ty][tx] = (k0 + ty < K && col < N) ? B[(size_t)(k0 + ty) * N + col] : 0.f;
        __syncthreads();  // the whole tile is in shared memory before anyone reads it
#pragma unroll
        for (int k = 0; k < S3; ++k) acc += sA[ty][k] * sB[k][tx];  // sA: broadcast; sB: 32 banks
        __syncthreads();  // everyone is done with the tile before the next step overwrites it
    }
    if (row < M && col < N) C[(size_t)row * N + col] = acc;
}
// --8<-- [end:kernel]
