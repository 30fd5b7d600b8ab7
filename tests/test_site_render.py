"""What a bench directive renders, read as HTML the way the site builds it: prose stays in the page body and out
of the provenance footnotes, one GPU or several (content tabs), goal checks in one table, short size labels,
the headline sentence of a summary box, and book versus library versions.

The numbers in the fixtures are test data for the code paths only; nothing here is published."""

from __future__ import annotations

import json
import re

import markdown
import pytest
from test_harness import fake_results

from snippets import site
from snippets.op_index import load_all
from snippets.site.fmt import short_size
from snippets.site.tables import PROVENANCE_ENDINGS, gpu_short, origin_of

OPS = load_all()
# a number (not a name such as H200) or an exponent right before a footnote marker
NUMBER_THEN_MARKER = re.compile(r"((?<![A-Za-z\d])\d[\d,.]*|</sup>|[xX×]\d+)\[\^")
EXTENSIONS = ["footnotes", "tables", "md_in_html", "admonition", "attr_list", "pymdownx.details",
              "pymdownx.superfences", "pymdownx.tabbed"]


def html_of(md: str) -> tuple[str, str]:
    """(page body, footnotes) of ``md`` converted with the site's Markdown extensions."""
    pytest.importorskip("pymdownx", reason="pymdown-extensions is not installed (the GPU image lacks it)")
    out = markdown.markdown(md, extensions=EXTENSIONS, extension_configs={"pymdownx.tabbed":
                                                                          {"alternate_style": True}})
    i = out.find('<div class="footnote">')
    return (out, "") if i < 0 else (out[:i], out[i:])


def footnote_texts(notes: str) -> list[str]:
    items = re.findall(r"<li id=\"fn:[^\"]+\">(.*?)</li>", notes, re.S)
    return [re.sub(r"<[^>]+>|&#160;|&#8617;", "", li).strip() for li in items]


@pytest.mark.parametrize("gap", ["\n", "\n\n"], ids=["no blank line", "blank line"])
@pytest.mark.parametrize("directive", ["table scale", "goal scale v1 v0:1", "headline scale",
                                       "table scale sizes=all"])
def test_paragraph_after_a_directive_stays_in_the_body(tmp_path, directive, gap):
    fake_results(tmp_path, "scale")
    fake_results(tmp_path, "scale", gpu="Other GPU")
    page = f"# Page\n\nBefore.\n\n<!-- bench:{directive} -->{gap}What the table shows, in prose.\n\nLast.\n"
    body, notes = html_of(site.render_page(page, "p.md", tmp_path))
    assert "What the table shows, in prose." in body and "Last." in body
    assert "What the table shows" not in notes and "Last." not in notes
    texts = footnote_texts(notes)
    assert texts and all(t.startswith("Measured by") and t.endswith(PROVENANCE_ENDINGS) for t in texts), texts


def test_directive_inside_an_admonition_is_indented_with_it(tmp_path):
    fake_results(tmp_path, "scale")
    page = '!!! abstract "In this chapter"\n\n    - a bullet\n\n    <!-- bench:headline scale -->\n\nAfter.\n'
    body, notes = html_of(site.render_page(page, "p.md", tmp_path))
    box = body[body.index('class="admonition abstract"'):body.index("After.")]
    assert "book&#x27;s best" in box or "book's best" in box
    assert "library&#x27;s best" in box or "library's best" in box
    assert footnote_texts(notes)


def test_several_gpus_render_as_linked_tabs_one_gpu_as_it_is(tmp_path):
    fake_results(tmp_path, "scale")
    one = site.render_page("<!-- bench:table scale -->\n", "p.md", tmp_path)
    assert "===" not in one
    fake_results(tmp_path, "scale", gpu="NVIDIA H100 80GB HBM3")
    two = site.render_page("<!-- bench:table scale -->\n", "p.md", tmp_path)
    assert '=== "H100"' in two and '=== "Test"' not in two
    body, _ = html_of(two)
    assert body.count('class="bench-table bench-op"') == 2 and "tabbed-set" in body


def test_goal_checks_every_gpu_in_one_table(tmp_path):
    fake_results(tmp_path, "scale")
    fake_results(tmp_path, "scale", gpu="NVIDIA H200")
    md = site.render_page("<!-- bench:goal scale v1 v0:1 ceiling:0.5 -->\n", "p.md", tmp_path)
    rows = [line for line in md.splitlines() if line.startswith("| v1 ")]
    assert len(rows) == 4  # two terms x two GPUs
    assert rows[0].split(" | ")[0] == rows[1].split(" | ")[0]  # a term's GPUs sit together
    assert md.count("| goal | GPU | measured | verdict |") == 1
    assert not NUMBER_THEN_MARKER.search(md)


@pytest.mark.parametrize("op_name", sorted(OPS))
def test_no_footnote_marker_follows_a_digit(tmp_path, op_name):
    """A provenance marker after a number ("2^13" then "3") reads as one number: markers follow words."""
    fake_results(tmp_path, op_name)
    for d in ("table", "headline"):
        md = site.render_page(f"<!-- bench:{d} {op_name} -->\n", "p.md", tmp_path)
        assert not NUMBER_THEN_MARKER.search(md), md[:400]


