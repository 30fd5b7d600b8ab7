// SGEMM, C = A @ B, for row-major fp32 A (M x K), B (K x N), C (M x N); plain IEEE fp32 FMAs (no tensor
// cores, no TF32). Loaded from Python by snippets/part3/sgemm.py (CuPy/NVRTC), one launcher for all versions.
//
// sgemm_v1  naive: one thread per element of C, threadIdx.x runs down a column of C (along the rows):
//           the warp's loads of A are K floats apart and its stores of C are N floats apart
// sgemm_v2  like v1 with threadIdx.x along a row of C: loads of B and stores of C coalesced, A broadcast
// sgemm_v3  32x32 tiles of A and B staged in shared memory: each global element is loaded once per tile
//           instead of once per thread that uses it
// sgemm_v4  1-D register tiling: a 64x64 block tile, BK = 8, each thread computes TM = 8 results of a column
// sgemm_v5  2-D register tiling: a 128x128 block tile, BK = 8, each thread computes an 8x8 sub-tile
// sgemm_v6  like v5 with 16-byte float4 global loads, the A tile stored transposed (and padded) in shared
//           memory, and float4 shared-memory reads of both fragments
// sgemm_v7  like v6 with warp tiling: each warp owns a 64x32 sub-tile and each thread four 4x4 pieces of it,
//           so a warp's shared-memory reads cover a compact, conflict-free range
// sgemm_v8  like v7 with double buffering: the next tile is fetched from global into registers while the
//           current one is multiplied out of the other shared-memory buffer; one barrier per tile
//
// Every load and store is bounds-checked, and the tiled versions fill the parts of a tile outside the
// matrices with zeros (which add nothing to a dot product), so any M, N, K >= 1 is correct. The float4 paths
// need a row length that is a multiple of 4 and a 16-byte-aligned base; otherwise (and for the last, partial
// float4 of a row) the same kernel falls back to guarded scalar accesses. Sizes are 32-bit (the launcher checks
// them), offsets into the matrices are 64-bit (size_t): M * K may pass 2^31.

// --8<-- [start:naive]
// v1: block (32, 32); blockIdx.x and threadIdx.x pick the row of C, blockIdx.y and threadIdx.y the column.
extern "C" __global__ void sgemm_v1(const float* __restrict__ A, const float* __restrict__ B,
                                    float* __restrict__ C, int M, int N, int K) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;  // consecutive threads: consecutive ROWS of C
    const int col = blockIdx.y * blockDim.y + threadIdx.y;
    if (row < M && col < N) {
        float acc = 0.f;
        for (int k = 0; k < K; ++k) {
            // A[row][k]: 32 addresses K floats apart (32 sectors); B[k][col]: one address (broadcast)
            acc += A[(size_t)row * K + k] * B[(size_t)k * N + col];
        }
        C[(size_t)row * N + col] = acc;  // 32 addresses N floats apart
    }
}
// --8<-- [end:naive]

