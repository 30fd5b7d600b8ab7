"""The mutation campaign (scripts/mutate.py): every mutant applies to the current sources (its original text
found exactly once), the list covers Parts 1-5 with at least 40 semantic bugs, and a few mutants run end to
end on a copy of the repository: planted bugs are killed (one of them an out-of-bounds mask, which the
interpreter's bounds checks turn into a failed test), a change that is not a bug survives, and the working
tree is left as it was. The full campaign is `python scripts/mutate.py` (minutes; see its docstring)."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
from helpers import load_script

from snippets.registry import REPO_ROOT

mutate = load_script("mutate")


def test_every_mutant_applies_to_the_current_sources():
    assert mutate.check(REPO_ROOT) == []


def test_the_list_covers_every_part():
    assert len(mutate.MUTANTS) >= 40
    files = {m.file for m in mutate.MUTANTS}
    for part in ("part1", "part2", "part3", "part4", "part5"):
        assert any(f"snippets/{part}/" in f for f in files), f"no mutant in {part}"
    for m in mutate.MUTANTS:
        for arg in m.tests:
            if arg.startswith("tests/"):
                assert (REPO_ROOT / arg).is_file(), f"{m.name}: no test file {arg}"
        assert m.bug, f"{m.name}: say which bug it stands for"


def test_select_and_its_refusal():
    assert [m.name for m in mutate.select(["rmsnorm_eps"])] == ["rmsnorm_eps"]
    assert {m.name for m in mutate.select(["rmsnorm_*"])} >= {"rmsnorm_eps", "rmsnorm_bwd_drops_term"}
    with pytest.raises(SystemExit, match="no mutant matches"):
        mutate.select(["no_such_mutant"])


def test_check_reports_a_stale_original():
    stale = dataclasses.replace(mutate.MUTANTS[0], original="text that is in no file")
    assert mutate.check(REPO_ROOT, [stale]) == [f"{stale.name}: original text found 0 times in {stale.file}"]


def _digest(paths) -> str:
    return hashlib.sha256(b"".join((REPO_ROOT / p).read_bytes() for p in paths)).hexdigest()


INTERPRETER_PROBLEM = mutate.interpreter_problem()


@pytest.mark.skipif(INTERPRETER_PROBLEM is not None, reason=str(INTERPRETER_PROBLEM))
def test_campaign_end_to_end():
    """Three runs on one copy, each with a narrow test selection to stay fast: the row mask ``offs <= n``
    (an out-of-bounds read and write, killed through the bounds checks), RMSNorm's eps (killed through the
    reference's own constant) and a comment edit (not a bug: it survives)."""
    by_name = {m.name: m for m in mutate.MUTANTS}
    oob = dataclasses.replace(by_name["add_mask_le"], tests=("tests/test_part1.py", "-k", "add_triton"))
    eps = dataclasses.replace(by_name["rmsnorm_eps"],
                              tests=("tests/test_reference_constants.py", "-k", "rmsnorm_kernel_default"))
    comment = mutate.Mutant("comment_only", oob.file, "# the last program runs past the end",
                            "# the final program runs past the end", oob.tests, "not a bug")
    files = sorted({m.file for m in (oob, eps, comment)})
    before = _digest(files)
    report = mutate.campaign([oob, eps, comment], jobs=1, timeout=300, baseline=False)
    status = {r["name"]: r for r in report["mutants"]}
    assert status["add_mask_le"]["status"] == "killed", status["add_mask_le"]
    assert status["add_mask_le"]["how"] == "failed", "a failed test, not a crashed interpreter"
    assert status["rmsnorm_eps"]["status"] == "killed", status["rmsnorm_eps"]
    assert status["comment_only"]["status"] == "survived", status["comment_only"]
    assert (report["killed"], report["survived"], report["total"]) == (2, 1, 3)
    assert _digest(files) == before, "the campaign must not touch the working tree"
