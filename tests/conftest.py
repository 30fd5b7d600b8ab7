"""Test configuration: Triton's interpreter without a GPU, the ``gpu`` marker, and shared helpers.

- No CUDA GPU: the root ``conftest.py`` sets ``TRITON_INTERPRET=1`` before anything imports Triton, so Triton
  kernels run on the CPU (for the docs' code blocks too).
- ``@pytest.mark.gpu`` tests skip with a reason on CPU machines; with ``REQUIRE_GPU=1`` (the GPU runner) a
  missing GPU fails them instead, so a broken runner cannot pass by skipping everything.
- A version that cannot run here (``Impl.requires``) is skipped through :func:`skip_unavailable`: with
  ``REQUIRE_GPU=1`` its reason fails the test instead, unless the reason is the GPU itself (a compute
  capability it lacks), so a library baseline missing on the runner (Liger-Kernel) cannot pass by skipping.
- ``KM_SPLIT_PART=k/n`` runs the k-th of n shares of the collected tests (scripts/gpu_tests.sh splits the
  longest files into several processes with it): the tests of one version of an op (or of one test function)
  stay together.
"""

from __future__ import annotations

import os
import re

import pytest
import torch

HAS_GPU = torch.cuda.is_available()  # without one, the root conftest.py has switched the interpreter on

if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):  # pytest-xdist: the cores shared out, not each worker on all
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

REQUIRE_GPU = os.environ.get("REQUIRE_GPU", "0") not in ("", "0")
DEVICE = "cuda" if HAS_GPU else "cpu"


def pytest_report_header(config):
    interp = os.environ.get("TRITON_INTERPRET", "0")
    gpu = torch.cuda.get_device_name(0) if HAS_GPU else "none"
    return f"GPU: {gpu}; TRITON_INTERPRET={interp}; REQUIRE_GPU={int(REQUIRE_GPU)}"


def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu") and not HAS_GPU:
        if REQUIRE_GPU:
            pytest.fail("REQUIRE_GPU=1 but torch sees no CUDA GPU")
        pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)")


# A reason that is the GPU itself, which no install on the runner can change (needs_hopper, needs_fp8).
HARDWARE_REASON = re.compile(r"compute capability", re.IGNORECASE)


def skip_unavailable(reason: str) -> None:
    """Skip a version that cannot run here (``impl.unavailable()``), giving its reason. With ``REQUIRE_GPU=1`` the
    test fails instead, unless the reason is the GPU's compute capability: on the GPU runner a missing package
    (Liger-Kernel), a missing GPU or a backend that refuses is a broken runner, not a pass."""
    if REQUIRE_GPU and not HARDWARE_REASON.search(reason):
        pytest.fail(f"REQUIRE_GPU=1, and this version cannot run: {reason}")
    pytest.skip(reason)


def _split_group(item) -> str:
    """The tests that stay in one process when a file is split: the cases of one version of an op (its
    compiled kernels, autotuning and torch.compile graphs are reused between them), else a test function's
    cases with the same first parameter."""
    spec = getattr(item, "callspec", None)
    name = getattr(item, "originalname", item.name)
    if spec is None:
        return name
    op = spec.params.get("op")
    if getattr(op, "name", None):
        impl = getattr(spec.params.get("impl"), "name", None)
        return f"op {op.name} {impl}" if impl else f"op {op.name}"
    return f"{name}[{spec.id.split('-')[0]}]"


def pytest_collection_modifyitems(config, items):
    split = os.environ.get("KM_SPLIT_PART")
    if not split:
        return
    m = re.fullmatch(r"(\d+)/(\d+)", split)
    if not m or not 1 <= int(m[1]) <= int(m[2]):
        raise pytest.UsageError(f"KM_SPLIT_PART must be k/n with 1 <= k <= n, got {split!r}")
    part, parts = int(m[1]) - 1, int(m[2])
    groups: dict[str, list] = {}
    for item in items:
        groups.setdefault(_split_group(item), []).append(item)
    # the largest groups first, each to the share with the fewest tests so far: shares of about equal size
    load, owner = [0] * parts, {}
    for key, group in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        k = min(range(parts), key=lambda i: (load[i], i))
        owner[key] = k
        load[k] += len(group)
    keep = [it for it in items if owner[_split_group(it)] == part]
    config.hook.pytest_deselected(items=[it for it in items if owner[_split_group(it)] != part])
    items[:] = keep


@pytest.fixture
def device() -> str:
    """Where Triton kernels run in this session: the GPU, or the CPU under the interpreter."""
    return DEVICE


def poison_allocator(nbytes: int, device: str) -> None:
    """Fill soon-to-be-reused memory with NaN, so an output element a kernel forgets to write is NaN, not a
    leftover that happens to look right. torch's CUDA caching allocator (and the CPU allocator, usually) hands
    the block just freed to the next allocation of that size."""
    t = torch.full((max(1, nbytes // 4),), float("nan"), device=device)
    del t


@pytest.fixture(scope="session")
def site_dir(tmp_path_factory):
    """The site built once per test run with ``mkdocs build --strict`` (the site tests, the asset tests and
    the browser tests all read it). Under pytest-xdist (``make test`` runs ``-n``), the first worker that needs
    it builds it into the run's shared temporary folder while the others wait on a file lock."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from filelock import FileLock

    pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install -e '.[docs]')")
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if worker else base  # xdist: each worker's basetemp is a folder of the run's
    out, done = shared / "site", shared / "site.built"
    with FileLock(str(shared / "site.lock")):
        if not done.exists():
            mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or "mkdocs"
            root = Path(__file__).resolve().parent.parent
            r = subprocess.run([mkdocs, "build", "--strict", "-d", str(out)], cwd=root, capture_output=True,
                               text=True, timeout=900)
            assert r.returncode == 0, f"mkdocs build --strict failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
            done.touch()
    return out
