// FP8 GEMMs for sm_90a with wider tiles (Part 6, "FP8 GEMMs"): fp8_gemm v4, v5 and v6,
// fp8_gemm_blockscaled v5 and v6. fp8_gemm.cu's kernels, whose 128 x 128 tile was set by the
// registers the promotion needs, with the tile's columns split into two slices that are promoted
// one at a time.
//
// Why wider: a tile of BM x BN reads (BM + BN) x 128 bytes of A and B for every 128-deep K-block
// and does 2 BM BN 128 FLOPs with them. At fp8's rate the 128 x 128 tile asks the L2 cache for a
// byte every 128 FLOPs, 128 x 256 for one every 171. The bf16 ladder's 64 x 256 consumer tile (one
// wgmma m64n256) cannot simply be copied: the promotion holds the fp32 accumulator and the wgmma
// temporary at once, 2 x 128 registers a thread for 256 columns, more than a thread may have.
//
// The fix: a consumer still owns 64 rows, now of 2 W columns, as two slices of W. Per K-block it
// runs the 4 wgmma m64nWk32 of one slice into a temporary, adds the temporary into that slice's
// accumulator, and does the same for the other slice. The accumulators cost W registers a thread,
// each temporary W / 2:
//   fp8_gemm_tensor_wide / fp8_gemm_block_wide (v4 / blockscaled v5): W = 128, one temporary,
//     128 + 64 = 192 registers. Each slice waits for its own wgmmas before it adds.
//   fp8_gemm_tensor_sliced (v5): W = 96, two temporaries, 96 + 2 x 48 = 192 registers. The second
//     slice's wgmmas are issued before the first slice is added, so the consumer adds while its
//     own wgmmas run; only the second slice's addition waits.
//   fp8_gemm_tensor_lean / fp8_gemm_block_lean (v6 / blockscaled v6): v5 / blockscaled v5 with less
//     work around the same wgmmas and adds: descriptors made by addition and a leaner mbarrier wait
//     (the lean region).
// BLOCKWISE needs W = 128: a slice then lies in one 128 x 128 scale block of B and has one scale.
//
// Everything else (TMA, mbarriers, descriptors, the persistent grouped order, setmaxnreg) is
// fp8_gemm.cu's, included below and unchanged. The epilogue is its store_tile and store_tile16 for
// a slice of any width.

#include "fp8_gemm.cu"

// --8<-- [start:constants]
namespace f8w {
constexpr int SLICES = 2;  // column slices of a consumer's 64 rows, promoted one at a time
// one stage: A's 128 x 128 bytes and B's 2 W x 128
template <int W> constexpr uint32_t STAGE_BYTES = f8::A_BYTES + SLICES * W * f8::ROW_BYTES;
// as many stages as 227 KB of shared memory holds, with the alignment slack and the barriers
template <int W>
constexpr int STAGES = (227 * 1024 - f8::SWIZZLE_REPEAT) / (STAGE_BYTES<W> + 2 * 8);
static_assert(STAGES<128> == 4 && STAGES<96> == 5, "the launcher's stage counts (48 KB, 40 KB)");
static_assert(SLICES * 128 / 2 + 128 / 2 + 40 <= f8::CONSUMER_REGS
                  && SLICES * 96 / 2 + 2 * 96 / 2 + 40 <= f8::CONSUMER_REGS,
              "accumulators + temporaries + working registers fit setmaxnreg");
}  // namespace f8w
// --8<-- [end:constants]

