"""refresh: patched branch -> patches/ + manifest, deterministic, with a --check fixed point."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from c128patch.git import Git
from c128patch.ops import equivalence
from c128patch.ops.lint import update_hashes
from c128patch.ops.proofs import PROOF
from c128patch.series.manifest import load_series
from support import copy_series, invoke, make_test_series, printed_command, refused, run_printed, upstream_commit

CUH = "python/sglang/kernels/jit/csrc/deepseek_v4/c128_online_v2.cuh"
EDIT = {CUH: ("    const uint32_t prefix_len = seq_len - extend_len;\n",
              "    const uint32_t prefix_len = seq_len - extend_len;  // c128patch test\n")}


def cli(*args: str) -> tuple[int, dict]:
    res = invoke(*args)
    return res.code, json.loads(res.text)


@pytest.fixture(scope="module")
def applied_once(tmp_path_factory: pytest.TempPathFactory, sglang_release_repo: Path) -> Path:
    """The folder holding ``series`` (the test series) and ``sglang`` (a clone of the releases it was applied to at
    v0.5.23, then refreshed once to normalize): made once, copied for each test (``applied``)."""
    root = tmp_path_factory.mktemp("applied")
    series, tree = make_test_series(root / "series", sglang_release_repo, EDIT), root / "sglang"
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(sglang_release_repo), str(tree)], check=True)
    subprocess.run(["git", "-C", str(tree), "checkout", "--quiet", "-b", "main", "v0.5.23"], check=True)
    assert cli("apply", "--sglang-rev", "v0.5.23", "--repo", str(tree), "--series", str(series))[0] == 0
    code, out = cli("refresh", "--tree", str(tree), "--series", str(series))  # normalize once
    assert code == 0, out
    return root


@pytest.fixture
def applied(tmp_path: Path, applied_once: Path) -> tuple[Path, Path]:
    """(series, tree): a copy of ``applied_once`` for one test to change (cp -a: the clone's .git state with it; no
    absolute path is recorded in the tree or the series), at tmp_path/series and tmp_path/sglang as before."""
    for name in ("series", "sglang"):
        subprocess.run(["cp", "-a", str(applied_once / name), str(tmp_path / name)], check=True)
    return tmp_path / "series", tmp_path / "sglang"


def files(series: Path) -> dict[str, bytes]:
    return {str(p.relative_to(series)): p.read_bytes() for p in sorted(series.rglob("*")) if p.is_file()}


def test_refresh_is_a_fixed_point(applied):
    series, tree = applied
    before = files(series)
    code, out = cli("refresh", "--tree", str(tree), "--series", str(series), "--check")
    assert code == 0 and out["changed"] == []
    # re-apply the refreshed series to a fresh branch: refreshing that changes nothing either
    Git(worktree=tree).run("checkout", "-q", "main")
    assert cli("apply", "--sglang-rev", "v0.5.23", "--repo", str(tree), "--series", str(series),
               "--branch", "again")[0] == 0
    code, out = cli("refresh", "--tree", str(tree), "--series", str(series), "--check")
    assert code == 0 and out["changed"] == []
    assert files(series) == before


def test_the_trees_format_patch_settings_change_nothing_refresh_writes(applied):
    """A tree's ``format.*`` config (an attached mail the reader refuses, a sign-off, headers, notes, a base, another
    sender: h140, `format.from` wrote every patch From: it) is not the series': refresh --check after it still changes
    nothing, and refresh writes the same bytes."""
    series, tree = applied
    before = files(series)
    for key, value in (("format.attach", "true"), ("format.signOff", "true"), ("format.headers", "X-Site: 1"),
                       ("format.notes", "true"), ("format.to", "x@example.invalid"), ("format.useAutoBase", "true"),
                       ("format.thread", "shallow"), ("format.from", "Someone Else <else@example.invalid>")):
        subprocess.run(["git", "-C", str(tree), "config", key, value], check=True)
    code, out = cli("refresh", "--tree", str(tree), "--series", str(series), "--check")
    assert code == 0 and out["changed"] == [], out
    assert cli("refresh", "--tree", str(tree), "--series", str(series))[0] == 0
    assert files(series) == before


def test_exported_patch_is_normalized(applied):
    series, _ = applied
    s = load_series(series)
    text = (s.patches_dir / s.entries[0].file).read_text()
    assert s.entries[0].file == "0001-test.patch"  # the name it was given: refresh never renames a file
    assert text.startswith("From 0000000000000000000000000000000000000000 ")
    assert "Date: Thu, 1 Jan 1970 00:00:00 +0000" in text
    assert "C128patch-Entry: test-patch" in text
    assert re.search(r"^index [0-9a-f]{40}\.\.[0-9a-f]{40} 100644$", text, re.M)
    assert "\n-- \n" not in text  # no signature
    assert " 1 file changed" not in text  # no diffstat


def test_check_detects_a_change_and_refresh_records_it(applied):
    series, tree = applied
    git = Git(worktree=tree)
    target = tree / CUH
    # amend the entry's commit (as a maintainer would with an interactive rebase)
    git.run("checkout", "-q", "HEAD~2")
    target.write_text(target.read_text().replace("// c128patch test", "// c128patch test, amended"))
    git.run("commit", "-q", "-a", "--amend", "--no-edit")
    amended = git.head()
    git.run("cherry-pick", "c128/v0.5.23~1", "c128/v0.5.23")
    git.run("branch", "-f", "c128/v0.5.23", "HEAD")
    git.run("checkout", "-q", "c128/v0.5.23")
    before = files(series)
    code, out = cli("refresh", "--tree", str(tree), "--series", str(series), "--check")
    assert code == 1 and out["changed"] == ["patches/0001-test.patch", "patches/series.toml"]
    assert files(series) == before  # --check changes nothing
    code, out = cli("refresh", "--tree", str(tree), "--series", str(series))
    assert code == 0
    s = load_series(series)
    assert s.version == "3"  # bumped from 2 (the first normalizing refresh) to 3
    assert "amended" in (s.patches_dir / s.entries[0].file).read_text()
    assert cli("lint", "--series", str(series), "--offline")[0] == 0
    assert amended


@pytest.mark.parametrize("check", [True, False], ids=["check", "refresh"])
def test_uncommitted_edits_are_refused_in_one_line_naming_them(applied, check):
    """An edit not committed on the branch is not in what refresh exports: refused, never "up to date"."""
    series, tree = applied
    (tree / CUH).write_text((tree / CUH).read_text() + "// not committed\n")
    (tree / "notes.txt").write_text("untracked\n")
    before = files(series)
    line = refused(["refresh", "--tree", tree, "--series", series, *(["--check"] if check else [])], tree,
                   f"{tree} has uncommitted changes ({CUH}, notes.txt)")
    assert line.startswith(f"c128patch: error: cannot refresh{' --check' if check else ''}: ")
    assert files(series) == before
    status = invoke("status", "--tree", tree, "--series", series)
    assert status.code == 1 and status.out["uncommitted"] == [CUH, "notes.txt"] and not status.out["equals_series"]
    text = invoke("status", "--tree", tree, "--series", series, as_json=False)
    assert text.code == 1
    assert "HEAD equals the series, the working tree does not (uncommitted changes): identical to" in text.text
    assert f"uncommitted: {CUH}, notes.txt" in text.text


def test_status_exits_0_only_where_the_tree_equals_the_series(applied):
    series, tree = applied
    res = invoke("status", "--tree", tree, "--series", series, as_json=False)
    assert res.code == 0 and "equals the series: identical to a fresh apply" in res.text
    git = Git(worktree=tree)
    (tree / CUH).write_text((tree / CUH).read_text() + "// committed\n")
    git.run("commit", "-q", "-a", "-m", "a user commit")
    res = invoke("status", "--tree", tree, "--series", series)
    assert res.code == 1 and res.out["equals_series"] is False and res.out["uncommitted"] == []


def test_status_after_a_refresh_that_changes_nothing_reads_the_proof_it_recorded(applied, monkeypatch):
    series, tree = applied
    (tree / ".git" / "c128patch" / PROOF).unlink(missing_ok=True)
    assert cli("refresh", "--tree", str(tree), "--series", str(series), "--check")[0] == 0

    def no_replay(*args, **kw):
        raise AssertionError("status replayed the series where refresh recorded its proof")

    monkeypatch.setattr(equivalence, "prove", no_replay)
    res = invoke("status", "--tree", tree, "--series", series)
    assert res.code == 0 and res.out["proof"] == "recorded" and res.out["equivalence"]["identical"]


def test_refresh_on_older_base_drops_a_redundant_variant(applied):
    """The test patch applies as is to 0.5.20: refreshing there writes no variant."""
    series, tree = applied
    Git(worktree=tree).run("checkout", "-q", "main")
    assert cli("apply", "--sglang-rev", "v0.5.20", "--repo", str(tree), "--series", str(series))[0] == 0
    code, out = cli("refresh", "--tree", str(tree), "--series", str(series))
    assert code == 0, out
    entry = load_series(series).entries[0]
    assert entry.base == "v0.5.23" and entry.variants == []


VERIFY = "python/sglang/srt/speculative/dspark_components/dspark_verify.py"
SIGNATURE = "\n    def run_idle_participation(\n"


def test_rebase_then_refresh_writes_the_variant_an_older_base_needs(tmp_path: Path, sglang_release_repo: Path):
    """Three lines above this edit differ in 0.5.20, so the 0.5.23 file cannot apply there strictly;
    a rebase merges it cleanly and refresh keeps the result as the v0.5.20 variant."""
    series = make_test_series(tmp_path / "series", sglang_release_repo,
                              {VERIFY: (SIGNATURE, "\n    # c128patch test" + SIGNATURE)}, overlay=False)
    tree = tmp_path / "t"
    assert cli("apply", "--sglang-rev", "v0.5.23", "--repo", str(sglang_release_repo), "--tree", str(tree),
               "--series", str(series))[0] == 0
    assert cli("refresh", "--tree", str(tree), "--series", str(series))[0] == 0
    code, out = cli("check", "--sglang-rev", "v0.5.20", "--series", str(series))
    assert code == 0 and out["revs"][0]["entries"][0]["status"] == "3way"  # only with a 3-way merge: needs a variant
    code, report = cli("rebase", "--onto", "v0.5.20", "--tree", str(tree), "--series", str(series))
    assert code == 0 and report["entries"][0]["status"] == "context-only", report
    said = invoke("refresh", "--tree", tree, "--series", series, "--variant", "--check", as_json=False)
    assert said.code == 1 and "(base v0.5.23), from a tree on v0.5.20 as its variants: 2 file(s) would change" \
        in said.text, said.text  # the tree's base named, never "on v0.5.23" alone
    code, out = cli("refresh", "--tree", str(tree), "--series", str(series), "--variant")
    assert code == 0 and (out["tree_base"], out["written_as"]) == ("v0.5.20", "variants"), out
    s = load_series(series)
    entry = s.entries[0]
    assert entry.base == "v0.5.23" and [v.base for v in entry.variants] == ["v0.5.20"] and s.base == "v0.5.23"
    assert entry.variants[0].file == "0001-test.v0.5.20.patch"
    assert cli("lint", "--series", str(series), "--offline")[0] == 0
    code, out = cli("check", *[a for r in ("v0.5.20", "v0.5.21", "v0.5.23") for a in ("--sglang-rev", r)],
                    "--series", str(series))
    assert code == 0, out
    assert [r["entries"][0]["file"] for r in out["revs"]] == ["patches/0001-test.v0.5.20.patch",
                                                               "patches/0001-test.v0.5.20.patch",
                                                               "patches/0001-test.patch"]


def test_refresh_refuses_a_tree_without_provenance(upstream_clone: Path, tmp_path: Path, sglang_release_repo: Path):
    series = make_test_series(tmp_path / "series", sglang_release_repo, EDIT)
    res = invoke("refresh", "--tree", upstream_clone, "--series", series, as_json=False)
    assert res.code == 2 and "no c128patch series is applied" in res.err


def test_a_variant_made_on_a_branch_is_keyed_by_its_commit_not_the_branch_name(tmp_path: Path,
                                                                              sglang_release_repo: Path):
    """Rebased --onto a branch (an untagged commit on top of 0.5.20), the variant refresh writes is
    named by the commit, which does not move, and records it."""
    series = make_test_series(tmp_path / "series", sglang_release_repo,
                              {VERIFY: (SIGNATURE, "\n    # c128patch test" + SIGNATURE)}, overlay=False)
    tree = tmp_path / "t"
    assert cli("apply", "--sglang-rev", "v0.5.23", "--repo", str(sglang_release_repo), "--tree", str(tree),
               "--series", str(series))[0] == 0
    git = Git(worktree=tree)

    def add_file(idx: Git) -> None:
        blob = idx.out("hash-object", "-w", "--stdin", input="moving\n")
        idx.run("update-index", "--add", "--cacheinfo", f"100644,{blob},python/MOVING.txt")

    commit = upstream_commit(git, "v0.5.20", "upstream work in progress", add_file)
    git.run("branch", "moving", commit)
    code, report = cli("rebase", "--onto", "moving", "--tree", str(tree), "--series", str(series))
    assert code == 0, report
    assert cli("refresh", "--tree", str(tree), "--series", str(series), "--variant")[0] == 0
    [variant] = load_series(series).entries[0].variants
    assert (variant.base, variant.commit, variant.file) == (commit[:12], commit, f"0001-test.{commit[:12]}.patch")


def amend_entry(tree: Path) -> None:
    """Amend the entry's commit on the branch (as a maintainer would with an interactive rebase)."""
    git = Git(worktree=tree)
    target = tree / CUH
    git.run("checkout", "-q", "HEAD~2")
    target.write_text(target.read_text().replace("// c128patch test", "// c128patch test, amended"))
    git.run("commit", "-q", "-a", "--amend", "--no-edit")
    git.run("cherry-pick", "c128/v0.5.23~1", "c128/v0.5.23")
    git.run("branch", "-f", "c128/v0.5.23", "HEAD")
    git.run("checkout", "-q", "c128/v0.5.23")


