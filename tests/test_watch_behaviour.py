"""`watch` runs the behavioural tier (ops.treecheck) on the tree it carries: an upstream commit made in
the test on the real v0.5.23 that changes what a callee does, not its signature (``EnvBool.parse`` no
longer takes "1"), passes the API contract and still makes watch `broken`, naming our module and the
upstream commit (bisect with the tier as its step). Where a tier cannot run here, watch is
`unchecked` (exit 8), never `clean`: no nvcc on PATH, an interpreter without torch."""

from __future__ import annotations

import os
import re
import shutil
import venv
from pathlib import Path

import pytest

import watch_upstream as wu
from c128patch.fit.watch import EXIT
from c128patch.git import Git
from c128patch.series.manifest import load_series
from c128patch.textsafe import md as inert
from support import REPO_ROOT, invoke, tier_unchecked, upstream_commit

ENVIRON = "python/sglang/srt/environ.py"
CONTROLLER = "sglang.srt.layers.attention.dsv4.online_c128_dspark"
PROBE = f"{CONTROLLER}.online_c128_dspark_env()"
SUBJECT = "environ: EnvBool takes true/false only"
V = load_series(REPO_ROOT).version


def envbool_strict(git: Git, parent: str) -> str:
    """EnvBool.parse no longer accepts "1"/"0": the same signature (the contract holds); a gate set to 1 is
    read as its default (off) with a warning, so our controller never switches on."""
    text = git.blob(parent, ENVIRON).decode()
    new = text.replace('if value in ["true", "1", "yes", "y"]:', 'if value in ["true", "yes", "y"]:', 1).replace(
        'if value in ["false", "0", "no", "n"]:', 'if value in ["false", "no", "n"]:', 1)
    assert new != text

    def edit(idx: Git) -> None:
        blob = idx.out("hash-object", "-w", "--stdin", input=new)
        idx.run("update-index", "--add", "--cacheinfo", f"100644,{blob},{ENVIRON}")

    return upstream_commit(git, parent, SUBJECT, edit)


