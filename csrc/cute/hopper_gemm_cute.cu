// The Hopper GEMM of csrc/part6/hopper_gemm.cu (v4's structure) written with CuTe and CUTLASS's
// pipeline: C = A @ B^T, A M x K and B N x K bf16 row-major (both K-major), C M x N bf16, with
// fp32 sums.
//
// A producer warpgroup issues TMA loads (SM90_TMA_LOAD, 128-byte swizzled tiles) into a ring
// of STAGES shared-memory stages guarded by cutlass::PipelineTmaAsync (a full and an empty
// mbarrier per stage); two consumer warpgroups run a TiledMMA of SM90_64x256x16_F32BF16BF16_SS
// (GMMA, i.e. wgmma) over a 128 x 256 tile, keep one wgmma batch in flight, and store C from
// registers with a bounds check. Persistent: one block per SM walks the tiles in grouped order
// (v4's tile_coords).
//
// Built as a shared library (snippets/part6/cute_gemm.py): the TMA descriptors are made on the
// host by make_tma_atom, so the launcher is C++ too: km_cute_gemm below.
//
// Without CuTe's headers on the include path (tests/test_cuda_compile.py builds every csrc file
// with only -I csrc/common) the file compiles to a launcher that returns cudaErrorNotSupported;
// without sm_90a's features (-arch=sm_80, plain sm_90) the kernel body is a trap.

#ifndef NDEBUG
#define NDEBUG  // CUTLASS's pipeline asserts and brkpt checks are for debug builds
#endif

#include <cuda_runtime.h>

#if __has_include(<cute/tensor.hpp>)
#define KM_HAVE_CUTE 1

#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || !defined(__CUDA_ARCH__)
#define KM_SM90A 1  // host pass, or the device pass for sm_90a: the kernel has its body
#endif

namespace kmc {
using namespace cute;
using bf16 = cutlass::bfloat16_t;

// --8<-- [start:config]
constexpr int BLOCK_M = 128;  // two consumer warpgroups of 64 rows each
constexpr int BLOCK_N = 256;
constexpr int BLOCK_K = 64;   // one 128-byte swizzle row of bf16 per tile row and stage
constexpr int STAGES = 4;
constexpr int CONSUMERS = 2;  // consumer warpgroups
constexpr int WG_THREADS = 128;
constexpr int THREADS = (1 + CONSUMERS) * WG_THREADS;
constexpr int GROUP_M = 8;    // grouped tile order, as v4
inline constexpr int PRODUCER_REGS = 40;  // setmaxnreg: 40 + 2 * 232 <= 512, 64K registers
inline constexpr int CONSUMER_REGS = 232;

using TileM = Int<BLOCK_M>;
using TileN = Int<BLOCK_N>;
using TileK = Int<BLOCK_K>;
using Stages = Int<STAGES>;

// Shared-memory tiles: the 128-byte-swizzle K-major atom (8 rows x 64 bf16) repeated over the tile
// and the stages; it is the layout both TMA (writing) and GMMA (reading) agree on
using SmemLayoutA = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<bf16>{},
                                           make_shape(TileM{}, TileK{}, Stages{})));
using SmemLayoutB = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<bf16>{},
                                           make_shape(TileN{}, TileK{}, Stages{})));

// Two 64 x 256 x 16 GMMA atoms stacked along M: consumer warpgroup w computes rows 64w..64w+63
using TiledMma = decltype(make_tiled_mma(
    SM90_64x256x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::K>{},
    Layout<Shape<Int<CONSUMERS>, _1, _1>>{}));

using Pipeline = cutlass::PipelineTmaAsync<STAGES>;
using PipelineState = cutlass::PipelineState<STAGES>;

