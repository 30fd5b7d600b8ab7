"""The timing-pitfalls demonstration: the wrong numbers must come out wrong in the expected direction."""

from __future__ import annotations

import pytest
import torch

from snippets.part3 import measuring


def test_refuses_without_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        measuring.timing_pitfalls()


def test_format_rows():
    rows = [dict(method="a", what="add", ms=0.5, rate=10.0, unit="GB/s")]
    text = measuring.format_rows(rows)
    assert "500.0 us" in text and "10.0 GB/s" in text


@pytest.mark.gpu
def test_pitfalls_show_what_they_claim():
    rows = {r["method"]: r for r in measuring.timing_pitfalls(n_large=2**28, n_small=2**20, m=4096)}
    no_sync = rows["host clock, no synchronize"]["ms"]
    synced = rows["host clock, synchronized, one call"]["ms"]
    assert no_sync < synced / 3, "without a synchronize the host clock should see only the launch"
    warm = rows["CUDA events, same small input (warm L2)"]["ms"]
    cold = rows["CUDA events, inputs rotated past L2"]["ms"]
    assert warm < cold, "the same 12 MB input every call should be served from L2"
    assert rows["CUDA events, matmul on zeros"]["ms"] > 0 and rows["CUDA events, matmul on random"]["ms"] > 0
