"""The contract: every op has a reference, a test, a benchmark entry and a chapter; every include resolves."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import yaml

from snippets import contract
from snippets.op_index import load_all
from snippets.registry import REPO_ROOT, Impl, Op

OPS = load_all()
MARKDOWN = sorted([*(REPO_ROOT / "docs").glob("**/*.md"), REPO_ROOT / "README.md", REPO_ROOT / "CONTRIBUTING.md"])
SOURCES = sorted([*(REPO_ROOT / "snippets").glob("**/*.py"), *(REPO_ROOT / "csrc").glob("**/*.cu*")])


@pytest.mark.parametrize("name", sorted(OPS))
def test_op_keeps_the_contract(name):
    assert contract.problems(OPS[name]) == []


@pytest.mark.parametrize("md", MARKDOWN, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_includes_resolve(md):
    assert contract.broken_includes(md) == []


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_regions_balanced(src):
    assert contract.unbalanced_regions(src) == []


def test_chapters_are_in_the_nav():
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)
    Loader.add_constructor("!ENV", lambda loader, node: None)
    nav = yaml.load((REPO_ROOT / "mkdocs.yml").read_text(), Loader=Loader)["nav"]
    pages = set()

    def walk(node):
        if isinstance(node, str):
            pages.add(node)
        elif isinstance(node, list):
            for n in node:
                walk(n)
        elif isinstance(node, dict):
            for v in node.values():
                walk(v)

    walk(nav)
    missing = {op.chapter for op in OPS.values()} - pages
    assert not missing, f"chapters not in mkdocs.yml nav: {missing}"


# ---------------------------------------------------------------- the contract can fail

def _bare_op(**changes) -> Op:
    base = OPS["vector_add"]
    op = dataclasses.replace(base, impls=dict(base.impls), **changes)
    return op


def test_contract_catches_a_missing_test(tmp_path):
    (tmp_path / "test_x.py").write_text("import pytest\n@pytest.mark.op('scale')\ndef test_a(): assert True\n")
    found = contract.problems(_bare_op(), tests_dir=tmp_path)
    assert any("no test" in p for p in found), found


def test_contract_catches_a_missing_chapter():
    found = contract.problems(_bare_op(chapter="part1/no-such-chapter.md"))
    assert any("does not exist" in p for p in found), found


def test_contract_catches_a_chapter_without_the_op(tmp_path):
    (tmp_path / "part1").mkdir()
    (tmp_path / "part1" / "elementwise.md").write_text("# Nothing here\n")
    found = contract.problems(_bare_op(), docs_dir=tmp_path)
    assert any("includes none" in p for p in found) and any("bench:table" in p for p in found), found


def test_contract_catches_a_missing_benchmark_and_reference():
    op = _bare_op(headline={}, sweep=[], reference=None)
    found = contract.problems(op)
    assert any("no headline" in p for p in found) and any("no benchmark sweep" in p for p in found)
    assert any("no reference" in p for p in found)


def test_contract_catches_a_missing_baseline():
    op = _bare_op()
    op.impls = {k: v for k, v in op.impls.items() if k != "v0"}
    assert any("no library baseline" in p for p in contract.problems(op))


def test_contract_catches_a_vanished_region(tmp_path):
    (tmp_path / "src.py").write_text("# --8<-- [start:kept]\nx = 1\n# --8<-- [end:kept]\n")
    md = tmp_path / "page.md"
    md.write_text('```python\n--8<-- "src.py:kept"\n--8<-- "src.py:gone"\n--8<-- "nofile.py:a"\n```\n')
    found = contract.broken_includes(md, root=tmp_path)
    assert len(found) == 2 and "no region 'gone'" in found[0] and "no such file" in found[1]


def test_contract_catches_a_bad_cost_model():
    op = _bare_op(bytes_moved=lambda s, d: 0)
    assert any("bytes > 0" in p for p in contract.problems(op))


def test_impl_rejects_unknown_language():
    with pytest.raises(ValueError, match="lang"):
        Impl("v9", torch.add, "Fortran", "no")
