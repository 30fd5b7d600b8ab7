"""The exercise checker: what an exercise is, how its files are found, and how a check runs and reports.

An exercise has files the learner edits (``exercises/partN/...``), the same files solved
(``exercises/solutions/partN/...``) and one or more *planted* wrong solutions
(the solution with one bug put in, kept as an edit of it in ``exercises/planted/partN/<file>.planted.json``,
or as a whole file ``exercises/planted/partN/<stem>.<name><suffix>``: a planted variant replaces some of the
files and takes the others from the solution). Its check is a function of a :class:`Run`, which loads the files of the variant
under test and records what passed; the first failure stops the check with a message that says what is wrong
and a hint written for that exercise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import re
import sys
import traceback
import warnings
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

ROOT = Path(__file__).resolve().parent  # exercises/
REPO_ROOT = ROOT.parent
SOLUTIONS = ROOT / "solutions"
PLANTED = ROOT / "planted"
DOCS = REPO_ROOT / "docs"
BUILD = REPO_ROOT / "build" / "exercises"  # compiled CUDA checks (build/ is not tracked)
MARK = "YOUR CODE HERE"

DIFFICULTY = {
    1: "fill one line",
    2: "write a few lines",
    3: "write most of it",
    4: "write the kernel",
}
KINDS = {
    "model": "a Python function that predicts a number (bytes, intensity, occupancy, conflicts), compared "
             "with the solution on several parameter sets",
    "triton": "a Triton kernel, run on the CPU through Triton's interpreter (on the GPU when there is one) "
              "and compared with a PyTorch reference",
    "cuda": "a CUDA C kernel: compiled with nvcc (syntax, signature), run on the CPU emulator "
            "(exercises/emu/cuda_emu.h) and, when CuPy and a GPU are present, on the GPU",
    "python": "Python code around kernels (a tolerance, a benchmark metric), checked on cases with known answers",
}
VARIANTS = ("learner", "solution", "planted")


class Failure(Exception):
    """A check failed. ``message`` says what is wrong; ``hint``, when given, replaces the exercise's hint."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint


class Skip(Exception):
    """A part of a check cannot run here (no nvcc, no GPU): reported, not a failure."""


@dataclasses.dataclass(frozen=True)
class Exercise:
    """One auto-checked exercise.

    ``id`` is ``partN.<chapter>.<k>``: the chapter's page (``docs/partN/<chapter>.md``) and the number of the
    exercise in its Exercises section. ``files`` are paths relative to ``exercises/``. ``planted`` maps each
    planted wrong solution's name to a piece of text its failure message must contain (the tests hold the
    checker to it). ``gpu`` says what part of the check only a GPU can do ("" when none).
    """

    id: str
    title: str
    difficulty: int
    kind: str
    files: tuple[str, ...]
    task: str
    hint: str
    check: Callable[["Run"], None]
    planted: dict[str, str]
    gpu: str = ""

    def __post_init__(self) -> None:
        if not re.fullmatch(r"part[1-8]\.[a-z0-9-]+\.\d+", self.id):
            raise ValueError(f"{self.id}: an id is partN.<chapter>.<number>")
        if self.difficulty not in DIFFICULTY:
            raise ValueError(f"{self.id}: difficulty must be one of {sorted(DIFFICULTY)}")
        if self.kind not in KINDS:
            raise ValueError(f"{self.id}: kind must be one of {sorted(KINDS)}")
        if not self.planted:
            raise ValueError(f"{self.id}: an exercise needs at least one planted wrong solution")

    @property
    def part(self) -> int:
        return int(self.id.split(".")[0][4:])

    @property
    def chapter(self) -> str:
        """The chapter's page, relative to docs/."""
        part, slug, _ = self.id.split(".")
        return f"{part}/{slug}.md"

    @property
    def number(self) -> int:
        """The exercise's number in the chapter's Exercises section."""
        return int(self.id.split(".")[2])

    @property
    def command(self) -> str:
        return f"python -m snippets exercise check {self.id}"


def _substitutions(rel: str) -> dict[str, list[list[str]]]:
    """The planted variants of one file as edits of its solution: ``exercises/planted/<rel>.planted.json``
    maps each variant's name to its (old, new) substitutions, each ``old`` found once in the solution. A
    planted solution is the solution with one bug put in, so it is kept as that edit, not as a copy."""
    f = PLANTED / f"{rel}.planted.json"
    return json.loads(f.read_text()) if f.is_file() else {}


