"""Part 2 op module `latency` (being written)."""
