"""Read the built site in a real browser, as a reader does, and count what a reader would trip over.

Used by tests/test_browser.py (which asserts the counts are zero) and from the command line, to measure a
site before and after a change:

    python tests/site_audit.py SITE_DIR [--pages part4/matmul ...] [--json OUT]

The browser is Debian's Chromium (``/usr/bin/chromium``, or ``KM_CHROMIUM``) driven by Playwright through
``executable_path``: Playwright's own browser download is not needed. Every request to another host is blocked
and counted, so a page that needs the network to render (a CDN script) fails here as it fails offline.

At 1400 px wide, every page: console errors, blocked or failed requests, footnotes holding more than their
provenance text (a paragraph swallowed by a footnote), tables wider than the text column (all of them, and
the headline ones outside folded blocks), listings that scroll sideways (captured program output excepted),
plots whose legend is cut off by the figure's edge, TeX left unrendered, Mermaid left unrendered, and the
bench tables and plots each directive of the page's source asked for. At 420 px, as a phone: a page that scrolls
sideways, and headline tables that do. Once per site: a search for "transpose" returns results, and content
tabs switch (on the first page that has a tab set).
"""

from __future__ import annotations

import argparse
import functools
import http.server
import io
import json
import os
import shutil
import sys
import threading
from pathlib import Path
from urllib.parse import urlparse

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from snippets.site.page import DIRECTIVE  # noqa: E402
from snippets.site.tables import PROVENANCE_ENDINGS  # noqa: E402

DESKTOP = {"width": 1400, "height": 900}
PHONE = {"width": 420, "height": 900}
# Every host but this machine's resolves to nothing (no proxy either): a page that needs the network fails
# here as it fails offline. The request for it is still counted (``_watch``).
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--no-proxy-server",
                 "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1, EXCLUDE localhost"]
TABLE_KINDS = {"table", "goal", "versus", "sweep", "summary", "ceilings"}
PLOT_KINDS = {"plot", "ladder", "roofline", "timeline"}
SEARCH_INDEX = "search/search_index.json"


def empty_index(site_dir: Path) -> str:
    """The site's search index with its configuration and no documents (what the page checks get)."""
    config = json.loads((site_dir / SEARCH_INDEX).read_text())["config"]
    return json.dumps({"config": config, "docs": []})


def chromium_path() -> str | None:
    """Debian's Chromium, or the browser named by KM_CHROMIUM; None when neither is installed."""
    for cand in (os.environ.get("KM_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                 shutil.which("chromium-browser")):
        if cand and Path(cand).exists():
            return cand
    return None


class _Handler(http.server.SimpleHTTPRequestHandler):
    """The site's files, each cacheable for the audit's run (the browser's cache keeps Material's bundle,
    MathJax and Mermaid compiled between pages instead of fetching and compiling them on every load), and
    the search index: the real one only while ``state["search"]`` is set, else the site's index with no
    documents. Every page load hands the search worker the whole index (MBs of text) to build: the audit's
    largest cost once, for a search no page check uses; the search check gets the real index."""

    state: dict = {}
    no_docs: bytes = b""

    def log_message(self, *args):  # noqa: D401 (the server's access log is noise in a test)
        pass

    def end_headers(self):
        # the index, never cached: a cached empty one would answer the search check
        index = urlparse(self.path).path.endswith("/" + SEARCH_INDEX)
        self.send_header("Cache-Control", "no-store" if index else "max-age=3600")
        super().end_headers()

    def send_head(self):
        if urlparse(self.path).path.endswith("/" + SEARCH_INDEX) and not self.state.get("search"):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(self.no_docs)))
            self.end_headers()
            return io.BytesIO(self.no_docs)
        return super().send_head()


