// FP8 GEMMs for sm_90a (Part 6, "FP8 GEMMs"): C (bf16, M x N) = A @ B^T with A (M x K) and
// B (N x K) in float8 e4m3, both K-major (the layout fp8 wgmma reads; it has no transpose flags).
//
//   fp8_gemm_tensor  one fp32 scale per operand: C = (A @ B^T) * a_s * b_s, scales in the epilogue
//   fp8_gemm_block   DeepSeek-V3's block scales: A per 1 x 128 block (a_scales[m, kb]), B per
//                    128 x 128 block (b_scales[n / 128, kb]), applied at every promotion
//   fp8_gemm_tensor16, fp8_gemm_block16
//                    the same two with the Hopper GEMM's v9 epilogue: 16-byte stores of C after a
//                    shuffle transpose inside each quad of lanes (the launcher adds v10's balanced
//                    grid)
//
// One body serves both (fp8_gemm<BLOCKWISE>): a producer warpgroup keeps STAGES K-blocks of A and B
// in shared memory with TMA (128-byte swizzle: a 128-byte row is 128 fp8 values, one K-block, one
// scale block); two consumer warpgroups own 64 rows each of a 128 x 128 tile of C and issue
// wgmma m64n128k32 e4m3. The promotion: the 4 wgmmas of one K-block (4 x 32 = 128 of K) sum into
// a temporary t (the first with scale-d = 0, so t needs no zeroing), and once they are done t is
// added into the fp32 accumulator acc (times the two block scales when BLOCKWISE). The tensor
// cores thus never sum more than 128 products in their own accumulator: what fp8_gemm v1 and
// cuBLAS (without fast accumulation) compute. Persistent: one block per SM walks the tiles in
// grouped order; while the consumers store a tile, the producer is loading the next one's blocks.
//
// The helpers (mbarrier, TMA, wgmma fences, setmaxnreg, descriptor, tile order) are copies of
// csrc/part6/hopper_gemm.cu's, in namespace f8 so that this file stands alone; a later re-measure
// can factor both into one sm90 header (changing hopper_gemm.cu stales its measured results).
//
// The tensor maps are built on the host (snippets/part6/fp8_gemm.py) and passed in global memory:
// 128 bytes for A, then 128 bytes for B. Only sm_90a has wgmma and setmaxnreg: for any other target
// the kernel bodies are traps, so the file still compiles where the book builds every csrc file.

#include <cuda_bf16.h>
#include <stdint.h>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define F8_SM90A 1
#else
#define F8_SM90A 0
#endif

// --8<-- [start:constants]
namespace f8 {
constexpr int BLOCK_K = 128;             // fp8 elements of K per stage: one 128-byte swizzled row
constexpr int ROW_BYTES = BLOCK_K;       // 1 byte per element: 128, the span of the 128B swizzle
constexpr int SCALE_BLOCK = 128;         // the block scales change every 128 of K (and of N for B)
constexpr int WGMMA_K = 32;              // wgmma m64nNk32: 32 fp8 values (32 bytes) of K each
constexpr int SWIZZLE_REPEAT = 1024;     // 8 rows x 128 bytes: tiles start on this boundary
constexpr int TMAP_BYTES = 128;          // one CUtensorMap
constexpr int WG_THREADS = 128;          // a warpgroup: four warps
constexpr int CONSUMERS = 2;             // consumer (math) warpgroups, 64 rows of C each
constexpr int THREADS = WG_THREADS * (1 + CONSUMERS);  // 384: the producer, then the consumers
constexpr int BLOCK_M = 128;            // 64 rows per consumer
constexpr int BLOCK_N = 128;             // one m64n128k32 per consumer per 32 of K
constexpr int STAGES = 6;                // K-blocks in flight: 6 x 32 KB of shared memory
constexpr int GROUP_M = 8;               // tile rows per group of the grouped (L2-friendly) order
constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;  // setmaxnreg: 128 x 40 + 256 x 232 <= 64K

// The register arithmetic. A consumer thread holds its share of a 64 x BLOCK_N fp32 tile twice:
// the promoted accumulator acc and the wgmma temporary t, 64 x BLOCK_N / 128 threads = BLOCK_N / 2
// registers each, BLOCK_N registers for both. BLOCK_N = 128: 128 of the 232 registers setmaxnreg
// gives a consumer, the rest for addresses, the loop, the scales. BLOCK_N = 256 (the bf16 ladder's
// tile) would need 256 for the two accumulators alone: more than a thread may have (255).
constexpr int ACC_REGS = BLOCK_N / 2;
static_assert(2 * ACC_REGS + 64 <= CONSUMER_REGS, "acc + t + working registers fit setmaxnreg");
static_assert(PRODUCER_REGS % 8 == 0 && CONSUMER_REGS % 8 == 0, "setmaxnreg takes multiples of 8");
static_assert(WG_THREADS * (PRODUCER_REGS + CONSUMERS * CONSUMER_REGS) <= 65536,
              "the three warpgroups' registers must fit the SM's 64K");
static_assert(BLOCK_K == SCALE_BLOCK && BLOCK_N == SCALE_BLOCK,
              "one K-block is one scale block; a tile's columns share one scale of B per K-block");
static_assert(BLOCK_K % WGMMA_K == 0 && BLOCK_N % 8 == 0 && BLOCK_N <= 256
                  && BLOCK_M == 64 * CONSUMERS,
              "wgmma shapes: m64nNk32, one 64-row wgmma per consumer");
constexpr uint32_t A_BYTES = BLOCK_M * ROW_BYTES;                  // 16 KB
constexpr uint32_t STAGE_BYTES = (BLOCK_M + BLOCK_N) * ROW_BYTES;  // 32 KB
static_assert(STAGES * STAGE_BYTES + SWIZZLE_REPEAT + 2 * 8 * STAGES <= 227 * 1024,
              "the stages and barriers must fit 227 KB of shared memory");
static_assert(A_BYTES + BLOCK_N * ROW_BYTES == STAGE_BYTES && TMAP_BYTES == 128 && GROUP_M > 0
                  && THREADS == 384,
              "a stage is A's tile then B's; a CUtensorMap is 128 bytes; 3 warpgroups");
}  // namespace f8
// --8<-- [end:constants]

