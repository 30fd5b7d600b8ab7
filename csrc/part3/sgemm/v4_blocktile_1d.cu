// SGEMM, C = A @ B, row-major fp32 A (M x K), B (K x N), C (M x N), plain IEEE fp32 FMAs. Step 4 of
// the ladder in docs/part3/sgemm.md, launched by snippets/part3/sgemm.py (CuPy/NVRTC).
//
// v4  1-D register tiling: a 64x64 block tile, BK = 8, each thread computes TM = 8 results of
//     a column
//
// Every load and store is bounds-checked, and the tiled versions fill the parts of a tile outside
// the matrices with zeros (which add nothing to a dot product), so any M, N, K >= 1 is correct.
// Sizes are 32-bit (the launcher checks them), offsets into the matrices are 64-bit (size_t): M * K
// may pass 2^31.

// This step's launch configuration, CONFIGS in snippets/part3/sgemm.py, which passes it as -D
// options: the block tile TILE_M x TILE_N, its step TILE_K along K and the THREADS per block. The
// defaults let this file compile alone.
#ifndef TILE_M
#define TILE_M 64
#define TILE_N 64
#define TILE_K 8
#define THREADS 512
#endif

// --8<-- [start:kernel]
// v4: a BM x BN tile of C per block of BM * BN / TM threads (1-D block). Thread t owns column t %
// BN of the tile and the TM rows (t / BN) * TM .. + TM - 1: one value of B, read once from shared
// memory, is reused for TM FMAs, each with an A value that is a broadcast within the warp.
template <int BM, int BN, int BK, int TM>
__device__ __forceinline__ void sgemm_1d(const float* __restrict__ A, const float* __restrict__ B,
                                         float* __restrict__ C, int M, int N, int K) {
    constexpr int NT = BM * BN / TM;  // threads per block
    static_assert(BM * BK == NT && BK * BN == NT,
                  "one element of each of the A and B tiles per thread");
    __shared__ float sA[BM][BK];  // (BM, BK)
    __shared__ float sB[BK][BN];  // (BK, BN)
    const int tid = threadIdx.x;
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    // this thread's column and first row in the tile
    const int tcol = tid % BN, trow = (tid / BN) * TM;
    const int ar = tid / BK, ac = tid % BK;              // the A element this thread loads
    const int br = tid / BN, bc = tid % BN;              // the B element this thread loads
    float rC[TM] = {0.f};                                // (TM,) accumulators, in registers
    for (int k0 = 0; k0 < K; k0 += BK) {
        sA[ar][ac] = (row0 + ar < M && k0 + ac < K) ? A[(size_t)(row0 + ar) * K + k0 + ac] : 0.f;
        sB[br][bc] = (k0 + br < K && col0 + bc < N) ? B[(size_t)(k0 + br) * N + col0 + bc] : 0.f;
        __syncthreads();
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            const float b = sB[k][tcol];  // one shared load ...
#pragma unroll
            for (int i = 0; i < TM; ++i) rC[i] += sA[trow + i][k] * b;  // ... TM FMAs
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int r = row0 + trow + i, c = col0 + tcol;
        if (r < M && c < N) C[(size_t)r * N + c] = rC[i];
    }
}

extern "C" __global__ void __launch_bounds__(THREADS)
    sgemm_v4(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
             int M, int N, int K) {
    // 64 x 64 tile, BK = 8 and 512 threads from the launcher: TM = 8 results per thread
    sgemm_1d<TILE_M, TILE_N, TILE_K, /*TM=*/TILE_M * TILE_N / THREADS>(A, B, C, M, N, K);
}
// --8<-- [end:kernel]
