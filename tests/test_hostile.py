"""Hostile input, on the real release history: a series that tries to write outside the tree, conflict
markers staged as a "resolution", two runs at once, commands printed with shell characters in them,
a detached HEAD with work on it, and damaged journals, records and manifests. Each refusal is one
line (exit 2) that names the problem and its fix, with nothing changed; each printed fix is pasted
into a shell and shown to work."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from c128patch.errors import C128Error
from c128patch.git import FAULT_HOOKS_ENV, Git
from c128patch.ops.lint import update_hashes
from c128patch.ops.treestate import apply_journal, rebase_journal
from c128patch.series.layers import stack
from c128patch.series.manifest import load_series
from c128patch.series.paths import confine
from c128patch.series.provenance import PROVENANCE_PATH
from small_series import CUH, EDIT, LINE, series, tree  # noqa: F401 (fixtures)
from support import (
    REPO_ROOT,
    cli_process,
    default_signals,
    invoke,
    make_test_series,
    printed_command,
    refused,
    run_printed,
    small_clone,
    snapshot,
)

OVERLAY = "python/sglang/c128_test_overlay.py"
VERIFY = "python/sglang/srt/speculative/dspark_components/dspark_verify.py"
ONLY_IN_023 = "from sglang.kernels.ops.speculative.dspark.static_accept_tail import static_accept_tail\n"


def retarget(series: Path, target: str) -> None:
    manifest = series / "patches" / "series.toml"
    manifest.write_text(manifest.read_text().replace(f'target = "{OVERLAY}"', f'target = "{target}"'))


def apply_args(tree: Path, series: Path, *extra: str) -> list:
    return ["apply", "--sglang-rev", "v0.5.22", "--repo", tree, "--series", series, *extra]


# ---------------------------------------------------------------------------- 1. no write leaves the tree
@pytest.mark.parametrize("points_to", ["absolute", "dotdot"])
def test_a_patch_that_creates_a_symlink_is_refused_before_anything_is_written(sglang_release_repo, tree, tmp_path,
                                                                              points_to):
    outside = tmp_path / "outside"
    outside.mkdir()
    target = str(outside) if points_to == "absolute" else "../../../outside"  # python/sglang/evil -> tmp/outside
    s = make_test_series(tmp_path / "s", sglang_release_repo, EDIT, links={"python/sglang/evil": target})
    retarget(s, "python/sglang/evil/pwned.py")
    update_hashes(load_series(s))
    refused(apply_args(tree, s), tree, "patches/0001-test.patch creates the symlink python/sglang/evil; "
                                       "a series may not create symlinks")
    assert list(outside.iterdir()) == []


def test_lint_reports_a_patch_that_creates_a_symlink(sglang_release_repo, tmp_path):
    s = make_test_series(tmp_path / "s", sglang_release_repo, EDIT, links={"python/sglang/evil": "/tmp"})
    res = invoke("lint", "--offline", "--series", s, "--json")
    assert res.code == 1
    assert [f["message"] for f in res.out["findings"]] == [
        "patches/0001-test.patch creates the symlink python/sglang/evil; a series may not create symlinks "
        "(a later write through it could leave the tree)"]


def test_a_symlink_mode_in_another_spelling_is_a_symlink_too(sglang_release_repo, tree, tmp_path):
    """Helper 93: git reads a mode by its type bits, so `new file mode 120644` makes a symlink; lint and apply
    compared the text with "120000" and committed a link to a host path."""
    s = make_test_series(tmp_path / "s", sglang_release_repo, EDIT, links={"python/sglang/evil": "/tmp"})
    (patch,) = (s / "patches").glob("0001-*.patch")
    assert "new file mode 120000\n" in patch.read_text()
    patch.write_text(patch.read_text().replace("new file mode 120000\n", "new file mode 120644\n"))
    update_hashes(load_series(s))
    res = invoke("lint", "--offline", "--series", s, "--json")
    assert res.code == 1 and any("creates the symlink python/sglang/evil" in f["message"]
                                 for f in res.out["findings"]), res.out
    refused(apply_args(tree, s), tree, "patches/0001-test.patch creates the symlink python/sglang/evil; ")


@pytest.mark.parametrize("how", ["new", "mode-change"])
def test_a_patch_making_a_submodule_entry_is_refused(sglang_release_repo, tree, tmp_path, how):
    """Helper 155: a patch adding a `160000` entry (or changing a file's mode to it) passed lint and check, and apply
    committed a submodule entry, "identical to a fresh apply"; a series carries only regular files."""
    s = make_test_series(tmp_path / "s", sglang_release_repo, EDIT)
    (patch,) = (s / "patches").glob("0001-*.patch")
    zero, one = "0" * 40, "1" * 40
    extra = (f"diff --git a/python/sub b/python/sub\nnew file mode 160000\nindex {zero}..{one}\n--- /dev/null\n"
             f"+++ b/python/sub\n@@ -0,0 +1 @@\n+Subproject commit {one}\n") if how == "new" else (
        f"diff --git a/{CUH} b/{CUH}\nold mode 100644\nnew mode 160000\n")
    text = patch.read_text()
    cut = text.rindex("-- \n") if "-- \n" in text else len(text)
    patch.write_text(text[:cut] + extra + text[cut:])
    update_hashes(load_series(s))
    where = "python/sub" if how == "new" else CUH
    res = invoke("lint", "--offline", "--series", s, "--json")
    assert res.code == 1 and any(f"makes {where} a submodule entry" in f["message"]
                                 for f in res.out["findings"]), res.out
    refused(apply_args(tree, s), tree, f"patches/0001-test.patch makes {where} a submodule entry (mode 160000)")


@pytest.mark.parametrize("points_to", ["absolute", "dotdot"])
def test_an_overlay_source_that_is_a_symlink_is_refused(tree, series, tmp_path, points_to):
    secret = tmp_path / "secret.py"
    secret.write_text("TOKEN = 'not for the tree'\n")
    source = series / "overlay" / "sglang" / "c128_test_overlay.py"
    source.unlink()
    source.symlink_to(secret if points_to == "absolute" else "../../../secret.py")
    refused(apply_args(tree, series), tree, "overlay/sglang/c128_test_overlay.py goes through the symlink")
    res = invoke("lint", "--offline", "--series", series, "--json")
    assert res.code == 1 and any("is (or goes through) a symlink" in f["message"] for f in res.out["findings"])


def test_a_symlink_git_does_not_track_is_seen_before_any_write(tree, series, tmp_path):
    """An ignored symlink in the work tree is in no upstream tree and survives the checkout: apply
    looks at the work tree itself."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (tree / "python/sglang/evil").symlink_to(outside)
    with open(tree / ".git/info/exclude", "a") as fh:
        fh.write("python/sglang/evil\n")
    retarget(series, "python/sglang/evil/pwned.py")
    refused(apply_args(tree, series), tree, "python/sglang/evil/pwned.py goes through the symlink python/sglang/evil")
    assert list(outside.iterdir()) == []


def test_check_refuses_an_overlay_through_an_upstream_symlink_as_apply_does(tree, series, tmp_path):
    """Helper 185: upstream commits a symlink ``python/sglang/lnk`` (to a folder outside); an overlay targets a file
    under it. apply refused it ("goes through the symlink ... upstream"), but check said "apply: applies" there:
    its replay checked the patches' paths for links, not the overlays'. check now says apply's refusal."""
    git = Git(worktree=tree)
    (tree / "python" / "sglang" / "lnk").symlink_to(tmp_path)
    git.run("add", "python/sglang/lnk")
    git.run("-c", "user.name=u", "-c", "user.email=u@x.invalid", "commit", "-qm", "a link")
    git.run("tag", "linked")
    retarget(series, "python/sglang/lnk/x.py")
    res = invoke("check", "--sglang-rev", "linked", "--repo", tree, "--series", series)
    assert res.code == 1, res.err
    [rev] = res.out["revs"]
    assert rev["apply"]["exit"] == 2 and "python/sglang/lnk/x.py goes through the symlink python/sglang/lnk" in \
        rev["apply"]["detail"], rev
    refused(["apply", "--sglang-rev", "linked", "--repo", tree, "--series", series], tree,
            "python/sglang/lnk/x.py goes through the symlink python/sglang/lnk upstream")


def test_the_destination_is_resolved_in_the_tree_as_it_is_when_written(tree, tmp_path):
    """The last guard, at the write itself: a symlink that appeared after planning (a folder on the way
    or the file itself) is refused, and so is a path that resolves outside."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (tree / "python/sglang/late").symlink_to(outside)
    (tree / "python/sglang/late_file.py").symlink_to(outside / "f.py")
    for rel, why in (("python/sglang/late/x.py", "goes through the symlink python/sglang/late"),
                     ("python/sglang/late_file.py", "goes through the symlink python/sglang/late_file.py")):
        with pytest.raises(C128Error, match=why):
            confine(tree, rel, "overlay 'x'")
    assert confine(tree, "python/sglang/ok.py", "overlay 'x'") == tree / "python/sglang/ok.py"


@pytest.mark.parametrize("forged", ["C128patch-Entry: test-overlay", "c128patch-entry : test-overlay"])
def test_an_entry_whose_message_claims_another_entry_is_refused_and_not_kept(tree, series, forged):
    """A patch naming another entry (any spelling git takes) is refused by the plan, before anything is written: apply,
    and rebase, which commits the file's own message (apply also checks what git recorded: test_trust_series)."""
    patch = series / "patches" / "0001-test.patch"
    patch.write_text(patch.read_text().replace("C128patch-Gate: none (test)", f"C128patch-Gate: none (test)\n{forged}"))
    update_hashes(load_series(series))
    git = Git(worktree=tree)
    before = git.head()
    res = invoke(*apply_args(tree, series), as_json=False)
    assert res.code == 2 and "entry 'test-patch': 0001-test.patch carries 'C128patch-Entry: test-overlay', not " \
        "'test-patch': fix its message" in res.err, res.err
    assert git.head() == before
    assert "test-overlay" not in git.out("log", "-3", "--format=%(trailers:key=C128patch-Entry,valueonly)")


def test_apply_refuses_a_commit_git_recorded_with_another_entrys_trailer_even_past_the_plan(tree, series, monkeypatch):
    """Helper 163: docs/security.md names ``Apply._claims`` (each step's commits carry its entry's trailer only, as git
    recorded them) as the rule's last guard, proven by the test above, which the plan refuses before any commit: with
    ``_claims`` made to accept anything, every test naming the rule still passed. Here the plan's reading is taken out
    (as a message it misreads would be): git's own record is refused, nothing of the step kept."""
    from c128patch.series import plan

    patch = series / "patches" / "0001-test.patch"
    patch.write_text(patch.read_text().replace("C128patch-Gate: none (test)",
                                               "C128patch-Gate: none (test)\nC128patch-Entry: test-overlay"))
    update_hashes(load_series(series))
    monkeypatch.setattr(plan, "find_trailers", lambda text: [])  # the plan misses the claim
    git = Git(worktree=tree)
    before = git.head()
    res = invoke(*apply_args(tree, series), as_json=False)
    assert res.code == 2 and "entry 'test-patch': its patch made commit(s) carrying C128patch-Entry 'test-overlay'" \
        in res.err and "nothing of it was kept" in res.err, res.err
    assert "test-overlay" not in git.out("log", "HEAD", "--format=%(trailers:key=C128patch-Entry,valueonly)")
    assert git.head() == before or "test-patch" not in git.out("log", f"{before}..HEAD", "--format=%B")


# ---------------------------------------------------------------------------- 2. no conflict markers committed
@pytest.fixture
def rebase_stopped(tree: Path, series: Path) -> Git:
    """The test series applied on v0.5.23, rebased onto an upstream commit that changed the very line
    the patch edits: stopped at the conflict in the .cuh file."""
    git = Git(worktree=tree)
    assert invoke("apply", "--sglang-rev", "v0.5.23", "--repo", tree, "--series", series, as_json=False).code == 0
    idx = git.with_env(GIT_INDEX_FILE=str(tree / ".git" / "other.index"))
    idx.run("read-tree", "v0.5.23")
    text = git.blob("v0.5.23", CUH).decode().replace(LINE, LINE.rstrip("\n") + "  // upstream's change\n")
    sha = git.out("hash-object", "-w", "--stdin", input=text)
    idx.run("update-index", "--cacheinfo", f"100644,{sha},{CUH}")
    onto = git.out("commit-tree", idx.out("write-tree"), "-p", "v0.5.23", "-m", "upstream edits the same line")
    res = invoke("rebase", "--onto", onto, "--tree", tree, "--series", series, as_json=False)
    assert res.code == 1 and f"conflicts on {onto} in {CUH}" in res.err, res.err
    return git


def test_rebase_continue_refuses_staged_conflict_markers(rebase_stopped, series):
    git = rebase_stopped
    git.run("add", CUH)  # the markers are still in
    line = (git.worktree / CUH).read_text().splitlines().index("<<<<<<<") + 1
    journal = rebase_journal(git).read_text()
    head = git.head()
    refused(["rebase", "--continue", "--tree", git.worktree],
            contains=f"cannot continue: {CUH} still holds a conflict marker at line {line} (and 2 more marker line(s))")
    assert rebase_journal(git).read_text() == journal and git.head() == head
    assert not (series / "patches" / "resolutions").exists()  # the ledger recorded nothing


def test_rebase_continue_refuses_a_committed_resolution_with_markers(rebase_stopped, series):
    git = rebase_stopped
    git.run("add", CUH)
    git.run("commit", "--quiet", "-m", "resolved")  # committed by hand, markers and all
    refused(["rebase", "--continue", "--tree", git.worktree],
            contains=f"{CUH} still holds a conflict marker at line")
    assert not (series / "patches" / "resolutions").exists()


def test_rebase_continue_records_a_real_resolution(rebase_stopped, series):
    git = rebase_stopped
    text = (git.worktree / CUH).read_text()
    ours = LINE.rstrip("\n") + "  // upstream's change; c128patch test\n"
    start, end = text.index("<<<<<<<"), text.index(">>>>>>>")
    (git.worktree / CUH).write_text(text[:start] + ours + text[text.index("\n", end) + 1:])
    git.run("add", CUH)
    res = invoke("rebase", "--continue", "--tree", git.worktree, "--json")
    assert res.code == 0, res.err
    assert res.out["entries"][0]["status"] == "resolved"
    (recorded,) = (series / "patches" / "resolutions" / "test-patch").glob("*.diff")
    added = [l for l in recorded.read_text().splitlines() if l.startswith("+") and not l.startswith("+++")]
    assert added == ["+" + ours.rstrip("\n")]


@pytest.fixture
def drifting_series(tmp_path: Path, sglang_release_repo: Path) -> Path:
    """A real patch next to an import only 0.5.23 has: it does not apply to v0.5.20."""
    return make_test_series(tmp_path / "drift", sglang_release_repo,
                            {VERIFY: (ONLY_IN_023, ONLY_IN_023 + "# c128patch test\n")}, overlay=False)


@pytest.fixture
def apply_stopped(sglang_release_repo: Path, tmp_path: Path, drifting_series: Path) -> tuple[Git, str]:
    """An apply of the drifting series onto v0.5.20, stopped at its conflict; returns (tree, stderr)."""
    git = small_clone(sglang_release_repo, tmp_path / "t", str(Path(VERIFY).parent))
    res = invoke("apply", "--sglang-rev", "v0.5.20", "--repo", git.worktree, "--series", drifting_series, as_json=False)
    assert res.code == 1, res.err
    return git, res.err


def _hand_resolution(git: Git, stderr: str, keep_markers: bool) -> None:
    """Follow the printed `resolve:` line: git am -3 the patch, edit, git add, git am --continue."""
    am = printed_command(stderr.split("resolve:", 1)[1], "git -C")
    assert run_printed(am).returncode != 0  # git am stops at the conflict, as the hint says it will
    text = (git.worktree / VERIFY).read_text()
    if not keep_markers:
        text = "".join(l for l in text.splitlines(keepends=True) if not l.startswith(("<<<<<<<", "=======", ">>>>>>>")))
    (git.worktree / VERIFY).write_text(text)
    git.run("add", VERIFY)
    git.run("am", "--continue")


def test_apply_continue_loads_no_layer_its_journal_names_inside_the_tree(apply_stopped):
    """Helper 93: apply.json (a state file: input) named a layer folder inside the tree, git-ignored; --continue
    applied it and called the tree a fresh apply of the stack. Layers come from the operator, journals included."""
    git, _ = apply_stopped
    shutil.copytree(REPO_ROOT / "docs" / "examples" / "acme-layer", git.worktree / "evil-layer")
    (git.worktree / ".git" / "info" / "exclude").write_text("evil-layer/\n")
    journal = json.loads(apply_journal(git).read_text())
    layer = git.worktree / "evil-layer"
    digest = stack(load_series(Path(journal["series_root"])), [layer]).digest()  # as the attacker sets it
    apply_journal(git).write_text(json.dumps({**journal, "layers": [str(layer)], "series_digest": digest}))
    head = git.head()
    refused(["apply", "--continue", "--tree", git.worktree], contains="is inside")
    assert git.head() == head and "evil" not in git.out("log", "--format=%B", "-3")


def test_apply_abort_never_removes_a_tree_holding_work_whatever_the_journal_says(apply_stopped):
    """Helper 93: apply.json claimed the tree was a clone the apply made (fresh_clone): --abort removed the whole
    repository, uncommitted work and .git included. A tree holding changes not the apply's is kept, the work
    stashed."""
    git, _ = apply_stopped
    journal = json.loads(apply_journal(git).read_text())
    apply_journal(git).write_text(json.dumps({**journal, "fresh_clone": True, "tree_existed": True}))
    (git.worktree / "mywork.txt").write_text("mine\n")
    res = invoke("apply", "--abort", "--tree", git.worktree)
    assert res.code == 0 and not res.out["removed_clone"], res.out
    assert (git.worktree / ".git").is_dir() and "c128patch apply --abort" in git.out("stash", "list")
    git.run("stash", "pop", "--quiet")
    assert (git.worktree / "mywork.txt").read_text() == "mine\n"


def test_apply_continue_refuses_a_hand_resolution_with_conflict_markers(apply_stopped):
    git, stderr = apply_stopped
    _hand_resolution(git, stderr, keep_markers=True)
    refused(["apply", "--continue", "--tree", git.worktree], git.worktree,
            f"cannot continue: {VERIFY} still holds a conflict marker at line")


def test_apply_continue_takes_a_hand_resolution_as_the_entry_and_says_it_is_not_the_series(apply_stopped,
                                                                                            drifting_series):
    git, stderr = apply_stopped
    _hand_resolution(git, stderr, keep_markers=False)
    done = run_printed(printed_command(stderr.split("resolve:", 1)[1], "c128patch apply --continue"))
    assert done.returncode == 1  # finished, but unproven: a hand resolution is not what the series says
    assert "applied to v0.5.20, but the tree is not what the series says: cannot prove" in done.stderr
    assert "C128patch-Entry: test-patch" in git.out("log", "-1", "--format=%B", "HEAD~1")
    record = json.loads((git.worktree / PROVENANCE_PATH).read_text())
    assert [(e["name"], e["applied"]) for e in record["entries"]] == [("test-patch", "resolved")]
    assert not apply_journal(git).exists() and git.status_porcelain() == []
    keep = printed_command(done.stderr.split("keep your resolution of test-patch as its file for v0.5.20:", 1)[1],
                           "c128patch refresh")  # (helper 96: undo was all it said)
    assert "--accept-differences --variant" in keep, done.stderr
    kept = run_printed(keep)
    assert kept.returncode == 0, kept.stderr
    proven = invoke("status", "--tree", git.worktree, "--series", drifting_series, "--prove")
    assert proven.code == 0 and proven.out["equals_series"], proven.out
    undo = run_printed(printed_command(done.stderr.split("undo:", 1)[1], "git -C"))  # the printed undo works
    assert undo.returncode == 0, undo.stderr
    assert git.current_branch() == "main" and git.rev_parse("refs/heads/c128/v0.5.20") is None


@pytest.mark.parametrize("identity", [None, "Ada Lovelace"], ids=["no-git-identity", "user-identity"])
def test_the_printed_resolve_commands_work_with_or_without_a_git_identity(
        identity, sglang_release_repo, drifting_series, tmp_path, monkeypatch):
    """A fresh machine has no git identity: the printed `git am -3` / `git am --continue` still work
    (they carry c128patch's); where the user has one, they are plain git and commit under it."""
    home = tmp_path / "home"
    home.mkdir()
    config = home / "gitconfig"
    if identity:
        config.write_text(f"[user]\n\tname = {identity}\n\temail = ada@example.invalid\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for name in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "EMAIL"):
        monkeypatch.delenv(name, raising=False)
    git = small_clone(sglang_release_repo, tmp_path / "t", str(Path(VERIFY).parent))
    res = invoke("apply", "--sglang-rev", "v0.5.20", "--repo", git.worktree, "--series", drifting_series, as_json=False)
    assert res.code == 1, res.err
    resolve = res.err.split("resolve:", 1)[1]
    am = printed_command(resolve, "git -C")
    assert ("-c user.name=c128patch" in am) == (identity is None), am
    stopped = run_printed(am)
    assert stopped.returncode != 0 and "identity unknown" not in stopped.stderr.lower(), stopped.stderr
    assert "CONFLICT" in stopped.stdout + stopped.stderr  # it got to the conflict the hint announces
    text = (git.worktree / VERIFY).read_text()
    (git.worktree / VERIFY).write_text("".join(
        line for line in text.splitlines(keepends=True) if not line.startswith(("<<<<<<<", "=======", ">>>>>>>"))))
    add = printed_command(resolve.split("edit the files", 1)[1], "git -C")
    assert run_printed(f"{add} {VERIFY}".replace(" add them", " add")).returncode == 0
    cont = printed_command(resolve.split("add them", 1)[1], "git -C")
    done = run_printed(cont)
    assert done.returncode == 0, done.stderr
    assert git.out("log", "-1", "--format=%cn") == (identity or "c128patch")


def test_a_conflict_stop_is_reported_by_status_and_undone_by_abort(sglang_release_repo, tmp_path, drifting_series):
    git = small_clone(sglang_release_repo, tmp_path / "t", str(Path(VERIFY).parent))
    before = snapshot(git.worktree)
    assert invoke("apply", "--sglang-rev", "v0.5.20", "--repo", git.worktree, "--series", drifting_series,
                  as_json=False).code == 1
    res = invoke("status", "--tree", git.worktree, as_json=False)
    assert "an apply stopped at a conflict after entry 0 of 1; next: test-patch; resume prints how to resolve" \
        in res.text
    steps = run_printed(res.text.split("resume:", 1)[1].splitlines()[0])  # run bare: the conflict and its steps
    assert steps.returncode != 0 and "resolve: git -C" in steps.stderr, steps.stderr
    done = run_printed(res.text.split("undo:", 1)[1].splitlines()[0])
    assert done.returncode == 0, done.stderr
    assert snapshot(git.worktree) == before


def test_apply_abort_keeps_uncommitted_work_in_a_stash(apply_stopped):
    git, _stderr = apply_stopped
    (git.worktree / "notes.txt").write_text("my notes\n")
    res = invoke("apply", "--abort", "--tree", git.worktree, as_json=False)
    assert res.code == 0, res.err
    assert "is back on main; uncommitted changes are in stash" in res.text
    listing = run_printed(printed_command(res.text, "git -C"))
    assert listing.returncode == 0 and "c128patch apply --abort: work in progress" in listing.stdout
    assert git.out("show", "refs/stash^3:notes.txt") == "my notes"  # the untracked file, kept
    assert git.current_branch() == "main" and git.status_porcelain() == []


# ---------------------------------------------------------------------------- 3. one operation per repository
def test_a_second_apply_refuses_while_one_runs(tree, series, tmp_path):
    ready, go = tmp_path / "ready", tmp_path / "go"
    hook = tmp_path / "fault-hooks" / "pre-applypatch"  # holds the first apply inside its git am
    hook.parent.mkdir()
    hook.write_text(f"#!/bin/sh\ntouch {ready}\nwhile [ ! -e {go} ]; do sleep 0.05; done\n")
    hook.chmod(0o755)
    first = subprocess.Popen([sys.executable, "-m", "c128patch", *map(str, apply_args(tree, series))],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_signals,
                             env={**os.environ, FAULT_HOOKS_ENV: str(hook.parent)})  # the tool's git runs no other hook
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert time.monotonic() < deadline and first.poll() is None, first.communicate()
            time.sleep(0.05)
        refused(apply_args(tree, series, "--branch", "other"),
                contains=f"another c128patch apply is running in {tree} (pid {first.pid}); wait for it to finish")
        status = invoke("status", "--tree", tree, as_json=False)
        assert f"a c128patch apply is running (pid {first.pid}" in status.text
        go.touch()
        assert first.wait(timeout=120) == 0, first.communicate()
    finally:
        go.touch()
        if first.poll() is None:
            first.kill()
    git = Git(worktree=tree)
    assert git.rev_parse("refs/heads/other") is None and git.current_branch() == "c128/v0.5.22"


def test_a_lock_left_by_a_dead_process_is_taken_over(tree, series):
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tree / ".git" / "c128patch.lock").write_text(json.dumps({"action": "rebase", "pid": dead.pid, "since": "then"}))
    res = invoke(*apply_args(tree, series), as_json=False)
    assert res.code == 0, res.err
    assert f"took over the lock {tree}/.git/c128patch.lock of c128patch rebase (pid {dead.pid}, since then), " \
           "which is no longer running" in res.err
    assert (tree / ".git" / "c128patch.lock").read_text() == ""  # released


@pytest.mark.parametrize("kind", ["link", "dangling", "fifo"])
def test_a_repository_lock_that_is_a_link_or_a_pipe_is_never_used(tree, series, tmp_path, kind):
    # helper 166: `.git/c128patch.lock` a link to ~/.bashrc had apply truncate it (JSON written, then emptied), a
    # dangling one made its target, a FIFO gave an OSError traceback; `status` read through the link
    victim, lock = tmp_path / "victim", tree / ".git" / "c128patch.lock"
    if kind == "fifo":
        os.mkfifo(lock)
    else:
        if kind == "link":
            victim.write_text("precious\n")
        lock.symlink_to(victim)
    line = refused(apply_args(tree, series), tree, f"the lock {lock} is not a regular file")
    assert (victim.read_text() == "precious\n") if kind == "link" else not victim.exists()
    assert "a c128patch" not in invoke("status", "--tree", tree, as_json=False).text
    fix = line.split("remove it (", 1)[1].split(") and run again")[0]
    assert subprocess.run(fix, shell=True).returncode == 0  # the fix as printed
    assert invoke(*apply_args(tree, series), as_json=False).code == 0


def test_a_rerun_after_an_interrupted_apply_names_both_ways_out(tree, series):
    assert cli_process(apply_args(tree, series), {"C128PATCH_FAULT": "kill-before:test-overlay"}).returncode == -9
    line = refused(apply_args(tree, series), tree, "a c128patch apply was interrupted in")
    assert f"c128patch apply --continue --tree {tree}" in line and f"c128patch apply --abort --tree {tree}" in line


# ---------------------------------------------------------------------------- 5. printed commands are safe to paste
def test_a_printed_branch_delete_is_safe_to_paste(tree, series, tmp_path):
    branch = "x;touch${IFS}PWNED"  # a valid ref name
    git = Git(worktree=tree)
    git.run("branch", branch, "v0.5.20")
    line = refused(apply_args(tree, series, "--branch", branch), tree, "already exists")
    assert "branch -D 'x;touch${IFS}PWNED'" in line
    done = run_printed(printed_command(line, "git -C"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "PWNED").exists() and git.rev_parse(f"refs/heads/{branch}") is None
    assert invoke(*apply_args(tree, series, "--branch", branch), as_json=False).code == 0


def test_an_existing_checked_out_branch_gets_a_fix_that_works(tree, series):
    git = Git(worktree=tree)
    git.run("checkout", "--quiet", "-b", "c128/v0.5.22")
    line = refused(apply_args(tree, series), tree, "already exists")
    assert "is checked out" in line
    done = run_printed(printed_command(line, "git -C"))
    assert done.returncode == 0, done.stderr
    assert invoke(*apply_args(tree, series), as_json=False).code == 0


def test_paths_with_shell_characters_are_quoted(sglang_release_repo, tmp_path, series):
    git = small_clone(sglang_release_repo, tmp_path / "my tree $(touch PWNED)")
    tree = git.worktree
    (tree / "notes.txt").write_text("mine\n")
    line = refused(apply_args(tree, series), tree, "uncommitted changes (notes.txt)")
    done = run_printed(printed_command(line, "git -C"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "PWNED").exists() and "notes.txt" in git.out("stash", "show", "--include-untracked",
                                                                           "--name-only")
    assert invoke(*apply_args(tree, series), as_json=False).code == 0


def test_the_next_step_a_rebase_prints_works(tree, series):
    assert invoke(*apply_args(tree, series), as_json=False).code == 0
    res = invoke("rebase", "--onto", "v0.5.23", "--tree", tree, "--series", series, as_json=False)
    assert res.code == 0, res.err
    done = run_printed(printed_command(res.text.split("; next: ", 1)[1], "c128patch refresh"))
    assert done.returncode == 0, done.stderr
    assert "series test" in done.stdout  # the series the rebase used, not the one this tool carries


def test_a_dirty_tree_refusal_names_whole_paths(tree, series):
    target = tree / CUH
    target.write_text(target.read_text() + "// mine\n")
    refused(apply_args(tree, series), tree, f"has uncommitted changes ({CUH})")


# ---------------------------------------------------------------------------- 6. where the user's work went
def test_apply_from_a_detached_head_with_a_local_commit_says_where_it_went(tree, series):
    git = Git(worktree=tree)
    git.run("checkout", "--quiet", "--detach")
    (tree / CUH).write_text((tree / CUH).read_text() + "// my local work\n")
    git.run("commit", "--quiet", "-am", "my local work")
    mine = git.head()
    res = invoke(*apply_args(tree, series), as_json=False)
    assert res.code == 0, res.err
    note = res.text.split("note: HEAD was detached", 1)[1]
    assert note.startswith(f" at {mine[:12]} with 1 commit(s) that no branch holds; "
                           "they are kept at refs/c128patch/recovery/")
    done = run_printed(printed_command(note, "git -C"))
    assert done.returncode == 0, done.stderr
    assert git.rev_parse(f"c128patch-saved-{mine[:8]}") == mine
    status = invoke("status", "--tree", tree, "--json").out
    assert [r["commit"] for r in status["recovery_refs"]] == [mine]
    assert "recovery refs (where HEAD was before an apply or rebase" in invoke("status", "--tree", tree,
                                                                               as_json=False).text


# ---------------------------------------------------------------------------- 7. no tracebacks for bad input
@pytest.fixture
def rebase_journal_left(tree: Path, series: Path) -> Git:
    """A rebase 0.5.22 -> 0.5.23 of the test series, killed between its two entries."""
    git = Git(worktree=tree)
    assert invoke(*apply_args(tree, series), as_json=False).code == 0
    proc = cli_process(["rebase", "--onto", "v0.5.23", "--tree", tree, "--series", series],
                       {"C128PATCH_FAULT": "kill-before:test-overlay"})
    assert proc.returncode == -9
    return git


@pytest.mark.parametrize("damage", ["truncated", "wrong-type", "list"])
def test_a_damaged_rebase_journal_is_one_line_with_the_way_out(rebase_journal_left, series, damage):
    git = rebase_journal_left
    path = rebase_journal(git)
    text = path.read_text()
    path.write_text({"truncated": text[: len(text) // 2], "wrong-type": text.replace('"pos": 1', '"pos": "one"'),
                     "list": "[]"}[damage])
    for args in (["status"], ["rebase", "--continue"], ["rebase", "--abort"]):
        line = refused([*args, "--tree", git.worktree], git.worktree,
                       f"cannot read the c128patch rebase journal {path}")
    assert f"rm -f {path}" in line and "git -C" not in line  # HEAD never left the branch: nothing to check out
    assert run_printed(printed_command(line, "rm -f")).returncode == 0
    status = invoke("status", "--tree", git.worktree, "--series", series, as_json=False)
    assert git.current_branch() == "c128/v0.5.22" and status.code == 0, status.text  # the branch equals the series


def test_a_truncated_apply_journal_is_one_line_with_the_way_out(tree, series):
    git = Git(worktree=tree)
    assert cli_process(apply_args(tree, series), {"C128PATCH_FAULT": "kill-before:test-overlay"}).returncode == -9
    path = apply_journal(git)
    path.write_text(path.read_text()[:100])
    for args in (["status"], ["apply", "--continue"], ["apply", "--abort"]):
        line = refused([*args, "--tree", tree], tree, f"cannot read the c128patch apply journal {path}")
    assert run_printed(printed_command(line, "rm -f")).returncode == 0
    assert run_printed(printed_command(line, "git -C")).returncode == 0
    assert git.current_branch() == "main"


@pytest.mark.parametrize("record, why", [("[]", "a JSON list, not an object"),
                                         ('{"entries": 5}', "'entries' is not a list"),
                                         ('{"entries": [{"name": "x", "kind": "overlay", "target": "../../etc"}]}',
                                          "has no target inside the tree"),
                                         ("{not json", "not valid JSON")],
                         ids=["list", "entries-5", "target-outside", "not-json"])
def test_a_damaged_provenance_record_is_one_line_with_the_way_back(tree, series, record, why):
    assert invoke(*apply_args(tree, series), as_json=False).code == 0
    (tree / PROVENANCE_PATH).write_text(record)
    for args in (["status", "--tree", tree], ["refresh", "--tree", tree, "--series", series, "--check"]):
        line = refused(args, tree, why)
    done = run_printed(printed_command(line, "git -C"))  # restore it
    assert done.returncode == 0, done.stderr
    assert invoke("status", "--tree", tree, "--series", series, as_json=False).code == 0  # the tree equals the series


@pytest.mark.parametrize("record", ["[]", "\udcff{"], ids=["list", "not-utf8"])
def test_a_committed_damaged_provenance_record_is_one_line(tree, series, record):
    """HEAD commits the damage; rebase refuses before it starts. The fix it printed was "apply the series again
    (c128patch apply) on a new branch", which fails as printed (no --sglang-rev; helper 164): the commit below holds
    the good record, and the line says the command that restores it from there, which works as printed."""
    assert invoke(*apply_args(tree, series), as_json=False).code == 0
    good = Git(worktree=tree).head()
    (tree / PROVENANCE_PATH).write_bytes(record.encode("utf-8", "surrogateescape"))
    Git(worktree=tree).run("commit", "-qam", "damage")
    why = "not a c128patch provenance record (a JSON list, not an object)" if record == "[]" else "not UTF-8"
    line = refused(["rebase", "--onto", "v0.5.23", "--tree", tree, "--series", series], tree, why)
    assert f"HEAD holds the same; commit {good[:12]} holds a good record: restore it from there" in line, line
    done = run_printed(printed_command(line, "git -C"))
    assert done.returncode == 0, done.stderr
    assert invoke("status", "--tree", tree, "--series", series, as_json=False).code == 1  # read: the change uncommitted


def test_a_damaged_provenance_record_no_commit_holds_good_says_to_apply_again(tree, series):
    """No commit of HEAD's history holds a good record: the line says to apply the series again."""
    assert invoke(*apply_args(tree, series), as_json=False).code == 0
    git = Git(worktree=tree)
    (tree / PROVENANCE_PATH).write_text("[]")
    git.run("commit", "-q", "--amend", "-a", "--no-edit")  # the provenance commit itself holds the damage
    line = refused(["status", "--tree", tree, "--series", series], None, "a JSON list, not an object")
    assert "HEAD holds the same and no commit below it a good record: apply the series again" in line, line


@pytest.mark.parametrize("edit, why", [
    (lambda t: t.replace('version = "1"', 'version = "1"\n# caf\xe9'), None),
    (lambda t: 'entries = 5\n[series]\nname = "test"\nversion = "1"\n',
     "'entries' must be an array of tables ([[entries]]), not an integer"),
    (lambda t: t.replace('name = "test-patch"', "name = true"), "'name' must be a string, not a boolean"),
    (lambda t: t.replace('file = "0001-test.patch"', 'file = "0001-test.patch"\nvariants = 5'),
     "'variants' must be an array of tables, not an integer"),
], ids=["latin-1", "entries-5", "name-true", "variants-5"])
def test_a_manifest_of_the_wrong_shape_is_one_line(series, edit, why):
    manifest = series / "patches" / "series.toml"
    text = edit(manifest.read_text())
    if why is None:  # not UTF-8
        manifest.write_bytes(text.encode("latin-1"))
        why = "not UTF-8 (byte 0xe9 at offset"
    else:
        manifest.write_text(text)
    refused(["check", "--sglang-rev", "v0.5.23", "--series", series], contains=why)
    refused(["lint", "--offline", "--series", series], contains=why)


def test_an_unwritable_cache_folder_says_how_to_move_it(series, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    for env, folder in (({"C128PATCH_CACHE": str(afile / "cache")}, afile / "cache"),
                        ({"C128PATCH_CACHE": None, "XDG_CACHE_HOME": None, "HOME": str(afile)},
                         afile / ".cache" / "c128patch")):
        res = invoke("check", "--sglang-rev", "v0.5.23", "--series", series, env=env, as_json=False)
        assert res.code == 2 and res.err.strip() == (
            f"c128patch: error: cannot write the cache folder {folder} (Not a directory); set C128PATCH_CACHE to a "
            "writable folder (export C128PATCH_CACHE=/path/to/cache)")


@pytest.mark.parametrize("name", ["cache", "-cache"])
def test_a_relative_cache_folder_is_the_cache_not_a_corrupt_one(series, sglang_release_repo, tmp_path, monkeypatch,
                                                                name):
    """Helper 159: ``C128PATCH_CACHE=cache`` (relative) named a sound cache "corrupt" (git ran in other folders, where
    the name meant nothing) and printed ``rm -rf cache/sglang-releases.git``, which deleted it; ``-cache`` made that
    rm's word an option. The folder is taken as it stands from the current one."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / name).symlink_to(sglang_release_repo.parent)
    res = invoke("check", "--sglang-rev", "v0.5.23", "--series", series, env={"C128PATCH_CACHE": name},
                 as_json=False)
    assert res.code == 0, res.err


@pytest.mark.parametrize("args", [
    ["wheel", "--from-release", "0.5.23", "-o", "afile/sub"],
    ["build", "--sglang-rev", "v0.5.23", "-o", "afile/sub"],
    ["rebase", "--continue", "--report", "afile/sub", "--tree", "."],
    ["smoke", "kernel", "--out", "afile/sub"],
], ids=["wheel", "build", "rebase", "smoke"])
def test_an_output_folder_under_a_file_is_refused_before_any_work(tree, tmp_path, monkeypatch, args):
    monkeypatch.chdir(tree)
    (tree / "afile").write_text("a file\n")
    started = time.monotonic()
    refused(args, tree, "-o afile/sub: afile is a file, not a folder" if "-o" in args else "afile/sub: afile is a file")
    assert time.monotonic() - started < 5  # refused up front: no wheel read, no clone, no build


def test_an_absurd_rev_is_one_line(series, tree):
    rev = "v0.5." + "9" * 5000
    line = refused(["check", "--sglang-rev", rev, "--series", series], contains="unknown rev 'v0.5.999")
    assert "(5005 characters)" in line and len(line) < 300
    refused(["apply", "--sglang-rev", rev, "--repo", tree, "--series", series], tree, "unknown rev")


def test_a_stale_index_lock_is_named_with_its_fix(tree, series):
    lock = tree / ".git" / "index.lock"
    lock.write_text("")
    line = refused(apply_args(tree, series), tree, f"{lock} exists: another git process is running in this "
                                                   "repository, or one was killed")
    done = run_printed(printed_command(line, "rm -f"))
    assert done.returncode == 0 and not lock.exists()
    assert invoke(*apply_args(tree, series), as_json=False).code == 0


def test_git_names_a_lock_file_it_cannot_take(tree):
    """Where git itself hits a lock (here a ref's), the message names the file, not "remove the file manually"."""
    lock = tree / ".git" / "refs" / "heads" / "main.lock"
    lock.write_text("")
    with pytest.raises(C128Error, match=f"{lock} exists: .* remove it \\(rm -f {lock}\\)"):
        Git(worktree=tree).run("update-ref", "refs/heads/main", "v0.5.22")
    assert os.path.exists(lock)


def test_a_subject_holding_unicode_line_separators_is_one_commit(tree, series):
    """Helper 93: a commit whose subject holds U+2028 made status and refresh --check fail with a traceback:
    ``str.splitlines`` cut its log record in two. git's records are split at "\\n" only."""
    assert invoke("apply", "--sglang-rev", "v0.5.23", "--repo", tree, "--series", series).code == 0
    git = Git(worktree=tree)
    (tree / CUH).write_text((tree / CUH).read_text() + "// mine\n")
    git.run("-c", "user.name=u", "-c", "user.email=u@example.invalid", "commit", "-qam",
            "mine\u2028second\x1cthird\x85fourth")
    status = invoke("status", "--tree", tree, "--series", series)
    assert status.code == 1 and status.out["commits_since"] == 1, (status.err, status.out)
    check = invoke("refresh", "--check", "--tree", tree, "--series", series)
    assert check.code in (0, 1) and "Traceback" not in check.err and "error" not in check.out, (check.err, check.out)


def test_a_small_address_space_reads_the_series_and_running_out_is_one_line(tmp_path, monkeypatch):
    """Helper 139: under ``ulimit -v`` each read of a patch took 64 MiB first (``read(MAX_SERIES_FILE + 1)``): apply
    under ~100 MB died of MemoryError with a traceback, rebase under 200 MB of "can't start new thread". A patch is
    read in pieces; memory or threads running out anywhere else is one line, exit 2."""
    import resource
    import textwrap

    from c128patch.series import manifest

    script = textwrap.dedent(f"""
        import resource, sys
        from c128patch.series.manifest import read_series_file
        size = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (size + (24 << 20), resource.getrlimit(resource.RLIMIT_AS)[1]))
        sys.stdout.write(str(len(read_series_file(__import__("pathlib").Path({str(REPO_ROOT / "patches")!r}) /
                                                  "0001-c128-plan-zero-rows.patch"))))
        """)
    if resource.getrlimit(resource.RLIMIT_AS)[1] != resource.RLIM_INFINITY:
        pytest.skip("an address-space limit is already set")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and int(proc.stdout) > 0, proc.stderr[-300:]

    def starved(path):
        raise MemoryError

    monkeypatch.setattr(manifest, "read_series_file", starved)
    monkeypatch.setattr(manifest, "sha256_file", starved)
    res = invoke("lint", "--offline", "--series", REPO_ROOT, as_json=False)
    (line,) = res.err.strip().splitlines()
    assert res.code == 2 and line.startswith("c128patch: error: out of memory"), res.err

    def no_thread(path):  # rebase's range-diff thread under ulimit -v 200000: a traceback
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(manifest, "read_series_file", no_thread)
    monkeypatch.setattr(manifest, "sha256_file", no_thread)
    res = invoke("lint", "--offline", "--series", REPO_ROOT, as_json=False)
    (line,) = res.err.strip().splitlines()
    assert res.code == 2 and line.startswith("c128patch: error: out of memory or threads"), res.err


def test_an_environment_that_leaves_no_room_for_a_child_is_one_line(monkeypatch):
    """Helper 139: an environment near the system's limit (2 MiB of variables) left git, started with the tool's
    own settings and variables added, no room: ``OSError: [Errno 7] Argument list too long`` and a traceback."""
    import errno

    def too_big(*args, **kw):
        raise OSError(errno.E2BIG, "Argument list too long", "/usr/bin/git")

    monkeypatch.setattr(subprocess, "run", too_big)
    res = invoke("lint", "--series", REPO_ROOT, as_json=False)
    (line,) = res.err.strip().splitlines()
    assert res.code == 2 and line.startswith("c128patch: error: cannot start /usr/bin/git: Argument list too long "
                                             "(the environment holds "), res.err


@pytest.mark.parametrize("args", [["lint", "--offline", "--series", "LONG"], ["check", "--repo", "LONG"],
                                  ["apply", "--tree", "LONG", "--sglang-rev", "v0.5.23"], ["lint", "--offline"]],
                         ids=["series", "repo", "tree", "env-series"])
def test_a_folder_given_whose_name_is_too_long_is_one_line(tmp_path, monkeypatch, args):
    """Helper 168: a folder given (``--series``, ``--repo``, ``apply --tree``, ``$C128PATCH_SERIES``) with a part over
    255 bytes was OSError's "File name too long" traceback, wherever it was first looked at."""
    long = str(tmp_path / ("a" * 300))
    if args == ["lint", "--offline"]:
        monkeypatch.setenv("C128PATCH_SERIES", long)
    res = invoke(*[long if a == "LONG" else a for a in args], as_json=False)
    (line,) = res.err.strip().splitlines()
    assert res.code == 2 and line.startswith("c128patch: error: a path is too long for the file system (File name "
                                             "too long): "), res.err


@pytest.mark.parametrize("stop", ["e2big", "memory", "threads"])
def test_a_run_stopped_by_its_limits_prints_its_json_error_object(monkeypatch, stop):
    """Helper 159: ``wheel --json`` under ``ulimit -v 200000`` (and an E2BIG, a thread limit) exited 2 with its line on
    stderr and nothing on stdout: every --json run prints one object (docs/schemas/README.md)."""
    import errno

    from c128patch.series import manifest

    raised = {"e2big": OSError(errno.E2BIG, "Argument list too long", "/usr/bin/git"), "memory": MemoryError(),
              "threads": RuntimeError("can't start new thread")}[stop]

    def stopped(*args, **kw):
        raise raised

    monkeypatch.setattr(manifest, "read_series_file", stopped)
    monkeypatch.setattr(manifest, "sha256_file", stopped)
    res = invoke("lint", "--offline", "--series", REPO_ROOT)
    (line,) = res.err.strip().splitlines()
    assert res.code == 2 and res.out.get("ok") is False and line == f"c128patch: error: {res.out['error']}", res


# git commands whose output carries upstream's names or subjects (a tag, a ref, a subject may hold U+2028 or NEL)
NAMED_OUTPUT = {"tag", "for-each-ref", "log", "branch", "show-ref", "ls-remote", "rev-list", "show", "describe",
                "range-diff", "shortlog", "cherry", "blame"}  # (blame --porcelain: each commit's summary and author)


def splitlines_of_named_output(source: str) -> list[str]:
    """Calls ``X.out(CMD, ...).splitlines()`` / ``X.run(CMD, ...).stdout.splitlines()`` with CMD in NAMED_OUTPUT (a
    ``rev-list`` of ids only is listed too: it takes ``--format``)."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "splitlines"):
            continue
        inner = node.func.value.value if isinstance(node.func.value, ast.Attribute) else node.func.value
        if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) and inner.func.attr in ("out", "run") \
                and inner.args and isinstance(inner.args[0], ast.Constant) and inner.args[0].value in NAMED_OUTPUT:
            found.append(ast.unparse(node))
    return found


def test_git_output_carrying_upstreams_names_is_split_at_newlines_only():
    """``str.splitlines`` cuts at U+2028, U+2029, NEL and \\x1c-\\x1e, which a tag, a branch or a subject may hold:
    status's recovery refs (a KeyError, helper 164) and base_label's tags (a base that is no tag) were cut so.
    ``Git.lines`` splits git's records at "\\n" only; this walks the code for the other way."""
    root = REPO_ROOT / "tooling" / "c128patch"
    found = {str(p.relative_to(root)): hits for p in sorted(root.rglob("*.py"))
             if (hits := splitlines_of_named_output(p.read_text()))}
    assert found == {}
    assert splitlines_of_named_output('git.out("tag", "--points-at", c).splitlines()\n'
                                      'g.run("log", x).stdout.splitlines()\ngit.out("ls-files").splitlines()\n') == [
        "git.out('tag', '--points-at', c).splitlines()", "g.run('log', x).stdout.splitlines()"]


def test_rebases_range_diff_keeps_a_subject_holding_a_line_separator_whole(tmp_path):
    """Helper 164: range_diff_of split range-diff's output with ``str.splitlines``: a subject's U+2028 cut its line,
    and the part after it (no ``N:`` at its start) was dropped from the report."""
    from types import SimpleNamespace

    from c128patch.git import Git
    from c128patch.ops.rebase_report import range_diff_of

    git = Git(tmp_path)
    git.run("init", "-q")
    ident = ("-c", "user.name=u", "-c", "user.email=u@x.invalid")

    def commit(name: str, message: str) -> str:
        (tmp_path / name).write_text(name)
        git.run("add", name)
        git.run(*ident, "commit", "-q", "-m", message)
        return git.out("rev-parse", "HEAD")

    base = commit("a", "base")
    ours = commit("b", "one\u2028two")
    git.run("checkout", "-q", base)
    onto = commit("c", "upstream")
    git.run(*ident, "cherry-pick", ours)
    lines = range_diff_of(git, SimpleNamespace(old_commit=base, orig_head=ours, onto_commit=onto),
                          git.out("rev-parse", "HEAD"))
    assert len(lines) == 1 and lines[0].endswith("one\u2028two"), lines
