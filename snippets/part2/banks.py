"""Shared-memory bank conflicts: a micro-benchmark in which every warp reads 32 words of shared
memory per step.

Shared memory is divided into 32 banks, 4 bytes wide: word ``w`` lives in bank ``w % 32``, and a
bank delivers one word per clock. Lane ``l`` of a warp reads, for columns ``c = 0 .. 31``, the
word at

- ``plain``     ``l * stride + c``: the column of a row-major tile whose rows are ``stride``
  words long;
- ``padded``    ``l * (stride + 1) + c``: the same tile with every row padded by one word;
- ``swizzled``  ``l * stride + (c ^ l)``: the same tile, unpadded, with the columns of row ``l``
  permuted by an XOR with the row index (``stride`` a multiple of 32).

With the plain layout a stride of ``s`` words puts ``gcd(s, 32)`` lanes' words in every bank used: a
``gcd(s, 32)``-way conflict, and the load takes that many passes. Padding (stride 33) and the
swizzle spread the 32 words over all 32 banks again.

Metric: bytes of shared memory read per second; ceiling ``smem``, registered below and measured with
this kernel at stride 1 (conflict-free). There is no library baseline (``kind="micro"``): v1 is the
CUDA kernel (``csrc/part2/banks.cu``). Each thread writes a checksum of the words it read, each
weighted by its column (wrapping at 2^32), which :func:`smem_bank_read_ref` reproduces exactly.
"""

from __future__ import annotations

import numpy as np
import torch

from snippets import cuda
from snippets._checks import check_tensors
from snippets.registry import CEILING_MEASURES, Impl, Op, register, register_ceiling

CU_FILE = "part2/banks.cu"
# banks of 4 bytes on every NVIDIA GPU since Maxwell (CUDA C++ Programming Guide, shared memory)
BANKS = 32
LAYOUTS = ("plain", "padded", "swizzled")
SMEM_WORDS = 2048  # words of the shared array
COLS = 32  # words each lane reads per step
CU_OPTIONS = cuda.defines(CU_FILE, SMEM_WORDS=SMEM_WORDS, COLS=COLS)  # banks.cu's sizes: -D options
REPS = 64  # steps: 64 * 32 reads per thread, long enough that filling shared memory is a small part
THREADS = 256


# --8<-- [start:address]
def pitch(stride: int, layout: str) -> int:
    """Words between the starts of consecutive rows: one more than ``stride`` when rows
    are padded."""
    return stride + 1 if layout == "padded" else stride


def word_address(lane, col, stride: int, layout: str):
    """The word that ``lane`` reads at column ``col`` (ints or integer tensors,
    broadcast together)."""
    row_start = lane * pitch(stride, layout)
    return row_start + (col ^ lane) if layout == "swizzled" else row_start + col


def conflict_ways(stride: int, layout: str) -> int:
    """How many passes one warp-wide read takes: the most *distinct* words that fall in one bank at
    any column (lanes that read the same word share one broadcast, so they count once)."""
    lanes = torch.arange(32)
    ways = 1
    for col in range(COLS):
        words = torch.unique(word_address(lanes, col, stride, layout))
        ways = max(ways, int(torch.bincount(words % BANKS, minlength=BANKS).max()))
    return ways
# --8<-- [end:address]


def word_values(seed: torch.Tensor) -> torch.Tensor:
    """(blocks, SMEM_WORDS) int64: the value of word w in block b, (w * w) XOR seed[b], as the
    kernel stores it."""
    w = torch.arange(SMEM_WORDS, device=seed.device, dtype=torch.int64)
    return (w * w)[None, :] ^ (seed.to(torch.int64) & 0xFFFFFFFF)[:, None]


# --8<-- [start:reference]
def smem_bank_read_ref(seed: torch.Tensor, stride: int, layout: str = "plain") -> torch.Tensor:
    """What every thread of the kernel writes: the sum, modulo 2^32, of (c + 1) * word over its
    REPS * COLS reads, c the column. The values depend only on the block (its seed) and the lane, so
    one step is computed per (block, lane) and multiplied by REPS. Shared-memory traffic of the
    kernel: THREADS * REPS * COLS * 4 bytes per block."""
    lanes = torch.arange(32, device=seed.device)
    cols = torch.arange(COLS, device=seed.device)
    addr = word_address(lanes[:, None], cols[None, :], stride, layout)  # (32, COLS)
    # column c counts c + 1 times, so the order of the reads matters
    weight = (cols + 1).to(torch.int64)
    one_step = (word_values(seed)[:, addr] * weight).sum(dim=-1)  # (blocks, 32)
    total = (one_step * REPS) & 0xFFFFFFFF  # unsigned 32-bit wrap-around, as in the kernel
    per_thread = total[:, torch.arange(THREADS, device=seed.device) % 32]  # (blocks, THREADS)
    return torch.where(per_thread >= 2**31, per_thread - 2**32,
                       per_thread).to(torch.int32).flatten()
# --8<-- [end:reference]


