// Inclusive prefix-sum (scan) kernels of Part 3, loaded from Python by snippets/part3/scan.py
// (CuPy/NVRTC). Every kernel exists for float (suffix _f32) and int (suffix _i32).
//
// v1  scan_tiles_ks     Kogge-Stone scan of a 1024-element tile in shared memory (1024 threads,
//                       10 steps), then the 3-phase device-wide scheme: scan tiles, scan the tile
//                       sums (recursively, on the host side), add_offsets (span log2(1024), work
//                       n log2(1024))
// v2  scan_tiles_bk     like v1, but a Brent-Kung up-sweep/down-sweep: 512 threads, 2 elements each
//                       (work 2n, span 2 log2(1024))
// v3  reduce_tiles, scan_sums, scan_tiles_rts    reduce-then-scan: 16 elements per thread in
//                       registers, 4096-element tiles; pass 1 reduces each tile to its sum, pass 2
//                       (one block) turns the sums into tile offsets, pass 3 rescans each tile and
//                       adds its offset (reads x twice)
// v5  scan_lookback     single pass with decoupled look-back: each tile publishes its sum, then its
//                       inclusive prefix; a tile adds up its predecessors' published values (reads
//                       x once)
// v6  scan_lookback_warp  like v5, but a whole warp looks back: 32 predecessors' words per round
//                       trip to L2, a ballot finds the nearest inclusive prefix, a shuffle
//                       reduction adds the window up; and one block-wide scan per tile instead of
//                       two
// v7  scan_lookback_v7  CUB's recipe: 8192-element tiles read and written with 16-byte vectors
//                       (warp-local transposes), the tile's sum published after one block barrier,
//                       the look-back overlapped with the other warps' work, no fence
// v8  scan_lookback_v8  v7's kernel with the same 8192-element tile cut the other way: half the
//                       threads, twice the elements (and 16-byte loads in flight) each
//
// x and out are contiguous; out may alias x for the tile kernels of v1/v2 (the host scans tile sums
// in place).

// The launcher's numbers, passed by snippets/part3/scan.py as -D options (the defaults let this
// file compile alone): TILE elements per tile in v1 and v2 (one per thread in v1), RTS_THREADS
// threads per block and ITEMS elements per thread in v3, v5 and v6, SUMS_THREADS threads in the
// one block of scan_sums; V7_THREADS threads per block and V7_ITEMS elements per thread in v7,
// V8_THREADS and V8_ITEMS in v8 (their defaults are next to v7).
#ifndef TILE
#define TILE 1024
#define RTS_THREADS 256
#define ITEMS 16
#define SUMS_THREADS 1024
#endif
static_assert((TILE & (TILE - 1)) == 0 && TILE <= 1024, "a power of two, one block of threads");

// --8<-- [start:kogge_stone]
// v1: Hillis-Steele / Kogge-Stone. Step d adds the value 2^d places to the left: after log2(TILE)
// steps every element holds the sum of everything up to it. Two buffers, so a step never reads what
// it is overwriting.
template <class T>
__device__ void scan_tiles_ks(const T* x, T* out, T* tile_sums, long long n) {
    __shared__ T buf[2][TILE];
    int t = threadIdx.x;  // blockDim.x == TILE
    long long i = (long long)blockIdx.x * TILE + t;
    buf[0][t] = i < n ? x[i] : T(0);  // past the end: the identity of +
    __syncthreads();
    int src = 0;
    for (int d = 1; d < TILE; d <<= 1) {
        T v = buf[src][t];
        if (t >= d) v += buf[src][t - d];
        buf[src ^ 1][t] = v;
        src ^= 1;
        __syncthreads();
    }
    if (i < n) out[i] = buf[src][t];
    if (t == TILE - 1) tile_sums[blockIdx.x] = buf[src][t];  // the tile's total
}
// --8<-- [end:kogge_stone]

