"""The code base passes ruff with the project's configuration (pyproject.toml, [tool.ruff]).

ruff comes with the dev extras; without it the test skips, except under CI (CI=true), where a missing linter is a
failure rather than a silently skipped check.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.helpers import dev_tool

REPO = Path(__file__).resolve().parent.parent
CHECKED = ["harness", "methods", "suites", "tests"]


def test_ruff_is_clean():
    """An unused import, an undefined name, a line over 120 characters or an unsorted import block anywhere in
    the project's Python code (the rules selected in pyproject.toml) fails here, with ruff's own report."""
    done = subprocess.run([dev_tool("ruff"), "check", "--no-cache", *CHECKED], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_reports_a_planted_error(tmp_path):
    """The check above could pass for a wrong reason (ruff not reading the project's configuration, or checking
    nothing); a file with an undefined name, checked with the same configuration, must fail."""
    bad = tmp_path / "planted.py"
    bad.write_text("def f():\n    return undefined_name\n")
    done = subprocess.run([dev_tool("ruff"), "check", "--no-cache", "--config", str(REPO / "pyproject.toml"), str(bad)],
                          capture_output=True, text=True)
    assert done.returncode == 1 and "F821" in done.stdout, done.stdout + done.stderr
