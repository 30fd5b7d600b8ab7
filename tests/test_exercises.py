"""The self-checking exercises (exercises/, ``python -m snippets exercise``).

For every exercise: the check passes on the reference solution (these tests carry the ``exercise`` marker:
``pytest -m exercise`` runs them alone), fails on the untouched file a learner starts from, and fails on every
planted wrong solution with a message that says what is wrong (the catalogue names a piece of text each failure
must contain: the mismatching element, the out-of-bounds access, the function call with the wrong value). Then
the catalogue, the CLI, docs/exercises.md and the chapters' Exercises sections must agree, the solutions must
agree with the book's own functions where the book has one, and the CUDA emulator must catch what it claims to.

CUDA exercises compile with nvcc where it is installed (the compile case is skipped, and said to be, where it is
not) and run on the CPU emulator (g++); their GPU run is the ``gpu``-marked test at the end.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from exercises import cuda, engine
from exercises.catalog import EXERCISES
from exercises.engine import MARK, PLANTED, ROOT, SOLUTIONS, Exercise, check, planted_names

REPO_ROOT = Path(__file__).resolve().parent.parent
IDS = list(EXERCISES)
PLANTED_CASES = [(ex_id, name) for ex_id, ex in EXERCISES.items() for name in ex.planted]
# Part 7's exercises check on gloo ranks, in plain tensors and on the meta device: they have no GPU path, so the
# GPU suite leaves them to the CPU suite (marked cpu_only; they took over half of this file's time on the runner).
# test_the_cpu_only_exercises_use_no_gpu holds them to it.
CPU_ONLY_PARTS = (7,)


def _cases(cases: list) -> list:
    """``cases`` (exercise ids, or (id, planted name) pairs) as parameters, those of CPU_ONLY_PARTS marked cpu_only."""
    def part(case) -> int:
        return EXERCISES[case if isinstance(case, str) else case[0]].part

    return [pytest.param(*([c] if isinstance(c, str) else c), id=c if isinstance(c, str) else "-".join(c),
                         marks=[pytest.mark.cpu_only] if part(c) in CPU_ONLY_PARTS else [])
            for c in cases]


def _runnable(ex: Exercise) -> None:
    """A CUDA exercise needs the emulator's compiler or a GPU to run its kernel at all."""
    if ex.kind == "cuda" and cuda.gxx() is None and cuda.gpu_unavailable():
        pytest.skip("no g++ for the CPU emulator and no GPU: a CUDA exercise's kernel cannot run here")


@pytest.mark.exercise
@pytest.mark.parametrize("ex_id", _cases(IDS))
def test_solution_passes(ex_id):
    ex = EXERCISES[ex_id]
    _runnable(ex)
    result = check(ex, "solution")
    assert result.passed, result.report()


@pytest.mark.parametrize("ex_id", _cases(IDS))
def test_untouched_file_fails(ex_id):
    ex = EXERCISES[ex_id]
    _runnable(ex)
    stubs = [ROOT / f for f in ex.files]
    if not all(MARK in p.read_text() for p in stubs):
        pytest.skip(f"{', '.join(str(p) for p in stubs)}: edited (no '# {MARK}' left), so not the untouched file")
    result = check(ex, "learner")
    assert not result.passed, result.report()
    assert result.failure and result.hint, result.report()
    assert MARK in result.report()  # the report says the file is not done yet


@pytest.mark.parametrize("ex_id,name", _cases(PLANTED_CASES))
def test_planted_solution_fails_and_says_why(ex_id, name):
    ex = EXERCISES[ex_id]
    _runnable(ex)
    result = check(ex, "planted", name)
    assert not result.passed, result.report()
    wanted = ex.planted[name].split("|")
    assert any(w in result.failure for w in wanted), (f"the failure should mention one of {wanted}:\n"
                                                      + result.report())
    assert result.hint, result.report()


