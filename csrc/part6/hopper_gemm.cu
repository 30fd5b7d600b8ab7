// The Hopper GEMM ladder (Part 6, "A Hopper GEMM"): C = A @ B^T in bf16 with fp32 sums, for sm_90a.
//
// A is M x K and B is N x K, both row-major: both operands are K-major, the layout wgmma reads
// without a transpose. C is M x N row-major bf16. Every tile reaches shared memory through TMA
// (cp.async.bulk.tensor) with the 128-byte swizzle, and the tensor cores read it from there through
// wgmma's matrix descriptors: no thread copies an element of A or B.
//
//   v1  one warpgroup, one stage: load a K-slice, wait on its mbarrier, multiply, repeat
//   v2  like v1 with STAGES_V2 stages and full/empty mbarriers: TMA runs ahead of the tensor cores
//   v3  warp specialisation: a producer warpgroup issues TMA, two consumer warpgroups multiply a
//       128 x 256 tile (64 x 256 each); setmaxnreg moves registers from producer to consumers
//   v4  like v3, persistent: one block per SM walks the tiles in grouped order (L2 reuse)
//   v5  like v4 in clusters of two blocks along M: each loads half of the B tile they share and
//       TMA multicasts it into both blocks' shared memory
//   v6  like v4 with STAGES_V6 stages and a TMA-store epilogue (registers -> shared -> global)
//   v7  v5's clusters and multicast with v6's TMA-store epilogue
//   v9  v5 with 16-byte stores of C: the four lanes that share a row of the accumulators trade
//       values with shuffles, so each lane stores 8 adjacent columns at once
//   v10 v9's kernel on a balanced grid: as few clusters as give the same number of tile rounds
//       (gemm.py chooses the grid; the kernel is v9's)
//
// The tensor maps are built on the host (snippets/part6/gemm.py, cuTensorMapEncodeTiled) and passed
// in global memory: 128 bytes for A, then 128 bytes for B (and for v6 and v7, 128 for C). The
// kernels take no other description of the operands: box sizes and swizzle must agree with the
// constants below, which gemm.py mirrors and tests/test_part6_gemm.py compares.
//
// Only sm_90a has wgmma and setmaxnreg: for any other target every kernel body is a trap, so the
// file still compiles for the other architectures the book builds for.

#include <cuda_bf16.h>
#include <stdint.h>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define HG_SM90A 1
#else
#define HG_SM90A 0
#endif

// v5's clusters: a compile-time cluster shape, which targets before sm_90 refuse
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define HG_CLUSTER_DIMS __cluster_dims__(2, 1, 1)
#else
#define HG_CLUSTER_DIMS
#endif

// --8<-- [start:constants]
namespace hg {
constexpr int BLOCK_K = 64;              // bf16 elements of K per stage: one 128-byte swizzled row
constexpr int ROW_BYTES = BLOCK_K * 2;   // 128, the span of the 128B swizzle
constexpr int SWIZZLE_REPEAT = 1024;     // 8 rows x 128 bytes: tiles start on this boundary
constexpr int TMAP_BYTES = 128;          // one CUtensorMap
constexpr int WG_THREADS = 128;          // a warpgroup: four warps

// v1, v2: one warpgroup computes a 128 x 128 tile of C as two 64-row wgmma halves
constexpr int BM_V1 = 128, BN_V1 = 128, STAGES_V2 = 4;
// v3, v4: a producer warpgroup and two consumers; a 128 x 256 tile, 64 x 256 per consumer
constexpr int BM_WS = 128, BN_WS = 256, STAGES_WS = 4, CONSUMERS = 2;
constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;  // 128 x 40 + 256 x 232 <= 65536
constexpr int GROUP_M = 8;  // v4: tile rows per group of the grouped (L2-friendly) order
constexpr int CLUSTER = 2;  // v5: blocks per cluster, along M; they share B's tiles
constexpr int STAGES_V6 = 3;  // v6: one stage less, for the C tiles of the TMA-store epilogue

// What the constants promise, checked where they are written
static_assert(PRODUCER_REGS % 8 == 0 && CONSUMER_REGS % 8 == 0, "setmaxnreg takes multiples of 8");
static_assert(WG_THREADS * (PRODUCER_REGS + CONSUMERS * CONSUMER_REGS) <= 65536,
              "the three warpgroups' registers must fit the SM's 64K");
static_assert(BM_WS == 64 * CONSUMERS && BN_WS <= 256, "one m64n256 wgmma row block per consumer");
static_assert(STAGES_WS * (BM_WS + BN_WS) * ROW_BYTES + SWIZZLE_REPEAT <= 227 * 1024,
              "v3/v4 stages must fit 227 KB of shared memory");
static_assert(GROUP_M > 0 && STAGES_V2 > 1, "a group and a pipeline need at least one");
static_assert(BN_WS % CLUSTER == 0, "v5: each block of a cluster loads an equal share of B");
static_assert(STAGES_V6 * (BM_WS + BN_WS) * ROW_BYTES + BM_WS * BN_WS * 2 + SWIZZLE_REPEAT
                  <= 227 * 1024,
              "v6: stages and the bf16 C tile must fit 227 KB of shared memory");
static_assert(TMAP_BYTES == 128 && BM_V1 == 128 && BN_V1 == 128,
              "v1/v2 issue two m64n128 wgmmas per 16 of K; a CUtensorMap is 128 bytes");
}  // namespace hg
// --8<-- [end:constants]

