"""Part 2 op module `host_transfer` (being written)."""
