"""part2.constant-memory.3: The cost of the halo

The reference solution.

Chapter: docs/part2/constant-memory.md, exercise 3. Difficulty 1 of 4 (fill one line).

v3's halo costs k - 1 extra inputs per tile of outputs. Compute the fraction of extra reads at k
= 63 for tiles of 256, 1024 and 4096 outputs (and any other k and tile).

Check it:  python -m snippets exercise check part2.constant-memory.3
"""


def tile_inputs(k: int, tile: int) -> int:
    """Inputs a tile of ``tile`` outputs of a k-tap filter reads."""
    return tile + k - 1


def extra_read_fraction(k: int, tile: int) -> float:
    """Extra inputs (the halo) per output of the tile."""
    return (tile_inputs(k, tile) - tile) / tile
