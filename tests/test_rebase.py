"""rebase on the real release history: 0.5.22 -> 0.5.23 gives the 0.5.23 series; conflicts, the
ledger, skip/abort/continue, interrupts and merged-upstream detection."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from c128patch.cli import main
from c128patch.git import Git
from c128patch.series.manifest import load_series
from support import REPO_ROOT, snapshot

RS = "c128-dspark-record-streams"
BACKEND = "c128-dspark-online-backend"
CONFLICTED = ["python/sglang/srt/environ.py", "python/sglang/srt/speculative/dspark_components/dspark_verify.py"]
LEDGERED = {RS, BACKEND}  # entries whose 0.5.22 -> 0.5.23 conflicts the product ledger resolves


def cli(*args: str) -> tuple[int, dict, str]:
    res = CliRunner().invoke(main, [*args, "--json"])
    try:
        out = json.loads(res.stdout)
    except ValueError:
        out = {}
    return res.exit_code, out, res.stderr


@pytest.fixture
def series(tmp_path: Path) -> Path:
    """A private copy of the product series (the rebase writes its ledger there)."""
    dest = tmp_path / "series"
    for sub in ("patches", "csrc", "overlay"):
        shutil.copytree(REPO_ROOT / sub, dest / sub)
    return dest


def forget_resolutions(series: Path, entry: str) -> None:
    """Drop the ledger's resolutions of one entry: its conflict then needs a human again."""
    ledger = series / "patches/resolutions/ledger.toml"
    rows = ledger.read_text().split("[[resolutions]]")
    ledger.write_text("[[resolutions]]".join(r for r in rows if f'entry = "{entry}"' not in r))
    shutil.rmtree(series / "patches/resolutions" / entry)


def clone_applied(repo: Path, dest: Path, series: Path, rev: str) -> Git:
    code, out, err = cli("apply", "--sglang-rev", rev, "--repo", str(repo), "--tree", str(dest), "--series", str(series))
    assert code == 0, err
    return Git(worktree=dest)


def test_rebase_022_to_023_yields_the_023_series(sglang_release_repo: Path, tmp_path: Path, series: Path):
    git = clone_applied(sglang_release_repo, tmp_path / "t", series, "v0.5.22")
    code, report, err = cli("rebase", "--onto", "v0.5.23", "--tree", str(git.worktree), "--series", str(series))
    assert code == 0, err
    status = {e["name"]: (e["status"], e["detail"]) for e in report["entries"]}
    assert all(status[n] == ("resolved", "resolved from the ledger") for n in LEDGERED)
    assert all(st in ("unchanged", "context-only") for n, (st, _) in status.items() if n not in LEDGERED)
    assert status["c128-plan-zero-rows"][0] == "unchanged"  # the kernel files did not move
    assert report["new_base"]["rev"] == "v0.5.23" and report["upstream_commits_between"] == 1
    assert any("!" in line for line in report["range_diff"])  # the record_stream entry changed
    assert git.current_branch() == "c128/v0.5.22" and git.status_porcelain() == []
    # exporting the rebased branch gives exactly the 0.5.23 series we carry
    before = {p: p.read_bytes() for p in (series / "patches").rglob("*") if p.is_file()}
    code, out, err = cli("refresh", "--tree", str(git.worktree), "--series", str(series), "--check")
    assert code == 0 and out["changed"] == [], out
    assert {p: p.read_bytes() for p in (series / "patches").rglob("*") if p.is_file()} == before
    assert cli("lint", "--series", str(series))[0] == 0  # includes the gate audit on v0.5.23
    assert cli("check", *[a for r in ("v0.5.20", "v0.5.21", "v0.5.22", "v0.5.23") for a in ("--sglang-rev", r)],
               "--series", str(series))[0] == 0
    md = (git.worktree / ".git/c128patch/rebase-report.md").read_text()
    assert "v0.5.22 → v0.5.23" in md and "## range-diff" in md


def _resolve_like_023(sglang_release_repo: Path, tmp_path: Path, series: Path, tree: Path) -> None:
    """Resolve the stopped entry's conflicts as the 0.5.23 series has them (that entry's commit)."""
    ref = tmp_path / "ref023"
    if not ref.exists():
        clone_applied(sglang_release_repo, ref, series, "v0.5.23")
    git, refgit = Git(worktree=tree), Git(worktree=ref)
    entry = json.loads((tree / ".git/c128patch/rebase.json").read_text())
    name = entry["steps"][entry["pos"]]["name"]
    commit = refgit.out("log", "-1", "--format=%H", f"--grep=^C128patch-Entry: {name}$")
    for f in git.out("diff", "--name-only", "--diff-filter=U").split():
        (tree / f).write_text(refgit.out("show", f"{commit}:{f}") + "\n")
        git.run("add", "--", f)