def serve(site_dir: Path, state: dict | None = None) -> tuple[http.server.ThreadingHTTPServer, str]:
    """Serve ``site_dir`` on a free local port; ``state["search"]`` switches the real search index on."""
    handler_cls = type("Handler", (_Handler,), {"state": {} if state is None else state,
                                                "no_docs": empty_index(site_dir).encode()})
    handler = functools.partial(handler_cls, directory=str(site_dir))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.handle_error = lambda request, address: None  # a page left mid-download: not a finding
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def site_pages(site_dir: Path) -> list[str]:
    """Every page of the site as a path under its root ("" for the home page, "part4/matmul/" ...)."""
    pages = []
    for html in sorted(site_dir.glob("**/index.html")):
        rel = html.parent.relative_to(site_dir).as_posix()
        if rel.startswith(("search", "assets")):
            continue
        pages.append("" if rel == "." else rel + "/")
    return pages


def source_of(page: str) -> Path | None:
    """The Markdown source of a built page (docs/part4/matmul.md for "part4/matmul/")."""
    stem = page.rstrip("/") or "index"
    for cand in (REPO_ROOT / "docs" / f"{stem}.md", REPO_ROOT / "docs" / stem / "index.md"):
        if cand.exists():
            return cand
    return None


# directives whose first argument is an op: an op with no committed results renders a "Not measured yet"
# notice in their place, not a table or a plot
OP_KINDS = {"table", "plot", "ladder", "goal"}


@functools.lru_cache(maxsize=1)
def measured_ops() -> frozenset[str]:
    """The ops with results in some committed results file."""
    from snippets.bench.report import load_results

    return frozenset(op for data in load_results().values() for op in data.get("ops", {}))


def asked_for(page: str) -> tuple[int, int]:
    """How many table-like and plot-like bench directives the page's source holds (leaving out those of
    ops that are not measured yet)."""
    src = source_of(page)
    if src is None:
        return 0, 0
    kinds = [m.group(2) for m in DIRECTIVE.finditer(src.read_text())
             if m.group(2) not in OP_KINDS or m.group(3).split()[:1] == [] or
             m.group(3).split()[0] in measured_ops()]
    return sum(k in TABLE_KINDS for k in kinds), sum(k in PLOT_KINDS for k in kinds)


# One script per page, run in the page: everything measured from the DOM as laid out.
MEASURE_JS = r"""
(endings) => {
  const visible = el => el.offsetParent !== null && el.getClientRects().length > 0;
  const inner = document.querySelector('.md-content__inner') || document.body;
  const column = inner.getBoundingClientRect().width;
  const out = {column: column, footnotes: [], tables: [], listings: [], legends: [], tex: 0, mermaid: 0,
               bench_tables: document.querySelectorAll('.bench-table').length,
               bench_plots: document.querySelectorAll('.bench-plot').length,
               tabs: (t => !!t && t.querySelectorAll('.tabbed-labels > label').length >= 2 &&
                       t.querySelectorAll('.tabbed-content > .tabbed-block').length >= 2)(
                 document.querySelector('.tabbed-set'))};
  for (const li of document.querySelectorAll('.footnote li')) {
    const clone = li.cloneNode(true);
    clone.querySelectorAll('.footnote-backref').forEach(a => a.remove());
    const text = clone.textContent.replace(/\s+/g, ' ').trim();
    const paras = li.querySelectorAll('p').length;
    const ok = paras <= 1 && /^(Measured|Captured) by/.test(text) && endings.some(e => text.endsWith(e));
    if (!ok) out.footnotes.push(text.slice(-160));
  }
  for (const t of document.querySelectorAll('.md-typeset table')) {
    if (!visible(t)) continue;
    const w = t.getBoundingClientRect().width;
    const folded = !!t.closest('details');
    const headline = !!t.closest('.bench-table') && !folded;
    out.tables.push({width: Math.round(w), over: w > column + 1, headline: headline, folded: folded});
  }
  for (const c of document.querySelectorAll('pre > code')) {
    if (!visible(c) || c.closest('.bench-output')) continue;
    // Material scrolls the <code> element itself (pre > code { overflow: auto })
    const scrolls = c.scrollWidth > c.clientWidth + 1 || c.parentElement.scrollWidth > c.parentElement.clientWidth + 1;
    const longest = Math.max(...c.textContent.split('\n').map(l => l.length));
    out.listings.push({scrolls: scrolls, longest: longest});
  }
  for (const fig of document.querySelectorAll('.bench-plot svg')) {
    if (!visible(fig)) continue;
    const box = fig.getBoundingClientRect();
    for (const g of fig.querySelectorAll('g[id^="legend"]')) {
      const r = g.getBoundingClientRect();
      const clipped = r.left < box.left - 1 || r.right > box.right + 1 || r.top < box.top - 1 ||
                      r.bottom > box.bottom + 1;
      out.legends.push({clipped: clipped});
    }
  }
  const tabs = [...document.querySelectorAll('.md-tabs__item')];
  const bar = document.querySelector('.md-tabs__list');
  const edge = bar ? Math.min(bar.getBoundingClientRect().right, document.documentElement.clientWidth) : 0;
  out.top_tabs_clipped = tabs.length > 0 && tabs[tabs.length - 1].getBoundingClientRect().right > edge + 1;
  for (const el of document.querySelectorAll('.arithmatex')) {
    if (!el.querySelector('mjx-container')) out.tex += 1;
  }
  // Material draws each diagram into a closed shadow root on a new div and removes the source <pre>: a
  // <pre class="mermaid"> still in the page is a diagram left unrendered.
  out.mermaid = document.querySelectorAll('pre.mermaid').length;
  return out;
}
"""