#if HG_SM90A
namespace hg {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Dynamic shared memory is only guaranteed 16-byte alignment: round up to the swizzle's repeat so
// that every tile starts on a 1024-byte boundary and its descriptors keep base offset 0.
__device__ __forceinline__ uint32_t align_up(uint32_t addr, uint32_t to) {
    return (addr + to - 1) & ~(to - 1);
}

// --8<-- [start:descriptor]
// The wgmma shared-memory matrix descriptor of a K-major tile written by TMA with the 128B swizzle
// (snippets/part6/hopper.py, wgmma_descriptor): start address, LBO = 16 bytes (unused by swizzled
// K-major layouts, encoded as 1), SBO = 1024 bytes (from one group of 8 rows to the next), base
// offset 0, layout type 1 (128B) in bits 62-63. Every field is in 16-byte units.
__device__ __forceinline__ uint64_t desc_encode(uint32_t x) { return (x & 0x3FFFF) >> 4; }

__device__ __forceinline__ uint64_t make_desc(uint32_t smem_addr) {
    return desc_encode(smem_addr) | desc_encode(16) << 16 | desc_encode(SWIZZLE_REPEAT) << 32
           | 1ull << 62;
}
// --8<-- [end:descriptor]

// --8<-- [start:mbarrier]
// mbarriers: a 64-bit word in shared memory with an arrival count and a transaction-byte count.
// A phase completes when both reach zero; try_wait.parity(p) returns once the phase of parity p
// has completed. The n-th use of a barrier (n = 0, 1, ...) waits on parity n & 1.
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

// Make the initialised barriers visible to the async proxy (TMA) before any copy signals them.
__device__ __forceinline__ void mbar_fence_init() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// One arrival that also announces the bytes TMA will deliver to this phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// A phase that never completes is a bug (a wrong parity, a byte count that never arrives): after
// WAIT_LIMIT_CLOCKS (seconds) the wait traps, so a broken kernel fails its launch instead of
// hanging the process.
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
// --8<-- [end:mbarrier]

// --8<-- [start:tma]
// The tensor map lives in global memory, written there by a host-to-device copy: order that write
// before the tensor-map proxy reads it, and prefetch it into the TMA unit's cache.
__device__ __forceinline__ void tmap_acquire(const void* tmap) {
    asm volatile("fence.proxy.tensormap::generic.acquire.sys [%0], 128;" ::"l"(tmap) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(tmap) : "memory");
}

// Copy the box at (k, row) of a 2-D tensor map into shared memory at dst; the copy's bytes count
// down the transaction count of the mbarrier bar. Coordinates are in elements, innermost (K)
// first. Rows or columns outside the tensor arrive as zeros and still count.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* tmap, uint32_t bar, int k,
                                            int row) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4}], [%2];"
        ::"r"(dst), "l"(tmap), "r"(bar), "r"(k), "r"(row)
        : "memory");
}
// --8<-- [end:tma]

// --8<-- [start:cluster]
// v5: the cluster of two blocks. The multicast copy writes the same box to the same shared-memory
// offset in every block of cta_mask and completes the transaction bytes on the barrier at the same
// offset in each. A barrier of another block is reached through its shared::cluster address (mapa).
__device__ __forceinline__ uint32_t cluster_rank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

__device__ __forceinline__ void cluster_sync() {  // every thread of both blocks
    asm volatile("barrier.cluster.arrive.release.aligned;\n"
                 "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

__device__ __forceinline__ void tma_load_2d_multicast(uint32_t dst, const void* tmap, uint32_t bar,
                                                      int k, int row, uint16_t cta_mask) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        ".multicast::cluster [%0], [%1, {%3, %4}], [%2], %5;"
        ::"r"(dst), "l"(tmap), "r"(bar), "r"(k), "r"(row), "h"(cta_mask)
        : "memory");
}

__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, uint32_t cta) {
    asm volatile(
        "{\n.reg .b32 remote;\n"
        "mapa.shared::cluster.u32 remote, %0, %1;\n"
        "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}"
        ::"r"(bar), "r"(cta)
        : "memory");
}
// --8<-- [end:cluster]

// --8<-- [start:wgmma]
// wgmma is asynchronous: fence before the first one that touches registers written by ordinary
// code, commit the issued ones as a group, and wait until at most N groups are still in flight
// before reading the accumulators or reusing the shared memory they read.
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

// Keep the compiler from moving reads or writes of the accumulators across a wgmma boundary.
template <int R>
__device__ __forceinline__ void fence_regs(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// --8<-- [end:wgmma]

// --8<-- [start:wgmma_n128]
// D (64 x 128, fp32, 64 registers a thread) += A (64 x 16) * B (128 x 16)^T, both read
// from shared memory through their descriptors; K-major (transpose flags 0), scale 1.
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t desc_a,
                                               uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
        "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
        "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "
        "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, "
        "%60, %61, %62, %63}, "
        "%64, %65, p, 1, 1, 0, 0;\n}\n"
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
        : "l"(desc_a), "l"(desc_b), "n"(1));
}

// --8<-- [end:wgmma_n128]

