// FlashAttention's backward on Hopper, step 1 (CUDA C for sm_90a), on the forward's machinery.
//
// Given Q, K, V, O, dO (bf16, (B, H, S, D), D = 64 or 128) and the forward's row log-sum-exp L
// (fp32, natural log), the gradients of sum(O * dO):
//     P = exp(scale * Q K^T - L)      dV = P^T dO       dP = dO V^T
//     dS = P * (dP - delta),  delta = rowsum(dO * O)    dK = scale * dS^T Q    dQ = scale * dS K
//
// Three kernels:
//   hopper_flash_bwd_prep_d*   a warp per query row: delta, L in log2 units (lse2 = L log2 e;
//                              +inf for the padding rows past S, so their P is 0), and the row of
//                              the fp32 dQ accumulator zeroed. Rows are padded to a multiple of
//                              BLOCK_M, so every bulk copy below reads whole tiles.
//   hopper_flash_bwd_d*        one block per (128 keys, head, batch), FlashAttention-2's loop order
//                              (keys outside, queries inside): dK and dV of the block's keys stay
//                              in registers for the whole loop, dQ is summed across the blocks of
//                              a head in the fp32 accumulator with atomic adds.
//   hopper_flash_bwd_dq_d*     dQ = scale * accumulator, rounded to bf16.
//
// The main kernel has the forward's three warpgroups:
//   warpgroup 0  the producer: one thread loads the block's K and V tiles once (the forward's
//                128-row boxes), then for each tile of BLOCK_M = 64 queries its Q and dO tiles
//                (64-row boxes) and its 64 lse2 and delta values (1-D bulk copies) through a ring
//                of STAGES stages
//   warpgroup 1, 2  the consumers, 64 keys each. Per query tile, everything transposed so that
//                the keys are the rows (the M of every wgmma) and P^T, dS^T stay in registers:
//                  S^T  = K Q^T     wgmma from shared memory, both K-major (D-contiguous rows)
//                  dP^T = V dO^T    the same form
//                  P^T  = 2^(S^T scale log2 e - lse2)         one FFMA and one ex2 a score
//                  dV  += P^T dO    P^T from REGISTERS (the forward's P V form), dO MN-major
//                  dS^T = P^T (dP^T - delta)
//                  dK  += dS^T Q    dS^T from registers, Q MN-major
//                  dQ   = dS K      dS written to shared memory (transposed: query rows, key
//                                   columns, K-major), K read MN-major; then atomically added
//                                   to the accumulator, two floats per atomic
//
// Shared memory: K and V (128 rows each), STAGES x (Q, dO) (64 rows each), a 64 x 64 dS tile per
// consumer, all in the layout of TMA's 128-byte swizzle; then STAGES x (lse2, delta) and the
// mbarriers. The device helpers (descriptors, mbarriers, TMA, the register-A wgmma) are the
// forward's: this file includes flash_fwd.cu.

#include "flash_fwd.cu"