#if F8_SM90A
namespace f8 {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ uint32_t align_up(uint32_t addr, uint32_t to) {
    return (addr + to - 1) & ~(to - 1);
}

// The wgmma descriptor of a K-major tile written by TMA with the 128B swizzle (hopper_gemm.cu's
// make_desc): start address, LBO 16 bytes (unused, encoded 1), SBO 1024 bytes, layout 1 (128B).
__device__ __forceinline__ uint64_t desc_encode(uint32_t x) { return (x & 0x3FFFF) >> 4; }

__device__ __forceinline__ uint64_t make_desc(uint32_t smem_addr) {
    return desc_encode(smem_addr) | desc_encode(16) << 16 | desc_encode(SWIZZLE_REPEAT) << 32
           | 1ull << 62;
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_fence_init() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// A phase that never completes traps after WAIT_LIMIT_CLOCKS instead of hanging the process.
constexpr long long WAIT_LIMIT_CLOCKS = 1ll << 34;

__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    long long start = 0;
    while (true) {
        asm volatile(
            "{\n.reg .pred p;\n"
            "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            "selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
        if (done) return;
        if (start == 0) start = clock64();
        else if (clock64() - start > WAIT_LIMIT_CLOCKS) __trap();
    }
}

__device__ __forceinline__ void tmap_acquire(const void* tmap) {
    asm volatile("fence.proxy.tensormap::generic.acquire.sys [%0], 128;" ::"l"(tmap) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(tmap) : "memory");
}

// The box at (k, row) of a 2-D tensor map into shared memory; out-of-bounds elements arrive as
// zeros and still count towards the barrier's transaction bytes.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* tmap, uint32_t bar, int k,
                                            int row) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4}], [%2];"
        ::"r"(dst), "l"(tmap), "r"(bar), "r"(k), "r"(row)
        : "memory");
}

__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
template <int R>
__device__ __forceinline__ void fence_regs(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

template <int R>
__device__ __forceinline__ void regs_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(R));
}
template <int R>
__device__ __forceinline__ void regs_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(R));
}

__device__ __forceinline__ void tile_coords(int t, int tiles_m, int tiles_n, int& pm, int& pn) {
    const int per_group = GROUP_M * tiles_n;
    const int first_m = (t / per_group) * GROUP_M;
    const int rows = min(tiles_m - first_m, GROUP_M);
    pm = first_m + (t % per_group) % rows;
    pn = (t % per_group) / rows;
}