// D (64 x 256, fp32, 128 registers a thread) += A (64 x 16) * B (256 x 16)^T, both read
// from shared memory through their descriptors; K-major (transpose flags 0), scale 1.
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t desc_a,
                                               uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
        "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
        "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "
        "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, "
        "%60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, "
        "%72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, "
        "%84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, "
        "%108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, "
        "%120, %121, %122, %123, %124, %125, %126, %127}, "
        "%128, %129, p, 1, 1, 0, 0;\n}\n"
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
          "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]),
          "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]),
          "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
          "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]),
          "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]),
          "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]),
          "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]),
          "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]),
          "+f"(d[126]), "+f"(d[127])
        : "l"(desc_a), "l"(desc_b), "n"(1));
}
// --8<-- [start:setmaxnreg]
template <int R>
__device__ __forceinline__ void regs_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(R));
}
template <int R>
__device__ __forceinline__ void regs_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(R));
}
// --8<-- [end:setmaxnreg]

// --8<-- [start:epilogue]
// The accumulators of one m64nNk16 wgmma, written to C (bf16, row-major, N_c columns): warp w of
// the warpgroup holds rows 16w..16w+15; lane l holds rows l/4 and l/4 + 8 of those, and in each
// group of 8 columns the two adjacent columns 2(l%4), 2(l%4) + 1, as d[4j..4j+3] for group j.
// Rows and columns outside C (the zero-filled edge of a tile) are not stored; gemm.py checks that
// N_c is a multiple of 8, so a pair of columns is inside C whole or not at all.
template <int N>
__device__ __forceinline__ void store_acc(const float (&d)[N / 2], __nv_bfloat16* C, int M,
                                          int N_c, int row0, int col0) {
    const int t = threadIdx.x % WG_THREADS, warp = t / 32, lane = t % 32;
    const int r = row0 + warp * 16 + lane / 4;
#pragma unroll
    for (int j = 0; j < N / 8; ++j) {
        const int c = col0 + 8 * j + 2 * (lane % 4);
        if (c >= N_c) continue;
        if (r < M) {
            *reinterpret_cast<__nv_bfloat162*>(C + size_t(r) * N_c + c) =
                __floats2bfloat162_rn(d[4 * j], d[4 * j + 1]);
        }
        if (r + 8 < M) {
            *reinterpret_cast<__nv_bfloat162*>(C + size_t(r + 8) * N_c + c) =
                __floats2bfloat162_rn(d[4 * j + 2], d[4 * j + 3]);
        }
    }
}
// --8<-- [end:epilogue]

// --8<-- [start:epilogue16]
// v9's epilogue. In store_acc a warp's store instruction writes 4 bytes per lane: 16 bytes of each
// of 8 rows, half of every 32-byte sector it touches, 64 instructions per thread. The four lanes
// q = l % 4 of a quad hold the same two rows; across four 8-column groups 4g..4g+3 lane q has the
// pair at columns 2q, 2q + 1 of each. Two rounds of shuffles transpose that 4 x 4 block of 4-byte
// words, after which lane q holds all 8 columns of group 4g + q: one 16-byte store per row, 16 per
// thread, each instruction writing 64 whole bytes of each of 8 rows.
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

template <int N>
__device__ __forceinline__ void store_acc16(const float (&d)[N / 2], __nv_bfloat16* C, int M,
                                            int N_c, int row0, int col0) {
    const int t = threadIdx.x % WG_THREADS, warp = t / 32, lane = t % 32, q = lane % 4;
    const int r = row0 + warp * 16 + lane / 4;
#pragma unroll
    for (int g = 0; g < N / 32; ++g) {
        uint32_t lo[4], hi[4];  // rows r and r + 8
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            lo[i] = pack_bf16x2(d[16 * g + 4 * i], d[16 * g + 4 * i + 1]);
            hi[i] = pack_bf16x2(d[16 * g + 4 * i + 2], d[16 * g + 4 * i + 3]);
        }
        quad_transpose(lo, q);  // every lane of the warp takes part, inside C or not
        quad_transpose(hi, q);
        const int c = col0 + 8 * (4 * g + q);  // N_c % 8 == 0: the 8 columns are in C or not
        if (c >= N_c) continue;
        if (r < M) {
            asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};"
                         ::"l"(C + size_t(r) * N_c + c), "r"(lo[0]), "r"(lo[1]), "r"(lo[2]),
                           "r"(lo[3]) : "memory");
        }
        if (r + 8 < M) {
            asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};"
                         ::"l"(C + size_t(r + 8) * N_c + c), "r"(hi[0]), "r"(hi[1]), "r"(hi[2]),
                           "r"(hi[3]) : "memory");
        }
    }
}
// --8<-- [end:epilogue16]

// --8<-- [start:tile_order]
// v4's tile order: groups of GROUP_M tile rows, walked column by column inside a group, so that the
// blocks running at the same time share a few rows of A and columns of B in L2 (gemm.py's
// tile_order is the same formula, tested to visit every tile once).
__device__ __forceinline__ void tile_coords(int t, int tiles_m, int tiles_n, int& pm, int& pn) {
    const int per_group = GROUP_M * tiles_n;
    const int first_m = (t / per_group) * GROUP_M;
    const int rows = min(tiles_m - first_m, GROUP_M);
    pm = first_m + (t % per_group) % rows;
    pn = (t % per_group) / rows;
}
// --8<-- [end:tile_order]

}  // namespace hg
#endif  // HG_SM90A

// -------------------------------------------------------------------------------------------------
// v1: TMA + one mbarrier + one warpgroup of wgmma, one stage
// -------------------------------------------------------------------------------------------------

