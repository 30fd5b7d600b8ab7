// A CPU emulator for the book's CUDA exercises: enough of CUDA C++ to run a small kernel, deterministically.
//
// Every CUDA thread of a block is a fiber (ucontext), all on one OS thread. The scheduler runs the fibers
// one after another in thread order (or in reverse order: `order` 1), each until it finishes or reaches a
// barrier (__syncthreads, __syncwarp, a shuffle, a vote); a barrier opens when every thread that has not
// exited waits at it. So the code between two barriers runs thread by thread: a missing __syncthreads
// gives wrong results every time, not once in a while, and one of the two orders exposes a read of a
// value that another thread writes later. Blocks run one after another, so __shared__ arrays can be
// `static`. A __syncthreads that not every thread reaches is reported (the run stops with a message),
// as compute-sanitizer's synccheck would.
//
// Not emulated: timing, memory spaces (every pointer is host memory), dynamic shared memory, streams,
// cooperative groups, tensor cores, half precision. The exercises use none of them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <ucontext.h>
#include <vector>

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
using uint3 = dim3;

struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

namespace emu {

enum State { RUN, WAIT_BLOCK, WAIT_WARP, DONE };

struct Fiber {
    ucontext_t ctx;
    char* stack = nullptr;
    dim3 tid;
    unsigned linear = 0;
    State state = RUN;
    unsigned mask = 0;   // the lanes a warp barrier waits for
    int line = 0;        // where it waits at __syncthreads
};

inline constexpr size_t STACK_BYTES = 64 * 1024;
inline ucontext_t scheduler;
inline std::vector<Fiber> fibers;
inline Fiber* current = nullptr;
inline std::function<void()> body;
inline std::vector<uint64_t> slots;  // one exchange word per thread, for shuffles and votes
inline std::string error;

inline dim3 threadIdx_, blockIdx_, blockDim_, gridDim_;

inline void trampoline() {
    body();
    current->state = DONE;  // uc_link returns to the scheduler
}

inline void wait(State s, unsigned mask, int line) {
    current->state = s;
    current->mask = mask;
    current->line = line;
    swapcontext(&current->ctx, &scheduler);
}

inline unsigned lane() { return current->linear % 32; }
inline unsigned warp_base() { return current->linear - current->linear % 32; }

// Open the barriers that every live participant has reached. Returns false on a deadlock.
inline bool release() {
    bool opened = false;
    size_t n = fibers.size();
    for (size_t base = 0; base < n; base += 32) {  // warp barriers first
        unsigned waiting = 0, live = 0, want = 0;
        for (size_t l = 0; l < 32 && base + l < n; ++l) {
            const Fiber& f = fibers[base + l];
            if (f.state != DONE) live |= 1u << l;
            if (f.state == WAIT_WARP) { waiting |= 1u << l; want |= f.mask; }
        }
        if (waiting && ((want & live) & ~waiting) == 0) {
            for (size_t l = 0; l < 32 && base + l < n; ++l)
                if (waiting >> l & 1u) fibers[base + l].state = RUN;
            opened = true;
        }
    }
    if (opened) return true;
    int line = -1;
    bool all = true, any = false;
    for (const Fiber& f : fibers) {
        if (f.state == DONE) continue;
        if (f.state != WAIT_BLOCK) { all = false; break; }
        if (line >= 0 && f.line != line) {
            error = "threads of one block wait at different __syncthreads() (lines " + std::to_string(line) +
                    " and " + std::to_string(f.line) + "): a __syncthreads() inside a branch that not every "
                    "thread takes";
            return false;
        }
        line = f.line;
        any = true;
    }
    if (all && any) {
        size_t done = 0;
        for (const Fiber& f : fibers) done += f.state == DONE;
        if (done) {
            error = "thread " + std::to_string(std::find_if(fibers.begin(), fibers.end(), [](const Fiber& f) {
                        return f.state == DONE; }) - fibers.begin()) +
                    " of a block returned while others wait at the __syncthreads() of line " +
                    std::to_string(line) + ": every thread of the block must reach each __syncthreads()";
            return false;
        }
        for (Fiber& f : fibers) if (f.state == WAIT_BLOCK) f.state = RUN;
        return true;
    }
    if (!any && all) return true;  // everything finished
    error = "deadlock: some threads wait at a warp barrier (a shuffle, a vote or __syncwarp) for lanes of "
            "their mask that never get there";
    return false;
}

// Run body() for every thread of every block. order 0: threads and blocks in increasing order; 1: reversed.
inline int launch(dim3 grid, dim3 block, int order, std::function<void()> kernel_call) {
    error.clear();
    body = std::move(kernel_call);
    blockDim_ = block;
    gridDim_ = grid;
    unsigned threads = block.x * block.y * block.z;
    unsigned blocks = grid.x * grid.y * grid.z;
    if (threads == 0 || threads > 1024) {
        error = "a block must have 1 to 1024 threads, this launch asks for " + std::to_string(threads);
        return 1;
    }
    fibers.assign(threads, Fiber{});
    slots.assign(threads, 0);
    std::vector<char*> stacks(threads);
    for (auto& s : stacks) s = static_cast<char*>(std::malloc(STACK_BYTES));
    int rc = 0;
    for (unsigned bi = 0; bi < blocks && rc == 0; ++bi) {
        unsigned b = order ? blocks - 1 - bi : bi;
        blockIdx_ = dim3(b % grid.x, b / grid.x % grid.y, b / (grid.x * grid.y));
        for (unsigned t = 0; t < threads; ++t) {
            Fiber& f = fibers[t];
            f = Fiber{};
            f.linear = t;
            f.tid = dim3(t % block.x, t / block.x % block.y, t / (block.x * block.y));
            f.stack = stacks[t];
            getcontext(&f.ctx);
            f.ctx.uc_stack.ss_sp = f.stack;
            f.ctx.uc_stack.ss_size = STACK_BYTES;
            f.ctx.uc_link = &scheduler;
            makecontext(&f.ctx, trampoline, 0);
        }
        for (;;) {
            bool ran = false;
            for (unsigned i = 0; i < threads; ++i) {
                Fiber& f = fibers[order ? threads - 1 - i : i];
                if (f.state != RUN) continue;
                current = &f;
                threadIdx_ = f.tid;
                swapcontext(&scheduler, &f.ctx);
                ran = true;
            }
            bool done = std::all_of(fibers.begin(), fibers.end(), [](const Fiber& f) { return f.state == DONE; });
            if (done) break;
            if (!release()) { rc = 1; break; }
            (void)ran;
        }
        if (rc) error = "block (" + std::to_string(blockIdx_.x) + ", " + std::to_string(blockIdx_.y) + ", " +
                        std::to_string(blockIdx_.z) + "): " + error;
    }
    for (auto& s : stacks) std::free(s);
    current = nullptr;
    return rc;
}

template <class T> inline void put(T v) {
    uint64_t w = 0;
    std::memcpy(&w, &v, sizeof(T));
    slots[current->linear] = w;
}
template <class T> inline T get(unsigned linear) {
    T v;
    std::memcpy(&v, &slots[linear], sizeof(T));
    return v;
}
template <class T> inline T exchange(unsigned mask, T v, unsigned src_lane) {
    put(v);
    wait(WAIT_WARP, mask, 0);
    T r = get<T>(warp_base() + src_lane);
    wait(WAIT_WARP, mask, 0);
    return r;
}

}  // namespace emu