// --8<-- [start:wgmma_fp8]
// D (64 x 128, fp32, 64 registers a thread) = A (64 x 32) * B (128 x 32)^T + (scale_d ? D : 0),
// e4m3 operands read from shared memory through their descriptors. fp8 wgmma has no transpose
// flags (both operands K-major) and takes the operand negation immediates only (1, 1).
__device__ __forceinline__ void wgmma_m64n128k32_e4m3(float (&d)[64], uint64_t desc_a,
                                                     uint64_t desc_b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
        "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
        "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "
        "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, "
        "%60, %61, %62, %63}, "
        "%64, %65, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
          "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
          "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
          "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
          "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
          "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
          "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]),
          "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
          "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
// --8<-- [end:wgmma_fp8]

// --8<-- [start:epilogue]
// One consumer's 64 x 128 accumulators, times `scale`, to C (bf16, row-major, N columns, row
// stride ldc): warp w holds rows 16w..16w+15, lane l rows l/4 and l/4 + 8 of those, and in each
// group of 8 columns the two columns 2(l%4), 2(l%4) + 1, as d[4j..4j+3] for group j. Rows and
// columns outside C (TMA's zero-filled edges) are not stored. Pairs go out as one bf16x2 when the
// pair is inside C and 4-byte aligned (even ldc), else one element at a time.
__device__ __forceinline__ void store_tile(const float (&d)[ACC_REGS], float scale,
                                           __nv_bfloat16* C, int M, int N, long long ldc,
                                           int row0, int col0) {
    const int t = threadIdx.x % WG_THREADS, warp = t / 32, lane = t % 32;
    const bool pairs = (ldc % 2) == 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = row0 + warp * 16 + lane / 4 + 8 * h;
        if (r >= M) continue;
        __nv_bfloat16* row = C + r * ldc;
#pragma unroll
        for (int j = 0; j < BLOCK_N / 8; ++j) {
            const int c = col0 + 8 * j + 2 * (lane % 4);
            const float x = d[4 * j + 2 * h] * scale, y = d[4 * j + 2 * h + 1] * scale;
            if (pairs && c + 1 < N) {
                *reinterpret_cast<__nv_bfloat162*>(row + c) = __floats2bfloat162_rn(x, y);
            } else {
                if (c < N) row[c] = __float2bfloat16_rn(x);
                if (c + 1 < N) row[c + 1] = __float2bfloat16_rn(y);
            }
        }
    }
}
// --8<-- [end:epilogue]

// --8<-- [start:epilogue16]
// fp8_gemm v3's and fp8_gemm_blockscaled v4's epilogue: csrc/part6/hopper_gemm.cu's store_acc16
// (its v9) with the per-tensor scale. The four lanes of a quad hold the same two rows; two rounds
// of shuffles leave lane q with all 8 columns of group 4g + q, stored with one 16-byte store per
// row. Where C's rows are not 16-byte aligned (an N that is not a multiple of 8) it falls back to
// store_tile. pack_bf16x2 and quad_transpose are hopper_gemm.cu's, copied (a CPU test compares).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

// w[i] is this lane's word of group i; afterwards w[p] is lane p's word of group q (q: this lane)
__device__ __forceinline__ void quad_transpose(uint32_t (&w)[4], int q) {
#pragma unroll
    for (int k = 1; k <= 2; k <<= 1) {      // round 1 swaps with lane q ^ 1, round 2 with q ^ 2
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            if (s & k) continue;             // the pair of slots (s, s ^ k)
            const bool upper = q & k;        // the upper lane keeps slot s and receives into it
            const uint32_t send = upper ? w[s] : w[s ^ k];
            const uint32_t got = __shfl_xor_sync(0xffffffffu, send, k);
            if (upper) w[s] = got;
            else w[s ^ k] = got;
        }
    }
}

