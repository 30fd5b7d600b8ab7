// Scan v9 (Part 3): v8's tile in a persistent grid that prefetches its next tile.
// Loaded from Python by snippets/part3/scan_v9.py (CuPy/NVRTC), where it is version v9 of the scan
// op. It reuses v7's pieces (the state words, pack/unpack, PAD, the warp scans and the warp-wide
// look-back) from Part 3's scan.cu, included whole.
//
// Why: in v7 and v8 a block issues its loads when it starts, and a block waiting on its
// predecessors' sums holds its SM's slots with nothing in flight. Here a grid of only as many
// blocks as fit on the GPU at once takes tile after tile from the counter in state[0], and each
// block issues the 16-byte loads of its next tile before it looks back and stores the current one,
// so the memory system has a tile's loads in flight while the block waits.
#include "../part3/scan.cu"

#ifndef V9_THREADS
#define V9_THREADS 256  // the launcher's numbers (snippets/part3/scan_v9.py), as -D options
#define V9_ITEMS 32
#endif

// --8<-- [start:lookback_v9]
// Tiles are still claimed in increasing order by running blocks, and a block publishes its tile's
// sum before it looks back, so waiting cannot deadlock: every predecessor of the lowest unfinished
// tile has published. Per tile the steps are v7's; the prefetched vectors wait in registers (v).
template <class T, int BLOCK_THREADS, int THREAD_ITEMS>
__device__ void scan_lookback_v9(const T* __restrict__ x, T* __restrict__ out,
                                 unsigned long long* state, long long n) {
    static_assert(BLOCK_THREADS % 32 == 0 && BLOCK_THREADS / 32 <= 32,
                  "whole warps, at most 32 of them");
    static_assert(THREAD_ITEMS % 4 == 0, "each lane loads and stores THREAD_ITEMS / 4 vectors");
    constexpr int TILE_N = BLOCK_THREADS * THREAD_ITEMS;
    constexpr int SEG = 32 * THREAD_ITEMS;
    constexpr int WARPS = BLOCK_THREADS / 32;
    constexpr int VEC = THREAD_ITEMS / 4;
    __shared__ T sSeg[WARPS][PAD(SEG)];
    __shared__ T sWarp[WARPS];
    __shared__ long long sTileId;
    __shared__ T sCarry;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const long long tiles = (n + TILE_N - 1) / TILE_N;
    const bool vec_ok = aligned16(x) && aligned16(out);
    volatile unsigned long long* flags = state + 1;
    T* s = sSeg[warp];
    if (t == 0) sTileId = (long long)atomicAdd(&state[0], 1ull);
    __syncthreads();
    long long tile = sTileId;
    __syncthreads();  // every thread has read it before thread 0 claims the next one below
    uint4 v[VEC];     // the 16-byte vectors of the tile about to be scanned, when `pre`
    bool pre = false;
    auto prefetch = [&](long long tl) {  // a full tile at aligned pointers: all loads in flight
        pre = tl < tiles && (tl + 1) * TILE_N <= n && vec_ok;
        if (pre) {
            const uint4* gv =
                reinterpret_cast<const uint4*>(x + tl * TILE_N + (long long)warp * SEG);
#pragma unroll
            for (int k = 0; k < VEC; ++k) v[k] = gv[k * 32 + lane];
        }
    };
    prefetch(tile);
    while (tile < tiles) {
        const long long base = tile * TILE_N;
        const long long gseg = base + (long long)warp * SEG;
        const bool full = base + TILE_N <= n;
        // 1. Into this warp's slice: the prefetched vectors, or (the last tile, unaligned
        // pointers) one element per lane per step. Thread 0 claims the next tile meanwhile.
        if (pre) {
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
                const int e = (k * 32 + lane) * 4;
                s[PAD(e)] = of_bits<T>(v[k].x);
                s[PAD(e + 1)] = of_bits<T>(v[k].y);
                s[PAD(e + 2)] = of_bits<T>(v[k].z);
                s[PAD(e + 3)] = of_bits<T>(v[k].w);
            }
        } else {
#pragma unroll
            for (int k = 0; k < THREAD_ITEMS; ++k) {
                const int e = k * 32 + lane;
                s[PAD(e)] = gseg + e < n ? x[gseg + e] : T(0);
            }
        }
        if (t == 0) sTileId = (long long)atomicAdd(&state[0], 1ull);
        __syncwarp();
        T r[THREAD_ITEMS];
#pragma unroll
        for (int k = 0; k < THREAD_ITEMS; ++k) r[k] = s[PAD(lane * THREAD_ITEMS + k)];

        // 2. Scan in registers, then across the warp; the barrier shares the warp totals and the
        // next tile's number, whose loads are issued at once.
#pragma unroll
        for (int k = 1; k < THREAD_ITEMS; ++k) r[k] += r[k - 1];
        const T incl = warp_inclusive_scan(r[THREAD_ITEMS - 1]);
        T lane_excl = __shfl_up_sync(0xffffffffu, incl, 1);
        if (lane == 0) lane_excl = T(0);
        if (lane == 31) sWarp[warp] = incl;
        __syncthreads();
        const long long next = sTileId;
        prefetch(next);  // in flight from here on, through the look-back and the stores
        const T wt = lane < WARPS ? sWarp[lane] : T(0);
        const T wincl = warp_inclusive_scan(wt);
        const T total = __shfl_sync(0xffffffffu, wincl, 31);
        T warp_excl = __shfl_sync(0xffffffffu, wincl, (warp + 31) & 31);
        if (warp == 0) warp_excl = T(0);

        // 3. Publish; 4. local work while warp 0 looks back; 5. store (all as in v7).
        if (t == 0) flags[tile] = pack(tile == 0 ? ST_PREFIX : ST_AGG, total);
        const T offset = warp_excl + lane_excl;
        __syncwarp();
#pragma unroll
        for (int k = 0; k < THREAD_ITEMS; ++k) s[PAD(lane * THREAD_ITEMS + k)] = r[k] + offset;
        if (warp == 0) {
            T carry = T(0);
            if (tile > 0) {
                carry = warp_lookback<T>(flags, tile);
                if (lane == 0) flags[tile] = pack(ST_PREFIX, carry + total);
            }
            if (lane == 0) sCarry = carry;
        }
        __syncthreads();
        const T carry = sCarry;
        if (full && vec_ok) {
            uint4* gv = reinterpret_cast<uint4*>(out + gseg);
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
                const int e = (k * 32 + lane) * 4;
                gv[k * 32 + lane] =
                    make_uint4(to_bits(s[PAD(e)] + carry), to_bits(s[PAD(e + 1)] + carry),
                               to_bits(s[PAD(e + 2)] + carry), to_bits(s[PAD(e + 3)] + carry));
            }
        } else {
#pragma unroll
            for (int k = 0; k < THREAD_ITEMS; ++k) {
                const int e = k * 32 + lane;
                if (gseg + e < n) out[gseg + e] = s[PAD(e)] + carry;
            }
        }
        __syncwarp();  // this warp's slice is read: the next tile may overwrite it
        tile = next;
    }
}
// --8<-- [end:lookback_v9]

#define INSTANTIATE_V9(T, S)                                                                      \
    extern "C" __global__ void __launch_bounds__(V9_THREADS, 2)                                   \
        scan_lookback_v9_##S(const T* x, T* out, unsigned long long* state, long long n) {        \
        scan_lookback_v9<T, V9_THREADS, V9_ITEMS>(x, out, state, n);                              \
    }

INSTANTIATE_V9(float, f32)
INSTANTIATE_V9(int, i32)
