"""MkDocs hook: render benchmark tables and plots from benchmarks/results/*.json into the pages that ask.

The rendering lives in ``snippets.site`` so that it is tested with the rest of the package.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout's snippets, also uninstalled

from snippets.site import render_page  # noqa: E402


def on_page_markdown(markdown, page, config, files):  # noqa: ARG001 (MkDocs hook signature)
    return render_page(markdown, page.file.src_path)
