// FlashAttention's forward on Hopper, step 1: the minimum that is right (CUDA C for sm_90a).
//
// O = softmax(Q K^T * scale) V for bf16 Q, K, V of shape (B, H, S, D), D = 64 or 128, with an
// optional causal mask (query i sees keys j <= i), plus the row log-sum-exp
// L = log(sum_j exp(scale * q_i . k_j)) in fp32, natural log (what a backward recomputes P from).
//
// One block per (128 query rows, head, batch), three warpgroups:
//   warpgroup 0  the producer: one thread issues TMA, Q's tile once, then each tile of BLOCK_N keys
//                of K and of V through a ring of STAGES stages (full and empty mbarriers)
//   warpgroup 1, 2  the consumers, 64 query rows each: S = Q K^T with wgmma (both operands read
//                from shared memory, both K-major: rows of Q and of K are D-contiguous), the online
//                softmax on the fp32 accumulators in registers (row max, exp2, row sum), P rounded
//                to bf16 IN REGISTERS and O += P V with the register-A form of wgmma, V read from
//                shared memory as an MN-major operand (V is keys x D, D-contiguous: the transpose
//                immediate of B is set)
//
// Step 2 (PINGPONG, the kernels hopper_flash_fwd_pingpong_d*): the same blocks, the two consumers
// take turns at the tensor cores through two named barriers, so that one's softmax runs while the
// other's products do (FlashAttention-3's ping-pong scheduling), with three K / V stages.
//
// Step 3 (PINGPONG and OVERLAP, the kernels hopper_flash_fwd_overlap_d*): step 2's turns, and
// inside a turn the next tile's S = Q K^T issued before the previous tile's O += P V as two wgmma
// groups; wgmma.wait_group 1 lets the softmax run while P V is still on the tensor cores
// (FlashAttention-3's intra-warpgroup overlap).
//
// Step 4 (PINGPONG and LEAN, the kernels hopper_flash_fwd_lean_d*): step 2's turns with a softmax
// of fewer instructions per score: the row max on the raw scores, the scale folded into one FFMA
// per score before ex2.approx (one MUFU.EX2, no range fix-up), the mask only on the last tile, and
// O's rescale skipped when no row of the warp changed its maximum. Not bit-equal to steps 1-3.
//
// Step 5 (the kernels hopper_flash_fwd_persist_d*): step 4's consumers in a persistent grid, one
// block per SM looping over (128 query rows, head, batch) tiles, each block's next tile taken from
// a global counter (atomicAdd) as it frees up. The producer loads the next tile's Q as soon as
// both consumers have issued their last Q K^T of the current one (a q_empty mbarrier), so that
// tile's Q and first K / V tiles arrive while the consumers finish P V and write O; the K / V ring
// and its phases run on across tiles. Bit-equal to step 4.
//
// Shared memory holds every tile in the layout TMA's 128-byte swizzle writes: a row of D bf16 is
// D * 2 bytes, more than the swizzle's 128-byte span when D = 128, so each tile is D / 64 panels
// of 64 columns, one TMA box (64 columns x 128 rows, 16 KB) each.
//
// The tensor maps are built on the host (snippets/part6/hopper_attention.py) over Q, K and V seen
// as 3-D tensors (D, S, B*H), innermost first, and passed in global memory: 128 bytes each, Q, K,
// V. A box is one head's rows, so rows of a tile past S arrive as TMA's zeros, never as the next
// head's data: the keys among them are still masked to -inf (a zero key scores 0, not -inf), and
// the queries among them are never stored.
//
// Only sm_90a has wgmma and setmaxnreg: for any other target every kernel body is a trap, so the
// file still compiles for the other architectures the book builds for.

#include <cuda_bf16.h>
#include <stdint.h>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define HA_SM90A 1
#else
#define HA_SM90A 0
#endif

// --8<-- [start:constants]
namespace ha {
constexpr int BLOCK_M = 128;            // query rows per block: 64 per consumer warpgroup
constexpr int BLOCK_N = 128;            // keys per K / V tile (both head dims)
constexpr int STAGES = 2;               // K / V tiles in flight
constexpr int PINGPONG_STAGES = 3;      // step 2: V of tile t - 1 is held one turn longer
constexpr int PANEL_COLS = 64;          // bf16 columns of one 128-byte swizzled row: one TMA box
constexpr int ROW_BYTES = PANEL_COLS * 2;  // 128, the span of the 128B swizzle
constexpr int BOX_ROWS = 128;           // rows of every TMA box (Q, K and V)
constexpr int PANEL_BYTES = BOX_ROWS * ROW_BYTES;  // 16 KB: one box
constexpr int SWIZZLE_REPEAT = 1024;    // 8 rows x 128 bytes: tiles start on this boundary
constexpr int TMAP_BYTES = 128;         // one CUtensorMap
constexpr int WG_THREADS = 128;         // a warpgroup: four warps
constexpr int CONSUMERS = 2;
constexpr int THREADS = (1 + CONSUMERS) * WG_THREADS;  // 384
constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;  // 128 x 40 + 256 x 232 <= 65536
// Step 2 (ping-pong): the consumers take turns at the tensor cores through two named barriers,
// ids 1 and 2 (id 0 is __syncthreads'), each counting both consumer warpgroups' 256 threads
constexpr int PINGPONG_BAR = 1;         // consumer c waits for its turn on barrier PINGPONG_BAR + c
constexpr int PINGPONG_THREADS = CONSUMERS * WG_THREADS;  // 256: 128 arrive, 128 sync
constexpr int PINGPONG_FIRST = 0;       // the consumer whose turn comes first
// Step 3: a 4-byte word of shared memory per consumer thread, after the barriers (pin_softmax)
constexpr int OVERLAP_SCRATCH = CONSUMERS * WG_THREADS * 4;
// Step 5: one more mbarrier after the others, q_empty (the consumers' last reads of Q's tile),
// and the number of the block's current tile (4 bytes, padded to 8)
constexpr int PERSIST_SCRATCH = 16;

// Shared memory of a head dim: Q's tile, then NS x (K's tile, V's tile), then the barriers, then
// SCRATCH_BYTES of scratch (step 3's only)
template <int D, int NS = STAGES, int SCRATCH_BYTES = 0>
struct Smem {
    static constexpr int PANELS = D / PANEL_COLS;           // boxes per tile row block
    static constexpr int TILE_BYTES = PANELS * PANEL_BYTES;  // 128 rows x D bf16
    static constexpr int Q = 0;
    static constexpr int KV = TILE_BYTES;                    // stage s: K at KV + s * STAGE
    static constexpr int STAGE = 2 * TILE_BYTES;             // a K tile and a V tile
    static constexpr int BARRIERS = KV + NS * STAGE;        // q_full, full[NS], empty[NS]
    static constexpr int SCRATCH = BARRIERS + (1 + 2 * NS) * 8;
    static constexpr int BYTES = SCRATCH + SCRATCH_BYTES;
    static constexpr int LAUNCH_BYTES = BYTES + SWIZZLE_REPEAT;  // + slack to align the base
};

static_assert(BLOCK_M == CONSUMERS * 64 && BLOCK_M == BOX_ROWS && BLOCK_N == BOX_ROWS,
              "one 64-row wgmma block per consumer; every box is one tile's 128 rows");
static_assert(TMAP_BYTES == 128, "a CUtensorMap is 128 bytes: Q's, then K's, then V's");
static_assert(THREADS == 384, "__launch_bounds__(384, 1) below: a producer and two consumers");
static_assert(PINGPONG_BAR >= 1 && PINGPONG_BAR + CONSUMERS <= 16 && CONSUMERS == 2,
              "two named barriers of the 16, not barrier 0 (__syncthreads): one per consumer");
static_assert(PINGPONG_THREADS % 32 == 0, "a named barrier counts whole warps");
static_assert(PINGPONG_FIRST == 0 || PINGPONG_FIRST == 1, "the first turn is a consumer's");
static_assert(PRODUCER_REGS % 8 == 0 && CONSUMER_REGS % 8 == 0, "setmaxnreg takes multiples of 8");
static_assert(WG_THREADS * (PRODUCER_REGS + CONSUMERS * CONSUMER_REGS) <= 65536,
              "the three warpgroups' registers must fit the SM's 64K");
static_assert(Smem<128>::LAUNCH_BYTES <= 227 * 1024 && Smem<64>::LAUNCH_BYTES <= 227 * 1024,
              "Q and the K / V stages must fit 227 KB of shared memory");
static_assert(Smem<128, PINGPONG_STAGES>::LAUNCH_BYTES <= 227 * 1024,
              "step 2's Q and three K / V stages must fit 227 KB of shared memory");
static_assert(Smem<128, PINGPONG_STAGES, OVERLAP_SCRATCH>::LAUNCH_BYTES <= 227 * 1024,
              "step 3's scratch words must fit beside step 2's tiles");
static_assert(PERSIST_SCRATCH <= OVERLAP_SCRATCH, "step 5's q_empty fits where step 3's words do");
}  // namespace ha
// --8<-- [end:constants]

