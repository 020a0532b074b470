"""c128patch build: a real PEP 517 source build of a small upstream-shaped checkout (a git repo made here
from real upstream files plus a setuptools-scm pyproject like upstream's), the version it gets, the
refusals. sglang itself cannot be source-built here (no upstream checkout, no Rust sources)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version

from c128patch.git import Git
from c128patch.series.layers import stack
from c128patch.series.manifest import load_series
from c128patch.upstream.source import open_upstream
from c128patch.wheel.srcbuild import NOTICE, PRETEND_ENV, base_version, build_command, build_env, build_wheel
from c128patch.wheel.tools import InWheel
from support import REPO_ROOT, invoke, make_test_series, series_paths

CUH = "python/sglang/kernels/jit/csrc/deepseek_v4/c128_online_v2.cuh"
ENVIRON = "python/sglang/srt/environ.py"
EDIT = {CUH: ("    const uint32_t prefix_len = seq_len - extend_len;\n",
              "    const uint32_t prefix_len = seq_len - extend_len;  // c128patch build test\n")}
# Shaped like upstream's python/pyproject.toml: setuptools-scm versions it from the repo root
# (root = ".."), writes sglang/_version.py and would fall back to 0.0.0.dev0.
PYPROJECT = """\
[build-system]
requires = ["setuptools>=64", "setuptools-scm>=8"]
build-backend = "setuptools.build_meta"

[project]
name = "sglang"
dynamic = ["version"]
requires-python = ">=3.10"

[tool.setuptools.packages.find]
include = ["sglang*"]

[tool.setuptools.package-data]
"sglang" = ["**/*.cuh", "**/*.json"]

