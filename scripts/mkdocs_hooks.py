"""MkDocs hook: everything the site build does beyond MkDocs and its plugins.

- Bench directives: tables and plots from benchmarks/results/*.json rendered into the pages that
  ask. The rendering lives in ``snippets.site`` so that it is tested with the rest of the package.
- Vendored JavaScript: MathJax and Mermaid, pinned and fetched by scripts/vendor_assets.py into
  .cache/vendor/, are published under vendor/ with their licences, so that no page loads anything
  from another host.
- Companion notebooks: a chapter listed in a notebook's metadata
  (``"kernels_measured": {"chapters": [...]}``) gets a box under its title with links to the
  notebook's page, to Colab and to the .ipynb file.
- Search: TeX in the search index becomes plain text, so that result snippets do not show
  ``\\(2^{13}\\)``.
"""

from __future__ import annotations

import html
import importlib.util
import json
import logging
import posixpath
import re
import sys
from pathlib import Path
from urllib.parse import urlparse

from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File
from mkdocs.utils import get_relative_url

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the checkout's snippets, also uninstalled

from snippets.site import render_page  # noqa: E402

log = logging.getLogger("mkdocs.hooks.kernels_measured")


def _load_vendor_assets():
    """scripts/vendor_assets.py as a module (scripts/ is not a package)."""
    name = "kernels_measured_vendor_assets"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "vendor_assets.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before exec: dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[name]


vendor_assets = _load_vendor_assets()

# State of the current build, set by on_config and on_files (a `mkdocs serve` rebuild starts over).
_vendored: dict[str, Path] = {}  # path in the site -> file in the cache
_notebooks: dict[str, list[dict]] = {}  # chapter src path -> the notebooks that accompany it
_colab_base = ""


# ---------------------------------------------------------------------------------- config, files

def on_config(config):
    global _vendored, _colab_base
    try:
        _vendored = vendor_assets.ensure_all()
    except vendor_assets.VendorError as err:
        pins = ", ".join(f"{p.name} {p.version}" for p in vendor_assets.PACKAGES)
        raise PluginError(
            f"The site serves its own copies of MathJax and Mermaid ({pins}), fetched from the "
            f"npm registry into {vendor_assets.CACHE_DIR} when missing, and that failed: {err}\n"
            "Run `python scripts/vendor_assets.py` on a machine that reaches registry.npmjs.org "
            "(or copy .cache/vendor/ from one), then build again.") from None
    _colab_base = _colab_prefix(config.repo_url)
    return config


def _colab_prefix(repo_url: str | None) -> str:
    """https://colab.research.google.com/github/OWNER/REPO/blob/main/ from a GitHub repo_url."""
    url = urlparse(repo_url or "")
    parts = [p for p in url.path.split("/") if p]
    if url.netloc != "github.com" or len(parts) < 2:
        raise PluginError(f"repo_url {repo_url!r} is not a GitHub repository: no Colab links")
    repo = parts[1].removesuffix(".git")
    return f"https://colab.research.google.com/github/{parts[0]}/{repo}/blob/main/"


def on_files(files, config):
    for uri, path in sorted(_vendored.items()):
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    _read_notebooks(files, config)
    return files


