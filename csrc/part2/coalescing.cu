// Strided and misaligned copies: out[i] = x[offset + i * stride] for i < n, loaded from Python by
// snippets/part2/coalescing.py (CuPy/NVRTC).
//
// strided_copy_v1  one thread per output element, 4-byte loads and stores     (the plain gather)
// copy_vec4        like v1 for stride 1, but 16-byte float4 loads and stores  (a quarter of
//                  the instructions)
//
// The stores are always dense and coalesced; only the loads change with stride and offset. The
// Python wrapper checks that every index is inside x, and uses copy_vec4 only when stride is 1 and
// both the source (x + offset) and out are 16-byte aligned.

// --8<-- [start:strided]
extern "C" __global__ void strided_copy_v1(const float* x, float* out, long long n,
                                           long long stride, long long offset) {
    // 64-bit: n * stride can pass 2^31
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        // Lane k of a warp reads x[offset + (i0 + k) * stride]: 32 addresses, 4 * stride
        // bytes apart.
        out[i] = x[offset + i * stride];
    }
}
// --8<-- [end:strided]

// --8<-- [start:vec4]
// src is x + offset, already 16-byte aligned (checked by the caller), and so is out.
extern "C" __global__ void copy_vec4(const float* src, float* out, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;  // index of a group of 4 floats
    long long n4 = n / 4;
    if (i < n4) {
        // One LDG.128 per thread: a warp moves 512 contiguous bytes, four full 128-byte lines.
        reinterpret_cast<float4*>(out)[i] = reinterpret_cast<const float4*>(src)[i];
    }
    if (i < n - 4 * n4) {  // the 0 to 3 elements past the last whole group, one thread each
        out[4 * n4 + i] = src[4 * n4 + i];
    }
}
// --8<-- [end:vec4]
