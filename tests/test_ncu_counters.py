"""scripts/ncu_counters.py names what each Nsight Compute capture profiles: every group's launches
name an op and a version that exist, a kernel regex that compiles, and target names that are unique
(capture_ncu_counters.sh runs one ncu per target)."""

from __future__ import annotations

import importlib.util
import re
import sys

from snippets.registry import REPO_ROOT, get_op


def _module():
    spec = importlib.util.spec_from_file_location("ncu_counters",
                                                  REPO_ROOT / "scripts" / "ncu_counters.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["ncu_counters"] = mod           # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


def test_every_profiled_launch_names_a_real_version():
    mod = _module()
    mod.get_op("transpose")                      # loads every op
    names = [mod._target(g, c) for g, (_, cs) in mod.GROUPS.items() for c in cs]
    assert len(names) == len(set(names))
    for group, (question, counted) in mod.GROUPS.items():
        assert question.endswith("?") and counted, group
        for c in counted:
            op = get_op(c.op)
            assert c.version in op.impls, (group, c)
            re.compile(c.kernel)
            size = mod._size(c)
            assert set(size) <= set(op.headline) | {k for s in op.sweep for k in s}, (group, c)


def test_every_group_has_a_declared_producer():
    """The capture script records each group's table with snippets.bench.captures, which refuses a
    capture without a declared producer: undeclared, a group's table is measured on the GPU and
    then lost at its record step (as happened twice)."""
    from snippets.bench import captures

    mod = _module()
    for group in mod.GROUPS:
        prod = captures.producer(f"ncu_counters_{group}")
        assert prod is not None, group
        assert set(prod.scripts) == {"scripts/capture_ncu_counters.sh", "scripts/ncu_counters.py"}


def test_the_tensor_pipe_row_takes_the_largest_matching_metric():
    """The tensor pipe's use is found by name among what the sections collected: the largest of
    the metrics that match (gmma and hmma pipes alike), never another pipe's."""
    mod = _module()
    gmma = "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"
    hmma = "sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active"
    alu = "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active"
    metrics = {gmma: (71.5, "%"), hmma: (3.0, "%"), alu: (90.0, "%")}
    (label, pattern, fmt), = mod.PATTERN_ROWS
    assert mod._matching(metrics, pattern) == sorted([gmma, hmma])
    assert mod._pattern_cell(metrics, pattern, fmt) == "71.5"
    assert mod._pattern_cell({alu: (90.0, "%")}, pattern, fmt) == "-"