@pytest.mark.cpu_only
def test_the_cpu_only_exercises_use_no_gpu():
    """What the GPU suite leaves out of this file must not need the GPU: no CUDA in the checks of CPU_ONLY_PARTS'
    catalogues, their learners' files or their solutions (test_gpu_suite's rule for cpu_only tests)."""
    from test_gpu_suite import GPU_USE

    paths = [REPO_ROOT / "exercises" / "catalog" / f"part{n}.py" for n in CPU_ONLY_PARTS]
    paths += [base / rel for ex in EXERCISES.values() if ex.part in CPU_ONLY_PARTS for rel in ex.files
              for base in (ROOT, SOLUTIONS)]
    assert len(paths) > len(CPU_ONLY_PARTS)
    for path in paths:
        found = GPU_USE.search(path.read_text())
        assert not found, f"{path} uses the GPU ({found[0]!r}): its exercise must not be cpu_only"
    assert {"cuda"} & {ex.kind for ex in EXERCISES.values() if ex.part in CPU_ONLY_PARTS} == set()


# ---------------------------------------------------------------------------------------------- the catalogue

def test_every_part_has_six_exercises_graded_one_to_four():
    # every part, 1 to 8, at least six
    parts = {p: [ex for ex in EXERCISES.values() if ex.part == p] for p in (1, 2, 3, 4, 5, 6, 7, 8)}
    assert all(len(v) >= 6 for v in parts.values()), {p: len(v) for p, v in parts.items()}
    assert len(EXERCISES) >= 30
    assert {ex.difficulty for ex in EXERCISES.values()} == {1, 2, 3, 4}
    assert {ex.kind for ex in EXERCISES.values()} == {"model", "triton", "cuda", "python"}


@pytest.mark.parametrize("ex_id", IDS)
def test_files_stub_solution_and_planted(ex_id):
    ex = EXERCISES[ex_id]
    for rel in ex.files:
        assert (SOLUTIONS / rel).is_file(), rel
        assert MARK not in (SOLUTIONS / rel).read_text(), rel
        assert (ROOT / rel).is_file(), rel
    assert any(MARK in (ROOT / rel).read_text() for rel in ex.files), "no stub has '# YOUR CODE HERE'"
    assert planted_names(ex) == sorted(ex.planted), "planted files on disk differ from the catalogue"
    assert ex.hint and ex.task and ex.title
    assert (REPO_ROOT / "docs" / ex.chapter).is_file(), ex.chapter


def test_no_stray_planted_files():
    known = {str(PLANTED / Path(rel).parent / f"{Path(rel).stem}.{name}{Path(rel).suffix}")
             for ex in EXERCISES.values() for rel in ex.files for name in ex.planted}
    known |= {str(PLANTED / f"{rel}.planted.json") for ex in EXERCISES.values() for rel in ex.files}
    stray = [str(p) for p in PLANTED.rglob("*") if p.is_file() and str(p) not in known]
    assert not stray, stray
    # every edit of a solution names a planted variant the catalogue expects, and still applies
    for ex in EXERCISES.values():
        for rel in ex.files:
            f = PLANTED / f"{rel}.planted.json"
            if f.is_file():
                names = set(json.loads(f.read_text()))
                assert names <= set(ex.planted), (rel, names - set(ex.planted))
                for name in names:
                    assert engine.planted_path(rel, name).is_file()


# ---------------------------------------------------------------------------------------------- CLI and docs

def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snippets", "exercise", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)


def test_cli_list_is_the_catalogue_and_the_docs_table():
    r = _cli("list", "--json")
    assert r.returncode == 0, r.stderr
    records = [json.loads(line) for line in r.stdout.splitlines()]
    assert [rec["id"] for rec in records] == IDS
    page = (REPO_ROOT / "docs" / "exercises.md").read_text()
    table = page.split("<!-- exercises:start -->", 1)[1].split("<!-- exercises:end -->", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "exercise check" in line]
    assert len(rows) == len(records)
    for rec, row in zip(records, rows):
        assert f"`{rec['check']}`" in row and f"{rec['difficulty']}: {rec['difficulty_name']}" in row, row
        assert f"({rec['chapter']}#exercises)" in row and f"| {rec['kind']} |" in row, row