#if HA_SM90A
namespace ha {
constexpr float LN2 = 0.6931471805599453f;  // the epilogue turns log2 units into a natural log

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ uint32_t align_up(uint32_t addr, uint32_t to) {
    return (addr + to - 1) & ~(to - 1);
}

// --8<-- [start:descriptors]
// wgmma's shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): start address,
// leading dimension byte offset (LBO), stride dimension byte offset (SBO), all in 16-byte units,
// base offset 0 (every tile starts on a 1024-byte boundary), layout type 1 (128B) in bits 62-63.
__device__ __forceinline__ uint64_t desc_encode(uint32_t x) { return (x & 0x3FFFF) >> 4; }

__device__ __forceinline__ uint64_t make_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return desc_encode(addr) | desc_encode(lbo) << 16 | desc_encode(sbo) << 32 | 1ull << 62;
}

// Q and K, K-major (the GEMM's K is D): rows of 128 swizzled bytes, SBO = 1024 from one group of 8
// rows to the next; LBO is unused by a swizzled K-major layout (encoded as 16 bytes, i.e. 1). A
// step of 16 along D is +32 bytes inside the row, or the next panel every 64 columns.
__device__ __forceinline__ uint64_t desc_kmajor(uint32_t addr) {
    return make_desc(addr, 16, SWIZZLE_REPEAT);
}

// V as the B operand of O = P V is MN-major: its N (= D) is contiguous and its K (= keys) is the
// row index. CuTe's canonical MN-major 128B layout, ((64 elements, n), (8 rows, 2)) with strides
// ((1, LBO), (128 bytes, SBO)): LBO = the step from one 64-column panel of D to the next (a whole
// box, PANEL_BYTES; used only when D = 128), SBO = the step from 8 keys to the next 8 (1024 bytes).
// A step of 16 keys along K is + 16 rows = 2048 bytes of the start address.
__device__ __forceinline__ uint64_t desc_mnmajor(uint32_t addr) {
    return make_desc(addr, PANEL_BYTES, SWIZZLE_REPEAT);
}
// --8<-- [end:descriptors]

// --8<-- [start:mbarrier]
// mbarriers: a phase completes when its arrivals and its transaction bytes have all come in;
// try_wait.parity(p) returns once the phase of parity p has completed (the n-th use waits on
// parity n & 1).
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

// A phase that never completes is a bug: after WAIT_LIMIT_CLOCKS the wait traps, so a broken
// kernel fails its launch instead of hanging the process.
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
__device__ __forceinline__ void tmap_acquire(const void* tmap) {
    asm volatile("fence.proxy.tensormap::generic.acquire.sys [%0], 128;" ::"l"(tmap) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(tmap) : "memory");
}

// The box at (column col, row row, head plane) of a 3-D tensor map into shared memory at dst; its
// bytes count down the transaction count of bar. Rows past S arrive as zeros and still count.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void* tmap, uint32_t bar, int col,
                                            int row, int plane) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4, %5}], [%2];"
        ::"r"(dst), "l"(tmap), "r"(bar), "r"(col), "r"(row), "r"(plane)
        : "memory");
}

// One tile of 128 rows x D columns of head plane `plane` (= b * H + h): D / 64 boxes, one per
// 64-column panel.
template <int D>
__device__ __forceinline__ void load_tile(uint32_t dst, const void* tmap, uint32_t bar, int row,
                                          int plane) {
#pragma unroll
    for (int p = 0; p < D / PANEL_COLS; ++p)
        tma_load_3d(dst + p * PANEL_BYTES, tmap, bar, p * PANEL_COLS, row, plane);
}
// --8<-- [end:tma]

// --8<-- [start:wgmma]
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

// Keep the compiler from moving reads or writes of registers across a wgmma boundary.
template <int R>
__device__ __forceinline__ void fence_regs(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int R>
__device__ __forceinline__ void fence_regs(uint32_t (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+r"(d[i])::"memory");
}
// --8<-- [end:wgmma]

// --8<-- [start:wgmma_ss]
// S (64 x 128, fp32, 64 registers a thread) += A (64 x 16) * B, both read from shared memory
// through their descriptors, A K-major, scale 1; B K-major (TB = 0: B is 128 x 16 with the 16
// contiguous, the forward's K) or MN-major (TB = 1: 16 x 128, the 128 contiguous; the backward's).
template <int TB>
__device__ __forceinline__ void wgmma_ss_n128(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
        "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
        "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "
        "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, "
        "%60, %61, %62, %63"
        "}, %64, %65, p, 1, 1, 0, %67;\n}\n"
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
        : "l"(desc_a), "l"(desc_b), "n"(1), "n"(TB));
}

// --8<-- [end:wgmma_ss]

// --8<-- [start:wgmma_rs]
// O (64 x 64, fp32, 32 registers a thread) += P (64 x 16, bf16, from REGISTERS: 4 x b32 a
// thread) * V (16 x 64) from shared memory, MN-major: the last immediate (imm-trans-b) is 1. The
// register form has no imm-trans-a: A's fragment is given in the layout it must have.
__device__ __forceinline__ void wgmma_rs_m64n64k16(float (&d)[32], const uint32_t (&a)[4],
                                                  uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
        "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
        "%24, %25, %26, %27, %28, %29, %30, %31"
        "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
          "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
          "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
          "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
          "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(1));
}

// O (64 x 128, fp32, 64 registers a thread) += P (64 x 16, bf16, from REGISTERS: 4 x b32 a
// thread) * V (16 x 128) from shared memory, MN-major: the last immediate (imm-trans-b) is 1. The
// register form has no imm-trans-a: A's fragment is given in the layout it must have.
__device__ __forceinline__ void wgmma_rs_m64n128k16(float (&d)[64], const uint32_t (&a)[4],
                                                  uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
        "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
        "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "
        "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, "
        "%60, %61, %62, %63"
        "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
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
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(1));
}

