"""Part 2 op module `transpose` (being written)."""
