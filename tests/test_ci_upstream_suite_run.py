"""ci/gpu/stage_upstream_suite.py -> ci/gpu/upstream_suite_run.sh -> ci/gpu/collect_upstream_suite.py,
end to end on this CPU machine for one release: the real staging (c128patch apply + smoke --stage),
the real script with the real smoke (its device probe answering as the H200:
tests/smoke_standins/h200_probe_c128patch.py), the real pytest passes, the bundle, the collector.
The upstream test files are written here (none is vendored)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

from support import REPO_ROOT, needs_torch

TESTS = {
    "test_c128patch_package.py": """
        from sglang.kernels.ops.attention.dsv4 import CompressorPrefillPlan, compress_forward

        def test_package_exports_the_compress_entry_points():
            assert callable(compress_forward) and hasattr(CompressorPrefillPlan, "generate")

        def test_fails_on_both():
            raise AssertionError("written to fail at /tmp/c128patch-jit/0123456789ab/x.so")
    """,
}
SOURCES = {"note": "written by tests/test_ci_upstream_suite_run.py"}


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", **extra}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("ci-upstream")
    tests = tmp / "test"
    for name, text in TESTS.items():
        path = tests / "registered/kernels/ops/attention" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    (tests / "SOURCES.json").write_text(json.dumps(SOURCES))
    stage = subprocess.run([sys.executable, str(REPO_ROOT / "ci/gpu/stage_upstream_suite.py"), "--tests", str(tests),
                            "--rev", "v0.5.23", "--dest", str(tmp / "stage"), "--no-wheels"],
                           capture_output=True, text=True, env=_env())
    assert stage.returncode == 0, stage.stderr[-3000:]
    run = subprocess.run(["bash", str(REPO_ROOT / "ci/gpu/upstream_suite_run.sh")], capture_output=True, text=True,
                         env=_env(STAGE=str(tmp / "stage"), OUT=str(tmp / "out"), WHEELS="none", PASS_TIMEOUT="240",
                                  DEADLINE="300",
                                  SMOKE=f"{sys.executable} {REPO_ROOT}/tests/smoke_standins/h200_probe_c128patch.py"),
                         timeout=400)
    return {"tmp": tmp, "stage": stage, "run": run}


def collect(bundle: dict, dest: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO_ROOT / "ci/gpu/collect_upstream_suite.py"),
                           str(bundle["tmp"] / "out"), "--dest", str(dest), *extra], capture_output=True, text=True)


def test_staging_writes_each_release_its_trees_tests_and_a_manifest(bundle):
    stage = bundle["tmp"] / "stage"
    manifest = json.loads((stage / "STAGE.json").read_text())
    assert [r["rev"] for r in manifest["releases"]] == ["v0.5.23"]
    assert manifest["releases"][0]["selected"] == ["registered/kernels/ops/attention/test_c128patch_package.py"]
    assert manifest["tests_sources"] == SOURCES
    assert {p.name for p in (stage / "v0.5.23").iterdir()} == {"patched", "upstream", "upstream-tests"}
    assert "git_commit" not in json.loads((stage / "v0.5.23/upstream-tests/SOURCES.json").read_text())


@needs_torch
def test_the_run_brings_back_three_files_within_the_device_limits(bundle):
    run = bundle["run"]
    assert run.returncode == 0, run.stdout + run.stderr  # a test failing on both trees is a note, not a problem
    out = bundle["tmp"] / "out"
    assert sorted(p.name for p in out.iterdir()) == ["upstream-suite-run.json", "upstream-suite-summary.txt",
                                                     "upstream-suite.tgz"]
    assert all(p.stat().st_size < 16 * 2**20 for p in out.iterdir())
    with tarfile.open(out / "upstream-suite.tgz") as tar:
        names = tar.getnames()
    assert {"./v0.5.23/upstream-suite.json", "./v0.5.23/smoke-upstream-suite.json", "./v0.5.23/pytest-patched.log",
            "./v0.5.23/pytest-upstream.log", "./v0.5.23.log", "./v0.5.23.rc"} <= set(names)


@needs_torch
def test_the_run_manifest_says_each_release_exit_and_counts(bundle):
    run = json.loads((bundle["tmp"] / "out/upstream-suite-run.json").read_text())
    (rel,) = run["releases"]
    assert (rel["rev"], rel["exit"], rel["ok"], rel["result"]) == ("v0.5.23", 0, True, "v0.5.23/upstream-suite.json")
    assert rel["counts"] == {"same": 1, "both fail": 1}
    summary = (bundle["tmp"] / "out/upstream-suite-summary.txt").read_text()
    assert summary.startswith("v0.5.23: exit 0 in ") and "ok=True, 1 both fail, 1 same" in summary.splitlines()[0]


def test_both_trees_ran_at_the_same_time(bundle):
    report = json.loads(tarfile.open(bundle["tmp"] / "out/upstream-suite.tgz").extractfile(
        "./v0.5.23/smoke-upstream-suite.json").read())
    assert "--parallel-trees" in report["command"]
    assert {p["label"] for p in report["passes"].values()} == {"patched", "upstream"}


@needs_torch
def test_the_collector_writes_each_release_result_with_no_machine_path(bundle, tmp_path):
    res = collect(bundle, tmp_path / "results")
    assert res.returncode == 0, res.stderr
    text = (tmp_path / "results/v0.5.23/upstream-suite.json").read_text()
    result = json.loads(text)
    assert result["rev"] == "v0.5.23" and result["counts"]["same"] == 1
    assert str(bundle["tmp"]) not in text and str(REPO_ROOT) not in text
    assert result["command"].startswith("c128patch smoke upstream --tree <stage>/v0.5.23/patched ")
    failing = {t["id"]: t for t in result["tests"]}[
        "registered/kernels/ops/attention/test_c128patch_package.py::test_fails_on_both"]
    assert failing["patched_message"] == "AssertionError: written to fail at $SGLANG_JIT_CACHE_DIR/x.so"


@needs_torch
def test_the_collector_refuses_a_collect_only_run_and_writes_nothing(bundle, tmp_path):
    listed = bundle["tmp"] / "listed"
    run = subprocess.run(["bash", str(REPO_ROOT / "ci/gpu/upstream_suite_run.sh"), "--list"], capture_output=True,
                         text=True, env=_env(STAGE=str(bundle["tmp"] / "stage"), OUT=str(listed), WHEELS="none"),
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    res = subprocess.run([sys.executable, str(REPO_ROOT / "ci/gpu/collect_upstream_suite.py"), str(listed),
                          "--dest", str(tmp_path / "results")], capture_output=True, text=True)
    assert res.returncode == 1
    assert "v0.5.23: a collect-only result (--list run); pass --allow-list to keep it" in res.stderr
    assert not (tmp_path / "results").exists()


def test_staging_refuses_a_folder_of_the_repository_that_git_does_not_ignore(tmp_path):
    res = subprocess.run([sys.executable, str(REPO_ROOT / "ci/gpu/stage_upstream_suite.py"), "--tests", str(tmp_path),
                          "--dest", str(REPO_ROOT / "ci/gpu/not-ignored-stage")], capture_output=True, text=True)
    assert res.returncode == 2
    assert "ci/gpu/not-ignored-stage is not git-ignored: it would hold upstream's files" in res.stderr
    assert "echo /ci/gpu/not-ignored-stage/ >>" in res.stderr
    assert not (REPO_ROOT / "ci/gpu/not-ignored-stage").exists()


@needs_torch
def test_the_collected_result_is_keyed_by_the_staged_tree_as_the_matrix_keys_the_release(bundle, tmp_path, real_series):
    from c128patch.evidence.keys import key_for
    from c128patch.upstream.releases import ReleaseHistory

    res = collect(bundle, tmp_path / "results")
    assert res.returncode == 0, res.stderr
    result = json.loads((tmp_path / "results/v0.5.23/upstream-suite.json").read_text())
    git = ReleaseHistory().git
    assert result["key"] == key_for(real_series, git, git.rev_parse("v0.5.23")).to_json()
    assert (result["passed"], result["failed"]) == (1, 1)


def test_the_collector_refuses_a_stage_that_holds_another_series_than_the_run(bundle, tmp_path):
    other = tmp_path / "stage"
    src = bundle["tmp"] / "stage/v0.5.23/patched/sglang/c128patch_provenance.json"
    record = json.loads(src.read_text())
    record["series"]["digest"] = "0" * 64
    dest = other / "v0.5.23/patched/sglang/c128patch_provenance.json"
    dest.parent.mkdir(parents=True)
    dest.write_text(json.dumps(record))
    res = collect(bundle, tmp_path / "results", "--stage", str(other))
    assert res.returncode == 1
    assert "v0.5.23: the stage holds series 000000000000, the result ran series " in res.stderr
    assert not (tmp_path / "results").exists()