// --8<-- [start:coalesced]
// v2: the same arithmetic, with the thread mapping turned round: threadIdx.x runs along a row of C.
extern "C" __global__ void sgemm_v2(const float* __restrict__ A, const float* __restrict__ B,
                                    float* __restrict__ C, int M, int N, int K) {
    const int col = blockIdx.x * blockDim.x + threadIdx.x;  // consecutive threads: consecutive COLUMNS of C
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
// --8<-- [end:coalesced]

// --8<-- [start:smem]
// v3: block (32, 32) computes a 32x32 tile of C, walking K in steps of 32. Each step, every thread loads one
// element of A's tile and one of B's (both coalesced), the block waits, and every thread does 32 FMAs out of
// shared memory. Threads outside the matrices still load (zeros) and reach both barriers.
constexpr int S3 = 32;

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
// --8<-- [end:smem]

// --8<-- [start:blocktile_1d]
// v4: a BM x BN tile of C per block of BM * BN / TM threads (1-D block). Thread t owns column t % BN of the
// tile and the TM rows (t / BN) * TM .. + TM - 1: one value of B, read once from shared memory, is reused
// for TM FMAs, each with an A value that is a broadcast within the warp.
template <int BM, int BN, int BK, int TM>
__device__ __forceinline__ void sgemm_1d(const float* __restrict__ A, const float* __restrict__ B,
                                         float* __restrict__ C, int M, int N, int K) {
    constexpr int NT = BM * BN / TM;  // threads per block
    static_assert(BM * BK == NT && BK * BN == NT, "one element of each of the A and B tiles per thread");
    __shared__ float sA[BM][BK];  // (BM, BK)
    __shared__ float sB[BK][BN];  // (BK, BN)
    const int tid = threadIdx.x;
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    const int tcol = tid % BN, trow = (tid / BN) * TM;  // this thread's column and first row in the tile
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

extern "C" __global__ void __launch_bounds__(512) sgemm_v4(const float* __restrict__ A,
                                                           const float* __restrict__ B,
                                                           float* __restrict__ C, int M, int N, int K) {
    sgemm_1d</*BM=*/64, /*BN=*/64, /*BK=*/8, /*TM=*/8>(A, B, C, M, N, K);  // 512 threads
}
// --8<-- [end:blocktile_1d]

// --8<-- [start:blocktile_2d]
// v5: a BM x BN tile of C per block of (BM / TM) * (BN / TN) threads; thread (tr, tc) owns the TM x TN
// sub-tile at rows tr * TM.., columns tc * TN... Per k it reads TM values of A and TN of B from shared memory
// into registers and does TM * TN FMAs with them: (TM * TN) / (TM + TN) FMAs per shared load.
template <int BM, int BN, int BK, int TM, int TN>
__device__ __forceinline__ void sgemm_2d(const float* __restrict__ A, const float* __restrict__ B,
                                         float* __restrict__ C, int M, int N, int K) {
    constexpr int NT = (BM / TM) * (BN / TN);
    static_assert((BM * BK) % NT == 0 && (BK * BN) % NT == 0, "whole loads per thread");
    __shared__ float sA[BM][BK];  // (BM, BK)
    __shared__ float sB[BK][BN];  // (BK, BN)
    const int tid = threadIdx.x;
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    const int tr = (tid / (BN / TN)) * TM, tc = (tid % (BN / TN)) * TN;  // this thread's sub-tile in the tile
    float rC[TM][TN] = {{0.f}};  // (TM, TN) accumulators
    float rA[TM], rB[TN];        // (TM,), (TN,) fragments of A and B for one k
    for (int k0 = 0; k0 < K; k0 += BK) {
#pragma unroll
        for (int i = 0; i < BM * BK / NT; ++i) {  // consecutive threads: consecutive elements of a row
            const int idx = tid + i * NT, r = idx / BK, c = idx % BK;
            sA[r][c] = (row0 + r < M && k0 + c < K) ? A[(size_t)(row0 + r) * K + k0 + c] : 0.f;
        }
#pragma unroll
        for (int i = 0; i < BK * BN / NT; ++i) {
            const int idx = tid + i * NT, r = idx / BN, c = idx % BN;
            sB[r][c] = (k0 + r < K && col0 + c < N) ? B[(size_t)(k0 + r) * N + col0 + c] : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < BK; ++k) {
#pragma unroll
            for (int i = 0; i < TM; ++i) rA[i] = sA[tr + i][k];
#pragma unroll
            for (int j = 0; j < TN; ++j) rB[j] = sB[k][tc + j];
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) rC[i][j] += rA[i] * rB[j];  // outer product of the fragments
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int r = row0 + tr + i, c = col0 + tc + j;
            if (r < M && c < N) C[(size_t)r * N + c] = rC[i][j];
        }
}

extern "C" __global__ void __launch_bounds__(256) sgemm_v5(const float* __restrict__ A,
                                                           const float* __restrict__ B,
                                                           float* __restrict__ C, int M, int N, int K) {
    sgemm_2d</*BM=*/128, /*BN=*/128, /*BK=*/8, /*TM=*/8, /*TN=*/8>(A, B, C, M, N, K);  // 256 threads
}
// --8<-- [end:blocktile_2d]

// --8<-- [start:vec_helpers]
// Four consecutive floats of row r of a rows x cols row-major matrix p, starting at column c (a multiple of 4
// on the vector path), with zeros outside the matrix. vec: cols % 4 == 0 and p is 16-byte aligned, so the
// float4 is either wholly inside the row or wholly outside it.
__device__ __forceinline__ float4 load4(const float* __restrict__ p, int r, int c, int rows, int cols, bool vec) {
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (r >= rows) return v;
    const float* q = p + (size_t)r * cols + c;
    if (vec) {
        if (c < cols) v = *reinterpret_cast<const float4*>(q);  // one 16-byte load
    } else {                                                       // guarded scalar fallback
        if (c + 0 < cols) v.x = q[0];
        if (c + 1 < cols) v.y = q[1];
        if (c + 2 < cols) v.z = q[2];
        if (c + 3 < cols) v.w = q[3];
    }
    return v;
}

__device__ __forceinline__ void store4(float* __restrict__ p, int r, int c, int rows, int cols, bool vec,
                                       float4 v) {
    if (r >= rows) return;
    float* q = p + (size_t)r * cols + c;
    if (vec) {
        if (c < cols) *reinterpret_cast<float4*>(q) = v;
    } else {
        if (c + 0 < cols) q[0] = v.x;
        if (c + 1 < cols) q[1] = v.y;
        if (c + 2 < cols) q[2] = v.z;
        if (c + 3 < cols) q[3] = v.w;
    }
}

// Four floats from 16-byte-aligned shared memory into four registers, with one 16-byte shared load.
__device__ __forceinline__ void lds4(float* dst, const float* src) {
    const float4 v = *reinterpret_cast<const float4*>(src);
    dst[0] = v.x, dst[1] = v.y, dst[2] = v.z, dst[3] = v.w;
}

__device__ __forceinline__ bool vec_ok(const void* p, int cols) {
    return cols % 4 == 0 && (reinterpret_cast<size_t>(p) & 15) == 0;
}

// Global -> registers for one BK step: the (BM, BK) tile of A and the (BK, BN) tile of B as float4s.
template <int BM, int BN, int BK, int NT>
struct TileLoader {
    static constexpr int A4 = BM * BK / 4 / NT, B4 = BK * BN / 4 / NT;  // float4s per thread
    static_assert(BK % 4 == 0 && BN % 4 == 0, "float4s along the rows of both tiles");
    static_assert(A4 * 4 * NT == BM * BK && B4 * 4 * NT == BK * BN, "whole float4s per thread");
    float4 rA[A4], rB[B4];  // (A4,), (B4,) staged float4s

    __device__ __forceinline__ void load(const float* __restrict__ A, const float* __restrict__ B, int M, int N,
                                         int K, int row0, int col0, int k0, bool vecA, bool vecB, int tid) {
#pragma unroll
        for (int i = 0; i < A4; ++i) {  // a row of the A tile is BK / 4 float4s
            const int idx = tid + i * NT, r = idx / (BK / 4), c = (idx % (BK / 4)) * 4;
            rA[i] = load4(A, row0 + r, k0 + c, M, K, vecA);
        }
#pragma unroll
        for (int i = 0; i < B4; ++i) {  // a warp reads 32 consecutive float4s of a row of B: 512 bytes
            const int idx = tid + i * NT, r = idx / (BN / 4), c = (idx % (BN / 4)) * 4;
            rB[i] = load4(B, k0 + r, col0 + c, K, N, vecB);
        }
    }
    // Registers -> shared: A transposed into sAT[BK][BM + PAD] (so that a column of A, which the inner loop
    // reads, is contiguous), B as it is into sB[BK][BN].
    template <int LDA>
    __device__ __forceinline__ void store(float (*sAT)[LDA], float (*sB)[BN], int tid) const {
#pragma unroll
        for (int i = 0; i < A4; ++i) {
            const int idx = tid + i * NT, r = idx / (BK / 4), c = (idx % (BK / 4)) * 4;
            sAT[c + 0][r] = rA[i].x;
            sAT[c + 1][r] = rA[i].y;
            sAT[c + 2][r] = rA[i].z;
            sAT[c + 3][r] = rA[i].w;
        }
#pragma unroll
        for (int i = 0; i < B4; ++i) {
            const int idx = tid + i * NT, r = idx / (BN / 4), c = (idx % (BN / 4)) * 4;
            *reinterpret_cast<float4*>(&sB[r][c]) = rB[i];
        }
    }
};
// --8<-- [end:vec_helpers]

// --8<-- [start:vectorized]
// v6: v5's tiling (BM = BN = 128, BK = 8, 8x8 per thread, 256 threads) with float4 everywhere it fits.
// PAD = 4: rows of sAT are BM + 4 floats. With BK = 8 a warp's transposed stores hit sAT[c + j][r] for
// r = 0..15 and c in {0, 4}: without padding, rows 128 words apart start in the same bank, and c = 0 and
// c = 4 collide (2-way); 132 = 4 (mod 32) shifts row c + j by 4(c + j) banks, so the two halves land on banks
// 0..15 and 16..31. 132 floats keep each row 16-byte aligned for the float4 reads.
template <int BM, int BN, int BK, int TM, int TN, int PAD>
__device__ __forceinline__ void sgemm_vec(const float* __restrict__ A, const float* __restrict__ B,
                                          float* __restrict__ C, int M, int N, int K) {
    constexpr int NT = (BM / TM) * (BN / TN);
    static_assert(TM % 4 == 0 && TN % 4 == 0 && PAD % 4 == 0, "float4 fragments and 16-byte-aligned rows");
    __shared__ __align__(16) float sAT[BK][BM + PAD];  // (BK, BM + PAD): A tile, transposed
    __shared__ __align__(16) float sB[BK][BN];         // (BK, BN)
    const int tid = threadIdx.x;
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    const int tr = (tid / (BN / TN)) * TM, tc = (tid % (BN / TN)) * TN;
    const bool vecA = vec_ok(A, K), vecB = vec_ok(B, N), vecC = vec_ok(C, N);
    TileLoader<BM, BN, BK, NT> ld;
    float rC[TM][TN] = {{0.f}};  // (TM, TN)
    float rA[TM], rB[TN];
    for (int k0 = 0; k0 < K; k0 += BK) {
        ld.load(A, B, M, N, K, row0, col0, k0, vecA, vecB, tid);
        ld.store(sAT, sB, tid);
        __syncthreads();
#pragma unroll
        for (int k = 0; k < BK; ++k) {
#pragma unroll
            for (int i = 0; i < TM; i += 4) lds4(&rA[i], &sAT[k][tr + i]);
#pragma unroll
            for (int j = 0; j < TN; j += 4) lds4(&rB[j], &sB[k][tc + j]);
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) rC[i][j] += rA[i] * rB[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; j += 4)
            store4(C, row0 + tr + i, col0 + tc + j, M, N, vecC,
                   make_float4(rC[i][j], rC[i][j + 1], rC[i][j + 2], rC[i][j + 3]));
}

extern "C" __global__ void __launch_bounds__(256) sgemm_v6(const float* __restrict__ A,
                                                           const float* __restrict__ B,
                                                           float* __restrict__ C, int M, int N, int K) {
    sgemm_vec</*BM=*/128, /*BN=*/128, /*BK=*/8, /*TM=*/8, /*TN=*/8, /*PAD=*/4>(A, B, C, M, N, K);
}
// --8<-- [end:vectorized]

// --8<-- [start:warptile]
// v7 and v8: the block tile is split among warps, WARPS_M x WARPS_N warp tiles of WM x WN. Inside a warp
// tile the 32 lanes form an 8 x 4 grid (LANES_M x LANES_N); lane (lm, ln) owns the 4x4 pieces at rows
// im * (WM / 2) + lm * 4 and columns jn * (WN / 2) + ln * 4, for im, jn in {0, 1}: 8x8 results in all.
// Per k, a warp's A reads are 8 distinct consecutive float4s (128 bytes) and its B reads 4 (64 bytes): no
// bank conflicts, every other lane's read is a broadcast. STAGES = 2 double-buffers the shared tiles: the
// next tile's global loads are issued before the current tile's FMAs and land in the other buffer after.
template <int BM, int BN, int BK, int WM, int WN, int PAD, int STAGES>
__device__ __forceinline__ void sgemm_warp(const float* __restrict__ A, const float* __restrict__ B,
                                           float* __restrict__ C, int M, int N, int K) {
    constexpr int LANES_M = 8, LANES_N = 4;                  // 32 lanes
    constexpr int TM = 2 * 4, TN = 2 * 4;                    // two 4-wide pieces in each direction
    static_assert(WM == 2 * 4 * LANES_M && WN == 2 * 4 * LANES_N, "warp tile = 2x2 pieces of 4x4 per lane");
    static_assert(BM % WM == 0 && BN % WN == 0, "whole warp tiles in a block tile");
    static_assert(STAGES == 1 || STAGES == 2, "single or double buffering");
    constexpr int WARPS_N = BN / WN, NT = (BM / WM) * WARPS_N * 32;
    __shared__ __align__(16) float sAT[STAGES][BK][BM + PAD];  // (STAGES, BK, BM + PAD)
    __shared__ __align__(16) float sB[STAGES][BK][BN];         // (STAGES, BK, BN)
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    const int wm0 = (warp / WARPS_N) * WM, wn0 = (warp % WARPS_N) * WN;  // this warp's tile in the block tile
    const int lm = lane / LANES_N, ln = lane % LANES_N;
    const bool vecA = vec_ok(A, K), vecB = vec_ok(B, N), vecC = vec_ok(C, N);
    TileLoader<BM, BN, BK, NT> ld;
    float rC[TM][TN] = {{0.f}};  // (TM, TN): rows {0..3, WM/2 .. WM/2+3} + lm*4, same for columns
    float rA[TM], rB[TN];
    const int tiles = (K + BK - 1) / BK;

    ld.load(A, B, M, N, K, row0, col0, 0, vecA, vecB, tid);
    ld.store(sAT[0], sB[0], tid);
    __syncthreads();
    for (int t = 0; t < tiles; ++t) {
        const int cur = STAGES == 2 ? t % 2 : 0;  // the buffer holding tile t
        if constexpr (STAGES == 2) if (t + 1 < tiles)  // fetch tile t + 1 into registers; it arrives during the FMAs
            ld.load(A, B, M, N, K, row0, col0, (t + 1) * BK, vecA, vecB, tid);
#pragma unroll
        for (int k = 0; k < BK; ++k) {
#pragma unroll
            for (int im = 0; im < 2; ++im) lds4(&rA[im * 4], &sAT[cur][k][wm0 + im * (WM / 2) + lm * 4]);
#pragma unroll
            for (int jn = 0; jn < 2; ++jn) lds4(&rB[jn * 4], &sB[cur][k][wn0 + jn * (WN / 2) + ln * 4]);
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) rC[i][j] += rA[i] * rB[j];
        }
        if (t + 1 < tiles) {
            if constexpr (STAGES == 2) {
                // buffer cur ^ 1 was last read in step t - 1, which every thread finished before the
                // barrier that ended it: safe to overwrite without another barrier
                ld.store(sAT[cur ^ 1], sB[cur ^ 1], tid);
            } else {
                __syncthreads();  // everyone is done reading the single buffer
                ld.load(A, B, M, N, K, row0, col0, (t + 1) * BK, vecA, vecB, tid);
                ld.store(sAT[0], sB[0], tid);
            }
            __syncthreads();  // the next tile is complete before anyone reads it
        }
    }
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int r = row0 + wm0 + (i / 4) * (WM / 2) + lm * 4 + i % 4;
#pragma unroll
        for (int jn = 0; jn < 2; ++jn) {
            const int j = jn * 4;
            store4(C, r, col0 + wn0 + jn * (WN / 2) + ln * 4, M, N, vecC,
                   make_float4(rC[i][j], rC[i][j + 1], rC[i][j + 2], rC[i][j + 3]));
        }
    }
}

// 128x128 block tile, 8 warps of 64x32 (2 x 4), BK = 8, sAT rows padded to 132 floats (as in v6)
extern "C" __global__ void __launch_bounds__(256) sgemm_v7(const float* __restrict__ A,
                                                           const float* __restrict__ B,
                                                           float* __restrict__ C, int M, int N, int K) {
    sgemm_warp</*BM=*/128, /*BN=*/128, /*BK=*/8, /*WM=*/64, /*WN=*/32, /*PAD=*/4, /*STAGES=*/1>(A, B, C, M, N, K);
}
// --8<-- [end:warptile]

// --8<-- [start:double_buffer]
// v8: v7's tiling with two shared-memory buffers (2 x 8.3 KB).
extern "C" __global__ void __launch_bounds__(256) sgemm_v8(const float* __restrict__ A,
                                                           const float* __restrict__ B,
                                                           float* __restrict__ C, int M, int N, int K) {
    sgemm_warp</*BM=*/128, /*BN=*/128, /*BK=*/8, /*WM=*/64, /*WN=*/32, /*PAD=*/4, /*STAGES=*/2>(A, B, C, M, N, K);
}
// --8<-- [end:double_buffer]