// --8<-- [start:v1]
extern "C" __global__ void __launch_bounds__(128, 1)
hopper_gemm_v1(const uint8_t* __restrict__ tmaps, __nv_bfloat16* __restrict__ C, int M, int N,
               int K) {
#if HG_SM90A
    using namespace hg;
    extern __shared__ uint8_t smem[];
    const uint32_t sA = align_up(smem_u32(smem), SWIZZLE_REPEAT);  // BM_V1 rows of 128 bytes
    const uint32_t sB = sA + BM_V1 * ROW_BYTES;                      // BN_V1 rows of 128 bytes
    const uint32_t bar = sB + BN_V1 * ROW_BYTES;
    const void* tmap_a = tmaps;
    const void* tmap_b = tmaps + TMAP_BYTES;
    const int m0 = blockIdx.y * BM_V1, n0 = blockIdx.x * BN_V1;
    const int tid = threadIdx.x;

    if (tid == 0) {
        tmap_acquire(tmap_a);
        tmap_acquire(tmap_b);
        mbar_init(bar, 1);  // one arrival (thread 0's expect_tx) + the bytes of both boxes
        mbar_fence_init();
    }
    __syncthreads();

    float d[2][BN_V1 / 2];  // rows 0-63 and 64-127 of the tile: 128 fp32 registers a thread
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int i = 0; i < BN_V1 / 2; ++i) d[h][i] = 0.0f;

    const int k_tiles = (K + BLOCK_K - 1) / BLOCK_K;
    for (int kt = 0; kt < k_tiles; ++kt) {
        if (tid == 0) {
            mbar_arrive_expect_tx(bar, (BM_V1 + BN_V1) * ROW_BYTES);
            tma_load_2d(sA, tmap_a, bar, kt * BLOCK_K, m0);
            tma_load_2d(sB, tmap_b, bar, kt * BLOCK_K, n0);
        }
        mbar_wait(bar, kt & 1);  // the kt-th phase of the one barrier

        wgmma_fence();
        fence_regs(d[0]);
        fence_regs(d[1]);
#pragma unroll
        for (int kk = 0; kk < BLOCK_K / 16; ++kk) {  // 16 elements of K = 32 bytes per wgmma
#pragma unroll
            for (int h = 0; h < 2; ++h)
                wgmma_m64n128k16(d[h], make_desc(sA + h * 64 * ROW_BYTES + kk * 32),
                                 make_desc(sB + kk * 32));
        }
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(d[0]);
        fence_regs(d[1]);
        __syncthreads();  // every warp is done reading the tiles before TMA overwrites them
    }
    store_acc<BN_V1>(d[0], C, M, N, m0, n0);
    store_acc<BN_V1>(d[1], C, M, N, m0 + 64, n0);
#else
    __trap();
#endif
}
// --8<-- [end:v1]

// -------------------------------------------------------------------------------------------------
// v2: STAGES_V2 stages, full and empty mbarriers
// -------------------------------------------------------------------------------------------------

// --8<-- [start:v2]
extern "C" __global__ void __launch_bounds__(128, 1)
hopper_gemm_v2(const uint8_t* __restrict__ tmaps, __nv_bfloat16* __restrict__ C, int M, int N,
               int K) {
#if HG_SM90A
    using namespace hg;
    constexpr int S = STAGES_V2;
    constexpr uint32_t A_BYTES = BM_V1 * ROW_BYTES, STAGE_BYTES = (BM_V1 + BN_V1) * ROW_BYTES;
    extern __shared__ uint8_t smem[];
    const uint32_t base = align_up(smem_u32(smem), SWIZZLE_REPEAT);  // stage s: A, then B
    const uint32_t full = base + S * STAGE_BYTES;  // S barriers: "stage s holds data"
    const uint32_t empty = full + S * 8;           // S barriers: "stage s may be refilled"
    const void* tmap_a = tmaps;
    const void* tmap_b = tmaps + TMAP_BYTES;
    const int m0 = blockIdx.y * BM_V1, n0 = blockIdx.x * BN_V1;
    const int tid = threadIdx.x, lane = tid % 32;
    const int k_tiles = (K + BLOCK_K - 1) / BLOCK_K;

    auto load = [&](int kt) {  // thread 0: fill stage kt % S with K-slice kt
        const uint32_t s = kt % S, a = base + s * STAGE_BYTES;
        mbar_arrive_expect_tx(full + 8 * s, STAGE_BYTES);
        tma_load_2d(a, tmap_a, full + 8 * s, kt * BLOCK_K, m0);
        tma_load_2d(a + A_BYTES, tmap_b, full + 8 * s, kt * BLOCK_K, n0);
    };
    if (tid == 0) {
        tmap_acquire(tmap_a);
        tmap_acquire(tmap_b);
        for (int s = 0; s < S; ++s) {
            mbar_init(full + 8 * s, 1);
            mbar_init(empty + 8 * s, WG_THREADS / 32);  // one arrival per warp
        }
        mbar_fence_init();
        for (int kt = 0; kt < S && kt < k_tiles; ++kt) load(kt);  // the prologue: S slices ahead
    }
    __syncthreads();

    float d[2][BN_V1 / 2];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int i = 0; i < BN_V1 / 2; ++i) d[h][i] = 0.0f;

    for (int kt = 0; kt < k_tiles; ++kt) {
        const uint32_t s = kt % S, a = base + s * STAGE_BYTES;
        mbar_wait(full + 8 * s, (kt / S) & 1);
        wgmma_fence();
        fence_regs(d[0]);
        fence_regs(d[1]);
#pragma unroll
        for (int kk = 0; kk < BLOCK_K / 16; ++kk) {
#pragma unroll
            for (int h = 0; h < 2; ++h)
                wgmma_m64n128k16(d[h], make_desc(a + h * 64 * ROW_BYTES + kk * 32),
                                 make_desc(a + A_BYTES + kk * 32));
        }
        wgmma_commit();
        wgmma_wait<0>();  // this warp's reads of stage s are done
        fence_regs(d[0]);
        fence_regs(d[1]);
        if (lane == 0) mbar_arrive(empty + 8 * s);
        if (tid == 0 && kt + S < k_tiles) {
            mbar_wait(empty + 8 * s, (kt / S) & 1);  // all four warps released stage s
            load(kt + S);  // refill it with the slice S steps ahead
        }
    }
    store_acc<BN_V1>(d[0], C, M, N, m0, n0);
    store_acc<BN_V1>(d[1], C, M, N, m0 + 64, n0);