// --8<-- [start:bwd_constants]
namespace hb {
constexpr int BLOCK_N = 128;            // keys per block: 64 per consumer warpgroup
constexpr int BLOCK_M = 64;             // queries per tile of the inner loop
constexpr int STAGES = 2;               // query tiles (Q, dO, lse2, delta) in flight
constexpr int Q_BOX_ROWS = 64;          // rows of the Q and dO boxes
constexpr int Q_PANEL_BYTES = Q_BOX_ROWS * ha::ROW_BYTES;  // 8 KB: one Q or dO box
constexpr int DS_TILE_BYTES = 64 * ha::ROW_BYTES;          // a consumer's 64 x 64 bf16 dS
constexpr int VEC_BYTES = BLOCK_M * 4;  // a tile's lse2 (or delta): 64 floats, one bulk copy
constexpr int DS_BAR = 1;               // consumer c syncs its dS stores on barrier DS_BAR + c
// Step 2 (BULK): both consumers' dS before dQ, and both halves of dQ before its bulk add, on two
// barriers counting both consumer warpgroups
constexpr int BULK_DS_BAR = 3, BULK_DQ_BAR = 4, BULK_THREADS = 256;
constexpr int PREP_ROWS = 8;            // rows per block of the prep kernel: a warp each
constexpr int DQ_THREADS = 256;         // threads per block of the dQ kernel: 2 floats each

template <int D, bool BULK = false>
struct BwdSmem {
    static constexpr int PANELS = D / ha::PANEL_COLS;
    static constexpr int KV_TILE = PANELS * ha::PANEL_BYTES;  // 128 rows x D
    static constexpr int Q_TILE = PANELS * Q_PANEL_BYTES;     // 64 rows x D
    static constexpr int K = 0;
    static constexpr int V = KV_TILE;
    static constexpr int Q = 2 * KV_TILE;                     // stage s: Q at Q + s * Q_TILE
    static constexpr int DO = Q + STAGES * Q_TILE;            // stage s: dO at DO + s * Q_TILE
    static constexpr int DS = DO + STAGES * Q_TILE;           // consumer c: DS + c * DS_TILE_BYTES
    static constexpr int DQ = DS + ha::CONSUMERS * DS_TILE_BYTES;   // step 2: 64 x D fp32
    static constexpr int LSE = DQ + (BULK ? BLOCK_M * D * 4 : 0);   // stage s: + s * VEC_BYTES
    static constexpr int DELTA = LSE + STAGES * VEC_BYTES;
    static constexpr int BARRIERS = DELTA + STAGES * VEC_BYTES;  // kv_full, full[S], empty[S]
    static constexpr int BYTES = BARRIERS + (1 + 2 * STAGES) * 8;
    static constexpr int LAUNCH_BYTES = BYTES + ha::SWIZZLE_REPEAT;
};

static_assert(BLOCK_N == ha::CONSUMERS * 64 && BLOCK_N == ha::BOX_ROWS,
              "64 keys per consumer; K and V come in the forward's 128-row boxes");
static_assert(BLOCK_M == Q_BOX_ROWS && BLOCK_M == 64, "a query tile is one 64-row box: N = 64");
static_assert(BwdSmem<128, true>::LAUNCH_BYTES <= 227 * 1024, "the D = 128 tiles must fit 227 KB");
static_assert(Q_PANEL_BYTES % ha::SWIZZLE_REPEAT == 0 && DS_TILE_BYTES % ha::SWIZZLE_REPEAT == 0,
              "every swizzled tile starts on a 1024-byte boundary");
static_assert(VEC_BYTES % 16 == 0, "bulk copies move multiples of 16 bytes");
static_assert(DS_BAR >= 1 && DS_BAR + ha::CONSUMERS <= BULK_DS_BAR && BULK_DQ_BAR < 16,
              "named barriers 1.., not 0 (__syncthreads'), each its own");
}  // namespace hb
// --8<-- [end:bwd_constants]

#if HA_SM90A
namespace hb {
using namespace ha;

// --8<-- [start:bwd_wgmma]
// D (64 x 64, fp32, 32 registers a thread) += A (64 x 16) * B, both from shared memory, A K-major;
// B K-major (TB = 0: B is 64 x 16 with the 16 contiguous) or MN-major (TB = 1: 16 x 64, the 64
// contiguous).
template <int TB>
__device__ __forceinline__ void wgmma_ss_n64(float (&d)[32], uint64_t desc_a, uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
        "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
        "%24, %25, %26, %27, %28, %29, %30, %31"
        "}, %32, %33, p, 1, 1, 0, %35;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
          "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
          "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
          "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
          "+f"(d[30]), "+f"(d[31])
        : "l"(desc_a), "l"(desc_b), "n"(1), "n"(TB));
}

// N = 128 is the forward's wgmma_ss_n128 (ha::, with the same TB immediate).

// N = 32 (16 registers a thread): step 2's half of dQ at D = 64 (TB = 1).
template <int TB>
__device__ __forceinline__ void wgmma_ss_n32(float (&d)[16], uint64_t desc_a, uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
        "}, %16, %17, p, 1, 1, 0, %19;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
          "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
          "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(desc_a), "l"(desc_b), "n"(1), "n"(TB));
}

// B MN-major, N = N_COLS (D for step 1's dQ, D / 2 for step 2's)
template <int N_COLS>
__device__ __forceinline__ void wgmma_ss_tb(float (&d)[N_COLS / 2], uint64_t desc_a,
                                            uint64_t desc_b) {
    if constexpr (N_COLS == 32) wgmma_ss_n32<1>(d, desc_a, desc_b);
    else if constexpr (N_COLS == 64) wgmma_ss_n64<1>(d, desc_a, desc_b);
    else wgmma_ss_n128<1>(d, desc_a, desc_b);
}
// --8<-- [end:bwd_wgmma]

// An MN-major operand of a 64-row (Q or dO) tile: as desc_mnmajor, the next 64-column panel of D
// one 64-row box further (Q_PANEL_BYTES) instead of one 128-row box
__device__ __forceinline__ uint64_t desc_mnmajor_q(uint32_t addr) {
    return make_desc(addr, Q_PANEL_BYTES, SWIZZLE_REPEAT);
}

// A 1-D bulk copy of `bytes` (a multiple of 16, both addresses 16-byte aligned) from global memory
// into shared memory; its bytes count down bar's transaction count
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes,
                                          uint32_t bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
        ::"r"(dst), "l"(src), "r"(bytes), "r"(bar)
        : "memory");
}

