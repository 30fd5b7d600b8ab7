"""Part 2 op module `spills` (being written)."""
