"""Part 2 op module `coalescing` (being written)."""
