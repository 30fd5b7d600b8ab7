// SGEMM, C = A @ B, row-major fp32 A (M x K), B (K x N), C (M x N), plain IEEE fp32 FMAs. Step 7 of
// the ladder in docs/part3/sgemm.md, launched by snippets/part3/sgemm.py (CuPy/NVRTC).
//
// v7  like v6 with warp tiling: each warp owns a 64x32 sub-tile and each thread four 4x4 pieces of
//     it, so a warp's shared-memory reads cover a compact, conflict-free range
//
// Every load and store is bounds-checked, and the tiled versions fill the parts of a tile outside
// the matrices with zeros (which add nothing to a dot product), so any M, N, K >= 1 is correct.
// Sizes are 32-bit (the launcher checks them), offsets into the matrices are 64-bit (size_t): M * K
// may pass 2^31.
#include "warptile.cuh"

// This step's launch configuration, CONFIGS in snippets/part3/sgemm.py, which passes it as -D
// options: the block tile TILE_M x TILE_N, its step TILE_K along K and the THREADS per block. The
// defaults let this file compile alone.
#ifndef TILE_M
#define TILE_M 128
#define TILE_N 128
#define TILE_K 8
#define THREADS 256
#endif

// --8<-- [start:kernel]
// 128x128 block tile, 8 warps of 64x32 (2 x 4), BK = 8, sAT rows padded to 132 floats (as in v6)
extern "C" __global__ void __launch_bounds__(THREADS)
    sgemm_v7(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
             int M, int N, int K) {
    sgemm_warp<TILE_M, TILE_N, TILE_K, /*WM=*/64, /*WN=*/32, /*PAD=*/4, /*STAGES=*/1, THREADS>(
        A, B, C, M, N, K);
}
// --8<-- [end:kernel]
