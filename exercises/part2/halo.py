"""part2.constant-memory.3: The cost of the halo

Chapter: docs/part2/constant-memory.md, exercise 3. Difficulty 1 of 4 (fill one line).

v3's halo costs k - 1 extra inputs per tile of outputs. Compute the fraction of extra reads at k
= 63 for tiles of 256, 1024 and 4096 outputs (and any other k and tile).

Check it:  python -m snippets exercise check part2.constant-memory.3
(--solution checks the reference solution; exercise show part2.constant-memory.3 gives the hint)
"""


def tile_inputs(k: int, tile: int) -> int:
    """Inputs a tile of ``tile`` outputs of a k-tap filter reads."""
    raise NotImplementedError("YOUR CODE HERE")


def extra_read_fraction(k: int, tile: int) -> float:
    """Extra inputs (the halo) per output of the tile."""
    raise NotImplementedError("YOUR CODE HERE")
