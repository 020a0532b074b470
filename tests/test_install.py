"""README's install for use (issue 37.1): `pip install` of this repository (not editable, no extras) into a fresh
venv gives a working `c128patch`: its help, and `matrix --json` on the committed results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from c128patch.evidence.results import RESULTS_UNDER
from c128patch.fit.contract_cxx import PROBE
from support import RELEASES, REPO_ROOT

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


def test_the_wheel_carries_every_series_file_the_tool_reads():
    """Installed, the tool reads its series from c128patch/_series: what is not packaged there is missing (the C++
    contract's probe was: `watch` from a pip install said unchecked, 'no ci/kernel_probe/upstream_signatures.cu in
    the series', on a machine with nvcc)."""
    wheel = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]
    packaged = {src: dest for src, dest in wheel["force-include"].items() if dest == f"c128patch/_series/{src}"}
    for read in ("patches", "csrc", "overlay", "tests/gpu", PROBE, RESULTS_UNDER):
        assert any(Path(read).is_relative_to(src) for src in packaged), read
        assert (REPO_ROOT / read).exists(), read


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
    assert (Path(where.strip()).parent / "_series" / PROBE).is_file()
