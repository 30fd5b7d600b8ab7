"""README's measured table is generated from the committed results and must match them."""

import subprocess
import sys

from snippets.registry import REPO_ROOT


def test_readme_table_is_current():
    r = subprocess.run([sys.executable, "scripts/readme_table.py", "--check"], cwd=REPO_ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_readme_has_the_two_commands():
    text = (REPO_ROOT / "README.md").read_text()
    assert "make serve" in text and "make test" in text and "python -m snippets bench" in text