struct alignas(1024) SharedStorage {
    alignas(1024) ArrayEngine<bf16, cosize_v<SmemLayoutA>> a;
    alignas(1024) ArrayEngine<bf16, cosize_v<SmemLayoutB>> b;
    typename Pipeline::SharedStorage pipeline;
};
constexpr int SMEM_BYTES = int(sizeof(SharedStorage)) + 1024;  // + slack to align the base
inline constexpr uint32_t STAGE_TX_BYTES = (BLOCK_M + BLOCK_N) * BLOCK_K * sizeof(bf16);
static_assert(SMEM_BYTES <= 227 * 1024, "the stages must fit 227 KB of shared memory");
static_assert(BLOCK_M == 64 * CONSUMERS, "one 64-row GMMA atom per consumer warpgroup");
static_assert(WG_THREADS * (PRODUCER_REGS + CONSUMERS * CONSUMER_REGS) <= 65536,
              "the three warpgroups' registers must fit the SM's 64K");
static_assert(size(TiledMma{}) == CONSUMERS * WG_THREADS, "the consumers are the TiledMMA");
// --8<-- [end:config]

// --8<-- [start:tile_order]
// v4's grouped order: GROUP_M tile rows at a time, walked column by column, for reuse in L2
__device__ __forceinline__ void tile_coords(int t, int tiles_m, int tiles_n, int& pm, int& pn) {
    const int per_group = GROUP_M * tiles_n;
    const int first_m = (t / per_group) * GROUP_M;
    const int rows = min(tiles_m - first_m, GROUP_M);
    pm = first_m + (t % per_group) % rows;
    pn = (t % per_group) / rows;
}
// --8<-- [end:tile_order]