// A query tile of 64 rows x D of head plane `plane`: D / 64 boxes of the 64-row tensor map
template <int D>
__device__ __forceinline__ void load_q_tile(uint32_t dst, const void* tmap, uint32_t bar, int row,
                                            int plane) {
#pragma unroll
    for (int p = 0; p < D / PANEL_COLS; ++p)
        tma_load_3d(dst + p * Q_PANEL_BYTES, tmap, bar, p * PANEL_COLS, row, plane);
}

// --8<-- [start:bwd_producer]
// The producer: K's and V's tiles once, then query tile i (rows (qt0 + i) * 64..) into stage
// i % STAGES once the consumers have released the tile that was there (i - STAGES).
// tmaps: Q's (64-row boxes), K's, V's (128-row boxes), dO's (64-row boxes).
template <int D, bool BULK = false>
__device__ __forceinline__ void bwd_produce(uint32_t base, uint32_t kv_full, uint32_t full,
                                            uint32_t empty, const uint8_t* tmaps,
                                            const float* lse2, const float* delta, int n0,
                                            int plane, int qt0, int n_tiles, int s_pad) {
    using L = BwdSmem<D, BULK>;
    mbar_arrive_expect_tx(kv_full, 2 * L::KV_TILE);
    load_tile<D>(base + L::K, tmaps + TMAP_BYTES, kv_full, n0, plane);
    load_tile<D>(base + L::V, tmaps + 2 * TMAP_BYTES, kv_full, n0, plane);
    for (int i = 0; i < n_tiles; ++i) {
        const int s = i % STAGES, row = (qt0 + i) * BLOCK_M;
        if (i >= STAGES) mbar_wait(empty + 8 * s, (i / STAGES - 1) & 1);
        const uint32_t bar = full + 8 * s;
        mbar_arrive_expect_tx(bar, 2 * L::Q_TILE + 2 * VEC_BYTES);
        load_q_tile<D>(base + L::Q + s * L::Q_TILE, tmaps, bar, row, plane);
        load_q_tile<D>(base + L::DO + s * L::Q_TILE, tmaps + 3 * TMAP_BYTES, bar, row, plane);
        const size_t v0 = size_t(plane) * s_pad + row;
        bulk_load(base + L::LSE + s * VEC_BYTES, lse2 + v0, VEC_BYTES, bar);
        bulk_load(base + L::DELTA + s * VEC_BYTES, delta + v0, VEC_BYTES, bar);
    }
}
// --8<-- [end:bwd_producer]

// --8<-- [start:bwd_consumer]
// A consumer warpgroup (c = 0 or 1): keys n0 + 64c..n0 + 64c + 63. This thread's accumulator rows
// (keys) are r0 and r0 + 8; its columns (queries, or D for dK, dV, dQ) 8j + 2(lane % 4) + e.
template <int D, bool BULK = false, bool FRAG = false>
__device__ __forceinline__ void bwd_consume(uint32_t base, uint32_t kv_full, uint32_t full,
                                            uint32_t empty, int c, int n0, int qt0, int n_tiles,
                                            int S, int s_pad, bool causal, float scale_log2,
                                            float scale, float* dq_acc, __nv_bfloat16* dK,
                                            __nv_bfloat16* dV, int plane) {
    using L = BwdSmem<D, BULK>;
    const size_t bh_row = size_t(plane) * S;  // row of (b, h, 0) in dK and dV
    const int t_wg = threadIdx.x % WG_THREADS, warp = t_wg / 32, lane = t_wg % 32;
    const int r0 = 16 * warp + lane / 4;         // this thread's first accumulator row
    const int key0 = n0 + 64 * c + r0;           // its key; the other row's is key0 + 8
    const int col = 2 * (lane % 4);              // its first column in each group of 8
    const uint32_t k_tile = base + L::K + c * 64 * ROW_BYTES;  // this consumer's 64 rows of K
    const uint32_t v_tile = base + L::V + c * 64 * ROW_BYTES;  // and of V
    const uint32_t ds_tile = base + L::DS + c * DS_TILE_BYTES;
    float dv[D / 2], dk[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) dv[i] = dk[i] = 0.0f;
    mbar_wait(kv_full, 0);

    // step 2: one thread adds each dQ tile to the accumulator with a bulk reduction
    const bool issuer = BULK && c == 0 && t_wg == 0;
    for (int i = 0; i < n_tiles; ++i) {
        const int s = i % STAGES, q0 = (qt0 + i) * BLOCK_M;
        const uint32_t q_tile = base + L::Q + s * L::Q_TILE, do_tile = base + L::DO + s * L::Q_TILE;
        mbar_wait(full + 8 * s, (i / STAGES) & 1);

        // S^T = K Q^T and dP^T = V dO^T: two groups, D / 16 wgmmas each
        float st[32], dpt[32];
#pragma unroll
        for (int r = 0; r < 32; ++r) st[r] = dpt[r] = 0.0f;
        wgmma_fence();
        fence_regs(st);
        fence_regs(dpt);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            const uint32_t off = (kk / 4) * PANEL_BYTES + (kk % 4) * 32;
            const uint32_t off_q = (kk / 4) * Q_PANEL_BYTES + (kk % 4) * 32;
            wgmma_ss_n64<0>(st, desc_kmajor(k_tile + off), desc_kmajor(q_tile + off_q));
        }
        wgmma_commit();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            const uint32_t off = (kk / 4) * PANEL_BYTES + (kk % 4) * 32;
            const uint32_t off_q = (kk / 4) * Q_PANEL_BYTES + (kk % 4) * 32;
            wgmma_ss_n64<0>(dpt, desc_kmajor(v_tile + off), desc_kmajor(do_tile + off_q));
        }
        wgmma_commit();

        wgmma_wait<0>();
        fence_regs(st);
        fence_regs(dpt);
        const uint32_t vec = base + L::LSE + s * VEC_BYTES;  // this tile's lse2; delta follows
        // P^T = 2^(S^T scale log2 e - lse2), 0 where masked: keys past S, and (causal) keys
        // after the query. Queries past S have lse2 = +inf: their P is 0 without a test.
        const bool mask = n0 + 64 * c + 63 >= S || (causal && q0 < n0 + 64 * c + 64);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            float lse[2];  // columns 8j + col and 8j + col + 1: one 8-byte load
            asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];"
                         : "=f"(lse[0]), "=f"(lse[1]) : "r"(vec + (8 * j + col) * 4) : "memory");
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float& x = st[4 * j + 2 * h + e];
                    x = ex2_approx(fmaf(x, scale_log2, -lse[e]));
                    if (mask) {
                        const int key = key0 + 8 * h, q = q0 + 8 * j + col + e;
                        if (key >= S || (causal && key > q)) x = 0.0f;
                    }
                }
        }
        // dS^T = P^T (dP^T - delta), in place of dP^T
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            float dl[2];
            asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];"
                         : "=f"(dl[0]), "=f"(dl[1])
                         : "r"(vec + STAGES * VEC_BYTES + (8 * j + col) * 4) : "memory");
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int r = 4 * j + 2 * h + e;
                    dpt[r] = st[r] * (dpt[r] - dl[e]);
                }
        }
        // both rounded to bf16 in registers: the A fragments of dV's and dK's products
        uint32_t pt[16], dst[16];
