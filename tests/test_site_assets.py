"""The site works with no network: MathJax and Mermaid are vendored (scripts/vendor_assets.py) and
served by the site, no page loads a script or stylesheet from another host, the search index holds
no raw TeX, and the chapters a companion notebook accompanies link to it (its page, Colab, the
.ipynb).

The tests marked slow read the site built once per session (``site_dir`` in conftest.py); the others
need neither a build nor the network."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import io
import json
import re
import sys
import tarfile
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import unquote, urlparse

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _module(name: str, path: Path):
    """A module of scripts/ (not a package), loaded once under the name the hook uses."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


va = _module("kernels_measured_vendor_assets", ROOT / "scripts" / "vendor_assets.py")


@pytest.fixture(scope="module")
def hooks():
    pytest.importorskip("mkdocs", reason="the docs extra is missing (pip install -e '.[docs]')")
    return _module("kernels_measured_mkdocs_hooks", ROOT / "scripts" / "mkdocs_hooks.py")


# ---------------------------------------------------------------------------------- the built site

class _Refs(HTMLParser):
    """Every <script src> and resource-loading <link href> of a page, the text of its inline
    scripts and styles, and its <a> tags."""

    NAVIGATION = {"canonical", "alternate", "prev", "next", "author", "license", "search"}

    def __init__(self):
        super().__init__()
        self.scripts: list[dict] = []
        self.links: list[str] = []
        self.anchors: list[dict] = []
        self.inline: dict[str, list[str]] = {"script": [], "style": []}
        self._inside: str | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("script", "style") and not a.get("src"):
            self._inside = tag
            self.inline[tag].append("")
        if tag == "script" and a.get("src"):
            self.scripts.append(a)
        elif tag == "link" and a.get("href"):
            rels = set((a.get("rel") or "").lower().split())
            if not rels or not rels <= self.NAVIGATION:  # canonical, prev, next: links, not loads
                self.links.append(a["href"])
        elif tag == "a":
            self.anchors.append(a)

    def handle_endtag(self, tag):
        if tag == self._inside:
            self._inside = None

    def handle_data(self, data):
        if self._inside:
            self.inline[self._inside][-1] += data


def _refs(html: Path) -> _Refs:
    parser = _Refs()
    parser.feed(html.read_text(errors="replace"))
    return parser


def _is_external(url: str) -> bool:
    return bool(urlparse(url).scheme or url.startswith("//")) and not url.startswith("data:")


def _resolve(site_dir: Path, html: Path, url: str) -> Path:
    target = (html.parent / unquote(urlparse(url).path)).resolve()
    return target / "index.html" if target.is_dir() else target


@pytest.mark.slow
def test_no_page_loads_a_script_or_stylesheet_from_another_host(site_dir):
    pages = sorted(site_dir.glob("**/*.html"))
    assert len(pages) > 40
    remote_css = re.compile(r"""(?:@import\s+|url\(\s*)["']?(?:https?:)?//""")
    remote_import = re.compile(r"""import\(\s*["'](?:https?:)?//""")
    external = []
    for html in pages:
        refs = _refs(html)
        name = html.relative_to(site_dir)
        for url in [s["src"] for s in refs.scripts] + refs.links:
            if _is_external(url):
                external.append(f"{name}: {url}")
        external += [f"{name}: <style> from another host" for style in refs.inline["style"]
                     if remote_css.search(style)]
        # nbconvert's template (notebook pages) imports Mermaid from cdnjs, but only for a
        # notebook that holds a Mermaid diagram (.jp-Mermaid): none may, or it needs the network
        if any(remote_import.search(script) for script in refs.inline["script"]):
            if 'class="jp-Mermaid' in html.read_text(errors="replace"):
                external.append(f"{name}: a notebook's Mermaid diagram, rendered from cdnjs")
    assert not external, "loaded from another host:\n" + "\n".join(external[:20])
    # nor through a stylesheet (@import or url() of a font service or CDN)
    css = [p.relative_to(site_dir) for p in site_dir.glob("**/*.css")
           if remote_css.search(p.read_text(errors="replace"))]
    assert not css, css