[tool.setuptools_scm]
root = ".."
version_file = "sglang/_version.py"
fallback_version = "0.0.0.dev0"
"""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t.invalid", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def source_repo(tmp_path: Path, sglang_release_repo: Path) -> Path:
    """A source checkout: real upstream files of v0.5.23, a pyproject, tag v0.5.23, one commit after."""
    repo = tmp_path / "sglang-src"
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    releases = Git(git_dir=sglang_release_repo)
    for path in (ENVIRON, CUH):
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_bytes(releases.blob("v0.5.23", path))
    (repo / "python/sglang/__init__.py").write_text("")
    (repo / "python/pyproject.toml").write_text(PYPROJECT)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "upstream at 0.5.23")
    git(repo, "tag", "v0.5.23")
    (repo / "python/sglang/__init__.py").write_text("# an unreleased change\n")
    git(repo, "commit", "-qam", "after the release")
    return repo


@pytest.fixture
def series(tmp_path: Path, sglang_release_repo: Path) -> Path:
    return make_test_series(tmp_path / "series", sglang_release_repo, EDIT)


def test_base_version(source_repo: Path):
    g = Git(worktree=source_repo)
    head, tagged = g.rev_parse("HEAD"), g.rev_parse("v0.5.23")
    assert base_version(g, "v0.5.23", tagged) == Version("0.5.23")
    assert base_version(g, "main", tagged) == Version("0.5.23")  # exactly on the tag
    v = base_version(g, "main", head)
    assert v == Version(f"0.5.24.dev1+g{head[:9]}")  # setuptools-scm's guess-next-dev form
    assert base_version(g, "main", head, "0.6.0rc1") == Version("0.6.0rc1")
    git(source_repo, "tag", "-d", "v0.5.23")
    with pytest.raises(Exception, match="--base-version"):
        base_version(g, "main", head)


def test_command_and_env(tmp_path: Path):
    cmd = build_command(tmp_path / "python", tmp_path / "out")
    assert cmd[:4] == [sys.executable, "-m", "build", "--wheel"] and cmd[-1] == str(tmp_path / "python")
    assert "--no-isolation" not in cmd and "--no-isolation" in build_command(tmp_path, tmp_path, True)
    assert build_env(Version("0.5.23"), 1700000000) == {PRETEND_ENV: "0.5.23", "SOURCE_DATE_EPOCH": "1700000000"}
    assert PRETEND_ENV == "SETUPTOOLS_SCM_PRETEND_VERSION_FOR_SGLANG"


def test_refused_without_pyproject(tmp_path: Path, series: Path):
    """The release history (upstream from wheels) has no build files: refused before anything is made."""
    tree, out = tmp_path / "tree", tmp_path / "dist"
    res = invoke("build", "--sglang-rev", "v0.5.23", "--series", str(series), "--tree", str(tree), "-o", str(out),
                 as_json=False)
    assert res.code == 2, res.err
    (line,) = res.err.strip().splitlines()
    assert line.startswith("c128patch: error: python/pyproject.toml is missing at v0.5.23")
    assert "c128patch wheel --from-release 0.5.23" in line
    assert not tree.exists() and not out.exists()


def test_failed_build_is_reported(tmp_path: Path, source_repo: Path, series: Path):
    def failing(cmd, env, cwd, log):
        log.write_text("compiling...\nerror: linker `cc` not found\n")
        return 101

    out = tmp_path / "dist"
    with pytest.raises(Exception, match=r"the source build failed \(exit 101\): error: linker `cc` not found") as info:
        build_wheel(load_series(series), open_upstream(str(source_repo), ["main"]), "main", None, out, runner=failing)
    assert "full log:" in info.value.hint and not out.exists()


def test_a_failed_builds_log_outlives_the_next_run(tmp_path: Path, source_repo: Path, series: Path, monkeypatch):
    """The hint "full log: PATH" named a file inside the build's scratch folder (named by this run's pid): the next
    run of any c128patch command swept it as a dead run's, so the log the hint names was gone once the operator
    looked (helper 176). The log is kept outside any scratch folder; a later run's sweep leaves it. The sweep below
    sees every process as dead: it runs in a temporary folder of this test's own (on the shared one it removed a
    live watch's folder of another worker: CI on a1958e4, test_copies)."""
    own = tmp_path / "tmpdir"
    own.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(own))

    def failing(cmd, env, cwd, log):
        log.write_text("compiling...\nerror: linker `cc` not found\n")
        return 101

    with pytest.raises(Exception, match="the source build failed") as info:
        build_wheel(load_series(series), open_upstream(str(source_repo), ["main"]), "main", None, tmp_path / "dist",
                    runner=failing)
    log = Path(re.search(r"full log: (\S+)", info.value.hint)[1])
    assert log.read_text().endswith("error: linker `cc` not found\n")
    import c128patch.procs as procs

    def gone(pid, sig):  # this run has ended, as seen by the next one
        raise ProcessLookupError(pid)
    monkeypatch.setattr(procs.os, "kill", gone)
    monkeypatch.setattr(procs.os, "getpid", lambda: 1)
    monkeypatch.setattr(procs, "_SWEPT", set())
    assert log.parent == own
    procs.sweep_stale(own, "c128patch-build-")
    assert log.read_text().endswith("error: linker `cc` not found\n")
    log.unlink()


def test_ignored_version_is_refused(tmp_path: Path, source_repo: Path, series: Path):
    """A build that falls back to setuptools-scm's 0.0.0.dev0 (the pretend variable ignored) is refused."""
    def fallback(cmd, env, cwd, log):
        outdir = Path(cmd[cmd.index("--outdir") + 1])
        outdir.mkdir(parents=True)
        with zipfile.ZipFile(outdir / "sglang-0.0.0.dev0-py3-none-any.whl", "w") as zf:
            zf.writestr("sglang/__init__.py", "")
        return 0

    with pytest.raises(Exception, match=f"not sglang 0.5.24.dev1.*{PRETEND_ENV} was not honoured"):
        build_wheel(load_series(series), open_upstream(str(source_repo), ["main"]), "main", None, tmp_path / "d",
                    runner=fallback)


@pytest.mark.skipif(importlib.util.find_spec("setuptools_scm") is None,
                    reason="setuptools-scm not installed (test extra)")