#if F8_SM90A
namespace f8w {
using namespace f8;

// --8<-- [start:slice]
// D (64 x 96, fp32, 48 registers a thread) = A (64 x 32) * B (96 x 32)^T + (scale_d ? D : 0),
// fp8_gemm.cu's wgmma_m64n128k32_e4m3 at 96 columns (48 accumulator registers).
__device__ __forceinline__ void wgmma_m64n96k32_e4m3(float (&d)[48], uint64_t desc_a,
                                                   uint64_t desc_b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %50, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n96k32.f32.e4m3.e4m3 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
        "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
        "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "
        "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, "
        "%48, %49, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
          "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
          "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
          "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
          "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
          "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
          "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// 4 wgmmas (128 of K) of one W-column slice into the temporary t, as one committed group
template <int W>
__device__ __forceinline__ void issue_slice(float (&t)[W / 2], uint32_t a, uint32_t b) {
    wgmma_fence();
    fence_regs(t);
#pragma unroll
    for (int kk = 0; kk < BLOCK_K / WGMMA_K; ++kk) {
        if constexpr (W == 128)
            wgmma_m64n128k32_e4m3(t, make_desc(a + kk * WGMMA_K), make_desc(b + kk * WGMMA_K),
                                  kk > 0);
        else
            wgmma_m64n96k32_e4m3(t, make_desc(a + kk * WGMMA_K), make_desc(b + kk * WGMMA_K),
                                 kk > 0);
    }
    wgmma_commit();
}

// The promotion of fp8_gemm.cu's loop: acc += t, times the rows' block scales when BLOCKWISE
template <bool BLOCKWISE, int R>
__device__ __forceinline__ void promote(float (&acc)[R], float (&t)[R], float s0, float s1) {
    fence_regs(t);
#pragma unroll
    for (int j = 0; j < R / 4; ++j) {
        if constexpr (BLOCKWISE) {
            acc[4 * j] = fmaf(t[4 * j], s0, acc[4 * j]);              // row r0
            acc[4 * j + 1] = fmaf(t[4 * j + 1], s0, acc[4 * j + 1]);
            acc[4 * j + 2] = fmaf(t[4 * j + 2], s1, acc[4 * j + 2]);  // row r0 + 8
            acc[4 * j + 3] = fmaf(t[4 * j + 3], s1, acc[4 * j + 3]);
        } else {
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[4 * j + q] += t[4 * j + q];
        }
    }
}
// --8<-- [end:slice]

// --8<-- [start:lean]
// v6's two changes to what a consumer executes per K-block besides its wgmmas and adds.
// 1. Descriptors by addition. make_desc keeps the start address in the low 14 bits, in 16-byte
//    units, and every shared-memory address of a block is below 2^18 bytes, so
//    make_desc(a + off) == make_desc(a) + off / 16 (no carry out of the field). A consumer builds
//    two descriptors once (stage 0's A rows and B's first slice); each K-block adds the stage's
//    and the K step's offsets to them instead of rebuilding 16 descriptors from addresses.
template <int W>
__device__ __forceinline__ void issue_slice_desc(float (&t)[W / 2], uint64_t da, uint64_t db) {
    wgmma_fence();
    fence_regs(t);
#pragma unroll
    for (int kk = 0; kk < BLOCK_K / WGMMA_K; ++kk) {
        const uint64_t step = kk * (WGMMA_K / 16);  // K step's offset, in 16-byte units
        if constexpr (W == 128) wgmma_m64n128k32_e4m3(t, da + step, db + step, kk > 0);
        else wgmma_m64n96k32_e4m3(t, da + step, db + step, kk > 0);
    }
    wgmma_commit();
}

// 2. The wait as one PTX loop. A try that succeeds costs the try and one branch; fp8_gemm.cu's
//    mbar_wait also turns the predicate into an integer and, on every retry, reads the clock and
//    compares 64-bit times for its trap. Here only a retry counts toward the trap that replaces a
//    hang (a try that fails has already waited up to a system-dependent time limit, so 2^26 of
//    them are far longer than any stage takes).
constexpr uint32_t WAIT_LIMIT_TRIES = 1u << 26;
__device__ __forceinline__ void mbar_wait_tries(uint32_t bar, uint32_t parity) {
    asm volatile(
        "{\n.reg .pred p;\n.reg .u32 n;\nmov.u32 n, 0;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        "@p bra DONE_%=;\n"
        "add.u32 n, n, 1;\n"
        "setp.lt.u32 p, n, %2;\n"
        "@p bra WAIT_%=;\n"
        "trap;\n"
        "DONE_%=:\n}\n"
        ::"r"(bar), "r"(parity), "n"(WAIT_LIMIT_TRIES)
        : "memory");
}
// --8<-- [end:lean]

// --8<-- [start:store]
// fp8_gemm.cu's store_tile16 (and its fallback store_tile, where C's rows are not 16-byte aligned)
// for one consumer's 64 x 2R slice of C at (row0, col0): R registers a thread, times `scale`.
template <int R>
__device__ __forceinline__ void store_slice(const float (&d)[R], float scale, __nv_bfloat16* C,
                                            int M, int N, long long ldc, int row0, int col0) {
    const int t = threadIdx.x % WG_THREADS, warp = t / 32, lane = t % 32, q = lane % 4;
    if (ldc % 8 != 0 || N % 8 != 0) {  // store_tile: pairs, or single elements at C's edge
        const bool pairs = (ldc % 2) == 0;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = row0 + warp * 16 + lane / 4 + 8 * h;
            if (r >= M) continue;
            __nv_bfloat16* row = C + r * ldc;
#pragma unroll
            for (int j = 0; j < R / 4; ++j) {
                const int c = col0 + 8 * j + 2 * q;
                const float x = d[4 * j + 2 * h] * scale, y = d[4 * j + 2 * h + 1] * scale;
                if (pairs && c + 1 < N) {
                    *reinterpret_cast<__nv_bfloat162*>(row + c) = __floats2bfloat162_rn(x, y);
                } else {
                    if (c < N) row[c] = __float2bfloat16_rn(x);
                    if (c + 1 < N) row[c + 1] = __float2bfloat16_rn(y);
                }
            }
        }
        return;
    }
    const int r = row0 + warp * 16 + lane / 4;  // store_tile16: 8 columns a lane, 16 bytes
#pragma unroll
    for (int g = 0; g < R / 16; ++g) {
        uint32_t lo[4], hi[4];  // rows r and r + 8
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float* x = d + 16 * g + 4 * i;
            lo[i] = pack_bf16x2(x[0] * scale, x[1] * scale);
            hi[i] = pack_bf16x2(x[2] * scale, x[3] * scale);
        }
        quad_transpose(lo, q);
        quad_transpose(hi, q);
        const int c = col0 + 8 * (4 * g + q);
        if (c >= N) continue;
        if (r < M) {
            asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};"
                         ::"l"(C + r * ldc + c), "r"(lo[0]), "r"(lo[1]), "r"(lo[2]), "r"(lo[3])
                         : "memory");
        }
        if (r + 8 < M) {
            asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};"
                         ::"l"(C + (r + 8) * ldc + c), "r"(hi[0]), "r"(hi[1]), "r"(hi[2]),
                           "r"(hi[3]) : "memory");
        }
    }
}
// --8<-- [end:store]