// --8<-- [end:wgmma_rs]

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

template <int D>
__device__ __forceinline__ void wgmma_pv(float (&o)[D / 2], const uint32_t (&a)[4],
                                         uint64_t desc_v) {
    if constexpr (D == 64) wgmma_rs_m64n64k16(o, a, desc_v);
    else wgmma_rs_m64n128k16(o, a, desc_v);
}

// --8<-- [start:producer]
// The producer: one thread loads Q's tile once, then key tile t into stage t % NS, after the
// consumers have released that stage's previous tile (t - NS). g0 (step 5): the key tiles this
// block loaded for its earlier tiles, where the ring's count starts (0 otherwise).
template <int D, int NS = STAGES>
__device__ __forceinline__ void produce(uint32_t base, uint32_t q_full, uint32_t full,
                                        uint32_t empty, const uint8_t* tmaps, int q_row,
                                        int plane, int n_tiles, int g0 = 0) {
    using L = Smem<D, NS>;
    mbar_arrive_expect_tx(q_full, L::TILE_BYTES);
    load_tile<D>(base + L::Q, tmaps, q_full, q_row, plane);
    for (int t = 0; t < n_tiles; ++t) {
        const int g = g0 + t;
        const uint32_t s = g % NS, kv = base + L::KV + s * L::STAGE;
        if (g >= NS) mbar_wait(empty + 8 * s, (g / NS - 1) & 1);
        mbar_arrive_expect_tx(full + 8 * s, 2 * L::TILE_BYTES);  // K's tile and V's
        load_tile<D>(kv, tmaps + TMAP_BYTES, full + 8 * s, t * BLOCK_N, plane);
        load_tile<D>(kv + L::TILE_BYTES, tmaps + 2 * TMAP_BYTES, full + 8 * s, t * BLOCK_N,
                     plane);
    }
}
// --8<-- [end:producer]

// --8<-- [start:fragments]
// Which element of the 64 x N tile each accumulator register holds (PTX ISA, "Matrix fragments
// for wgmma .m64nNk16", the layout the GEMM's store_acc writes back): warp w of the warpgroup has
// rows 16w..16w+15; lane l has rows l/4 ("row 0") and l/4 + 8 ("row 1") of those, and in column
// group j (8 columns) the pair 8j + 2(l%4), 8j + 2(l%4) + 1:
//     d[4j + 0], d[4j + 1]  row 0        d[4j + 2], d[4j + 3]  row 1
// So a thread owns parts of exactly 2 rows, and the other parts of each row are in the 3 other
// lanes of its quad (the lanes with the same l/4): a row's max and sum are a thread's own values
// reduced, then two shuffles (xor 1, xor 2).
//
// The register A operand of a bf16 m64nNk16 wgmma (PTX ISA, the "A" register fragment; CuTe's
// ALayout_64x16 has the same strides as CLayout_64x16) has the same layout for its 16 columns:
// b32 register i of slice kk holds the bf16 pair of accumulator registers 8kk + 2i, 8kk + 2i + 1,
// low half the lower column. So P's fragment for keys 16kk..16kk+15 is accumulator registers
// 8kk..8kk+7 rounded pairwise to bf16: no shuffle, no shared memory.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low 16 bits) = lo
    return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffff, x, 1);
    return x + __shfl_xor_sync(0xffffffff, x, 2);
}
// --8<-- [end:fragments]

// --8<-- [start:softmax]
// The online softmax of one key tile, in log2 units: s = S * scale * log2(e), m = the running row
// max, l = the running row sum of 2^(s - m) (this thread's part of it; the quad's parts are
// summed once, at the end, since every lane of a quad rescales by the same factor). On return sc
// holds P = 2^(s - m_new) and o has been rescaled by 2^(m_old - m_new).
template <int D>
__device__ __forceinline__ void online_softmax(float (&sc)[BLOCK_N / 2], float (&o)[D / 2],
                                               float (&m)[2], float (&l)[2], float scale_log2,
                                               bool mask, int key0, int q0, int S, bool causal) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int i = 0; i < BLOCK_N / 2; ++i) {
        sc[i] *= scale_log2;
        if (mask) {  // the last tile: keys past S, and keys right of the diagonal
            const int key = key0 + 8 * (i / 4) + 2 * (lane % 4) + (i & 1);
            const int q = q0 + 8 * ((i / 2) & 1);
            if (key >= S || (causal && key > q)) sc[i] = -INFINITY;
        }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // row 0 and row 1 of this thread
        float mx = m[h];
#pragma unroll
        for (int j = 0; j < BLOCK_N / 8; ++j) mx = fmaxf(mx, fmaxf(sc[4 * j + 2 * h],
                                                                   sc[4 * j + 2 * h + 1]));
        mx = quad_max(mx);
        // a row with every score so far masked keeps m = -inf: subtract 0 instead (its p are 0)
        const float m_use = mx == -INFINITY ? 0.0f : mx;
        const float alpha = exp2f(m[h] - m_use);  // 0 on the first tile (m = -inf)
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < BLOCK_N / 8; ++j) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float& x = sc[4 * j + 2 * h + e];
                x = exp2f(x - m_use);
                sum += x;
            }
        }
        l[h] = l[h] * alpha + sum;
        m[h] = mx;
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
            o[4 * j + 2 * h] *= alpha;
            o[4 * j + 2 * h + 1] *= alpha;
        }
    }
}
// --8<-- [end:softmax]

// --8<-- [start:softmax_split]
// Step 3's online softmax, in two parts: softmax_scores is online_softmax without O's rescale (the
// same statements in the same order, less the last loop; a test compares the two texts), and
// alpha = 2^(m_old - m_new) is returned for rescale_o, which applies it once the P V product that
// is still reading O has completed. online_softmax itself is left as it was, so that steps 1 and 2
// compile to the same instructions as before step 3 existed.
__device__ __forceinline__ void softmax_scores(float (&sc)[BLOCK_N / 2], float (&m)[2],
                                               float (&l)[2], float (&alpha)[2],
                                               float scale_log2, bool mask, int key0, int q0,
                                               int S, bool causal) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int i = 0; i < BLOCK_N / 2; ++i) {
        sc[i] *= scale_log2;
        if (mask) {  // the last tile: keys past S, and keys right of the diagonal
            const int key = key0 + 8 * (i / 4) + 2 * (lane % 4) + (i & 1);
            const int q = q0 + 8 * ((i / 2) & 1);
            if (key >= S || (causal && key > q)) sc[i] = -INFINITY;
        }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // row 0 and row 1 of this thread
        float mx = m[h];
#pragma unroll
        for (int j = 0; j < BLOCK_N / 8; ++j) mx = fmaxf(mx, fmaxf(sc[4 * j + 2 * h],
                                                                   sc[4 * j + 2 * h + 1]));
        mx = quad_max(mx);
        // a row with every score so far masked keeps m = -inf: subtract 0 instead (its p are 0)
        const float m_use = mx == -INFINITY ? 0.0f : mx;
        alpha[h] = exp2f(m[h] - m_use);  // 0 on the first tile (m = -inf)
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < BLOCK_N / 8; ++j) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float& x = sc[4 * j + 2 * h + e];
                x = exp2f(x - m_use);
                sum += x;
            }
        }
        l[h] = l[h] * alpha[h] + sum;
        m[h] = mx;
    }
}