#pragma unroll
        for (int r = 0; r < 16; ++r) {
            pt[r] = pack_bf16(st[2 * r], st[2 * r + 1]);
            dst[r] = pack_bf16(dpt[2 * r], dpt[2 * r + 1]);
        }

        // dV += P^T dO and dK += dS^T Q: 4 wgmmas of 16 queries each, the A operand from
        // registers, dO and Q MN-major
        wgmma_fence();
        fence_regs(dv);
        fence_regs(dk);
        fence_regs(pt);
        fence_regs(dst);
#pragma unroll
        for (int kk = 0; kk < BLOCK_M / 16; ++kk) {
            const uint32_t a[4] = {pt[4 * kk], pt[4 * kk + 1], pt[4 * kk + 2], pt[4 * kk + 3]};
            wgmma_pv<D>(dv, a, desc_mnmajor_q(do_tile + kk * 16 * ROW_BYTES));
        }
#pragma unroll
        for (int kk = 0; kk < BLOCK_M / 16; ++kk) {
            const uint32_t a[4] = {dst[4 * kk], dst[4 * kk + 1], dst[4 * kk + 2],
                                   dst[4 * kk + 3]};
            wgmma_pv<D>(dk, a, desc_mnmajor_q(q_tile + kk * 16 * ROW_BYTES));
        }
        wgmma_commit();

        // dS to shared memory as 64 query rows x 64 key columns, 128B-swizzled: element (query q,
        // key k) at q * 128 + ((k / 8) ^ (q % 8)) * 16 + (k % 8) * 2
        if constexpr (FRAG) {
            // step 3: stmatrix .trans. The 8 x 8 block (keys 16 warp + 8h.., queries 8j..) is
            // register dst[2j + h] of each lane, in the layout stmatrix takes; .trans stores it
            // as 8 query rows of 8 keys (16 bytes each). One instruction stores 4 blocks (h = m %
            // 2, j = 2t + m / 2); lane L gives the address of row L % 8 of block L / 8.
            const int m = lane / 8, i = lane % 8, h = m % 2;
#pragma unroll
            for (int t = 0; t < 4; ++t) {
                const int q = 8 * (2 * t + m / 2) + i;
                const uint32_t a = ds_tile + q * ROW_BYTES + (((2 * warp + h) ^ i) * 16);
                asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 "
                             "[%0], {%1, %2, %3, %4};"
                             ::"r"(a), "r"(dst[4 * t]), "r"(dst[4 * t + 1]), "r"(dst[4 * t + 2]),
                               "r"(dst[4 * t + 3])
                             : "memory");
            }
        } else {
#pragma unroll
            for (int r = 0; r < 16; ++r) {
                const int j = r / 2, h = r % 2;
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int q = 8 * j + col + e, k = r0 + 8 * h;
                    const uint32_t a =
                        ds_tile + q * ROW_BYTES + (((k / 8) ^ (q % 8)) * 16) + (k % 8) * 2;
                    const uint16_t bits = static_cast<uint16_t>(e ? dst[r] >> 16 : dst[r] & 0xFFFF);
                    asm volatile("st.shared.b16 [%0], %1;" ::"r"(a), "h"(bits) : "memory");
                }
            }
        }
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        if constexpr (BULK) {
            // the previous dQ tile's bulk add has read its shared memory before anyone rewrites it
            if (issuer) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
            asm volatile("bar.sync %0, %1;" ::"n"(BULK_DS_BAR), "n"(BULK_THREADS) : "memory");
        } else {
            asm volatile("bar.sync %0, %1;" ::"r"(DS_BAR + c), "n"(WG_THREADS) : "memory");
        }

        wgmma_wait<0>();  // dV's and dK's products are done: P^T's and dS^T's registers free
        fence_regs(dv);
        fence_regs(dk);
        fence_regs(pt);
        fence_regs(dst);
        if constexpr (BULK) {
            if (lane == 0) mbar_arrive(empty + 8 * s);  // Q and dO of stage s are read
            // this consumer's half of dQ's columns, over the block's 128 keys: dS (64 x 128,
            // both consumers' tiles) K-major, K (128 x D / 2) MN-major
            constexpr int HALF = D / 2;
            float dq[HALF / 2];
#pragma unroll
            for (int r = 0; r < HALF / 2; ++r) dq[r] = 0.0f;
            const uint32_t k_cols = base + L::K + (D == 128 ? c * PANEL_BYTES : c * HALF * 2);
            wgmma_fence();
            fence_regs(dq);
#pragma unroll
            for (int kk = 0; kk < BLOCK_N / 16; ++kk)
                wgmma_ss_tb<HALF>(dq,
                                  desc_kmajor(base + L::DS + (kk / 4) * DS_TILE_BYTES +
                                              (kk % 4) * 32),
                                  desc_mnmajor(k_cols + kk * 16 * ROW_BYTES));
            wgmma_commit();
            wgmma_wait<0>();
            fence_regs(dq);
            // to the fp32 tile, then one bulk reduction of the whole tile into the accumulator
            const uint32_t tile = base + L::DQ;
            if constexpr (FRAG) {
                // step 3: the tile (and the accumulator) in fragment order: group j of consumer
                // c is 128 float4, one a thread, in thread order. A warp's store is 512
                // contiguous bytes: no bank conflict. hopper_flash_bwd_dq_frag_d* reorders.
#pragma unroll
                for (int j = 0; j < HALF / 8; ++j) {
                    const uint32_t a = tile + ((c * (HALF / 8) + j) * WG_THREADS + t_wg) * 16;
                    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};"
                                 ::"r"(a), "f"(dq[4 * j]), "f"(dq[4 * j + 1]), "f"(dq[4 * j + 2]),
                                   "f"(dq[4 * j + 3])
                                 : "memory");
                }
            } else {
                // row-major, the accumulator's layout: the 8 rows of a warp's store are D * 4
                // bytes apart, on the same banks (an 8-way conflict)
#pragma unroll
                for (int j = 0; j < HALF / 8; ++j)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const uint32_t a = tile + ((r0 + 8 * h) * D + c * HALF + 8 * j + col) * 4;
                        asm volatile("st.shared.v2.f32 [%0], {%1, %2};"
                                     ::"r"(a), "f"(dq[4 * j + 2 * h]), "f"(dq[4 * j + 2 * h + 1])
                                     : "memory");
                    }
            }
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            asm volatile("bar.sync %0, %1;" ::"n"(BULK_DQ_BAR), "n"(BULK_THREADS) : "memory");
            if (issuer) {
                float* dst_rows = dq_acc + (size_t(plane) * s_pad + q0) * D;
                asm volatile(
                    "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;"
                    ::"l"(dst_rows), "r"(tile), "n"(BLOCK_M * D * 4)
                    : "memory");
                asm volatile("cp.async.bulk.commit_group;" ::: "memory");
            }
        } else {
            // dQ (this consumer's part) = dS K: dS K-major from shared memory, K MN-major
            float dq[D / 2];
#pragma unroll
            for (int r = 0; r < D / 2; ++r) dq[r] = 0.0f;
            wgmma_fence();
            fence_regs(dq);
#pragma unroll
            for (int kk = 0; kk < 64 / 16; ++kk)
                wgmma_ss_tb<D>(dq, desc_kmajor(ds_tile + kk * 32),
                               desc_mnmajor(k_tile + kk * 16 * ROW_BYTES));
            wgmma_commit();
            wgmma_wait<0>();
            fence_regs(dq);
            if (lane == 0) mbar_arrive(empty + 8 * s);  // this warp is done with stage s

            // the accumulator has s_pad rows a head: the padding rows take zeros, no test needed
            float* row0 = dq_acc + (size_t(plane) * s_pad + q0 + r0) * D;  // query q0 + r0
#pragma unroll
            for (int j = 0; j < D / 8; ++j)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    atomicAdd(reinterpret_cast<float2*>(row0 + 8 * h * D + 8 * j + col),
                              make_float2(dq[4 * j + 2 * h], dq[4 * j + 2 * h + 1]));
        }
    }
    if (issuer) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");  // the last add is done

    // dK (scaled) and dV of this thread's two keys, bf16
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int key = key0 + 8 * h;
        if (key >= S) continue;
        __nv_bfloat16* kr = dK + (bh_row + key) * D;
        __nv_bfloat16* vr = dV + (bh_row + key) * D;
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
            *reinterpret_cast<__nv_bfloat162*>(kr + 8 * j + col) =
                __floats2bfloat162_rn(dk[4 * j + 2 * h] * scale, dk[4 * j + 2 * h + 1] * scale);
            *reinterpret_cast<__nv_bfloat162*>(vr + 8 * j + col) =
                __floats2bfloat162_rn(dv[4 * j + 2 * h], dv[4 * j + 2 * h + 1]);
        }
    }
}
// --8<-- [end:bwd_consumer]