#else
    __trap();
#endif
}
// --8<-- [end:v2]

// -------------------------------------------------------------------------------------------------
// v3 and v4: warp specialisation; v4 also persistent
// -------------------------------------------------------------------------------------------------

#if HG_SM90A
namespace hg {
constexpr uint32_t WS_A_BYTES = BM_WS * ROW_BYTES;                    // 16 KB
constexpr uint32_t WS_STAGE_BYTES = (BM_WS + BN_WS) * ROW_BYTES;     // 48 KB

// --8<-- [start:producer]
// The producer: one thread of warpgroup 0 keeps the S stages full. `it` counts K-slices
// across every tile this block computes, so the stage and the phase carry on from tile to tile.
template <int S = STAGES_WS>
__device__ __forceinline__ void produce(uint32_t base, uint32_t full, uint32_t empty,
                                        const void* tmap_a, const void* tmap_b, int m0, int n0,
                                        int k_tiles, int& it) {
    for (int kt = 0; kt < k_tiles; ++kt, ++it) {
        const uint32_t s = it % S, a = base + s * WS_STAGE_BYTES;
        if (it >= S) mbar_wait(empty + 8 * s, (it / S - 1) & 1);
        mbar_arrive_expect_tx(full + 8 * s, WS_STAGE_BYTES);
        tma_load_2d(a, tmap_a, full + 8 * s, kt * BLOCK_K, m0);
        tma_load_2d(a + WS_A_BYTES, tmap_b, full + 8 * s, kt * BLOCK_K, n0);
    }
}
// --8<-- [end:producer]

// --8<-- [start:consumer]
// A consumer warpgroup (c = 0 or 1): rows 64c..64c+63 of the 128 x 256 tile, one m64n256k16 per
// 16 elements of K. It releases a stage (one arrival per warp) once the wgmma reading it is done.
template <int S = STAGES_WS>
__device__ __forceinline__ void consume(uint32_t base, uint32_t full, uint32_t empty, int c,
                                        int k_tiles, int& it, float (&d)[BN_WS / 2]) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int i = 0; i < BN_WS / 2; ++i) d[i] = 0.0f;
    for (int kt = 0; kt < k_tiles; ++kt, ++it) {
        const uint32_t s = it % S, a = base + s * WS_STAGE_BYTES;
        mbar_wait(full + 8 * s, (it / S) & 1);
        wgmma_fence();
        fence_regs(d);
#pragma unroll
        for (int kk = 0; kk < BLOCK_K / 16; ++kk)
            wgmma_m64n256k16(d, make_desc(a + c * 64 * ROW_BYTES + kk * 32),
                             make_desc(a + WS_A_BYTES + kk * 32));
        wgmma_commit();
        wgmma_wait<1>();
        fence_regs(d);
        if (kt > 0 && lane == 0) mbar_arrive(empty + 8 * ((it - 1) % S));
    }
    wgmma_wait<0>();
    fence_regs(d);
    if (lane == 0) mbar_arrive(empty + 8 * ((it - 1) % S));
}
// --8<-- [end:consumer]

// Shared memory of v3 to v6: S stages, then `extra` bytes (v6's C tiles), then the barriers.
template <int S = STAGES_WS>
__device__ __forceinline__ void ws_setup(uint32_t& base, uint32_t& full, uint32_t& empty,
                                         const uint8_t* tmaps, uint32_t extra = 0) {
    extern __shared__ uint8_t smem[];
    base = align_up(smem_u32(smem), SWIZZLE_REPEAT);
    full = base + S * WS_STAGE_BYTES + extra;
    empty = full + S * 8;
    if (threadIdx.x == 0) {
        tmap_acquire(tmaps);
        tmap_acquire(tmaps + TMAP_BYTES);
        for (int s = 0; s < S; ++s) {
            mbar_init(full + 8 * s, 1);
            mbar_init(empty + 8 * s, CONSUMERS * WG_THREADS / 32);  // every consumer warp
        }
        mbar_fence_init();
    }
    __syncthreads();
}
}  // namespace hg
#endif  // HG_SM90A

