"""The GitHub workflows hold the least privilege they need: no job but a publishing one can write, the release
measures the tagged commit (not whatever main is), installs the pinned versions, and every action is pinned by
its commit unless the line says that its commit was not verified. Parsed with PyYAML where it is installed (it
comes with mkdocs), else read as text."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = sorted((REPO_ROOT / ".github" / "workflows").glob("*.yml"))
UNVERIFIED = "tag: commit not verified"
# Commits checked against the actions' release tags; a pin to any other commit of these is a mistake.
VERIFIED = {"actions/checkout": ("11bd71901bbe5b1630ceea73d27597364c9af683", "v4.2.2"),
            "actions/setup-python": ("a26af69be951a213d495a4c3e4e4022e16d87065", "v5.6.0")}
USES = re.compile(r"^\s*(?:-\s*)?uses:\s*([^\s@#]+)@(\S+)(.*)$")
TAGGED_COMMIT = ("${{ github.sha }}", "${{ github.ref }}")
REF = re.compile(r"^\s+ref:\s*(.+?)\s*(?:#.*)?$|[{,]\s*ref:\s*([^,}#]+?)\s*[,}]")  # block or flow style


def _load(path: Path) -> dict:
    """The workflow as a mapping: PyYAML if installed, else a small reader of the subset these files use
    (``permissions`` at the top and per job, and each job's checkout ``ref``)."""
    try:
        import yaml
    except ImportError:
        return _read_text(path.read_text())
    data = yaml.safe_load(path.read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as true
    return data


def _read_text(text: str) -> dict:
    """Top-level ``permissions`` and, per job, ``permissions`` and the ``with: ref`` of each checkout step, found by
    indentation (the fallback without PyYAML)."""
    lines = text.splitlines()

    def block(start: int, indent: int) -> dict:
        out = {}
        for line in lines[start:]:
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            ind = len(line) - len(line.lstrip())
            if ind < indent:
                break
            if ind == indent and ":" in line:
                k, v = line.strip().split(":", 1)
                out[k.strip()] = v.split("#")[0].strip()
        return out

    data: dict = {"jobs": {}}
    for i, line in enumerate(lines):
        if line.startswith("permissions:"):
            rest = line.split(":", 1)[1].strip()
            data["permissions"] = rest or block(i + 1, 2)
        if line == "jobs:":
            for j in range(i + 1, len(lines)):
                m = re.match(r"^  ([\w-]+):\s*$", lines[j])
                if m:
                    job = {"steps": []}
                    for k in range(j + 1, len(lines)):
                        if re.match(r"^  \S", lines[k]):
                            break
                        if lines[k].startswith("    permissions:"):
                            rest = lines[k].split(":", 1)[1].strip()
                            job["permissions"] = rest or block(k + 1, 6)
                        u = USES.match(lines[k])
                        if u:  # its `with: ref:` on the next lines, block or flow style ({ ref: main })
                            found = [REF.search(x) for x in lines[k + 1:k + 4]]
                            ref = next(((f[1] or f[2]).strip("'\"") for f in found if f), None)
                            job["steps"].append({"uses": f"{u[1]}@{u[2]}", "with": {"ref": ref} if ref else {}})
                    data["jobs"][m[1]] = job
    return data


def _writes(perms) -> list[str]:
    if perms in ("write-all",):
        return ["write-all"]
    if isinstance(perms, dict):
        return [k for k, v in perms.items() if str(v).strip() == "write"]
    return []


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_only_publishing_jobs_can_write(path):
    wf = _load(path)
    assert "permissions" in wf, f"{path.name}: no top-level permissions (the token's default may be write-all)"
    assert not _writes(wf["permissions"]), f"{path.name}: top-level permissions write {_writes(wf['permissions'])}"
    for name, job in wf["jobs"].items():
        writes = _writes(job.get("permissions"))
        if writes:
            assert name.startswith("publish"), f"{path.name}: job {name} can write {writes}"


def test_release_measures_the_tag_read_only_and_publishes_apart():
    wf = _load(REPO_ROOT / ".github" / "workflows" / "release.yml")
    jobs = wf["jobs"]
    checkouts = [(name, s) for name, job in jobs.items() for s in job.get("steps", [])
                 if str(s.get("uses", "")).startswith("actions/checkout@")]
    assert checkouts
    for name, step in checkouts:
        assert (step.get("with") or {}).get("ref") in TAGGED_COMMIT, f"release: {name} checks out {step.get('with')}"
    assert _writes(jobs["bench"].get("permissions")) == [], "the GPU job runs the tag's code: read only"
    assert _writes(jobs["publish"]["permissions"]) == ["contents"]
    assert sorted(_writes(jobs["publish-pages"]["permissions"])) == ["id-token", "pages"]
    text = (REPO_ROOT / ".github" / "workflows" / "release.yml").read_text()
    assert "upload-artifact" in text and "download-artifact" in text, "results go from bench to publish"
    assert "ref: main" not in text and "{ ref: main }" not in text


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_actions_are_pinned_by_commit(path):
    for n, line in enumerate(path.read_text().splitlines(), 1):
        m = USES.match(line)
        if not m or m[1].startswith("./"):
            continue
        action, ref, rest = m[1], m[2], m[3]
        where = f"{path.name}:{n}: {action}@{ref}"
        if re.fullmatch(r"[0-9a-f]{40}", ref):
            if action in VERIFIED:
                sha, tag = VERIFIED[action]
                assert ref == sha and tag in rest, f"{where}: not the verified commit of {tag}"
        else:
            assert UNVERIFIED in rest, f"{where}: pin it by commit, or say '# {UNVERIFIED}'"


@pytest.mark.parametrize("name", ["release.yml", "gpu.yml"])
def test_gpu_jobs_install_the_pinned_versions_and_liger(name):
    text = (REPO_ROOT / ".github" / "workflows" / name).read_text()
    installs = [line for line in text.splitlines() if "pip install" in line]
    assert installs
    for line in installs:
        assert "-c constraints.txt" in line, f"{name}: {line.strip()}"
    assert any("liger-kernel" in line for line in installs), f"{name}: Liger-Kernel's comparisons must run"
    assert re.search(r"^liger-kernel==", (REPO_ROOT / "constraints.txt").read_text(), re.M)


def test_the_text_reader_agrees_with_yaml():
    yaml = pytest.importorskip("yaml")
    del yaml
    for path in WORKFLOWS:
        parsed, read = _load(path), _read_text(path.read_text())
        assert _writes(parsed["permissions"]) == _writes(read["permissions"])
        for name, job in parsed["jobs"].items():
            assert sorted(_writes(job.get("permissions"))) == sorted(_writes(read["jobs"][name].get("permissions")))
            refs = [(s.get("with") or {}).get("ref") for s in job.get("steps", []) if "uses" in s]
            assert refs == [(s.get("with") or {}).get("ref") for s in read["jobs"][name]["steps"]], path.name