def test_real_source_build(tmp_path: Path, source_repo: Path, series: Path):
    out = tmp_path / "dist"
    args = ["build", "--sglang-rev", "main", "--repo", str(source_repo), "--series", str(series),
            "-o", str(out), "--no-isolation", "--json"]
    res = invoke(*args)
    assert res.code == 0, (res.err, res.text)
    data = res.out
    head = git(source_repo, "rev-parse", "main")
    s = load_series(series)
    assert data["base_version"] == f"0.5.24.dev1+g{head[:9]}"
    assert data["version"] == f"0.5.24.dev1+g{head[:9]}.c128.{s.version}.{s.digest()[:8]}"
    assert data["env"][PRETEND_ENV] == data["base_version"] and data["applied"] is True
    assert data["runs_target_code"] == NOTICE and f"build {NOTICE}" in res.err.splitlines()  # the backend: the box's
    wheel = Path(data["wheel"])
    assert wheel.parent == out and sorted(p.name for p in out.iterdir()) == [wheel.name]
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        version_py = zf.read("sglang/_version.py").decode()
        cuh = zf.read(CUH.removeprefix("python/")).decode()
        record = json.loads(zf.read("sglang/c128patch_provenance.json"))
    assert "c128patch build test" in cuh and "sglang/c128_test_overlay.py" in names
    assert data["base_version"] in version_py  # setuptools-scm wrote the version we set
    assert record["upstream"]["build"] == "source" and record["upstream"]["commit"] == head
    assert any(n.endswith(".dist-info/sboms/c128patch.cdx.json") for n in names)
    # the built wheel passes verify-wheel; the source tree is left clean on the patched branch
    # (a source build has no upstream wheel to compare with: authenticity is refused, never passed silently)
    unknown = invoke("verify-wheel", str(wheel), "--series", str(series))
    assert unknown.code == 2 and "cannot check authenticity" in unknown.err, unknown.err
    verified = invoke("verify-wheel", str(wheel), "--series", str(series), "--compile-all", "--no-authenticity")
    assert verified.code == 0, verified.err
    assert verified.out["authenticity"] is None
    assert verified.out["compiled"] == len([n for n in names if n.endswith(".py")])
    assert git(source_repo, "status", "--porcelain") == ""
    assert git(source_repo, "rev-parse", "--abbrev-ref", "HEAD") == "c128/main"
    # a second build reuses the patched tree (no second apply) and gives the same wheel name
    again = invoke(*args[:-4], "-o", str(tmp_path / "again"), "--no-isolation")
    assert again.code == 0, again.err
    assert again.out["applied"] is False
    assert Path(again.out["wheel"]).name == wheel.name


ACME = REPO_ROOT / "docs" / "examples" / "acme-layer"


@pytest.fixture
def stack_source_repo(tmp_path: Path, sglang_release_repo: Path) -> Path:
    """A source checkout at tag v0.5.23 holding the real upstream files our series and the example
    layer write (series_paths of the stack, as released), with a pyproject like upstream's."""
    repo = tmp_path / "sglang-stack-src"
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    releases = Git(git_dir=sglang_release_repo)
    have = set(releases.out("ls-tree", "-r", "--name-only", "v0.5.23").splitlines())
    paths = [p for p in series_paths(stack(load_series(REPO_ROOT), [ACME])) if p in have]
    for path in [*paths, "python/sglang/__init__.py"]:
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_bytes(releases.blob("v0.5.23", path))
    (repo / "python/pyproject.toml").write_text(PYPROJECT)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "upstream at 0.5.23")
    git(repo, "tag", "v0.5.23")
    return repo


@pytest.mark.skipif(importlib.util.find_spec("setuptools_scm") is None,
                    reason="setuptools-scm not installed (test extra)")
