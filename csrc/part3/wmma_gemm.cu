// Tensor-core GEMM through the WMMA API (nvcuda::wmma): C = A @ B for row-major A (M x K), B (K x
// N) and C (M x N), products on the tensor cores, sums in fp32, C rounded to the input type once at
// the end. Loaded from Python by snippets/part3/wmma.py (CuPy/NVRTC), one launcher for all
// versions. Every kernel exists once per input type: _f16 (__half), _bf16 (__nv_bfloat16) and _tf32
// (float inputs and output, multiplied as TF32).
//
// wmma_v1_*   naive: one warp per 16x16 tile of C, fragments loaded straight from global memory. M,
//             N and K must be multiples of 16 (no bounds checks: a fragment load cannot be partial)
// wmma_v2_*   a block of 8 warps computes a 128x128 tile of C; 16-byte loads stage the A and B
//             tiles (BK = 64 bytes of K) in padded shared memory; each warp owns a 64x32 part: 4x2
//             accumulator fragments
// wmma_v3_*   like v2 with two shared-memory stages filled by cp.async: the next tile is copied
//             from global to shared memory while the tensor cores work on the current one, with no
//             staging registers
// mma_v6_*    no WMMA: PTX mma.sync.aligned.m16n8k16 fed by ldmatrix (.x4, and .trans for the
//             row-major B) from XOR-swizzled shared memory (no padding), MMA_STAGES stages filled
//             by cp.async, 4 warps of 64 x 64; C written straight from the accumulator registers
//
// v2 and v3 take any M; N and K must be multiples of one 16-byte vector (8 halves or 4 floats), and
// A and B must start on a 16-byte boundary, so every 16-byte piece of a row is either wholly inside
// the matrix or wholly outside it (then it is zero-filled; zeros add nothing to a dot product). The
// launcher checks all of this. Sizes are 32-bit, offsets into the matrices 64-bit (size_t).
//
// NVRTC (through CuPy) finds mma.h, cuda_fp16.h and cuda_bf16.h in the CUDA toolkit's include
// directory; they are device headers, nothing from the host C library is pulled in.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

using namespace nvcuda;

// The launch configurations of snippets/part3/wmma.py (CONFIGS), passed as -D options (the defaults
// let this file compile alone): v1's square patch of C per block and its threads, and the block
// tile and threads of v2, v3 and tf32_gemm's v1.
#ifndef NAIVE_TILE
#define NAIVE_TILE 32
#define NAIVE_THREADS 128
#define TILED_M 128
#define TILED_N 128
#define TILED_THREADS 256
#endif

// v6's block tile, K step (elements), threads and pipeline depth (CONFIGS["v6"] in wmma.py; the
// launcher sizes the grid and the dynamic shared memory from the same numbers).
#ifndef MMA_BM
#define MMA_BM 128
#define MMA_BN 128
#define MMA_BK 64
#define MMA_THREADS 128
#define MMA_STAGES 3
#endif

// --8<-- [start:types]
// What depends on the input type: the element type WMMA's A and B fragments hold, the depth of one
// MMA step (m16n16k16 for fp16/bf16, m16n16k8 for TF32), the conversion of the fp32 result to the
// output type, and, for TF32 only, the rounding of each fp32 fragment element to TF32's 10-bit
// mantissa before the MMA.
template <typename T>
struct Mma;

template <>
struct Mma<__half> {
    using Elem = __half;
    static constexpr int FK = 16;
    __device__ static __half from_float(float x) { return __float2half_rn(x); }
    template <typename Frag>
    __device__ static void to_tf32(Frag&) {}
};

template <>
struct Mma<__nv_bfloat16> {
    using Elem = __nv_bfloat16;
    static constexpr int FK = 16;
    __device__ static __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
    template <typename Frag>
    __device__ static void to_tf32(Frag&) {}
};

template <>
struct Mma<float> {
    using Elem = wmma::precision::tf32;  // loaded from float memory, multiplied as TF32
    static constexpr int FK = 8;
    __device__ static float from_float(float x) { return x; }
    template <typename Frag>
    __device__ static void to_tf32(Frag& f) {
        // The tensor core reads only the top 19 bits of each element; round to nearest
        // (cvt.rna.tf32.f32) instead of letting it drop the low 13 bits.
        // snippets/part3/wmma.py:tf32_round emulates this.
#pragma unroll
        for (int e = 0; e < f.num_elements; ++e) f.x[e] = wmma::__float_to_tf32(f.x[e]);
    }
};