// --8<-- [start:body]
// fp8_gemm.cu's body with a 128 x 2W tile and TEMPS temporaries. Shared memory: STAGES<W> x (A's
// 128 x 128 bytes, then B's 2W x 128), then the full and empty mbarriers.
template <bool BLOCKWISE, int W, int TEMPS, bool LEAN = false>
__device__ __forceinline__ void fp8_gemm_sliced(const uint8_t* tmaps, __nv_bfloat16* C, int M,
                                                int N, int K, long long ldc, const float* a_s,
                                                const float* b_s, long long s_am, long long s_ak,
                                                long long s_bn, long long s_bk) {
    constexpr int BN = SLICES * W, R = W / 2, NST = STAGES<W>;
    constexpr uint32_t STAGE = STAGE_BYTES<W>;
    static_assert((W == 128 || W == 96) && (TEMPS == 1 || TEMPS == 2), "the two instances");
    static_assert(!BLOCKWISE || W == SCALE_BLOCK, "a slice is one scale block of B");
    static_assert((W * ROW_BYTES) % SWIZZLE_REPEAT == 0, "slices start on the swizzle's repeat");
    extern __shared__ uint8_t smem[];
    const uint32_t base = align_up(smem_u32(smem), SWIZZLE_REPEAT);
    const uint32_t full = base + NST * STAGE, empty = full + NST * 8;
    if (threadIdx.x == 0) {
        tmap_acquire(tmaps);
        tmap_acquire(tmaps + TMAP_BYTES);
        for (int s = 0; s < NST; ++s) {
            mbar_init(full + 8 * s, 1);
            mbar_init(empty + 8 * s, CONSUMERS * WG_THREADS / 32);
        }
        mbar_fence_init();
    }
    __syncthreads();

    const int wg = threadIdx.x / WG_THREADS;
    const int tiles_m = (M + BLOCK_M - 1) / BLOCK_M, tiles_n = (N + BN - 1) / BN;
    const int tiles = tiles_m * tiles_n, k_blocks = (K + BLOCK_K - 1) / BLOCK_K;
    int it = 0, pm, pn;
    if (wg == 0) {  // the producer, as in fp8_gemm.cu, with B's box of 2W rows
        regs_dec<PRODUCER_REGS>();
        if (threadIdx.x == 0) {
            for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
                tile_coords(tile, tiles_m, tiles_n, pm, pn);
                for (int kb = 0; kb < k_blocks; ++kb, ++it) {
                    const uint32_t s = it % NST, a = base + s * STAGE;
                    if (it >= NST) {
                        if constexpr (LEAN) mbar_wait_tries(empty + 8 * s, (it / NST - 1) & 1);
                        else mbar_wait(empty + 8 * s, (it / NST - 1) & 1);
                    }
                    mbar_arrive_expect_tx(full + 8 * s, STAGE);
                    tma_load_2d(a, tmaps, full + 8 * s, kb * BLOCK_K, pm * BLOCK_M);
                    tma_load_2d(a + A_BYTES, tmaps + TMAP_BYTES, full + 8 * s, kb * BLOCK_K,
                                pn * BN);
                }
            }
        }
        return;
    }
    regs_inc<CONSUMER_REGS>();
    const int c = wg - 1, lane = threadIdx.x % 32;
    const int t = threadIdx.x % WG_THREADS, warp = t / 32;
    const int scale_rows_b = (N + SCALE_BLOCK - 1) / SCALE_BLOCK;  // B's scale blocks along N
    float acc[SLICES][R], tmp[TEMPS][R];
    // LEAN (v6): stage 0's descriptors of this consumer's rows of A and of B's first slice
    const uint64_t da0 = make_desc(base + c * 64 * ROW_BYTES), db0 = make_desc(base + A_BYTES);
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        tile_coords(tile, tiles_m, tiles_n, pm, pn);
        const int row0 = pm * BLOCK_M + c * 64, col0 = pn * BN;
        // BLOCKWISE: this thread's two rows of A's scales and each slice's row of B's (clamped
        // into B's scales: a slice past N is never stored)
        const int r0 = min(row0 + warp * 16 + lane / 4, M - 1);
        const int r1 = min(row0 + warp * 16 + lane / 4 + 8, M - 1);
