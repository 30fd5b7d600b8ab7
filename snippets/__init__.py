"""Kernels, Measured: the tested kernels of the book, with their references, tests and benchmarks.

``snippets.registry`` declares every op; ``python -m snippets bench`` times them on a GPU and
``python -m snippets report`` summarises the committed measurements.
"""

__version__ = "0.1.0"
