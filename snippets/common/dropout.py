"""Dropout that stores nothing for its backward, as Parts 4 and 5 use it: Triton's counter-based
generator (Philox-4x32-10) computed bit for bit in NumPy (the exact reference), the checks of a
dropout probability and seed, and the seeded dropout kernel (Part 4's ``dropout`` v2, the dropout
step of Part 5's unfused chain).

Element ``i`` is kept when ``tl.rand(seed, i) >= p`` and scaled by ``1 / (1 - p)``; the random
number is a pure function of ``(seed, i)``, so the backward regenerates the same keep bits.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from snippets._checks import check_int, check_scalar, check_tensors, refuse_grad, triton_device

FLOAT_TYPES = (torch.float32, torch.float16, torch.bfloat16)
# Triton passes a Python int as int32 or int64; the generator's key is its 64 bits
SEED_LIMIT = 2**63


# --------------------------------------------------------------------------------------------------
# Philox-4x32-10 in NumPy: the numbers tl.randint / tl.rand / tl.rand4x give, bit for bit
# --------------------------------------------------------------------------------------------------

# --8<-- [start:philox]
# Salmon et al., "Parallel random numbers: as easy as 1, 2, 3" (SC 2011), Philox-4x32: a 128-bit
# counter (c0, c1, c2, c3) and a 64-bit key (k0, k1); each round multiplies two counter words by
# fixed constants, mixes the high and low halves of the products with the other words and the key,
# and bumps the key by a Weyl sequence (the constants are the golden ratio and sqrt(3) - 1 in 32-bit
# fixed point).
PHILOX_ROUND_A, PHILOX_ROUND_B = np.uint32(0xD2511F53), np.uint32(0xCD9E8D57)
PHILOX_KEY_A, PHILOX_KEY_B = np.uint32(0x9E3779B9), np.uint32(0xBB67AE85)
N_ROUNDS = 10  # triton.language.random.N_ROUNDS_DEFAULT


def _mul_hi_lo(a: np.uint32, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The high and low 32 bits of the 64-bit product a * b."""
    prod = np.uint64(a) * b.astype(np.uint64)
    return ((prod >> np.uint64(32)).astype(np.uint32),
            (prod & np.uint64(0xFFFFFFFF)).astype(np.uint32))