#pragma unroll
        for (int p = 0; p < SLICES; ++p)
#pragma unroll
            for (int i = 0; i < R; ++i) acc[p][i] = 0.0f;
        for (int kb = 0; kb < k_blocks; ++kb, ++it) {
            const uint32_t s = it % NST, a = base + s * STAGE;
            float sa0 = 1.f, sa1 = 1.f, sb[SLICES] = {1.f, 1.f};
            if constexpr (BLOCKWISE) {  // loaded before the wait: their latency hides behind it
                sa0 = __ldg(a_s + r0 * s_am + kb * s_ak);
                sa1 = __ldg(a_s + r1 * s_am + kb * s_ak);
#pragma unroll
                for (int p = 0; p < SLICES; ++p)
                    sb[p] = __ldg(b_s + min(2 * pn + p, scale_rows_b - 1) * s_bn + kb * s_bk);
            }
            if constexpr (LEAN) mbar_wait_tries(full + 8 * s, (it / NST) & 1);
            else mbar_wait(full + 8 * s, (it / NST) & 1);
            const uint32_t a_rows = a + c * 64 * ROW_BYTES, b_rows = a + A_BYTES;
            // slice p's 4 wgmmas into t, from descriptors rebuilt from addresses or (LEAN, v6)
            // made by adding this stage's and slice's offsets to stage 0's
            auto issue = [&](float (&t)[R], int p) {
                if constexpr (LEAN)
                    issue_slice_desc<W>(t, da0 + s * (STAGE / 16),
                                        db0 + s * (STAGE / 16) + p * (W * ROW_BYTES / 16));
                else issue_slice<W>(t, a_rows, b_rows + p * W * ROW_BYTES);
            };
            if constexpr (TEMPS == 1) {  // v4: per slice, its wgmmas, their wait, the add
#pragma unroll
                for (int p = 0; p < SLICES; ++p) {
                    issue(tmp[0], p);
                    wgmma_wait<0>();
                    promote<BLOCKWISE>(acc[p], tmp[0], sa0 * sb[p], sa1 * sb[p]);
                }
            } else {  // v5: slice 1's wgmmas are issued before slice 0 is added
                issue(tmp[0], 0);
                issue(tmp[1], 1);
                wgmma_wait<1>();  // slice 0's group is done; slice 1's may still run
                promote<BLOCKWISE>(acc[0], tmp[0], sa0 * sb[0], sa1 * sb[0]);
                wgmma_wait<0>();
                promote<BLOCKWISE>(acc[1], tmp[1], sa0 * sb[1], sa1 * sb[1]);
            }
            if (lane == 0) mbar_arrive(empty + 8 * s);  // both slices read: TMA may refill it
        }
        const float scale = BLOCKWISE ? 1.f : __ldg(a_s) * __ldg(b_s);