def test_build_with_a_layer_labels_the_wheel_and_its_provenance_with_the_layer(tmp_path: Path, stack_source_repo: Path):
    """`build --layer docs/examples/acme-layer` on 0.5.23: our series and the layer's three entries
    applied, the wheel labelled with both, the provenance listing the layer, verify-wheel passing."""
    out = tmp_path / "dist"
    res = invoke("build", "--sglang-rev", "v0.5.23", "--repo", str(stack_source_repo), "--layer", str(ACME),
                 "-o", str(out), "--no-isolation")
    assert res.code == 0, (res.err, res.text)
    ours, layer = load_series(REPO_ROOT), stack(load_series(REPO_ROOT), [ACME]).layers[0]
    assert res.out["version"] == f"0.5.23+c128.{ours.version}.{ours.digest()[:8]}.acme.{layer.digest()[:8]}"
    assert res.out["applied"] is True
    with InWheel(Path(res.out["wheel"])) as iw:
        record = json.loads(iw.read("sglang/c128patch_provenance.json"))
        environ = iw.read("sglang/srt/environ.py").decode()
        floor = iw.read("sglang/srt/speculative/dspark_components/acme_sps_floor.py").decode()
    assert record["upstream"]["build"] == "source"
    assert record["layers"] == [{"name": "acme", "version": layer.version, "base": "v0.5.23", "digest": layer.digest(),
                                 "entries": ["acme/acme-sps-env", "acme/acme-sps-floor-helper", "acme/acme-sps-floor"]}]
    assert [e["name"] for e in record["entries"]][-3:] == record["layers"][0]["entries"]
    assert "SGLANG_ACME_SPS_FLOOR = EnvBool(False)" in environ and "def floored(" in floor  # the layer's files
    verified = invoke("verify-wheel", res.out["wheel"], "--layer", str(ACME), "--no-authenticity")
    assert verified.code == 0, verified.err
    present = {e["name"] for e in verified.out["entries"] if e["status"] == "present"}
    assert set(record["layers"][0]["entries"]) <= present
    # the patched tree is this stack: a second build with the layer reuses it; without the layer it is refused
    again = invoke("build", "--sglang-rev", "v0.5.23", "--repo", str(stack_source_repo), "--layer", str(ACME),
                   "-o", str(tmp_path / "again"), "--no-isolation")
    assert again.code == 0 and again.out["applied"] is False, again.err
    assert Path(again.out["wheel"]).name == Path(res.out["wheel"]).name
    alone = invoke("build", "--sglang-rev", "v0.5.23", "--repo", str(stack_source_repo), "-o", str(tmp_path / "alone"),
                   "--no-isolation", as_json=False)
    assert alone.code == 2, alone.err
    assert f"is patched with series c128patch {ours.version} + layer acme {layer.version} on " in alone.err
    assert f"not series c128patch {ours.version} on " in alone.err
    assert not (tmp_path / "alone").exists()


# A hostile upstream build backend (attack h107/04): it says what it sees, then tries to write outside its folder.
HOSTILE_BACKEND = """\
import json, os, sys
seen = {k: v for k, v in os.environ.items() if "TOKEN" in k or "SECRET" in k}
home = os.environ.get("HOME", "")
try:
    operators = sorted(os.listdir(OPERATOR_HOME))
except OSError as exc:
    operators = str(exc)
wrote = []
for path in (MARKER, os.path.join(OPERATOR_HOME, "c128-pwned")):
    try:
        with open(path, "w") as f:
            f.write("pwned")
        wrote.append(path)
    except OSError:
        pass
print("SEEN " + json.dumps({"tokens": seen, "home": home, "operators_home": operators, "wrote": wrote}),
      file=sys.stderr, flush=True)
def get_requires_for_build_wheel(config_settings=None):
    return []
def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    raise SystemExit("stop")
"""