@pytest.fixture(scope="module")
def drift(sglang_release_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Git:
    """Branch ``behaviour``: an unrelated commit on v0.5.23, then the EnvBool change (``behaviour-change``)."""
    git = wu.stand_in(sglang_release_repo, tmp_path_factory.mktemp("behaviour") / "sglang.git")
    change = envbool_strict(git, wu.unrelated(git))
    wu.set_branch(git, "behaviour-change", change)
    wu.set_branch(git, "behaviour", change)
    wu.set_branch(git, "unrelated", wu.unrelated(git))
    return git


@pytest.fixture(scope="module")
def broken(drift: Git, tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("broken") / "out"
    return invoke("watch", "--onto", "behaviour", "--repo", str(drift.git_dir), "--out", str(out),
                  "--series", str(REPO_ROOT)), out


def no_torch_python(tmp: Path) -> str:
    """An interpreter without torch: a fresh venv of the base interpreter (the tier runs ``python -I``, which
    ignores PYTHONPATH, so a ``torch`` hidden there no longer hides it)."""
    venv.create(tmp / "no-torch-venv", with_pip=False)
    return str(tmp / "no-torch-venv" / "bin" / "python")


def test_the_static_contract_does_not_see_the_change(drift):
    run = invoke("contract", "--sglang-rev", "behaviour", "--repo", str(drift.git_dir), "--series", str(REPO_ROOT),
                 "--no-nvcc")
    assert run.code == 0, run.out
    assert run.out["revs"][0]["verdict"].startswith("holds: ")


def test_watch_says_broken_naming_our_module_and_the_upstream_commit(broken, drift):
    run, out = broken
    assert run.code == EXIT["broken"] == 7, (run.err, run.out.get("headline"))
    report = run.out
    assert report["outcome"] == "broken" and not report["ok"]
    assert report["contract"]["broken"] is False  # the contract holds: only the tier sees it
    failed = report["behaviour"]["failed"]
    assert failed[0] == f"gates on: {PROBE}: returned False with the gates on, expected True", failed
    # the series' DSPARK scenarios see it too: the controller stays off with the gates on (those that ran here)
    scenario = (r"gates on: scenario (verify-static|verify-compact|decode|worker-commit|record-streams|"
                r"compressor-callback|backend-verify-metadata): .*: "
                r"the controller is disabled with the gates on|"
                r"gates (on|off): scenario startup-rules: .*: AssertionError: "  # the rules no longer read as upstream
                r"SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK='1': upstream's EnvBool\.parse reads ValueError, "
                r"the rules True")
    assert any(f.startswith("gates on: scenario startup-rules: ") for f in failed[1:]) and all(
        re.fullmatch(scenario, f) for f in failed[1:]), failed
    # the verify scenarios enter the tree's backend (helper 103): where this interpreter cannot import it they are
    # not run, and say so; where they run, the controller is off
    on = next(t for t in report["behaviour"]["json"]["tiers"] if t["gates"] == "on")["scenarios"]
    assert on["verify-static"]["status"] == "failed" or (
        on["verify-static"]["status"] == "not run" and " did not import" in on["verify-static"]["detail"]), on
    assert report["headline"] == (f"series c128patch {V} applies on behaviour@{report['onto']['commit'][:12]} but does "
                                  f"not fit it: behavioural tier, {failed[0]}; {len(failed) - 1} more")
    assert report["next"][0] == (f"c128patch treecheck --sglang-rev behaviour --repo {drift.git_dir} "
                                 f"--series {REPO_ROOT}")
    found = report["bisect"]
    assert found["found"] and found["commit"] == drift.rev_parse("behaviour-change") and found["subject"] == SUBJECT
    assert found["failing"] == [f"behavioural tier: {f}" for f in failed]
    md = (out / "watch-report.md").read_text()
    assert "## Behavioural tier (gates off and on)" in md and all(f"- **failed**: {inert(f)}" in md for f in failed)
    assert f"first bad upstream commit: `{found['commit']}` `{SUBJECT}`" in md


def test_the_printed_command_shows_the_same_failure(broken, drift):
    run, _ = broken
    cmd = run.out["next"][0].split()
    assert cmd[:2] == ["c128patch", "treecheck"]
    again = invoke(*cmd[1:])
    assert again.code == 1 and again.out["failed"] == run.out["behaviour"]["failed"]


def _path_without(program: str) -> str:
    return os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep)
                           if d and not (Path(d) / program).exists())


def test_without_nvcc_watch_is_unchecked_not_clean(drift, tmp_path):
    pytest.importorskip("torch")
    path = _path_without("nvcc")
    assert shutil.which("nvcc", path=path) is None and shutil.which("git", path=path)
    run = invoke("watch", "--onto", "unrelated", "--repo", str(drift.git_dir), "--out", str(tmp_path / "out"),
                 "--series", str(REPO_ROOT), env={"PATH": path})
    assert run.code == EXIT["unchecked"] == 8, (run.err, run.out.get("headline"))
    report = run.out
    assert report["outcome"] == "unchecked" and not report["ok"]
    assert report["unchecked"] == ["C++: nvcc not found: C++ contract not checked (only the header text was compared)",
                                   *tier_unchecked(report["behaviour"])]
    said = "; ".join(report["unchecked"])
    assert report["headline"].endswith(f"(11 entries, proven) but is not checked here: {said}")
    assert report["behaviour"]["failed"] == [] and report["behaviour"]["ran"]
    md = (tmp_path / "out" / "watch-report.md").read_text()
    assert "## Not checked here" in md and f"- `{report['unchecked'][0]}`" in md


def test_without_torch_watch_is_unchecked_not_clean(drift, tmp_path):
    python = no_torch_python(tmp_path)
    run = invoke("watch", "--onto", "unrelated", "--repo", str(drift.git_dir), "--out", str(tmp_path / "out"),
                 "--series", str(REPO_ROOT), "--python", python)
    assert run.code == EXIT["unchecked"], (run.err, run.out.get("headline"))
    report = run.out
    lines = [u for u in report["unchecked"] if not u.startswith("C++: ")]
    assert lines == ["behavioural tier: torch is not installed for this interpreter: behavioural tier not checked; "
                     "imports: 11 of 11 modules' sglang imports resolve on the tree's files"], report["unchecked"]
    assert report["behaviour"]["not_checked"] == [
        "behavioural tier: torch is not installed for this interpreter (nothing imported)"]