// O *= alpha: online_softmax's last loop, row h's registers by alpha[h]
template <int D>
__device__ __forceinline__ void rescale_o(float (&o)[D / 2], const float (&alpha)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
            o[4 * j + 2 * h] *= alpha[h];
            o[4 * j + 2 * h + 1] *= alpha[h];
        }
    }
}
// --8<-- [end:softmax_split]

// --8<-- [start:lean_softmax]
// Step 4's online softmax: online_softmax's values up to rounding, in fewer instructions per score.
// exp2f compiles to a range fix-up around MUFU.EX2 (FSETP, two predicated FMULs: seen in this
// file's SASS, nvcc 13.0); ex2.approx.ftz is the MUFU.EX2 alone. Its error (PTX ISA: max
// relative error about 2^-22) is far below the bf16 rounding that P gets before P V.
__device__ __forceinline__ float ex2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// The last tile's mask, on raw scores: keys past S and, causal, keys right of the diagonal, i.e.
// key >= min(S, q + 1). sc[4j + 2h + e] is key col0 + 8j + e of row h: one compare with a
// constant and one select per score against a column limit per row.
__device__ __forceinline__ void mask_raw_scores(float (&sc)[BLOCK_N / 2], int key0, int q0, int S,
                                                bool causal) {
    const int lane = threadIdx.x % 32;
    const int col0 = key0 + 2 * (lane % 4);  // the key of sc[0]
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int q = q0 + 8 * h;
        const int limit = (causal ? min(S, q + 1) : S) - col0;  // columns >= limit are masked
#pragma unroll
        for (int j = 0; j < BLOCK_N / 8; ++j) {
#pragma unroll
            for (int e = 0; e < 2; ++e)
                if (8 * j + e >= limit) sc[4 * j + 2 * h + e] = -INFINITY;
        }
    }
}

// MASK: the last tile (keys past S, the causal diagonal); every other tile runs without the mask's
// instructions. The max is taken on the raw scores (scale_log2 >= 0: the host negates K for a
// negative scale; rounding is monotonic, so m * scale_log2 is online_softmax's m exactly); then
// one FFMA and one MUFU.EX2 per score, p = 2^(s * scale_log2 - m * scale_log2), where
// online_softmax had FMUL, FADD and exp2f. alpha's argument is online_softmax's exactly
// (__fmul_rn: no FFMA contraction): 0, so alpha = 1.0f exactly, when the max did not move, and
// O's rescale, D / 2 FMULs a thread, is skipped when that holds for every row of the warp
// (multiplying by 1.0f changes nothing). On return m holds the raw-score max: the caller turns
// it into log2 units for write_rows.
template <int D, bool MASK>
__device__ __forceinline__ void lean_softmax(float (&sc)[BLOCK_N / 2], float (&o)[D / 2],
                                             float (&m)[2], float (&l)[2], float scale_log2,
                                             int key0, int q0, int S, bool causal) {
    if constexpr (MASK) mask_raw_scores(sc, key0, q0, S, causal);
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // row 0 and row 1 of this thread
        float mx = m[h];
#pragma unroll
        for (int j = 0; j < BLOCK_N / 8; ++j) mx = fmaxf(mx, fmaxf(sc[4 * j + 2 * h],
                                                                   sc[4 * j + 2 * h + 1]));
        mx = quad_max(mx);
        // a row with every score so far masked keeps m = -inf: subtract 0 instead (its p are 0)
        const float neg_m = mx == -INFINITY ? 0.0f : -__fmul_rn(mx, scale_log2);
        // 0 on the first tile (m = -inf; the select keeps -inf * 0 from a scale of 0 out)
        alpha[h] = m[h] == -INFINITY ? 0.0f : ex2_approx(__fmul_rn(m[h], scale_log2) + neg_m);
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < BLOCK_N / 8; ++j) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float& x = sc[4 * j + 2 * h + e];
                const float p = ex2_approx(fmaf(x, scale_log2, neg_m));
                if constexpr (MASK) x = x == -INFINITY ? 0.0f : p;  // -inf * 0 when scale is 0
                else x = p;
                sum += x;
            }
        }
        l[h] = l[h] * alpha[h] + sum;
        m[h] = mx;
    }
    if (__any_sync(0xffffffff, alpha[0] != 1.0f || alpha[1] != 1.0f)) rescale_o<D>(o, alpha);
}

// The softmax of one tile in step 2's loop: online_softmax (step 2), or step 4's, with the mask
// compiled into the last tile's copy only
template <int D, bool LEAN>
__device__ __forceinline__ void tile_softmax(float (&sc)[BLOCK_N / 2], float (&o)[D / 2],
                                             float (&m)[2], float (&l)[2], float scale_log2,
                                             bool last, int key0, int q0, int S, bool causal) {
    if constexpr (!LEAN)
        online_softmax<D>(sc, o, m, l, scale_log2, last, key0, q0, S, causal);
    else if (last)
        lean_softmax<D, true>(sc, o, m, l, scale_log2, key0, q0, S, causal);
    else
        lean_softmax<D, false>(sc, o, m, l, scale_log2, key0, q0, S, causal);
}
// --8<-- [end:lean_softmax]

// --8<-- [start:products]
// S = Q K^T issued (not waited for): D / 16 wgmmas of 16 along D, each +32 bytes in the row or the
// next panel of both tiles; sc must hold zeros.
template <int D>
__device__ __forceinline__ void qk_issue(float (&sc)[BLOCK_N / 2], uint32_t q_tile,
                                         uint32_t k_tile) {
    wgmma_fence();
    fence_regs(sc);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        const uint32_t off = (kk / 4) * PANEL_BYTES + (kk % 4) * 32;
        wgmma_ss_n128<0>(sc, desc_kmajor(q_tile + off), desc_kmajor(k_tile + off));
    }
    wgmma_commit();
}

// O += P V issued (not waited for): BLOCK_N / 16 wgmmas of 16 keys, P's bf16 pairs from registers,
// V's start address + 16 rows (2048 bytes) each.
template <int D>
__device__ __forceinline__ void pv_issue(float (&o)[D / 2], uint32_t (&p)[BLOCK_N / 4],
                                         uint32_t v_tile) {
    wgmma_fence();
    fence_regs(o);
    fence_regs(p);
#pragma unroll
    for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
        const uint32_t a[4] = {p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]};
        wgmma_pv<D>(o, a, desc_mnmajor(v_tile + kk * 16 * ROW_BYTES));
    }
    wgmma_commit();
}

// P to bf16 in registers: the A fragments of the PV wgmmas
__device__ __forceinline__ void pack_p(uint32_t (&p)[BLOCK_N / 4], const float (&sc)[BLOCK_N / 2]) {
#pragma unroll
    for (int i = 0; i < BLOCK_N / 4; ++i) p[i] = pack_bf16(sc[2 * i], sc[2 * i + 1]);
}
// --8<-- [end:products]

