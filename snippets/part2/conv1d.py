"""Part 2 op module `conv1d` (being written)."""