template <typename T>
using FragA =
    wmma::fragment<wmma::matrix_a, 16, 16, Mma<T>::FK, typename Mma<T>::Elem, wmma::row_major>;
template <typename T>
using FragB =
    wmma::fragment<wmma::matrix_b, 16, 16, Mma<T>::FK, typename Mma<T>::Elem, wmma::row_major>;
template <typename T>
using FragC = wmma::fragment<wmma::accumulator, 16, 16, Mma<T>::FK, float>;
// --8<-- [end:types]

// --8<-- [start:store_tile]
// The accumulator is fp32 and its element-to-lane mapping is unspecified, so a warp cannot convert
// it in registers and write it out itself. Instead it stores the 16x16 floats to its own staging
// tile in shared memory (rows padded to LDC = 20 floats, a multiple of 4 as store_matrix_sync
// requires for float), then every lane converts 8 consecutive values of one row and writes them
// with 16-byte stores, skipping what lies outside C.
constexpr int LDC = 16 + 4;

template <typename T>
__device__ __forceinline__ void store_tile(const FragC<T>& acc, float* sC, T* __restrict__ C,
                                           int row0, int col0, int M, int N) {
    constexpr int V = 16 / sizeof(T);  // elements per 16-byte store: 8 (fp16, bf16) or 4 (fp32)
    wmma::store_matrix_sync(sC, acc, LDC, wmma::mem_row_major);
    __syncwarp();  // the whole tile is in sC before any lane reads another lane's values
    const int lane = threadIdx.x % 32;
    const int r = lane / 2, c = (lane % 2) * 8;  // lane: row r of the tile, columns c .. c + 7
    const int row = row0 + r;
    if (row < M) {
#pragma unroll
        for (int j = 0; j < 8; j += V) {
            const int col = col0 + c + j;
            if (col < N) {  // N % V == 0: the V elements are all inside C or all outside
                union {
                    T v[V];
                    uint4 u;
                } out;
#pragma unroll
                for (int e = 0; e < V; ++e) out.v[e] = Mma<T>::from_float(sC[r * LDC + c + j + e]);
                *reinterpret_cast<uint4*>(C + (size_t)row * N + col) = out.u;
            }
        }
    }
    __syncwarp();  // every lane has read sC before the next store_tile overwrites it
}
// --8<-- [end:store_tile]

// --8<-- [start:naive]
// v1: a block of NAIVE_THREADS threads (4 warps) covers a NAIVE_TILE x NAIVE_TILE patch of C (32 x
// 32), each warp one 16x16 tile. The warp walks K in steps of 16 (one MMA of m16n16k16 each),
// loading the 16x16 tiles of A and B for the step straight from global memory. load_matrix_sync
// needs a 32-byte-aligned pointer and a leading dimension that is a multiple of 8 halves: with M,
// N, K multiples of 16 and 32-byte-aligned A and B (the launcher checks), every tile start is.
template <typename T>
__device__ __forceinline__ void wmma_naive(const T* __restrict__ A, const T* __restrict__ B,
                                           T* __restrict__ C, int M, int N, int K) {
    constexpr int SIDE = NAIVE_TILE / 16;  // warps along each side of the patch: 2
    static_assert(SIDE * SIDE * 32 == NAIVE_THREADS, "one warp per 16x16 tile of the patch");
    // (SIDE * SIDE warps, 16 x 20): staging for the fp32 -> T store
    __shared__ __align__(32) float sC[SIDE * SIDE][16 * LDC];
    const int warp = threadIdx.x / 32;
    const int row0 = (blockIdx.y * SIDE + warp / SIDE) * 16;
    const int col0 = (blockIdx.x * SIDE + warp % SIDE) * 16;
    // a whole warp leaves; there is no block-wide barrier below
    if (row0 >= M || col0 >= N) return;
    FragA<T> a;    // 16x16 of A, spread over the warp's registers
    FragB<T> b;    // 16x16 of B
    FragC<T> acc;  // 16x16 fp32 sums
    wmma::fill_fragment(acc, 0.f);
    for (int k = 0; k < K; k += 16) {
        // rows row0 .. +15, columns k .. k + 15
        wmma::load_matrix_sync(a, A + (size_t)row0 * K + k, K);
        // rows k .. k + 15, columns col0 .. +15
        wmma::load_matrix_sync(b, B + (size_t)k * N + col0, N);
        wmma::mma_sync(acc, a, b, acc);                          // acc += a @ b on the tensor cores
    }
    store_tile<T>(acc, sC[warp], C, row0, col0, M, N);
}