// --8<-- [start:epilogue]
// O = O / l and L = ln(sum) = (m + log2(l)) * ln 2, for this thread's two rows inside S
template <int D>
__device__ __forceinline__ void write_rows(const float (&o)[D / 2], const float (&m)[2],
                                           const float (&l)[2], int q0, int S, __nv_bfloat16* O,
                                           float* Lse, size_t bh_row) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int q = q0 + 8 * h;
        const float sum = quad_sum(l[h]);
        const float inv = 1.0f / sum;
        if (q >= S) continue;
        __nv_bfloat16* row = O + (bh_row + q) * D;
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
            *reinterpret_cast<__nv_bfloat162*>(row + 8 * j + 2 * (lane % 4)) =
                __floats2bfloat162_rn(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
        }
        if (lane % 4 == 0) Lse[bh_row + q] = (m[h] + log2f(sum)) * LN2;
    }
}
// --8<-- [end:epilogue]

// --8<-- [start:consumer]
// A consumer warpgroup (c = 0 or 1): query rows 64c..64c+63 of the block's 128.
template <int D>
__device__ __forceinline__ void consume(uint32_t base, uint32_t q_full, uint32_t full,
                                        uint32_t empty, int c, int n_tiles, int S, int m0,
                                        bool causal, float scale_log2, __nv_bfloat16* O,
                                        float* Lse, size_t bh_row) {
    using L = Smem<D>;
    const int t_wg = threadIdx.x % WG_THREADS, warp = t_wg / 32, lane = t_wg % 32;
    const int q0 = m0 + 64 * c + 16 * warp + lane / 4;  // this thread's row 0; row 1 is q0 + 8
    float o[D / 2], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
    mbar_wait(q_full, 0);
    const uint32_t q_tile = base + L::Q + c * 64 * ROW_BYTES;  // this consumer's 64 rows of Q

    for (int t = 0; t < n_tiles; ++t) {
        const uint32_t s = t % STAGES, k_tile = base + L::KV + s * L::STAGE;
        const uint32_t v_tile = k_tile + L::TILE_BYTES;
        mbar_wait(full + 8 * s, (t / STAGES) & 1);

        float sc[BLOCK_N / 2];
#pragma unroll
        for (int i = 0; i < BLOCK_N / 2; ++i) sc[i] = 0.0f;
        qk_issue<D>(sc, q_tile, k_tile);
        wgmma_wait<0>();
        fence_regs(sc);

        online_softmax<D>(sc, o, m, l, scale_log2, t == n_tiles - 1, t * BLOCK_N, q0, S, causal);

        uint32_t p[BLOCK_N / 4];
        pack_p(p, sc);
        pv_issue<D>(o, p, v_tile);
        wgmma_wait<0>();
        fence_regs(o);
        fence_regs(p);
        if (lane == 0) mbar_arrive(empty + 8 * s);  // this warp is done with stage s
    }
    write_rows<D>(o, m, l, q0, S, O, Lse, bh_row);
}
// --8<-- [end:consumer]

// --8<-- [start:turns]
// The turn of consumer c: bar.sync on its own barrier, which completes when the other consumer's
// 128 threads have arrived on it. The barrier ids are immediates (c is a template argument at the
// call), so the SASS names them.
template <int C>
__device__ __forceinline__ void turn_wait() {
    asm volatile("bar.sync %0, %1;" ::"n"(PINGPONG_BAR + C), "n"(PINGPONG_THREADS) : "memory");
}
// Consumer c hands the turn to the other: bar.arrive, which does not wait.
template <int C>
__device__ __forceinline__ void turn_pass() {
    asm volatile("bar.arrive %0, %1;" ::"n"(PINGPONG_BAR + 1 - C), "n"(PINGPONG_THREADS)
                 : "memory");
}
__device__ __forceinline__ void turn_wait(int c) {
    if (c == 0) turn_wait<0>();
    else turn_wait<1>();
}
__device__ __forceinline__ void turn_pass(int c) {
    if (c == 0) turn_pass<0>();
    else turn_pass<1>();
}
// --8<-- [end:turns]

// --8<-- [start:pingpong]
// Step 2: consumer c's loop with turns. Turn t (t = 0..n_tiles) issues O += P_{t-1} V_{t-1}
// (t >= 1) and then S_t = Q K_t^T (t < n_tiles), and hands the turn on once they are issued,
// before it waits for them: the other consumer's products are issued behind these, and run on the
// tensor cores while this consumer, its products done, runs the softmax of tile t. Every operation
// on O, m and l is v1's, in v1's order (O is rescaled by tile t's alpha after P_{t-1} V_{t-1} is
// added, as in v1), so the result is v1's; only the issue order moves.
//
// Both consumers take n_tiles + 1 turns (n_tiles is the block's, the same for both: the causal
// diagonal is masked per row on the last tile, never skipped for one consumer), alternating from
// PINGPONG_FIRST. The other consumer arrives once before its loop (the first turn) and not after
// its last turn, so every arrive meets a sync and no barrier is left with a pending arrival.
//
// V of tile t - 1 is read in turn t, a turn later than in v1, so step 2 runs PINGPONG_STAGES = 3
// stages: the load of tile t + 1 waits for the release of tile t - 2 (in turn t - 1), not of tile
// t - 1 (in turn t, one softmax before tile t + 1 is needed).
//
// Step 5 (PERSIST) runs this for each of its block's tiles: g0 is where the K / V ring's count
// starts (the key tiles of the block's earlier tiles), j the tile's number in the block (the
// parity of q_full), and each warp arrives on q_empty once its last Q K^T is done.
template <int D, bool LEAN = false, bool PERSIST = false>
__device__ __forceinline__ void consume_pingpong(uint32_t base, uint32_t q_full, uint32_t full,
                                                 uint32_t empty, int c, int n_tiles, int S,
                                                 int m0, bool causal, float scale_log2,
                                                 __nv_bfloat16* O, float* Lse, size_t bh_row,
                                                 int g0 = 0, int j = 0, uint32_t q_empty = 0) {
    using L = Smem<D, PINGPONG_STAGES>;
    const int t_wg = threadIdx.x % WG_THREADS, warp = t_wg / 32, lane = t_wg % 32;
    const int q0 = m0 + 64 * c + 16 * warp + lane / 4;  // this thread's row 0; row 1 is q0 + 8
    float o[D / 2], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
    uint32_t p[BLOCK_N / 4];  // P of tile t - 1: the A operand of turn t's P V
    mbar_wait(q_full, j & 1);
    const uint32_t q_tile = base + L::Q + c * 64 * ROW_BYTES;  // this consumer's 64 rows of Q
    if (c != PINGPONG_FIRST) turn_pass(c);  // the first turn is the other consumer's

    // Turn 0: S_0 only
    float sc[BLOCK_N / 2];
#pragma unroll
    for (int i = 0; i < BLOCK_N / 2; ++i) sc[i] = 0.0f;
    const uint32_t s0 = g0 % PINGPONG_STAGES;
    mbar_wait(full + 8 * s0, (g0 / PINGPONG_STAGES) & 1);  // before the turn: a turn only issues
    turn_wait(c);
    qk_issue<D>(sc, q_tile, base + L::KV + s0 * L::STAGE);
    turn_pass(c);  // n_tiles >= 1: never the last turn
    wgmma_wait<0>();
    fence_regs(sc);
    if constexpr (PERSIST) {
        if (n_tiles == 1 && lane == 0) mbar_arrive(q_empty);  // this warp's last read of Q
    }
    tile_softmax<D, LEAN>(sc, o, m, l, scale_log2, n_tiles == 1, 0, q0, S, causal);
    pack_p(p, sc);

    // Turns 1 .. n_tiles - 1: P_{t-1} V_{t-1}, then S_t
    for (int t = 1; t < n_tiles; ++t) {
        const int g = g0 + t;
        const uint32_t s = g % PINGPONG_STAGES, k_tile = base + L::KV + s * L::STAGE;
        const uint32_t s_prev = (g - 1) % PINGPONG_STAGES;
        const uint32_t v_prev = base + L::KV + s_prev * L::STAGE + L::TILE_BYTES;
#pragma unroll
        for (int i = 0; i < BLOCK_N / 2; ++i) sc[i] = 0.0f;
        mbar_wait(full + 8 * s, (g / PINGPONG_STAGES) & 1);
        turn_wait(c);
        pv_issue<D>(o, p, v_prev);
        qk_issue<D>(sc, q_tile, k_tile);
        turn_pass(c);
        wgmma_wait<0>();
        fence_regs(o);
        fence_regs(p);
        fence_regs(sc);
        if (lane == 0) mbar_arrive(empty + 8 * s_prev);  // this warp is done with tile t - 1
        if constexpr (PERSIST) {
            if (t == n_tiles - 1 && lane == 0) mbar_arrive(q_empty);  // its last read of Q
        }
        tile_softmax<D, LEAN>(sc, o, m, l, scale_log2, t == n_tiles - 1, t * BLOCK_N, q0, S,
                              causal);
        pack_p(p, sc);
    }

    // Turn n_tiles: P V of the last tile; the last consumer hands no turn on
    const uint32_t s_last = (g0 + n_tiles - 1) % PINGPONG_STAGES;
    turn_wait(c);
    pv_issue<D>(o, p, base + L::KV + s_last * L::STAGE + L::TILE_BYTES);
    if (c == PINGPONG_FIRST) turn_pass(c);
    wgmma_wait<0>();
    fence_regs(o);
    fence_regs(p);
    if (lane == 0) mbar_arrive(empty + 8 * s_last);
    if constexpr (LEAN) {  // step 4 kept the raw-score max: log2 units, as write_rows takes it
        m[0] = __fmul_rn(m[0], scale_log2);
        m[1] = __fmul_rn(m[1], scale_log2);
    }
    write_rows<D>(o, m, l, q0, S, O, Lse, bh_row);
}
// --8<-- [end:pingpong]

