"""Helpers shared by the test modules: running an implementation against the float64 reference."""

from __future__ import annotations

import torch

from conftest import poison_allocator
from snippets.bench.harness import as_tuple
from snippets.registry import Impl, Op


def assert_matches_reference(op: Op, impl: Impl, args: tuple, dtype: torch.dtype):
    """Run ``impl`` on ``args`` and compare with the float64 reference; an op whose reference returns a tuple
    (a backward pass) is compared part by part. Returns the output."""
    # The reference first: some versions (Liger) write their results over their inputs. float64 copies.
    refs = as_tuple(op.reference_fp64(args)) if op.check is None else ()
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    nbytes = max(t.numel() * t.element_size() for t in tensors)
    poison_allocator(nbytes, str(tensors[0].device.type))
    out = impl.fn(*args)
    if op.check is not None:  # a random output (dropout): the op's own check of what is a valid output
        op.check(out, args, dtype)
        return out
    outs = as_tuple(out)
    assert len(outs) == len(refs), f"{op.name} {impl.name}: {len(outs)} outputs, reference has {len(refs)}"
    rtol, atol = op.tolerance(dtype)
    for i, (o, ref) in enumerate(zip(outs, refs)):
        ref = ref.to(torch.float64)  # integer references (checksums, indices) compare exactly
        part = f" output {i}" if len(refs) > 1 else ""
        want = op.output_dtype(dtype)
        assert o.dtype == want, f"{op.name} {impl.name}{part}: output dtype {o.dtype}, expected {want}"
        assert not o.isnan().any() or ref.isnan().any(), f"{op.name} {impl.name}{part}: unwritten (NaN) outputs"
        torch.testing.assert_close(o.double().cpu(), ref.cpu(), rtol=rtol, atol=atol,
                                   msg=lambda m: f"{op.name} {impl.name} {dtype}{part}: {m}")
    return out