def test_short_size_labels():
    assert short_size({"m": 8192, "n": 8192, "k": 8192}) == "8192<sup>3</sup>"
    assert short_size({"m": 8192, "n": 8192, "k": 8192}, html=False) == "8192^3"
    assert short_size({"m": 16384, "n": 4096, "k": 14336}) == "16384×4096×14336"
    # hopper_gemm's categorical axis labels its own m, n, k: not repeated
    assert short_size({"shape": "2048x28672x4096", "m": 2048, "n": 28672, "k": 4096}) == \
        "2048×28672×4096"
    assert short_size({"m": 64, "n": 64, "k": 64, "g": 128}) == "64<sup>3</sup> g=128"
    assert short_size({"m": 16384, "n": 8192}) == "16384×8192"
    assert short_size({"b": 4, "h": 32, "s": 4096, "d": 128, "causal": False}) == "B4 H32 S4096 D128"
    assert short_size({"b": 4, "h": 32, "s": 4096, "d": 128, "causal": True}) == "B4 H32 S4096 D128 causal"
    assert short_size({"n": 2**28}, html=False) == "2^28"
    assert short_size({"n": 12345}) == "12345"
    assert short_size({"bytes": 2**30, "iters": 32768}) == "bytes=1 GiB iters=32768"
    # every registered size gets a label shorter than the old "k = v, ..." form, and distinct sizes stay distinct
    for op in OPS.values():
        labels = {short_size(sz) for sz in [op.headline, *op.sweep]}
        assert len(labels) == len({json.dumps(dict(sz), sort_keys=True) for sz in [op.headline, *op.sweep]})
        assert len(short_size(op.headline)) < len(site._fmt_size(op.headline)) + 1


def test_gpu_short_names():
    assert gpu_short("NVIDIA H100 80GB HBM3") == "H100"
    assert gpu_short("NVIDIA H200") == "H200"
    assert gpu_short("nvidia-h100-80gb-hbm3") == "H100"


def test_library_versions_are_marked_and_never_the_books_best(tmp_path):
    # torch.compile and Liger-Kernel are libraries even where they generate Triton
    assert origin_of(OPS["rmsnorm"], "v1") == "library" and origin_of(OPS["rmsnorm"], "v2") == "library"
    assert origin_of(OPS["rmsnorm"], "v4") == "book" and origin_of(OPS["rmsnorm"], "v0") == "library"
    fake_results(tmp_path, "rmsnorm")  # the fixture makes the last version (v4) fastest: ms = 1 / (k + 1)
    data = json.loads((tmp_path / "test-gpu.json").read_text())
    for r in data["ops"]["rmsnorm"]["records"]:  # make the library's v2 the fastest of all
        if r["impl"] == "v2":
            r["ms"], r["value"] = r["ms"] / 100, r["value"] * 100
    (tmp_path / "test-gpu.json").write_text(json.dumps(data))
    md = site.render_page("<!-- bench:headline rmsnorm dtype=float32 -->\n", "p.md", tmp_path)
    assert "book's best: **v4**" in md and "library's best: **v2**" in md


def test_long_captured_output_is_folded(tmp_path):
    d = tmp_path / "outputs" / "nvidia-h200"
    d.mkdir(parents=True)
    (d / "short.txt").write_text("one line\n")
    (d / "long.txt").write_text("\n".join(f"line {i}" for i in range(100)) + "\n")
    short = site.render_page("<!-- bench:output short -->\n", "p.md", tmp_path)
    long = site.render_page("<!-- bench:output long -->\n", "p.md", tmp_path)
    assert "???" not in short and "one line" in short and ".bench-output" in short
    assert '??? note "Output captured on the H200 (100 lines)' in long and "    line 99" in long


def test_report_credits_a_library_result_to_the_library(tmp_path):
    """torch.compile and Liger-Kernel generate Triton, but their results are the library's: the report (and
    the README and summary built from it) name the book's best and the library's best apart."""
    from snippets.bench import report

    fake_results(tmp_path, "rmsnorm")
    data = json.loads((tmp_path / "test-gpu.json").read_text())
    for r in data["ops"]["rmsnorm"]["records"]:
        r["dtype"] = "bfloat16"  # the op's headline dtype
        if r["impl"] == "v2":  # Liger-Kernel fastest of all
            r["ms"], r["value"] = r["ms"] / 100, r["value"] * 100
    (tmp_path / "test-gpu.json").write_text(json.dumps(data))
    rec = next(r for r in report.report(tmp_path) if r["op"] == "rmsnorm" and r["device"])
    assert rec["best_impl"] == "v4" and rec["library_impl"] == "v2" and rec["book_vs_library"] < 1
    row = site.render_summary(tmp_path)
    line = next(x for x in row.splitlines() if "`rmsnorm`" in x)
    assert "| v4 Triton" in line and "| v2 Triton |" in line
