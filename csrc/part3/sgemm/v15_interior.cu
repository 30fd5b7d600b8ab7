// SGEMM v15: v12's template (csrc/part3/sgemm/v11_tuned.cu) with INTERIOR on. A block whose tile
// lies inside C, on 16-byte aligned rows, loads every whole K-step with unconditional float4 loads
// from pointers planned once; edge blocks, a ragged last step and unaligned rows keep v12's
// checked loads. v12's loop spends issue slots on those checks (compares, branches, the scalar
// fallback's moves) in every K-step of every block; in an FMA-bound kernel each slot an
// instruction takes is one an FFMA does not get. Launched by snippets/part3/sgemm_v15.py, which
// autotunes over v12's configurations.
#include "v11_tuned.cu"

// --8<-- [start:configs]
// One extern "C" kernel per configuration, named like v12's with sgemm_i_ for sgemm_t_.
#define SGEMM_INTERIOR(BM, BN, BK, WM, WN, NT, G, PAD)                                            \
    extern "C" __global__ void __launch_bounds__(NT)                                              \
        sgemm_i_##BM##x##BN##_k##BK##_w##WM##x##WN##_t##NT##_g##G##_p##PAD(                       \
            const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,      \
            int M, int N, int K) {                                                                \
        sgemm_tuned<BM, BN, BK, WM, WN, WM / 32, WN / 16, NT, G, PAD, true>(A, B, C, M, N, K);    \
    }

// The configurations: INTERIOR in snippets/part3/sgemm_v15.py, passed as the -D option
// SGEMM_INTERIOR_CONFIGS. The default, TUNED's first entry alone, lets this file compile alone.
#ifndef SGEMM_INTERIOR_CONFIGS
#define SGEMM_INTERIOR_CONFIGS SGEMM_INTERIOR(128, 128, 8, 64, 64, 128, 0, 4)
#endif
SGEMM_INTERIOR_CONFIGS
// --8<-- [end:configs]