def philox4x32(c0, c1, c2, c3, k0, k1, n_rounds: int = N_ROUNDS):
    """Philox-4x32 on arrays of uint32 counters with a uint32 key pair: four uint32 arrays."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint32) for c in (c0, c1, c2, c3))
    k0, k1 = np.uint32(k0), np.uint32(k1)
    with np.errstate(over="ignore"):  # the key's additions wrap modulo 2^32 on purpose
        for _ in range(n_rounds):
            hi_b, lo_b = _mul_hi_lo(PHILOX_ROUND_B, c2)
            hi_a, lo_a = _mul_hi_lo(PHILOX_ROUND_A, c0)
            c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
            k0, k1 = k0 + PHILOX_KEY_A, k1 + PHILOX_KEY_B
    return c0, c1, c2, c3


def randint4x_ref(seed: int, offsets: np.ndarray):
    """tl.randint4x(seed, offsets): the seed is the key (low word k0, high word k1), the element's
    offset is the counter (low word c0, high word c1; c2 = c3 = 0). Four uint32 arrays."""
    offsets = np.asarray(offsets, dtype=np.uint64)
    zero = np.zeros(offsets.shape, dtype=np.uint32)
    return philox4x32((offsets & np.uint64(0xFFFFFFFF)).astype(np.uint32),
                      (offsets >> np.uint64(32)).astype(np.uint32), zero, zero, seed & 0xFFFFFFFF,
                      seed >> 32)


def randint_ref(seed: int, offsets: np.ndarray) -> np.ndarray:
    """tl.randint(seed, offsets): the first of the four words."""
    return randint4x_ref(seed, offsets)[0]


def uint_to_uniform_ref(u: np.ndarray) -> np.ndarray:
    """A uint32 to a float32 in [0, 1), as Triton does it: read the bits as int32, fold the negative
    half onto the positive one (~x), so 31 random bits remain, and multiply by 4.6566127342e-10
    (just under 2^-31, so that 2^31 - 1 times it rounds to a float32 below 1)."""
    i = np.asarray(u, dtype=np.uint32).view(np.int32)
    i = np.where(i < 0, ~i, i)
    return i.astype(np.float32) * np.float32(4.6566127342e-10)


def rand_ref(seed: int, offsets: np.ndarray) -> np.ndarray:
    """tl.rand(seed, offsets): float32 in [0, 1)."""
    return uint_to_uniform_ref(randint_ref(seed, offsets))
# --8<-- [end:philox]


def keep_ref(seed: int, p: float, n: int, per_call: int = 1) -> np.ndarray:
    """The keep bits of v2 (``per_call=1``: element i uses rand(seed, i)) or v3 (``per_call=4``:
    element i uses word i % 4 of Philox at counter i // 4), as a bool array of n."""
    i = np.arange(n, dtype=np.uint64)
    if per_call == 1:
        u = rand_ref(seed, i)
    elif per_call == 4:
        words = np.stack([uint_to_uniform_ref(w)
                          for w in randint4x_ref(seed, np.arange((n + 3) // 4))], axis=1)
        u = words.reshape(-1)[:n]  # element 4j + c is word c of counter j
    else:
        raise ValueError(f"per_call must be 1 or 4, got {per_call}")
    return u >= np.float32(p)  # p is a float32 in the kernel too


# --------------------------------------------------------------------------------------------------
# The checks and the seeded dropout kernel
# --------------------------------------------------------------------------------------------------

# --8<-- [start:check_args]
def check_p_seed(p: float, seed: int) -> tuple[float, float, int]:
    """Validate a dropout probability and a Philox seed; returns (p, scale, seed) with scale = 1 /
    (1 - p)."""
    p = check_scalar("p", p)
    if not 0.0 <= p <= 1.0:  # also refuses nan
        raise ValueError(f"p must be in [0, 1], got {p}")
    seed = check_int("seed", seed, 0)
    if seed >= SEED_LIMIT:
        raise ValueError(f"seed must be below 2**63, got {seed}")
    # p = 1: every element is dropped, nothing to scale
    scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
    return p, scale, seed


def check_dropout_args(x: torch.Tensor, p: float, seed: int) -> tuple[float, float, int]:
    """Validate the arguments of every Triton dropout version; returns (p, scale, seed)."""
    check_tensors(("x",), (x,), dtypes=FLOAT_TYPES, device=triton_device())
    return check_p_seed(p, seed)
# --8<-- [end:check_args]


# --8<-- [start:kernel]
# 2048 elements per program, 8 warps: 8 per thread (two 16-byte fp32 vectors), and 8 independent
# Philox evaluations per thread for the scheduler to overlap with the loads.
BLOCK = 2048
NUM_WARPS = 8


@triton.jit
def dropout_kernel(x_ptr, y_ptr, mask_ptr, n, p, scale, seed, BLOCK: tl.constexpr,
                   STORE_MASK: tl.constexpr):
    # the element index is the counter
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    in_range = offs < n
    x = tl.load(x_ptr + offs, mask=in_range)
    keep = tl.rand(seed, offs) >= p               # Philox(key=seed, counter=i) -> uniform in [0, 1)
    y = tl.where(keep, x.to(tl.float32) * scale, 0.0)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=in_range)
    if STORE_MASK:                                # v1 only: one byte per element for the backward
        tl.store(mask_ptr + offs, keep.to(tl.uint8), mask=in_range)
# --8<-- [end:kernel]


# --8<-- [start:host_v2]
def seeded_dropout(x: torch.Tensor, p: float, seed: int) -> torch.Tensor:
    """v2: y = x * keep / (1 - p), keep regenerated from (seed, element index): no mask. Called on
    dy with the same seed, it is also the backward."""
    refuse_grad("seeded_dropout", x, instead="SeededDropout.apply")
    p, scale, seed = check_dropout_args(x, p, seed)
    y, n = torch.empty_like(x), x.numel()
    if n:
        dropout_kernel[(triton.cdiv(n, BLOCK),)](x, y, y, n, p, scale, seed, BLOCK=BLOCK,
                                                 STORE_MASK=False, num_warps=NUM_WARPS)
    return y
# --8<-- [end:host_v2]