template <class TmaA, class TmaB>
__global__ void __launch_bounds__(THREADS, 1)
cute_gemm_kernel(CUTE_GRID_CONSTANT TmaA const tma_a, CUTE_GRID_CONSTANT TmaB const tma_b,
                 bf16* C, int M, int N, int K) {
#if defined(KM_SM90A)
    // --8<-- [start:kernel_setup]
    extern __shared__ char smem_raw[];
    auto base = (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023);
    SharedStorage& smem = *reinterpret_cast<SharedStorage*>(base);

    const int wg = threadIdx.x / WG_THREADS;  // 0: producer, 1..CONSUMERS: consumers
    typename Pipeline::Params params;
    params.transaction_bytes = STAGE_TX_BYTES;
    params.role = wg == 0 ? Pipeline::ThreadCategory::Producer
                          : Pipeline::ThreadCategory::Consumer;
    params.is_leader = threadIdx.x == 0;
    params.num_consumers = CONSUMERS * WG_THREADS;
    Pipeline pipeline(smem.pipeline, params, Shape<_1, _1, _1>{});  // warp 0 inits the barriers
    __syncthreads();  // barriers initialised before anyone waits on them

    // The whole of A, B and C as CuTe tensors; the TMA ones hold coordinates, not addresses
    Tensor mA = tma_a.get_tma_tensor(make_shape(M, K));                       // (M, K)
    Tensor mB = tma_b.get_tma_tensor(make_shape(N, K));                       // (N, K)
    Tensor mC = make_tensor(make_gmem_ptr(C), make_shape(M, N), make_stride(N, _1{}));
    Tensor sA = make_tensor(make_smem_ptr(smem.a.begin()), SmemLayoutA{});  // (BM, BK, STAGES)
    Tensor sB = make_tensor(make_smem_ptr(smem.b.begin()), SmemLayoutB{});  // (BN, BK, STAGES)
    // Every tile of A and B: (BM, BK, m-tiles, k-tiles), (BN, BK, n-tiles, k-tiles)
    Tensor gA = local_tile(mA, make_shape(TileM{}, TileK{}), make_coord(_, _));
    Tensor gB = local_tile(mB, make_shape(TileN{}, TileK{}), make_coord(_, _));

    const int tiles_m = (M + BLOCK_M - 1) / BLOCK_M;
    const int tiles_n = (N + BLOCK_N - 1) / BLOCK_N;
    const int k_tiles = (K + BLOCK_K - 1) / BLOCK_K;  // TMA fills the K beyond the edge with zeros
    const int tiles = tiles_m * tiles_n;
    int pm, pn;
    // --8<-- [end:kernel_setup]

    if (wg == 0) {
        // --8<-- [start:producer]
        cutlass::arch::warpgroup_reg_dealloc<PRODUCER_REGS>();
        if (threadIdx.x == 0) {  // one thread issues every TMA load
            // tma_partition: the TMA's view of a tile, (TMA, m-tiles, k-tiles) and (TMA, STAGES)
            auto [tAgA, tAsA] = tma_partition(tma_a, Int<0>{}, Layout<_1>{},
                                              group_modes<0, 2>(sA), group_modes<0, 2>(gA));
            auto [tBgB, tBsB] = tma_partition(tma_b, Int<0>{}, Layout<_1>{},
                                              group_modes<0, 2>(sB), group_modes<0, 2>(gB));
            PipelineState write = cutlass::make_producer_start_state<Pipeline>();
            for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
                tile_coords(t, tiles_m, tiles_n, pm, pn);
                for (int k = 0; k < k_tiles; ++k) {
                    pipeline.producer_acquire(write);  // wait for an empty stage, expect bytes
                    auto* full = pipeline.producer_get_barrier(write);
                    const int s = write.index();
                    copy(tma_a.with(*full), tAgA(_, pm, k), tAsA(_, s));
                    copy(tma_b.with(*full), tBgB(_, pn, k), tBsB(_, s));
                    ++write;
                }
            }
        }
        // --8<-- [end:producer]
    } else {
        // --8<-- [start:consumer]
        cutlass::arch::warpgroup_reg_alloc<CONSUMER_REGS>();
        TiledMma mma;
        ThrMMA thr = mma.get_slice(threadIdx.x - WG_THREADS);  // 0..255 over the two consumers
        Tensor tCsA = thr.partition_A(sA);        // (MMA, MMA_M, MMA_K, STAGES)
        Tensor tCsB = thr.partition_B(sB);        // (MMA, MMA_N, MMA_K, STAGES)
        Tensor tCrA = thr.make_fragment_A(tCsA);  // GMMA descriptors of the shared tiles
        Tensor tCrB = thr.make_fragment_B(tCsB);
        Tensor acc = partition_fragment_C(mma, make_shape(TileM{}, TileN{}));  // fp32 registers
        // Which (row, column) of the tile each accumulator register holds, for the bounds check
        Tensor tCcC = thr.partition_C(make_identity_tensor(make_shape(TileM{}, TileN{})));

        PipelineState read;
        for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
            tile_coords(t, tiles_m, tiles_n, pm, pn);
            PipelineState release = read;
            mma.accumulate_ = GMMA::ScaleOut::Zero;  // the first K-slice overwrites acc
            for (int k = 0; k < k_tiles; ++k) {
                pipeline.consumer_wait(read);  // the stage's TMA bytes have landed
                const int s = read.index();
                warpgroup_fence_operand(acc);
                warpgroup_arrive();
                CUTE_UNROLL
                for (int kb = 0; kb < size<2>(tCrA); ++kb) {  // 4 wgmma k16 per 64-wide slice
                    gemm(mma, tCrA(_, _, kb, s), tCrB(_, _, kb, s), acc);
                    mma.accumulate_ = GMMA::ScaleOut::One;
                }
                warpgroup_commit_batch();
                warpgroup_wait<1>();  // the previous slice's wgmmas are done: free its stage
                warpgroup_fence_operand(acc);
                if (k > 0) {
                    pipeline.consumer_release(release);
                    ++release;
                }
                ++read;
            }
            warpgroup_wait<0>();
            warpgroup_fence_operand(acc);
            if (k_tiles > 0) {
                pipeline.consumer_release(release);
            }
            // --8<-- [end:consumer]

            // --8<-- [start:epilogue]
            // The producer already loads the next tile while this one is stored. Registers 2i and
            // 2i+1 hold neighbouring columns (GMMA's accumulator layout): store them as one bf16x2;
            // N % 8 == 0 keeps the pair inside C and 4-byte aligned
            Tensor gC = local_tile(mC, make_shape(TileM{}, TileN{}), make_coord(pm, pn));
            Tensor tCgC = thr.partition_C(gC);
            const int rows_left = M - pm * BLOCK_M;
            const int cols_left = N - pn * BLOCK_N;
            CUTE_UNROLL
            for (int i = 0; i < size(acc); i += 2) {
                const int row = get<0>(tCcC(i)), col = get<1>(tCcC(i));
                if (row < rows_left && col < cols_left) {
                    __nv_bfloat162 pair = __floats2bfloat162_rn(acc(i), acc(i + 1));
                    *reinterpret_cast<__nv_bfloat162*>(&tCgC(i)) = pair;
                }
            }
            // --8<-- [end:epilogue]
        }
    }
