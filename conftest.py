"""Root test configuration, for everything pytest collects (tests/, the docs' code blocks, README.md):
without a CUDA GPU, Triton's interpreter runs the kernels on the CPU, and it must be switched on before
anything imports Triton. Under the interpreter every load, store and atomic is bounds-checked
(tests/interpreter_guard.py), so that a kernel's out-of-bounds access fails its test instead of
crashing the run (INTERPRETER_BOUNDS=0 turns the checks off); a Triton and NumPy pair whose interpreter
cannot run the kernels stops the run at once, saying which. tests/conftest.py holds the rest."""

import importlib.util
import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") and os.environ.get("INTERPRETER_BOUNDS") != "0":
    _spec = importlib.util.spec_from_file_location(
        "interpreter_guard", Path(__file__).resolve().parent / "tests" / "interpreter_guard.py")
    _guard = sys.modules.setdefault("interpreter_guard", importlib.util.module_from_spec(_spec))
    if not hasattr(_guard, "install"):
        _spec.loader.exec_module(_guard)
    _guard.install()
    if _guard.version_problem():  # say so once, instead of a TypeError in every kernel test
        import pytest

        pytest.exit(_guard.version_problem(), returncode=4)
