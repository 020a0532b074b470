"""Fault injection: ``apply`` and ``rebase`` killed (SIGKILL) or interrupted (SIGINT, as Ctrl-C to the
terminal's process group) at each phase, on the real release history. After every interruption the
commands the tool prints (or ``status`` prints, after a SIGKILL) are pasted into a shell, and both
ways out end in the right state: ``--continue`` gives exactly the commits an uninterrupted run gives;
``--abort`` gives back the tree, refs and HEAD exactly as they were.

The interruptions come from two places: ``C128PATCH_FAULT`` points in the tool (ops.treestate: between
steps, after a commit the journal does not list yet, with the provenance file written but not
committed, right after a fresh clone, inside a rebase's stop, after the rebased branch moved) and
git hooks that signal the whole process group from inside git itself (during ``git am``; during the
checkout that finishes a rebase). Patches carrying their entry trailer go in as a run, one ``git am``:
killed inside it or stopped at one of its entries, the way out is the same.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from c128patch.git import FAULT_HOOKS_ENV, Git
from c128patch.ops.lint import update_hashes
from c128patch.ops.rebase_journal import Journal
from c128patch.ops.treestate import apply_journal, rebase_journal
from c128patch.series.manifest import load_series
from support import cli_process, invoke, make_test_series, printed_command, run_printed, small_clone, snapshot

CUH = "python/sglang/kernels/jit/csrc/deepseek_v4/c128_online_v2.cuh"
EDIT = {CUH: ("    const uint32_t prefix_len = seq_len - extend_len;\n",
              "    const uint32_t prefix_len = seq_len - extend_len;  // c128patch test\n")}
SIGNALS = {"kill": ("KILL", -9), "sigint": ("INT", 130)}

# where: (how the fault is made, its spec). A "hook:NAME" fault is a git hook signalling the group.
APPLY_PHASES = {
    "before-first-entry": "before:test-patch",
    "during-git-am": "hook:pre-applypatch",
    "after-entry-commit": "after:test-patch",
    "between-entries": "before:test-overlay",
    "after-overlay-commit": "after:test-overlay",
    "provenance-written": "at:provenance",
    "provenance-committed": "after:provenance",
}
FRESH_PHASES = {"after-clone": "at:clone", "checkout-in-fresh-tree": "at:apply-checkout",
                "first-entry-in-fresh-tree": "before:test-patch"}
REBASE_PHASES = {
    "between-entries": "before:test-overlay",
    "finishing-checkout": "hook:post-checkout",  # the new tip checked out, the branch not moved yet
    "branch-moved": "after:rebase-branch",
}


@pytest.fixture(scope="module")
def series(sglang_release_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One series for the module, so that every run (and the reference runs) applies the same bytes."""
    return make_test_series(tmp_path_factory.mktemp("faults") / "series", sglang_release_repo, EDIT)