// --8<-- [start:brent_kung]
// v2: Brent-Kung. The up-sweep builds a tree of partial sums in place (after it, the last element
// holds the tile's total); the down-sweep pushes prefixes back down the tree. 2 * TILE additions
// instead of TILE * log2(TILE), at the price of twice as many steps.
template <class T>
__device__ void scan_tiles_bk(const T* x, T* out, T* tile_sums, long long n) {
    __shared__ T buf[TILE];
    int t = threadIdx.x;  // blockDim.x == TILE / 2: two elements per thread
    long long base = (long long)blockIdx.x * TILE;
    for (int k = t; k < TILE; k += TILE / 2) buf[k] = base + k < n ? x[base + k] : T(0);
    __syncthreads();
    for (int stride = 1; stride < TILE; stride <<= 1) {  // up-sweep: log2(TILE) levels
        int k = (t + 1) * 2 * stride - 1;  // right child of the pair this thread combines
        if (k < TILE) buf[k] += buf[k - stride];
        __syncthreads();
    }
    // down-sweep: complete the missing prefixes
    for (int stride = TILE / 4; stride > 0; stride >>= 1) {
        int k = (t + 1) * 2 * stride - 1;
        if (k + stride < TILE) buf[k + stride] += buf[k];
        __syncthreads();
    }
    for (int k = t; k < TILE; k += TILE / 2)
        if (base + k < n) out[base + k] = buf[k];
    if (t == 0) tile_sums[blockIdx.x] = buf[TILE - 1];
}
// --8<-- [end:brent_kung]

// --8<-- [start:add_offsets]
// Phase 3 of v1/v2: tile b > 0 adds the inclusive scan of the tile sums up to tile b - 1.
template <class T>
__device__ void add_offsets(T* out, const T* scanned_sums, long long n) {
    long long i = (long long)(blockIdx.x + 1) * TILE + threadIdx.x;  // block b serves tile b + 1
    if (i < n) out[i] += scanned_sums[blockIdx.x];
}
// --8<-- [end:add_offsets]

// -------------------------------------------------------------------------------------------------
// v3: reduce-then-scan and v5: decoupled look-back share the tile code below.
// -------------------------------------------------------------------------------------------------
// RTS_THREADS threads per block, ITEMS elements per thread held in registers
#define RTS_TILE (RTS_THREADS * ITEMS)  // elements per tile
#define PAD(i) ((i) + ((i) >> 5))       // one padding word per 32: conflict-free blocked reads

// --8<-- [start:block_tools]
template <class T>
__device__ __forceinline__ T warp_inclusive_scan(T v) {
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        T u = __shfl_up_sync(0xffffffffu, v, d);
        if (lane >= d) v += u;
    }
    return v;
}

// Exclusive scan of one value per thread across the block; *total receives the block's sum.
// sWarp must hold 32 values. Ends with a __syncthreads, so sWarp can be reused afterwards.
template <class T>
__device__ __forceinline__ T block_exclusive_scan(T v, T* sWarp, T* total) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    T incl = warp_inclusive_scan(v);
    if (lane == 31) sWarp[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        T w = lane < warps ? sWarp[lane] : T(0);
        T wincl = warp_inclusive_scan(w);
        sWarp[lane] = wincl - w;  // exclusive prefix of each warp
        if (lane == 31) sWarp[32] = wincl;
    }
    __syncthreads();
    T out = sWarp[warp] + incl - v;
    *total = sWarp[32];
    __syncthreads();
    return out;
}

// Load a tile: coalesced global loads (consecutive threads, consecutive addresses) into padded
// shared memory, then each thread takes its ITEMS consecutive elements into registers ("blocked"
// order for a sequential scan).
template <class T>
__device__ __forceinline__ void load_blocked(const T* x, long long base, long long n, T* sTile,
                                             T (&r)[ITEMS]) {
    int t = threadIdx.x;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {  // all ITEMS loads issued before any is used
        int j = k * RTS_THREADS + t;
        sTile[PAD(j)] = base + j < n ? x[base + j] : T(0);
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) r[k] = sTile[PAD(t * ITEMS + k)];
    __syncthreads();
}

