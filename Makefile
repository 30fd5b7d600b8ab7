# Kernels, Measured: the two commands a reader needs, and a few for contributors.
#
#   make serve   build and serve the site at http://127.0.0.1:8000 (no GPU needed)
#   make test    the whole suite: CPU (Triton interpreter, nvcc compile checks, docs fences, notebooks,
#                strict site build) and, with a CUDA GPU present, the GPU tests too
#
# Both create .venv on first use. PYTHON picks the interpreter (3.10+); TORCH holds the pip arguments that
# install torch when the venv has none, e.g. on a machine without a GPU, a CPU build keeps the download small:
#   make test TORCH="torch --index-url https://download.pytorch.org/whl/cpu"
# CONSTRAINTS names the pip constraints file: by default the versions CI tests (constraints.txt); empty
# (make test CONSTRAINTS=) installs the newest of everything within pyproject.toml's ranges.

PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch
CONSTRAINTS ?= constraints.txt
PIN     = $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
# JOBS: pytest-xdist workers for `make test` (default: one per core; a file's tests stay on one worker, and
# files go out in collection order, so the browser audit, the longest file, starts first instead of last);
# JOBS=0 runs the suite in this process, as a bare `pytest` does.
JOBS   ?= auto
JOBS_ARGS = $(if $(filter 0,$(JOBS)),,-n $(JOBS) --dist loadfile --no-loadscope-reorder)
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed

.PHONY: serve test build bench report gpu-test clean

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH) $(PIN)
	$(PY) -m pip install -q -e ".[docs,test]" $(PIN)
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/mkdocs serve -a 127.0.0.1:8000

build: $(STAMP)
	$(VENV)/bin/mkdocs build --strict

test: $(STAMP)
	$(VENV)/bin/ruff check .   # the linter first: seconds, and its findings are bugs more often than style
	$(PY) -m pytest $(JOBS_ARGS)   # pyproject.toml says what: tests/, the docs' code blocks, README.md, CONTRIBUTING.md

# On a CUDA machine: fail (instead of skip) when the GPU is missing, then run the sanitizer pass.
gpu-test: $(STAMP)
	REQUIRE_GPU=1 $(PY) -m pytest tests
	$(PY) scripts/sanitize.py

bench: $(STAMP)
	$(PY) -m snippets bench $(OPS)

report: $(STAMP)
	$(PY) -m snippets report

clean:
	rm -rf site build .pytest_cache