@pytest.fixture(scope="module")
def upstream(sglang_release_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The releases v0.5.22 and v0.5.23 (tags, v0.5.22 the parent) holding only the folder the series edits: what
    ``apply --tree`` clones and checks out whole in the fresh-tree cases (the real tree is 20k files)."""
    dest = tmp_path_factory.mktemp("upstream") / "sglang.git"
    git = Git(git_dir=sglang_release_repo).with_env(GIT_INDEX_FILE=str(dest.parent / "index"))
    subprocess.run(["git", "init", "--quiet", "--bare", str(dest)], check=True)
    folder, parent = CUH.rsplit("/", 1)[0], []
    for tag in ("v0.5.22", "v0.5.23"):
        git.run("read-tree", "--empty")
        git.run("update-index", "--index-info", input=git.out("ls-tree", "-r", tag, "--", folder) + "\n")
        commit = git.out("commit-tree", git.out("write-tree"), *parent, "-m", f"sglang {tag}: {folder} alone")
        git.run("push", "--quiet", str(dest), f"{commit}:refs/tags/{tag}")
        parent = ["-p", commit]
    return dest


@pytest.fixture(scope="module")
def reference(sglang_release_repo: Path, upstream: Path, series: Path, tmp_path_factory: pytest.TempPathFactory
              ) -> dict[str, str]:
    """HEAD after uninterrupted runs: apply v0.5.22; apply into a fresh tree (of ``upstream``); that apply rebased
    onto v0.5.23. The local clone applied at v0.5.22 is kept (``applied`` copies it)."""
    root = tmp_path_factory.mktemp("reference")
    git = small_clone(sglang_release_repo, root / "local")
    assert invoke("apply", "--sglang-rev", "v0.5.22", "--repo", git.worktree, "--series", series,
                  as_json=False).code == 0
    subprocess.run(["cp", "-a", str(git.worktree), str(root / "applied")], check=True)
    fresh = root / "fresh"
    assert invoke("apply", "--sglang-rev", "v0.5.22", "--repo", upstream, "--tree", fresh,
                  "--series", series, as_json=False).code == 0
    applied = git.head()
    res = invoke("rebase", "--onto", "v0.5.23", "--tree", git.worktree, "--series", series, as_json=False)
    assert res.code == 0, res.err
    return {"apply": applied, "fresh": Git(worktree=fresh).head(), "rebase": git.head(),
            "applied": str(root / "applied")}


def hook(tree: Path, name: str, sig: str) -> Path:
    """A git hook that sends ``sig`` to its whole process group: git and the c128patch that runs it
    (in a folder of its own, which C128PATCH_FAULT_HOOKS names: the tool's git runs no other hook)."""
    path = tree.parent / f"{tree.name}-fault-hooks" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\nkill -{sig} -$(ps -o pgid= $$ | tr -d ' ')\nsleep 5\n")
    path.chmod(0o755)
    return path


def interrupt(args: list, tree: Path, fault: str, how: str) -> subprocess.CompletedProcess:
    """Run the CLI with the fault; assert it died of it (SIGKILL) or stopped at it (SIGINT, exit 130)."""
    sig, code = SIGNALS[how]
    env = {}
    made = None
    if fault.startswith("hook:"):
        made = hook(tree, fault.removeprefix("hook:"), sig)
        env[FAULT_HOOKS_ENV] = str(made.parent)
    else:
        env["C128PATCH_FAULT"] = f"{how}-{fault}"
    proc = cli_process(args, env)
    if made:
        made.unlink()
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    if how == "sigint":
        assert "interrupted (SIGINT): the" in proc.stderr and "journal is intact" in proc.stderr, proc.stderr
    return proc


def way_out(proc: subprocess.CompletedProcess, tree: Path, verb: str, kind: str) -> str:
    """The command that resumes (``continue``) or undoes (``abort``): from the tool's own message after a
    Ctrl-C; from ``status`` after a SIGKILL (which prints nothing)."""
    if proc.returncode == 130:
        return printed_command(proc.stderr, f"c128patch {kind} --{verb}")
    res = invoke("status", "--tree", tree, as_json=False)
    assert res.code == 1, res.err  # stopped half way: the tree does not equal the series
    if kind == "apply":
        assert re.search(r"an apply (was interrupted|stopped at a conflict) after entry \d of 2", res.text), res.text
    else:
        assert re.search(r"c128patch rebase v0.5.22 -> \S+ in progress, \d/2 entries done", res.text), res.text
    label = "resume:" if verb == "continue" else "undo:"
    return res.text.split(label, 1)[1].splitlines()[0].strip()


def assert_nothing_in_progress(git: Git) -> None:
    for name in ("rebase-apply", "CHERRY_PICK_HEAD", "sequencer", "index.lock"):
        assert not (git.worktree / ".git" / name).exists(), name
    assert not apply_journal(git).exists() and not rebase_journal(git).exists()
    assert git.status_porcelain() == []


# ---------------------------------------------------------------------------- apply
@pytest.mark.parametrize("how", SIGNALS)
@pytest.mark.parametrize("phase", APPLY_PHASES)
def test_interrupted_apply_resumes_to_the_uninterrupted_result(sglang_release_repo, series, reference, tmp_path,
                                                               phase, how):
    git = small_clone(sglang_release_repo, tmp_path / "t")
    proc = interrupt(["apply", "--sglang-rev", "v0.5.22", "--repo", git.worktree, "--series", series],
                     git.worktree, APPLY_PHASES[phase], how)
    done = run_printed(way_out(proc, git.worktree, "continue", "apply"))
    assert done.returncode == 0, done.stderr
    assert git.head() == reference["apply"] and git.current_branch() == "c128/v0.5.22"
    assert git.rev_parse("main") == git.rev_parse("v0.5.23")
    assert_nothing_in_progress(git)


@pytest.mark.parametrize("how", SIGNALS)
@pytest.mark.parametrize("phase", APPLY_PHASES)
def test_interrupted_apply_aborts_to_the_tree_as_it_was(sglang_release_repo, series, tmp_path, phase, how):
    git = small_clone(sglang_release_repo, tmp_path / "t")
    before = snapshot(git.worktree)
    proc = interrupt(["apply", "--sglang-rev", "v0.5.22", "--repo", git.worktree, "--series", series],
                     git.worktree, APPLY_PHASES[phase], how)
    done = run_printed(way_out(proc, git.worktree, "abort", "apply"))
    assert done.returncode == 0, done.stderr
    assert "apply aborted" in done.stdout and "is back on main" in done.stdout
    assert snapshot(git.worktree) == before  # refs (no new branch, no recovery ref), HEAD, index, files
    assert_nothing_in_progress(git)


@pytest.mark.parametrize("how", SIGNALS)
@pytest.mark.parametrize("phase", FRESH_PHASES)
def test_interrupted_apply_into_a_fresh_tree_resumes(upstream, series, reference, tmp_path, phase, how):
    tree = tmp_path / "fresh"
    proc = interrupt(["apply", "--sglang-rev", "v0.5.22", "--repo", upstream, "--tree", tree,
                      "--series", series], tree, FRESH_PHASES[phase], how)
    done = run_printed(way_out(proc, tree, "continue", "apply"))
    assert done.returncode == 0, done.stderr
    git = Git(worktree=tree)
    assert git.head() == reference["fresh"] and git.current_branch() == "c128/v0.5.22"
    assert_nothing_in_progress(git)


@pytest.mark.parametrize("how", SIGNALS)
@pytest.mark.parametrize("phase, existed", [(p, False) for p in FRESH_PHASES] + [("after-clone", True)],
                         ids=[*FRESH_PHASES, "after-clone-into-an-empty-folder"])
def test_interrupted_apply_into_a_fresh_tree_aborts_to_no_clone(upstream, series, tmp_path, phase, how, existed):
    tree = tmp_path / "fresh"
    if existed:
        tree.mkdir()
    proc = interrupt(["apply", "--sglang-rev", "v0.5.22", "--repo", upstream, "--tree", tree,
                      "--series", series], tree, FRESH_PHASES[phase], how)
    done = run_printed(way_out(proc, tree, "abort", "apply"))
    assert done.returncode == 0, done.stderr
    assert f"the clone {tree} it made was removed" in done.stdout
    assert tree.is_dir() == existed and (not existed or not any(tree.iterdir()))


# ---------------------------------------------------------------------------- rebase
@pytest.fixture
def applied(reference: dict[str, str], tmp_path: Path) -> Git:
    """A copy (cp -a) of the local clone ``reference`` applied at v0.5.22."""
    subprocess.run(["cp", "-a", reference["applied"], str(tmp_path / "t")], check=True)
    git = Git(worktree=tmp_path / "t")
    assert git.head() == reference["apply"] and git.current_branch() == "c128/v0.5.22"
    return git


@pytest.mark.parametrize("how", SIGNALS)
@pytest.mark.parametrize("phase", REBASE_PHASES)
def test_interrupted_rebase_resumes_to_the_uninterrupted_result(applied, series, reference, phase, how):
    git = applied
    proc = interrupt(["rebase", "--onto", "v0.5.23", "--tree", git.worktree, "--series", series], git.worktree,
                     REBASE_PHASES[phase], how)
    done = run_printed(way_out(proc, git.worktree, "continue", "rebase") + " --json")
    assert done.returncode == 0, done.stderr
    assert git.head() == reference["rebase"] and git.current_branch() == "c128/v0.5.23"  # named after its new base
    assert "resolved by hand" not in done.stdout  # an interrupted pick is picked again, not "resolved"
    assert_nothing_in_progress(git)


@pytest.mark.parametrize("how", SIGNALS)
@pytest.mark.parametrize("phase", [p for p in REBASE_PHASES if p != "branch-moved"])
def test_interrupted_rebase_aborts_to_the_branch_as_it_was(applied, series, phase, how):
    git = applied
    before = snapshot(git.worktree)
    proc = interrupt(["rebase", "--onto", "v0.5.23", "--tree", git.worktree, "--series", series], git.worktree,
                     REBASE_PHASES[phase], how)
    done = run_printed(way_out(proc, git.worktree, "abort", "rebase"))
    assert done.returncode == 0, done.stderr
    after = snapshot(git.worktree)
    mine = lambda s: [r for r in s["refs"].splitlines() if "refs/c128patch/recovery" not in r]  # noqa: E731
    assert mine(after) == mine(before) and after["head"] == before["head"] and after["status"] == before["status"]
    assert_nothing_in_progress(git)


def half_a_checkout(git: Git, target: str) -> list[str]:
    """What a ``git checkout`` killed inside it leaves: half of the paths that differ from ``target`` written as
    ``target`` has them (a new file untracked, a file it lacks removed), the last file it wrote cut short after
    half its bytes, the one after removed but not written yet; HEAD and the index not moved."""
    rows = [line.split("\t") for line in git.out("diff", "--name-status", "--no-renames", "HEAD", target).splitlines()]
    added = [path for status, path in rows if status == "A"]
    assert added, "the new tip adds no file: a cut checkout would leave nothing untracked"
    present = [row for row in rows if row[0] != "A" and (git.worktree / row[1]).exists()]  # (a sparse clone)
    done = present[: len(present) // 2] + [["A", added[0]]]
    cut, unwritten = [path for status, path in present[len(done):] if status == "M"][:2]
    for status, path in done:
        file = git.worktree / path
        if status == "D":
            file.unlink()
        else:
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_bytes(git.blob(target, path))
    content = git.blob(target, cut)
    (git.worktree / cut).write_bytes(content[: len(content) // 2])
    (git.worktree / unwritten).unlink()
    return [path for _, path in done] + [cut, unwritten]


@pytest.mark.parametrize("verb", ["continue", "abort"])
def test_a_checkout_of_the_new_tip_cut_short_is_finished_or_undone_as_printed(applied, series, reference, verb):
    """Ctrl-C inside the checkout that finishes a rebase: ``status``'s commands work as printed; the half
    checkout is the tool's own (no stash of it on --abort); --skip has nothing to skip and says so."""
    git = applied
    before = snapshot(git.worktree)
    interrupt(["rebase", "--onto", "v0.5.23", "--tree", git.worktree, "--series", series], git.worktree,
              "at:rebase-checkout", "kill")
    written = half_a_checkout(git, Journal.load(rebase_journal(git), git).head_before)
    assert len(written) > 5 and git.status_porcelain()
    listed = invoke("status", "--tree", git.worktree, as_json=False)
    assert "skip:" not in listed.text, listed.text  # every entry is done: nothing to skip
    skip = invoke("rebase", "--skip", "--tree", git.worktree, as_json=False)
    assert skip.code == 2 and "cannot skip: every entry is done" in skip.err and "Traceback" not in skip.err
    done = run_printed(way_out(subprocess.CompletedProcess([], -9), git.worktree, verb, "rebase"))
    assert done.returncode == 0, done.stderr
    if verb == "continue":
        assert git.head() == reference["rebase"] and git.current_branch() == "c128/v0.5.23"
    else:
        after = snapshot(git.worktree)
        assert after["head"] == before["head"] and after["status"] == before["status"] == ""
        assert git.out("stash", "list") == "" and "uncommitted work" not in done.stdout  # nothing of the user's
    assert_nothing_in_progress(git)


@pytest.mark.parametrize("verb", ["continue", "abort"])
def test_a_checkout_of_the_release_cut_short_inside_apply_is_finished_or_undone_as_printed(
        sglang_release_repo, series, tmp_path, verb):
    """Ctrl-C inside apply's own checkout of the release: --abort stashed the half checkout as "your work in
    progress"; it is the tool's own (``treestate.cut_checkout``, as for rebase): undone, no stash."""
    git = small_clone(sglang_release_repo, tmp_path / "t")
    git.run("checkout", "--quiet", "-b", "work", "v0.5.22")
    before = snapshot(git.worktree)
    proc = interrupt(["apply", "--sglang-rev", "v0.5.23", "--repo", git.worktree, "--series", series], git.worktree,
                     "at:apply-checkout", "kill")
    written = half_a_checkout(git, git.rev_parse("v0.5.23"))
    assert len(written) > 3 and git.status_porcelain()
    done = run_printed(way_out(proc, git.worktree, verb, "apply"))
    assert done.returncode == 0, done.stderr
    if verb == "abort":
        assert snapshot(git.worktree) == before and git.out("stash", "list") == "", done.stdout
    else:
        plain = small_clone(sglang_release_repo, tmp_path / "plain")  # the same apply, uninterrupted
        plain.run("checkout", "--quiet", "-b", "work", "v0.5.22")
        ran = invoke("apply", "--sglang-rev", "v0.5.23", "--repo", plain.worktree, "--series", series)
        assert ran.code == 0, (ran.code, ran.err)
        assert git.current_branch() == "c128/v0.5.23" and git.rev_parse("HEAD^{tree}") == plain.rev_parse("HEAD^{tree}")
    assert_nothing_in_progress(git)


def test_a_cut_checkout_with_a_file_of_the_users_since_is_not_thrown_away(applied, series):
    git = applied
    interrupt(["rebase", "--onto", "v0.5.23", "--tree", git.worktree, "--series", series], git.worktree,
              "at:rebase-checkout", "kill")
    half_a_checkout(git, Journal.load(rebase_journal(git), git).head_before)
    (git.worktree / "notes.txt").write_text("mine\n")
    res = invoke("rebase", "--continue", "--tree", git.worktree, as_json=False)
    assert res.code == 2 and "changed since the rebase was cut short, not by it (notes.txt)" in res.err, res.err
    assert (git.worktree / "notes.txt").read_text() == "mine\n"
    undone = invoke("rebase", "--abort", "--tree", git.worktree, as_json=False)
    assert undone.code == 0 and git.out("stash", "list").count("\n") == 0 and "stash" in undone.text
    assert git.out("stash", "show", "--include-untracked", "--name-only", "stash@{0}").split() == ["notes.txt"]


def test_a_kill_after_the_branch_moved_only_finishes_the_report(applied, series, reference):
    """Killed once the branch points at the rebased commits: --continue writes the report, changes nothing."""
    git = applied
    interrupt(["rebase", "--onto", "v0.5.23", "--tree", git.worktree, "--series", series], git.worktree,
              REBASE_PHASES["branch-moved"], "kill")
    assert git.rev_parse("c128/v0.5.22") == reference["rebase"]
    res = invoke("rebase", "--continue", "--tree", git.worktree, "--json")
    assert res.code == 0, res.err
    assert git.head() == reference["rebase"] and git.current_branch() == "c128/v0.5.23"
    assert_nothing_in_progress(git)



@pytest.fixture
def conflicting_onto(applied: Git) -> str:
    """An upstream commit on v0.5.23 that changes the very line the test patch edits."""
    git = applied
    idx = git.with_env(GIT_INDEX_FILE=str(git.worktree / ".git" / "other.index"))
    idx.run("read-tree", "v0.5.23")
    line = EDIT[CUH][0]
    text = git.blob("v0.5.23", CUH).decode().replace(line, line.rstrip("\n") + "  // upstream's change\n")
    idx.run("update-index", "--cacheinfo", f"100644,{git.out('hash-object', '-w', '--stdin', input=text)},{CUH}")
    return git.out("commit-tree", idx.out("write-tree"), "-p", "v0.5.23", "-m", "upstream edits the same line")


@pytest.mark.parametrize("how", SIGNALS)
def test_a_rebase_interrupted_inside_its_stop_stops_again_on_continue(applied, series, conflicting_onto, how):
    """Cut short while leaving a conflict in the work tree: --continue makes the very stop again."""
    git = applied
    proc = interrupt(["rebase", "--onto", conflicting_onto, "--tree", git.worktree, "--series", series], git.worktree,
                     "at:rebase-stop", how)
    done = run_printed(way_out(proc, git.worktree, "continue", "rebase"))
    assert done.returncode == 1 and f"entry 'test-patch' conflicts on {conflicting_onto} in {CUH}" in done.stderr
    assert "<<<<<<<" in (git.worktree / CUH).read_text()


@pytest.mark.parametrize("how", SIGNALS)
def test_a_rebase_interrupted_inside_its_stop_aborts_to_the_branch_as_it_was(applied, series, conflicting_onto, how):
    git = applied
    before = snapshot(git.worktree)
    proc = interrupt(["rebase", "--onto", conflicting_onto, "--tree", git.worktree, "--series", series], git.worktree,
                     "at:rebase-stop", how)
    done = run_printed(way_out(proc, git.worktree, "abort", "rebase"))
    assert done.returncode == 0, done.stderr
    after = snapshot(git.worktree)
    mine = lambda s: [r for r in s["refs"].splitlines() if "refs/c128patch/recovery" not in r]  # noqa: E731
    assert mine(after) == mine(before) and after["head"] == before["head"] and after["status"] == before["status"]
    assert_nothing_in_progress(git)


# ---------------------------------------------------------------------------- a run of entries (one git am)
def run_series(dest: Path, bad: str = "") -> Path:
    """Entries run-a, run-b, run-c, each a patch carrying its entry trailer that adds a file; ``bad`` changes a
    line python/sglang/__init__.py does not have instead: it does not apply."""
    (dest / "patches").mkdir(parents=True)
    rows = []
    for i, x in enumerate("abc", 1):
        name, path = f"run-{x}", f"python/sglang/c128_run_{x}.py"
        diff = (f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n+VALUE = {i}\n" if name != bad else
                "--- a/python/sglang/__init__.py\n+++ b/python/sglang/__init__.py\n@@ -1 +1 @@\n-no such line\n+x\n")
        path = path if name != bad else "python/sglang/__init__.py"
        (dest / "patches" / f"000{i}-{name}.patch").write_text(
            f"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\nFrom: t <t@t>\nDate: Thu, 1 Jan "
            f"1970 00:00:00 +0000\nSubject: [PATCH] run {x}\n\nC128patch-Entry: {name}\n---\n"
            f"diff --git a/{path} b/{path}\n" + ("new file mode 100644\n" if name != bad else "") + diff)
        rows.append(f'[[entries]]\nname = "{name}"\nkind = "patch"\nfile = "000{i}-{name}.patch"\nwhy = "test"\n'
                    'base = "v0.5.23"\n')
    (dest / "patches" / "series.toml").write_text('[series]\nname = "runs"\nversion = "1"\nbase = "v0.5.23"\n\n'
                                                  + "\n".join(rows))
    update_hashes(load_series(dest))
    return dest


def test_a_kill_inside_a_run_of_entries_resumes_to_the_uninterrupted_result(sglang_release_repo, tmp_path):
    """Killed in the run's `git am` after its first commit: --continue redoes the run, giving the commits an
    uninterrupted apply gives, one per entry."""
    series, args = run_series(tmp_path / "series"), ["apply", "--sglang-rev", "v0.5.23", "--series"]
    ref = small_clone(sglang_release_repo, tmp_path / "ref")
    assert invoke(*args, tmp_path / "series", "--repo", ref.worktree, as_json=False).code == 0
    git = small_clone(sglang_release_repo, tmp_path / "t")
    hook = tmp_path / "hooks" / "pre-applypatch"  # the second patch's: the first is committed
    hook.parent.mkdir()
    hook.write_text('#!/bin/sh\n[ -f "$0.seen" ] && kill -KILL -$(ps -o pgid= $$ | tr -d " ") && sleep 5\n'
                    'touch "$0.seen"\n')
    hook.chmod(0o755)
    proc = cli_process([*args, series, "--repo", git.worktree], {FAULT_HOOKS_ENV: str(hook.parent)})
    assert proc.returncode == -9, proc.stderr
    assert git.out("log", "--format=%s", "v0.5.23..HEAD") == "run a"
    assert json.loads(apply_journal(git).read_text())["entries"] == []  # the run is one step: none recorded
    done = invoke("apply", "--continue", "--tree", git.worktree, as_json=False)
    assert done.code == 0, done.err
    assert git.head() == ref.head() and git.out("log", "--format=%s", "v0.5.23..HEAD~").splitlines() == [
        "run c", "run b", "run a"]
    assert_nothing_in_progress(git)


def test_a_run_stops_at_the_entry_that_does_not_apply_naming_it_and_resumes_from_it(sglang_release_repo, tmp_path):
    git = small_clone(sglang_release_repo, tmp_path / "t")
    res = invoke("apply", "--sglang-rev", "v0.5.23", "--series", run_series(tmp_path / "series", bad="run-b"),
                 "--repo", git.worktree, as_json=False)
    for stop in (res, invoke("apply", "--continue", "--tree", git.worktree, as_json=False)):
        assert stop.code == 1 and "entry 'run-b'" in stop.err.splitlines()[0], stop.err
        assert git.out("log", "--format=%s", "v0.5.23..HEAD") == "run a" and git.status_porcelain() == []
        journal = json.loads(apply_journal(git).read_text())
        assert [e["name"] for e in journal["entries"]] == ["run-a"] and journal["paused"] == "conflict"
        assert not (git.worktree / ".git" / "rebase-apply").exists()


def test_a_patch_file_of_two_messages_in_a_run_makes_both_commits_as_alone(sglang_release_repo, tmp_path):
    """Not one commit per file: the run's entries go in one at a time, the entry's row naming its last commit."""
    series = run_series(tmp_path / "series")
    b = series / "patches" / "0002-run-b.patch"
    b.write_text(b.read_text() + "\n" + b.read_text().replace("run_b", "run_b2").replace("run b", "run b2"))
    update_hashes(load_series(series))
    git = small_clone(sglang_release_repo, tmp_path / "t")
    res = invoke("apply", "--sglang-rev", "v0.5.23", "--series", series, "--repo", git.worktree)
    assert res.code == 0, res.err
    assert git.out("log", "--format=%s", "v0.5.23..HEAD~").splitlines() == ["run c", "run b2", "run b", "run a"]
    assert [e["commit"] for e in res.out["entries"]] == [git.rev_parse(f"HEAD~{n}") for n in (4, 2, 1)]


def test_status_names_a_stale_index_lock_and_its_commands_then_work(sglang_release_repo, series, reference, tmp_path):
    """A kill -9 that also leaves ``.git/index.lock`` (git killed mid-write): `status` names the lock and
    prints the one command that clears it; after it, the resume command status prints works."""
    git = small_clone(sglang_release_repo, tmp_path / "t")
    proc = interrupt(["apply", "--sglang-rev", "v0.5.22", "--repo", git.worktree, "--series", series],
                     git.worktree, APPLY_PHASES["after-entry-commit"], "kill")
    lock = git.worktree / ".git" / "index.lock"
    lock.write_bytes(b"")  # what a git killed while writing the index leaves
    res = invoke("status", "--tree", git.worktree, as_json=False)
    assert res.code == 1, res.err  # an apply stopped half way: not the series
    assert f"{lock} is left over from a killed git or c128patch run" in res.text
    clear = res.text.split("clear:", 1)[1].splitlines()[0].strip()
    assert clear == f"rm -f {lock}"
    blocked = run_printed(way_out(proc, git.worktree, "continue", "apply"))
    assert blocked.returncode != 0 and "index.lock" in blocked.stderr  # the lock is what is in the way
    assert run_printed(clear).returncode == 0 and not lock.exists()
    done = run_printed(way_out(proc, git.worktree, "continue", "apply"))
    assert done.returncode == 0, done.stderr
    assert git.head() == reference["apply"] and git.current_branch() == "c128/v0.5.22"
    assert_nothing_in_progress(git)
    assert "left over" not in invoke("status", "--tree", git.worktree, as_json=False).text


# ---------------------------------------------------------------------------- Ctrl-C while git holds the index
@pytest.mark.parametrize("way", ["continue", "abort"])
@pytest.mark.parametrize("verb", ["apply", "rebase"])
def test_a_ctrl_c_while_git_writes_the_index_leaves_no_lock_and_the_printed_way_out_runs(
        sglang_release_repo, series, reference, tmp_path, verb, way):
    """A new user's Ctrl-C during apply's checkout: the tool ends its git with SIGKILL (procs.Group), which leaves
    ``.git/index.lock``; the `apply --continue` it printed then failed on that lock. A git hook takes the lock as git
    does while writing the index, then Ctrl-Cs the tool: the lock is the run's own, removed; the printed way out
    runs as printed (and a lock that was there before is not touched: ``own_index_lock``)."""
    if verb == "apply":
        git = small_clone(sglang_release_repo, tmp_path / "t")
        args, name = ["apply", "--sglang-rev", "v0.5.22", "--repo", git.worktree, "--series", series], "pre-applypatch"
    else:
        subprocess.run(["cp", "-a", reference["applied"], str(tmp_path / "t")], check=True)
        git = Git(worktree=tmp_path / "t")
        args, name = ["rebase", "--onto", "v0.5.23", "--tree", git.worktree, "--series", series], "post-checkout"
    before = snapshot(git.worktree)
    made = tmp_path / "hooks" / name
    made.parent.mkdir()
    made.write_text('#!/bin/sh\n: > "$(git rev-parse --git-path index.lock)"\n'
                    'kill -INT "$(ps -o ppid= $PPID | tr -d " ")"\nsleep 5\n')
    made.chmod(0o755)
    proc = cli_process(args, {FAULT_HOOKS_ENV: str(made.parent)})
    made.unlink()
    assert proc.returncode == 130 and "journal is intact" in proc.stderr, (proc.returncode, proc.stderr)
    assert not (git.worktree / ".git" / "index.lock").exists()
    done = run_printed(printed_command(proc.stderr, f"c128patch {verb} --{way}"))
    assert done.returncode == 0, done.stderr
    if way == "continue":
        assert git.head() == reference[verb]
    else:
        assert snapshot(git.worktree)["head"] == before["head"]
    assert_nothing_in_progress(git)


@pytest.mark.parametrize("way", ["continue", "abort"])
def test_a_sigkill_during_applys_checkout_leaving_index_lock_is_led_out_by_status(
        sglang_release_repo, series, reference, tmp_path, way):
    """Helper 156: a SIGKILL of `apply` while its git checks the branch out: git dies with the tool (procs.Group's
    PR_SET_PDEATHSIG) and leaves ``.git/index.lock``, which no run can prove its own (a git of the user's takes the
    same lock), so it is not removed. The user's whole path, each command as printed: `status` names the lock with
    its `rm -f` and the resume and undo; the lock cleared, the resume (or the undo) runs, the tree as an uninterrupted
    apply left it (or as it was)."""
    git = small_clone(sglang_release_repo, tmp_path / "t")
    before = snapshot(git.worktree)
    made = tmp_path / "hooks" / "post-checkout"
    made.parent.mkdir()
    made.write_text('#!/bin/sh\n: > "$(git rev-parse --git-path index.lock)"\n'
                    "kill -KILL -$(ps -o pgid= $$ | tr -d ' ')\nsleep 5\n")
    made.chmod(0o755)
    proc = cli_process(["apply", "--sglang-rev", "v0.5.22", "--repo", git.worktree, "--series", series],
                       {FAULT_HOOKS_ENV: str(made.parent)})
    made.unlink()
    assert proc.returncode == -9, (proc.returncode, proc.stderr)
    lock = git.worktree / ".git" / "index.lock"
    assert lock.exists()
    res = invoke("status", "--tree", git.worktree, as_json=False)
    assert f"{lock} is left over from a killed git or c128patch run" in res.text, res.text
    clear = res.text.split("clear:", 1)[1].splitlines()[0].strip()
    label = "resume:" if way == "continue" else "undo:"
    out = res.text.split(label, 1)[1].splitlines()[0].strip()
    assert run_printed(clear).returncode == 0 and not lock.exists()
    done = run_printed(out)
    assert done.returncode == 0, done.stderr
    if way == "continue":
        assert git.head() == reference["apply"] and git.current_branch() == "c128/v0.5.22"
    else:
        assert snapshot(git.worktree)["head"] == before["head"]
    assert_nothing_in_progress(git)
    assert "left over" not in invoke("status", "--tree", git.worktree, as_json=False).text


def test_apply_continue_refuses_a_journals_series_folder_others_may_write_and_takes_one_given(
        sglang_release_repo, series, reference, tmp_path):
    """Helper 156: `apply --continue` loaded the series folder its journal names whoever could write it. Now refused
    in one line naming the way on; `--series DIR` (the operator's word) resumes to the uninterrupted result."""
    ours = tmp_path / "series"
    shutil.copytree(series, ours)
    git = small_clone(sglang_release_repo, tmp_path / "t")
    interrupt(["apply", "--sglang-rev", "v0.5.22", "--repo", git.worktree, "--series", ours],
              git.worktree, APPLY_PHASES["after-entry-commit"], "kill")
    (ours / "patches").chmod(0o777)
    refused = invoke("apply", "--continue", "--tree", git.worktree, as_json=False)
    assert refused.code != 0 and len(refused.err.strip().splitlines()) == 1, refused.err
    assert f"names series {ours} (its patches), writable by others: not read" in refused.err, refused.err
    assert "name it with --series" in refused.err
    done = invoke("apply", "--continue", "--tree", git.worktree, "--series", ours, as_json=False)
    assert done.code == 0, done.err
    assert git.head() == reference["apply"]
    assert_nothing_in_progress(git)