def test_conflict_is_resolved_once_then_replayed_from_the_ledger(sglang_release_repo, tmp_path, series):
    forget_resolutions(series, RS)
    git = clone_applied(sglang_release_repo, tmp_path / "a", series, "v0.5.22")
    code, out, err = cli("rebase", "--onto", "v0.5.23", "--tree", str(git.worktree), "--series", str(series))
    assert code == 1 and f"entry '{RS}' conflicts on v0.5.23" in err and "rebase --continue" in err
    assert sorted(git.out("diff", "--name-only", "--diff-filter=U").split()) == CONFLICTED
    assert "<<<<<<<\n" in (git.worktree / CONFLICTED[1]).read_text()  # labels normalized
    failing = out["report"]["entries"][2]
    assert failing["status"] == "failing" and failing["upstream_commits"] == [
        git.out("log", "-1", "--format=%h %s", "v0.5.23")]
    _resolve_like_023(sglang_release_repo, tmp_path, series, git.worktree)
    code, report, err = cli("rebase", "--continue", "--tree", str(git.worktree), "--series", str(series))
    assert code == 0, err
    assert report["entries"][2]["status"] == "resolved" and len(report["entries"][2]["ledger"]) == 2
    ledger = (series / "patches/resolutions/ledger.toml").read_text()
    assert ledger.count(f'entry = "{RS}"') == 2 and 'from = "v0.5.22"' in ledger
    for diff in (series / "patches/resolutions" / RS).glob("*.diff"):
        assert len(diff.read_text().splitlines()) < 60  # a resolution, not a copy of an upstream file
    # another machine: a fresh clone replays the recorded resolution, and says so
    other = clone_applied(sglang_release_repo, tmp_path / "b", series, "v0.5.22")
    code, report, err = cli("rebase", "--onto", "v0.5.23", "--tree", str(other.worktree), "--series", str(series))
    assert code == 0, err
    assert report["entries"][2]["detail"] == "resolved from the ledger"
    assert report["entries"][2]["ledger"] == [f"{RS}:{p.stem}" for p in sorted((series / "patches/resolutions" / RS).glob("*.diff"),
                                                                               key=lambda p: CONFLICTED.index(_file_of(p)))]
    assert other.out("rev-parse", "HEAD^{tree}") == git.out("rev-parse", "HEAD^{tree}")


def _file_of(diff: Path) -> str:
    return diff.read_text().splitlines()[0].removeprefix("--- a/")


def test_abort_restores_the_branch_exactly_and_keeps_uncommitted_work(sglang_release_repo, tmp_path, series):
    forget_resolutions(series, RS)
    git = clone_applied(sglang_release_repo, tmp_path / "t", series, "v0.5.22")
    before = snapshot(git.worktree)
    assert cli("rebase", "--onto", "v0.5.23", "--tree", str(git.worktree), "--series", str(series))[0] == 1
    (git.worktree / "python/sglang/srt/environ.py").write_text("half-resolved\n")
    code, out, err = cli("rebase", "--abort", "--tree", str(git.worktree), "--series", str(series))
    assert code == 0, err
    after = snapshot(git.worktree)
    refs = lambda s: [r for r in s["refs"].splitlines() if "refs/c128patch/recovery" not in r and "refs/stash" not in r]  # noqa: E731
    assert refs(after) == refs(before) and after["head"] == before["head"] and after["status"] == before["status"]
    assert git.rev_parse(out["recovery_ref"]) == git.rev_parse("c128/v0.5.22")
    assert out["stash"] and "half-resolved" in git.out("show", f"{out['stash']}:python/sglang/srt/environ.py")
    assert not (git.worktree / ".git/c128patch/rebase.json").exists()


def test_skip_drops_the_entry_and_other_commands_wait(sglang_release_repo, tmp_path, series):
    forget_resolutions(series, RS)
    git = clone_applied(sglang_release_repo, tmp_path / "t", series, "v0.5.22")
    assert cli("rebase", "--onto", "v0.5.23", "--tree", str(git.worktree), "--series", str(series))[0] == 1
    for args in (["apply", "--sglang-rev", "v0.5.21", "--repo", str(git.worktree)],
                 ["refresh", "--tree", str(git.worktree)],
                 ["rebase", "--onto", "v0.5.21", "--tree", str(git.worktree)]):
        code, _, err = cli(*args, "--series", str(series))
        assert code == 2 and "a c128patch rebase is in progress" in err, (args, err)
    # a dirty tree mid-rebase: continue refuses and says why
    (git.worktree / "python/sglang/srt/environ.py").write_text("x\n")
    git.run("add", "python/sglang/srt/environ.py")
    code, _, err = cli("rebase", "--continue", "--tree", str(git.worktree), "--series", str(series))
    assert code == 2 and "conflicts remain in python/sglang/srt/speculative" in err
    code, report, err = cli("rebase", "--skip", "--tree", str(git.worktree), "--series", str(series))
    assert code == 0, err
    assert [e["status"] for e in report["entries"]][2] == "skipped"
    assert f"C128patch-Entry: {RS}\n" not in git.out("log", "--format=%B", "v0.5.23..HEAD") + "\n"
    assert "SGLANG_DSPARK_RECORD_VERIFY_STREAMS" not in (git.worktree / "python/sglang/srt/environ.py").read_text()