// Scan the tile held in registers (sequential within a thread, then across threads) and store it,
// offset by `carry`, back through shared memory with coalesced global stores.
template <class T>
__device__ __forceinline__ void scan_store_blocked(T (&r)[ITEMS], T carry, T* out, long long base,
                                                   long long n, T* sTile, T* sWarp) {
    int t = threadIdx.x;
#pragma unroll
    for (int k = 1; k < ITEMS; ++k) r[k] += r[k - 1];  // this thread's chunk, in registers
    T total;
    T prefix = block_exclusive_scan(r[ITEMS - 1], sWarp, &total) + carry;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) sTile[PAD(t * ITEMS + k)] = r[k] + prefix;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        int j = k * RTS_THREADS + t;
        if (base + j < n) out[base + j] = sTile[PAD(j)];
    }
}
// --8<-- [end:block_tools]

// --8<-- [start:reduce_then_scan]
// Pass 1: each block reduces its tile to one sum.
template <class T>
__device__ void reduce_tiles(const T* x, T* tile_sums, long long n) {
    __shared__ T sWarp[33];
    long long base = (long long)blockIdx.x * RTS_TILE;
    T s = T(0);
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        long long j = base + k * RTS_THREADS + threadIdx.x;
        s += j < n ? x[j] : T(0);
    }
    T total;
    block_exclusive_scan(s, sWarp, &total);
    if (threadIdx.x == 0) tile_sums[blockIdx.x] = total;
}

// Pass 2: one block turns the tile sums into exclusive tile offsets, in place, 4 per thread per
// round; a running carry links the rounds, so any number of tiles works.
template <class T>
__device__ void scan_sums(T* sums, long long tiles) {
    __shared__ T sWarp[33];
    T carry = T(0);
    for (long long base = 0; base < tiles; base += 4LL * blockDim.x) {
        long long j = base + 4LL * threadIdx.x;
        T v[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) v[k] = j + k < tiles ? sums[j + k] : T(0);
        T mine = v[0] + v[1] + v[2] + v[3];
        T total;
        T run = block_exclusive_scan(mine, sWarp, &total) + carry;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            if (j + k < tiles) sums[j + k] = run;  // exclusive: the sum of every tile before j + k
            run += v[k];
        }
        carry += total;
    }
}

// Pass 3: rescan each tile in registers and add its offset.
template <class T>
__device__ void scan_tiles_rts(const T* x, T* out, const T* offsets, long long n) {
    __shared__ T sTile[PAD(RTS_TILE)];
    __shared__ T sWarp[33];
    long long base = (long long)blockIdx.x * RTS_TILE;
    T r[ITEMS];
    load_blocked(x, base, n, sTile, r);
    scan_store_blocked(r, offsets[blockIdx.x], out, base, n, sTile, sWarp);
}
// --8<-- [end:reduce_then_scan]

// --8<-- [start:lookback]
// v5: one pass. Tiles are numbered in the order blocks start (an atomic counter), so every tile a
// block waits for belongs to a block that is already running: waiting cannot deadlock. Each tile
// publishes a 64-bit word: status in the high half (0 not ready, 1 its own sum ready, 2 its
// inclusive prefix ready), the value's bits in the low half; one 64-bit store publishes both
// at once.
#define ST_AGG 1ull
#define ST_PREFIX 2ull

__device__ __forceinline__ unsigned to_bits(float v) { return __float_as_uint(v); }
__device__ __forceinline__ unsigned to_bits(int v) { return (unsigned)v; }
__device__ __forceinline__ void from_bits(unsigned b, float* v) { *v = __uint_as_float(b); }
__device__ __forceinline__ void from_bits(unsigned b, int* v) { *v = (int)b; }

template <class T>
__device__ __forceinline__ unsigned long long pack(unsigned long long status, T v) {
    return (status << 32) | (unsigned long long)to_bits(v);
}
template <class T>
__device__ __forceinline__ T unpack(unsigned long long w) {
    T v;
    from_bits((unsigned)(w & 0xffffffffull), &v);
    return v;
}

