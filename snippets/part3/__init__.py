"""Part 3: performance engineering."""