// --8<-- [start:overlap]
// Step 3: step 2's turns, and inside a turn the two products in two wgmma groups, S_t = Q K_t^T
// first, O += P_{t-1} V_{t-1} second (FlashAttention-3's intra-warpgroup overlap of the softmax
// with the GEMMs, section 3.2 of its paper). wgmma.wait_group 1 waits for the older group only:
// the softmax of tile t runs while P_{t-1} V_{t-1} is still on the tensor cores. O's rescale by
// tile t's alpha waits for wait_group 0 (the product is writing O), and so does P_t's packing into
// p (the product is reading p's registers). O still sees v1's sequence: + P_{t-1} V_{t-1}, then
// * alpha_t, then + P_t V_t, so the result is v1's bit for bit.
//
// Turn 0 and turn n_tiles are step 2's. A stage holds K_t and V_t; it is released after the
// wait_group 0 of turn t + 1, when P_t V_t (the last reader of the stage, after S_t) is complete.
// Live across the softmax: S_t (fp32, BLOCK_N / 2 registers), P_{t-1} (bf16 pairs, BLOCK_N / 4)
// and O (D / 2), all in one thread's registers; ptxas reports no spill (the compile test).
//
// pin_softmax: ptxas schedules register arithmetic freely across wgmma.wait_group (the wait has no
// register operands), and without the pin it placed the WARPGROUP.DEPBAR of wait_group 0 before
// the row maxima and the exp2s (seen in this file's SASS, nvcc 13.0): the softmax ran after P V,
// as in step 2. A shared-memory store stays on its side of the wait, so a store of a value that
// depends on every exp2 of the tile (the row sums) keeps the whole softmax above the wait. It
// stores to this thread's own word of OVERLAP_SCRATCH, which nothing reads. The SASS test checks
// that every MUFU.EX2 of the softmax lies between the two waits.
__device__ __forceinline__ void pin_softmax(uint32_t addr, float x) {
    asm volatile("st.shared.f32 [%0], %1;" ::"r"(addr), "f"(x) : "memory");
}

template <int D>
__device__ __forceinline__ void consume_overlap(uint32_t base, uint32_t q_full, uint32_t full,
                                                uint32_t empty, int c, int n_tiles, int S,
                                                int m0, bool causal, float scale_log2,
                                                __nv_bfloat16* O, float* Lse, size_t bh_row) {
    using L = Smem<D, PINGPONG_STAGES, OVERLAP_SCRATCH>;
    const int t_wg = threadIdx.x % WG_THREADS, warp = t_wg / 32, lane = t_wg % 32;
    const int q0 = m0 + 64 * c + 16 * warp + lane / 4;  // this thread's row 0; row 1 is q0 + 8
    float o[D / 2], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
    uint32_t p[BLOCK_N / 4];  // P of tile t - 1: the A operand of turn t's P V
    mbar_wait(q_full, 0);
    const uint32_t q_tile = base + L::Q + c * 64 * ROW_BYTES;  // this consumer's 64 rows of Q
    const uint32_t pin = base + L::SCRATCH + 4 * (c * WG_THREADS + t_wg);  // this thread's word
    if (c != PINGPONG_FIRST) turn_pass(c);  // the first turn is the other consumer's

    // Turn 0 (the prologue): S_0 and its softmax
    float sc[BLOCK_N / 2];
#pragma unroll
    for (int i = 0; i < BLOCK_N / 2; ++i) sc[i] = 0.0f;
    mbar_wait(full, 0);
    turn_wait(c);
    qk_issue<D>(sc, q_tile, base + L::KV);
    turn_pass(c);  // n_tiles >= 1: never the last turn
    wgmma_wait<0>();
    fence_regs(sc);
    online_softmax<D>(sc, o, m, l, scale_log2, n_tiles == 1, 0, q0, S, causal);
    pack_p(p, sc);

    // Turns 1 .. n_tiles - 1: S_t, then P_{t-1} V_{t-1}; the softmax of t under P_{t-1} V_{t-1}
    for (int t = 1; t < n_tiles; ++t) {
        const uint32_t s = t % PINGPONG_STAGES, k_tile = base + L::KV + s * L::STAGE;
        const uint32_t s_prev = (t - 1) % PINGPONG_STAGES;
        const uint32_t v_prev = base + L::KV + s_prev * L::STAGE + L::TILE_BYTES;
#pragma unroll
        for (int i = 0; i < BLOCK_N / 2; ++i) sc[i] = 0.0f;
        mbar_wait(full + 8 * s, (t / PINGPONG_STAGES) & 1);
        turn_wait(c);
        qk_issue<D>(sc, q_tile, k_tile);  // group 1: S_t
        pv_issue<D>(o, p, v_prev);        // group 2: O += P_{t-1} V_{t-1}
        turn_pass(c);
        wgmma_wait<1>();  // group 1 is complete; group 2 may still be running
        fence_regs(sc);
        float alpha[2];
        softmax_scores(sc, m, l, alpha, scale_log2, t == n_tiles - 1, t * BLOCK_N, q0, S, causal);
        pin_softmax(pin, l[0] + l[1]);  // keeps ptxas from moving the wait above the softmax
        wgmma_wait<0>();  // group 2 is complete: O and p are this thread's again
        fence_regs(o);
        fence_regs(p);
        if (lane == 0) mbar_arrive(empty + 8 * s_prev);  // this warp is done with tile t - 1
        rescale_o<D>(o, alpha);
        pack_p(p, sc);
    }

    // Turn n_tiles (the epilogue): P V of the last tile; the last consumer hands no turn on
    const uint32_t s_last = (n_tiles - 1) % PINGPONG_STAGES;
    turn_wait(c);
    pv_issue<D>(o, p, base + L::KV + s_last * L::STAGE + L::TILE_BYTES);
    if (c == PINGPONG_FIRST) turn_pass(c);
    wgmma_wait<0>();
    fence_regs(o);
    fence_regs(p);
    if (lane == 0) mbar_arrive(empty + 8 * s_last);
    write_rows<D>(o, m, l, q0, S, O, Lse, bh_row);
}
// --8<-- [end:overlap]