__device__ __forceinline__ void store_tile16(const float (&d)[ACC_REGS], float scale,
                                             __nv_bfloat16* C, int M, int N, long long ldc,
                                             int row0, int col0) {
    if (ldc % 8 != 0 || N % 8 != 0) {  // the same test for every thread: no lane is left out
        store_tile(d, scale, C, M, N, ldc, row0, col0);
        return;
    }
    const int t = threadIdx.x % WG_THREADS, warp = t / 32, lane = t % 32, q = lane % 4;
    const int r = row0 + warp * 16 + lane / 4;
#pragma unroll
    for (int g = 0; g < BLOCK_N / 32; ++g) {
        uint32_t lo[4], hi[4];  // rows r and r + 8
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float* x = d + 16 * g + 4 * i;
            lo[i] = pack_bf16x2(x[0] * scale, x[1] * scale);
            hi[i] = pack_bf16x2(x[2] * scale, x[3] * scale);
        }
        quad_transpose(lo, q);  // every lane of the warp takes part, inside C or not
        quad_transpose(hi, q);
        const int c = col0 + 8 * (4 * g + q);  // N % 8 == 0: the 8 columns are in C or not
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
// --8<-- [end:epilogue16]

// --8<-- [start:body]
// The kernel body. Shared memory: STAGES x (A's 128 x 128 bytes, then B's 128 x 128 bytes), then
// STAGES "full" and STAGES "empty" mbarriers. `it` counts K-blocks across all of a block's tiles,
// so stage (it % STAGES) and phase ((it / STAGES) & 1) carry on from one tile to the next.
template <bool BLOCKWISE, bool STORE16 = false>
__device__ __forceinline__ void fp8_gemm(const uint8_t* tmaps, __nv_bfloat16* C, int M, int N,
                                         int K, long long ldc, const float* a_s, const float* b_s,
                                         long long s_am, long long s_ak, long long s_bn,
                                         long long s_bk) {
    extern __shared__ uint8_t smem[];
    const uint32_t base = align_up(smem_u32(smem), SWIZZLE_REPEAT);
    const uint32_t full = base + STAGES * STAGE_BYTES, empty = full + STAGES * 8;
    if (threadIdx.x == 0) {
        tmap_acquire(tmaps);
        tmap_acquire(tmaps + TMAP_BYTES);
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full + 8 * s, 1);                               // expect_tx + TMA bytes
            mbar_init(empty + 8 * s, CONSUMERS * WG_THREADS / 32);    // every consumer warp
        }
        mbar_fence_init();
    }
    __syncthreads();

    const int wg = threadIdx.x / WG_THREADS;
    const int tiles_m = (M + BLOCK_M - 1) / BLOCK_M, tiles_n = (N + BLOCK_N - 1) / BLOCK_N;
    const int k_blocks = (K + BLOCK_K - 1) / BLOCK_K;
    int it = 0, pm, pn;
    if (wg == 0) {  // the producer: one thread issues every TMA copy
        regs_dec<PRODUCER_REGS>();
        if (threadIdx.x == 0) {
            for (int tile = blockIdx.x; tile < tiles_m * tiles_n; tile += gridDim.x) {
                tile_coords(tile, tiles_m, tiles_n, pm, pn);
                for (int kb = 0; kb < k_blocks; ++kb, ++it) {
                    const uint32_t s = it % STAGES, a = base + s * STAGE_BYTES;
                    if (it >= STAGES) mbar_wait(empty + 8 * s, (it / STAGES - 1) & 1);
                    mbar_arrive_expect_tx(full + 8 * s, STAGE_BYTES);
                    tma_load_2d(a, tmaps, full + 8 * s, kb * BLOCK_K, pm * BLOCK_M);
                    tma_load_2d(a + A_BYTES, tmaps + TMAP_BYTES, full + 8 * s, kb * BLOCK_K,
                                pn * BLOCK_N);
                }
            }
        }
        return;
    }
    regs_inc<CONSUMER_REGS>();
    const int c = wg - 1, lane = threadIdx.x % 32;
    const int t = threadIdx.x % WG_THREADS, warp = t / 32;
    float acc[ACC_REGS], tmp[ACC_REGS];
    for (int tile = blockIdx.x; tile < tiles_m * tiles_n; tile += gridDim.x) {
        tile_coords(tile, tiles_m, tiles_n, pm, pn);
        const int row0 = pm * BLOCK_M + c * 64, col0 = pn * BLOCK_N;
        // BLOCKWISE: this thread's two rows of A (clamped into A: rows past M are never stored)
        // and the tile's one row of B's scales, read one K-block ahead of their use.
        const int r0 = min(row0 + warp * 16 + lane / 4, M - 1);
        const int r1 = min(row0 + warp * 16 + lane / 4 + 8, M - 1);
        const float* sa0 = a_s + r0 * s_am;
        const float* sa1 = a_s + r1 * s_am;
        const float* sb = b_s + pn * s_bn;
        float na0 = 0.f, na1 = 0.f, nb = 0.f;
        if constexpr (BLOCKWISE) {
            na0 = __ldg(sa0);
            na1 = __ldg(sa1);
            nb = __ldg(sb);
        }
#pragma unroll
        for (int i = 0; i < ACC_REGS; ++i) acc[i] = 0.0f;
        for (int kb = 0; kb < k_blocks; ++kb, ++it) {
            const uint32_t s = it % STAGES, a = base + s * STAGE_BYTES;
            mbar_wait(full + 8 * s, (it / STAGES) & 1);
            wgmma_fence();
            fence_regs(tmp);
#pragma unroll
            for (int kk = 0; kk < BLOCK_K / WGMMA_K; ++kk)  // 32 bytes of K per wgmma
                wgmma_m64n128k32_e4m3(tmp, make_desc(a + c * 64 * ROW_BYTES + kk * WGMMA_K),
                                      make_desc(a + A_BYTES + kk * WGMMA_K), kk > 0);
            wgmma_commit();
            float s0 = 1.f, s1 = 1.f;
            if constexpr (BLOCKWISE) {  // this block's scales; start loading the next block's
                s0 = na0 * nb;
                s1 = na1 * nb;
                if (kb + 1 < k_blocks) {
                    na0 = __ldg(sa0 + (kb + 1) * s_ak);
                    na1 = __ldg(sa1 + (kb + 1) * s_ak);
                    nb = __ldg(sb + (kb + 1) * s_bk);
                }
            }
            wgmma_wait<0>();
            fence_regs(tmp);
            if (lane == 0) mbar_arrive(empty + 8 * s);  // stage s is read: TMA may refill it
            // The promotion: 128 of K summed by the tensor cores, added here in fp32.
#pragma unroll
            for (int j = 0; j < ACC_REGS / 4; ++j) {
                if constexpr (BLOCKWISE) {
                    acc[4 * j] = fmaf(tmp[4 * j], s0, acc[4 * j]);          // row r0
                    acc[4 * j + 1] = fmaf(tmp[4 * j + 1], s0, acc[4 * j + 1]);
                    acc[4 * j + 2] = fmaf(tmp[4 * j + 2], s1, acc[4 * j + 2]);  // row r0 + 8
                    acc[4 * j + 3] = fmaf(tmp[4 * j + 3], s1, acc[4 * j + 3]);
                } else {
#pragma unroll
                    for (int q = 0; q < 4; ++q) acc[4 * j + q] += tmp[4 * j + q];
                }
            }
        }
        // the producer is already loading the next tile's blocks while this one is stored
        const float scale = BLOCKWISE ? 1.f : __ldg(a_s) * __ldg(b_s);
        if constexpr (STORE16) store_tile16(acc, scale, C, M, N, ldc, row0, col0);
        else store_tile(acc, scale, C, M, N, ldc, row0, col0);
    }
}
// --8<-- [end:body]
}  // namespace f8
#endif  // F8_SM90A