extern "C" __global__ void __launch_bounds__(NAIVE_THREADS)
    wmma_v1_f16(const __half* __restrict__ A, const __half* __restrict__ B, __half* __restrict__ C,
                int M, int N, int K) {
    wmma_naive<__half>(A, B, C, M, N, K);
}

extern "C" __global__ void __launch_bounds__(NAIVE_THREADS)
    wmma_v1_bf16(const __nv_bfloat16* __restrict__ A, const __nv_bfloat16* __restrict__ B,
                 __nv_bfloat16* __restrict__ C, int M, int N, int K) {
    wmma_naive<__nv_bfloat16>(A, B, C, M, N, K);
}
// --8<-- [end:naive]

// --8<-- [start:cp_async]
// cp.async (sm_80+): copy 16 bytes from global to shared memory without passing through registers.
// With src-size 0 nothing is read and the 16 bytes are zero-filled: that is how a piece outside the
// matrix is padded (the source address is then the matrix base, always valid). .cg caches the data
// in L2 only: each element is used from shared memory afterwards, not from L1.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool inside) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    const int src_size = inside ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
                 "r"(src_size));
}

// Close the group of copies this thread issued since the last commit.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Wait until at most PENDING of this thread's committed groups are still in flight.
template <int PENDING>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING));
}
// --8<-- [end:cp_async]

