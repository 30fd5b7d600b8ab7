"""part1.execution-model.1: Occupancy from registers, shared memory and block size

The reference solution.

Chapter: docs/part1/execution-model.md, exercise 1. Difficulty 2 of 4 (write a few lines).

Compute the occupancy, on Hopper, of a kernel with 128-thread blocks that uses 72 registers per
thread and no shared memory. Write resident_blocks() and occupancy() from the chapter's formula
(registers allocated per warp in units of 256, 1 KB of shared memory reserved per block); the
check tries them on the worked example, this question, exercise 2's 1024-thread blocks at 32 and
33 registers, and more.

Check it:  python -m snippets exercise check part1.execution-model.1
"""

import math

# Per-SM limits of compute capability 9.0 (Hopper), from the CUDA C++ Programming Guide.
MAX_THREADS, MAX_BLOCKS, MAX_WARPS = 2048, 32, 64
REGISTERS, REG_UNIT = 65536, 256  # registers are allocated per warp, in units of 256
SMEM, SMEM_RESERVED = 228 * 1024, 1024  # bytes; the driver reserves 1 KB per resident block


def resident_blocks(threads: int, regs_per_thread: int, smem_per_block: int = 0) -> int:
    """How many blocks of ``threads`` threads fit on one SM."""
    warps = math.ceil(threads / 32)
    regs_per_warp = math.ceil(32 * regs_per_thread / REG_UNIT) * REG_UNIT
    return min(MAX_THREADS // (32 * warps),
               REGISTERS // (warps * regs_per_warp),
               SMEM // (smem_per_block + SMEM_RESERVED),
               MAX_BLOCKS)


def occupancy(threads: int, regs_per_thread: int, smem_per_block: int = 0) -> float:
    """Resident warps over the 64 an SM can hold."""
    return resident_blocks(threads, regs_per_thread, smem_per_block) * math.ceil(threads / 32) / MAX_WARPS
