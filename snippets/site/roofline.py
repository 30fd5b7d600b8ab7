"""``bench:roofline``: every op's best result on the roofline of each GPU (the model is snippets.bench.roofline)."""

from snippets.bench.roofline import render_roofline

__all__ = ["render_roofline"]
