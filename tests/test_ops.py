"""Every implementation of every registered op against its float64 reference, at every test size and dtype.

On a CPU machine this runs the implementations that can run there (Triton under the interpreter, NumPy, torch
on the CPU); on a GPU every implementation runs. The parameters come from the registry, so a new op or version is
tested as soon as it is registered.
"""

from __future__ import annotations

import pytest
import torch
from helpers import assert_matches_reference

from conftest import HAS_GPU, skip_unavailable
from snippets.op_index import load_all
from snippets.registry import size_key

CASES = []
for op in load_all().values():
    for name, impl in op.impls.items():
        for dtype in op.dtypes:
            if not impl.supports(dtype):
                continue
            for size in op.test_sizes:
                cpu_ok = impl.runs_on("cpu")
                marks = [] if cpu_ok else [pytest.mark.gpu]
                ident = f"{op.name}-{name}-{str(dtype)[6:]}-{size_key(size)}"
                CASES.append(pytest.param(op, impl, dtype, size, id=ident, marks=marks))


@pytest.mark.parametrize("op, impl, dtype, size", CASES)
def test_matches_reference(op, impl, dtype, size):
    reason = impl.unavailable()
    if reason:
        skip_unavailable(f"{op.name} {impl.name}: {reason}")  # REQUIRE_GPU=1: a failure, unless it is the GPU
    run_on = "cuda" if HAS_GPU and impl.runs_on("cuda") else "cpu"
    gen = torch.Generator().manual_seed(1234)
    args = op.make_inputs(size, dtype, impl.input_device(run_on), gen)
    assert_matches_reference(op, impl, args, dtype, size)


def test_every_op_has_cases():
    covered = {p.values[0].name for p in CASES}
    assert covered == set(load_all()), f"ops without test cases: {set(load_all()) - covered}"
