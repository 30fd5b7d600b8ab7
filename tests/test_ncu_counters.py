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