def _check_pattern(stride: object, layout: object) -> tuple[int, str]:
    if isinstance(stride, bool) or not isinstance(stride, (int, np.integer)):
        raise TypeError(f"stride must be a Python int, got {type(stride).__name__}")
    if not isinstance(layout, str):
        raise TypeError(f"layout must be a str, one of {LAYOUTS}; got {type(layout).__name__}")
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose one of {LAYOUTS}")
    if stride < 1:
        raise ValueError(f"stride must be >= 1, got {stride}")
    if layout == "swizzled" and stride % 32:
        raise ValueError("the swizzled layout needs a stride that is a multiple of 32 words, got "
                         f"{stride}")
    last = 31 * pitch(int(stride), layout) + COLS - 1  # the highest word any lane reads
    if last >= SMEM_WORDS:
        raise ValueError(f"stride {stride} ({layout}) would read word {last}, past the "
                         f"{SMEM_WORDS}-word shared array; the largest row pitch is "
                         f"{(SMEM_WORDS - COLS) // 31}")
    return int(stride), layout


# --8<-- [start:launch]
def smem_bank_read(seed: torch.Tensor, stride: int, layout: str = "plain") -> torch.Tensor:
    """v1: one block per entry of ``seed`` (int32), THREADS threads each; every warp reads REPS *
    COLS words of shared memory at the addresses of ``layout`` and ``stride``. Returns each thread's
    sum (int32 bits of the unsigned sum)."""
    stride, layout = _check_pattern(stride, layout)
    check_tensors(("seed",), (seed,), dtypes=(torch.int32,), device="cuda", allow_empty=False)
    if seed.dim() != 1:
        raise ValueError("seed must be one-dimensional (one entry per block), got shape "
                         f"{tuple(seed.shape)}")
    out = torch.empty(seed.numel() * THREADS, device=seed.device, dtype=torch.int32)
    name = "smem_read_swizzled" if layout == "swizzled" else "smem_read_linear"
    cuda.launch(cuda.kernel(CU_FILE, name, CU_OPTIONS), seed.numel(), THREADS,
                (seed, out, np.int32(pitch(stride, layout)), np.int32(REPS)))
    return out
# --8<-- [end:launch]


def smem_bytes_read(blocks: int) -> int:
    """Shared-memory bytes the kernel reads: every thread, REPS steps of COLS 4-byte words."""
    return blocks * THREADS * REPS * COLS * 4


# --8<-- [start:ceiling]
# 4x the benchmark grid: dozens of waves on any GPU, so the tail wave hardly counts
CEILING_BLOCKS = 16384


def measure_smem_ceiling(quick: bool) -> dict:
    """The ``smem`` ceiling: the conflict-free (stride 1) read rate of this kernel on a
    large grid."""
    from snippets.bench.timing import time_device

    seed = torch.zeros(CEILING_BLOCKS, dtype=torch.int32, device="cuda")
    t = time_device(smem_bank_read, [(seed, 1, "plain")], budget_ms=100 if quick else 300)
    return {"value": smem_bytes_read(CEILING_BLOCKS) / (t.median * 1e-3) / 1e9, "unit": "GB/s",
            "how": f"smem_bank_read stride 1, {CEILING_BLOCKS} blocks x {THREADS} threads x "
                   f"{REPS * COLS} 4-byte shared-memory reads"}


if "smem" not in CEILING_MEASURES:  # registered once, even if this module is imported again
    register_ceiling("smem", "shared-memory read bandwidth, conflict-free (stride 1)",
                     measure_smem_ceiling)
# --8<-- [end:ceiling]


def _make_inputs(size, dtype, device, gen):
    seed = torch.randint(0, 2**20, (size["blocks"],), generator=gen, dtype=torch.int32).to(device)
    return seed, size["stride"], size["layout"]


# 4096 blocks of 256 threads: several waves on a 132-SM GPU (8 such blocks fit per SM), 8.6 GB of
# shared-memory reads, so even the 32-way conflict finishes in milliseconds.
BLOCKS = 4096
SWEEP = ([{"stride": s, "layout": "plain", "blocks": BLOCKS} for s in (1, 2, 4, 8, 16, 32)]
         + [{"stride": 32, "layout": "padded", "blocks": BLOCKS},
            {"stride": 32, "layout": "swizzled", "blocks": BLOCKS}])
TEST_PATTERNS = ([(s, "plain") for s in (1, 2, 3, 4, 8, 16, 32, 33, 64)]
                 + [(1, "padded"), (32, "padded"), (32, "swizzled"), (64, "swizzled")])

smem_bank_stride = register(Op(
    name="smem_bank_stride", part=2, chapter="part2/bank-conflicts.md",
    title="Shared-memory bank conflicts", reference=smem_bank_read_ref, make_inputs=_make_inputs,
    bytes_moved=lambda s, d: smem_bytes_read(s["blocks"]), flops=lambda s, d: 0,
    metric="GB/s", ceiling="smem", kind="micro",
    # The headline is the last sweep entry, so the table of every size lists the sweep in order.
    headline=SWEEP[-1], sweep=SWEEP, sweep_axis="stride", dtypes=(torch.int32,),
    test_sizes=[{"stride": s, "layout": lay, "blocks": b} for s, lay in TEST_PATTERNS
                for b in (1, 3)],
    tolerances={torch.int32: (0.0, 0.0)}))  # integer sums: exact
smem_bank_stride.add(Impl("v1", smem_bank_read, "CUDA",
                          "each lane reads word lane * pitch + column",
                          (cuda.source_path(CU_FILE),)))