KILL_POINTS = ["refresh-staged:0", "refresh-before-commit", "refresh-committed", "refresh-moved:0"]


def test_refresh_killed_anywhere_leaves_the_old_or_the_new_series(applied, tmp_path: Path):
    """kill -9 at each point of the write: every reader (load_series) then sees the old series or
    the new one, never a mix; no staging folder is left once read; a re-run gives the new series."""
    import shutil

    from support import cli_process

    series, tree = applied
    amend_entry(tree)
    old = files(series)
    saved = tmp_path / "saved"
    shutil.copytree(series, saved)
    code, _ = cli("refresh", "--tree", str(tree), "--series", str(series))
    assert code == 0
    new = files(series)
    assert new != old and {k for k in new if new[k] != old.get(k)} >= {"patches/series.toml", "patches/0001-test.patch"}
    for point in KILL_POINTS:
        shutil.rmtree(series)
        shutil.copytree(saved, series)
        proc = cli_process(["refresh", "--tree", tree, "--series", series], env={"C128PATCH_FAULT": f"kill-at:{point}"})
        assert proc.returncode == -9, (point, proc.returncode, proc.stderr)
        load_series(series)  # what every command does first: finish (or drop) the interrupted write
        after = files(series)
        assert after == (new if point in ("refresh-committed", "refresh-moved:0") else old), point
        assert not list(series.glob(".c128patch-txn*")), point
        code, out = cli("refresh", "--tree", str(tree), "--series", str(series))
        assert code == 0, (point, out)
        assert files(series) == new, point