// --8<-- [start:bwd_kernel]
// Grid (ceil(S / 128), H, B). Causal: the block's first query tile is the one holding its first
// key (earlier queries see none of its keys).
template <int D, bool BULK = false, bool FRAG = false>
__device__ __forceinline__ void flash_bwd(const uint8_t* tmaps, const float* lse2,
                                          const float* delta, float* dq_acc, __nv_bfloat16* dK,
                                          __nv_bfloat16* dV, int S, int s_pad, float scale_log2,
                                          float scale, int causal) {
    using L = BwdSmem<D, BULK>;
    extern __shared__ uint8_t smem[];
    const uint32_t base = align_up(smem_u32(smem), SWIZZLE_REPEAT);
    const uint32_t kv_full = base + L::BARRIERS, full = kv_full + 8, empty = full + 8 * STAGES;
    const int n0 = blockIdx.x * BLOCK_N;
    const int plane = blockIdx.z * gridDim.y + blockIdx.y;
    const int qt0 = causal ? n0 / BLOCK_M : 0;
    const int n_tiles = s_pad / BLOCK_M - qt0;

    if (threadIdx.x == 0) {
        init_block<STAGES>(tmaps, 4, kv_full, full, empty);  // the forward's set-up
        mbar_fence_init();
    }
    __syncthreads();

    const int wg = threadIdx.x / WG_THREADS;
    if (wg == 0) {
        regs_dec<PRODUCER_REGS>();
        if (threadIdx.x == 0)
            bwd_produce<D, BULK>(base, kv_full, full, empty, tmaps, lse2, delta, n0, plane, qt0,
                           n_tiles, s_pad);
    } else {
        regs_inc<CONSUMER_REGS>();
        bwd_consume<D, BULK, FRAG>(base, kv_full, full, empty, wg - 1, n0, qt0, n_tiles, S, s_pad,
                       causal != 0, scale_log2, scale, dq_acc, dK, dV, plane);
    }
}
// --8<-- [end:bwd_kernel]
}  // namespace hb
#endif  // HA_SM90A

