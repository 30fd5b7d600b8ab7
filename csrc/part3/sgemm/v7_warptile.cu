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

// --8<-- [start:kernel]
// 128x128 block tile, 8 warps of 64x32 (2 x 4), BK = 8, sAT rows padded to 132 floats (as in v6)
extern "C" __global__ void __launch_bounds__(256)
    sgemm_v7(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
             int M, int N, int K) {
    sgemm_warp</*BM=*/128, /*BN=*/128, /*BK=*/8, /*WM=*/64, /*WN=*/32, /*PAD=*/4,
               /*STAGES=*/1>(A, B, C, M, N, K);
}
// --8<-- [end:kernel]