PHONE_JS = r"""
(w) => {
  // What a phone reader loses: content that runs past the screen's edge (w, the phone's width: a phone's
  // browser widens its layout viewport to fit content that overflows, so window.innerWidth would hide it) with
  // nothing to scroll it into view, and headline bench tables that need sideways scrolling to show their
  // measurement columns. In-line formulas count: MathJax breaks them across lines; display ones scroll.
  const scroller = el => {
    for (let a = el.parentElement; a && a !== document.body; a = a.parentElement) {
      const o = getComputedStyle(a).overflowX;
      if ((o === 'auto' || o === 'scroll') && a.scrollWidth > a.clientWidth) return a;
    }
    return null;
  };
  const cut = [];
  for (const el of document.querySelectorAll('.md-content__inner *')) {
    if (el.offsetParent === null) continue;
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.right <= w + 1) continue;
    if (el.closest('pre, .highlight, .md-typeset__scrollwrap, div.arithmatex, .bench-plot') || scroller(el)) continue;
    cut.push(el.tagName.toLowerCase() + (el.className && typeof el.className === 'string' ?
             '.' + el.className.split(' ')[0] : ''));
  }
  const tables = [];
  for (const t of document.querySelectorAll('.bench-table table')) {
    if (t.offsetParent === null || t.closest('details')) continue;
    const wrap = t.closest('.md-typeset__scrollwrap') || t.parentElement;
    if (t.getBoundingClientRect().width > wrap.getBoundingClientRect().width + 1) tables.push(t.rows.length);
  }
  const doc = document.documentElement.scrollWidth > w + 1;
  return {scroll: doc || cut.length > 0, cut: cut.slice(0, 5), tables: tables.length, doc: doc};
}
"""


def _settle(page) -> None:
    """Wait for MathJax's first typeset and Mermaid's diagrams, where the page has them."""
    # MathJax's script is a plain one: at the load event MathJax.startup.promise exists, and it resolves once
    # the page's first typeset (speech included) is done. Awaited directly: no polling, no timeout to wait out.
    try:
        page.evaluate("() => window.MathJax && window.MathJax.startup && window.MathJax.startup.promise")
    except Exception:  # noqa: BLE001 (no MathJax, or it failed: the count of raw TeX and the console say so)
        pass
    if page.query_selector(".mermaid"):
        try:
            page.wait_for_function("() => document.querySelectorAll('pre.mermaid').length === 0",
                                   timeout=8000)
        except Exception:  # noqa: BLE001 (counted as unrendered)
            pass