def test_docs_table_is_current():
    r = subprocess.run([sys.executable, "scripts/exercise_table.py", "--check"], cwd=REPO_ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_cli_check_reports_what_is_wrong():
    ok = _cli("check", "part1.execution-model.1", "--solution")
    assert ok.returncode == 0 and "result: passed" in ok.stdout, ok.stdout + ok.stderr
    bad = _cli("check", "part1.execution-model.1", "--planted", "no_rounding")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "resident_blocks(256, 33) = 7, expected 6" in bad.stdout and "hint:" in bad.stdout, bad.stdout
    unknown = _cli("check", "part9.nothing.1")
    assert unknown.returncode == 2 and "no exercise" in unknown.stderr


def _exercise_items(chapter: str) -> dict[int, str]:
    """Number -> text of each item of a chapter's Exercises section."""
    text = (REPO_ROOT / "docs" / chapter).read_text()
    section = text.split("\n## Exercises\n", 1)[1].split("\n## ", 1)[0]
    items = re.split(r"\n(?=\d+\. )", "\n" + section)
    return {int(m.group(1)): item for item in items if (m := re.match(r"(\d+)\. ", item))}


@pytest.mark.parametrize("ex_id", IDS)
def test_the_chapter_marks_the_exercise_with_its_check(ex_id):
    ex = EXERCISES[ex_id]
    items = _exercise_items(ex.chapter)
    assert ex.number in items, f"docs/{ex.chapter} has no exercise {ex.number}"
    assert f"Check it: `{ex.command}`" in items[ex.number], items[ex.number]


# ---------------------------------------------------------------------------------------------- against the book

def _solution(rel: str):
    from exercises.engine import load_module

    return load_module(SOLUTIONS / rel)


def test_conflict_degrees_agree_with_the_banks_chapter():
    from snippets.part2.banks import conflict_ways

    sol = _solution("part2/conflicts.py")
    for stride in range(1, 65):
        assert sol.conflict_degree(stride) == conflict_ways(stride, "plain"), stride


def test_sectors_agree_with_the_coalescing_chapter():
    from snippets.part2.coalescing import sectors_touched

    sol = _solution("part2/sectors.py")
    for itemsize in (1, 2, 4, 8):
        for stride in range(1, 40):
            assert sol.sectors_per_request(stride, itemsize) == sectors_touched(32, stride, 0, itemsize)


def test_occupancy_agrees_with_the_chapter_worked_example():
    sol = _solution("part1/occupancy.py")
    assert sol.resident_blocks(256, 32) == 8 and sol.occupancy(256, 32) == 1.0
    assert sol.occupancy(256, 64) == 0.5 and sol.occupancy(256, 40) == 0.75
    assert sol.occupancy(256, 32, smem_per_block=48 * 1024) == 0.5


def test_validation_tolerance_is_the_sgemm_chapters():
    from snippets.part3.sgemm import tolerance_for_k

    sol = _solution("part3/validate.py")
    for k in (1, 16, 4096):
        assert sol.tolerance(k) == tolerance_for_k(k)


def test_softmax_bytes_agree_with_the_chapter():
    from snippets.part4.softmax import chain_bytes

    sol = _solution("part4/softmax_bytes.py")
    m, n, s = 16384, 8192, 2
    assert 2 * m * n * s == chain_bytes(m, n, s)["fused"]  # what a rate counts
    assert sol.bytes_online(m, n, s) == 1.5 * chain_bytes(m, n, s)["fused"]  # "v4 moves 1.5 times that"


def test_metrics_solution_matches_the_harness_rate():
    import snippets.part1.elementwise  # noqa: F401
    from snippets.registry import REGISTRY

    op = REGISTRY["vector_add"]
    sol = _solution("part3/metrics.py")
    assert sol.for_op(op, op.headline, torch.float32, 1.0)["gb_per_s"] == pytest.approx(
        op.rate(op.headline, torch.float32, 1.0))


# ---------------------------------------------------------------------------------------------- the CUDA emulator

requires_gxx = pytest.mark.skipif(cuda.gxx() is None, reason="no g++: the CUDA emulator cannot be built")


def _emulate(tmp_path, body: str, grid=(1,), block=(64,), n=64):
    src = tmp_path / "k.cu"
    src.write_text('extern "C" __global__ void k(float* out, int n) {\n' + body + "\n}\n")
    return cuda.emulate(src, cuda.Kernel("k", "float* out, int n"), grid, block, (cuda.Out(n), n), 0)


@requires_gxx
def test_emulator_runs_shuffles_and_barriers(tmp_path):
    out = _emulate(tmp_path, """
        __shared__ float s[64];
        int t = threadIdx.x;
        s[t] = t;
        __syncthreads();
        float v = s[63 - t];
        v += __shfl_xor_sync(0xffffffffu, v, 1);
        if (t < n) out[t] = v + __popc(__ballot_sync(0xffffffffu, t % 2));""")[0]
    t = torch.arange(64.0)
    expected = (63 - t) + (63 - (t.long() ^ 1).float()) + 16
    assert torch.equal(out, expected)


@requires_gxx
def test_emulator_reports_a_divergent_syncthreads(tmp_path):
    from exercises.engine import Failure

    with pytest.raises(Failure, match="__syncthreads"):
        _emulate(tmp_path, """
            if (threadIdx.x < 16) { __syncthreads(); out[threadIdx.x] = 1.0f; }
            else { __syncthreads(); out[threadIdx.x] = 2.0f; }""")
    with pytest.raises(Failure, match="returned while others wait"):
        _emulate(tmp_path, """
            if (threadIdx.x >= 32) return;
            __syncthreads();
            out[threadIdx.x] = 1.0f;""")


@requires_gxx
def test_emulator_catches_a_store_past_the_end(tmp_path):
    from exercises.engine import Failure

    with pytest.raises(Failure, match=r"past the end of out \(first: out\[64\]"):
        _emulate(tmp_path, "out[threadIdx.x] = 1.0f;", block=(96,))


@pytest.mark.skipif(cuda.nvcc() is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("ex_id", [i for i, ex in EXERCISES.items() if ex.kind == "cuda"])
def test_cuda_solutions_compile_with_nvcc(ex_id):
    result = check(EXERCISES[ex_id], "solution")
    assert any(status == "ok" and text.startswith("nvcc compiles") for status, text in result.lines), \
        result.report()


@pytest.mark.gpu
@pytest.mark.parametrize("ex_id", [i for i, ex in EXERCISES.items() if ex.kind == "cuda"])
def test_cuda_solutions_run_on_the_gpu(ex_id):
    pytest.importorskip("cupy", reason="the GPU run of a CUDA exercise goes through CuPy")
    result = check(EXERCISES[ex_id], "solution")
    assert result.passed, result.report()
    assert any(status == "ok" and "GPU" in text for status, text in result.lines), result.report()


def test_part6_solutions_agree_with_the_books_layout_algebra():
    """The layout exercises' solutions are the same functions as snippets/part6/layout.py."""
    import random

    from snippets.part6.layout import Swizzle, coalesce, make_layout

    crd, coal, sw = (_solution(f"part6/{n}.py") for n in ("crd2idx", "coalesce", "swizzle"))
    rng = random.Random(7)
    for _ in range(300):
        shape = tuple(rng.choice([rng.randint(1, 4), (rng.randint(1, 3), rng.randint(1, 3))])
                      for _ in range(rng.randint(1, 3)))
        stride = tuple(s if isinstance(s, int) else tuple(rng.randint(0, 9) for _ in s)
                       for s in (rng.randint(0, 9) if isinstance(x, int) else x for x in shape))
        layout = make_layout(shape, stride)
        for k in range(layout.size):
            assert crd.crd2idx(k, shape, stride) == layout(k)
        got_shape, got_stride = coal.coalesce(shape, stride)
        assert make_layout(got_shape, got_stride) == coalesce(layout)
    for b, m, s in ((3, 4, 3), (2, 3, 3), (3, 3, 3)):
        assert all(sw.swizzle(o, b, m, s) == Swizzle(b, m, s)(o) for o in range(4096))