// --8<-- [start:bwd_prep]
// A warp per padded query row r of head plane p (rows s_pad a head): delta = sum(dO * O) in fp32,
// lse2 = L log2 e, and the row of the dQ accumulator zeroed; rows past S get delta 0, lse2 +inf.
template <int D>
__device__ __forceinline__ void flash_bwd_prep(const __nv_bfloat16* O, const __nv_bfloat16* dO,
                                               const float* Lse, float* lse2, float* delta,
                                               float* dq_acc, int S, int s_pad, int rows) {
    constexpr int PER_LANE = D / 32;  // 2 or 4 contiguous elements a lane
    const int lane = threadIdx.x % 32;
    const int r = blockIdx.x * hb::PREP_ROWS + threadIdx.x / 32;
    if (r >= rows) return;
    const int plane = r / s_pad, q = r % s_pad;
    float acc = 0.0f;
    if (q < S) {
        const size_t at = (size_t(plane) * S + q) * D + lane * PER_LANE;
#pragma unroll
        for (int e = 0; e < PER_LANE; e += 2) {
            const float2 o =
                __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(O + at + e));
            const float2 g =
                __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(dO + at + e));
            acc += o.x * g.x + o.y * g.y;
        }
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffff, acc, off);
    float* zero = dq_acc + size_t(r) * D + lane * PER_LANE;
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) zero[e] = 0.0f;
    if (lane == 0) {
        delta[r] = acc;
        lse2[r] = q < S ? Lse[size_t(plane) * S + q] * 1.4426950408889634f : INFINITY;
    }
}
// --8<-- [end:bwd_prep]

