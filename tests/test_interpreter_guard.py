"""The interpreter's bounds checks (tests/interpreter_guard.py, installed by the root conftest.py): a kernel
with a planted off-by-one row mask (``rows <= M``) or a wild pointer fails its own test with a message that
names the kernel and the tensor, the memory next to the tensor is left alone, and the tests after it still
run. On a GPU there is no interpreter to guard: the module skips."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import triton
import triton.language as tl

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") in ("", "0"),
                                reason="the bounds checks guard Triton's CPU interpreter only")
DEMO = os.environ.get("GUARD_DEMO") == "1"  # the two tests a child pytest runs (test_a_crash_fails_one_test)


@triton.jit
def _copy_rows(x_ptr, y_ptr, M, N, far, PLANT_LOAD: tl.constexpr, PLANT_STORE: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    good = (rows < M)[:, None] & (cols < N)[None, :]
    planted = (rows <= M)[:, None] & (cols < N)[None, :]  # the off-by-one: row M does not exist
    offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
    if PLANT_LOAD:
        x = tl.load(x_ptr + offs + far, mask=planted, other=0.0)
    else:
        x = tl.load(x_ptr + offs, mask=good, other=0.0)
    if PLANT_STORE:
        tl.store(y_ptr + offs, x, mask=planted)
    else:
        tl.store(y_ptr + offs, x, mask=good)


def _copy(x, plant_load=False, plant_store=False, far=0, y=None):
    m, n = x.shape
    y = torch.empty_like(x) if y is None else y
    _copy_rows[(triton.cdiv(m, 8),)](x, y, m, n, far, PLANT_LOAD=plant_load, PLANT_STORE=plant_store,
                                     BLOCK_M=8, BLOCK_N=8)
    return y


def test_in_bounds_kernel_runs():
    x = torch.randn(5, 8)
    assert torch.equal(_copy(x), x)


def test_planted_row_mask_fails_its_test():
    """5 rows in an 8-row tile: the mask ``rows <= M`` lets row 5 through, 8 elements past the end of x."""
    with pytest.raises(Exception, match=r"_copy_rows: out-of-bounds load of 8 of 48 active lanes") as info:
        _copy(torch.randn(5, 8), plant_load=True)
    assert "past the end of x_ptr" in str(info.value)


def test_planted_store_fails_before_writing():
    """The store is checked before it writes anything: one program covers the 5 rows, and y is as it was."""
    x, y = torch.randn(5, 8), torch.zeros(5, 8)
    with pytest.raises(Exception, match="out-of-bounds store of 8 of 48 active lanes"):
        _copy(x, plant_store=True, y=y)
    assert torch.equal(y, torch.zeros(5, 8))


def test_a_view_may_reach_the_rest_of_its_storage():
    """The check is per storage: a view's kernel may read the rest of its base tensor (a known limit of
    the guard; the poisoned outputs and the references catch what it lets through)."""
    base = torch.randn(6, 8)
    _copy(base[:5], plant_load=True)


def test_wild_pointer_fails_instead_of_crashing():
    """2^60 elements away: without the checks this read segfaults the interpreter."""
    with pytest.raises(Exception, match="out-of-bounds load"):
        _copy(torch.randn(5, 8), plant_load=True, far=2**60)


@pytest.mark.skipif(not DEMO, reason="run by test_a_crash_fails_one_test in a child pytest")
def test_demo_wild_read():
    _copy(torch.randn(5, 8), plant_load=True, far=2**60)


@pytest.mark.skipif(not DEMO, reason="run by test_a_crash_fails_one_test in a child pytest")
def test_demo_after():
    x = torch.randn(5, 8)
    assert torch.equal(_copy(x), x)


def _child(bounds: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "GUARD_DEMO": "1", "INTERPRETER_BOUNDS": bounds}
    return subprocess.run([sys.executable, "-m", "pytest", "-o", "addopts=", "-p", "no:cacheprovider", "-q",
                           __file__, "-k", "demo"], env=env, capture_output=True, text=True, timeout=300,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), check=False)


def test_a_crash_fails_one_test():
    """In a child pytest: with the checks, the wild read fails one test and the next one passes; without
    them the same read kills the whole run (a signal, no summary)."""
    guarded = _child("1")
    assert "1 failed, 1 passed" in guarded.stdout, guarded.stdout[-3000:] + guarded.stderr[-3000:]
    assert "out-of-bounds load" in guarded.stdout
    unguarded = _child("0")
    assert unguarded.returncode < 0 and "passed" not in unguarded.stdout, \
        f"rc {unguarded.returncode}: {unguarded.stdout[-2000:]}"