def test_a_committed_refresh_is_finished_by_any_reader(applied, tmp_path: Path):
    """Killed after the commit point, before the manifest moved in: `lint` (any verb) finishes it."""
    from support import cli_process

    series, tree = applied
    amend_entry(tree)
    proc = cli_process(["refresh", "--tree", tree, "--series", series],
                       env={"C128PATCH_FAULT": "kill-at:refresh-moved:0"})
    assert proc.returncode == -9
    assert (series / ".c128patch-txn").is_dir()  # the patch moved in, the manifest not yet
    assert cli("lint", "--series", str(series), "--offline")[0] == 0
    assert not (series / ".c128patch-txn").exists()
    assert "amended" in (series / "patches" / "0001-test.patch").read_text()
    assert cli("refresh", "--tree", str(tree), "--series", str(series), "--check")[0] == 0


@pytest.mark.parametrize("errno_name", ["EROFS", "ENOSPC", "EACCES"])
def test_a_committed_refresh_a_reader_cannot_finish_here_is_kept_not_undone(applied, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch,
                                                                           errno_name: str):
    """Helper 164: a series folder holding a committed refresh on a read-only mount (a full disk, no write permission):
    every reader said the refresh "cannot be finished" and printed the undo: put back patches/ and `rm -rf` the journal
    (which fails as printed there, and throws away a write past its commit point). It says to make the folder
    writable and run again; nothing is removed; run again where it can write, the refresh is finished."""
    import errno

    from support import cli_process

    series, tree = applied
    amend_entry(tree)
    proc = cli_process(["refresh", "--tree", tree, "--series", series],
                       env={"C128PATCH_FAULT": "kill-at:refresh-committed"})
    assert proc.returncode == -9
    journal = series / ".c128patch-txn"
    assert journal.is_dir()

    def cannot(*_a, **_k):
        raise OSError(getattr(errno, errno_name), os.strerror(getattr(errno, errno_name)))

    with monkeypatch.context() as mp:
        mp.setattr("c128patch.series.txn.os.replace", cannot)
        line = refused(["lint", "--series", series, "--offline"], None, "cannot be finished here")
    assert "rm -rf" not in line and "put back" not in line, line
    assert f"past its commit point: nothing of it is lost; make {series} writable" in line, line
    assert journal.is_dir()
    assert cli("lint", "--series", str(series), "--offline")[0] == 0  # run again where it can write: finished
    assert not journal.exists() and "amended" in (series / "patches" / "0001-test.patch").read_text()


