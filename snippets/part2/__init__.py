"""Part 2: the memory hierarchy, measured."""