template <class T>
__device__ void scan_lookback(const T* x, T* out, unsigned long long* state, long long n) {
    // state[0]: the tile counter; state[1 + tile]: that tile's published word. Zeroed by
    // the caller.
    __shared__ T sTile[PAD(RTS_TILE)];
    __shared__ T sWarp[33];
    __shared__ long long sTileId;
    __shared__ T sCarry;
    if (threadIdx.x == 0) sTileId = (long long)atomicAdd(&state[0], 1ull);
    __syncthreads();
    long long tile = sTileId;
    long long base = tile * RTS_TILE;
    volatile unsigned long long* flags = state + 1;

    T r[ITEMS];
    load_blocked(x, base, n, sTile, r);
    T mine = T(0);
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) mine += r[k];
    T total;
    block_exclusive_scan(mine, sWarp, &total);  // total: this tile's sum
    if (threadIdx.x == 0) {
        if (tile == 0) {
            flags[0] = pack(ST_PREFIX, total);
            sCarry = T(0);
        } else {
            flags[tile] = pack(ST_AGG, total);  // let successors skip past this tile early
            T carry = T(0);
            // look back until an inclusive prefix is found
            for (long long j = tile - 1; j >= 0; --j) {
                unsigned long long w;
                // the predecessor is running: it will publish
                do { w = flags[j]; } while ((w >> 32) == 0);
                carry += unpack<T>(w);
                if ((w >> 32) == ST_PREFIX) break;
            }
            __threadfence();
            flags[tile] = pack(ST_PREFIX, carry + total);
            sCarry = carry;
        }
    }
    __syncthreads();
    scan_store_blocked(r, sCarry, out, base, n, sTile, sWarp);
}
// --8<-- [end:lookback]

// --8<-- [start:lookback_warp]
// v6: v5 with the look-back done by warp 0 as a whole, and one block-wide scan per tile instead of
// two (each thread scans its 16 elements first, so the block scan of the thread totals gives both
// the tile's sum and every thread's offset). Each lane reads the words of LB_PER_LANE consecutive
// predecessors - a window of 32 * LB_PER_LANE tiles per round trip to L2 instead of one tile - and
// the warp waits until every word of the window is published. The nearest tile with an inclusive
// prefix (found with a ballot over the lanes that hold one) ends the look-back: the words up to it
// contribute, a shuffle reduction adds them up. Without a prefix in the window, everything is added
// and the window moves back. LB_PER_LANE = 1 reads one predecessor per lane (a window of 32). A
// wider window takes fewer round trips when the nearest inclusive prefix is far back, but makes the
// warp wait until more predecessors have published: the chapter's exercises measure the trade-off.
#define LB_PER_LANE 1
template <class T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
    return v;
}