// --8<-- [start:v3]
extern "C" __global__ void __launch_bounds__(384, 1)
hopper_gemm_v3(const uint8_t* __restrict__ tmaps, __nv_bfloat16* __restrict__ C, int M, int N,
               int K) {
#if HG_SM90A
    using namespace hg;
    uint32_t base, full, empty;
    ws_setup(base, full, empty, tmaps);
    const int wg = threadIdx.x / WG_THREADS;
    const int m0 = blockIdx.y * BM_WS, n0 = blockIdx.x * BN_WS;
    const int k_tiles = (K + BLOCK_K - 1) / BLOCK_K;
    int it = 0;
    if (wg == 0) {  // the producer warpgroup gives up registers it does not need
        regs_dec<PRODUCER_REGS>();
        if (threadIdx.x == 0)
            produce(base, full, empty, tmaps, tmaps + TMAP_BYTES, m0, n0, k_tiles, it);
    } else {        // each consumer gets 232 registers: 128 accumulators and room to spare
        regs_inc<CONSUMER_REGS>();
        float d[BN_WS / 2];
        consume(base, full, empty, wg - 1, k_tiles, it, d);
        store_acc<BN_WS>(d, C, M, N, m0 + (wg - 1) * 64, n0);
    }
#else
    __trap();
#endif
}
// --8<-- [end:v3]

// --8<-- [start:v4]
extern "C" __global__ void __launch_bounds__(384, 1)
hopper_gemm_v4(const uint8_t* __restrict__ tmaps, __nv_bfloat16* __restrict__ C, int M, int N,
               int K) {
#if HG_SM90A
    using namespace hg;
    uint32_t base, full, empty;
    ws_setup(base, full, empty, tmaps);
    const int wg = threadIdx.x / WG_THREADS;
    const int tiles_m = (M + BM_WS - 1) / BM_WS, tiles_n = (N + BN_WS - 1) / BN_WS;
    const int k_tiles = (K + BLOCK_K - 1) / BLOCK_K;
    int it = 0, pm, pn;
    if (wg == 0) {
        regs_dec<PRODUCER_REGS>();
        if (threadIdx.x == 0) {
            for (int t = blockIdx.x; t < tiles_m * tiles_n; t += gridDim.x) {
                tile_coords(t, tiles_m, tiles_n, pm, pn);
                produce(base, full, empty, tmaps, tmaps + TMAP_BYTES, pm * BM_WS, pn * BN_WS,
                        k_tiles, it);
            }
        }
    } else {
        regs_inc<CONSUMER_REGS>();
        float d[BN_WS / 2];
        for (int t = blockIdx.x; t < tiles_m * tiles_n; t += gridDim.x) {
            tile_coords(t, tiles_m, tiles_n, pm, pn);
            consume(base, full, empty, wg - 1, k_tiles, it, d);
            // the producer is already loading the next tile's slices while this one is stored
            store_acc<BN_WS>(d, C, M, N, pm * BM_WS + (wg - 1) * 64, pn * BN_WS);
        }
    }
#else
    __trap();
#endif
}
// --8<-- [end:v4]


// -------------------------------------------------------------------------------------------------
// The TMA-store epilogue of v6 and v7 (registers -> shared memory -> one bulk tensor store)
// -------------------------------------------------------------------------------------------------

