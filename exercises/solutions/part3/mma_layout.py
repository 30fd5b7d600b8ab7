"""part3.tensor-cores.14: where mma.sync's fragments live

The reference solution.

Chapter: docs/part3/tensor-cores.md, exercise 14. Difficulty 2 of 4 (a few lines, once understood).

mma.sync.m16n8k16 takes its operands from the 32 lanes of a warp: each lane holds four 32-bit
registers of A (16 x 16, two 16-bit values each), two of B (16 x 8) and four fp32 sums of C
(16 x 8). Which element sits where is fixed by the PTX ISA, in terms of g = lane // 4 (the lane's
group of four) and t = lane % 4 (its place in the group). Write, for each operand, the (row,
column) of the element a lane holds: c_coords for sum e of C; a_coords and b_coords for the low
(half 0) or high (half 1) 16 bits of a register. mma_rate (csrc/wmma/mma_rate.cu) writes its sums
in C's layout, and its GPU test checks the hardware against these rules.

Check it:  python -m snippets exercise check part3.tensor-cores.14
(--solution checks the reference solution; exercise show part3.tensor-cores.14 gives the hint)
"""


def c_coords(lane: int, e: int) -> tuple[int, int]:
    """(row, column) of the 16 x 8 tile C that sum e (0..3) of lane holds."""
    g, t = lane // 4, lane % 4
    return g + 8 * (e // 2), 2 * t + e % 2


def a_coords(lane: int, reg: int, half: int) -> tuple[int, int]:
    """(row, k) of the 16 x 16 tile A that half `half` of register reg (0..3) of lane holds."""
    g, t = lane // 4, lane % 4
    return g + 8 * (reg % 2), 2 * t + 8 * (reg // 2) + half


def b_coords(lane: int, reg: int, half: int) -> tuple[int, int]:
    """(k, column) of the 16 x 8 tile B that half `half` of register reg (0..1) of lane holds."""
    g, t = lane // 4, lane % 4
    return 2 * t + 8 * reg + half, g
