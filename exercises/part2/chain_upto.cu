/*
 * part2.registers.6: The chain with a run-time number of slots, its array in registers
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
 * (--solution checks the reference solution; exercise show part2.registers.6 gives the hint)
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
    float a[MAX_SLOTS];
    // YOUR CODE HERE: the loops below are right but end at slots, a run-time value, and the sum starts
    // at a[slots - 1]: a needs an address, so it is in local memory. Make every index of a a compile-time
    // constant (run each loop to MAX_SLOTS and #pragma unroll it; let slots decide what is summed).
    a[0] = x[i];
    for (int k = 1; k < slots; ++k) a[k] = fmaf(C, a[k - 1], D);
    float s = a[slots - 1];  // the last value made is the first one summed
    for (int k = slots - 2; k >= 0; --k) s += a[k];
    out[i] = s;
}