// dQ = scale * accumulator for the rows inside S, bf16; two elements a thread
template <int D>
__device__ __forceinline__ void flash_bwd_dq(const float* dq_acc, __nv_bfloat16* dQ, int S,
                                             int s_pad, size_t pairs, float scale) {
    const size_t i = size_t(blockIdx.x) * hb::DQ_THREADS + threadIdx.x;
    if (i >= pairs) return;
    const size_t e = 2 * i, row = e / D;  // row of (B*H, S)
    const size_t plane = row / S, q = row % S;
    const float2 a = *reinterpret_cast<const float2*>(dq_acc + (plane * s_pad + q) * D + e % D);
    *reinterpret_cast<__nv_bfloat162*>(dQ + e) = __floats2bfloat162_rn(a.x * scale, a.y * scale);
}

// --8<-- [start:bwd_dq_frag]
// Step 3's dQ = scale * accumulator, the accumulator in fragment order: a thread per float4, which
// holds rows r0 and r0 + 8 of a tile, columns c * D / 2 + 8j + 2(lane % 4) and the next
template <int D>
__device__ __forceinline__ void flash_bwd_dq_frag(const float* dq_acc, __nv_bfloat16* dQ, int S,
                                                  int s_pad, size_t quads, float scale) {
    constexpr int HALF = D / 2, GROUPS = HALF / 8;  // float4 groups of a consumer's thread
    const size_t f = size_t(blockIdx.x) * hb::DQ_THREADS + threadIdx.x;
    if (f >= quads) return;
    const size_t tile = f / (hb::BLOCK_M * D / 4);
    const int w = int(f % (hb::BLOCK_M * D / 4));
    const int t = w % 128, cj = w / 128, c = cj / GROUPS, j = cj % GROUPS;
    const int r0 = 16 * (t / 32) + (t % 32) / 4;
    const int column = c * HALF + 8 * j + 2 * (t % 4);
    const int tiles = s_pad / hb::BLOCK_M;
    const size_t plane = tile / tiles;
    const int q = int(tile % tiles) * hb::BLOCK_M + r0;
    const float4 a = *reinterpret_cast<const float4*>(dq_acc + 4 * f);
    if (q < S)
        *reinterpret_cast<__nv_bfloat162*>(dQ + (plane * S + q) * D + column) =
            __floats2bfloat162_rn(a.x * scale, a.y * scale);
    if (q + 8 < S)
        *reinterpret_cast<__nv_bfloat162*>(dQ + (plane * S + q + 8) * D + column) =
            __floats2bfloat162_rn(a.z * scale, a.w * scale);
}
// --8<-- [end:bwd_dq_frag]

extern "C" __global__ void __launch_bounds__(384, 1)
hopper_flash_bwd_d64(const uint8_t* __restrict__ tmaps, const float* __restrict__ lse2,
                     const float* __restrict__ delta, float* __restrict__ dq_acc,
                     __nv_bfloat16* __restrict__ dK, __nv_bfloat16* __restrict__ dV, int S,
                     int s_pad, float scale_log2, float scale, int causal) {
#if HA_SM90A
    hb::flash_bwd<64>(tmaps, lse2, delta, dq_acc, dK, dV, S, s_pad, scale_log2, scale, causal);
#else
    __trap();
#endif
}

extern "C" __global__ void __launch_bounds__(384, 1)
hopper_flash_bwd_d128(const uint8_t* __restrict__ tmaps, const float* __restrict__ lse2,
                      const float* __restrict__ delta, float* __restrict__ dq_acc,
                      __nv_bfloat16* __restrict__ dK, __nv_bfloat16* __restrict__ dV, int S,
                      int s_pad, float scale_log2, float scale, int causal) {
#if HA_SM90A
    hb::flash_bwd<128>(tmaps, lse2, delta, dq_acc, dK, dV, S, s_pad, scale_log2, scale, causal);
#else
    __trap();
#endif
}