def _read_notebooks(files, config) -> None:
    """Read every notebook's ``kernels_measured.chapters`` metadata once per build."""
    _notebooks.clear()
    jupyter = config.plugins.get("mkdocs-jupyter")
    for f in files:
        if not f.src_uri.endswith(".ipynb") or f.abs_src_path is None:
            continue
        try:
            nb = json.loads(Path(f.abs_src_path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise PluginError(f"cannot read notebook {f.src_uri}: {err}") from None
        chapters = nb.get("metadata", {}).get("kernels_measured", {}).get("chapters", [])
        if not chapters:
            continue
        if jupyter is None or not jupyter.config.get("include_source"):
            raise PluginError(f"{f.src_uri} has chapters, whose download links need mkdocs-jupyter "
                              "with include_source: true (it publishes the .ipynb)")
        # mkdocs-jupyter (include_source) copies the .ipynb next to the notebook page's index.html
        download = posixpath.join(posixpath.dirname(f.dest_uri), posixpath.basename(f.src_uri))
        info = {"src": f.src_uri, "title": _notebook_title(nb, f.src_uri), "download": download,
                "colab": _colab_base + "docs/" + f.src_uri}
        for chapter in chapters:
            if files.get_file_from_path(chapter) is None:
                log.warning("%s lists chapter %r, which is not a page under docs/",
                            f.src_uri, chapter)
                continue
            _notebooks.setdefault(chapter, []).append(info)


def _notebook_title(nb: dict, src_uri: str) -> str:
    """The first Markdown cell's H1 ("Part 2 notebook: the memory hierarchy"), or the path."""
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "markdown":
            source = "".join(cell.get("source", []))
            match = re.search(r"^#\s+(.+?)\s*#*\s*$", source, re.M)
            if match:
                return re.sub(r"([\[\]])", r"\\\1", match.group(1))  # inside [...] of a link
            break
    return src_uri


# ---------------------------------------------------------------------------------- pages

def on_page_markdown(markdown, page, config, files):  # noqa: ARG001 (MkDocs hook signature)
    markdown = render_page(markdown, page.file.src_path)
    notebooks = _notebooks.get(page.file.src_uri)
    if notebooks:
        boxes = "".join(_notebook_box(nb, page) for nb in notebooks)
        markdown = insert_after_title(markdown, boxes)
    return markdown


def _notebook_box(nb: dict, page) -> str:
    page_link = posixpath.relpath(nb["src"], posixpath.dirname(page.file.src_uri) or ".")
    download = get_relative_url(nb["download"], page.url)
    name = posixpath.basename(nb["src"])
    colab = html.escape(nb["colab"])
    return (
        '!!! example "Companion notebook"\n\n'
        f"    The code of this chapter runs in [{nb['title']}]({page_link}), on a GPU or on a"
        " CPU.\n\n"
        f'    <a class="md-button" href="{colab}" target="_blank" rel="noopener">'
        "Open in Colab</a>\n"
        f'    <a class="md-button" href="{html.escape(download)}" download>Download {name}</a>\n\n')


_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def insert_after_title(markdown: str, block: str) -> str:
    """``block`` inserted after the first H1 (``# Title``, or ``Title`` over ``===``) outside code
    fences, or at the top when there is none."""
    lines = markdown.splitlines(keepends=True)
    fence = None
    for i, line in enumerate(lines):
        match = _FENCE.match(line)
        if fence:
            if match and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence):
                fence = None
            continue
        if match:
            fence = match.group(1)
            continue
        after = None
        if re.match(r"^ {0,3}#(\s|$)", line):
            after = i + 1
        elif (line.strip() and i + 1 < len(lines) and re.match(r"^ {0,3}=+\s*$", lines[i + 1])
              and (i == 0 or not lines[i - 1].strip())):
            after = i + 2
        if after is not None:
            head = "".join(lines[:after])
            if not head.endswith("\n"):
                head += "\n"
            return head + "\n" + block + "".join(lines[after:])
    return block + markdown


# ---------------------------------------------------------------------------------- search index

_TOKEN = re.compile(r"\\[A-Za-z]+|\\.|\s+|.", re.S)
_WRAPPERS = {"text", "textrm", "textnormal", "textbf", "textit", "texttt", "textsf", "emph",
             "mbox", "hbox", "mathrm", "mathit", "mathbf", "mathsf", "mathtt", "mathcal", "mathbb",
             "mathfrak", "mathscr", "boldsymbol", "bm", "operatorname", "underbrace", "overbrace",
             "underline", "boxed"}
_ACCENTS = {"hat", "widehat", "bar", "overline", "tilde", "widetilde", "vec", "dot", "ddot"}
_FRACS = {"frac", "tfrac", "dfrac", "cfrac"}
_SIZES = {"left", "right", "middle", "big", "Big", "bigg", "Bigg", "bigl", "bigr", "Bigl", "Bigr",
          "biggl", "biggr", "Biggl", "Biggr"}
_NO_ARG_STYLES = {"displaystyle", "textstyle", "scriptstyle", "limits", "nolimits"}
_SYMBOLS = {
    "times": "×", "cdot": "·", "le": "≤", "leq": "≤", "ge": "≥", "geq": "≥", "ne": "≠", "neq": "≠",
    "approx": "≈", "sim": "~", "to": "→", "rightarrow": "→", "leftarrow": "←", "gets": "←",
    "Rightarrow": "⇒", "mapsto": "↦", "infty": "∞", "pm": "±", "in": "∈", "dots": "…", "ldots": "…",
    "cdots": "…", "lfloor": "⌊", "rfloor": "⌋", "lceil": "⌈", "rceil": "⌉", "langle": "⟨",
    "rangle": "⟩", "lvert": "|", "rvert": "|", "vert": "|", "mid": "|", "oplus": "⊕", "odot": "⊙",
    "otimes": "⊗", "circ": "∘", "partial": "∂", "nabla": "∇", "top": "T", "cup": "∪", "cap": "∩",
    "quad": " ", "qquad": " ", "enspace": " ", "bmod": "mod", "ell": "ℓ", "prime": "'",
    "varepsilon": "epsilon", "epsilon": "epsilon", "varphi": "phi", "vartheta": "theta",
}
_ESCAPES = {",": " ", ";": " ", ":": " ", ">": " ", " ": " ", "!": "", "\\": "; ", "|": "‖"}


_MATRIX = re.compile(r"\\begin\{([pbvBV]?)matrix\}(.*?)\\end\{\1matrix\}", re.S)
_BRACKETS = {"": "()", "p": "()", "b": "[]", "B": "{}", "v": "||", "V": "‖‖"}


def tex_to_text(tex: str) -> str:
    """A readable plain form of a TeX formula: ``2^{13}`` -> ``2^13``, ``\\frac{a+b}{c}`` ->
    ``(a+b)/c``, ``\\text{GB/s}`` -> ``GB/s``, ``\\times`` -> ``×``, ``\\alpha`` -> ``alpha``; a
    matrix is written by rows, ``(a, b; c, d)``."""
    tex = _MATRIX.sub(lambda m: "{" + _BRACKETS[m.group(1)][0] + m.group(2).replace("&", ",")
                      + _BRACKETS[m.group(1)][1] + "}", tex)
    text, _ = _convert(_TOKEN.findall(tex), 0)
    text = re.sub(r"\s+", " ", text)
    text = re.sub(r"\s+([;,.)\]⌋⌉])", r"\1", text)
    return re.sub(r"([(\[⌊⌈])\s+", r"\1", text).strip()


def _wrap(s: str) -> str:
    """``s`` as one operand: bare when it is one, in parentheses otherwise."""
    s = s.strip()
    if re.fullmatch(r"-?[\w.'^]+|[^\w\s]", s) or (s.startswith("(") and s.endswith(")")):
        return s
    return f"({s})"


def _skip_space(toks, i):
    while i < len(toks) and toks[i].isspace():
        i += 1
    return i


def _arg(toks, i):
    """One argument: a {group}, a command or a character. Returns (text, next index)."""
    i = _skip_space(toks, i)
    if i >= len(toks):
        return "", i
    if toks[i] == "{":
        return _convert(toks, i + 1)
    if toks[i].startswith("\\"):
        return _command(toks, i)
    return toks[i], i + 1


def _command(toks, i):
    """The command at toks[i] with its arguments. Returns (text, next index)."""
    tok = toks[i]
    name = tok[1:]
    i += 1
    if len(name) == 1 and not name.isalpha():
        return _ESCAPES.get(name, name), i
    if name in _FRACS:
        num, i = _arg(toks, i)
        den, i = _arg(toks, i)
        return f"{_wrap(num)}/{_wrap(den)}", i
    if name == "sqrt":
        j = _skip_space(toks, i)
        if j < len(toks) and toks[j] == "[":  # \sqrt[n]{x}: the index is dropped
            while j < len(toks) and toks[j] != "]":
                j += 1
            i = j + 1
        arg, i = _arg(toks, i)
        return f"sqrt({arg.strip()})", i
    if name in _NO_ARG_STYLES:
        return "", i
    if name in _WRAPPERS:
        return _arg(toks, i)
    if name in _ACCENTS:
        arg, i = _arg(toks, i)
        return f"{name}({arg.strip()})", i
    if name in ("begin", "end"):
        _, i = _arg(toks, i)
        return " ", i
    if name in _SIZES:
        if i < len(toks) and toks[i] == ".":  # \left. is an invisible delimiter
            i += 1
        return "", i
    return _SYMBOLS.get(name, name), i


def _convert(toks, i):
    """Tokens from toks[i] up to the '}' that closes the group (or the end).

    Returns (text, next index)."""
    out: list[str] = []
    word_end = False  # the last piece was a command's name: a following letter needs a space

    def put(piece, is_word=False):
        nonlocal word_end
        glued = out and piece[:1].isalnum() and out[-1][-1:].isalnum()
        if piece and glued and (is_word or word_end):
            out.append(" ")
        if piece:
            out.append(piece)
        word_end = is_word and bool(piece) and piece[-1:].isalnum()

    while i < len(toks):
        tok = toks[i]
        if tok == "}":
            return "".join(out), i + 1
        if tok == "{":
            text, i = _convert(toks, i + 1)
            put(text)
        elif tok in "^_":
            arg, i = _arg(toks, i + 1)
            arg = arg.strip()
            simple = (re.fullmatch(r"-?(?:[^\W_]|[.'])+|[^\w\s]", arg)
                      or arg[:1] + arg[-1:] == "()")
            put(tok + (arg if simple else f"({arg})"))
        elif tok.startswith("\\"):
            text, i = _command(toks, i)
            put(text, is_word=len(tok) > 2 and tok[1:].isalpha())
        else:
            put(" " if tok.isspace() or tok in "&~" else tok)
            i += 1
    return "".join(out), i


_MATH = re.compile(r"\\\((.+?)\\\)|\\\[(.+?)\\\]|(\\begin\{([A-Za-z*]+)\}.*?\\end\{\4\})", re.S)
_CODE = re.compile(r"(<code\b.*?</code>|<pre\b.*?</pre>)", re.S)


def _plain_math(match) -> str:
    tex = next(g for g in match.groups()[:3] if g is not None)
    return html.escape(tex_to_text(html.unescape(tex)), quote=False)


def clean_search_text(text: str) -> str:
    """The HTML text of a search-index entry with each arithmatex formula (outside code) in plain
    form."""
    parts = _CODE.split(text)
    parts[::2] = [_MATH.sub(_plain_math, part) for part in parts[::2]]
    return "".join(parts)


MERMAID = "vendor/mermaid/mermaid.min.js"
_BUNDLE = re.compile(r'<script src="[^"]*assets/javascripts/bundle\.[^"]*"')


def on_post_page(output, page, config):  # noqa: ARG001 (MkDocs hook signature)
    """Mermaid on the pages that draw a diagram, and only there: a plain script before Material's
    bundle, which then renders with this global ``mermaid`` instead of fetching one from a CDN."""
    if 'class="mermaid"' not in output:
        return output
    tag = f'<script src="{get_relative_url(MERMAID, page.url)}"></script>\n    '
    match = _BUNDLE.search(output)
    if match is None:
        raise PluginError(f"{page.file.src_uri}: no Material bundle script to put Mermaid before")
    return output[:match.start()] + tag + output[match.start():]


@event_priority(-100)  # after the search plugin has written the index
def on_post_build(config):
    index = Path(config.site_dir) / "search" / "search_index.json"
    if not index.is_file():
        return
    data = json.loads(index.read_text(encoding="utf-8"))
    for doc in data.get("docs", []):
        for key in ("title", "text"):
            if isinstance(doc.get(key), str):
                doc[key] = clean_search_text(doc[key])
    index.write_text(json.dumps(data, separators=(",", ":")), encoding="utf-8")
