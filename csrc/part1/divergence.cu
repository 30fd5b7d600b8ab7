// Warp divergence, measured: every thread runs one of two equally long loops, chosen by a
// per-element flag.
//
// A warp issues one instruction for all 32 threads. If its threads disagree on the branch, the warp
// runs the taken path with the other threads masked off, then the other path: both loops, one after
// the other. So the time depends on how the flags are laid out across warps, not on how many of
// each there are. Loaded from Python by snippets/part1/divergence.py.

// --8<-- [start:kernel]
extern "C" __global__ void two_paths(const float* x, const unsigned char* take_a, float* out,
                                     long long n, int iters) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    if (take_a[i]) {
        for (int k = 0; k < iters; ++k) v = fmaf(v, v, -0.5f);   // path A: v <- v*v - 0.5
    } else {
        for (int k = 0; k < iters; ++k) v = fmaf(v, 0.5f, 0.25f);  // path B: v <- v/2 + 1/4
    }
    out[i] = v;
}
// --8<-- [end:kernel]
