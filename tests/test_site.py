"""The site: a strict MkDocs build, every internal link resolving, and the companion notebooks executing."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from snippets.registry import REPO_ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site_dir(tmp_path_factory) -> Path:
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install -e '.[docs]')")
    out = tmp_path_factory.mktemp("site")
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or "mkdocs"
    r = subprocess.run([mkdocs, "build", "--strict", "-d", str(out)], cwd=REPO_ROOT, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, f"mkdocs build --strict failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return out


def test_strict_build_has_every_chapter(site_dir):
    for page in ("index.html", "part1/elementwise/index.html", "benchmarks/index.html",
                 "part1/notebook/index.html"):
        assert (site_dir / page).is_file(), page


HREF = re.compile(r'(?:href|src)="([^"#?]+)')


def test_internal_links_resolve(site_dir):
    broken = []
    for html in site_dir.glob("**/*.html"):
        for link in HREF.findall(html.read_text(errors="replace")):
            url = urlparse(link)
            if url.scheme or link.startswith(("//", "/", "mailto:", "data:")):
                continue  # external, or site-absolute (only 404.html uses those, built from site_url)
            target = (html.parent / unquote(url.path)).resolve()
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{html.relative_to(site_dir)} -> {link}")
    assert not broken, "broken internal links:\n" + "\n".join(sorted(set(broken))[:50])


def test_no_bench_directive_left_unrendered(site_dir):
    left = [str(p.relative_to(site_dir)) for p in site_dir.glob("**/*.html") if "<!-- bench:" in p.read_text()]
    assert not left, f"unrendered bench directives in {left}"


NOTEBOOKS = sorted((REPO_ROOT / "docs").glob("**/*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_notebook_executes(path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    nb = nbformat.read(path, as_version=4)
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit notebooks without outputs"
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(REPO_ROOT)}}
                            ).execute()