def test_without_torch_a_behavioural_break_is_not_called_clean_either(drift, tmp_path):
    """The tier cannot see the EnvBool change without torch: unchecked, not clean (and not broken)."""
    run = invoke("watch", "--onto", "behaviour", "--repo", str(drift.git_dir), "--out", str(tmp_path / "out"),
                 "--series", str(REPO_ROOT), "--python", no_torch_python(tmp_path))
    assert run.code == EXIT["unchecked"] and run.out["outcome"] == "unchecked", run.out.get("headline")


def test_no_run_runs_none_of_the_targets_code_and_is_unchecked(drift, tmp_path):
    """--no-run: the tier does not start (the imports are still resolved); watch is unchecked, never clean."""
    run = invoke("watch", "--onto", "unrelated", "--repo", str(drift.git_dir), "--out", str(tmp_path / "out"),
                 "--series", str(REPO_ROOT), "--no-run")
    assert run.code == EXIT["unchecked"] and run.out["outcome"] == "unchecked", run.out.get("headline")
    assert run.out["behaviour"]["ran"] is False and run.out["behaviour"]["json"]["tiers"] == []
    assert ("behavioural tier: unchecked: the target's code was not run (--no-run); imports: 11 of 11 modules' "
            "sglang imports resolve on the tree's files") in run.out["unchecked"]
    md = (tmp_path / "out" / "watch-report.md").read_text()
    assert "runs the target tree's code" not in md


def python_running(tmp: Path, code: str) -> str:
    """An interpreter without torch that runs ``code`` as it starts (a ``.pth`` line of its own site-packages, which
    ``python -I`` still reads): what the box runs doing it."""
    python = Path(no_torch_python(tmp))
    site = next((python.parent.parent / "lib").glob("python3*/site-packages"))
    (site / "c128-start.pth").write_text(f"import sys; exec({code!r})\n")
    return str(python)


def test_a_flood_of_output_is_broken_and_a_run_past_treechecks_timeout_unchecked(drift, tmp_path):
    """Output past the box's limit is the target's defect: watch `broken` (it was `unchecked`), treecheck exit 1 (it
    was 2); past treecheck's --timeout (600 s, fixed) it is unchecked, exit 8 (a slow host too: it was 2)."""
    flood = python_running(tmp_path / "flood", "sys.stdout.write('x' * (17 << 20))")
    line = "the target's code wrote more than 16 MiB to its stdout (the box's limit): none of it is taken"
    run = invoke("watch", "--onto", "unrelated", "--repo", str(drift.git_dir), "--out", str(tmp_path / "out"),
                 "--series", str(REPO_ROOT), "--python", flood)
    assert run.code == EXIT["broken"] and run.out["outcome"] == "broken", (run.err, run.out.get("headline"))
    assert run.out["behaviour"]["failed"] == [f"behavioural tier: {line}"]
    run = invoke("treecheck", "--sglang-rev", "unrelated", "--repo", str(drift.git_dir), "--series", str(REPO_ROOT),
                 "--python", flood)
    assert run.code == 1 and run.out["failed"] == [f"behavioural tier: {line}"], (run.code, run.err)
    hang = python_running(tmp_path / "hang", "import time; time.sleep(600)")
    run = invoke("treecheck", "--sglang-rev", "unrelated", "--repo", str(drift.git_dir), "--series", str(REPO_ROOT),
                 "--python", hang, "--timeout", "3")
    assert run.code == 8 and not run.out["failed"], (run.code, run.err)
    assert run.out["not_checked"] == ["behavioural tier: the target's code did not finish in 3 s (the box's time "
                                      "limit; a slow host: treecheck --timeout SECONDS gives it more)"]