def as_installed(series: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``series`` as the copy an installed tool carries (site-packages/c128patch/_series), the tool's own."""
    package = tmp_path / "site-packages" / "c128patch"
    package.mkdir(parents=True)
    (package / "_series").symlink_to(series)
    monkeypatch.setattr("c128patch.series.manifest.PACKAGE_DIR", package)
    monkeypatch.delenv("C128PATCH_SERIES", raising=False)
    return package / "_series"


def test_refresh_never_writes_the_series_of_an_installed_tool(applied, tmp_path: Path, monkeypatch):
    """`pip install` of the repository: the series is the package's (site-packages). A user's commit on the
    patched branch, refreshed there, would become entry N of the installed series (issue 37's first day): refused,
    nothing written; `--check` still says what would change. (The series stands in as the package's copy.)"""
    series, tree = applied
    package = as_installed(series, tmp_path, monkeypatch)
    (tree / CUH).write_text((tree / CUH).read_text() + "// mine\n")
    Git(worktree=tree).with_env(GIT_AUTHOR_NAME="me", GIT_AUTHOR_EMAIL="me@x.invalid", GIT_COMMITTER_NAME="me",
                                GIT_COMMITTER_EMAIL="me@x.invalid").run("commit", "-qam", "mine")
    before = files(series)
    res = invoke("refresh", "--tree", str(tree), "--series", str(package), as_json=False)
    assert res.code == 2 and res.err.startswith("c128patch: error: cannot refresh: it would write patches/") and \
        "(a package, not a checkout)" in res.err and res.err.rstrip().endswith("nothing was written"), res.err
    assert files(series) == before
    assert cli("refresh", "--check", "--tree", str(tree), "--series", str(package))[0] == 1


def test_a_rebase_needing_a_variant_prints_no_refresh_into_an_installed_tool(tmp_path: Path, sglang_release_repo,
                                                                             upstream_clone: Path, monkeypatch):
    """Installed, a rebase onto a release where an entry needs a 3-way merge (a v0.5.21 variant to make) prints a
    note, not a `next: c128patch refresh` that would write into site-packages."""
    old = '    SGLANG_SPEC_TP_SYNC = EnvStr("all")\n'  # where the example layer's entry needs a 3-way merge on 0.5.21
    series = make_test_series(tmp_path / "series", sglang_release_repo,
                              {"python/sglang/srt/environ.py": (old, f"{old}    SGLANG_MINE = EnvBool(False)\n")})
    as_installed(series, tmp_path, monkeypatch)
    assert invoke("apply", "--sglang-rev", "v0.5.23", "--repo", str(upstream_clone)).code == 0
    res = invoke("rebase", "--onto", "v0.5.21", "--tree", str(upstream_clone), as_json=False)
    assert res.code == 0, res.err
    (line,) = [x for x in res.text.splitlines() if x.startswith("report: ")]
    assert "next: " not in line and line.endswith(f"note: series test (the tool's own, in {series}) would need files "
                                                  "for v0.5.21: not refreshed from here, it would write there"), line
    assert invoke("refresh", "--check", "--tree", str(upstream_clone)).code == 1  # as the note says: files needed


def applied_with_a_commit_of_the_users(tree: Path) -> None:
    """``apply`` of v0.5.23 into ``tree`` (the user's clone), then a commit of the user's on the branch."""
    assert invoke("apply", "--sglang-rev", "v0.5.23", "--repo", str(tree)).code == 0
    (tree / "USER.txt").write_text("mine\n")
    git = Git(worktree=tree).with_env(GIT_AUTHOR_NAME="me", GIT_AUTHOR_EMAIL="me@x.invalid", GIT_COMMITTER_NAME="me",
                                      GIT_COMMITTER_EMAIL="me@x.invalid")
    git.run("add", "USER.txt")
    git.run("commit", "-qm", "site: mine")


def test_a_users_commit_rebased_on_an_installed_tool_is_pointed_at_a_layer_by_rebase_and_refresh_check(
        tmp_path: Path, sglang_release_repo, upstream_clone: Path, monkeypatch):
    """Issue 37's walk: `pip install`ed, applied into one's own clone, a commit of one's own on the branch, rebased.
    The rebase's note and `refresh --check` both say refresh will not write the installed series and name
    `layer add-entry`, instead of "would need files" / "would change patches/..." that `refresh` then refuses."""
    old = '    SGLANG_SPEC_TP_SYNC = EnvStr("all")\n'
    series = make_test_series(tmp_path / "series", sglang_release_repo,
                              {"python/sglang/srt/environ.py": (old, f"{old}    SGLANG_MINE = EnvBool(False)\n")})
    as_installed(series, tmp_path, monkeypatch)
    applied_with_a_commit_of_the_users(upstream_clone)
    res = invoke("rebase", "--onto", "v0.5.21", "--tree", str(upstream_clone), as_json=False)
    assert res.code == 0, res.err
    (line,) = [x for x in res.text.splitlines() if x.startswith("report: ")]
    assert "next: " not in line and "would take your commit(s) on the branch as new entries: not refreshed from " \
        "here, it would write there; make them entries of a layer of yours: c128patch layer new " in line, line
    layer = tmp_path / "layers" / "local"  # v0.5.21 is no base of this series: back to its base, then the entry
    assert line.endswith(shlex.join(["c128patch", "layer", "add-entry", "--layer", str(layer), "--from-commit",
                                     "HEAD~1", "--tree", str(upstream_clone), "--why", "site: mine"])), line
    before = files(series)
    check = invoke("refresh", "--check", "--tree", str(upstream_clone), as_json=False)
    assert check.code == 1, check.err
    (note,) = [x for x in check.text.splitlines() if x.startswith("note: refresh will not write ")]
    assert "as installed in " in note and "(a package, not a checkout)" in note and "layer add-entry" in note, note
    assert files(series) == before
    *steps, add = printed_command(line, "c128patch layer new ").split(" && ")  # as printed (helper 108's case 04),
    for step in steps:  # in this process: the installed series stands in here
        done = invoke(*shlex.split(step)[1:], as_json=False)
        assert done.code == 0, (step, done.err)
    done = invoke(*shlex.split(add)[1:], as_json=False)  # the user's commit reached (its USER.txt is no entry's)
    assert done.code == 2 and "cannot be an entry of layer local: patches/0001-site-mine.patch" in done.err, done.err
    assert "USER.txt, outside python/" in done.err and files(series) == before


def test_a_users_commit_rebased_with_the_tools_own_checkout_is_pointed_at_a_layer_too(
        tmp_path: Path, sglang_release_repo, upstream_clone: Path, monkeypatch):
    """The README's development install (`pip install -e`): the tool's series is its checkout. A rebase printed
    `next: c128patch refresh ...` there, which took the user's commit into our series as a new entry; the next:
    never writes the tool's own series (docs/layers.md), it points at a layer."""
    old = '    SGLANG_SPEC_TP_SYNC = EnvStr("all")\n'
    series = make_test_series(tmp_path / "series", sglang_release_repo,
                              {"python/sglang/srt/environ.py": (old, f"{old}    SGLANG_MINE = EnvBool(False)\n")})
    monkeypatch.setenv("C128PATCH_SERIES", str(series))  # the tool's own series, a checkout
    applied_with_a_commit_of_the_users(upstream_clone)
    before = files(series)
    res = invoke("rebase", "--onto", "v0.5.22", "--tree", str(upstream_clone), as_json=False)
    assert res.code == 0, res.err
    (line,) = [x for x in res.text.splitlines() if x.startswith("report: ")]
    assert "next: " not in line and "would take your commit(s) on the branch as new entries" in line, line
    assert "c128patch layer add-entry" in line and files(series) == before


def test_a_rebases_layer_commands_leave_out_an_empty_commit_of_the_users(
        tmp_path: Path, sglang_release_repo, upstream_clone: Path, monkeypatch):
    """An empty commit of the user's (`commit --allow-empty`) carried by a rebase: its note printed an `add-entry`
    for it, which add-entry refuses ("changes nothing"), so the `&&` chain stopped before the user's real commit.
    The note names the commits that change something; its commands run as printed, the real commit an entry."""
    old = '    SGLANG_SPEC_TP_SYNC = EnvStr("all")\n'
    series = make_test_series(tmp_path / "series", sglang_release_repo,
                              {"python/sglang/srt/environ.py": (old, f"{old}    SGLANG_MINE = EnvBool(False)\n")})
    monkeypatch.setenv("C128PATCH_SERIES", str(series))  # the tool's own series, a checkout
    assert invoke("apply", "--sglang-rev", "v0.5.23", "--repo", str(upstream_clone)).code == 0
    git = Git(worktree=upstream_clone).with_env(GIT_AUTHOR_NAME="me", GIT_AUTHOR_EMAIL="me@x.invalid",
                                                GIT_COMMITTER_NAME="me", GIT_COMMITTER_EMAIL="me@x.invalid")
    git.run("commit", "-q", "--allow-empty", "-m", "site: nothing")
    (upstream_clone / CUH).write_text((upstream_clone / CUH).read_text() + "// mine\n")
    git.run("commit", "-qam", "site: mine")
    res = invoke("rebase", "--onto", "v0.5.22", "--tree", str(upstream_clone), as_json=False)
    assert res.code == 0, res.err
    (line,) = [x for x in res.text.splitlines() if x.startswith("report: ")]
    printed = printed_command(line, "c128patch layer new ")
    assert "site: nothing" not in printed and printed.count("layer add-entry") == 1, printed
    done = run_printed(printed, cwd=tmp_path)
    assert done.returncode == 0, (printed, done.stderr)
    layer = load_series(tmp_path / "layers" / "local")
    assert [e.name for e in layer.entries] == ["site-mine"]


@pytest.mark.parametrize("spelling", ["c128patch-entry: x", "C128patch-Entry : x", "C128PATCH-ENTRY:x"])
def test_a_commit_whose_entry_trailer_is_spelled_otherwise_gets_no_second_one(tmp_path: Path, spelling: str):
    """git reads each spelling as the entry trailer; format_patch must not add ours beside it."""
    from c128patch.ops.refresh import format_patch
    from c128patch.series.trailers import ENTRY_TRAILER, GATE_TRAILER, find_trailers
    git = Git(worktree=tmp_path)
    git.run("init", "-q")
    (tmp_path / "f").write_text("a\n")
    git.run("add", "f")
    git.run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", f"s\n\nbody\n\n{spelling}")
    head = format_patch(git, "HEAD", "x", gate="G").decode().split("\n---\n")[0]
    assert [k for k, _ in find_trailers(head)] == [ENTRY_TRAILER]  # none added beside it, not even the gate's
    assert GATE_TRAILER not in head


def test_refresh_in_a_tree_applied_before_the_stack_gained_an_entry_points_at_rebase(tmp_path, sglang_release_repo,
                                                                                    monkeypatch):
    """A tree applied with an older stack (a layer's folder gained entries since, through another tree): refresh
    exported the branch and dropped the new entries from the stack, and offered --accept-differences to do so.
    It refuses now, naming them, with the rebase that takes them; after it, refresh --check changes nothing."""
    series = copy_series(tmp_path / "series")
    monkeypatch.setenv("C128PATCH_SERIES", str(series))
    tree = tmp_path / "sglang"
    assert invoke("apply", "--sglang-rev", "v0.5.23", "--tree", tree).code == 0
    (series / "overlay" / "sglang" / "late.py").write_text("LATE = 1\n")
    with (series / "patches" / "series.toml").open("a") as fh:
        fh.write('\n[[entries]]\nname = "late"\nkind = "overlay"\nsource = "overlay/sglang/late.py"\n'
                 'target = "python/sglang/late.py"\nwhy = "added after the tree was applied"\nbase = "v0.5.23"\n')
    update_hashes(load_series(series))
    before = files(series)
    res = invoke("refresh", "--check", "--tree", tree, as_json=False)
    assert res.code == 2 and "entries this tree was never applied with (late)" in res.err, res.err
    again = res.err.split("take them into the tree first: ", 1)[1].strip()
    assert again == f"c128patch rebase --onto v0.5.23 --tree {tree}" and files(series) == before
    assert run_printed(again).returncode == 0
    done = invoke("refresh", "--check", "--tree", tree)
    assert done.code == 0 and done.out["changed"] == [], done.out


ME = {"GIT_AUTHOR_NAME": "me", "GIT_AUTHOR_EMAIL": "me@x.invalid", "GIT_COMMITTER_NAME": "me",
      "GIT_COMMITTER_EMAIL": "me@x.invalid"}


def a_commit_of_mine(tree: Path, message: str) -> None:
    (tree / CUH).write_text((tree / CUH).read_text() + "// mine\n")
    Git(worktree=tree).with_env(**ME).run("commit", "-qam", message)


def test_a_plain_commit_is_no_new_entry_without_the_gate_trailer_lint_requires(applied, monkeypatch):
    """Finding 06: `refresh --series DIR` made a plain commit entry 0002 with no C128patch-Gate trailer, exit 0, and
    `lint` then failed on it while rebase, status and wheel went through. Refused before writing, in one line naming
    the trailer and the amend that adds it; that amend, run as printed, makes the refresh write an entry lint
    passes."""
    series, tree = applied
    a_commit_of_mine(tree, "mine")
    before = files(series)
    res = invoke("refresh", "--tree", str(tree), "--series", str(series), as_json=False)
    assert res.code == 2 and "without a 'C128patch-Gate:' trailer, which lint requires" in res.err, res.err
    assert res.err.rstrip().endswith("nothing was written") and len(res.err.strip().splitlines()) == 1, res.err
    assert files(series) == before
    check = invoke("refresh", "--check", "--tree", str(tree), "--series", str(series))
    assert check.code == 1 and any(n.startswith("refresh will refuse: commit ") for n in check.out["notes"])
    for key, value in ME.items():  # the amend as a user runs it (an identity of their own)
        monkeypatch.setenv(key, value)
    amend = run_printed(printed_command(res.err, "git -C "))
    assert amend.returncode == 0, amend.stderr
    done = invoke("refresh", "--tree", str(tree), "--series", str(series))
    assert done.code == 0 and done.out["lint_errors"] == [], done.out
    assert load_series(series).entries[-1].gate == ""
    assert invoke("lint", "--series", str(series), "--offline").code == 0


def test_the_printed_amend_that_adds_the_gate_trailer_runs_as_printed_with_no_git_identity(applied, monkeypatch):
    """A new user's machine has no git identity: the printed `git -C TREE commit --amend --trailer ...` failed
    ("Committer identity unknown"); it names one, as the tool's other printed commits do (treestate.git_command)."""
    series, tree = applied
    a_commit_of_mine(tree, "mine")
    for key in [*ME, "EMAIL"]:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", "/dev/null")
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    res = invoke("refresh", "--tree", str(tree), "--series", str(series), as_json=False)
    assert res.code == 2, res.err
    amend = run_printed(printed_command(res.err, "git -C "))
    assert amend.returncode == 0, (res.err, amend.stderr)
    assert invoke("refresh", "--tree", str(tree), "--series", str(series)).code == 0


def test_a_commit_gated_by_an_undescribed_variable_is_written_and_refresh_exits_1_with_lint_s_finding(applied):
    """The commit's own gate trailer becomes the new entry's gate; a gate the series' [[gates]] does not describe is
    lint's error on what was written: refresh says it and the lint to run after the fix, and exits 1."""
    series, tree = applied
    a_commit_of_mine(tree, "mine\n\nC128patch-Gate: SGLANG_MINE_ON")
    res = invoke("refresh", "--tree", str(tree), "--series", str(series), as_json=False)
    assert res.code == 1, res.err
    assert "  lint error: " in res.text and "SGLANG_MINE_ON" in res.text, res.text
    lint = printed_command(res.text, "c128patch lint")
    assert lint == f"c128patch lint --series {series}", res.text
    assert load_series(series).entries[-1].gate == "SGLANG_MINE_ON"
    shown = run_printed(lint)
    assert shown.returncode == 1 and "SGLANG_MINE_ON" in shown.stdout + shown.stderr, shown.stdout + shown.stderr


def test_refresh_keeps_the_users_text_of_the_values_it_does_not_change(applied):
    """A gate row the user wrote as docs/layers.md says (`default = '"INFO"'`, a TOML literal string, a comment after
    it) came back from a refresh that added an entry as `default = "\\"INFO\\""`, the comment gone: what refresh does
    not change keeps the user's text; what it changes (the entries, the version) is written as before; the user's
    comment lines stay above what they were above (a header; a value refresh changed) and at the end (helper 129)."""
    series, tree = applied
    manifest = series / "patches" / "series.toml"
    row = ("# our site's envs: ask ops before changing one\n[[gates]]\nname = 'SGLANG_MINE_ON'\n"
           "declared_by = \"upstream\"\ntype = 'str'\n"
           "default = '\"INFO\"'   # as environ.py writes it\nenables = 'my probe, on cold clocks'\n")
    text = manifest.read_text()
    assert text.count('\nversion = "') == 1
    text = text.replace('\nversion = "', '\n# bumped by refresh\nversion = "')  # a value refresh changes
    manifest.write_text(text + "\n" + row + "# the end\n")
    a_commit_of_mine(tree, "mine\n\nC128patch-Gate: SGLANG_MINE_ON")
    res = invoke("refresh", "--tree", str(tree), "--series", str(series))
    assert "patches/series.toml" in res.out["changed"], res.out
    written = load_series(series)
    assert written.entries[-1].gate == "SGLANG_MINE_ON" and written.gates[-1].default == '"INFO"'
    assert row in manifest.read_text(), manifest.read_text()  # the comment above its header too
    assert re.search(r'\n# bumped by refresh\nversion = "\d+"\n', manifest.read_text()), manifest.read_text()
    assert manifest.read_text().endswith("# the end\n") and manifest.read_text().count("# the end") == 1
    assert invoke("refresh", "--check", "--tree", str(tree), "--series", str(series)).out["changed"] == []


@pytest.mark.parametrize("flags", [("--primary", "--variant"), ("--variant", "--primary")], ids=["pv", "vp"])
def test_primary_and_variant_together_are_a_usage_error_not_the_last_one_winning(applied, flags, tmp_path):
    """`refresh --primary --variant` ran as --variant (the last of one --primary/--variant option won, silently):
    one line naming both, exit 2, nothing written; `watch` took the same option, and refuses the same way."""
    series, tree = applied
    before = files(series)
    line = refused(["refresh", *flags, "--tree", tree, "--series", series], tree,
                   "--primary and --variant together: give one of them, or neither")
    assert line.endswith("(see `c128patch refresh --help`)"), line
    assert files(series) == before
    refused(["watch", "--onto", "v0.5.23", *flags, "--out", tmp_path / "w", "--series", series], None,
            "--primary and --variant together")
    assert not (tmp_path / "w").exists()


def test_a_bad_contract_lock_line_is_fixed_by_the_command_printed(applied):
    """A lock line refresh never writes (an odd site) refused refresh too, whose message said to rewrite the lock with
    `c128patch refresh`: the fix printed could not work. It prints the line's deletion first; both work as printed."""
    import re

    from support import run_printed

    series, tree = applied
    lock = series / "patches" / "contract.lock"
    kept = lock.read_text() if lock.exists() else "# base v0.5.23\n"
    lock.write_text(kept + "function  sglang.a.f  /etc/passwd:3  python/sglang/a.py:10  sig=0123456789ab\n")
    code, out = cli("refresh", "--tree", str(tree), "--series", str(series))
    assert code != 0 and "not a contract line refresh writes" in out["error"], out
    delete, refresh = re.findall(r"`([^`]+)`", out["error"])
    assert run_printed(delete).returncode == 0 and refresh == f"c128patch refresh --series {series.absolute()}"
    assert run_printed(refresh, cwd=tree).returncode == 0  # (as printed: the lock's series, not the tool's own)
    assert "/etc/passwd" not in lock.read_text()
