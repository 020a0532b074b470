"""A new user's first commands: every usage error is one line (and a JSON error object under --json),
and `smoke --list` on a Python without torch says so in one line instead of listing nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from c128patch.smoke.kernel import UNSEALED
from smoke_helpers import make_tree, one_line_error
from support import REPO_ROOT, invoke

USAGE_ERRORS = [
    (["check", "--deep=yes"], "Option '--deep' does not take a value", "c128patch check --help"),
    (["capacity", "--preset", "nope"], "Invalid value for '--preset': 'nope' is not one of",
     "c128patch capacity --help"),
    (["apply", "--no-such-flag"], "No such option '--no-such-flag'", "c128patch apply --help"),
    (["no-such-command"], "No such command 'no-such-command'", "c128patch --help"),
]


@pytest.mark.parametrize("args, message, see", USAGE_ERRORS, ids=[a[0] for a, _, _ in USAGE_ERRORS])
def test_a_usage_error_is_one_line(args, message, see):
    res = invoke(*args, as_json=False)
    assert res.code == 2 and res.text == ""
    (line,) = res.err.splitlines()
    assert line.startswith(f"c128patch: error: {message}") and line.endswith(f"(see `{see}`)"), line


@pytest.mark.parametrize("args, message, see", USAGE_ERRORS, ids=[a[0] for a, _, _ in USAGE_ERRORS])
def test_a_usage_error_under_json_is_a_json_error_object(args, message, see):
    res = invoke(*args, "--json", as_json=False)
    assert res.code == 2
    assert res.out["ok"] is False and res.out["error"].startswith(message) and res.out["usage_error"] is True
    assert len(res.err.splitlines()) == 1


def test_a_usage_error_is_one_line_from_the_installed_command_too():
    """As a user runs it (a process, not click's test runner): one line, the JSON object, exit 2."""
    proc = subprocess.run([sys.executable, "-m", "c128patch", "check", "--deep=yes", "--json"], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT / "tooling")})
    assert proc.returncode == 2
    assert json.loads(proc.stdout)["error"].startswith("Option '--deep' does not take a value")
    assert proc.stderr.splitlines() == [f"c128patch: error: {json.loads(proc.stdout)['error']}"]


def test_json_after_the_launch_arguments_separator_is_not_the_tools():
    res = invoke("capacity", "--preset", "nope", "--", "--json", as_json=False)
    assert res.code == 2 and res.text == "" and res.err.startswith("c128patch: error: ")


@pytest.fixture
def no_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Child Pythons (the suite's) without torch, whether or not this machine has it."""
    blocker = tmp_path / "no-torch"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text("import sys\nsys.modules['torch'] = None  # as if not installed\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(blocker), os.environ.get("PYTHONPATH")) if p))


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_smoke_list_without_torch_fails_in_one_line(no_torch, tmp_path: Path, as_json: bool):
    tree = make_tree(tmp_path / "t")
    res = invoke("smoke", "kernel", "--list", "--tree", tree, "--out", tmp_path / "out", as_json=as_json)
    if as_json:
        assert res.code == 2 and res.out["ok"] is False and "torch does not import" in res.out["error"]
        assert len([x for x in res.err.splitlines() if x != UNSEALED]) == 1, res.err  # (the notice: --json too)
    else:
        one_line_error(res, f"--list collected no test of {REPO_ROOT / 'tests' / 'gpu'}")
        assert "torch does not import in " in res.err and "the suite's files skip without it" in res.err