def planted_path(rel: str, name: str) -> Path:
    """The file of a planted variant: a hand-written one under ``exercises/planted/`` if there is one,
    else the solution with the variant's substitutions applied, written under ``build/exercises/``."""
    p = Path(rel)
    written = PLANTED / p.parent / f"{p.stem}.{name}{p.suffix}"
    subs = _substitutions(rel).get(name)
    if written.exists() or subs is None:
        return written
    text = (SOLUTIONS / rel).read_text()
    for old, new in subs:
        if text.count(old) != 1:
            raise ValueError(f"planted {name!r} of {rel}: its edit no longer matches the solution once; "
                             "update exercises/planted/" + f"{rel}.planted.json")
        text = text.replace(old, new)
    out = ROOT.parent / "build" / "exercises" / "planted" / p.parent / written.name
    out.parent.mkdir(parents=True, exist_ok=True)
    if not out.exists() or out.read_text() != text:
        out.write_text(text)
    return out


def planted_names(ex: Exercise) -> list[str]:
    """The planted variants of ``ex``: hand-written files and edits of the solution."""
    names = set()
    for rel in ex.files:
        p = Path(rel)
        names.update(_substitutions(rel))
        folder = PLANTED / p.parent
        if folder.is_dir():
            for f in folder.glob(f"{p.stem}.*{p.suffix}"):
                names.add(f.name[len(p.stem) + 1:-len(p.suffix)])
    return sorted(names)


def resolve(ex: Exercise, variant: str = "learner", planted: str | None = None) -> dict[str, Path]:
    """The file under test for each of ``ex.files``."""
    if variant == "learner":
        return {rel: ROOT / rel for rel in ex.files}
    if variant == "solution":
        return {rel: SOLUTIONS / rel for rel in ex.files}
    if variant == "planted":
        if planted is None:
            raise ValueError("a planted variant needs a name")
        out = {rel: planted_path(rel, planted) for rel in ex.files}
        if not any(p.exists() for p in out.values()):
            raise KeyError(f"{ex.id} has no planted solution {planted!r}; it has: "
                           f"{', '.join(planted_names(ex)) or 'none'}")
        return {rel: p if p.exists() else SOLUTIONS / rel for rel, p in out.items()}
    raise ValueError(f"variant must be one of {VARIANTS}")