// Thread 0's set-up of a block: the first n_maps tensor maps fetched, a one-shot barrier `first`
// (Q's tile; the backward's K and V) and a ring of NS stages (full: the producer's expect_tx;
// empty: every consumer warp). The caller inits any other barrier, then mbar_fence_init().
template <int NS>
__device__ __forceinline__ void init_block(const uint8_t* tmaps, int n_maps, uint32_t first,
                                           uint32_t full, uint32_t empty) {
    for (int i = 0; i < n_maps; ++i) tmap_acquire(tmaps + i * TMAP_BYTES);
    mbar_init(first, 1);
    for (int s = 0; s < NS; ++s) {
        mbar_init(full + 8 * s, 1);                            // the producer's expect_tx
        mbar_init(empty + 8 * s, CONSUMERS * WG_THREADS / 32);  // every consumer warp
    }
}

// --8<-- [start:kernel]
// Grid (ceil(S / 128), H, B). tmaps: Q's, K's and V's tensor maps, 128 bytes each. O is (B, H, S,
// D) bf16, Lse (B, H, S) fp32; scale_log2 = scale * log2(e). PINGPONG: step 2's consumers
// (consume_pingpong) instead of step 1's; PINGPONG and OVERLAP: step 3's (consume_overlap);
// PINGPONG and LEAN: step 4's (consume_pingpong with lean_softmax); everything else is shared.
template <int D, bool PINGPONG = false, bool OVERLAP = false, bool LEAN = false>
__device__ __forceinline__ void flash_fwd(const uint8_t* tmaps, __nv_bfloat16* O, float* Lse,
                                          int S, float scale_log2, int causal) {
    static_assert(PINGPONG || !OVERLAP, "step 3 overlaps inside step 2's turns");
    static_assert(PINGPONG || !LEAN, "step 4 is step 2's turns with a leaner softmax");
    static_assert(!(OVERLAP && LEAN), "step 4 is built on step 2, not step 3");
    constexpr int NS = PINGPONG ? PINGPONG_STAGES : STAGES;  // K / V stages
    using L = Smem<D, NS, OVERLAP ? OVERLAP_SCRATCH : 0>;
    extern __shared__ uint8_t smem[];
    const uint32_t base = align_up(smem_u32(smem), SWIZZLE_REPEAT);
    const uint32_t q_full = base + L::BARRIERS, full = q_full + 8, empty = full + 8 * NS;
    const int m0 = blockIdx.x * BLOCK_M;
    const int plane = blockIdx.z * gridDim.y + blockIdx.y;  // b * H + h: the tensor maps' 3rd dim
    const size_t bh_row = size_t(plane) * S;                // row of (b, h, 0) in O and Lse
    const int key_tiles = (S + BLOCK_N - 1) / BLOCK_N;
    // causal: key tiles past the diagonal are skipped (BLOCK_M == BLOCK_N: tile x is the last)
    const int n_tiles = causal ? min(key_tiles, int(blockIdx.x) + 1) : key_tiles;

    if (threadIdx.x == 0) {
        init_block<NS>(tmaps, 3, q_full, full, empty);
        mbar_fence_init();
    }
    __syncthreads();

    const int wg = threadIdx.x / WG_THREADS;
    if (wg == 0) {
        regs_dec<PRODUCER_REGS>();
        if (threadIdx.x == 0)
            produce<D, NS>(base, q_full, full, empty, tmaps, m0, plane, n_tiles);
    } else {
        regs_inc<CONSUMER_REGS>();
        if constexpr (OVERLAP)
            consume_overlap<D>(base, q_full, full, empty, wg - 1, n_tiles, S, m0, causal != 0,
                               scale_log2, O, Lse, bh_row);
        else if constexpr (PINGPONG)
            consume_pingpong<D, LEAN>(base, q_full, full, empty, wg - 1, n_tiles, S, m0,
                                      causal != 0, scale_log2, O, Lse, bh_row);
        else
            consume<D>(base, q_full, full, empty, wg - 1, n_tiles, S, m0, causal != 0,
                       scale_log2, O, Lse, bh_row);
    }
}
// --8<-- [start:persist]
// Step 5's work list: tile w of the m_blocks x planes tiles is query block w % m_blocks of plane
// (b * H + h) w / m_blocks, so the blocks that run at once share a few heads' K and V in L2, as
// the grid of steps 1-4 does; with the causal mask the longest query block of a plane comes first.
// Returns the tile's number of key tiles.
__device__ __forceinline__ int work_tile(int w, int m_blocks, int key_tiles, bool causal, int& mb,
                                         int& plane) {
    const int r = w % m_blocks;
    mb = causal ? m_blocks - 1 - r : r;
    plane = w / m_blocks;
    return causal ? min(key_tiles, mb + 1) : key_tiles;
}

