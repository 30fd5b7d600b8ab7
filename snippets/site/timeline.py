"""``bench:timeline``: a GPU timeline captured on the runner (the loader is snippets.bench.timeline)."""

from snippets.bench.timeline import render_timeline

__all__ = ["render_timeline"]