#pragma unroll
        for (int p = 0; p < SLICES; ++p)
            store_slice(acc[p], scale, C, M, N, ldc, row0, col0 + p * W);
    }
}
// --8<-- [end:body]
}  // namespace f8w
#endif  // F8_SM90A

// --8<-- [start:kernels]
// One signature for the three (the per-tensor ones ignore the scale strides): a_s and b_s are one
// fp32 value each per tensor, or a_scales (M x K/128) and b_scales (ceil(N/128) x K/128).
#if F8_SM90A
#define F8W_BODY(BLOCKWISE, W, TEMPS, LEAN) \
    f8w::fp8_gemm_sliced<BLOCKWISE, W, TEMPS, LEAN>(tmaps, C, M, N, K, ldc, a_s, b_s, s_am, s_ak, \
                                                    s_bn, s_bk);
#else
#define F8W_BODY(BLOCKWISE, W, TEMPS, LEAN) __trap();
#endif
#define F8W_KERNEL(NAME, BLOCKWISE, W, TEMPS, LEAN)                                                \
    extern "C" __global__ void __launch_bounds__(f8::THREADS, 1)                                   \
        NAME(const uint8_t* __restrict__ tmaps, __nv_bfloat16* __restrict__ C, int M, int N,       \
             int K, long long ldc, const float* __restrict__ a_s, const float* __restrict__ b_s,   \
             long long s_am, long long s_ak, long long s_bn, long long s_bk) {                     \
        F8W_BODY(BLOCKWISE, W, TEMPS, LEAN)                                                        \
    }
F8W_KERNEL(fp8_gemm_tensor_wide, false, 128, 1, false)   // fp8_gemm v4: 128 x 256, one temporary
F8W_KERNEL(fp8_gemm_block_wide, true, 128, 1, false)     // fp8_gemm_blockscaled v5: v4, scaled
F8W_KERNEL(fp8_gemm_tensor_sliced, false, 96, 2, false)  // fp8_gemm v5: 128 x 192, two temporaries
F8W_KERNEL(fp8_gemm_tensor_lean, false, 96, 2, true)     // fp8_gemm v6: v5, fewer instructions
F8W_KERNEL(fp8_gemm_block_lean, true, 128, 1, true)      // fp8_gemm_blockscaled v6: its v5, lean
// --8<-- [end:kernels]