def _empty_findings(pages: int) -> dict:
    return {"pages": pages, "console_errors": [], "external_requests": [], "failed_requests": [],
            "footnotes_swallowing": [], "tables": 0, "tables_over_column": [], "headline_over_column": [],
            "listings": 0, "listings_scrolling": [], "legends": 0, "legends_clipped": [], "raw_tex": [],
            "raw_mermaid": [], "missing_bench": [], "phone_scroll": [], "phone_tables_scrolling": [],
            "top_tabs_clipped": []}


def _local(url: str) -> bool:
    return urlparse(url).hostname in ("127.0.0.1", "localhost")


def _watch(ctx, page, found: dict, current: dict) -> None:
    """Count, into ``found``, what goes wrong on ``page`` of ``ctx`` while ``current["page"]`` is shown."""
    def request(r):
        # the browser cannot reach another host (CHROMIUM_ARGS' resolver rules): a request for one is counted
        if urlparse(r.url).scheme in ("http", "https", "ws", "wss") and not _local(r.url):
            found["external_requests"].append(f"{current['page']}: {r.url}")

    ctx.on("request", request)
    page.on("console", lambda m: m.type == "error" and found["console_errors"].append(
        f"{current['page']}: {m.text[:200]}"))
    page.on("pageerror", lambda e: found["console_errors"].append(f"{current['page']}: {str(e)[:200]}"))
    # a request of this site that fails (a 404 is a response, not a failure: both are caught); one aborted
    # because the next page's navigation cut it off (net::ERR_ABORTED) is not the site's fault
    page.on("requestfailed", lambda r: _local(r.url) and "ERR_ABORTED" not in (r.failure or "")
            and found["failed_requests"].append(f"{current['page']}: {r.url} ({r.failure})"))
    page.on("response", lambda r: r.status >= 400 and found["failed_requests"].append(
        f"{current['page']}: {r.url} (HTTP {r.status})"))


def _launch(pw):
    return pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)


def _desktop_pass(page, base: str, pages: list[str], found: dict, current: dict) -> str | None:
    """Every page at 1400 px; returns the first page whose first tab set has two tabs or more."""
    tabs_page = None
    for p in pages:
        current["page"] = p or "/"
        page.goto(base + p, wait_until="load")
        _settle(page)
        m = page.evaluate(MEASURE_JS, list(PROVENANCE_ENDINGS))
        found["footnotes_swallowing"] += [f"{p}: ...{t}" for t in m["footnotes"]]
        found["tables"] += len(m["tables"])
        found["tables_over_column"] += [f"{p}: {t['width']} px > {m['column']:.0f}" for t in m["tables"]
                                        if t["over"]]
        found["headline_over_column"] += [f"{p}: {t['width']} px > {m['column']:.0f}" for t in m["tables"]
                                          if t["over"] and t["headline"]]
        found["listings"] += len(m["listings"])
        found["listings_scrolling"] += [f"{p}: longest line {c['longest']}" for c in m["listings"]
                                        if c["scrolls"]]
        found["legends"] += len(m["legends"])
        found["legends_clipped"] += [p for c in m["legends"] if c["clipped"]]
        if m["top_tabs_clipped"]:
            found["top_tabs_clipped"].append(p)
        if m["tex"]:
            found["raw_tex"].append(f"{p}: {m['tex']}")
        if m["mermaid"]:
            found["raw_mermaid"].append(f"{p}: {m['mermaid']}")
        tables, plots = asked_for(p)
        if m["bench_tables"] < tables or m["bench_plots"] < plots:
            found["missing_bench"].append(f"{p}: {m['bench_tables']}/{tables} tables, "
                                          f"{m['bench_plots']}/{plots} plots")
        if tabs_page is None and m["tabs"]:
            tabs_page = p
    return tabs_page


