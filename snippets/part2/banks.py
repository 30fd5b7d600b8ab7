"""Part 2 op module `banks` (being written)."""
