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
from support import REPO_ROOT, invoke

DOC = (REPO_ROOT / "docs" / "deploy.md").read_text()


def doc_command(prefix: str) -> list[str]:
    """The first command of the doc that starts with ``prefix`` (after the venv's bin/), as argv."""
    match = re.search(r"^/opt/sglang/bin/(" + re.escape(prefix) + r"[^\n]*)$", DOC, re.M)
    assert match, prefix
    return match.group(1).split()


@pytest.fixture(scope="module")
def wheels_doc_example(tmp_path_factory: pytest.TempPathFactory, sglang_release_repo: Path):
    """docs/wheels.md's example as written (its first line run in a fresh folder): (the doc, its console block, the
    run, the folder). Its wheel is the series' 0.5.23 wheel for this interpreter, the one the venv installs: built
    once for both."""
    doc = (REPO_ROOT / "docs" / "wheels.md").read_text()
    block = doc.split("```console\n", 1)[1].split("\n```", 1)[0].splitlines()
    assert block[0] == "$ c128patch wheel --from-release 0.5.23 -o dist"
    folder = tmp_path_factory.mktemp("wheels-doc")
    return doc, block, run_doc_line(block[0].removeprefix("$ "), folder), folder


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory, wheels_doc_example) -> dict:
    """A venv with upstream sglang 0.5.23, and the patched wheel of it (docs/wheels.md's example's)."""
    root = tmp_path_factory.mktemp("deploy")
    folder = wheels_doc_example[3]
    (wheel,) = (folder / "dist").glob("sglang-0.5.23+c128.*.whl")
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


# -- step 1 and the README's install line, as written (real release wheels, downloaded once) ----


def block_after(text: str, heading: str) -> list[str]:
    """The lines of the first ```bash block after ``heading``."""
    return text.split(heading, 1)[1].split("```bash\n", 1)[1].split("\n```", 1)[0].splitlines()


def shell_words(line: str, cwd: Path) -> list[str]:
    """``line`` as bash reads it in ``cwd`` (globs and $(...) expanded); a glob matching nothing stays."""
    out = subprocess.run(["bash", "-c", f'printf "%s\\n" {line}'], cwd=cwd, capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def run_doc_line(line: str, cwd: Path):
    argv = shell_words(line.split("#", 1)[0], cwd)
    assert argv[0] == "c128patch", line
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(cwd)
        res = invoke(*argv[1:], as_json=False)
    if res.code == 2 and "no wheel for" not in res.err and "pip" in res.err.lower():
        pytest.skip(f"the package index is out of reach: {res.err.strip()}")
    assert res.code == 0, f"{line}\n{res.err}"
    return res


def test_step_1_and_the_readme_install_line_each_match_one_wheel(tmp_path: Path, sglang_release_repo: Path):
    step1 = [line for line in block_after(DOC, "## 1. Build the wheel") if line.startswith("c128patch ")]
    assert [line.split()[1] for line in step1] == ["wheel", "wheel", "verify-wheel"]
    for line in step1:
        if line.startswith("c128patch verify-wheel "):
            assert len(shell_words(line, tmp_path)) == 3 and "*" not in line.split("*", 1)[0]  # one wheel named
        run_doc_line(line, tmp_path)
    platforms = {p.name: [w.name for w in p.glob("*.whl")] for p in (tmp_path / "dist").iterdir()}
    assert {k: len(v) for k, v in platforms.items()} == {"x86_64": 1, "aarch64": 1}
    assert platforms["aarch64"][0].endswith("-cp312-cp312-manylinux_2_34_aarch64.whl")
    step2 = next(line for line in block_after(DOC, "## 2. Install it") if line.startswith("WHEEL=$(ls "))
    found = subprocess.run(["bash", "-c", step2 + ' && printf "%s\\n" "$WHEEL"'], cwd=tmp_path, capture_output=True,
                           text=True, check=True).stdout.split()
    assert found == [f"dist/x86_64/{platforms['x86_64'][0]}"]

    # the README's lines, in the same folder: its wheel beside step 1's, its glob still matches one
    readme = (REPO_ROOT / "README.md").read_text()
    lines = block_after(readme, "To serve, build the patched **wheel**")
    run_doc_line(next(line for line in lines if line.startswith("c128patch wheel ")), tmp_path)
    install = next(line for line in lines if line.startswith("/opt/sglang/bin/pip install --no-deps "))
    words = shell_words(install.split("#", 1)[0], tmp_path)
    assert words[:3] == ["/opt/sglang/bin/pip", "install", "--no-deps"] and len(words) == 4, words
    assert Path(tmp_path / words[3]).is_file() and Path(words[3]).parent == Path("dist")


def test_the_wheels_doc_example_shows_the_real_label(wheels_doc_example):
    doc, block, res, folder = wheels_doc_example  # its first line run as written (the fixture)
    printed = next(line for line in res.text.splitlines() if not line.startswith(" "))  # after the entries
    assert block[1] == printed and (folder / printed).is_file()
    version = printed.split("/")[1].split("-")[1]
    assert set(re.findall(r"0\.5\.23(?:\+|%2B)c128\.[0-9a-z.]+?(?=-|`)", doc)) == {version,
                                                                                  version.replace("+", "%2B")}


def test_the_readme_gives_the_size_of_the_release_wheels_it_downloads(sglang_release_repo: Path):
    from c128patch.upstream.releases import DEFAULT_RELEASES

    total = sum(wheel_for(v).stat().st_size for v in DEFAULT_RELEASES)
    readme = " ".join((REPO_ROOT / "README.md").read_text().split())
    assert f"release wheels, ~{round(total / 1e7) * 10} MB from the package index" in readme, total
