"""Part 7: distributed training, from collectives to sharded and parallel models."""