@pytest.mark.parametrize("how", ["kill", "sigint"])
def test_interrupted_rebase_resumes(sglang_release_repo, tmp_path, series, how):
    git = clone_applied(sglang_release_repo, tmp_path / "t", series, "v0.5.22")
    env = {**os.environ, "C128PATCH_FAULT": f"{how}-before:c128-dspark-kernels-csrc"}
    proc = subprocess.run([sys.executable, "-m", "c128patch", "rebase", "--onto", "v0.5.23", "--tree", str(git.worktree),
                           "--series", str(series)], env=env, capture_output=True, text=True)
    if how == "kill":
        assert proc.returncode == -9
    else:
        assert proc.returncode == 2 and "interrupted: the rebase journal is intact" in proc.stderr
    journal = json.loads((git.worktree / ".git/c128patch/rebase.json").read_text())
    assert journal["pos"] == 3 and [s["status"] for s in journal["steps"]][:3] == ["unchanged", "unchanged", "resolved"]
    assert [s["status"] for s in journal["steps"]][3:] == ["pending"] * 7
    code, out, err = cli("status", "--tree", str(git.worktree), "--series", str(series))
    assert code == 0 and out["rebase_in_progress"]
    code, report, err = cli("rebase", "--continue", "--tree", str(git.worktree), "--series", str(series))
    assert code == 0, err
    statuses = {e["name"]: e["status"] for e in report["entries"]}
    assert {n for n, st in statuses.items() if st == "resolved"} == LEDGERED
    assert set(statuses.values()) <= {"unchanged", "context-only", "resolved"}
    assert cli("refresh", "--tree", str(git.worktree), "--series", str(series), "--check")[0] == 0


def _upstream_with_entry_merged(git: Git, series: Path, subject: str) -> str:
    """A commit on top of v0.5.23 that already contains the zero-rows patch (as upstream would merge it)."""
    s = load_series(series)
    idx = git.with_env(GIT_INDEX_FILE=str(git.worktree / ".git" / "merged.index"))
    idx.run("read-tree", "v0.5.23")
    idx.run("apply", "--cached", str(s.file_of(s.entry("c128-plan-zero-rows"))))
    tree = idx.out("write-tree")
    return git.out("commit-tree", tree, "-p", "v0.5.23", "-m", subject)


@pytest.mark.parametrize("subject,reason", [("[DeepSeek-V4] c128 plans: skip zero rows (#35848)", "names PR #35848"),
                                            ("c128 plans: skip zero rows", "reverse-applies")])
def test_merged_upstream_is_proposed_never_silent(sglang_release_repo, tmp_path, series, subject, reason):
    git = clone_applied(sglang_release_repo, tmp_path / "t", series, "v0.5.23")
    onto = _upstream_with_entry_merged(git, series, subject)
    code, out, err = cli("rebase", "--onto", onto, "--tree", str(git.worktree), "--series", str(series))
    assert code == 1 and "entry 'c128-plan-zero-rows' looks merged upstream" in err and reason in err
    assert "nothing was dropped" in err and "rebase --skip" in err
    code, report, err = cli("rebase", "--skip", "--tree", str(git.worktree), "--series", str(series))
    assert code == 0, err
    first = report["entries"][0]
    assert first["status"] == "dropped-as-merged" and reason in first["detail"]
    assert [e["status"] for e in report["entries"][1:]] == ["unchanged"] * 9


def test_drop_merged_flag_and_keep_via_continue(sglang_release_repo, tmp_path, series):
    git = clone_applied(sglang_release_repo, tmp_path / "t", series, "v0.5.23")
    onto = _upstream_with_entry_merged(git, series, "c128 plans (#35848)")
    code, report, err = cli("rebase", "--onto", onto, "--drop-merged", "--tree", str(git.worktree), "--series", str(series))
    assert code == 0, err
    assert report["entries"][0]["status"] == "dropped-as-merged" and "PR #35848" in report["entries"][0]["detail"]
    other = clone_applied(sglang_release_repo, tmp_path / "u", series, "v0.5.23")
    onto = _upstream_with_entry_merged(other, series, "c128 plans (#35848)")
    assert cli("rebase", "--onto", onto, "--tree", str(other.worktree), "--series", str(series))[0] == 1
    code, report, err = cli("rebase", "--continue", "--tree", str(other.worktree), "--series", str(series))
    assert code == 0, err
    assert report["entries"][0]["status"] == "dropped-as-merged" and "became empty" in report["entries"][0]["detail"]