def device() -> str:
    """Where kernels run: the GPU when torch sees one, else the CPU (Triton through its interpreter)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def prepare() -> None:
    """Before any Triton kernel is defined: the interpreter on a machine without a GPU, with the bounds checks
    of tests/interpreter_guard.py (an out-of-bounds load fails the check instead of reading garbage)."""
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") and os.environ.get("INTERPRETER_BOUNDS") != "0":
        guard = REPO_ROOT / "tests" / "interpreter_guard.py"
        if guard.is_file():
            spec = importlib.util.spec_from_file_location("interpreter_guard", guard)
            mod = sys.modules.setdefault("interpreter_guard", importlib.util.module_from_spec(spec))
            if not hasattr(mod, "install"):
                spec.loader.exec_module(mod)
            mod.install()


_LOADED = 0


def load_module(path: Path):
    """Import the Python file at ``path`` as a fresh module (a learner's edit is always seen)."""
    global _LOADED
    _LOADED += 1
    name = f"exercise_{path.stem}_{_LOADED}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # Triton's JIT looks its functions' module up
    try:
        spec.loader.exec_module(mod)
    except SyntaxError as exc:
        raise Failure(f"{rel(path)} does not parse: {exc.msg} (line {exc.lineno})",
                      hint="fix the syntax error first") from exc
    except Exception as exc:  # noqa: BLE001
        raise Failure(f"{rel(path)} fails on import: {type(exc).__name__}: {exc}") from exc
    return mod


def rel(path: Path) -> str:
    try:
        return path.resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return str(path)


def explain(exc: BaseException, files=()) -> str:
    """What an exception raised by the learner's code means, in one or two lines, with the line of ``files``
    (the files under test) where it happened when the traceback passes through one of them."""
    if isinstance(exc, NotImplementedError):
        return f"not written yet: {exc or 'NotImplementedError'}"
    text = f"{type(exc).__name__}: {exc}"
    chain = [exc]
    while chain[-1].__cause__ is not None or chain[-1].__context__ is not None:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
        if len(chain) > 8:
            break
    full = " | ".join(f"{type(e).__name__}: {e}" for e in chain)
    # the deepest frame in a file under test, in any exception of the chain (the interpreter re-raises)
    names = {str(Path(f).resolve()) for f in files}
    frames = [f for e in chain for f in traceback.extract_tb(e.__traceback__)
              if str(Path(f.filename).resolve()) in names]
    where = f" (at {rel(Path(frames[-1].filename))}, line {frames[-1].lineno})" if frames else ""
    if "out-of-bounds" in full:
        m = re.search(r"out-of-bounds (load|store|atomic) of [^;]*;[^)]*\)", full)
        what = m.group(0).strip() if m else "out-of-bounds access"
        what = re.sub(r"the first 0 elements past the end of (\w+)", r"the first right after the end of \1", what)
        return (f"the kernel made an {what}. A lane past the end of the data was not masked off "
                f"(check the mask of every tl.load and tl.store){where}")
    last = text.strip().splitlines()
    short = last[0] if len(last) < 3 else " ".join(s.strip() for s in last[-3:])
    return f"{short[:600]}{where}"


class Run:
    """What a check sees: the files of the variant under test, where kernels run, and the report so far."""

    def __init__(self, ex: Exercise, variant: str = "learner", planted: str | None = None,
                 files: dict[str, Path] | None = None):
        self.ex = ex
        self.variant = variant
        self.planted = planted
        self.files = files or resolve(ex, variant, planted)
        self.device = device()
        self.lines: list[tuple[str, str]] = []
        self.kernel_runs = 0  # CUDA: the runs of the kernel (CPU emulator or GPU) that took place
        self._modules: dict[str, object] = {}
        self._case: list[str] = []

    # ------------------------------------------------------------------ files
    def path(self, rel_path: str | None = None) -> Path:
        rel_path = rel_path or self.ex.files[0]
        return self.files[rel_path]

    def module(self, rel_path: str | None = None):
        """The Python file ``rel_path`` (default: the exercise's first file) of the variant under test."""
        rel_path = rel_path or next(f for f in self.ex.files if f.endswith(".py"))
        if rel_path not in self._modules:
            self._modules[rel_path] = load_module(self.path(rel_path))
        return self._modules[rel_path]

    def solution(self, rel_path: str | None = None):
        """The solution's module: the answers that model exercises are compared with."""
        rel_path = rel_path or next(f for f in self.ex.files if f.endswith(".py"))
        key = f"solution:{rel_path}"
        if key not in self._modules:
            self._modules[key] = load_module(SOLUTIONS / rel_path)
        return self._modules[key]

    @property
    def on_gpu(self) -> bool:
        return self.device == "cuda"

    # ------------------------------------------------------------------ report
    def ok(self, text: str) -> None:
        self.lines.append(("ok", text))

    def skip(self, text: str) -> None:
        if ("skipped", text) not in self.lines:  # said once, however many cases it concerns
            self.lines.append(("skipped", text))

    def note(self, text: str) -> None:
        self.lines.append(("note", text))

    @contextlib.contextmanager
    def case(self, name: str, hint: str | None = None) -> Iterator[None]:
        """One case of the check: reported as ok when it passes; a failure inside it names it. ``hint``
        replaces the exercise's hint for failures of this case (unless the failure carries its own)."""
        self._case.append(name)
        try:
            yield
        except Skip as exc:
            self.skip(str(exc))  # what could not run here, said once (it says what was skipped)
        except Failure as exc:
            raise Failure(f"{name}: {exc.message}" if not exc.message.startswith(name) else exc.message,
                          exc.hint or hint) from exc
        except Exception as exc:  # noqa: BLE001 (the learner's code raised)
            raise Failure(f"{name}: {explain(exc, self.files.values())}", hint) from exc
        else:
            self.ok(name)
        finally:
            self._case.pop()


@dataclasses.dataclass
class Result:
    ex: Exercise
    variant: str
    planted: str | None
    files: dict[str, Path]
    passed: bool
    lines: list[tuple[str, str]]
    failure: str | None = None
    hint: str | None = None
    incomplete: str | None = None  # passed what could run, but the essential part could not run here

    @property
    def message(self) -> str:
        return self.report()

    def report(self) -> str:
        ex = self.ex
        out = [f"{ex.id}: {ex.title}",
               wrap("  chapter: ", f"docs/{ex.chapter} (exercise {ex.number}); difficulty {ex.difficulty} "
                                    f"({DIFFICULTY[ex.difficulty]}); kind {ex.kind}")]
        what = {"learner": "your file", "solution": "the solution",
                "planted": f"planted solution {self.planted!r}"}
        out.append(wrap("  checking ", f"{what[self.variant]}: " + ", ".join(rel(p) for p in self.files.values())))
        for status, text in self.lines:
            out.append(wrap(f"  {status:8s}", text))
        if not self.passed:
            out.append(wrap("  FAILED  ", self.failure or ""))
            if self.hint:
                out.append(wrap("  hint:   ", self.hint))
            untouched = [rel(p) for p in self.files.values() if p.exists() and p.suffix in (".py", ".cu")
                         and MARK in p.read_text()]
            if self.variant == "learner" and untouched:
                verb = "contains" if len(untouched) == 1 else "contain"
                out.append(wrap("  note:   ", f"{', '.join(untouched)} still {verb} '{MARK}': the exercise is "
                                              f"not done yet (python -m snippets exercise show {ex.id})"))
        if ex.gpu:
            out.append(wrap("  GPU only: ", ex.gpu))
        skipped = sum(status == "skipped" for status, _ in self.lines)
        if not self.passed:
            out.append("  result: FAILED")
        elif self.incomplete:
            out.append(wrap("  result: ", f"NOT CHECKED: {self.incomplete}"))
        else:
            out.append("  result: " + (f"passed ({skipped} part(s) skipped here: see above)" if skipped
                                       else "passed"))
        return "\n".join(out)


def wrap(prefix: str, text: str, width: int = 100) -> str:
    """``text`` after ``prefix``, wrapped at ``width`` columns with its continuation lines aligned (a line of
    its own, such as a compiler's error, keeps its line break)."""
    import textwrap

    pad = " " * len(prefix)
    # never break inside the marker or a command (they are copied and searched for)
    keep = re.compile(rf"{MARK}|python -m snippets [\w-]+(?: [\w.-]+)*")
    text = keep.sub(lambda m: m.group(0).replace(" ", "\0"), text)
    lines = []
    for para in text.splitlines() or [""]:
        lines += textwrap.wrap(para.strip(), width - len(pad), break_long_words=False,
                               break_on_hyphens=False) or [""]
    return prefix + ("\n" + pad).join(lines).replace("\0", " ")


def check(ex: Exercise, variant: str = "learner", planted: str | None = None,
          files: dict[str, Path] | None = None) -> Result:
    """Run ``ex``'s check on a variant of its files and return what happened (never raises for a wrong
    answer: that is a failed :class:`Result`)."""
    prepare()
    files = files or resolve(ex, variant, planted)
    missing = [rel(p) for p in files.values() if not p.exists()]
    run = Run(ex, variant, planted, files)
    if missing:
        return Result(ex, variant, planted, files, False, run.lines, f"missing file: {', '.join(missing)}",
                      "the exercise's files live under exercises/ (git checkout them to start again)")
    if ex.kind == "triton":
        run.note("device: " + (f"GPU ({_gpu_name()})" if run.on_gpu else "CPU, through Triton's interpreter"))
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)  # the interpreter's numpy overflows: reported as inf
            ex.check(run)
    except Failure as exc:
        return Result(ex, variant, planted, files, False, run.lines, exc.message, exc.hint or ex.hint)
    except Skip as exc:
        run.skip(str(exc))
    except Exception as exc:  # noqa: BLE001 (the learner's code raised outside a case)
        return Result(ex, variant, planted, files, False, run.lines, explain(exc, files.values()), ex.hint)
    incomplete = None
    if ex.kind == "cuda" and run.kernel_runs == 0:
        incomplete = ("the kernel ran nowhere: the CPU emulator needs g++ and the GPU run a CUDA GPU with "
                      "CuPy (only the compile check, if any, was done)")
    return Result(ex, variant, planted, files, True, run.lines, incomplete=incomplete)


def _gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name(0)