def _phone_pass(base: str, pages: list[str], found: dict) -> None:
    """Every page at 420 px as a phone, in a browser of its own driven from this thread (Playwright's sync
    API wants one instance per thread): its own context (is_mobile: the layout viewport of a phone's
    browser, which a narrowed desktop window does not reproduce), every page loaded again."""
    from playwright.sync_api import sync_playwright

    current = {"page": ""}
    try:
        with sync_playwright() as pw:
            browser = _launch(pw)
            phone = browser.new_context(viewport=PHONE, is_mobile=True)
            ph = phone.new_page()
            _watch(phone, ph, found, current)
            for p in pages:
                current["page"] = p or "/"
                ph.goto(base + p, wait_until="load")
                _settle(ph)
                r = ph.evaluate(PHONE_JS, PHONE["width"])
                if r["scroll"]:
                    found["phone_scroll"].append(f"{p}: page scrolls: {r['doc']}; cut off: {r['cut']}")
                if r["tables"]:
                    found["phone_tables_scrolling"].append(f"{p}: {r['tables']} headline tables")
            browser.close()
    except BaseException as e:  # noqa: BLE001 (raised again in the calling thread)
        found["error"] = e


def audit(site_dir: Path, pages: list[str] | None = None, checks_once: bool = True) -> dict:
    """Visit ``pages`` (default: every page) of the built site in ``site_dir``; return the findings.

    The desktop pass runs in this thread and the phone pass in another, each with its own browser, at the
    same time: a page's load, layout and MathJax's typeset (its speech worker included) keep one core busy, so
    the two passes share out the machine's cores. Each pass counts into its own findings, merged in order
    (desktop, then phone) at the end; the once-per-site checks run after both."""
    from playwright.sync_api import sync_playwright

    if chromium_path() is None:
        raise RuntimeError("no Chromium: install Debian's chromium package or set KM_CHROMIUM")
    state: dict = {}
    server, base = serve(site_dir, state)
    pages = site_pages(site_dir) if pages is None else pages
    found = _empty_findings(len(pages))
    phone_found = _empty_findings(len(pages))
    phone = threading.Thread(target=_phone_pass, args=(base, pages, phone_found), daemon=True)
    try:
        phone.start()
        with sync_playwright() as pw:
            browser = _launch(pw)
            ctx = browser.new_context(viewport=DESKTOP)
            current = {"page": ""}
            page = ctx.new_page()
            _watch(ctx, page, found, current)
            tabs_page = _desktop_pass(page, base, pages, found, current)
            phone.join()
            if "error" in phone_found:
                raise phone_found["error"]
            for key, value in phone_found.items():
                if isinstance(value, list):
                    found[key] += value
            if checks_once:
                current["page"] = "search"
                state["search"] = True
                found["search_transpose"] = _search(page, base)
                current["page"] = "tabs"
                found["tabs_switch"] = None if tabs_page is None else _tabs(page, base + tabs_page)
            browser.close()
    finally:
        server.shutdown()
    return found


def _search(page, base: str) -> int:
    """How many results the site's search lists for "transpose"."""
    page.goto(base, wait_until="load")
    page.click("label.md-search__icon, .md-search__input", timeout=5000)
    page.fill(".md-search__input", "transpose")
    try:
        page.wait_for_selector(".md-search-result__item", timeout=15000)
    except Exception:  # noqa: BLE001
        return 0
    return len(page.query_selector_all(".md-search-result__item"))


def _tabs(page, url: str) -> bool:
    """On ``url``, whose first tab set has two tabs or more (MEASURE_JS's ``tabs``): click the second label;
    True when its panel becomes the visible one."""
    page.goto(url, wait_until="load")
    tabs = page.query_selector(".tabbed-set")
    labels = tabs.query_selector_all(".tabbed-labels > label")
    blocks = tabs.query_selector_all(".tabbed-content > .tabbed-block")
    labels[1].click()
    page.wait_for_timeout(100)
    return bool(blocks[1].is_visible() and not blocks[0].is_visible())


def summary(found: dict) -> dict:
    """The counts of a finding set (what a before/after comparison shows)."""
    return {k: (len(v) if isinstance(v, list) else v) for k, v in found.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("site", type=Path)
    ap.add_argument("--pages", nargs="*")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    found = audit(args.site, args.pages)
    if args.json:
        args.json.write_text(json.dumps(found, indent=1))
    print(json.dumps(summary(found), indent=1))


if __name__ == "__main__":
    main()