#else
    __trap();  // GMMA, TMA and setmaxnreg exist only for sm_90a
#endif
}

}  // namespace kmc
#endif  // __has_include(<cute/tensor.hpp>)

// --8<-- [start:launcher]
// The host side: CuTe tensors over A and B, the TMA atoms (CuTe encodes the CUtensorMap: sizes,
// strides, the box of one tile, the 128-byte swizzle read off the shared layout), a persistent grid
// of one block per SM. Returns a cudaError_t (0 = success).
extern "C" int km_cute_gemm(const void* A, const void* B, void* C, int M, int N, int K,
                            void* stream) {
#if defined(KM_HAVE_CUTE)
    using namespace cute;
    using namespace kmc;
    if (M <= 0 || N <= 0 || K <= 0 || K % 8 || N % 8) {
        return int(cudaErrorInvalidValue);
    }
    Tensor mA = make_tensor(make_gmem_ptr(static_cast<const bf16*>(A)), make_shape(M, K),
                            make_stride(K, _1{}));
    Tensor mB = make_tensor(make_gmem_ptr(static_cast<const bf16*>(B)), make_shape(N, K),
                            make_stride(K, _1{}));
    auto tma_a = make_tma_atom(SM90_TMA_LOAD{}, mA, SmemLayoutA{}(_, _, 0),
                               make_shape(TileM{}, TileK{}));
    auto tma_b = make_tma_atom(SM90_TMA_LOAD{}, mB, SmemLayoutB{}(_, _, 0),
                               make_shape(TileN{}, TileK{}));
    // make_tma_atom reports a failed encoding only on stderr (its assert is off here): the Python
    // side has already refused every input the encoding would reject (alignment, K % 8)
    auto kernel = &cute_gemm_kernel<decltype(tma_a), decltype(tma_b)>;

    // Once per device: the SM count, and the opt-in to more than 48 KB of dynamic shared memory
    constexpr int MAX_DEVICES = 64;
    static int sms_of[MAX_DEVICES];  // 0 until set up; a race only repeats the set-up
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess || device < 0 || device >= MAX_DEVICES) {
        return int(err != cudaSuccess ? err : cudaErrorInvalidDevice);
    }
    int sms = sms_of[device];
    if (sms == 0) {
        err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
        if (err == cudaSuccess) {
            err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       SMEM_BYTES);
        }
        if (err != cudaSuccess) {
            return int(err);
        }
        sms_of[device] = sms;
    }
    const int tiles = ((M + BLOCK_M - 1) / BLOCK_M) * ((N + BLOCK_N - 1) / BLOCK_N);
    const int grid = tiles < sms ? tiles : sms;
    kernel<<<grid, THREADS, SMEM_BYTES, static_cast<cudaStream_t>(stream)>>>(
        tma_a, tma_b, static_cast<bf16*>(C), M, N, K);
    return int(cudaGetLastError());
#else
    (void)A, (void)B, (void)C, (void)M, (void)N, (void)K, (void)stream;
    return int(cudaErrorNotSupported);  // built without CuTe's headers
#endif
}

// cudaGetErrorString of the runtime this library links (statically), for Python's error message
extern "C" const char* km_cute_error_string(int err) {
    return cudaGetErrorString(static_cast<cudaError_t>(err));
}
// --8<-- [end:launcher]
