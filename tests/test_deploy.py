"""docs/deploy.md as written: replace an installed upstream sglang 0.5.23 with the patched wheel, confirm
with doctor, see that a plain `pip install sglang==0.5.23` does not roll back, roll back with the doc's
command. Real wheels in a fresh venv (pip's own, no dependencies: the cache's wheels stand in for the
index). The startup line the doc quotes is the one the series' overlay logs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from c128patch.upstream.releases import wheel_for
from c128patch.wheel.patch import patch_wheel
from support import REPO_ROOT, invoke

DOC = (REPO_ROOT / "docs" / "deploy.md").read_text()


def doc_command(prefix: str) -> list[str]:
    """The first command of the doc that starts with ``prefix`` (after the venv's bin/), as argv."""
    match = re.search(r"^/opt/sglang/bin/(" + re.escape(prefix) + r"[^\n]*)$", DOC, re.M)
    assert match, prefix
    return match.group(1).split()


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory, real_series, sglang_release_repo: Path) -> dict:
    """A venv with upstream sglang 0.5.23, and the patched wheel of it."""
    root = tmp_path_factory.mktemp("deploy")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("SOURCE_DATE_EPOCH", raising=False)
        wheel = Path(patch_wheel(real_series, wheel_for("0.5.23"), root / "dist").wheel)
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True)
    python = root / "venv" / "bin" / "python"
    pip = [str(python), "-m", "pip", "--disable-pip-version-check", "--no-input"]
    offline = ["--no-index", "--find-links", str(wheel_for("0.5.23").parent), "--no-compile"]
    subprocess.run([*pip, "install", "-q", "--no-deps", *offline, "sglang==0.5.23"], check=True)
    return {"python": python, "pip": pip, "offline": offline, "wheel": wheel}


def pip(venv: dict, argv: list[str]) -> subprocess.CompletedProcess:
    """A `pip ...` command of the doc, run offline in the venv."""
    assert argv[0] == "pip"
    extra = venv["offline"] if argv[1] == "install" else []
    return subprocess.run([*venv["pip"], *argv[1:], *extra], capture_output=True, text=True)


def build_line(venv: dict) -> tuple[str, str]:
    res = invoke("doctor", "--python", str(venv["python"]))
    (finding,) = [f for f in res.out["findings"] if f["topic"] == "build"]
    return finding["level"], finding["message"]


def test_the_docs_install_replace_confirm_and_roll_back_work_as_written(venv):
    replace = [a if a != '"$WHEEL"' else str(venv["wheel"]) for a in doc_command("pip install --no-deps ")]
    res = pip(venv, replace)
    assert res.returncode == 0 and "Successfully uninstalled sglang-0.5.23" in res.stdout, res.stderr
    level, message = build_line(venv)
    assert level == "ok" and message.startswith("c128patch build: series c128patch ")

    plain = pip(venv, ["pip", "install", "--no-deps", "sglang==0.5.23"])
    assert "Requirement already satisfied: sglang==0.5.23" in plain.stdout  # why the doc forces it
    assert build_line(venv)[0] == "ok"

    res = pip(venv, doc_command("pip install --force-reinstall "))
    assert res.returncode == 0, res.stderr
    assert build_line(venv) == ("warn", "plain sglang 0.5.23: not a c128patch build (no "
                                        "sglang/c128patch_provenance.json); the series' gates do nothing here")


def test_the_startup_line_the_doc_quotes_is_the_one_the_overlay_logs():
    quoted = DOC.split("<!-- startup-line -->\n```\n", 1)[1].split("\n```", 1)[0]
    source = (REPO_ROOT / "overlay/sglang/srt/layers/attention/dsv4/online_c128_dspark.py").read_text()
    match = re.search(r'logger\.warning\(\s*"([^"]*)"\s*"([^"]*)",', source)
    assert match, "the overlay's startup warning"
    assert quoted == (match.group(1) + match.group(2)).replace("%d", "N")
