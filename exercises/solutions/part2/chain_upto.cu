/*
 * part2.registers.6: The chain with a run-time number of slots, its array in registers
 *
 * The reference solution.
 *
 * Chapter: docs/part2/registers.md, exercise 6. Difficulty 2 of 4 (write a few lines).
 *
 * chain_registers takes its number of slots as a template parameter: spill.cu compiles one kernel
 * per value. chain_upto below takes it at run time, as the kernel argument slots (1 to MAX_SLOTS).
 * It computes the right values, but its loops run to slots: they cannot be unrolled, so a[k] has
 * an index known only at run time, and a lives in local memory (ptxas reports a stack frame).
 * Rewrite the loops so that every index of a is a compile-time constant: loops that run to
 * MAX_SLOTS, fully unrolled, in which slots only decides which iterations count. The sum keeps
 * chain_registers' order, a[slots - 1] first. The check compiles the kernel for sm_90 and wants no
 * ld.local or st.local in the PTX, no stack frame and no spills in the -Xptxas -v report; then it
 * runs the kernel on the CPU emulator for several numbers of slots and compares out with the
 * book's chain_sum_ref.
 *
 * Check it:  python -m snippets exercise check part2.registers.6
 */

// 31/32 and 1/16 are exact in fp32, as in spill.cu: a[k] tends to D / (1 - C) = 2.
constexpr float C = 0.96875f;
constexpr float D = 0.0625f;
constexpr int MAX_SLOTS = 16;  // the largest number of slots the kernel accepts: 1 <= slots <= MAX_SLOTS

// out[i] = a[0] + a[1] + ... + a[slots - 1], with a[0] = x[i] and a[k] = C * a[k - 1] + D.
// One thread per element; any grid that covers n.
extern "C" __global__ void chain_upto(const float* x, float* out, long long n, int slots) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float a[MAX_SLOTS];  // MAX_SLOTS registers: every index below is a compile-time constant
    a[0] = x[i];
    // all MAX_SLOTS values are made (the ones past slots are never summed): a few wasted FMAs, no address
#pragma unroll
    for (int k = 1; k < MAX_SLOTS; ++k) a[k] = fmaf(C, a[k - 1], D);
    // chain_registers' order, a[slots - 1] first: 0 + a[slots - 1] is exactly a[slots - 1]
    float s = 0.0f;
#pragma unroll
    for (int k = MAX_SLOTS - 1; k >= 0; --k)
        if (k < slots) s += a[k];  // slots decides whether the iteration counts, not which element it reads
    out[i] = s;
}