@pytest.mark.parametrize("isolation", [False, True], ids=["no-isolation", "isolation"])
def test_the_upstream_build_backend_runs_in_the_sealed_box_and_build_says_so(tmp_path: Path, source_repo: Path,
                                                                              series: Path, isolation: bool):
    """`build` runs the target tree's PEP 517 backend (its code) in fit/sandbox.py's box: no token of the operator's,
    HOME a scratch folder, the operator's HOME unseen, nothing written outside its build folder; and it says so on
    stderr, with --json too."""
    marker, home = tmp_path / "PWNED", tmp_path / "operator-home"
    home.mkdir()
    (home / ".git-credentials").write_text("https://u:secret@example.invalid\n")
    (source_repo / "python/pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "evilbackend"\nbackend-path = ["."]\n')
    (source_repo / "python/evilbackend.py").write_text(
        f"MARKER, OPERATOR_HOME = {str(marker)!r}, {str(home)!r}\n" + HOSTILE_BACKEND)
    git(source_repo, "add", "-A")
    git(source_repo, "commit", "-qm", "upstream: its own build backend")
    out = tmp_path / "dist"
    res = invoke("build", "--sglang-rev", "main", "--repo", str(source_repo), "--series", str(series), "-o", str(out),
                 *([] if isolation else ["--no-isolation"]),
                 env={"GITHUB_TOKEN": "ghp_FAKE", "AWS_SECRET_ACCESS_KEY": "FAKE_AWS", "HF_TOKEN": "hf_FAKE",
                      "HOME": str(home)})
    assert res.code != 0 and "the source build failed" in res.err, res.err
    log = Path(re.search(r"full log: (\S+)", res.err)[1])
    seen = json.loads(next(ln for ln in log.read_text().splitlines() if ln.startswith("SEEN "))[5:])
    assert seen["tokens"] == {}, seen  # no token of the operator's
    assert seen["home"] and not Path(seen["home"]).is_relative_to(home), seen  # HOME a scratch folder
    assert ".git-credentials" not in str(seen["operators_home"]), seen  # the operator's HOME unseen
    assert seen["wrote"] == [] and not marker.exists() and not (home / "c128-pwned").exists(), seen
    assert not out.exists()
    assert f"build {NOTICE}" in res.err.splitlines()  # said with --json too


LINKING_BACKEND = """\
import os
log = os.path.join(os.getcwd(), "..", "..", "build.log")  # the build folder's log, which the box may write
os.unlink(log)
os.symlink(VICTIM, log)
def get_requires_for_build_wheel(config_settings=None):
    return []
def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    raise SystemExit(3)
"""


@pytest.mark.parametrize("victim", ["secret", "/dev/zero"])
def test_a_build_that_replaces_its_log_with_a_link_has_the_tool_read_nothing_through_it(tmp_path: Path,
                                                                                         source_repo: Path,
                                                                                         series: Path, victim: str):
    """The box writes its build folder, the log too: a backend that leaves a link there, to a file of the operator's it
    cannot read itself (a token) or to /dev/zero, has the failed build say that the log is not read, never the
    file's last line (the token printed in build's error) nor an endless read."""
    secret = tmp_path / "operator-home" / ".git-credentials"
    secret.parent.mkdir()
    secret.write_text("https://u:ghp_SECRETTOKEN@github.com\n")
    target = str(secret) if victim == "secret" else victim
    (source_repo / "python/pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "evilbackend"\nbackend-path = ["."]\n')
    (source_repo / "python/evilbackend.py").write_text(f"VICTIM = {target!r}\n" + LINKING_BACKEND)
    git(source_repo, "add", "-A")
    git(source_repo, "commit", "-qm", "upstream: a backend that links its log elsewhere")
    res = invoke("build", "--sglang-rev", "main", "--repo", str(source_repo), "--series", str(series), "-o",
                 str(tmp_path / "dist"), "--no-isolation", as_json=False)
    assert res.code != 0 and "the source build failed" in res.err, res.err
    assert "ghp_SECRETTOKEN" not in res.err and "its log is gone or a link: not read" in res.err, res.err
    assert "full log:" not in res.err, res.err  # (the link is not a log to read)
    assert secret.read_text() == "https://u:ghp_SECRETTOKEN@github.com\n"


LINKED_WHEEL_BACKEND = """\
import os
def get_requires_for_build_wheel(config_settings=None):
    return []
def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name = "sglang-" + os.environ["SETUPTOOLS_SCM_PRETEND_VERSION_FOR_SGLANG"] + "-py3-none-any.whl"
    os.symlink(OUTSIDE, os.path.join(wheel_directory, name))  # a wheel of the operator's, which the box cannot read
    return name
"""


def test_a_build_whose_wheel_is_a_link_out_of_its_folder_is_refused_unread(tmp_path: Path, source_repo: Path,
                                                                          series: Path):
    """The box writes its build folder: a backend that leaves as its wheel a link to a file outside (a wheel of the
    operator's it cannot read itself) is refused in one line; the tool reads nothing through it, writes no wheel."""
    outside = tmp_path / "operator-home" / "private.whl"
    outside.parent.mkdir()
    with zipfile.ZipFile(outside, "w") as zf:
        zf.writestr("private/secret.py", "TOKEN = 'ghp_SECRETTOKEN'\n")
    (source_repo / "python/pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "evilbackend"\nbackend-path = ["."]\n')
    (source_repo / "python/evilbackend.py").write_text(f"OUTSIDE = {str(outside)!r}\n" + LINKED_WHEEL_BACKEND)
    git(source_repo, "add", "-A")
    git(source_repo, "commit", "-qm", "upstream: a backend whose wheel is a link")
    out = tmp_path / "dist"
    res = invoke("build", "--sglang-rev", "main", "--repo", str(source_repo), "--series", str(series), "-o", str(out),
                 "--no-isolation", as_json=False)
    assert res.code != 0 and "is a link, not a wheel it wrote" in res.err.splitlines()[-1], res.err
    assert not out.exists()