// --8<-- [start:tiled]
// v2 and v3. The block tile is BM x BN = 128 x 128 and K advances BK elements per step, BK *
// sizeof(T) = 64 bytes (32 halves or 16 floats). 8 warps in a 2 x 4 grid each own a WM x WN = 64 x
// 32 part of the tile: (64 / 16) x (32 / 16) = 4 x 2 accumulator fragments, 64 fp32 registers per
// thread. Per MMA step a warp loads 4 A fragments and 2 B fragments and issues 8 MMAs: each A
// fragment serves 2 MMAs, each B fragment 4.
//
// Shared memory rows are padded (PAD_A, PAD_B elements) against bank conflicts when the warp reads
// fragments. A fragment read touches 8 or 16 rows of the tile at once, the same columns in each.
// Unpadded, the A tile's rows are 64 bytes apart, so rows r and r + 2 start in the same bank (32
// banks of 4 bytes = 128 bytes); the B tile's rows are 256 (fp16) or 512 (fp32) bytes apart and all
// start in bank 0. Padding A's rows to 80 bytes puts 8 consecutive rows at banks 0, 20, 8, 28, 16,
// 4, 24, 12: 8 disjoint groups of 4 banks. B's rows padded to 272 bytes (fp16, + 8 halves) start 4
// banks apart, 8 rows covering all 32 banks with 16-byte reads. For TF32, in the register layout of
// PTX's m16n8k8 MMA, one register of a B fragment holds (across the warp) 8 consecutive floats of
// each of 4 rows, so B's rows are padded by 8 floats (32 bytes: rows 8 banks apart, the 4 x 8
// floats on 32 different banks). Every padded row stays a multiple of 16 bytes (the 16-byte copies)
// and every fragment start a multiple of 32 bytes (load_matrix_sync's alignment rule).
template <typename T, int STAGES, bool ASYNC>
__device__ __forceinline__ void wmma_tiled(const T* __restrict__ A, const T* __restrict__ B,
                                           T* __restrict__ C, int M, int N, int K) {
    constexpr int BM = TILED_M, BN = TILED_N, BK = 64 / sizeof(T);
    constexpr int WM = 64, WN = 32, WARPS_N = BN / WN, NT = (BM / WM) * WARPS_N * 32;
    static_assert(NT == TILED_THREADS, "one warp per WM x WN part: the launcher's threads");
    // 4 x 2 fragments per warp; MMA depth
    constexpr int FM = WM / 16, FN = WN / 16, FK = Mma<T>::FK;
    constexpr int V = 16 / sizeof(T);                           // elements per 16-byte copy
    constexpr int PAD_A = V, PAD_B = sizeof(T) == 4 ? 2 * V : V;
    constexpr int LDA = BK + PAD_A, LDB = BN + PAD_B;  // padded row lengths, in elements
    // 16-byte copies per thread
    constexpr int A_COPIES = BM * BK / V / NT, B_COPIES = BK * BN / V / NT;
    static_assert(A_COPIES * V * NT == BM * BK && B_COPIES * V * NT == BK * BN,
                  "whole copies per thread");
    static_assert(STAGES == 1 || (STAGES == 2 && ASYNC), "one stage, or two filled by cp.async");
    static_assert((LDA * sizeof(T)) % 16 == 0 && (16 * LDA * sizeof(T)) % 32 == 0 &&
                      (FK * LDB * sizeof(T)) % 32 == 0,
                  "16-byte rows for the copies, 32-byte fragment starts for load_matrix_sync");

    __shared__ __align__(128) T sA[STAGES][BM][LDA];  // (STAGES, BM, BK + PAD_A)
    __shared__ __align__(128) T sB[STAGES][BK][LDB];  // (STAGES, BK, BN + PAD_B)
    __shared__ __align__(128) float sC[NT / 32][16 * LDC];  // (8 warps, 16 x 20): output staging

    const int tid = threadIdx.x, warp = tid / 32;
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    // this warp's part of the tile
    const int wm0 = (warp / WARPS_N) * WM, wn0 = (warp % WARPS_N) * WN;

    // One BK step of A and B into stage s: consecutive threads copy consecutive 16-byte pieces of a
    // row. A piece outside the matrices becomes zeros (cp.async's zero fill, or a zero store).
    auto load_tiles = [&](int s, int k0) {
#pragma unroll
        for (int i = 0; i < A_COPIES; ++i) {
            const int idx = tid + i * NT, r = idx / (BK / V), c = (idx % (BK / V)) * V;
            const bool inside = row0 + r < M && k0 + c < K;
            const T* src = inside ? A + (size_t)(row0 + r) * K + k0 + c : A;
            if constexpr (ASYNC) {
                cp_async16(&sA[s][r][c], src, inside);
            } else {
                *reinterpret_cast<uint4*>(&sA[s][r][c]) =
                    inside ? *reinterpret_cast<const uint4*>(src) : make_uint4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int i = 0; i < B_COPIES; ++i) {
            const int idx = tid + i * NT, r = idx / (BN / V), c = (idx % (BN / V)) * V;
            const bool inside = k0 + r < K && col0 + c < N;
            const T* src = inside ? B + (size_t)(k0 + r) * N + col0 + c : B;
            if constexpr (ASYNC) {
                cp_async16(&sB[s][r][c], src, inside);
            } else {
                *reinterpret_cast<uint4*>(&sB[s][r][c]) =
                    inside ? *reinterpret_cast<const uint4*>(src) : make_uint4(0, 0, 0, 0);
            }
        }
    };

    FragC<T> acc[FM][FN];  // (4, 2) fragments: this warp's 64 x 32 sums
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j) wmma::fill_fragment(acc[i][j], 0.f);

    // The tensor-core work on stage s: BK / FK MMA steps, each 4 A fragments x 2 B fragments.
    auto mma_tiles = [&](int s) {
#pragma unroll
        for (int kk = 0; kk < BK; kk += FK) {
            FragA<T> a[FM];  // (4,): rows wm0 .. wm0 + 63, columns kk .. kk + FK - 1 of the A tile
            FragB<T> b[FN];  // (2,): rows kk .. kk + FK - 1, columns wn0 .. wn0 + 31 of the B tile
#pragma unroll
            for (int i = 0; i < FM; ++i) {
                wmma::load_matrix_sync(a[i], &sA[s][wm0 + i * 16][kk], LDA);
                Mma<T>::to_tf32(a[i]);
            }
#pragma unroll
            for (int j = 0; j < FN; ++j) {
                wmma::load_matrix_sync(b[j], &sB[s][kk][wn0 + j * 16], LDB);
                Mma<T>::to_tf32(b[j]);
            }
#pragma unroll
            for (int i = 0; i < FM; ++i)
#pragma unroll
                for (int j = 0; j < FN; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
        }
    };

    const int tiles = (K + BK - 1) / BK;
    if constexpr (!ASYNC) {
        // v2: copy, wait, multiply, wait. While the block copies, its tensor cores idle (other
        // resident blocks may fill the gap).
        for (int t = 0; t < tiles; ++t) {
            load_tiles(0, t * BK);
            __syncthreads();  // the whole tile is in shared memory before any warp reads it
            mma_tiles(0);
            __syncthreads();  // every warp is done with the tile before the next step overwrites it
        }
    } else {
        // v3: while the warps multiply stage t % 2, the copies of tile t + 1 into the other stage
        // are in flight. wait_group<1> lets the newest group (tile t + 1) stay pending and waits
        // for tile t.
        load_tiles(0, 0);
        cp_async_commit();
        for (int t = 0; t < tiles; ++t) {
            if (t + 1 < tiles) load_tiles((t + 1) % 2, (t + 1) * BK);
            // on the last step an empty group: the wait below still means "tile t"
            cp_async_commit();
            cp_async_wait<1>();  // this thread's copies of tile t have landed ...
            __syncthreads();     // ... and every thread's
            mma_tiles(t % 2);
            // stage t % 2 is refilled at step t + 1: every warp must be done reading it
            __syncthreads();
        }
    }

#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j)
            store_tile<T>(acc[i][j], sC[warp], C, row0 + wm0 + i * 16, col0 + wn0 + j * 16, M, N);
}
// --8<-- [end:tiled]

// --8<-- [start:instances]
// 256 threads; at most 128 registers each (the second __launch_bounds__ argument asks for 2
// resident blocks per SM), which leaves room for the 64 accumulator registers and 6 fragments.
#define WMMA_KERNEL(NAME, T, STAGES, ASYNC)                                                       \
    extern "C" __global__ void __launch_bounds__(TILED_THREADS, 2)                                \
        NAME(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C, int M, int N,   \
             int K) {                                                                             \
        wmma_tiled<T, STAGES, ASYNC>(A, B, C, M, N, K);                                           \
    }

WMMA_KERNEL(wmma_v2_f16, __half, 1, false)  // v2: shared-memory tiles, 16-byte loads
WMMA_KERNEL(wmma_v2_bf16, __nv_bfloat16, 1, false)
WMMA_KERNEL(wmma_v2_tf32, float, 1, false)  // tf32_gemm v1: the v2 structure on TF32 fragments
WMMA_KERNEL(wmma_v3_f16, __half, 2, true)   // v3: two stages filled by cp.async
WMMA_KERNEL(wmma_v3_bf16, __nv_bfloat16, 2, true)
// --8<-- [end:instances]

// --8<-- [start:mma_ptx]
// v6 talks to the tensor cores in PTX. The fragment layouts are the PTX ISA's ("Matrix Fragments
// for mma.m16n8k16"), with g = lane / 4 and t = lane % 4, (row, columns) per register:
//   A (16 x 16, 4 registers of 2 halves): a0 = (g, 2t..2t+1), a1 = (g + 8, 2t..2t+1),
//                                          a2 = (g, 8+2t..8+2t+1), a3 = (g + 8, 8+2t..8+2t+1)
//   B (16 x 8, 2 registers):               b0 = (k = 2t..2t+1, n = g), b1 = (k = 8+2t.., n = g)
//   C (16 x 8 fp32, 4 registers):          c0, c1 = (g, 2t), (g, 2t + 1); c2, c3 = row g + 8
// ldmatrix.x4 loads four 8 x 8 matrices of 16-bit values: lanes 8i .. 8i + 7 give the addresses of
// the 8 rows (16 bytes each) of matrix i, and each lane gets register i = (row g, columns 2t and
// 2t + 1) of matrix i; with .trans it gets (rows 2t and 2t + 1, column g) instead.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* smem) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* smem) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

// d += a @ b for one m16n8k16 step, fp32 sums; and two fp32 sums packed into the output type.
template <typename T>
struct MmaSync;

template <>
struct MmaSync<__half> {
    __device__ static void mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
    __device__ static __half2 pack(float lo, float hi) { return __floats2half2_rn(lo, hi); }
};

template <>
struct MmaSync<__nv_bfloat16> {
    __device__ static void mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
    __device__ static __nv_bfloat162 pack(float lo, float hi) {
        return __floats2bfloat162_rn(lo, hi);
    }
};
// --8<-- [end:mma_ptx]

// --8<-- [start:swizzle]
// Shared-memory tiles without padding: a row of the A tile is BK = 64 halves = 128 bytes, a row of
// the B tile BN = 128 halves = 256 bytes, both whole 128-byte lines, in 16-byte chunks of 8 halves.
// Unswizzled, chunk c of every row sits in the same 4 banks, and the 8 rows an ldmatrix phase reads
// (same chunk, 8 consecutive rows) would hit one bank group 8 times. Chunk c of row r is stored at
// chunk c ^ (r % 8) instead: the XOR permutes the 8 chunks of each 128-byte line, so 8 consecutive
// rows put a given chunk in 8 different bank groups. The cp.async writes, 8 consecutive chunks of
// one row per 8 threads, stay conflict-free too (a permutation of one line). snippets/part3/wmma.py
// (mma_swizzle) models this offset, and tests/test_part3_wmma.py checks both access patterns.
__device__ __forceinline__ int swizzle(int row, int chunk, int chunks_per_row) {
    return row * chunks_per_row + (chunk ^ (row % 8));  // in chunks of 16 bytes
}
// --8<-- [end:swizzle]

// --8<-- [start:mma_v6]
template <typename T>
__device__ __forceinline__ void mma_tiled(const T* __restrict__ A, const T* __restrict__ B,
                                          T* __restrict__ C, int M, int N, int K) {
    constexpr int BM = MMA_BM, BN = MMA_BN, BK = MMA_BK, NT = MMA_THREADS, STAGES = MMA_STAGES;
    constexpr int WM = 64, WN = 64, WARPS_N = BN / WN;  // 2 x 2 warps of 64 x 64
    constexpr int MI = WM / 16, NI = WN / 8;            // 4 x 8 m16n8 tiles per warp
    constexpr int V = 8;                                // halves per 16-byte chunk
    constexpr int CA = BK / V, CB = BN / V;             // chunks per row: 8 (A), 16 (B)
    constexpr int A_COPIES = BM * CA / NT, B_COPIES = BK * CB / NT;  // per thread per stage
    static_assert(sizeof(T) == 2, "16-bit inputs: mma.m16n8k16 and ldmatrix.b16");
    static_assert((BM / WM) * WARPS_N * 32 == NT, "one warp per 64 x 64 part of the tile");
    static_assert(CA == 8 && CB % 8 == 0, "rows of whole 128-byte lines: the XOR swizzle's period");
    static_assert(A_COPIES * NT == BM * CA && B_COPIES * NT == BK * CB, "whole copies per thread");
    static_assert(STAGES >= 2, "a pipeline needs two stages at least");

    // Dynamic shared memory (the launcher passes its size and opts in above 48 KB): STAGES tiles of
    // A, then STAGES tiles of B, each in 16-byte chunks.
    extern __shared__ __align__(128) uint4 smem[];
    uint4* sA = smem;                         // (STAGES, BM * CA) chunks
    uint4* sB = smem + STAGES * BM * CA;      // (STAGES, BK * CB) chunks

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    const int wm0 = (warp / WARPS_N) * WM, wn0 = (warp % WARPS_N) * WN;

    // One BK step of A (BM x BK) and B (BK x BN) into stage s; consecutive threads take consecutive
    // chunks of a row. Chunks outside the matrices are zero-filled (src-size 0).
    auto load_tiles = [&](int s, int k0) {
#pragma unroll
        for (int i = 0; i < A_COPIES; ++i) {
            const int idx = tid + i * NT, r = idx / CA, c = idx % CA;
            const bool inside = row0 + r < M && k0 + c * V < K;
            const T* src = inside ? A + (size_t)(row0 + r) * K + k0 + c * V : A;
            cp_async16(sA + s * BM * CA + swizzle(r, c, CA), src, inside);
        }
#pragma unroll
        for (int i = 0; i < B_COPIES; ++i) {
            const int idx = tid + i * NT, r = idx / CB, c = idx % CB;
            const bool inside = k0 + r < K && col0 + c * V < N;
            const T* src = inside ? B + (size_t)(k0 + r) * N + col0 + c * V : B;
            cp_async16(sB + s * BK * CB + swizzle(r, c, CB), src, inside);
        }
    };

    float acc[MI][NI][4];  // (4, 8, 4): this warp's 64 x 64 fp32 sums, 128 registers
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

    // The MMAs on stage s: BK / 16 steps, each 4 ldmatrix.x4 for A, 4 ldmatrix.x4.trans for B and
    // 4 x 8 mma.sync. Lane l addresses row l % 16 of a 16-row slab, at chunk l / 16 of the step's
    // two: lanes 0-7, 8-15, 16-23, 24-31 give the rows of the four 8 x 8 matrices in the order of
    // A's registers a0..a3 (top left, bottom left, top right, bottom right), and of B's b0, b1 for
    // columns n .. n + 7, then b0, b1 for n + 8 .. n + 15.
    auto mma_tiles = [&](int s) {
        const uint4* tA = sA + s * BM * CA;
        const uint4* tB = sB + s * BK * CB;
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
            unsigned a[MI][4];      // (4, 4): rows wm0 + 16i .. +15, columns 16kk .. +15
            unsigned b[NI / 2][4];  // (4, 4): rows 16kk .. +15, columns wn0 + 16j .. +15
#pragma unroll
            for (int i = 0; i < MI; ++i)
                ldmatrix_x4(a[i], tA + swizzle(wm0 + i * 16 + lane % 16, 2 * kk + lane / 16, CA));
#pragma unroll
            for (int j = 0; j < NI / 2; ++j)
                ldmatrix_x4_trans(b[j], tB + swizzle(16 * kk + lane % 16,
                                                     (wn0 + j * 16) / V + lane / 16, CB));
#pragma unroll
            for (int i = 0; i < MI; ++i)
#pragma unroll
                for (int j = 0; j < NI; ++j) {
                    const unsigned bj[2] = {b[j / 2][2 * (j % 2)], b[j / 2][2 * (j % 2) + 1]};
                    MmaSync<T>::mma(acc[i][j], a[i], bj);
                }
        }
    };

    // The pipeline: STAGES - 1 tiles in flight before the loop; at step t wait for tile t (at most
    // STAGES - 2 newer groups pending), then refill the stage that step t - 1 read with tile
    // t + STAGES - 1. One commit per step, empty near the end, keeps "group t = tile t".
    const int tiles = (K + BK - 1) / BK;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < tiles) load_tiles(s, s * BK);
        cp_async_commit();
    }
    for (int t = 0; t < tiles; ++t) {
        cp_async_wait<STAGES - 2>();  // this thread's copies of tile t have landed ...
        __syncthreads();  // ... and every thread's; and every warp is done with step t - 1's stage
        const int next = t + STAGES - 1;
        if (next < tiles) load_tiles(next % STAGES, next * BK);
        cp_async_commit();
        mma_tiles(t % STAGES);
    }

    // Epilogue straight from the registers: lane (g, t) holds columns 2t, 2t + 1 of rows g and
    // g + 8 of each m16n8 tile, written as one 4-byte pair. N is a multiple of 8, so a pair is
    // wholly inside C or wholly outside.
    const int g = lane / 4, t4 = lane % 4;
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j) {
            const int col = col0 + wn0 + j * 8 + 2 * t4;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = row0 + wm0 + i * 16 + g + 8 * h;
                if (row < M && col < N)
                    *reinterpret_cast<decltype(MmaSync<T>::pack(0.f, 0.f))*>(
                        C + (size_t)row * N + col) =
                        MmaSync<T>::pack(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
            }
        }
}
// --8<-- [end:mma_v6]

// --8<-- [start:mma_instances]
// MMA_THREADS threads with up to 255 registers each (two blocks of 128 per SM still fit the
// register file); the 128 accumulators, 16 A and 16 B registers per k16 step need about 170.
#define MMA_KERNEL(NAME, T)                                                                       \
    extern "C" __global__ void __launch_bounds__(MMA_THREADS, 2)                                  \
        NAME(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C, int M, int N,   \
             int K) {                                                                             \
        mma_tiled<T>(A, B, C, M, N, K);                                                           \
    }

MMA_KERNEL(mma_v6_f16, __half)
MMA_KERNEL(mma_v6_bf16, __nv_bfloat16)
// --8<-- [end:mma_instances]