template <class T>
__device__ void scan_lookback_warp(const T* x, T* out, unsigned long long* state, long long n) {
    __shared__ T sTile[PAD(RTS_TILE)];
    __shared__ T sWarp[33];
    __shared__ long long sTileId;
    __shared__ T sCarry;
    if (threadIdx.x == 0) sTileId = (long long)atomicAdd(&state[0], 1ull);
    __syncthreads();
    const long long tile = sTileId, base = tile * RTS_TILE;
    volatile unsigned long long* flags = state + 1;
    const int lane = threadIdx.x & 31;

    T r[ITEMS];
    load_blocked(x, base, n, sTile, r);
#pragma unroll
    for (int k = 1; k < ITEMS; ++k) r[k] += r[k - 1];  // this thread's chunk, scanned in registers
    T total;
    // one block scan (v5 does two)
    const T prefix = block_exclusive_scan(r[ITEMS - 1], sWarp, &total);
    if (threadIdx.x < 32) {  // warp 0 looks back while the other warps wait at the barrier below
        T carry = T(0);
        if (tile == 0) {
            if (lane == 0) flags[0] = pack(ST_PREFIX, total);
        } else {
            if (lane == 0) flags[tile] = pack(ST_AGG, total);
            for (long long j0 = tile - 1;; j0 -= 32 * LB_PER_LANE) {
                // lane i reads tiles j0 - LB_PER_LANE * i - q, q = 0 .. LB_PER_LANE - 1 (nearest
                // first); before tile 0 there is nothing to add: read it as an inclusive prefix
                // of zero
                unsigned long long w[LB_PER_LANE];
#pragma unroll
                for (int q = 0; q < LB_PER_LANE; ++q) {
                    const long long j = j0 - LB_PER_LANE * lane - q;
                    w[q] = j >= 0 ? flags[j] : pack(ST_PREFIX, T(0));
                }
                bool waiting = true;
                // some predecessor in the window has not published
                while (__any_sync(0xffffffffu, waiting)) {
                    waiting = false;
#pragma unroll
                    for (int q = 0; q < LB_PER_LANE; ++q)
                        if ((w[q] >> 32) == 0) {
                            w[q] = flags[j0 - LB_PER_LANE * lane - q];
                            waiting |= (w[q] >> 32) == 0;
                        }
                }
                int first = LB_PER_LANE;  // this lane's nearest inclusive prefix, if it has one
#pragma unroll
                for (int q = LB_PER_LANE - 1; q >= 0; --q)
                    if ((w[q] >> 32) == ST_PREFIX) first = q;
                const unsigned prefixes = __ballot_sync(0xffffffffu, first < LB_PER_LANE);
                // the lane with the nearest prefix
                const int stop = prefixes ? __ffs(prefixes) - 1 : 31;
                T v = T(0);
                // everything up to and including the nearest prefix
#pragma unroll
                for (int q = 0; q < LB_PER_LANE; ++q)
                    if (lane < stop || (lane == stop && q <= first)) v += unpack<T>(w[q]);
                carry += warp_sum(v);
                if (prefixes) break;
            }
            if (lane == 0) {
                __threadfence();
                flags[tile] = pack(ST_PREFIX, carry + total);
            }
        }
        if (lane == 0) sCarry = carry;
    }
    __syncthreads();
    const T offset = prefix + sCarry;
    const int t = threadIdx.x;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) sTile[PAD(t * ITEMS + k)] = r[k] + offset;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {  // coalesced stores, as in scan_store_blocked
        const int j = k * RTS_THREADS + t;
        if (base + j < n) out[base + j] = sTile[PAD(j)];
    }
}
// --8<-- [end:lookback_warp]

// --8<-- [start:lookback_v7]
// v7: CUB's recipe. A larger tile (BLOCK_THREADS threads x THREAD_ITEMS elements), read with
// 16-byte vector loads, one block barrier before the tile's sum is published, and the look-back
// overlapped with the rest of the block's work. Each warp owns a contiguous segment of
// 32 * THREAD_ITEMS elements and its own slice of shared memory, so the transposes between the
// warp-striped vectors of global memory and the blocked order of the sequential scan need only
// __syncwarp, not a block barrier. The state words are v5's (the tile counter in state[0], then one
// word per tile). v7 is V7_THREADS x V7_ITEMS; v8 is the same code at V8_THREADS x V8_ITEMS.
#ifndef V7_THREADS
#define V7_THREADS 512
#define V7_ITEMS 16
#define V8_THREADS 256
#define V8_ITEMS 32
#endif

__device__ __forceinline__ bool aligned16(const void* p) {
    return (reinterpret_cast<unsigned long long>(p) & 15ull) == 0;
}
template <class T>
__device__ __forceinline__ T of_bits(unsigned b) {
    T v;
    from_bits(b, &v);
    return v;
}

