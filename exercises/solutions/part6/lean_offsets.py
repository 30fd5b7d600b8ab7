"""part6.fp8-gemm.7: v6's descriptor offsets, and how far the window reaches

The reference solution.

Chapter: docs/part6/fp8-gemm.md, exercise 7. Difficulty 2 of 4 (write a few lines).

fp8_gemm v6 builds two wgmma descriptors once (consumer 0's rows of A and B's first slice, both
in stage 0) and adds offsets to them. Write offsets(...): the two offsets, in the descriptor's
16-byte units, for a consumer's rows of A and a slice of B in one stage at one K step. Then
largest_start(...): the largest byte address the kernel ever puts in a descriptor when its
dynamic shared memory starts as late as smem_limit allows.

Check it:  python -m snippets exercise check part6.fp8-gemm.7
"""

BLOCK_M = 128    # a tile's rows of A; each consumer owns 64 of them
ROW_BYTES = 128  # one row of a K-block: 128 e4m3 values
WGMMA_K = 32     # one wgmma's K: 32 bytes of each row
UNIT = 16        # a descriptor's start address is in 16-byte units
ALIGN = 1024     # the tiles start on the 128B swizzle's 1024-byte repeat


def stage_bytes(block_n: int) -> int:
    """One stage: A's BLOCK_M rows, then B's block_n rows (the two slices, one after the other)."""
    return (BLOCK_M + block_n) * ROW_BYTES


def offsets(block_n: int, consumer: int, stage: int, slice_: int, kk: int) -> tuple[int, int]:
    """(A's, B's) offsets in units from the two base descriptors: consumer ``consumer``'s 64 rows
    of A and B's slice ``slice_`` (block_n / 2 rows) in stage ``stage``, at K step ``kk``."""
    s = stage * stage_bytes(block_n)
    a = s + consumer * 64 * ROW_BYTES + kk * WGMMA_K
    b = s + slice_ * (block_n // 2) * ROW_BYTES + kk * WGMMA_K
    return a // UNIT, b // UNIT


def largest_start(block_n: int, stages: int, smem_limit: int) -> int:
    """The largest start address, in bytes, of any descriptor: the allocation (the stages, ALIGN bytes
    of slack, two 8-byte barriers per stage) placed as late as smem_limit allows, its tiles at the
    next multiple of ALIGN, then B's last slice in the last stage at the last K step."""
    allocation = stages * stage_bytes(block_n) + ALIGN + 16 * stages
    start = smem_limit - allocation
    base = -(-start // ALIGN) * ALIGN
    return (base + (stages - 1) * stage_bytes(block_n) + BLOCK_M * ROW_BYTES
            + (block_n // 2) * ROW_BYTES + (ROW_BYTES // WGMMA_K - 1) * WGMMA_K)