// Grid (min(tiles, SMs)): block i starts with tile i; every later tile goes to the block that asks
// first, gridDim.x + atomicAdd(next, 1) (next: a zeroed int per launch), so a block that drew short
// causal tiles takes more of them. planes = B * H. The producer writes the tile's number (-1: no
// more) to shared memory before it arrives on q_full; the consumers read it after their wait.
template <int D>
__device__ __forceinline__ void flash_fwd_persistent(const uint8_t* tmaps, __nv_bfloat16* O,
                                                     float* Lse, int S, float scale_log2,
                                                     int causal, int planes, int* next) {
    constexpr int NS = PINGPONG_STAGES;
    using L = Smem<D, NS, PERSIST_SCRATCH>;
    extern __shared__ uint8_t smem[];
    const uint32_t base = align_up(smem_u32(smem), SWIZZLE_REPEAT);
    const uint32_t q_full = base + L::BARRIERS, full = q_full + 8, empty = full + 8 * NS;
    const uint32_t q_empty = base + L::SCRATCH, tile_slot = q_empty + 8;
    const int m_blocks = (S + BLOCK_M - 1) / BLOCK_M, key_tiles = (S + BLOCK_N - 1) / BLOCK_N;
    const int n_work = m_blocks * planes;

    if (threadIdx.x == 0) {
        init_block<NS>(tmaps, 3, q_full, full, empty);
        mbar_init(q_empty, CONSUMERS * WG_THREADS / 32);  // every consumer warp, once a tile
        mbar_fence_init();
    }
    __syncthreads();

    const int wg = threadIdx.x / WG_THREADS;
    int g = 0;  // key tiles this block has had so far: the K / V ring's count
    if (wg == 0) {
        regs_dec<PRODUCER_REGS>();
        if (threadIdx.x != 0) return;
        int w = blockIdx.x;
        for (int j = 0;; ++j) {
            if (j > 0) mbar_wait(q_empty, (j - 1) & 1);  // Q's tile and the slot are free again
            const int tile = w < n_work ? w : -1;
            asm volatile("st.shared.b32 [%0], %1;" ::"r"(tile_slot), "r"(tile) : "memory");
            if (tile < 0) {
                mbar_arrive(q_full);  // the last phase: no bytes, the consumers stop
                break;
            }
            w = gridDim.x + atomicAdd(next, 1);  // the next tile, asked for before it is needed
            int mb, plane;
            const int n_tiles = work_tile(tile, m_blocks, key_tiles, causal != 0, mb, plane);
            produce<D, NS>(base, q_full, full, empty, tmaps, mb * BLOCK_M, plane, n_tiles, g);
            g += n_tiles;
        }
    } else {
        regs_inc<CONSUMER_REGS>();
        for (int j = 0;; ++j) {
            mbar_wait(q_full, j & 1);
            int tile;
            asm volatile("ld.shared.b32 %0, [%1];" : "=r"(tile) : "r"(tile_slot) : "memory");
            if (tile < 0) break;
            int mb, plane;
            const int n_tiles = work_tile(tile, m_blocks, key_tiles, causal != 0, mb, plane);
            consume_pingpong<D, true, true>(base, q_full, full, empty, wg - 1, n_tiles, S,
                                            mb * BLOCK_M, causal != 0, scale_log2, O, Lse,
                                            size_t(plane) * S, g, j, q_empty);
            g += n_tiles;
        }
    }
}
// --8<-- [end:persist]
}  // namespace ha
#endif  // HA_SM90A

extern "C" __global__ void __launch_bounds__(384, 1)
hopper_flash_fwd_d64(const uint8_t* __restrict__ tmaps, __nv_bfloat16* __restrict__ O,
                     float* __restrict__ Lse, int S, float scale_log2, int causal) {
#if HA_SM90A
    ha::flash_fwd<64>(tmaps, O, Lse, S, scale_log2, causal);
#else
    __trap();
#endif
}

extern "C" __global__ void __launch_bounds__(384, 1)
hopper_flash_fwd_d128(const uint8_t* __restrict__ tmaps, __nv_bfloat16* __restrict__ O,
                      float* __restrict__ Lse, int S, float scale_log2, int causal) {
#if HA_SM90A
    ha::flash_fwd<128>(tmaps, O, Lse, S, scale_log2, causal);
#else
    __trap();
#endif
}

// Step 2: the same kernel with ping-pong consumers
extern "C" __global__ void __launch_bounds__(384, 1)
hopper_flash_fwd_pingpong_d64(const uint8_t* __restrict__ tmaps, __nv_bfloat16* __restrict__ O,
                              float* __restrict__ Lse, int S, float scale_log2, int causal) {
#if HA_SM90A
    ha::flash_fwd<64, true>(tmaps, O, Lse, S, scale_log2, causal);
#else
    __trap();
#endif
}

extern "C" __global__ void __launch_bounds__(384, 1)
hopper_flash_fwd_pingpong_d128(const uint8_t* __restrict__ tmaps, __nv_bfloat16* __restrict__ O,
                               float* __restrict__ Lse, int S, float scale_log2, int causal) {
#if HA_SM90A
    ha::flash_fwd<128, true>(tmaps, O, Lse, S, scale_log2, causal);
#else
    __trap();
#endif
}

// Step 3: the same kernel with ping-pong consumers that overlap their softmax with their own P V
extern "C" __global__ void __launch_bounds__(384, 1)
hopper_flash_fwd_overlap_d64(const uint8_t* __restrict__ tmaps, __nv_bfloat16* __restrict__ O,
                             float* __restrict__ Lse, int S, float scale_log2, int causal) {
#if HA_SM90A
    ha::flash_fwd<64, true, true>(tmaps, O, Lse, S, scale_log2, causal);
#else
    __trap();
#endif
}

extern "C" __global__ void __launch_bounds__(384, 1)
hopper_flash_fwd_overlap_d128(const uint8_t* __restrict__ tmaps, __nv_bfloat16* __restrict__ O,
                              float* __restrict__ Lse, int S, float scale_log2, int causal) {
#if HA_SM90A
    ha::flash_fwd<128, true, true>(tmaps, O, Lse, S, scale_log2, causal);
#else
    __trap();
#endif
}

// Step 4: step 2's kernel with the lean softmax; scale_log2 must be >= 0 (the host negates K for
// a negative scale)
extern "C" __global__ void __launch_bounds__(384, 1)
hopper_flash_fwd_lean_d64(const uint8_t* __restrict__ tmaps, __nv_bfloat16* __restrict__ O,
                          float* __restrict__ Lse, int S, float scale_log2, int causal) {
#if HA_SM90A
    ha::flash_fwd<64, true, false, true>(tmaps, O, Lse, S, scale_log2, causal);
#else
    __trap();
#endif
}

extern "C" __global__ void __launch_bounds__(384, 1)
hopper_flash_fwd_lean_d128(const uint8_t* __restrict__ tmaps, __nv_bfloat16* __restrict__ O,
                           float* __restrict__ Lse, int S, float scale_log2, int causal) {
#if HA_SM90A
    ha::flash_fwd<128, true, false, true>(tmaps, O, Lse, S, scale_log2, causal);
#else
    __trap();
#endif
}

// Step 5: step 4's consumers in a persistent grid of min(tiles, SMs) blocks; planes = B * H, next
// a zeroed int (the tile counter)
extern "C" __global__ void __launch_bounds__(384, 1)
hopper_flash_fwd_persist_d64(const uint8_t* __restrict__ tmaps, __nv_bfloat16* __restrict__ O,
                             float* __restrict__ Lse, int S, float scale_log2, int causal,
                             int planes, int* __restrict__ next) {
#if HA_SM90A
    ha::flash_fwd_persistent<64>(tmaps, O, Lse, S, scale_log2, causal, planes, next);
#else
    __trap();
#endif
}

extern "C" __global__ void __launch_bounds__(384, 1)
hopper_flash_fwd_persist_d128(const uint8_t* __restrict__ tmaps, __nv_bfloat16* __restrict__ O,
                              float* __restrict__ Lse, int S, float scale_log2, int causal,
                              int planes, int* __restrict__ next) {
#if HA_SM90A
    ha::flash_fwd_persistent<128>(tmaps, O, Lse, S, scale_log2, causal, planes, next);
#else
    __trap();
#endif
}
// --8<-- [end:kernel]