#define threadIdx (emu::threadIdx_)
#define blockIdx (emu::blockIdx_)
#define blockDim (emu::blockDim_)
#define gridDim (emu::gridDim_)
static constexpr int warpSize = 32;

#define __global__
#define __device__
#define __host__
#define __constant__
#define __shared__ static
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __syncthreads() emu::wait(emu::WAIT_BLOCK, 0, __LINE__)

inline void __syncwarp(unsigned mask = 0xffffffffu) { emu::wait(emu::WAIT_WARP, mask, 0); }

template <class T> inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    unsigned base = emu::lane() / width * width;
    return emu::exchange(mask, v, base + (unsigned(src) % width));
}
template <class T> inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    unsigned l = emu::lane(), base = l / width * width;
    T r = emu::exchange(mask, v, l - base >= delta ? l - delta : l);
    return r;
}
template <class T> inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    unsigned l = emu::lane(), base = l / width * width;
    return emu::exchange(mask, v, l - base + delta < unsigned(width) ? l + delta : l);
}
template <class T> inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    unsigned l = emu::lane(), base = l / width * width, src = l ^ unsigned(lane_mask);
    return emu::exchange(mask, v, src / width * width == base ? src : l);
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
    emu::put<int>(pred != 0);
    emu::wait(emu::WAIT_WARP, mask, 0);
    unsigned bits = 0, base = emu::warp_base();
    for (unsigned l = 0; l < 32 && base + l < emu::fibers.size(); ++l)
        if ((mask >> l & 1u) && emu::get<int>(base + l)) bits |= 1u << l;
    emu::wait(emu::WAIT_WARP, mask, 0);
    return bits;
}
inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
inline int __all_sync(unsigned mask, int pred) { return (__ballot_sync(mask, pred) & mask) == mask; }
inline unsigned __activemask() {
    unsigned bits = 0, base = emu::warp_base();
    for (unsigned l = 0; l < 32 && base + l < emu::fibers.size(); ++l)
        if (emu::fibers[base + l].state != emu::DONE) bits |= 1u << l;
    return bits;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x ? __builtin_clz(unsigned(x)) : 32; }

// One OS thread runs every fiber, and a fiber never yields inside an atomic: plain read-modify-writes.
template <class T> inline T atomicAdd(T* p, T v) { T old = *p; *p = old + v; return old; }
template <class T> inline T atomicSub(T* p, T v) { T old = *p; *p = old - v; return old; }
template <class T> inline T atomicMax(T* p, T v) { T old = *p; *p = std::max(old, v); return old; }
template <class T> inline T atomicMin(T* p, T v) { T old = *p; *p = std::min(old, v); return old; }
template <class T> inline T atomicExch(T* p, T v) { T old = *p; *p = v; return old; }
template <class T> inline T atomicCAS(T* p, T cmp, T v) { T old = *p; if (old == cmp) *p = v; return old; }

inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __saturatef(float x) { return std::fmin(1.0f, std::fmax(0.0f, x)); }
template <class T> inline T __ldg(const T* p) { return *p; }