#if HG_SM90A
namespace hg {
// --8<-- [start:tma_store]
// The threads of one consumer warpgroup meet at their own named barrier (0 is __syncthreads').
template <int ID>
__device__ __forceinline__ void wg_barrier() {
    asm volatile("bar.sync %0, %1;" ::"n"(ID), "n"(WG_THREADS) : "memory");
}

// One consumer's 64 x 256 accumulators to C through shared memory: wait until the previous tile's
// store has read the buffer, write the bf16 values row-major (512-byte rows, as the tensor map's
// unswizzled box is laid out), fence them from the generic to the async proxy, and let one thread
// issue the store. TMA clips the rows and columns outside C, so there is no bounds check here.
template <int BAR_ID>
__device__ __forceinline__ void store_acc_tma(const float (&d)[BN_WS / 2], uint32_t c_smem,
                                              const void* tmap_c, int row0, int col0) {
    const int t = threadIdx.x % WG_THREADS, warp = t / 32, lane = t % 32;
    if (t == 0) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
    wg_barrier<BAR_ID>();
    const uint32_t row = c_smem + (warp * 16 + lane / 4) * (BN_WS * 2);
#pragma unroll
    for (int j = 0; j < BN_WS / 8; ++j) {
        const uint32_t col_bytes = (8 * j + 2 * (lane % 4)) * 2;
        __nv_bfloat162 lo = __floats2bfloat162_rn(d[4 * j], d[4 * j + 1]);
        __nv_bfloat162 hi = __floats2bfloat162_rn(d[4 * j + 2], d[4 * j + 3]);
        asm volatile("st.shared.b32 [%0], %1;" ::"r"(row + col_bytes),
                     "r"(*reinterpret_cast<uint32_t*>(&lo)) : "memory");
        asm volatile("st.shared.b32 [%0], %1;" ::"r"(row + 8 * BN_WS * 2 + col_bytes),
                     "r"(*reinterpret_cast<uint32_t*>(&hi)) : "memory");
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    wg_barrier<BAR_ID>();
    if (t == 0) {
        asm volatile(
            "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];"
            ::"l"(tmap_c), "r"(col0), "r"(row0), "r"(c_smem)
            : "memory");
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    }
}
// --8<-- [end:tma_store]
}  // namespace hg
#endif  // HG_SM90A

// -------------------------------------------------------------------------------------------------
// v5: v4 in clusters of two blocks along M; each block loads half of B and multicasts it to both.
// v7: v5 with v6's TMA-store epilogue (3 stages). v9: v5 with store_acc16. One body, cluster_gemm,
// serves all three.
// -------------------------------------------------------------------------------------------------

// --8<-- [start:v5]
#if HG_SM90A
namespace hg {
enum class Epilogue { kRegs, kTma, kRegs16 };  // store_acc, store_acc_tma, store_acc16

template <int S, Epilogue EPI>
__device__ __forceinline__ void cluster_gemm(const uint8_t* tmaps, __nv_bfloat16* C, int M, int N,
                                             int K) {
    constexpr uint32_t B_HALF_BYTES = BN_WS / CLUSTER * ROW_BYTES;  // 16 KB: 128 rows of B
    constexpr bool TMA_STORE = EPI == Epilogue::kTma;
    constexpr uint32_t C_TILE_BYTES = 64 * BN_WS * 2;  // v7: one consumer's 64 x 256 bf16
    constexpr uint32_t EXTRA = TMA_STORE ? CONSUMERS * C_TILE_BYTES : 0;
    extern __shared__ uint8_t smem[];
    const uint32_t base = align_up(smem_u32(smem), SWIZZLE_REPEAT);
    const uint32_t full = base + S * WS_STAGE_BYTES + EXTRA, empty = full + S * 8;
    const uint32_t rank = cluster_rank();
    if (threadIdx.x == 0) {
        tmap_acquire(tmaps);
        tmap_acquire(tmaps + TMAP_BYTES);
        for (int s = 0; s < S; ++s) {
            mbar_init(full + 8 * s, 1);  // own expect_tx; the bytes come from both blocks' copies
            // a stage may be refilled once the consumers of BOTH blocks are done with it: the
            // peer's half of B lands in this block's stage, this block's half in the peer's
            mbar_init(empty + 8 * s, CLUSTER * CONSUMERS * WG_THREADS / 32);
        }
        mbar_fence_init();
    }
    cluster_sync();  // both blocks' barriers exist before either block's copies signal them

    const int wg = threadIdx.x / WG_THREADS;
    const int pairs_m = (M + CLUSTER * BM_WS - 1) / (CLUSTER * BM_WS);
    const int tiles_n = (N + BN_WS - 1) / BN_WS;
    const int clusters = gridDim.x / CLUSTER, cluster = blockIdx.x / CLUSTER;
    const int k_tiles = (K + BLOCK_K - 1) / BLOCK_K;
    int it = 0, pm, pn;
    if (wg == 0) {
        regs_dec<PRODUCER_REGS>();
        if (threadIdx.x == 0) {
            for (int t = cluster; t < pairs_m * tiles_n; t += clusters) {
                tile_coords(t, pairs_m, tiles_n, pm, pn);
                const int m0 = (pm * CLUSTER + rank) * BM_WS, n0 = pn * BN_WS;
                for (int kt = 0; kt < k_tiles; ++kt, ++it) {
                    const uint32_t s = it % S, a = base + s * WS_STAGE_BYTES;
                    if (it >= S) mbar_wait(empty + 8 * s, (it / S - 1) & 1);
                    mbar_arrive_expect_tx(full + 8 * s, WS_STAGE_BYTES);  // A + both halves of B
                    tma_load_2d(a, tmaps, full + 8 * s, kt * BLOCK_K, m0);
                    tma_load_2d_multicast(a + WS_A_BYTES + rank * B_HALF_BYTES, tmaps + TMAP_BYTES,
                                          full + 8 * s, kt * BLOCK_K, n0 + rank * (BN_WS / 2),
                                          (1 << CLUSTER) - 1);
                }
            }
        }
    } else {
        regs_inc<CONSUMER_REGS>();
        const int c = wg - 1, lane = threadIdx.x % 32;
        const uint32_t c_smem = base + S * WS_STAGE_BYTES + c * C_TILE_BYTES;  // v7 only
        const void* tmap_c = tmaps + 2 * TMAP_BYTES;
        if (TMA_STORE && threadIdx.x % WG_THREADS == 0) tmap_acquire(tmap_c);  // the storer
        float d[BN_WS / 2];
        for (int t = cluster; t < pairs_m * tiles_n; t += clusters) {
            tile_coords(t, pairs_m, tiles_n, pm, pn);
#pragma unroll
            for (int i = 0; i < BN_WS / 2; ++i) d[i] = 0.0f;
            for (int kt = 0; kt < k_tiles; ++kt, ++it) {
                const uint32_t s = it % S, a = base + s * WS_STAGE_BYTES;
                mbar_wait(full + 8 * s, (it / S) & 1);
                wgmma_fence();
                fence_regs(d);
#pragma unroll
                for (int kk = 0; kk < BLOCK_K / 16; ++kk)
                    wgmma_m64n256k16(d, make_desc(a + c * 64 * ROW_BYTES + kk * 32),
                                     make_desc(a + WS_A_BYTES + kk * 32));
                wgmma_commit();
                wgmma_wait<1>();
                fence_regs(d);
                if (kt > 0 && lane == 0)
                    for (uint32_t r = 0; r < CLUSTER; ++r)
                        mbar_arrive_cluster(empty + 8 * ((it - 1) % S), r);
            }
            wgmma_wait<0>();
            fence_regs(d);
            if (lane == 0)
                for (uint32_t r = 0; r < CLUSTER; ++r)
                    mbar_arrive_cluster(empty + 8 * ((it - 1) % S), r);
            const int row0 = (pm * CLUSTER + rank) * BM_WS + c * 64, col0 = pn * BN_WS;
            if constexpr (TMA_STORE) {  // barrier 1 or 2: each consumer meets only its own
                if (c == 0) store_acc_tma<1>(d, c_smem, tmap_c, row0, col0);
                else store_acc_tma<2>(d, c_smem, tmap_c, row0, col0);
            } else if constexpr (EPI == Epilogue::kRegs16) {
                store_acc16<BN_WS>(d, C, M, N, row0, col0);
            } else {
                store_acc<BN_WS>(d, C, M, N, row0, col0);
            }
        }
        // the block's shared memory must outlive the last store's reads of it
        if (TMA_STORE && threadIdx.x % WG_THREADS == 0)
            asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    }
    // no block may exit while its peer can still arrive on its barriers
    cluster_sync();
}
}  // namespace hg
#endif  // HG_SM90A

extern "C" __global__ void HG_CLUSTER_DIMS __launch_bounds__(384, 1)
hopper_gemm_v5(const uint8_t* __restrict__ tmaps, __nv_bfloat16* __restrict__ C, int M, int N,
               int K) {
#if HG_SM90A
    hg::cluster_gemm<hg::STAGES_WS, hg::Epilogue::kRegs>(tmaps, C, M, N, K);
#else
    __trap();
#endif
}
// --8<-- [end:v5]

// -------------------------------------------------------------------------------------------------
// v6: v4 with the TMA-store epilogue
// -------------------------------------------------------------------------------------------------

// --8<-- [start:v6]
extern "C" __global__ void __launch_bounds__(384, 1)
hopper_gemm_v6(const uint8_t* __restrict__ tmaps, __nv_bfloat16* __restrict__ C, int M, int N,
               int K) {
#if HG_SM90A
    using namespace hg;
    constexpr uint32_t C_TILE_BYTES = 64 * BN_WS * 2;  // one consumer's 64 x 256 bf16
    uint32_t base, full, empty;
    ws_setup<STAGES_V6>(base, full, empty, tmaps, CONSUMERS * C_TILE_BYTES);
    const int wg = threadIdx.x / WG_THREADS;
    const int tiles_m = (M + BM_WS - 1) / BM_WS, tiles_n = (N + BN_WS - 1) / BN_WS;
    const int k_tiles = (K + BLOCK_K - 1) / BLOCK_K;
    int it = 0, pm, pn;
    if (wg == 0) {
        regs_dec<PRODUCER_REGS>();
        if (threadIdx.x == 0) {
            for (int t = blockIdx.x; t < tiles_m * tiles_n; t += gridDim.x) {
                tile_coords(t, tiles_m, tiles_n, pm, pn);
                produce<STAGES_V6>(base, full, empty, tmaps, tmaps + TMAP_BYTES, pm * BM_WS,
                                   pn * BN_WS, k_tiles, it);
            }
        }
    } else {
        regs_inc<CONSUMER_REGS>();
        const int c = wg - 1;
        const uint32_t c_smem = base + STAGES_V6 * WS_STAGE_BYTES + c * C_TILE_BYTES;
        if (threadIdx.x % WG_THREADS == 0) tmap_acquire(tmaps + 2 * TMAP_BYTES);  // the storer
        float d[BN_WS / 2];
        for (int t = blockIdx.x; t < tiles_m * tiles_n; t += gridDim.x) {
            tile_coords(t, tiles_m, tiles_n, pm, pn);
            consume<STAGES_V6>(base, full, empty, c, k_tiles, it, d);
            const int row0 = pm * BM_WS + c * 64, col0 = pn * BN_WS;  // barrier 1 or 2
            if (c == 0) store_acc_tma<1>(d, c_smem, tmaps + 2 * TMAP_BYTES, row0, col0);
            else store_acc_tma<2>(d, c_smem, tmaps + 2 * TMAP_BYTES, row0, col0);
        }
        // the block's shared memory must outlive the last store's reads of it
        if (threadIdx.x % WG_THREADS == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    }
#else
    __trap();
#endif
}
// --8<-- [end:v6]

// --8<-- [start:v7]
extern "C" __global__ void HG_CLUSTER_DIMS __launch_bounds__(384, 1)
hopper_gemm_v7(const uint8_t* __restrict__ tmaps, __nv_bfloat16* __restrict__ C, int M, int N,
               int K) {
#if HG_SM90A
    hg::cluster_gemm<hg::STAGES_V6, hg::Epilogue::kTma>(tmaps, C, M, N, K);
#else
    __trap();
#endif
}
// --8<-- [end:v7]

// -------------------------------------------------------------------------------------------------
// v9: v5 with 16-byte stores of C (v10 launches the same kernel on a balanced grid)
// -------------------------------------------------------------------------------------------------

// --8<-- [start:v9]
extern "C" __global__ void HG_CLUSTER_DIMS __launch_bounds__(384, 1)
hopper_gemm_v9(const uint8_t* __restrict__ tmaps, __nv_bfloat16* __restrict__ C, int M, int N,
               int K) {
#if HG_SM90A
    hg::cluster_gemm<hg::STAGES_WS, hg::Epilogue::kRegs16>(tmaps, C, M, N, K);
#else
    __trap();
#endif
}
// --8<-- [end:v9]
