// Scan v11: v10's look-back, scanned in the order the lanes load it; tiles three times v10's.
//
// v7 to v10 load a warp's segment as 16-byte vectors, striped over the lanes (lane l holds
// vectors l, l + 32, l + 64, ...: every load instruction reads 512 contiguous bytes), then
// transpose it through shared memory into blocked order (lane l holds elements 32l .. 32l + 31),
// scan each lane's run sequentially, and transpose back before the store. The tile lives in shared
// memory, and its size is bounded by it.
//
// v11 scans the striped order directly. Row k of the warp (its k-th vector instruction) is 128
// consecutive elements, four per lane: each lane scans its four (three additions), the warp scans
// the 32 vector sums with shuffles, and the rows are chained in registers (row k's offset is the
// sum of rows 0 .. k-1). No tile in shared memory: it holds only the warp totals, the tile number
// and the carry. What that frees buys a larger tile: 256 threads x 96 elements (24576, three of
// v10's tiles), two blocks an SM (__launch_bounds__: 128 registers a thread, 96 of them the
// tile), so a third as many tiles look back for the same data. The rest is v10's: the tile's sum
// published after one barrier, warp 0 looking back while the other warps wait, evict-first loads
// and stores.
//
// The additions come in a different order from v10's (a four-element run, a 32-lane shuffle tree,
// then a chain of rows), so fp32 results differ from v10's in the last bits; int32 results are
// exact. As in v5 to v10, the carry groups the predecessors' sums by timing, so fp32 results can
// also differ from run to run.
// Launched by snippets/part3/scan_v11.py.
#include "../part3/scan.cu"

#ifndef V11_THREADS
#define V11_THREADS 256  // the launcher's numbers (snippets/part3/scan_v11.py), as -D options
#define V11_ITEMS 96
#define V11_BLOCKS 2
#endif

// --8<-- [start:striped]
template <class T, int BLOCK_THREADS, int THREAD_ITEMS>
__device__ void scan_lookback_striped(const T* __restrict__ x, T* __restrict__ out,
                                      unsigned long long* state, long long n) {
    static_assert(BLOCK_THREADS % 32 == 0 && BLOCK_THREADS / 32 <= 32,
                  "whole warps, at most 32 of them");
    static_assert(THREAD_ITEMS % 4 == 0, "each lane loads and stores THREAD_ITEMS / 4 vectors");
    constexpr int ROWS = THREAD_ITEMS / 4;                // vector instructions per warp
    constexpr int TILE_N = BLOCK_THREADS * THREAD_ITEMS;  // elements per tile
    constexpr int SEG = 32 * THREAD_ITEMS;                // elements per warp segment
    constexpr int WARPS = BLOCK_THREADS / 32;
    __shared__ T sWarp[WARPS];  // each warp's total
    __shared__ long long sTile;
    __shared__ T sCarry;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    if (t == 0) sTile = (long long)atomicAdd(&state[0], 1ull);  // forward progress, as in v5
    __syncthreads();
    const long long base = sTile * TILE_N;
    const long long gseg = base + (long long)warp * SEG;  // this warp's first element
    const bool full = base + TILE_N <= n;                 // no element of the tile is past n

    // 1. Load: element c of row k in lane l is element 128k + 4l + c of the segment. A full tile
    // at a 16-byte aligned x reads row k as one 16-byte vector per lane (512 contiguous bytes);
    // otherwise (the last tile, or x not aligned) one element at a time, past the end the identity.
    T v[ROWS][4];
    if (full && aligned16(x)) {
        const uint4* gv = reinterpret_cast<const uint4*>(x + gseg);
        uint4 q[ROWS];
#pragma unroll
        for (int k = 0; k < ROWS; ++k) q[k] = __ldcs(gv + k * 32 + lane);  // all in flight
#pragma unroll
        for (int k = 0; k < ROWS; ++k) {
            v[k][0] = of_bits<T>(q[k].x);
            v[k][1] = of_bits<T>(q[k].y);
            v[k][2] = of_bits<T>(q[k].z);
            v[k][3] = of_bits<T>(q[k].w);
        }
    } else {
#pragma unroll
        for (int k = 0; k < ROWS; ++k)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const long long e = gseg + k * 128 + lane * 4 + c;
                v[k][c] = e < n ? x[e] : T(0);
            }
    }

    // 2. Scan where the data is: each lane's four elements, then each row across the warp, then
    // the rows in order. Afterwards v holds the segment's inclusive prefix and seg its total.
    T seg = T(0);