@pytest.mark.slow
def test_vendored_mathjax_mermaid_and_licences_are_published(site_dir):
    for pkg in va.PACKAGES:
        published = site_dir / va.SITE_PREFIX / pkg.site_name
        cached = va.fetch(pkg)  # the build filled the cache: nothing is downloaded here
        assert set(cached) == {p.relative_to(published).as_posix()
                               for p in published.rglob("*") if p.is_file()}, pkg.name
        for rel, path in cached.items():
            assert (published / rel).read_bytes() == path.read_bytes(), rel
        if (published / "LICENSE").exists():
            assert (published / "LICENSE").stat().st_size > 500, f"{pkg.name}: no licence next to it"
        else:  # a package that ships no LICENSE file: its package.json states the licence
            assert json.loads((published / "package.json").read_text())["license"], pkg.name
    mathjax = site_dir / "vendor" / "mathjax"
    assert "Apache License" in (mathjax / "LICENSE").read_text()
    assert "MIT License" in (site_dir / "vendor" / "mermaid" / "LICENSE").read_text()
    assert json.loads((site_dir / "vendor" / "mathjax-newcm-font" / "package.json").read_text())[
        "license"] == "Apache-2.0"
    # MathJax 4's default font: its CHTML web fonts and the character ranges it loads on demand
    font = site_dir / "vendor" / "mathjax-newcm-font" / "chtml"
    fonts = list((font / "woff2").glob("*.woff2"))
    assert len(fonts) > 20 and any(f.name == "mjx-ncm-n.woff2" for f in fonts)
    assert (font / "dynamic" / "calligraphic.js").is_file()
    # the speech worker and its English rules (the menu and screen-reader support load them)
    assert (mathjax / "sre" / "speech-worker.js").is_file() and (mathjax / "sre" / "mathmaps" / "en.json").is_file()
    # the configuration points MathJax, its extensions and its font ([fonts]/mathjax-newcm-font) at these copies
    config = (site_dir / "javascripts" / "mathjax.js").read_text()
    assert '"../vendor"' in config and 'mathjax: vendor + "/mathjax"' in config and "fonts: vendor" in config


@pytest.mark.slow
def test_every_page_loads_the_local_copies_before_material_looks_for_mermaid(site_dir):
    """Material renders diagrams with a global ``mermaid`` when one exists and fetches its own from
    unpkg otherwise: on a page with a diagram the vendored one must be a plain script (not async, not
    a module) before Material's bundle; a page without one does not load its 3.5 MB. MathJax's
    settings come before MathJax on every page."""
    order = ["javascripts/mathjax.js", "vendor/mathjax/tex-mml-chtml.js"]
    pages = sorted(site_dir.glob("**/index.html"))
    assert len(pages) > 40
    with_diagrams = 0
    for html in pages:
        scripts = _refs(html).scripts
        srcs = [s["src"] for s in scripts]
        where = [next((k for k, src in enumerate(srcs) if src.endswith(w)), None) for w in order]
        assert None not in where and where == sorted(where), f"{html.relative_to(site_dir)}: {srcs}"
        mermaid = [k for k, src in enumerate(srcs) if src.endswith("vendor/mermaid/mermaid.min.js")]
        if 'class="mermaid"' in html.read_text():
            with_diagrams += 1
            bundle = next(k for k, src in enumerate(srcs) if "assets/javascripts/bundle." in src)
            assert len(mermaid) == 1 and mermaid[0] < bundle, f"{html.relative_to(site_dir)}: {srcs}"
        else:
            assert not mermaid, f"{html.relative_to(site_dir)} loads Mermaid without a diagram"
        for s in scripts:
            if "vendor/" in s["src"]:
                assert "async" not in s and s.get("type") in (None, "text/javascript"), s
                assert _resolve(site_dir, html, s["src"]).is_file(), s["src"]
    assert with_diagrams >= 3


@pytest.mark.slow
def test_search_index_has_no_tex_left(site_dir):
    index = json.loads((site_dir / "search" / "search_index.json").read_text())
    code = re.compile(r"<code\b.*?</code>|<pre\b.*?</pre>", re.S)  # listings keep their backslashes
    left = [doc["location"] for doc in index["docs"] for key in ("title", "text")
            if re.search(r"\\[(\[]", code.sub("", doc[key]))]
    assert not left, left[:10]
    text = " ".join(doc["text"] for doc in index["docs"])
    assert re.search(r"\b2\^\d\d\b", text), "no power of two in plain form (2^13) in the index"


def _repo_url() -> str:
    match = re.search(r"^repo_url:\s*(\S+)", (ROOT / "mkdocs.yml").read_text(), re.M)
    return match.group(1)


def _companions() -> dict[str, list[str]]:
    """{chapter: [notebook path under docs/]} from every notebook's metadata."""
    out: dict[str, list[str]] = {}
    for nb in sorted(DOCS.glob("**/*.ipynb")):
        meta = json.loads(nb.read_text())["metadata"]
        for chapter in meta.get("kernels_measured", {}).get("chapters", []):
            out.setdefault(chapter, []).append(nb.relative_to(DOCS).as_posix())
    return out