// The carry of `tile` (the sum of every tile before it; tile > 0), by one whole warp: lane i reads
// the word of tile j0 - i, the warp waits until all 32 have published, and adds the values up to
// and including the nearest inclusive prefix (v6 with one word per lane). Every lane returns it.
template <class T>
__device__ __forceinline__ T warp_lookback(volatile unsigned long long* flags, long long tile) {
    const int lane = threadIdx.x & 31;
    T carry = T(0);
    for (long long j0 = tile - 1;; j0 -= 32) {
        const long long j = j0 - lane;
        // before tile 0 there is nothing to add: an inclusive prefix of zero
        unsigned long long w = j >= 0 ? flags[j] : pack(ST_PREFIX, T(0));
        while (__any_sync(0xffffffffu, (w >> 32) == 0))
            if ((w >> 32) == 0) w = flags[j];  // only lanes with j >= 0 can be waiting
        const unsigned prefixes = __ballot_sync(0xffffffffu, (w >> 32) == ST_PREFIX);
        const int stop = prefixes ? __ffs(prefixes) - 1 : 31;  // the nearest inclusive prefix
        carry += warp_sum(lane <= stop ? unpack<T>(w) : T(0));
        if (prefixes) return carry;
    }
}

template <class T, int BLOCK_THREADS, int THREAD_ITEMS>
__device__ void scan_lookback_v7(const T* __restrict__ x, T* __restrict__ out,
                                 unsigned long long* state, long long n) {
    static_assert(BLOCK_THREADS % 32 == 0 && BLOCK_THREADS / 32 <= 32,
                  "whole warps, at most 32 of them");
    static_assert(THREAD_ITEMS % 4 == 0, "each lane loads and stores THREAD_ITEMS / 4 vectors");
    constexpr int TILE_N = BLOCK_THREADS * THREAD_ITEMS;  // elements per tile
    constexpr int SEG = 32 * THREAD_ITEMS;                // elements per warp segment
    constexpr int WARPS = BLOCK_THREADS / 32;
    __shared__ T sSeg[WARPS][PAD(SEG)];  // one slice per warp: (WARPS, SEG + padding)
    __shared__ T sWarp[WARPS];           // each warp's total
    __shared__ long long sTileId;
    __shared__ T sCarry;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    if (t == 0) sTileId = (long long)atomicAdd(&state[0], 1ull);  // forward progress, as in v5
    __syncthreads();
    const long long tile = sTileId, base = tile * TILE_N;
    const long long gseg = base + (long long)warp * SEG;  // this warp's first element
    const bool full = base + TILE_N <= n;                 // no element of the tile is past n
    volatile unsigned long long* flags = state + 1;
    T* s = sSeg[warp];

    // 1. Load. A full tile at a 16-byte aligned x (base is a multiple of 4 elements): vector q of
    // the warp is lane q % 32's, elements 4q .. 4q + 3 of the segment, 512 contiguous bytes per
    // instruction. Otherwise (the last tile, or x not aligned) one element per lane per step.
    if (full && aligned16(x)) {
        const uint4* gv = reinterpret_cast<const uint4*>(x + gseg);
        uint4 v[THREAD_ITEMS / 4];
#pragma unroll
        for (int k = 0; k < THREAD_ITEMS / 4; ++k) v[k] = gv[k * 32 + lane];  // all loads in flight
#pragma unroll
        for (int k = 0; k < THREAD_ITEMS / 4; ++k) {
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
            s[PAD(e)] = gseg + e < n ? x[gseg + e] : T(0);  // past the end: the identity of +
        }
    }
    __syncwarp();
    T r[THREAD_ITEMS];  // blocked: lane i holds elements i * THREAD_ITEMS .. of the segment
#pragma unroll
    for (int k = 0; k < THREAD_ITEMS; ++k) r[k] = s[PAD(lane * THREAD_ITEMS + k)];

    // 2. Scan in registers, then across the warp; one block barrier shares the warp totals.
#pragma unroll
    for (int k = 1; k < THREAD_ITEMS; ++k) r[k] += r[k - 1];
    const T incl = warp_inclusive_scan(r[THREAD_ITEMS - 1]);
    T lane_excl = __shfl_up_sync(0xffffffffu, incl, 1);
    if (lane == 0) lane_excl = T(0);
    if (lane == 31) sWarp[warp] = incl;
    __syncthreads();
    // every warp scans the warp totals itself: its own offset and the tile's sum, no second barrier
    const T wt = lane < WARPS ? sWarp[lane] : T(0);
    const T wincl = warp_inclusive_scan(wt);
    const T total = __shfl_sync(0xffffffffu, wincl, 31);
    T warp_excl = __shfl_sync(0xffffffffu, wincl, (warp + 31) & 31);
    if (warp == 0) warp_excl = T(0);

    // 3. Publish the tile's sum at once (tile 0 publishes its inclusive prefix: it has no carry).
    if (t == 0) flags[tile] = pack(tile == 0 ? ST_PREFIX : ST_AGG, total);

    // 4. Every warp finishes its local work - the in-tile prefix added, back to striped order in
    // its slice - while warp 0 looks back; only the carry is left for after the barrier.
    const T offset = warp_excl + lane_excl;
    __syncwarp();  // every lane has read its elements: the slice may be overwritten
#pragma unroll
    for (int k = 0; k < THREAD_ITEMS; ++k) s[PAD(lane * THREAD_ITEMS + k)] = r[k] + offset;
    if (warp == 0) {
        T carry = T(0);
        if (tile > 0) {
            carry = warp_lookback<T>(flags, tile);
            // one 64-bit store carries status and value: no fence is needed to order them
            if (lane == 0) flags[tile] = pack(ST_PREFIX, carry + total);
        }
        if (lane == 0) sCarry = carry;
    }
    __syncthreads();
    const T carry = sCarry;

    // 5. Store, in the order of the loads.
    if (full && aligned16(out)) {
        uint4* gv = reinterpret_cast<uint4*>(out + gseg);
#pragma unroll
        for (int k = 0; k < THREAD_ITEMS / 4; ++k) {
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
}
// --8<-- [end:lookback_v7]

#define INSTANTIATE(T, S)                                                                         \
    extern "C" __global__ void __launch_bounds__(TILE)                                            \
        scan_tiles_ks_##S(const T* x, T* out, T* sums, long long n) {                             \
        scan_tiles_ks<T>(x, out, sums, n);                                                        \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(TILE / 2)                                        \
        scan_tiles_bk_##S(const T* x, T* out, T* sums, long long n) {                             \
        scan_tiles_bk<T>(x, out, sums, n);                                                        \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(TILE)                                            \
        add_offsets_##S(T* out, const T* sums, long long n) {                                     \
        add_offsets<T>(out, sums, n);                                                             \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(RTS_THREADS)                                     \
        reduce_tiles_##S(const T* x, T* sums, long long n) {                                      \
        reduce_tiles<T>(x, sums, n);                                                              \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(SUMS_THREADS)                                    \
        scan_sums_##S(T* sums, long long tiles) {                                                 \
        scan_sums<T>(sums, tiles);                                                                \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(RTS_THREADS)                                     \
        scan_tiles_rts_##S(const T* x, T* out, const T* offsets, long long n) {                   \
        scan_tiles_rts<T>(x, out, offsets, n);                                                    \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(RTS_THREADS)                                     \
        scan_lookback_##S(const T* x, T* out, unsigned long long* state, long long n) {           \
        scan_lookback<T>(x, out, state, n);                                                       \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(RTS_THREADS)                                     \
        scan_lookback_warp_##S(const T* x, T* out, unsigned long long* state, long long n) {      \
        scan_lookback_warp<T>(x, out, state, n);                                                  \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(V7_THREADS, 2)                                   \
        scan_lookback_v7_##S(const T* x, T* out, unsigned long long* state, long long n) {        \
        scan_lookback_v7<T, V7_THREADS, V7_ITEMS>(x, out, state, n);                              \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(V8_THREADS, 2)                                   \
        scan_lookback_v8_##S(const T* x, T* out, unsigned long long* state, long long n) {        \
        scan_lookback_v7<T, V8_THREADS, V8_ITEMS>(x, out, state, n);                              \
    }

INSTANTIATE(float, f32)
INSTANTIATE(int, i32)