// --8<-- [start:kernels]
// Per-tensor: a_s and b_s point at one fp32 value each (the scale strides are unused).
extern "C" __global__ void __launch_bounds__(f8::THREADS, 1)
fp8_gemm_tensor(const uint8_t* __restrict__ tmaps, __nv_bfloat16* __restrict__ C, int M, int N,
                int K, long long ldc, const float* __restrict__ a_s,
                const float* __restrict__ b_s) {
#if F8_SM90A
    f8::fp8_gemm<false>(tmaps, C, M, N, K, ldc, a_s, b_s, 0, 0, 0, 0);
#else
    __trap();
#endif
}

// Block-scaled: a_scales is M x K/128 and b_scales ceil(N/128) x K/128, any strides (elements).
extern "C" __global__ void __launch_bounds__(f8::THREADS, 1)
fp8_gemm_block(const uint8_t* __restrict__ tmaps, __nv_bfloat16* __restrict__ C, int M, int N,
               int K, long long ldc, const float* __restrict__ a_scales,
               const float* __restrict__ b_scales, long long s_am, long long s_ak,
               long long s_bn, long long s_bk) {
#if F8_SM90A
    f8::fp8_gemm<true>(tmaps, C, M, N, K, ldc, a_scales, b_scales, s_am, s_ak, s_bn, s_bk);
#else
    __trap();
#endif
}

// fp8_gemm v3 and fp8_gemm_blockscaled v4: the same two bodies with the 16-byte epilogue.
extern "C" __global__ void __launch_bounds__(f8::THREADS, 1)
fp8_gemm_tensor16(const uint8_t* __restrict__ tmaps, __nv_bfloat16* __restrict__ C, int M, int N,
                  int K, long long ldc, const float* __restrict__ a_s,
                  const float* __restrict__ b_s) {
#if F8_SM90A
    f8::fp8_gemm<false, true>(tmaps, C, M, N, K, ldc, a_s, b_s, 0, 0, 0, 0);
#else
    __trap();
#endif
}

extern "C" __global__ void __launch_bounds__(f8::THREADS, 1)
fp8_gemm_block16(const uint8_t* __restrict__ tmaps, __nv_bfloat16* __restrict__ C, int M, int N,
                 int K, long long ldc, const float* __restrict__ a_scales,
                 const float* __restrict__ b_scales, long long s_am, long long s_ak,
                 long long s_bn, long long s_bk) {
#if F8_SM90A
    f8::fp8_gemm<true, true>(tmaps, C, M, N, K, ldc, a_scales, b_scales, s_am, s_ak, s_bn, s_bk);
#else
    __trap();
#endif
}
// --8<-- [end:kernels]