def test_part1_notebook_names_the_chapters_it_accompanies():
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(DOCS / "part1" / "notebook.ipynb", as_version=4)
    nbformat.validate(nb)
    chapters = nb.metadata["kernels_measured"]["chapters"]
    assert chapters and all((DOCS / c).is_file() for c in chapters), chapters
    assert "part1/elementwise.md" in chapters


@pytest.mark.slow
def test_companion_notebook_links(site_dir):
    companions = _companions()
    assert companions, "no notebook lists the chapters it accompanies"
    owner_repo = urlparse(_repo_url()).path.strip("/")
    for chapter, notebooks in companions.items():
        html = site_dir / chapter.removesuffix(".md") / "index.html"
        page = html.read_text()
        box = page.find("Companion notebook")
        assert 0 < page.find("<h1") < box, f"{chapter}: no box after the title"
        anchors = _refs(html).anchors
        for nb in notebooks:
            colab = f"https://colab.research.google.com/github/{owner_repo}/blob/main/docs/{nb}"
            assert any(a.get("href") == colab for a in anchors), f"{chapter}: no Colab link to {nb}"
            downloads = [a["href"] for a in anchors if "download" in a and a.get("href", "")
                         .endswith(Path(nb).name)]
            assert downloads, f"{chapter}: no download link"
            for href in downloads:
                target = _resolve(site_dir, html, href)
                assert target.is_file(), f"{chapter}: {href} is not in the built site"
                assert target.read_bytes() == (DOCS / nb).read_bytes()
            # and the notebook's own page
            nb_page = site_dir / nb.removesuffix(".ipynb") / "index.html"
            assert any(a.get("href") and not _is_external(a["href"]) and "download" not in a
                       and _resolve(site_dir, html, a["href"]) == nb_page.resolve()
                       for a in anchors)


# -------------------------------------------------------------------------------- the hook's parts

@pytest.mark.parametrize("tex, plain", [
    (r"2^{13}", "2^13"),
    (r"\frac{a}{b}", "a/b"),
    (r"\frac{a + b}{c}", "(a + b)/c"),
    (r"\mathrm{GB/s} = \frac{\text{bytes}}{t \times 10^{9}}", "GB/s = bytes/(t × 10^9)"),
    (r"e^{x_j - m}", "e^(x_j - m)"),
    (r"\lceil n / 256 \rceil", "⌈n / 256⌉"),
    (r"\alpha a + b", "alpha a + b"),
    (r"\sum_{j=1}^{N} \sin\theta_{j}", "sum_(j=1)^N sin theta_j"),
    (r"QK^\top", "QK^T"),
    (r"\texttt{BLOCK\_N} \le 128", "BLOCK_N ≤ 128"),
    (r"\begin{pmatrix} a & b \\ c & d \end{pmatrix}", "(a, b; c, d)"),
])
def test_tex_to_text(hooks, tex, plain):
    assert hooks.tex_to_text(tex) == plain


def test_search_text_cleaning_keeps_code_and_html(hooks):
    text = (r"<p>At \(n = 2^{28}\) and \(r &lt; 32\):</p> \[ \frac{1}{6} \] "
            r'<pre><code>re.compile(r"\(x\)")</code></pre>')
    assert hooks.clean_search_text(text) == (r"<p>At n = 2^28 and r &lt; 32:</p> 1/6 "
                                             r'<pre><code>re.compile(r"\(x\)")</code></pre>')


def test_box_goes_after_the_first_title_outside_code(hooks):
    md = "```python\n# not a title\n```\n\n# Title\n\nText.\n"
    assert hooks.insert_after_title(md, "BOX\n") == (
        "```python\n# not a title\n```\n\n# Title\n\nBOX\n\nText.\n")
    setext = "Title\n=====\nText.\n"
    assert hooks.insert_after_title(setext, "BOX\n") == "Title\n=====\n\nBOX\nText.\n"
    assert hooks.insert_after_title("No title.\n", "BOX\n") == "BOX\nNo title.\n"


def test_colab_prefix_comes_from_repo_url(hooks):
    assert hooks._colab_prefix("https://github.com/o/r.git") == \
        "https://colab.research.google.com/github/o/r/blob/main/"
    with pytest.raises(Exception, match="not a GitHub repository"):
        hooks._colab_prefix("https://gitlab.com/o")


def test_build_stops_with_a_clear_message_when_the_assets_cannot_be_fetched(hooks, monkeypatch):
    def offline(*args, **kwargs):
        raise va.VendorError("cannot download https://registry.npmjs.org/...: no network")

    monkeypatch.setattr(hooks.vendor_assets, "ensure_all", offline)
    message = r"(?s)MathJax and Mermaid.*no network.*scripts/vendor_assets\.py"
    with pytest.raises(Exception, match=message):
        hooks.on_config(SimpleNamespace(repo_url=_repo_url()))