#pragma unroll
    for (int k = 0; k < ROWS; ++k) {
        v[k][1] += v[k][0];
        v[k][2] += v[k][1];
        v[k][3] += v[k][2];
        const T incl = warp_inclusive_scan(v[k][3]);        // row k's sums up to this lane
        T excl = __shfl_up_sync(0xffffffffu, incl, 1);     // ... and up to the lane before
        if (lane == 0) excl = T(0);
        const T before = seg + excl;                        // everything before this lane's four
#pragma unroll
        for (int c = 0; c < 4; ++c) v[k][c] += before;
        seg += __shfl_sync(0xffffffffu, incl, 31);          // row k's total
    }
    if (lane == 0) sWarp[warp] = seg;
    __syncthreads();

    // 3. Warp 0 sums the warp totals, publishes the tile's sum at once (tile 0 its inclusive
    // prefix: it has no carry) and looks back, while the other warps wait at the barrier.
    if (warp == 0) {
        const long long tile = sTile;  // read again: no register holds it across the scan
        volatile unsigned long long* flags = state + 1;
        const T total = warp_sum(lane < WARPS ? sWarp[lane] : T(0));
        if (lane == 0) flags[tile] = pack(tile == 0 ? ST_PREFIX : ST_AGG, total);
        T carry = T(0);
        if (tile > 0) {
            carry = warp_lookback<T>(flags, tile);
            // one 64-bit store carries status and value: no fence is needed to order them
            if (lane == 0) flags[tile] = pack(ST_PREFIX, carry + total);
        }
        if (lane == 0) sCarry = carry;
    }
    __syncthreads();
    // every warp scans the warp totals itself for its own offset (after the barrier: nothing but
    // the segment is held in registers across the look-back)
    const T wincl = warp_inclusive_scan(lane < WARPS ? sWarp[lane] : T(0));
    T warp_excl = __shfl_sync(0xffffffffu, wincl, (warp + 31) & 31);
    if (warp == 0) warp_excl = T(0);
    const T offset = sCarry + warp_excl;  // everything before this warp's segment

    // 4. Store, in the order of the loads. (The tile's place is read again from shared memory, for
    // the same reason.)
    const long long gseg2 = sTile * TILE_N + (long long)warp * SEG;
    if (sTile * TILE_N + TILE_N <= n && aligned16(out)) {
        uint4* gv = reinterpret_cast<uint4*>(out + gseg2);
#pragma unroll
        for (int k = 0; k < ROWS; ++k)
            __stcs(gv + k * 32 + lane,  // evict first
                   make_uint4(to_bits(v[k][0] + offset), to_bits(v[k][1] + offset),
                              to_bits(v[k][2] + offset), to_bits(v[k][3] + offset)));
    } else {
#pragma unroll
        for (int k = 0; k < ROWS; ++k)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const long long e = gseg2 + k * 128 + lane * 4 + c;
                if (e < n) out[e] = v[k][c] + offset;
            }
    }
}
// --8<-- [end:striped]

// --8<-- [start:kernel]
#define INSTANTIATE_V11(T, S)                                                                     \
    extern "C" __global__ void __launch_bounds__(V11_THREADS, V11_BLOCKS)                         \
        scan_lookback_v11_##S(const T* x, T* out, unsigned long long* state, long long n) {       \
        scan_lookback_striped<T, V11_THREADS, V11_ITEMS>(x, out, state, n);                      \
    }

INSTANTIATE_V11(float, f32)
INSTANTIATE_V11(int, i32)
// --8<-- [end:kernel]
