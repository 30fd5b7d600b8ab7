"""Helpers shared by the test modules: running an implementation against the float64 reference."""

from __future__ import annotations

import torch

from conftest import poison_allocator
from snippets.registry import Impl, Op


def assert_matches_reference(op: Op, impl: Impl, args: tuple, dtype: torch.dtype) -> torch.Tensor:
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    nbytes = max(t.numel() * t.element_size() for t in tensors)
    poison_allocator(nbytes, str(tensors[0].device.type))
    out = impl.fn(*args)
    ref = op.reference_fp64(args).to(torch.float64)  # integer references (checksums, indices) compare exactly
    rtol, atol = op.tolerance(dtype)
    assert out.dtype == dtype, f"{op.name} {impl.name}: output dtype {out.dtype}, expected {dtype}"
    assert not out.isnan().any() or ref.isnan().any(), f"{op.name} {impl.name}: unwritten (NaN) outputs"
    torch.testing.assert_close(out.double().cpu(), ref.cpu(), rtol=rtol, atol=atol,
                               msg=lambda m: f"{op.name} {impl.name} {dtype}: {m}")
    return out
