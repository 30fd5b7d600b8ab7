"""No measured figure is typed into the code: the measurements live in the results, and the chapters
show them through their bench directives (tables, plots, goal checks), which say which GPU, which
size and whether the number is still fresh.

A figure written into a docstring or a comment ("3.56 TB/s there", "0.333 ms", "1.8x faster") is
true of one GPU, one driver and one version of the code, and silently goes stale when any of them
changes. So every ``.py`` file under ``snippets/`` (its comments, docstrings and other string
literals) and every file under ``csrc/`` (comments and string literals; its code too) is scanned
for a number followed by a rate or a time unit, a percentage of something, or a speed ratio, and
the test fails listing ``file:line`` for each.

What may carry such a number is listed in ``ALLOWED``, each entry with its reason: a chapter's goal
(a target, not a measurement: "at least 90% of cuBLAS"), a hardware specification, or a unit that
is no measurement at all (a tolerance, a timeout).
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SNIPPETS = REPO_ROOT / "snippets"
CSRC = REPO_ROOT / "csrc"

_NUM = r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?:[eE][+-]?\d+)?"
# A number and a unit of rate or time: "3.56 TB/s", "0.333 ms", "349 TFLOP/s", "~0.8 us".
RATE_OR_TIME = re.compile(
    _NUM + r"\s*(?:[KMGT]i?B/s|[KMGTP]FLOP/?s|[KMGTP]FLOPS|ms|us|µs|μs|ns|s/iter)(?![\w/])")
# A share of something: "85% of copy", "within 2% of each other", "3 percent slower".
PERCENT = re.compile(_NUM + r"\s*(?:%|percent)\s*(?:of|faster|slower|better|worse|more|less|"
                     r"above|below|behind|ahead|off)\b", re.IGNORECASE)
# A speed ratio: "1.8x faster", "2 times slower", "0.8x of cuBLAS", "3x speedup", "a 1.5x win".
RATIO = re.compile(
    _NUM + r"\s*(?:x|×|times)\s+(?:faster|slower|as fast|the speed|the throughput|the rate|"
    r"the bandwidth|speed-?ups?|win|of (?:cuBLAS|cuDNN|torch|PyTorch|Liger|SDPA|the ceiling|"
    r"copy|peak|eager))", re.IGNORECASE)
PATTERNS = (RATE_OR_TIME, PERCENT, RATIO)

# (file, a piece of the flagged line) -> why that figure is not a measurement. Keep it short: a new
# entry needs a reason that a reader of the chapter would accept.
ALLOWED: dict[tuple[str, str], str] = {
    # goals: targets that the chapter's goal check measures against, not results
    ("snippets/part2/transpose.py", "at least 85% of copy"): "the chapter's goal",
    ("snippets/part3/reduce.py", "at least 90% of"): "the chapter's goal",
    ("snippets/part3/scan.py", "at least 75% of copy"): "the chapter's goal",
    ("snippets/part3/sgemm.py", "at least 90% of cuBLAS"): "the chapter's goal",
    ("snippets/part5/flash_attention.py", "the backward at least 0.8 times as fast as the"):
        "the chapter's goal",
    # hardware specifications: datasheet numbers, the same on every run
    ("csrc/part1/device_query.cu", "= 4814 GB/s, its datasheet's"):
        "the H200's memory bandwidth from its reported clock and bus width: a specification",
    ("csrc/part1/device_query.cu", "// 4.8 TB/s."): "the H200 datasheet's memory bandwidth",
    ("snippets/part3/streams.py", "at the 67 TFLOP/s fp32 of the H200 datasheet take 4.1 ms"):
        "a datasheet rate and the time it implies for the sweep's work: a specification",
    ("snippets/part3/streams.py", "at the 63 GB/s per direction of such a link"):
        "PCIe 5.0 x16's rate per direction after line encoding, and the time it implies",
    ("snippets/part4/softmax.py", "law asks for at 4.8 TB/s and ~0.8 us of DRAM latency"):
        "Little's law from the H200 datasheet bandwidth and a typical DRAM latency",
    # units that measure nothing: durations the code asks for, thresholds, operation counts
    ("snippets/bench/timing.py", "About 50 us at Hopper's ~2 GHz"):
        "the spin kernel's length: a fixed cycle count the timer asks for, at the clock",
    ("snippets/site/roofline.py", "roofs within 15% of each other share one label"):
        "a layout threshold of the roofline figure",
    ("snippets/part5/lora.py", "1% of each"): "the adapter's share of FLOPs and bytes: a count",
}


def strings_and_comments_py(text: str) -> list[tuple[int, str]]:
    """(first line, text) of every comment and string literal (docstrings, f-strings) of a Python
    source: the places a figure could be typed into."""
    out = []
    # Python 3.12 tokenizes an f-string as FSTRING_START, FSTRING_MIDDLE (its literal text), ...,
    # FSTRING_END instead of one STRING: the literal pieces are what a figure could be typed into.
    kinds = {tokenize.COMMENT, tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in kinds:
            out.append((tok.start[0], tok.string))
    return out


def figures(text: str, first_line: int = 1) -> list[tuple[int, str]]:
    """(line, matched text) of every measured-looking figure in ``text``, which starts at
    ``first_line`` of its file."""
    hits = []
    for pattern in PATTERNS:
        for m in pattern.finditer(text):
            hits.append((first_line + text.count("\n", 0, m.start()), m.group()))
    return sorted(set(hits))


def scanned_files() -> list[Path]:
    return sorted([*SNIPPETS.rglob("*.py"), *(p for p in CSRC.rglob("*") if p.is_file())])


def found_figures(path: Path) -> list[tuple[int, str, str]]:
    """(line, figure, whole line) of every figure in ``path`` that ``ALLOWED`` does not excuse."""
    text = path.read_text()
    lines = text.splitlines()
    rel = path.relative_to(REPO_ROOT).as_posix()
    pieces = strings_and_comments_py(text) if path.suffix == ".py" else [(1, text)]
    out = []
    for start, piece in pieces:
        for line, fig in figures(piece, start):
            whole = lines[line - 1]
            if not any(f == rel and allowed in whole for f, allowed in ALLOWED):
                out.append((line, fig, whole.strip()))
    return out


def test_patterns_catch_measurements_and_spare_the_rest():
    caught = ["the forward at 4.23 TB/s there", "eager PyTorch took 14.9 ms", "~0.8 us of latency",
              "(349 TFLOP/s)", "1,234 GB/s", "within 2% of each other", "1.8x faster than v2",
              "3 times slower", "reaches 0.8x of cuBLAS", "a 2x speedup", "5 GFLOPS", "12 ns"]
    spared = ["5x the H200's L2", "4x the bytes in flight", "f'{ms:.3f} ms'", "metric='GB/s'",
              "2 ** 28 elements", "1e-5 relative", "within 50 lines", "256 threads", "x2 ms",
              "sm_90a", "3 stages", "v2 is faster", "100% sure"]
    for text in caught:
        assert figures(text), text
    for text in spared:
        assert not figures(text), (text, figures(text))


def test_strings_and_comments_are_what_is_scanned():
    source = 'x = 3  # 2.5 ms\n"""doc: 1 TB/s"""\ny = f"{t:.2f} ms"\nz = 4  \nw = f"took 3.5 ms ({n})"\n'
    assert sorted({line for line, _ in strings_and_comments_py(source)}) == [1, 2, 3, 5]
    assert [(line, fig) for line, piece in strings_and_comments_py(source)
            for line, fig in figures(piece, line)] == [(1, "2.5 ms"), (2, "1 TB/s"), (5, "3.5 ms")]


def test_every_allowed_figure_is_still_there():
    """An entry of ALLOWED whose line is gone is stale: remove it, so the list stays short."""
    stale = [f"{f}: {piece!r}" for f, piece in ALLOWED
             if not (REPO_ROOT / f).is_file() or piece not in (REPO_ROOT / f).read_text()]
    assert not stale, "ALLOWED entries that match nothing:\n" + "\n".join(stale)


@pytest.mark.parametrize("path", scanned_files(), ids=lambda p: p.relative_to(REPO_ROOT).as_posix())
def test_no_measured_figures(path: Path):
    found = found_figures(path)
    assert not found, (
        "measured figures belong in the results, not in the code; point to the chapter's bench "
        "table or goal check in words instead (or, for a goal, a specification or a unit that "
        "measures nothing, add an entry with its reason to ALLOWED):\n"
        + "\n".join(f"{path.relative_to(REPO_ROOT)}:{line}: {fig!r} in {whole!r}"
                    for line, fig, whole in found))
