"""README's install for use (issue 37.1): `pip install` of this repository (not editable, no extras) into a fresh
venv gives a working `c128patch`: its help, and `matrix --json` on the committed results."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from support import RELEASES, REPO_ROOT


@pytest.mark.heavy  # a fresh venv and the tool's dependencies: a minute or more on a busy machine
def test_pip_install_of_the_repository_gives_a_working_c128patch(tmp_path):
    assert "pip install ./c128patch" in (REPO_ROOT / "README.md").read_text()  # the line this test runs
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("C128PATCH_SERIES", "PYTHONPATH", "VIRTUAL_ENV"))}
    done = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(REPO_ROOT)], env=env, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    tool = str(venv / "bin" / "c128patch")
    helped = subprocess.run([tool, "--help"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert helped.returncode == 0 and "apply" in helped.stdout and "matrix" in helped.stdout, helped.stderr
    shown = subprocess.run([tool, "matrix", "--json"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    assert report["ok"] and [r["rev"] for r in report["releases"]] == list(RELEASES), report
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import c128patch; print(c128patch.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True).stdout
    assert str(venv) in where and str(REPO_ROOT) not in where, where  # installed, not this checkout