# -------------------------------------------------------------------------------- vendor_assets.py

def _tarball(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, content in files.items():
            info = tarfile.TarInfo(f"package/{name}")
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


def _integrity(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


FAKE_FILES = {"dist/fake.min.js": b"window.fake = 1;\n", "dist/other.js": b"unused\n",
              "fonts/a.woff": b"A", "fonts/b.woff": b"B", "LICENSE": b"MIT License\n"}
FAKE_SPEC = (("dist/fake.min.js", "fake.min.js"), ("fonts/", "fonts/"), ("LICENSE", "LICENSE"))


@pytest.fixture
def registry(monkeypatch):
    """A stand-in for the npm registry: serves ``registry.body``; no network is touched."""
    fake = SimpleNamespace(body=b"", calls=[])

    def download(url):
        fake.calls.append(url)
        return fake.body

    monkeypatch.setattr(va, "download", download)
    return fake


def test_vendoring_refuses_a_tarball_whose_integrity_does_not_match(tmp_path, registry):
    good = _tarball(FAKE_FILES)
    registry.body = _tarball({**FAKE_FILES, "dist/fake.min.js": b"window.evil = 1;\n"})
    pkg = va.Package("fake", "1.0.0", _integrity(good), FAKE_SPEC)
    with pytest.raises(va.IntegrityError, match="integrity mismatch"):
        va.fetch(pkg, tmp_path)
    assert registry.calls == [pkg.tarball_url]
    assert list(tmp_path.iterdir()) == [], "something of a refused tarball was kept"


def test_vendoring_extracts_only_the_named_files_once(tmp_path, registry):
    registry.body = _tarball(FAKE_FILES)
    pkg = va.Package("fake", "1.0.0", _integrity(registry.body), FAKE_SPEC)
    files = va.fetch(pkg, tmp_path)
    assert sorted(files) == ["LICENSE", "fake.min.js", "fonts/a.woff", "fonts/b.woff"]
    assert files["fake.min.js"].read_bytes() == FAKE_FILES["dist/fake.min.js"]
    assert va.fetch(pkg, tmp_path) == files and len(registry.calls) == 1  # the cache is used
    # an altered file in the cache is noticed and extracted again from the verified tarball
    files["fake.min.js"].write_bytes(b"window.changed = 1;\n")
    assert va.fetch(pkg, tmp_path)["fake.min.js"].read_bytes() == FAKE_FILES["dist/fake.min.js"]
    assert len(registry.calls) == 1
    site = va.ensure_all(tmp_path, packages=(pkg,))
    assert "vendor/fake/fonts/a.woff" in site


def test_vendoring_refuses_an_altered_tarball_in_the_cache(tmp_path, registry):
    good = _tarball(FAKE_FILES)
    pkg = va.Package("fake", "1.0.0", _integrity(good), FAKE_SPEC)
    (tmp_path / f"{pkg.key}.tgz").write_bytes(_tarball({"LICENSE": b"x"}))
    with pytest.raises(va.IntegrityError):
        va.fetch(pkg, tmp_path)
    assert not (tmp_path / f"{pkg.key}.tgz").exists() and registry.calls == []


def test_vendoring_says_which_file_a_package_lacks(tmp_path, registry):
    registry.body = _tarball({"LICENSE": b"MIT License\n"})
    pkg = va.Package("fake", "1.0.0", _integrity(registry.body), FAKE_SPEC)
    with pytest.raises(va.VendorError, match="has no 'dist/fake.min.js'"):
        va.fetch(pkg, tmp_path)


def test_pins_are_exact_versions_with_sha512_integrity():
    assert {p.name for p in va.PACKAGES} == {"mathjax", "@mathjax/mathjax-newcm-font", "mermaid"}
    for pkg in va.PACKAGES:
        assert re.fullmatch(r"\d+\.\d+\.\d+", pkg.version), pkg
        assert pkg.integrity.startswith("sha512-")
        assert len(base64.b64decode(pkg.integrity[len("sha512-"):])) == 64
        assert ("LICENSE", "LICENSE") in pkg.files or ("package.json", "package.json") in pkg.files


def test_a_scoped_package_is_fetched_from_its_scope_and_published_without_it():
    pkg = va.Package("@scope/thing", "1.2.3", "sha512-x", (("a.js", "a.js"),))
    assert pkg.tarball_url == f"{va.REGISTRY}/@scope/thing/-/thing-1.2.3.tgz"
    assert pkg.site_name == "thing" and pkg.key == "thing-1.2.3"