extern "C" __global__ void __launch_bounds__(384, 1)
hopper_flash_bwd_bulk_d64(const uint8_t* __restrict__ tmaps, const float* __restrict__ lse2,
                          const float* __restrict__ delta, float* __restrict__ dq_acc,
                          __nv_bfloat16* __restrict__ dK, __nv_bfloat16* __restrict__ dV, int S,
                          int s_pad, float scale_log2, float scale, int causal) {
#if HA_SM90A
    hb::flash_bwd<64, true>(tmaps, lse2, delta, dq_acc, dK, dV, S, s_pad, scale_log2, scale,
                            causal);
#else
    __trap();
#endif
}

extern "C" __global__ void __launch_bounds__(384, 1)
hopper_flash_bwd_bulk_d128(const uint8_t* __restrict__ tmaps, const float* __restrict__ lse2,
                           const float* __restrict__ delta, float* __restrict__ dq_acc,
                           __nv_bfloat16* __restrict__ dK, __nv_bfloat16* __restrict__ dV, int S,
                           int s_pad, float scale_log2, float scale, int causal) {
#if HA_SM90A
    hb::flash_bwd<128, true>(tmaps, lse2, delta, dq_acc, dK, dV, S, s_pad, scale_log2, scale,
                            causal);
#else
    __trap();
#endif
}

extern "C" __global__ void __launch_bounds__(384, 1)
hopper_flash_bwd_frag_d64(const uint8_t* __restrict__ tmaps, const float* __restrict__ lse2,
                          const float* __restrict__ delta, float* __restrict__ dq_acc,
                          __nv_bfloat16* __restrict__ dK, __nv_bfloat16* __restrict__ dV, int S,
                          int s_pad, float scale_log2, float scale, int causal) {
#if HA_SM90A
    hb::flash_bwd<64, true, true>(tmaps, lse2, delta, dq_acc, dK, dV, S, s_pad, scale_log2,
                                  scale, causal);
#else
    __trap();
#endif
}

extern "C" __global__ void __launch_bounds__(384, 1)
hopper_flash_bwd_frag_d128(const uint8_t* __restrict__ tmaps, const float* __restrict__ lse2,
                           const float* __restrict__ delta, float* __restrict__ dq_acc,
                           __nv_bfloat16* __restrict__ dK, __nv_bfloat16* __restrict__ dV, int S,
                           int s_pad, float scale_log2, float scale, int causal) {
#if HA_SM90A
    hb::flash_bwd<128, true, true>(tmaps, lse2, delta, dq_acc, dK, dV, S, s_pad, scale_log2,
                                  scale, causal);
#else
    __trap();
#endif
}

extern "C" __global__ void __launch_bounds__(256)
hopper_flash_bwd_prep_d64(const __nv_bfloat16* __restrict__ O, const __nv_bfloat16* __restrict__ dO,
                          const float* __restrict__ Lse, float* __restrict__ lse2,
                          float* __restrict__ delta, float* __restrict__ dq_acc, int S, int s_pad,
                          int rows) {
    flash_bwd_prep<64>(O, dO, Lse, lse2, delta, dq_acc, S, s_pad, rows);
}

extern "C" __global__ void __launch_bounds__(256)
hopper_flash_bwd_prep_d128(const __nv_bfloat16* __restrict__ O,
                           const __nv_bfloat16* __restrict__ dO, const float* __restrict__ Lse,
                           float* __restrict__ lse2, float* __restrict__ delta,
                           float* __restrict__ dq_acc, int S, int s_pad, int rows) {
    flash_bwd_prep<128>(O, dO, Lse, lse2, delta, dq_acc, S, s_pad, rows);
}

extern "C" __global__ void __launch_bounds__(256)
hopper_flash_bwd_dq_d64(const float* __restrict__ dq_acc, __nv_bfloat16* __restrict__ dQ, int S,
                        int s_pad, unsigned long long pairs, float scale) {
    flash_bwd_dq<64>(dq_acc, dQ, S, s_pad, pairs, scale);
}

extern "C" __global__ void __launch_bounds__(256)
hopper_flash_bwd_dq_d128(const float* __restrict__ dq_acc, __nv_bfloat16* __restrict__ dQ, int S,
                         int s_pad, unsigned long long pairs, float scale) {
    flash_bwd_dq<128>(dq_acc, dQ, S, s_pad, pairs, scale);
}

extern "C" __global__ void __launch_bounds__(256)
hopper_flash_bwd_dq_frag_d64(const float* __restrict__ dq_acc, __nv_bfloat16* __restrict__ dQ,
                             int S, int s_pad, unsigned long long quads, float scale) {
    flash_bwd_dq_frag<64>(dq_acc, dQ, S, s_pad, quads, scale);
}

extern "C" __global__ void __launch_bounds__(256)
hopper_flash_bwd_dq_frag_d128(const float* __restrict__ dq_acc, __nv_bfloat16* __restrict__ dQ,
                              int S, int s_pad, unsigned long long quads, float scale) {
    flash_bwd_dq_frag<128>(dq_acc, dQ, S, s_pad, quads, scale);
}
