"""Test configuration: Triton's interpreter without a GPU, the ``gpu`` marker, and shared helpers.

- No CUDA GPU: ``TRITON_INTERPRET=1`` is set before anything imports Triton, so Triton kernels run on the CPU.
- ``@pytest.mark.gpu`` tests skip with a reason on CPU machines; with ``REQUIRE_GPU=1`` (the GPU runner) a
  missing GPU fails them instead, so a broken runner cannot pass by skipping everything.
"""

from __future__ import annotations

import os

import torch

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

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
    """The site built once per test session with ``mkdocs build --strict`` (the site tests, the asset tests and
    the browser tests all read it)."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install -e '.[docs]')")
    out = tmp_path_factory.mktemp("site")
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or "mkdocs"
    root = Path(__file__).resolve().parent.parent
    r = subprocess.run([mkdocs, "build", "--strict", "-d", str(out)], cwd=root, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, f"mkdocs build --strict failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return out
