"""Trust boundaries on the git side (docs/security.md), on the real release history: a hostile
series folder, a repository whose config names programs, the operator's own global settings and
exported GIT_* variables, option-like and git-dir `--tree` values, another user's repository and a
read-only tree. In each, the marker program never runs (it would touch a marker file), nothing is
written outside the tree or the series folder, and a refusal is one clear line with a non-zero exit."""

from __future__ import annotations

import base64
import contextlib
import difflib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from c128patch.errors import C128Error
from c128patch.fit import copies
from c128patch.git import Git, GitError
from c128patch.ops.lint import update_hashes
from c128patch.ops.treestate import rebase_command, rebase_journal
from c128patch.series.ledger import Conflict, Ledger
from c128patch.series.manifest import load_series
from c128patch.upstream.releases import cache_dir
from small_series import CUH, EDIT, LINE, series, tree  # noqa: F401 (fixtures)
from support import (
    OUT_OF_DISK,
    cli_process,
    failing_git,
    invoke,
    printed_command,
    refused,
    run_printed,
    small_clone,
    snapshot,
    upstream_commit,
)

OVERLAY = "python/sglang/c128_test_overlay.py"
HOOKS = ("pre-commit", "prepare-commit-msg", "commit-msg", "post-commit", "applypatch-msg", "pre-applypatch",
         "post-applypatch", "post-checkout", "post-rewrite", "post-index-change", "reference-transaction",
         "pre-auto-gc")


@pytest.fixture
def marker(tmp_path: Path) -> tuple[Path, Path]:
    """(program, marker): the program touches the marker, then passes its input through (a filter)
    and fails when asked to (a signer, a hook that should never be consulted)."""
    mark = tmp_path / "MARKER-RAN"
    prog = tmp_path / "marker-program"
    prog.write_text(f"#!/bin/sh\ntouch {mark}\ncat\n")
    prog.chmod(0o755)
    return prog, mark


def apply_args(tree: Path, series: Path, rev: str = "v0.5.23", *extra: str) -> list:
    return ["apply", "--sglang-rev", rev, "--repo", tree, "--series", series, *extra]


def set_entry(series: Path, old: str, new: str) -> None:
    manifest = series / "patches" / "series.toml"
    text = manifest.read_text()
    assert old in text
    manifest.write_text(text.replace(old, new))


def files_under(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


# ---------------------------------------------------------------------------- 1. a hostile series folder
@pytest.mark.parametrize("target", [".git/config", ".git/hooks/post-checkout", ".GIT/hooks/x", ".git./config",
                                    "python/.git /config", "GIT~1/config", "python/sglang/.gitattributes",
                                    ".gitmodules", "GITMOD~1", "python/gi7d29~2", "python/sglang/a\nb.py",
                                    "\uff0egit/hooks/post-checkout"])
def test_an_overlay_into_gits_own_files_is_refused_by_lint_and_apply(series, tree, marker, target):
    prog, mark = marker
    (series / "overlay" / "sglang" / "c128_test_overlay.py").write_text(f"[core]\n\tfsmonitor = {prog}\n")
    set_entry(series, f'target = "{OVERLAY}"', f"target = {target!r}".replace("'", '"').replace("\n", "\\n"))
    config = (tree / ".git" / "config").read_bytes()
    line = refused(["lint", "--offline", "--series", series], contains="unsafe path in")
    assert repr(target) in line, line
    refused(apply_args(tree, series), tree, "unsafe path in")
    refused(["check", "--sglang-rev", "v0.5.23", "--repo", tree, "--series", series], tree, "unsafe path in")
    assert ((tree / ".git" / "config").read_bytes() == config
            and not (tree / ".git" / "hooks" / "post-checkout").exists())
    subprocess.run(["git", "-C", str(tree), "status"], check=True, capture_output=True)  # the user's own git, after
    assert not mark.exists()


def test_a_patch_that_creates_a_git_hook_is_refused_as_unsafe_not_as_a_conflict(series, tree, marker):
    prog, mark = marker
    patch = series / "patches" / "0001-test.patch"
    text = patch.read_text()
    hook = (f"diff --git a/.git/hooks/post-checkout b/.git/hooks/post-checkout\nnew file mode 100755\n"
            f"index {'0' * 40}..{'1' * 40}\n--- /dev/null\n+++ b/.git/hooks/post-checkout\n@@ -0,0 +1,2 @@\n"
            f"+#!/bin/sh\n+{prog}\n")
    cut = text.index("diff --git ")
    patch.write_text(text[:cut] + hook + text[cut:])
    update_hashes(load_series(series))
    line = refused(apply_args(tree, series), tree, "unsafe path in patch 0001-test.patch: '.git/hooks/post-checkout'")
    assert "does not apply" not in line
    res = invoke("lint", "--offline", "--series", series, "--json")
    assert res.code == 1 and [f["message"] for f in res.out["findings"]] == [line.removeprefix("c128patch: error: ")]
    assert not (tree / ".git" / "hooks" / "post-checkout").exists() and not mark.exists()


@pytest.mark.parametrize("quoted", ['"{}/python/.gitattributes"', '"{}/python/\\056gitattributes"',
                                    '"{}/.gitmodules"'])
def test_a_patch_whose_paths_git_quotes_is_read_as_git_reads_it(series, tree, quoted):
    """Helper 148: git reads a C-quoted header path (`"b/python/.gitattributes"`, octal escapes too); unidiff kept the
    quotes, so every path rule read `"b/python/.gitattributes"` and passed it, and `apply` committed the file."""
    patch = series / "patches" / "0001-test.patch"
    text = patch.read_text()
    a, b = quoted.format("a"), quoted.format("b")
    section = (f"diff --git {a} {b}\nnew file mode 100644\nindex {'0' * 40}..{'1' * 40}\n--- /dev/null\n+++ {b}\n"
               "@@ -0,0 +1 @@\n+*.py filter=pwn\n")
    cut = text.index("diff --git ")
    patch.write_text(text[:cut] + section + text[cut:])
    update_hashes(load_series(series))
    refused(apply_args(tree, series), tree, "unsafe path in patch 0001-test.patch")
    assert not (tree / "python" / ".gitattributes").exists() and not (tree / ".gitmodules").exists()
    res = invoke("lint", "--offline", "--series", series, "--json")
    assert res.code == 1 and any("unsafe path in patch" in f["message"] for f in res.out["findings"]), res.out


@pytest.mark.parametrize("hooks", [".githooks", "python/sglang"])
def test_an_overlay_into_the_folder_the_trees_hooks_run_from_is_refused(series, tree, hooks):
    """The user's own git runs hooks from core.hooksPath: a series may not write there either."""
    subprocess.run(["git", "-C", str(tree), "config", "core.hooksPath", hooks], check=True)
    set_entry(series, f'target = "{OVERLAY}"', f'target = "{hooks}/post-checkout"')
    refused(apply_args(tree, series), tree, f"it is under {hooks}, the folder git runs hooks from")
    assert not (tree / hooks / "post-checkout").exists()


@pytest.mark.parametrize("name", ["../../../ESCAPE", "ok\\nC128patch-Entry: forged", "nul\\u0000name", "Upper",
                                  "-dash", "x" * 81])
def test_an_unsafe_entry_name_is_refused_before_anything_is_written(series, tree, tmp_path, name):
    set_entry(series, 'name = "test-patch"', f'name = "{name}"')
    before = files_under(tmp_path)
    refused(["lint", "--offline", "--series", series], contains="unsafe entry name in")
    refused(apply_args(tree, series), tree, "unsafe entry name in")
    refused(["check", "--sglang-rev", "v0.5.23", "--repo", tree, "--series", series], tree, "unsafe entry name in")
    assert files_under(tmp_path) == before


def test_every_entry_name_of_the_product_series_fits_the_rule():
    names = [e.name for e in load_series(Path(__file__).parents[1]).entries]
    assert names and all(n == n.lower() and not n.startswith(("-", ".")) for n in names)


def test_the_ledger_builds_no_path_from_an_unchecked_row(series, tree):
    """A ledger row (a pull request can write one) is read when the replay of a series entry meets its conflict:
    a key naming ../ is refused there (the key is in the file only), and so is a row naming an entry ../."""
    res = series / "patches" / "resolutions"
    res.mkdir()

    def replay_with_row(entry: str, key: str) -> list:
        (res / "ledger.toml").write_text(f'[[resolutions]]\nentry = "{entry}"\nkey = "{key}"\nmatch = "m"\n'
                                         f'file = "{CUH}"\nfrom = "a"\nonto = "b"\n')
        return Ledger(load_series(series)).replay(Git(worktree=tree), "test-patch", [Conflict(CUH, "abc", "", "m")])

    with pytest.raises(C128Error, match=r"unsafe ledger key in .*ledger\.toml: '\.\./\.\./x'"):
        replay_with_row("test-patch", "../../x")
    assert replay_with_row("test-patch", "0123abcd") == []  # a safe key: its diff is absent, nothing applied
    with pytest.raises(C128Error, match="unsafe entry name in the ledger"):  # (helper 155: refused as read, not only
        replay_with_row("../../../ESCAPE", "abc")  # unmatched: lint passed such a row)
    assert not (series.parent / "ESCAPE").exists() and not (tree.parent / "ESCAPE").exists()
    with pytest.raises(C128Error, match="unsafe entry name in the ledger"):
        Ledger(load_series(series))._diff_path("../../../ESCAPE", "abc")


# -------------------------------------------------------------------------- 2. a repository whose config names programs
def hostile_config(repo: Path, prog: Path) -> None:
    """fsmonitor, a clean/smudge filter on every file (info/attributes), diff drivers and every hook."""
    git = ["git", "-C", str(repo), "config"]
    for key, value in (("core.fsmonitor", str(prog)), ("filter.evil.clean", str(prog)),
                       ("filter.evil.smudge", str(prog)),
                       ("filter.evil.required", "true"), ("diff.evil.textconv", str(prog)),
                       ("diff.evil.command", str(prog))):
        subprocess.run([*git, key, value], check=True)
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "attributes").write_text("* filter=evil diff=evil\n")
    hooks = repo / ".git" / "hooks"
    hooks.mkdir(exist_ok=True)
    for hook in HOOKS:
        (hooks / hook).write_text(f"#!/bin/sh\n{prog} </dev/null\nexit 1\n")
        (hooks / hook).chmod(0o755)


def test_a_repository_whose_config_names_programs_runs_none_of_them(series, tree, marker, sglang_release_repo,
                                                                    tmp_path):
    prog, mark = marker
    clean = small_clone(sglang_release_repo, tmp_path / "clean").worktree
    hostile_config(tree, prog)
    res = invoke("check", "--sglang-rev", "v0.5.23", "--repo", tree, "--series", series)
    assert res.code == 0, res.err
    assert not mark.exists(), "check ran a program the repository's config names"
    res = invoke(*apply_args(tree, series))
    assert res.code == 0, res.err
    assert not mark.exists(), "apply ran a program the repository's config names"
    assert invoke(*apply_args(clean, series)).code == 0
    assert Git(worktree=tree).head() == Git(worktree=clean).head()  # the same commits as in a plain clone
    assert invoke("status", "--tree", tree, "--series", series).code == 0 and not mark.exists()


def signed_commit(repo: Path) -> str:
    """A commit on HEAD with a (fake) signature header: what makes ``log.showSignature`` call the gpg program."""
    git = Git(worktree=repo)
    body = (f"tree {git.out('rev-parse', 'HEAD^{tree}')}\nparent {git.head()}\nauthor A <a@b> 1700000000 +0000\n"
            "committer A <a@b> 1700000000 +0000\ngpgsig -----BEGIN PGP SIGNATURE-----\n \n iQEz\n"
            " -----END PGP SIGNATURE-----\n\nsigned\n")
    sha = git.out("hash-object", "-t", "commit", "-w", "--stdin", input=body)
    git.run("update-ref", "HEAD", sha)
    return sha


def test_a_config_that_shows_signatures_runs_no_gpg_program(series, tree, marker, sglang_release_repo, tmp_path):
    """log.showSignature with gpg.program (and its ssh and x509 kin): every log of a signed commit would run it."""
    prog, mark = marker
    assert invoke(*apply_args(tree, series)).code == 0
    user = small_clone(sglang_release_repo, tmp_path / "user").worktree
    shas = {}
    for repo in (tree, user):
        for key, value in (("gpg.program", prog), ("gpg.ssh.program", prog), ("gpg.x509.program", prog),
                           ("log.showSignature", "true")):
            subprocess.run(["git", "-C", str(repo), "config", key, str(value)], check=True)
        shas[repo] = signed_commit(repo)
    subprocess.run(["git", "-C", str(tree), "log", "-1"], capture_output=True)
    assert mark.exists(), "the trap does not fire for a plain git log"
    mark.unlink()
    for as_json in (True, False):
        assert invoke("status", "--tree", tree, "--series", series, as_json=as_json).code == 0
    assert not mark.exists(), "status ran the gpg program the tree's config names"
    res = invoke("apply", "--sglang-rev", shas[user], "--repo", user, "--series", series)
    assert res.code == 0, res.err
    assert not mark.exists(), "apply --repo ran the gpg program the repository's config names"


def test_a_repository_whose_config_names_a_merge_program_is_refused(series, tree, marker):
    prog, mark = marker
    subprocess.run(["git", "-C", str(tree), "config", "merge.evil.driver", f"{prog} %A"], check=True)
    refused(["check", "--sglang-rev", "v0.5.23", "--repo", tree, "--series", series],
            contains="its git config names a merge program (merge.evil.driver")
    assert not mark.exists()


def test_a_submodules_own_filter_never_runs_and_status_still_sees_the_trees_own_changes(series, tree, marker,
                                                                                       tmp_path):
    """A tree holding a submodule whose own config names a clean and a smudge filter; the tree's config asks git into
    it (``submodule.recurse``, the submodule's ``ignore = none``, which beats ``diff.ignoreSubmodules``), so does
    .gitmodules. git's status, diff, commit and stash would run the clean filter on a touched file there, a checkout
    moving the submodule to the rev's commit the smudge: the tool's git never enters a submodule (apply, status,
    commit, stash), and status still lists the tree's own change and the submodule left at another commit."""
    prog, mark = marker
    me = ["-c", "user.name=t", "-c", "user.email=t@t.invalid"]
    sub = tmp_path / "subsrc"
    subprocess.run(["git", "init", "--quiet", str(sub)], check=True)
    (sub / ".gitattributes").write_text("*.txt filter=y\n")
    for text in ("a\n", "b\n"):
        (sub / "f.txt").write_text(text)
        subprocess.run(["git", "-C", str(sub), "add", "."], check=True)
        subprocess.run(["git", "-C", str(sub), *me, "commit", "--quiet", "-m", text], check=True)
    path = str(Path(CUH).parent / "sub")
    git = ["git", "-C", str(tree)]
    subprocess.run([*git, "-c", "protocol.file.allow=always", "submodule", "--quiet", "add", str(sub), path],
                   check=True)
    subprocess.run([*git, "config", "-f", ".gitmodules", f"submodule.{path}.ignore", "none"], check=True)
    subprocess.run([*git, "add", ".gitmodules"], check=True)
    subprocess.run([*git, *me, "commit", "--quiet", "-m", "upstream: a submodule"], check=True)
    rev = Git(worktree=tree).head()  # the rev applied: the submodule at its second commit, the tree at its first
    subprocess.run(["git", "-C", str(tree / path), "checkout", "--quiet", "HEAD~"], check=True)
    subprocess.run([*git, *me, "commit", "--quiet", "-am", "mine: the submodule's first commit"], check=True)
    for key, value in (("submodule.recurse", "true"), (f"submodule.{path}.ignore", "none")):
        subprocess.run([*git, "config", key, value], check=True)
    for key in ("clean", "smudge"):
        subprocess.run(["git", "-C", str(tree / path), "config", f"filter.y.{key}", str(prog)], check=True)

    def touch() -> None:  # the submodule's file no longer matches its index: its status would clean it again
        os.utime(tree / path / "f.txt", (1, 1))

    touch()
    res = invoke(*apply_args(tree, series, rev))
    assert res.code == 0 and not mark.exists(), res.err
    touch()
    (tree / CUH).write_text((tree / CUH).read_text() + "// mine\n")
    res = invoke("status", "--tree", tree, "--series", series)
    assert res.code == 1 and res.out["uncommitted"] == [CUH, path] and not mark.exists(), res.err  # (1: not clean)
    for command in (["commit", "--quiet", "-m", "x"], ["stash", "create", "x"]):  # (nothing staged: a status)
        touch()
        Git(worktree=tree).run(*command, check=False)
        assert not mark.exists(), command
    subprocess.run([*git, "rm", "--quiet", ".gitmodules"], check=True)  # a submodule .gitmodules does not name
    subprocess.run([*git, *me, "commit", "--quiet", "-m", "no .gitmodules"], check=True)
    mark.unlink(missing_ok=True)  # (the user's own git, not the tool's)
    touch()
    Git(worktree=tree).run("commit", "--quiet", "-m", "x", check=False)
    assert not mark.exists()


@pytest.mark.parametrize("key", ["include.path", "includeIf.gitdir:**/.path"])
def test_a_repository_whose_config_includes_a_file_is_refused_before_the_file_can_change(series, tree, marker, key):
    """The config includes ``../evil.cfg``, a file of the work tree absent at HEAD that the upstream rev being applied
    adds (with a filter and a ``.gitattributes`` naming it): once checked out, every later git call would run that
    filter, and the config check (cached by .git/config's stat) would not see it. Any include is refused, one line."""
    prog, mark = marker
    git = Git(worktree=tree)

    def add_config(idx: Git) -> None:
        for path, text in (("evil.cfg", f'[filter "x"]\n\tclean = {prog}\n\tsmudge = {prog}\n'),
                           (".gitattributes", "* filter=x\n")):
            blob = idx.out("hash-object", "-w", "--stdin", input=text)
            idx.run("update-index", "--add", "--cacheinfo", f"100644,{blob},{path}")

    rev = upstream_commit(git, "v0.5.23", "upstream: a config file", add_config)
    before = snapshot(tree)
    subprocess.run(["git", "-C", str(tree), "config", key, "../evil.cfg"], check=True)
    for verb in (apply_args(tree, series, rev), ["status", "--tree", tree, "--series", series]):
        refused(verb, contains=f"its git config names another config file to include, which may change after this "
                f"check ({key.lower()} = ../evil.cfg)")  # (git prints a section's name in lower case)
    assert not mark.exists()
    subprocess.run(["git", "-C", str(tree), "config", "--unset", key], check=True)
    assert snapshot(tree) == before


@pytest.mark.parametrize("key", ["trailer.x.command", "trailer.x.cmd"])
def test_a_repository_whose_config_names_a_trailer_program_is_refused(series, tree, marker, key):
    """git runs ``trailer.<token>.command``/``cmd`` on every ``commit --trailer``, which apply runs for a patch without
    its entry trailer (the test series' has none): refused in one line like a merge program, before any commit."""
    prog, mark = marker
    before = snapshot(tree)  # (the tool's git refuses the tree while the setting is there)
    subprocess.run(["git", "-C", str(tree), "config", key, f"{prog} </dev/null; echo v"], check=True)
    refused(apply_args(tree, series), contains=f"its git config names a trailer program ({key} = ")
    assert not mark.exists()
    subprocess.run(["git", "-C", str(tree), "config", "--unset", key], check=True)
    assert snapshot(tree) == before


def test_a_trees_config_moving_its_worktree_elsewhere_is_refused_and_the_printed_fix_works(series, tree, tmp_path):
    """``core.worktree`` in the tree's config: git would check out and commit in that folder, not the tree given
    (helper 100). Refused before anything is written there or in the tree; the printed unset works as printed."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    before = snapshot(tree)
    subprocess.run(["git", "-C", str(tree), "config", "core.worktree", str(elsewhere)], check=True)
    line = refused(apply_args(tree, series), contains="its git config sets core.worktree = ")
    assert list(elsewhere.iterdir()) == []
    assert run_printed(printed_command(line, "git -C ")).returncode == 0
    assert snapshot(tree) == before
    assert invoke(*apply_args(tree, series)).code == 0


@pytest.mark.parametrize("how", ["name-with-equals", "on-a-branch"])
def test_a_filter_the_tool_cannot_turn_off_is_refused_before_anything_runs(series, tree, marker, tmp_path, how):
    """``-c filter.x=y.clean=`` sets ``filter.x`` (git splits at the first ``=``), so a filter named ``x=y`` cannot be
    turned off; a filter in a file the config includes on a branch turns on when apply checks out ``c128/...``,
    after the check. Both are refused in one line, before any git call that reads a file."""
    prog, mark = marker
    config = ["git", "-C", str(tree), "config"]
    if how == "name-with-equals":
        for key in ("clean", "smudge"):
            subprocess.run([*config, f"filter.x=y.{key}", str(prog)], check=True)
        attribute, said = "* filter=x=y\n", "names a program under a name c128patch cannot turn off (filter.x=y."
    else:
        (tmp_path / "evil.inc").write_text(f'[filter "evil"]\n\tsmudge = {prog}\n\tclean = {prog}\n')
        subprocess.run([*config, "includeIf.onbranch:c128/**.path", str(tmp_path / "evil.inc")], check=True)
        attribute, said = "* filter=evil\n", "another config file to include, which may change after this check"
    (tree / ".git" / "info").mkdir(exist_ok=True)
    (tree / ".git" / "info" / "attributes").write_text(attribute)
    refs = ["git", "-C", str(tree), "for-each-ref", "--format=%(refname) %(objectname)"]  # (git status would run it)
    before = subprocess.run(refs, capture_output=True, text=True, check=True).stdout
    for verb in (["check", "--sglang-rev", "v0.5.23", "--repo", tree, "--series", series], apply_args(tree, series),
                 ["status", "--tree", tree, "--series", series]):
        refused(verb, contains=said)
    assert subprocess.run(refs, capture_output=True, text=True, check=True).stdout == before and not mark.exists()


def test_a_textconv_program_of_the_trees_config_never_runs_in_a_rebase(series, tree, marker):
    """The rebase report's ``git range-diff`` runs a ``git log -p`` of its own, which takes no ``--no-textconv``: the
    tree's textconv programs are set to ``cat`` (and their cache off) for every call instead."""
    prog, mark = marker
    assert invoke(*apply_args(tree, series)).code == 0
    subprocess.run(["git", "-C", str(tree), "config", "diff.evil.textconv", str(prog)], check=True)
    subprocess.run(["git", "-C", str(tree), "config", "diff.evil.cachetextconv", "true"], check=True)
    (tree / ".git" / "info").mkdir(exist_ok=True)
    (tree / ".git" / "info" / "attributes").write_text("* diff=evil\n")
    res = invoke("rebase", "--onto", "v0.5.22", "--tree", tree, "--series", series)
    assert res.code == 0 and res.out["range_diff"], res.err
    assert not mark.exists() and not Git(worktree=tree).out("for-each-ref", "refs/notes")


def test_a_trees_config_redirecting_the_fetch_or_naming_an_alternate_refs_command_runs_nothing(series, marker,
                                                                                             packed_release_repo,
                                                                                             tmp_path):
    """apply into an existing tree, and rebase onto a commit the tree lacks, fetch from the source into the tree: a
    ``url.<x>.insteadOf`` in the tree's config could send that fetch to ``ext::`` or to ssh with its
    ``core.sshCommand``, an ``core.alternateRefsCommand`` runs during it. The fetch reads none of the tree's config."""
    prog, mark = marker
    source = tmp_path / "source.git"
    subprocess.run(["git", "clone", "--quiet", "--bare", "--shared", str(packed_release_repo), str(source)], check=True)
    other = tmp_path / "other"
    subprocess.run(["git", "init", "--quiet", str(other)], check=True)
    me = ["-c", "user.name=t", "-c", "user.email=t@t.invalid"]  # (CI has no git identity)
    subprocess.run(["git", "-C", str(other), *me, "commit", "--quiet", "--allow-empty", "-m", "x"], check=True)
    tree = tmp_path / "tree"
    subprocess.run(["git", "init", "--quiet", str(tree)], check=True)
    subprocess.run(["git", "-C", str(tree), *me, "commit", "--quiet", "--allow-empty", "-m", "init"], check=True)
    (tree / ".git" / "objects" / "info" / "alternates").write_text(f"{other / '.git' / 'objects'}\n")
    for key, value in (("core.alternateRefsCommand", str(prog)), ("protocol.ext.allow", "always"),
                       (f"url.ext::sh -c {prog}% #.insteadOf", str(source)), ("core.sshCommand", str(prog))):
        subprocess.run(["git", "-C", str(tree), "config", key, value], check=True)
    res = invoke("apply", "--sglang-rev", "v0.5.23", "--repo", source, "--tree", tree, "--series", series)
    assert res.code == 0 and not mark.exists(), res.err
    assert Git(worktree=tree).out("tag", "--list", "v0.5.2*").split() == ["v0.5.20", "v0.5.21", "v0.5.22", "v0.5.23"]

    def add_file(idx: Git) -> None:
        blob = idx.out("hash-object", "-w", "--stdin", input="new\n")
        idx.run("update-index", "--add", "--cacheinfo", f"100644,{blob},python/NEW.txt")

    newer = upstream_commit(Git(git_dir=source), "v0.5.23", "upstream work", add_file)
    assert Git(worktree=tree).rev_parse(newer) is None
    res = invoke("rebase", "--onto", newer, "--repo", source, "--tree", tree, "--series", series)
    assert res.code == 0 and not mark.exists(), res.err


# ---------------------------------------------------------------------------- 3. the operator's own settings
def test_the_operators_global_settings_and_git_variables_change_nothing(series, tree, marker, sglang_release_repo,
                                                                        tmp_path):
    """A global prepare-commit-msg hook that edits messages, a failing post-checkout hook, signing with
    a failing signer (global and system config), and exported GIT_DIR/GIT_WORK_TREE/GIT_INDEX_FILE and
    identity pointing elsewhere: the same commit ids as with a clean HOME, nothing run, the decoy untouched."""
    prog, mark = marker
    clean = small_clone(sglang_release_repo, tmp_path / "clean").worktree
    decoy = small_clone(sglang_release_repo, tmp_path / "decoy").worktree
    home, hooks = tmp_path / "home", tmp_path / "global-hooks"
    hooks.mkdir()
    (hooks / "prepare-commit-msg").write_text(f'#!/bin/sh\n{prog} </dev/null\necho "edited by a hook" >> "$1"\n')
    (hooks / "post-checkout").write_text(f"#!/bin/sh\n{prog} </dev/null\nexit 1\n")
    for hook in hooks.iterdir():
        hook.chmod(0o755)
    home.mkdir()
    (home / ".gitconfig").write_text(f"[core]\n\thooksPath = {hooks}\n\tfsmonitor = {prog}\n"
                                     "[commit]\n\tgpgSign = true\n"
                                     f"[gpg]\n\tprogram = {prog}\n[am]\n\tmessageId = true\n"
                                     "[format]\n\tsignOff = true\n"
                                     "[color]\n\tui = always\n"
                                     "[user]\n\tname = Someone Else\n\temail = else@example.invalid\n")
    system = tmp_path / "system-gitconfig"
    system.write_text(f"[tag]\n\tgpgSign = true\n[gpg]\n\tprogram = {prog}\n")
    decoy_state = snapshot(decoy)
    env = {"HOME": str(home), "C128PATCH_CACHE": str(cache_dir()), "GIT_CONFIG_SYSTEM": str(system),
           "GIT_CONFIG_GLOBAL": None,
           "GIT_DIR": str(decoy / ".git"), "GIT_WORK_TREE": str(decoy), "GIT_INDEX_FILE": str(tmp_path / "stray.index"),
           "GIT_AUTHOR_NAME": "Exported Name", "GIT_COMMITTER_EMAIL": "exported@example.invalid"}
    res = invoke(*apply_args(tree, series, "v0.5.22"), env=env)
    assert res.code == 0, res.err
    assert invoke(*apply_args(clean, series, "v0.5.22")).code == 0
    ours, theirs = Git(worktree=tree), Git(worktree=clean)
    assert ours.out("log", "--format=%H", "v0.5.22..HEAD") == theirs.out("log", "--format=%H", "v0.5.22..HEAD")
    assert invoke("status", "--tree", tree, "--series", series, env=env).code == 0  # the tree equals the series
    assert not mark.exists() and not (tmp_path / "stray.index").exists()
    assert snapshot(decoy) == decoy_state


def test_the_operators_attributes_and_ignore_files_change_nothing(series, tree, sglang_release_repo, tmp_path):
    """git reads $XDG_CONFIG_HOME/git/attributes and .../ignore whatever GIT_CONFIG_GLOBAL says: `* -diff` made
    refresh write binary hunks, `eol=crlf` checked the tree out with CRLF, an ignored provenance file failed apply's
    `git add`. With them: the same commits as with none, LF files, the series up to date."""
    clean = small_clone(sglang_release_repo, tmp_path / "clean").worktree
    xdg = tmp_path / "xdg"
    (xdg / "git").mkdir(parents=True)
    (xdg / "git" / "attributes").write_text("* -diff\n*.cuh eol=crlf\n")
    (xdg / "git" / "ignore").write_text("*.json\n")
    env = {"XDG_CONFIG_HOME": str(xdg)}
    res = invoke(*apply_args(tree, series, "v0.5.22"), env=env)
    assert res.code == 0, res.err
    assert invoke(*apply_args(clean, series, "v0.5.22")).code == 0
    ours, theirs = Git(worktree=tree), Git(worktree=clean)
    assert ours.out("log", "--format=%H", "v0.5.22..HEAD") == theirs.out("log", "--format=%H", "v0.5.22..HEAD")
    assert b"\r\n" not in (tree / CUH).read_bytes()
    res = invoke("refresh", "--check", "--tree", tree, "--series", series, env=env)
    assert res.code == 0, res.err + res.stdout


# ---------------------------------------------------------------------------- 4. --tree values
@pytest.mark.parametrize("value", ["--bare", "--template={tmp}/tpl", "--upload-pack=touch {tmp}/MARKER-RAN"])
def test_an_option_like_tree_never_reaches_git(series, tmp_path, monkeypatch, value):
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    value = value.format(tmp=tmp_path)
    line = refused(["apply", "--sglang-rev", "v0.5.23", "--series", series, f"--tree={value}"],
                   contains="looks like an option, not a folder")
    assert f"./{value}" in line
    assert list(work.iterdir()) == [] and not (tmp_path / "MARKER-RAN").exists() and not (tmp_path / "tpl").exists()


@pytest.mark.parametrize("inside", [".git", ".git/new", ".git/refs"])
def test_a_tree_inside_a_git_dir_is_refused_with_nothing_to_delete(series, tree, inside):
    before = files_under(tree / ".git")
    line = refused(["apply", "--sglang-rev", "v0.5.23", "--series", series, "--tree", tree / inside], tree,
                   "is inside a git dir")
    assert "remove" not in line and "rm " not in line
    assert files_under(tree / ".git") == before
    if (tree / inside).is_dir():
        refused(["status", "--tree", tree / inside], tree, "is inside a git dir")


def test_a_bare_repository_is_no_tree(series, sglang_release_repo, tmp_path):
    bare = tmp_path / "bare.git"
    subprocess.run(["git", "clone", "--quiet", "--bare", "--shared", str(sglang_release_repo), str(bare)], check=True)
    refused(["apply", "--sglang-rev", "v0.5.23", "--series", series, "--tree", bare / "new"],
            contains="is inside a git dir")
    assert not (bare / "new").exists()


# ---------------------------------------------------------------------------- 5. environment failures say what they are
def test_a_repository_owned_by_another_user_is_named_as_such_and_the_printed_fix_works(tree, tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("C128PATCH_CACHE", str(cache_dir()))  # before HOME moves
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("GIT_CONFIG_GLOBAL", raising=False)
    if os.geteuid() != 0:  # (git's GIT_TEST_ASSUME_DIFFERENT_OWNER never reaches the tool's git)
        pytest.skip("needs root, to give the tree to another user")
    monkeypatch.delenv("SUDO_UID", raising=False)  # (root under sudo: git takes SUDO_UID for the owner)
    for folder in (tree, tree / ".git"):
        os.chown(folder, 54321, 54321)
    line = refused(["status", "--tree", tree], contains="it is owned by another user")
    assert "not a git repository" not in line and "dubious ownership" in line
    fix = printed_command(line, "git config --global")
    assert run_printed(fix).returncode == 0
    res = invoke("status", "--tree", tree, as_json=False)
    assert "owned by another user" not in res.err and "no c128patch series is applied in" in res.err, res.err


def test_gits_test_knobs_never_reach_the_tools_git(series, tree, monkeypatch):
    """GIT_TEST_ASSUME_DIFFERENT_OWNER=1 exported (git's own test knob) made every repository "owned by another
    user", a line whose printed fix changed nothing; GIT_TEST_* never reaches the tool's git."""
    monkeypatch.setenv("GIT_TEST_ASSUME_DIFFERENT_OWNER", "1")
    res = invoke(*apply_args(tree, series), as_json=False)
    assert res.code == 0 and "owned by another user" not in res.err, res.err
    assert invoke("status", "--tree", tree, "--series", series).code == 0


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """``folder`` not writable, for root too (the immutable flag; skipped where it cannot be set)."""
    if os.geteuid() == 0:
        if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
            pytest.skip("root, and chattr +i is not available here")
        undo = ["chattr", "-i", str(folder)]
    else:
        folder.chmod(0o555)
        undo = ["chmod", "755", str(folder)]
    try:
        yield
    finally:
        subprocess.run(undo, check=True)


@pytest.mark.parametrize("folder", [str(Path(CUH).parent), "python/sglang"], ids=["patch", "overlay"])
def test_a_read_only_tree_is_a_permission_error_not_a_conflict(series, tree, folder):
    with read_only(tree / folder):
        res = invoke(*apply_args(tree, series), as_json=False)
    first = res.err.strip().splitlines()[0]
    assert res.code == 2 and first.startswith("c128patch: error: "), res.err
    assert "Permission denied" in first or "Operation not permitted" in first, res.err
    assert "does not apply" not in res.err and "conflict" not in first
    assert Git(worktree=tree).rev_parse("refs/heads/main") is not None  # the user's branch is there
    resume = printed_command(res.err, "c128patch apply --continue")
    assert run_printed(resume).returncode == 0  # writable again: the printed resume finishes the apply



@pytest.mark.parametrize("verb", ["apply", "check"])
def test_a_patch_with_a_bad_rename_header_is_refused_as_corrupt_not_as_a_conflict(series, tree, verb):
    patch = series / "patches" / "0001-test.patch"
    text = patch.read_text()
    header = f"diff --git a/{CUH} b/{CUH}\n"
    assert header in text
    patch.write_text(text.replace(header, header + f"similarity index 90%\nrename from python/sglang/elsewhere.cuh\n"
                                  f"rename to {CUH}\n", 1))
    update_hashes(load_series(series))
    args = apply_args(tree, series) if verb == "apply" else ["check", "--sglang-rev", "v0.5.23", "--repo", tree,
                                                            "--series", series]
    line = refused(args, tree, "corrupt patch 0001-test.patch: 'rename from python/sglang/elsewhere.cuh' names "
                               "another path than its diff header")
    assert "does not apply" not in line and "conflict" not in line


@pytest.mark.parametrize("old", ["a/python/sglang/elsewhere.cuh", "{CUH}"], ids=["another-path", "no-prefix"])
@pytest.mark.parametrize("verb", ["apply", "check", "lint"])
def test_a_patch_whose_old_name_line_differs_from_its_diff_header_is_refused_as_corrupt(series, tree, verb, old):
    """helper 167: ``diff --git a/X b/X`` then ``--- a/Y``: git takes Y as the old path (a rename of Y to X: Y removed,
    X written from Y's lines, ``git apply`` says ``Y => X``), unidiff and every check the header's X only; lint passed
    it, check said "applies" where apply then failed on Y. Refused as corrupt, naming the line. ``--- python/x`` (no
    ``a/``) is ``sglang/x``'s old path to git (-p1 drops the first part, whatever it is): as another path."""
    patch = series / "patches" / "0001-test.patch"
    text, old = patch.read_text(), old.format(CUH=CUH)
    assert f"--- a/{CUH}\n" in text
    patch.write_text(text.replace(f"--- a/{CUH}\n", f"--- {old}\n", 1))
    update_hashes(load_series(series))
    said = f"corrupt patch 0001-test.patch: '--- {old}' names another path than its diff header"
    if verb == "lint":
        res = invoke("lint", "--offline", "--series", series, as_json=False)
        assert res.code == 1 and said in res.err + res.text, (res.code, res.err, res.text)
        return
    refused(apply_args(tree, series) if verb == "apply" else ["check", "--sglang-rev", "v0.5.23", "--repo", tree,
                                                              "--series", series], tree, said)


@pytest.mark.parametrize("encoding", ["quoted-printable", "format=flowed", "quoted-printable, a second message",
                                      "quoted-printable, a second message from 'From c128 1x00:00 2001:'",
                                      "quoted-printable, a second message from 'From c128patch 0 00:00+2001'",
                                      "multipart, its Content-Type an RFC 2047 encoded word"])
def test_a_series_patch_whose_mail_git_am_decodes_is_refused_before_anything_is_written(series, tree, encoding):
    """Our own series' patch file, its mail quoted-printable (or flowed; or a second message of the file, which git am
    splits off and reads as its own mail: a series' file may hold several, from any line git's ``is_from_line`` takes,
    a colon after the year, no blank before it): a file diff (a .gitattributes) the raw text hides, git am decodes.
    ``patchfile._parse`` (every diff reader) refuses it through ``trailers.check_message``."""
    patch = series / "patches" / "0001-test.patch"
    text = patch.read_text()
    hidden = ("diff --git a/python/.gitattributes b/python/.gitattributes\nnew file mode 100644\n--- /dev/null\n"
              "+++ b/python/.gitattributes\n@@ -0,0 +1 @@\n+* filter=evil\n")
    if encoding.startswith("quoted-printable"):
        header, lines = "Content-Transfer-Encoding: quoted-printable", [f"={ord(x[0]):02X}{x[1:]}" for x in
                                                                         hidden.splitlines()]
    elif encoding.startswith("multipart"):  # git mailinfo decodes the header first, then reads the part's base64
        word = base64.b64encode(b'multipart/mixed; boundary="ZZ"').decode()
        header, lines = f"Content-Type: =?us-ascii?b?{word}?=", ["--ZZ", "Content-Transfer-Encoding: base64", "",
                                                                base64.b64encode(hidden.encode()).decode(), "--ZZ--"]
    else:
        header, lines = "Content-Type: text/plain; charset=UTF-8; format=flowed", [f" {x}" for x in hidden.splitlines()]
    head, blank, rest = text.partition("\n\n")
    head = "\n".join(line for line in head.split("\n") if not line.lower().startswith(("content-type",
                                                                                      "content-transfer")))
    first = f"{text}\n" if "a second message" in encoding else ""
    if "from '" in encoding:  # that message's mbox line: one git splits at, not the usual date
        head = encoding.split("'")[1] + head[head.index("\n"):]
    patch.write_text(f"{first}{head}\n{header}{blank}{rest}" + "\n".join(lines) + "\n")
    update_hashes(load_series(series))
    says = "format=flowed" if encoding == "format=flowed" else "RFC 2047" if encoding.startswith("multipart") else \
        "transfer encoding 'quoted-printable'"
    for args in (apply_args(tree, series), ["check", "--sglang-rev", "v0.5.23", "--repo", tree, "--series", series]):
        line = refused(args, tree, contains="corrupt patch 0001-test.patch: ")
        assert says in line, line
    res = invoke("lint", "--offline", "--series", series, as_json=False)  # lint lists it as one of its errors
    assert res.code == 1 and "error: test-patch: corrupt patch 0001-test.patch: " in res.text, res.text
    assert says in res.text, res.text
    assert not (tree / "python" / ".gitattributes").exists()
    assert Git(worktree=tree).rev_parse("refs/heads/c128/v0.5.23") is None


@pytest.mark.parametrize("moved", ["copy to .githooks/post-checkout", "copy to .gitattributes",
                                   "rename to python/sglang/x.py"])
def test_a_hunkless_copy_or_rename_to_another_path_than_its_header_is_refused(series, tree, moved):
    """git applies a ``copy to``/``rename to`` line where it says, and with no hunk never checks it against the
    ``diff --git`` header, which unidiff and so every path rule read: such a patch is refused before anything."""
    patch = series / "patches" / "0001-test.patch"
    text = patch.read_text()
    cut = text.index("diff --git ")
    kind = moved.split()[0]
    section = (f"diff --git a/{CUH} b/{CUH}\nsimilarity index 100%\n{kind} from {CUH}\n{moved}\n")
    patch.write_text(text[:cut] + section + text[cut:])
    update_hashes(load_series(series))
    for args in (apply_args(tree, series), ["check", "--sglang-rev", "v0.5.23", "--repo", tree, "--series", series]):
        refused(args, tree, f"corrupt patch 0001-test.patch: '{moved}' names another path than its diff header")
    assert not (tree / ".githooks").exists() and not (tree / ".gitattributes").exists()


def upstream_edits_the_same_line(git: Git, tree: Path) -> str:
    """A commit on v0.5.23 editing the line an entry edits in ``CUH``: a rebase onto it stops at a conflict."""
    idx = git.with_env(GIT_INDEX_FILE=str(tree / ".git" / "other.index"))
    idx.run("read-tree", "v0.5.23")
    text = git.blob("v0.5.23", CUH).decode().replace(LINE, LINE.rstrip("\n") + "  // upstream's change\n")
    idx.run("update-index", "--cacheinfo", f"100644,{git.out('hash-object', '-w', '--stdin', input=text)},{CUH}")
    return git.out("commit-tree", idx.out("write-tree"), "-p", "v0.5.23", "-m", "upstream edits the same line")


def stopped_rebase(series, tree) -> tuple[Git, Path, dict]:
    """The series applied on ``tree``, a rebase onto an upstream edit of our line stopped at its conflict: the git,
    the rebase journal's path and its data."""
    from c128patch.ops.treestate import rebase_journal

    git = Git(worktree=tree)
    assert invoke(*apply_args(tree, series), as_json=False).code == 0
    onto = upstream_edits_the_same_line(git, tree)
    assert invoke("rebase", "--onto", onto, "--tree", tree, "--series", series, as_json=False).code == 1
    path = rebase_journal(git)
    return git, path, json.loads(path.read_text())


def test_an_entry_named_escape_in_a_rebase_journal_never_reaches_the_ledger_through_continue(series, tree):
    """A rebase stopped at a conflict, its journal's entry renamed ``../../../ESCAPE``, the conflict resolved:
    `rebase --continue` refuses the name in one line; no ESCAPE path is made and the ledger records nothing."""
    git, path, data = stopped_rebase(series, tree)
    assert data["steps"][data["pos"]]["name"] == "test-patch"
    data["steps"][data["pos"]]["name"] = "../../../ESCAPE"
    path.write_text(json.dumps(data))
    text = (tree / CUH).read_text()
    start, end = text.index("<<<<<<<"), text.index(">>>>>>>")
    (tree / CUH).write_text(text[:start] + LINE.rstrip("\n") + "  // resolved\n" + text[text.index("\n", end) + 1:])
    git.run("add", CUH)
    refused(["rebase", "--continue", "--tree", tree], contains="unsafe entry name")
    assert not [p for root in (tree.parent, series.parent) for p in root.rglob("*ESCAPE*")]
    assert not (series / "patches" / "resolutions").exists()


@pytest.mark.parametrize("how", ["attributes", "config"])
def test_an_upstream_union_merge_attribute_never_turns_a_conflict_into_an_applied_entry(series, tree, how):
    """Upstream edits the line our entry edits and commits `*.cuh merge=union` (or the tree's config says
    `merge.default = union`): git's 3-way merge kept both lines, and apply said "identical to a fresh apply", rebase
    "clean", of a file that no longer compiles. Both stop at the conflict, as without it."""
    git = Git(worktree=tree)

    def edit(idx: Git) -> None:
        text = git.blob("v0.5.23", CUH).decode().replace(LINE, LINE.rstrip("\n") + "  // upstream's change\n")
        files = {CUH: text, **({".gitattributes": "*.cuh merge=union\n"} if how == "attributes" else {})}
        for path, body in files.items():
            blob = idx.out("hash-object", "-w", "--stdin", input=body)
            idx.run("update-index", "--add", "--cacheinfo", f"100644,{blob},{path}")

    onto = upstream_commit(git, "v0.5.23", "upstream edits the same line", edit)
    if how == "config":
        git.run("config", "merge.default", "union")
    res = invoke(*apply_args(tree, series, onto), as_json=False)
    assert res.code == 1, res.err
    head = git.blob("HEAD", CUH).decode()
    assert "upstream's change" in head and "c128patch test" not in head
    assert invoke("apply", "--abort", "--tree", tree, as_json=False).code == 0
    git.run("checkout", "--quiet", "main")
    assert invoke(*apply_args(tree, series), as_json=False).code == 0
    res = invoke("rebase", "--onto", onto, "--tree", tree, "--series", series, as_json=False)
    assert res.code == 1, res.err
    assert "<<<<<<<" in (tree / CUH).read_text()


@pytest.mark.parametrize("how", ["upstream", "info"])
def test_a_working_tree_encoding_attribute_is_refused_by_check_and_apply_alike(series, tree, how):
    """Upstream's .gitattributes (or the tree's .git/info/attributes) says `*.cuh working-tree-encoding=UTF-16LE`:
    check said "all apply" (its index takes the series' bytes as they are), apply stopped at `git add` ("failed to
    encode"); rebase onto it moved the branch, then could not prove it. All refuse up front in one line; nothing
    changes; `working-tree-encoding=UTF-8` (git's no-op) is no refusal."""
    git = Git(worktree=tree)
    rev = "v0.5.23"
    if how == "upstream":
        def edit(idx: Git) -> None:
            blob = idx.out("hash-object", "-w", "--stdin", input="*.cuh working-tree-encoding=UTF-16LE\n")
            idx.run("update-index", "--add", "--cacheinfo", f"100644,{blob},.gitattributes")
        rev = upstream_commit(git, "v0.5.23", "upstream re-encodes its headers", edit)
    else:
        (tree / ".git" / "info").mkdir(exist_ok=True)
        (tree / ".git" / "info" / "attributes").write_text("*.cuh working-tree-encoding=UTF-16LE\n")
    res = invoke("check", "--sglang-rev", rev, "--repo", tree, "--series", series)
    assert res.code != 0 and not res.out["ok"], res.text
    assert "working-tree-encoding=UTF-16LE" in res.out["revs"][0]["apply"]["detail"], res.text
    refused(apply_args(tree, series, rev), tree, f"{CUH} has the attribute working-tree-encoding=UTF-16LE")
    if how == "upstream":  # rebase onto it: its loop wrote the commits, moved the branch, then could not prove them
        assert invoke(*apply_args(tree, series)).code == 0
        refused(["rebase", "--onto", rev, "--tree", tree, "--series", series], tree, "working-tree-encoding=UTF-16LE")
    else:
        (tree / ".git" / "info" / "attributes").write_text("*.cuh working-tree-encoding=utf-8\n")
        res = invoke("check", "--sglang-rev", rev, "--repo", tree, "--series", series)
        assert res.code == 0, res.text


@pytest.mark.parametrize("link", ["patches/resolutions", "patches/resolutions/test-patch"])
def test_a_ledger_folder_that_is_a_link_is_never_written_through(series, tree, tmp_path, link):
    """The series (a pull request's) holds `patches/resolutions` (or its entry's folder) as a link out of it: the
    resolution `rebase --continue` records was written through it, outside the series folder. Refused in one line;
    nothing is written there."""
    git = Git(worktree=tree)
    outside = tmp_path / "outside"
    outside.mkdir()
    (series / link).parent.mkdir(parents=True, exist_ok=True)
    (series / link).symlink_to(outside)
    assert invoke(*apply_args(tree, series), as_json=False).code == 0
    onto = upstream_edits_the_same_line(git, tree)
    head = git.head()
    res = invoke("rebase", "--onto", onto, "--tree", tree, "--series", series, as_json=False)
    if link == "patches/resolutions":  # (its ledger is read first: refused before anything moves)
        assert res.code == 2 and "goes through the symlink" in res.err and list(outside.rglob("*")) == [], res.err
        assert git.head() == head and not git.status_porcelain()
        return
    assert res.code == 1, res.err
    text = (tree / CUH).read_text()
    start, end = text.index("<<<<<<<"), text.index(">>>>>>>")
    (tree / CUH).write_text(text[:start] + LINE.rstrip("\n") + "  // resolved\n" + text[text.index("\n", end) + 1:])
    git.run("add", CUH)
    res = invoke("rebase", "--continue", "--tree", tree, as_json=False)
    assert list(outside.rglob("*")) == [], res.err
    assert res.code == 2 and "goes through the symlink" in res.err, res.err


@pytest.mark.parametrize("how", ["honest", "another-file", "symlink"])
def test_a_ledger_rows_diff_changes_its_own_files_lines_and_nothing_else(series, tree, how):
    """A ledger row (a pull request's) whose diff resolves its conflict and also writes another file, or turns the
    file into a symlink: `git apply` took it whole, in the tree at a stop (an untracked `evil.py` beside the
    conflict) and in the loop, where the symlink (which no series may carry) was committed. Such a row does not fit:
    the rebase stops at the conflict, nothing else written; the honest row still resolves it."""
    git, path, data = stopped_rebase(series, tree)
    conflict = Conflict.of(CUH, (tree / CUH).read_text())
    start, end = conflict.text.index("<<<<<<<"), conflict.text.index(">>>>>>>")
    resolved = (conflict.text[:start] + LINE.rstrip("\n") + "  // resolved\n"
                + conflict.text[conflict.text.index("\n", end) + 1:])
    diff = "".join(difflib.unified_diff(conflict.text.splitlines(keepends=True), resolved.splitlines(keepends=True),
                                        f"a/{CUH}", f"b/{CUH}"))
    if how == "another-file":
        diff += "--- /dev/null\n+++ b/python/sglang/evil.py\n@@ -0,0 +1 @@\n+import os\n"
    if how == "symlink":
        lines = conflict.text.splitlines(keepends=True)
        diff = (f"diff --git a/{CUH} b/{CUH}\ndeleted file mode 100644\n--- a/{CUH}\n+++ /dev/null\n"
                f"@@ -1,{len(lines)} +0,0 @@\n" + "".join("-" + line for line in lines)
                + f"diff --git a/{CUH} b/{CUH}\nnew file mode 120000\n--- /dev/null\n+++ b/{CUH}\n@@ -0,0 +1 @@\n"
                "+/etc/passwd\n\\ No newline at end of file\n")
    ledger = series / "patches" / "resolutions"
    (ledger / "test-patch").mkdir(parents=True)
    (ledger / "test-patch" / f"{conflict.key}.diff").write_text(diff)
    (ledger / "ledger.toml").write_text(f'[[resolutions]]\nentry = "test-patch"\nkey = "{conflict.key}"\n'
                                        f'match = "{conflict.match}"\nfile = "{CUH}"\nfrom = "a"\nonto = "b"\n')
    assert invoke("rebase", "--abort", "--tree", tree, as_json=False).code == 0
    res = invoke("rebase", "--onto", data["onto_commit"], "--tree", tree, "--series", series, as_json=False)
    assert not (tree / "python/sglang/evil.py").exists() and not (tree / CUH).is_symlink()
    assert git.out("ls-tree", "-r", "HEAD", "--", CUH).startswith("100644 ")
    if how == "honest":
        assert res.code == 0 and "  // resolved" in (tree / CUH).read_text(), res.err
        return
    assert res.code == 1 and "<<<<<<<" in (tree / CUH).read_text(), res.err
    assert [line for line in git.lines("status", "--porcelain") if not line.startswith("??")] == [f"UU {CUH}"]


def test_a_refusal_past_the_rebase_journals_first_write_says_the_rebase_is_in_progress_and_its_way_out(
        series, tree, tmp_path):
    """A ledger row the loop read only at the conflict (`from = "a b"`): `rebase --onto` said only "not a resolution
    ledger", exit 2, as a refusal that changed nothing, and left its journal (every later verb "a rebase is in
    progress"). Every ledger is now read before the journal (nothing changed); what is found only at the conflict
    (the row's diff a link) says the rebase is in progress with the commands that finish or undo it, which work as
    printed."""
    git = Git(worktree=tree)
    (series / "patches" / "resolutions").mkdir(parents=True)
    ledger = series / "patches" / "resolutions" / "ledger.toml"
    ledger.write_text(f'[[resolutions]]\nentry = "test-patch"\nkey = "0"\nfile = "{CUH}"\nfrom = "a b"\n')
    assert invoke(*apply_args(tree, series), as_json=False).code == 0
    head, onto = git.head(), upstream_edits_the_same_line(git, tree)
    refused(["rebase", "--onto", onto, "--tree", tree, "--series", series], tree, "not a resolution ledger")
    assert not rebase_journal(git).is_file()
    ledger.unlink()
    assert invoke("rebase", "--onto", onto, "--tree", tree, "--series", series, as_json=False).code == 1
    key = Conflict.of(CUH, (tree / CUH).read_text()).key
    assert invoke("rebase", "--abort", "--tree", tree, as_json=False).code == 0
    ledger.write_text(f'[[resolutions]]\nentry = "test-patch"\nkey = "{key}"\nfile = "{CUH}"\n')
    (series / "patches" / "resolutions" / "test-patch").mkdir()
    diff = series / "patches" / "resolutions" / "test-patch" / f"{key}.diff"
    diff.symlink_to(tmp_path / "elsewhere.diff")
    res = invoke("rebase", "--onto", onto, "--tree", tree, "--series", series, as_json=False)
    assert res.code == 2 and "goes through the symlink" in res.err and "in progress" in res.err, res.err
    again = invoke("rebase", "--onto", onto, "--tree", tree, "--series", series, as_json=False).err  # (printed
    for verb in ("continue", "skip", "abort"):  # "(... --continue --tree T / --skip)": no command as printed)
        assert printed_command(again, f"c128patch rebase --{verb}") == rebase_command(tree, verb), again
    diff.unlink()
    done = run_printed(printed_command(res.err, "c128patch rebase --continue"))
    assert done.returncode == 1 and "<<<<<<<" in (tree / CUH).read_text(), done.stderr  # the conflict, for a human
    undone = run_printed(printed_command(res.err, "c128patch rebase --abort"))
    assert undone.returncode == 0 and git.head() == head and not git.status_porcelain(), undone.stderr


def test_the_commands_a_rebase_stop_prints_work_as_printed_for_a_tree_path_no_line_shows_as_it_is(
        series, sglang_release_repo, tmp_path):
    """A tree whose path holds a newline, a byte that is not UTF-8, U+202E and shell words (`$x`, a quote): the
    commands the stop printed were quoted, then made plain (the byte as U+FFFD, U+202E gone), so `--tree` named a
    folder that does not exist. Each is now `$'...'` with those bytes escaped, and works pasted into bash."""
    tree = small_clone(sglang_release_repo, tmp_path / "t \n\udcff\u202e $x 'q").worktree
    assert tree is not None
    git = Git(worktree=tree)
    assert cli_process(apply_args(tree, series)).returncode == 0
    res = cli_process(["rebase", "--onto", upstream_edits_the_same_line(git, tree), "--tree", tree, "--series", series])
    assert res.returncode == 1, res.stderr
    text = (tree / CUH).read_text()
    start, end = text.index("<<<<<<<"), text.index(">>>>>>>")
    (tree / CUH).write_text(text[:start] + LINE.rstrip("\n") + "  // resolved\n" + text[text.index("\n", end) + 1:])
    added = run_printed(f"{printed_command(res.stderr, 'git -C')} {CUH}")
    assert added.returncode == 0, added.stderr
    done = run_printed(printed_command(res.stderr, "c128patch rebase --continue"))
    assert done.returncode == 0 and not rebase_journal(git).is_file(), done.stderr
    assert "  // resolved" in git.blob("HEAD", CUH).decode()


def test_a_verb_taking_its_layers_from_a_journal_says_them_as_onto_does(series, tree, tmp_path):
    """`rebase --continue`/`--skip`/`--drop` and `apply --continue` take the layers the journal names, which nobody
    passed: they were said in --json only (and not in apply's error object), never on stderr, as every other verb
    says a stack it did not get from --layer. Now one line each, and in the error object too."""
    git, layer = Git(worktree=tree), tmp_path / "our layer"
    assert invoke("layer", "new", layer, "--name", "ours", "--series", series, as_json=False).code == 0
    onto = upstream_edits_the_same_line(git, tree)
    said = f"layers from the apply journal: {layer}"
    assert invoke(*apply_args(tree, series, onto, "--layer", layer), as_json=False).code == 1
    res = invoke("apply", "--continue", "--tree", tree, as_json=False)
    assert res.code == 1 and said in res.err.splitlines(), res.err
    res = invoke("apply", "--continue", "--tree", tree)
    assert res.out["layers_in_effect"]["from"] == "the apply journal" and said not in res.err, res.err
    assert invoke("apply", "--abort", "--tree", tree, as_json=False).code == 0
    git.run("checkout", "--quiet", "main")
    assert invoke(*apply_args(tree, series, "v0.5.23", "--layer", layer), as_json=False).code == 0
    res = invoke("rebase", "--onto", onto, "--tree", tree, "--series", series, "--layer", layer, as_json=False)
    assert res.code == 1, res.err
    res = invoke("rebase", "--skip", "--tree", tree, as_json=False)
    assert res.code == 0 and f"layers from the rebase journal: {layer}" in res.err.splitlines(), res.err


def test_a_rebase_onto_an_upstream_symlinking_a_folder_the_series_writes_is_refused_before_its_journal(
        series, tree, tmp_path):
    """Upstream makes a folder an entry writes into a symlink (out of the tree): `rebase --onto` wrote its journal, then
    failed half way on git's "appears as both a file and as a directory", its rebase left in progress. Now one line
    naming the entry and the symlink, before anything is written."""
    git, folder = Git(worktree=tree), "python/sglang/kernels/jit/csrc/deepseek_v4"
    assert invoke(*apply_args(tree, series), as_json=False).code == 0

    def symlinked(idx: Git) -> None:
        idx.run("rm", "-r", "-q", "--cached", "--force", "--", folder)
        blob = idx.out("hash-object", "-w", "--stdin", input=str(tmp_path / "elsewhere"))
        idx.run("update-index", "--add", "--cacheinfo", f"120000,{blob},{folder}")

    onto = upstream_commit(git, "v0.5.23", "upstream: a folder is a symlink", symlinked)
    refused(["rebase", "--onto", onto, "--tree", tree, "--series", series], tree, "goes through the symlink")
    assert not (tree / ".git" / "c128patch" / "rebase.json").exists()


def test_a_tag_too_long_for_a_variants_file_name_is_one_line_for_rebase_and_refresh(series, tree):
    """A 240-character tag (git takes up to 255 bytes): `rebase --continue` recorded the resolution in a ledger row
    whose `onto` its own reader refuses (every later rebase of the series: "not a resolution ledger"); the rebase's
    next-step line (what refresh would write) died on OSError's "File name too long" for `<stem>.<tag>.patch`, as did
    `refresh --variant`. Now the row names the commit; a tag that is no plain word of at most 64 characters
    (refresh.LABEL, helper 158) names no variant: the commit does, and the refresh the rebase prints writes it."""
    git = Git(worktree=tree)
    assert invoke(*apply_args(tree, series), as_json=False).code == 0
    tag = "v0.5.24-" + "a" * 232
    git.run("tag", tag, upstream_edits_the_same_line(git, tree))
    assert invoke("rebase", "--onto", tag, "--tree", tree, "--series", series, as_json=False).code == 1
    text = (tree / CUH).read_text()
    start, end = text.index("<<<<<<<"), text.index(">>>>>>>")
    (tree / CUH).write_text(text[:start] + LINE.rstrip("\n") + "  // resolved\n" + text[text.index("\n", end) + 1:])
    git.run("add", CUH)
    res = invoke("rebase", "--continue", "--tree", tree, as_json=False)
    assert res.code == 0 and "refresh would refuse" not in res.err + res.text, res.err
    assert "next: c128patch refresh --variant --tree " in " ".join(res.text.split()), res.text
    (row,) = Ledger(load_series(series)).rows()  # (the ledger the tool wrote was one it refused: "not a git rev name")
    assert row["onto"] == git.rev_parse(tag)[:12] and row["from"] == "v0.5.23", row
    assert invoke("refresh", "--variant", "--tree", tree, "--series", series, as_json=False).code == 0
    assert sorted(p.name for p in (series / "patches").glob(f"*.{git.rev_parse(tag)[:12]}.patch")), \
        sorted(p.name for p in (series / "patches").iterdir())


@pytest.mark.parametrize("gone", ["layer", "series"])
def test_rebase_abort_undoes_a_rebase_whose_series_or_layer_folder_was_moved_since(series, tree, tmp_path, gone):
    """`rebase --abort` loaded the series and layers the journal names, which it never uses: one moved or removed
    since the stop refused the undo ("no layer at ...: make one with c128patch layer new"), the rebase in progress
    for good (status still printed that undo). It undoes the rebase now, and `--continue` says so."""
    git, layer = Git(worktree=tree), tmp_path / "layer"
    assert invoke("layer", "new", layer, "--name", "ours", "--series", series, as_json=False).code == 0
    assert invoke(*apply_args(tree, series, "v0.5.23", "--layer", layer), as_json=False).code == 0
    head, onto = git.head(), upstream_edits_the_same_line(git, tree)
    assert invoke("rebase", "--onto", onto, "--tree", tree, "--series", series, "--layer", layer).code == 1
    moved = layer if gone == "layer" else series
    moved.rename(tmp_path / "moved")
    refused(["rebase", "--continue", "--tree", tree], tree, f"put it back, or undo the rebase: "
                                                            f"`{rebase_command(tree, 'abort')}`")  # (not "layer new")
    res = invoke("rebase", "--abort", "--tree", tree, as_json=False)
    assert res.code == 0 and git.head() == head and not git.status_porcelain(), res.err
    assert not (tree / ".git" / "c128patch" / "rebase.json").exists()


@pytest.mark.parametrize("field, value", [("orig_branch", "--orphan=pwned"), ("orig_branch", "-Bmain"),
                                          ("orig_head", "--orphan=pwned"), ("recovery_ref", "--stdin")])
def test_a_journal_field_git_would_read_as_an_option_is_refused_before_git_runs(series, tree, field, value):
    """The rebase journal is the tree's (input): `orig_branch = "--orphan=pwned"` made `rebase --abort` run
    `git checkout --quiet --orphan=pwned`, the tree left on a new unborn branch ("-Bmain" resets the user's main).
    A field git takes as a word of its command line that starts with '-' is a corrupt journal: one line, nothing
    changed."""
    git, path, data = stopped_rebase(series, tree)
    data[field] = value
    path.write_text(json.dumps(data))
    before = git.out("for-each-ref", "--format=%(refname) %(objectname)")
    for verb in ("--abort", "--continue", "--skip"):
        refused(["rebase", verb, "--tree", tree], tree, f"{field!r} starts with '-'")
    assert git.out("for-each-ref", "--format=%(refname) %(objectname)") == before and git.current_branch() != "pwned"


@pytest.mark.parametrize("field, value", [("layers", [1]), ("layers", [None]), ("layers", ["a\0b"]), ("layers", [""]),
                                          ("series_root", "a\0b"), ("series_root", "")])
def test_a_journal_naming_a_folder_that_is_no_path_is_one_line(series, tree, field, value):
    """h146: a journal's `layers` was checked to be a list, its items not: `"layers": [1]` made `rebase --continue`
    (and `apply --continue`) TypeError's traceback, a NUL in a folder ValueError's. A corrupt journal: one line."""
    git, path, data = stopped_rebase(series, tree)
    data[field] = value
    path.write_text(json.dumps(data))
    for verb in ("--continue", "--skip"):
        refused(["rebase", verb, "--tree", tree], tree, f"cannot read the c128patch rebase journal {path} ({field!r} "
                                                        f"holds {json.dumps(value)}, not folder paths)")


def test_an_upstream_attribute_marking_files_binary_never_makes_refresh_write_a_binary_hunk(series, tree):
    """Upstream commits `*.cuh -diff`: the patch refresh wrote for a commit of the user's on the patched branch was
    "Binary files ... differ", a corrupt patch written into the series ("written, but lint fails on it")."""
    git = Git(worktree=tree)

    def attributes(idx: Git) -> None:
        blob = idx.out("hash-object", "-w", "--stdin", input="*.cuh -diff\n")
        idx.run("update-index", "--add", "--cacheinfo", f"100644,{blob},.gitattributes")

    rev = upstream_commit(git, "v0.5.23", "upstream: attributes", attributes)
    assert invoke(*apply_args(tree, series, rev), as_json=False).code == 0
    (tree / CUH).write_text((tree / CUH).read_text() + "// the user's edit\n")
    git.run("commit", "--quiet", "-am", "my edit\n\nC128patch-Gate: none (a comment)")
    res = invoke("refresh", "--tree", tree, "--series", series, as_json=False)
    assert res.code == 0, res.err
    written = [p.read_text() for p in (series / "patches").glob("*.patch")]
    assert not [t for t in written if "Binary files" in t]
    assert any("+// the user's edit" in t for t in written)


def test_an_upstream_attribute_marking_files_binary_never_hides_a_conflict_marker_from_continue(series, tree):
    """Upstream edits the line our entry edits and commits `*.cuh -diff`: `git diff --check` skips a file it takes
    for binary, so `rebase --continue` with the conflict's markers still in the file took them as the resolution
    (committed, and recorded in the series' ledger). Refused, naming the file and line, as without the attribute."""
    git = Git(worktree=tree)

    def edit(idx: Git) -> None:
        text = git.blob("v0.5.23", CUH).decode().replace(LINE, LINE.rstrip("\n") + "  // upstream's change\n")
        for path, body in ((CUH, text), (".gitattributes", "*.cuh -diff\n")):
            blob = idx.out("hash-object", "-w", "--stdin", input=body)
            idx.run("update-index", "--add", "--cacheinfo", f"100644,{blob},{path}")

    onto = upstream_commit(git, "v0.5.23", "upstream edits the same line", edit)
    assert invoke(*apply_args(tree, series), as_json=False).code == 0
    assert invoke("rebase", "--onto", onto, "--tree", tree, "--series", series, as_json=False).code == 1
    assert "<<<<<<<" in (tree / CUH).read_text()
    git.run("add", CUH)  # the markers left in
    refused(["rebase", "--continue", "--tree", tree], contains=f"{CUH} still holds a conflict marker at line")
    assert not (series / "patches" / "resolutions").exists()


def test_a_bare_repositorys_config_and_hooks_run_nothing_in_the_clone_apply_makes(series, marker, sglang_release_repo,
                                                                                 tmp_path):
    prog, mark = marker
    bare = tmp_path / "bare.git"
    subprocess.run(["git", "clone", "--quiet", "--bare", "--shared", str(sglang_release_repo), str(bare)], check=True)
    for key, value in (("core.fsmonitor", str(prog)), ("filter.evil.clean", str(prog)),
                       ("filter.evil.smudge", str(prog)), ("filter.evil.required", "true"),
                       ("diff.evil.textconv", str(prog)), ("uploadpack.packObjectsHook", str(prog))):
        subprocess.run(["git", "--git-dir", str(bare), "config", key, value], check=True)
    (bare / "info").mkdir(exist_ok=True)
    (bare / "info" / "attributes").write_text("* filter=evil diff=evil\n")
    for hook in HOOKS:
        (bare / "hooks" / hook).write_text(f"#!/bin/sh\n{prog} </dev/null\nexit 1\n")
        (bare / "hooks" / hook).chmod(0o755)
    res = invoke("apply", "--sglang-rev", "v0.5.23", "--repo", bare, "--tree", tmp_path / "new", "--series", series)
    assert res.code == 0, res.err
    assert not mark.exists(), "apply ran a program the bare repository's config or hooks name"
    assert invoke("status", "--tree", tmp_path / "new", "--series", series).code == 0 and not mark.exists()
    (tmp_path / "w").mkdir()  # the trap fires for a plain git reading that repository
    subprocess.run(["git", "--git-dir", str(bare), "--work-tree", str(tmp_path / "w"), "checkout", "v0.5.23", "--",
                    CUH], capture_output=True)
    assert mark.exists()


def test_extract_writes_a_trees_files_at_their_paths_and_no_symlink(tmp_path):
    """``Git.extract`` (the tier's tree, the contract's headers, build's sources): git's own checkout into a private
    index; a symlink the tree holds, pointing out of the folder, is written as a file holding its target, the
    repository's index is untouched, a path the rev lacks is a GitError."""
    repo = tmp_path / "r"
    git = Git(worktree=repo)
    repo.mkdir()
    git.run("init", "-q")
    (repo / "python" / "sglang").mkdir(parents=True)
    (repo / "python" / "sglang" / "a.py").write_text("A = 1\n")
    (repo / "python" / "sglang" / "run.sh").write_text("#!/bin/sh\n")
    (repo / "python" / "sglang" / "run.sh").chmod(0o755)
    (repo / "python" / "sglang" / "keys").symlink_to("/root/.ssh")
    git.run("add", "-A")
    git.run("commit", "-qm", "c")
    (repo / "python" / "sglang" / "a.py").write_text("A = 2\n")  # a change of the work tree: not extracted
    index = (repo / ".git" / "index").read_bytes()
    dest = tmp_path / "out"
    git.extract("HEAD", "python/sglang", dest)
    files = {str(p.relative_to(dest)) for p in dest.rglob("*") if not p.is_dir()}
    assert files == {"python/sglang/a.py", "python/sglang/run.sh", "python/sglang/keys"}
    assert (dest / "python/sglang/a.py").read_text() == "A = 1\n"
    assert os.access(dest / "python/sglang/run.sh", os.X_OK)
    link = dest / "python/sglang/keys"
    assert not link.is_symlink() and link.read_text() == "/root/.ssh"
    git.extract("HEAD", "python/sglang/a.py", tmp_path / "one")
    assert [p.name for p in (tmp_path / "one").rglob("*") if p.is_file()] == ["a.py"]
    assert (repo / ".git" / "index").read_bytes() == index
    with pytest.raises(GitError):
        git.extract("HEAD", "python/nothing", tmp_path / "none")


def test_extract_writes_the_committed_bytes_whatever_the_attributes_and_config(tmp_path):
    """A tree's `.git/info/attributes` (`* text eol=crlf`), its committed `.gitattributes` (`*.py ident`, and
    `*.h working-tree-encoding=UTF-16LE`) and `core.autocrlf=true` made `Git.extract` (git's checkout) write other
    bytes than the commit holds: the tier's files, the contract's headers, a source build's wheel changed with the
    operator's settings. It writes the blobs as committed, `.gitattributes` too."""
    repo = tmp_path / "r"
    git = Git(worktree=repo)
    repo.mkdir()
    git.run("init", "-q")
    pkg = repo / "python" / "sglang"
    pkg.mkdir(parents=True)
    files = {"python/sglang/a.py": b"# $Id$\nA = 1\n", "python/sglang/b.h": b"int b;\n",
             "python/sglang/.gitattributes": b"*.py ident\n*.h working-tree-encoding=UTF-16LE\n"}
    for name, data in files.items():  # (the attributes last: git add would encode b.h)
        (repo / name).write_bytes(data)
        git.run("add", name)
    git.run("commit", "-qm", "c")
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "attributes").write_text("* text eol=crlf\n")
    git.run("config", "core.autocrlf", "true")
    for path, dest in (("python/sglang", tmp_path / "out"), (".", tmp_path / "all")):
        git.extract("HEAD", path, dest)
        got = {str(p.relative_to(dest)): p.read_bytes() for p in dest.rglob("*") if p.is_file()}
        assert got == files, got


def test_a_trees_diff_settings_do_not_change_the_diffs_the_tool_reads(tree):
    """diff.noprefix / mnemonicPrefix / srcPrefix, diff.context and color.ui=always in the tree's own config changed
    the headers and hunks the tool parses (merged-upstream detection found nothing, refresh wrote other patches)."""
    git = Git(worktree=tree)
    plain, mail = git.out("diff", "HEAD~1", "HEAD"), git.out("format-patch", "--stdout", "-1", "HEAD")
    for key, value in [("diff.noprefix", "true"), ("diff.mnemonicPrefix", "true"), ("diff.srcPrefix", "x/"),
                       ("diff.dstPrefix", "y/"), ("diff.context", "1"), ("color.ui", "always"),
                       ("color.diff", "always"), ("diff.algorithm", "patience"), ("diff.suppressBlankEmpty", "true")]:
        subprocess.run(["git", "-C", str(tree), "config", key, value], check=True)
    said = git.out("diff", "HEAD~1", "HEAD")
    assert said == plain and said.startswith("diff --git a/") and "\x1b[" not in said
    assert git.out("format-patch", "--stdout", "-1", "HEAD") == mail


@pytest.mark.parametrize("moved", ["c128_online_v2\n+.cuh", "c128_online_v2\udcff.cuh"], ids=["newline", "not-utf8"])
def test_a_path_upstream_moves_our_file_to_that_no_patch_can_name_is_one_answer_not_a_traceback(series, tree, moved):
    """Upstream moves the file our entry patches to a name holding a newline (the renamed patch check wrote carried
    the name's second line as a line of its own: "corrupt patch", no answer) or a byte that is not UTF-8 (git's
    output read as UTF-8: a UnicodeDecodeError traceback, from check, and from bisect and watch on any upstream
    adding such a file): the move is not followed, the entry is a conflict, each verb answers."""
    git = Git(worktree=tree)
    dest = f"{CUH.rsplit('/', 1)[0]}/{moved}"  # a surrogate: its byte, as git is handed it (os.fsencode)

    def move(idx: Git) -> None:
        idx.run("update-index", "--force-remove", CUH)
        blob = git.out("rev-parse", f"v0.5.23:{CUH}")
        for path in (dest, f"python/sglang/{moved}.py"):
            idx.run("update-index", "--add", "--cacheinfo", f"100644,{blob},{path}")

    onto = upstream_commit(git, "v0.5.23", "upstream moves the file", move)
    res = invoke("check", "--sglang-rev", onto, "--repo", tree, "--series", series)
    assert res.code == 1, (res.code, res.err)
    assert f"{CUH}: does not exist" in json.dumps(res.out), res.out
    assert copies.find(git, git.rev_parse("v0.5.23"), onto, []) == []  # watch's and bisect's look for copies


def test_the_commands_watch_prints_to_reproduce_a_stop_work_as_printed_whatever_the_tag_holds(series, tree, tmp_path):
    """A tag upstream names with what a report or a terminal cannot show (a C1 control, a bidi override, a
    zero-width space: stripped where printed) is reproduced by its commit: the rebase command watch printed named a
    tag that does not exist (``unknown revision``)."""
    git = Git(worktree=tree)
    tag = "v0.5.24-\x9b31m\u202e\u200b$(touch${IFS}PWNED)`id`<b>"
    git.run("tag", tag, upstream_edits_the_same_line(git, tree))
    out = tmp_path / "out"
    res = invoke("watch", "--onto", tag, "--repo", tree, "--series", series, "--out", out, "--no-run", as_json=False)
    assert res.code == 5, (res.code, res.err)
    report = (out / "watch-report.md").read_text()
    rebase = printed_command(report, "c128patch rebase --onto")
    assert rebase in res.text
    work = tmp_path / "work"
    work.mkdir()
    apply = printed_command(report, "c128patch apply --sglang-rev")
    assert run_printed(apply, work).returncode == 0
    done = run_printed(rebase, work)
    assert done.returncode == 1 and "conflicts on" in done.stderr, done.stderr
    assert not list(tmp_path.rglob("PWNED"))


def test_a_rebase_journals_revs_reach_the_terminal_one_line_each(series, tree):
    """The rebase journal is the tree's (``rebase.json``): a newline in its old or new rev split the lines rebase
    prints when it goes on (its table's title, the contract's line, the report's), the rest a line of its own."""
    git, path, data = stopped_rebase(series, tree)
    data["old_rev"] += "\nforged: ok"
    data["onto_rev"] += "\x1b]8;;https://evil.invalid\x07\nforged: ok"
    path.write_text(json.dumps(data))
    res = invoke("rebase", "--skip", "--tree", tree, as_json=False)
    said = res.text + res.err
    assert "\x1b" not in said and "\x07" not in said, said
    (contract,) = [line for line in said.splitlines() if line.startswith("contract on ")]
    assert "⏎ forged: ok" in contract, said  # (the table's title wraps where its width says: a line of its own)
    assert not any(line.strip().startswith("forged: ok:") for line in said.splitlines()), said


def _commit_bytes(tree: Path, path: bytes, data: bytes, subject: str) -> str:
    """A commit adding ``data`` to (or making) the file ``path`` of ``tree``, its name and content bytes as given."""
    file = os.fsencode(tree) + b"/" + path
    with open(file, "ab") as fh:
        fh.write(data)
    ident = ["-c", "user.name=t", "-c", "user.email=t@t.invalid"]
    subprocess.run(["git", "-C", str(tree), "add", "--", os.fsdecode(path)], check=True)
    subprocess.run(["git", *ident, "-C", str(tree), "commit", "-q", "-m", subject], check=True)
    return Git(worktree=tree).head() or ""


def test_a_user_commit_adding_bytes_that_are_not_utf8_is_proven_refreshed_and_added_byte_for_byte(
        upstream_clone, tmp_path):
    """A Latin-1 "# caf\\xe9" added to a patched file (an old editor): git's output of it (the proof's diff, the
    commit's patch) was decoded strictly, a UnicodeDecodeError traceback in status, refresh and layer add-entry. The
    bytes are kept as git gave them: status proves the tree, the refreshed or added patch holds them exactly."""
    from support import copy_series

    series = copy_series(tmp_path / "series")
    assert invoke("apply", "--sglang-rev", "v0.5.23", "--repo", upstream_clone, "--series", series).code == 0
    sha = _commit_bytes(upstream_clone, b"python/sglang/srt/environ.py", b"\n# caf\xe9\n",
                        "acme: a comment\n\nC128patch-Gate: none (a comment)")
    status = invoke("status", "--tree", upstream_clone, "--series", series)
    assert status.code in (0, 1) and "error" not in status.out, status.out
    layer = tmp_path / "acme"
    assert invoke("layer", "new", layer, "--name", "acme", "--series", series).code == 0
    add = invoke("layer", "add-entry", "--layer", layer, "--from-commit", sha, "--tree", upstream_clone, "--why", "w",
                 "--series", series)
    assert add.code == 0, add.out
    assert b"+# caf\xe9\n" in (layer / "patches" / "0001-acme-a-comment.patch").read_bytes()
    refresh = invoke("refresh", "--tree", upstream_clone, "--series", series)
    assert refresh.code == 0, refresh.out
    assert any(b"+# caf\xe9\n" in p.read_bytes() for p in (series / "patches").glob("*.patch"))


def test_a_user_commit_naming_a_file_that_is_not_utf8_is_one_line(upstream_clone, tmp_path):
    """A file name in Latin-1 no manifest (UTF-8 TOML) can hold: refresh and layer add-entry say so in one line."""
    from support import copy_series

    series = copy_series(tmp_path / "series")
    assert invoke("apply", "--sglang-rev", "v0.5.23", "--repo", upstream_clone, "--series", series).code == 0
    sha = _commit_bytes(upstream_clone, b"python/sglang/caf\xe9.txt", b"x\n",
                        "acme: a file\n\nC128patch-Gate: none (a file)")
    layer = tmp_path / "acme"
    assert invoke("layer", "new", layer, "--name", "acme", "--series", series).code == 0
    for args in (["layer", "add-entry", "--layer", layer, "--from-commit", sha, "--tree", upstream_clone, "--why", "w",
                  "--series", series], ["refresh", "--tree", upstream_clone, "--series", series]):
        run = invoke(*args)
        assert run.code == 2 and "(its name is not UTF-8)" in run.out["error"], (args, run.out)


def test_too_few_open_files_for_git_is_one_line(sglang_release_repo, tmp_path):
    """``ulimit -n 10``: the pipes of a git call could not be made, an OSError (EMFILE) traceback mid-apply; one line
    naming the limit, and what became of the clone it made said truly ("was removed" had been said over a clone
    rmtree could not remove)."""
    import resource
    import sys

    def low() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (10, 10))

    tree = tmp_path / "tree"
    proc = subprocess.run([sys.executable, "-m", "c128patch", "apply", "--sglang-rev", "v0.5.23", "--tree", str(tree)],
                          capture_output=True, text=True, timeout=300, preexec_fn=low)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("c128patch: error: cannot run git: Too many open files (the limit of open files, "
                                  "ulimit -n 10, is too low)"), proc.stderr
    # the clone it made is removed, or (rmtree needs files open too) said not to be: never "removed" over one left
    assert ("was removed)" in proc.stderr) == (not tree.exists()), proc.stderr
    assert tree.exists() == ("could not be removed: remove it by hand)" in proc.stderr), proc.stderr


def test_git_killed_by_the_file_size_limit_is_said_so_not_a_negative_exit(tmp_path):
    """Helper 177: `layer add-entry` under `ulimit -f 2` said "git read-tree ... failed: exit -25": git, killed by
    SIGXFSZ, says nothing. The signal is named, with the limit and the way past it."""
    import sys

    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "big").write_bytes(os.urandom(1 << 20))
    code = ("import resource, sys\n"
            "from pathlib import Path\n"
            "from c128patch.errors import C128Error\n"
            "from c128patch.git import Git\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))\n"
            "try:\n"
            "    Git(worktree=Path(sys.argv[1])).run('hash-object', '-w', 'big')\n"
            "except C128Error as exc:\n"
            "    print(exc.message)\n")
    out = subprocess.run([sys.executable, "-c", code, str(repo)], capture_output=True, text=True, timeout=60).stdout
    assert out.strip() == ("git hash-object -w big failed: killed by SIGXFSZ: a file reached the file size limit; "
                           "raise it (ulimit -f unlimited) and run it again"), out


def test_an_index_git_cannot_write_is_named_with_what_is_wrong_there(tmp_path):
    """CI failed twice on git's "Unable to write new index file" (it names no file and no errno; not reproduced):
    the failure names the index and says what is wrong there, its folder gone or the space left."""
    import sys

    repo, bin_dir, gone = tmp_path / "repo", tmp_path / "bin", tmp_path / "gone"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    bin_dir.mkdir()
    real = shutil.which("git")
    (bin_dir / "git").write_text('#!/bin/sh\nfor a; do [ "$a" = update-index ] && '
                                 '{ echo "fatal: Unable to write new index file" >&2; exit 128; }; done\n'
                                 f'exec {real} "$@"\n')
    (bin_dir / "git").chmod(0o755)
    code = ("import sys\n"
            "from pathlib import Path\n"
            "from c128patch.errors import C128Error\n"
            "from c128patch.git import Git\n"
            "git = Git(worktree=Path(sys.argv[1]))\n"
            "for env in ({}, {'GIT_INDEX_FILE': sys.argv[2] + '/index'}):\n"
            "    try:\n"
            "        git.with_env(**env).run('update-index', '--add', '--cacheinfo', '100644,' + '0' * 40 + ',a',\n"
            "                                check=False)\n"
            "    except C128Error as exc:\n"
            "        print(exc.message)\n")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    out = subprocess.run([sys.executable, "-c", code, str(repo), str(gone)], capture_output=True, text=True,
                         timeout=60, env=env).stdout.splitlines()
    assert len(out) == 2, out
    assert out[0].startswith("git update-index --add --cacheinfo failed: fatal: Unable to write new index file "
                             f"{repo / '.git' / 'index'} (") and out[0].endswith(" KiB free there)"), out
    assert out[1] == ("git update-index --add --cacheinfo failed: fatal: Unable to write new index file "
                      f"{gone / 'index'} (its folder: No such file or directory)"), out


def test_a_trees_own_info_attributes_change_no_contract_row_and_no_verdict(tmp_path):
    """h133: a tree's `.git/info/attributes` (never committed, git reads it always) holding `*.cuh -diff` or `* binary`
    made `git diff -U0` say "Binary files differ": the contract rows of the calls the series adds there were dropped,
    `refresh --check` said contract.lock would change (exit 1) and `refresh` wrote the lock without them, so `contract`
    no longer checked those calls. Every diff whose lines the tool reads is taken with --text."""
    from support import copy_series

    tree, series = tmp_path / "t", copy_series(tmp_path / "series")
    assert invoke("apply", "--sglang-rev", "v0.5.23", "--tree", tree, "--series", series).code == 0
    for attributes in ("*.cuh -diff\n", "* binary\n"):
        (tree / ".git" / "info").mkdir(exist_ok=True)
        (tree / ".git" / "info" / "attributes").write_text(attributes)
        run = invoke("refresh", "--check", "--tree", tree, "--series", series)
        assert run.code == 0 and run.out["changed"] == [], (attributes, run.out.get("changed"), run.err)


def test_no_git_variable_runs_a_program_of_the_tree_git_works_in(tmp_path: Path, monkeypatch):
    """Helper 137: git runs in the tree, and the tool's git kept the operator's GIT_EXEC_PATH (git puts it first on
    PATH), GIT_SSH, GIT_PROXY_COMMAND, ... and PATH as they were: a relative value (`.`, `./x`) ran a program the tree
    holds (its `git-upload-pack` on a fetch of a local path, its `evil` as the ssh or proxy program). Now
    GIT_EXEC_PATH is dropped, a program variable reaches only a clone or fetch and a relative one is one line,
    PATH's relative entries are dropped, and no editor or pager is run."""
    src, tree, pwned = tmp_path / "src", tmp_path / "tree", tmp_path / "pwned"
    for repo in (src, tree):
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(src), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                    "--allow-empty", "-m", "x"], check=True)
    for name in ("git-upload-pack", "ssh", "evil"):
        (tree / name).write_text(f"#!/bin/sh\necho {name} >> {pwned}\nexit 1\n")
        (tree / name).chmod(0o755)
    git = Git(worktree=tree)
    monkeypatch.setenv("GIT_EXEC_PATH", ".")
    monkeypatch.setenv("PATH", ".:" + os.environ["PATH"])
    for transport in (False, True):
        assert git.run("fetch", "-q", str(src), check=False, transport=transport).returncode == 0
        git.run("fetch", "-q", "ssh://localhost.invalid/x", check=False, transport=transport)
    for name, value, url in (("GIT_SSH", "./evil", "ssh://localhost.invalid/x"),
                             ("GIT_SSH_COMMAND", "./evil -v", "ssh://localhost.invalid/x"),
                             ("GIT_SSH_COMMAND", "sh -c ./evil", "ssh://localhost.invalid/x"),
                             ("GIT_PROXY_COMMAND", "./evil", "git://localhost.invalid/x"),
                             ("GIT_ASKPASS", "sub/evil", "ssh://localhost.invalid/x")):
        with monkeypatch.context() as env:
            env.setenv(name, value)
            git.run("fetch", "-q", url, check=False)  # not a transport: the variable does not reach git
            with pytest.raises(C128Error, match=rf"^\${name} is '{value}', a relative path: .* absolute path$"):
                git.run("fetch", "-q", url, check=False, transport=True)
    monkeypatch.setenv("EDITOR", "./evil")
    monkeypatch.setenv("VISUAL", "./evil")
    git.run("commit", "-q", "--allow-empty", check=False)  # (an editor git would start for the message)
    assert not pwned.exists(), pwned.read_text()


@pytest.mark.skipif(not shutil.which("cc"), reason="needs a C compiler to build the tree's library")
def test_a_relative_ld_preload_loads_no_library_of_the_tree_into_git(tmp_path: Path, monkeypatch):
    """Helper 137: LD_PRELOAD reached the tool's git as it was; git runs in the tree, so `./evil.so` loaded the tree's
    library into git (as a relative LD_LIBRARY_PATH entry did before). Now its relative entries are dropped."""
    tree, pwned = tmp_path / "tree", tmp_path / "pwned"
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    (tree / "evil.c").write_text('#include <stdio.h>\n__attribute__((constructor)) static void x(void) '
                                 f'{{ FILE *f = fopen("{pwned}", "a"); if (f) fclose(f); }}\n')
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(tree / "evil.so"), str(tree / "evil.c")], check=True)
    monkeypatch.setenv("LD_PRELOAD", "./evil.so")
    Git(worktree=tree).run("status", check=False)
    assert not pwned.exists()


@pytest.mark.parametrize("fails, said", [
    ('*" am "*', "fatal: unable to create threaded lstat: Resource temporarily unavailable"),
    ('*" apply --cached /"*', "fatal: Out of memory, malloc failed (tried to allocate 131278 bytes)"),
    ('*" am "*', "fatal: sha1 file '.git/index.lock' write error. Out of diskspace"),
    ('*" apply --cached /"*', "fatal: sha1 file '/tmp/c128check-x/index.lock' write error. Out of diskspace")],
    ids=["apply-am", "check-apply", "apply-am-disk", "check-apply-disk"])
def test_a_git_starved_of_memory_or_threads_is_a_machine_failure_not_a_conflict(series, tree, tmp_path, monkeypatch,
                                                                                fails, said):
    """Helper 139: under ``ulimit -v`` git's ``am`` or ``apply --cached`` failed for want of memory or threads:
    ``apply`` said the entry "does not apply" (a conflict to resolve by hand, exit 1) and ``check`` that the wheel
    "stops at" an entry; neither is the series'. A git that says so (``git._STARVED``) is one line, exit 2."""
    fake = failing_git(tmp_path / "bin", fails, said)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    args = apply_args(tree, series) if " am " in fails else ["check", "--sglang-rev", "v0.5.23", "--repo", tree,
                                                           "--series", series]
    res = invoke(*args, as_json=False)
    first = (res.err.strip().splitlines() or [res.text])[0]
    assert res.code == 2 and first.startswith("c128patch: error: ") and said in first, res.err
    assert "does not apply" not in res.err and "stops at" not in res.text + res.err and "conflict" not in first


def test_a_release_cache_git_cannot_map_for_want_of_memory_is_not_called_corrupt(tmp_path, monkeypatch):
    """Helper 139: ``ulimit -v`` too low to map the release cache's pack: "the release cache is corrupt; rebuild it:
    rm -rf ..." (its 130 MB imported again, for nothing). It is the machine's failure, said as such."""
    real = shutil.which("git")
    fake = tmp_path / "bin" / "git"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\nfor a in "$@"; do [ "$a" = for-each-ref ] && { echo "fatal: packfile x.pack cannot be '
                    'mapped, check sys.vm.max_map_count and/or RLIMIT_DATA: Cannot allocate memory" >&2; exit 128; }; '
                    f'done\nexec {real} "$@"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    res = invoke("check", "--sglang-rev", "v0.5.23", as_json=False)
    (line,) = res.err.strip().splitlines()
    assert res.code == 2 and line.startswith("c128patch: error: ") and "Cannot allocate memory" in line and \
        "rm -rf" not in line and "corrupt" not in line, res.err


def test_a_trees_crlf_settings_and_sparse_checkout_neither_stop_apply_half_done(series, tree, sglang_release_repo,
                                                                               tmp_path):
    """h140: a tree with `core.autocrlf=true` and `core.safecrlf=true` (git's advice on Windows): the overlay's `git
    add` died ("LF would be replaced by CRLF"); a sparse checkout whose cone leaves out the overlay and the provenance:
    `git add` (git >= 2.34) refused them. Both stopped apply half done; now the same commits as in a plain clone."""
    clean = small_clone(sglang_release_repo, tmp_path / "clean").worktree
    assert invoke(*apply_args(clean, series, "v0.5.23")).code == 0
    git = Git(worktree=tree)
    subprocess.run(["git", "-C", str(tree), "config", "core.autocrlf", "true"], check=True)
    subprocess.run(["git", "-C", str(tree), "config", "core.safecrlf", "true"], check=True)
    subprocess.run(["git", "-C", str(tree), "sparse-checkout", "set", "--no-cone",
                    "/python/sglang/kernels/jit/csrc/deepseek_v4/"], check=True)
    res = invoke(*apply_args(tree, series, "v0.5.23"))
    assert res.code == 0, res.err
    assert git.out("log", "--format=%H", "v0.5.23..HEAD") == \
        Git(worktree=clean).out("log", "--format=%H", "v0.5.23..HEAD")
    assert invoke("status", "--tree", tree, "--series", series).code == 0


CRLF_CONFIG = "[core]\n\tautocrlf = true\n\teol = crlf\n\tsafecrlf = true\n"


@pytest.mark.parametrize("operator", ["crlf and a merge program", "unreadable"])
def test_one_config_read_takes_line_ends_from_the_operator_and_programs_from_the_repository_alone(
        tmp_path, monkeypatch, operator):
    """The repository's programs and the operator's line-end settings are read in one git call (status's CPU): a
    merge program in the operator's own config is not the repository's (the tool's calls never read that config), one
    in the repository's is refused whatever the operator's config holds, even one git cannot read."""
    glob = tmp_path / "gitconfig"
    glob.write_text("[core]\n\tautocrlf = true\n[merge \"x\"]\n\tdriver = touch /tmp/pwned\n"
                    if operator != "unreadable" else "[core\n\tbroken")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(glob))
    plain, hostile, env = tmp_path / "plain", tmp_path / "hostile", {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull}
    for repo in (plain, hostile):
        subprocess.run(["git", "init", "-q", str(repo)], check=True, env=env)
    subprocess.run(["git", "-C", str(hostile), "config", "merge.y.driver", "touch /tmp/pwned"], check=True, env=env)
    assert Git(worktree=plain).converts_eol() == (operator != "unreadable")
    assert Git(worktree=plain).out("rev-parse", "--is-inside-work-tree") == "true"
    with pytest.raises(C128Error, match=r"its git config names a merge program \(merge\.y\.driver = touch"):
        Git(worktree=hostile).out("status")


def test_the_operators_global_crlf_config_changes_no_commit_proof_or_refreshed_byte(series, sglang_release_repo,  # noqa: F811
                                                                                    tmp_path, monkeypatch):
    """Helper 170 (issue 36's open item): the operator's global config (GIT_CONFIG_GLOBAL: core.autocrlf=true,
    core.eol=crlf, core.safecrlf=true), their clone checked out with it (CRLF files) and their own commit made with
    it. `apply` refused "uncommitted changes" (the tool's git read none of it: CRLF files differed from the index), and
    the `git stash -u` it printed said "No local changes to save". Now `apply` commits the trees a plain clone's apply
    does, `status` proves it, and `refresh` writes the bytes it writes from a plain clone. Round 31 left: the overlays
    stayed LF in their CRLF tree, and their own `git commit -a` of an edit to one died under their core.safecrlf ("LF
    would be replaced by CRLF"): apply leaves them as their checkout writes them, and `status` reads them as their
    git does (no drift)."""
    (tmp_path / "gitconfig").write_text(CRLF_CONFIG)
    trees, copies = [], []
    for name, config in (("plain", os.devnull), ("crlf", str(tmp_path / "gitconfig"))):
        monkeypatch.setenv("GIT_CONFIG_GLOBAL", config)
        tree = small_clone(sglang_release_repo, tmp_path / name).worktree
        nl = b"\r\n" if name == "crlf" else b"\n"
        assert nl in (tree / CUH).read_bytes() and (nl == b"\r\n") == (b"\r\n" in (tree / CUH).read_bytes())
        assert invoke("apply", "--sglang-rev", "v0.5.23", "--repo", tree, "--series", series).code == 0
        said = invoke("status", "--tree", tree, "--series", series)
        assert said.code == 0 and said.out["equivalence"]["identical"] is True, said.out["equivalence"]
        assert said.out["drift"] == [] and said.out["uncommitted"] == [], said.out
        edited = EDIT[CUH][1].rstrip("\n").encode() + nl
        text = (tree / CUH).read_bytes()
        assert text.count(edited) == 1
        (tree / CUH).write_bytes(text.replace(edited, edited * 2))
        proc = subprocess.run(["git", "-C", str(tree), "-c", "user.name=u", "-c", "user.email=u@x.invalid", "commit",
                               "-qam", "c128: blank line", "--trailer", "C128patch-Gate: none (test)"],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        copies.append(shutil.copytree(series, tmp_path / f"series-{name}"))
        assert invoke("refresh", "--tree", tree, "--series", copies[-1]).code == 0
        assert invoke("refresh", "--check", "--tree", tree, "--series", copies[-1]).code == 0
        trees.append(Git(worktree=tree).out("log", "--format=%T", "v0.5.23..HEAD~1"))
    assert trees[0] == trees[1]
    assert snapshot_files(copies[0]) == snapshot_files(copies[1])


def snapshot_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
            and ".git" not in p.parts}


def _series_repo(tmp_path: Path, attributes: bool, notes: bool = False) -> Path:
    """tmp_path/src: a repository committing this one's patches/, overlay/, csrc/ (and .gitattributes, a notes.txt)."""
    from support import REPO_ROOT

    src = tmp_path / "src"
    src.mkdir()
    for part in ("patches", "overlay", "csrc"):
        shutil.copytree(REPO_ROOT / part, src / part)
    if attributes:
        shutil.copy(REPO_ROOT / ".gitattributes", src / ".gitattributes")
    if notes:
        (src / "notes.txt").write_text("mine\n")
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    subprocess.run(["git", "init", "-q", str(src)], check=True, env=env)
    subprocess.run(["git", "-C", str(src), "add", "-A"], check=True, env=env)
    subprocess.run(["git", "-C", str(src), "-c", "user.name=u", "-c", "user.email=u@x.invalid", "commit", "-qm", "s"],
                   check=True, env=env)
    return src


def _crlf_env(tmp_path: Path) -> dict[str, str]:
    """Our environment with a global git config of CRLF_CONFIG (no system config)."""
    (tmp_path / "gitconfig").write_text(CRLF_CONFIG)
    return {**os.environ, "GIT_CONFIG_GLOBAL": str(tmp_path / "gitconfig"), "GIT_CONFIG_NOSYSTEM": "1"}


def test_a_checkout_of_this_repository_with_crlf_settings_keeps_the_series_bytes(tmp_path):
    """Helper 170: the operator's global `core.autocrlf=true` (`core.eol=crlf`), in a clone of this repository (theirs,
    or the one `pip install git+URL` makes, whose package takes the series from it): every patch and overlay was
    written with CRLF line ends, and `lint` gave 35 errors ("sha256 does not match", "corrupt patch ... names another
    path than its diff header"), `apply` refused. The repository's `.gitattributes` keeps every file's bytes."""
    src, dest = _series_repo(tmp_path, attributes=True), tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(src), str(dest)], check=True, env=_crlf_env(tmp_path))
    res = invoke("lint", "--offline", "--series", dest)
    assert res.code == 0, res.text


@pytest.mark.parametrize("attributes", [True, False])
def test_a_series_file_with_crlf_line_ends_is_told_a_command_that_rewrites_it_as_committed(tmp_path, attributes):
    """Helper 174: the CRLF finding said "check it out again with its bytes as committed", no command. In a clone made
    under core.autocrlf=true, with this repository's `* -text` (an editor wrote CRLF) or without it (a layer's
    repository: the checkout wrote CRLF, the file's stat clean, so `git checkout -- F` skipped it and autocrlf wrote
    CRLF again), the command printed writes the committed bytes of that file and touches no other uncommitted work."""
    src, dest, crlf = _series_repo(tmp_path, attributes, notes=True), tmp_path / "clone", _crlf_env(tmp_path)
    subprocess.run(["git", "-c", "core.autocrlf=true", "clone", "-q", str(src), str(dest)], check=True, env=crlf)
    entry = next(e for e in load_series(src).entries if e.is_patch)
    path = load_series(dest).file_of(entry)
    if attributes:
        path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))  # an editor's
    assert b"\r\n" in path.read_bytes()
    (dest / "notes.txt").write_text("mine, not committed\n")
    res = invoke("lint", "--offline", "--series", dest, as_json=False)
    said = [line for line in res.text.splitlines() if f"{path.name}: its lines end in CRLF" in line]
    assert res.code == 1 and len(said) == 1 and "write it again as committed: git -C " in said[0], res.text
    command = said[0].split("write it again as committed: ", 1)[1]
    subprocess.run(command, shell=True, check=True, env=crlf)
    assert path.read_bytes() == (src / path.relative_to(dest)).read_bytes()
    assert (dest / "notes.txt").read_text() == "mine, not committed\n"
    if attributes:
        assert invoke("lint", "--offline", "--series", dest).code == 0


def test_a_series_file_with_crlf_line_ends_is_said_to_be_one_not_a_corrupt_patch(series):  # noqa: F811
    """Helper 170: a series (or a layer) checked out with CRLF line ends: lint said "corrupt patch ... '--- a/...'
    names another path than its diff header (git would take it as a rename)" and apply "sha256 does not match the
    manifest (... record the change with `c128patch lint --update-hashes`)", which would record the CRLF bytes. Both
    say what it is."""
    entry = next(e for e in load_series(series).entries if e.is_patch)
    path = load_series(series).file_of(entry)
    path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    res = invoke("lint", "--offline", "--series", series, as_json=False)
    said = [line for line in res.text.splitlines() if path.name in line]
    assert res.code == 1 and len(said) == 1 and "its lines end in CRLF, the manifest's bytes in LF" in said[0], said
    line = refused(["apply", "--sglang-rev", "v0.5.23", "--series", series, "--tree", series.parent / "t"],
                   contains=f"corrupt series file patches/{path.name}: its lines end in CRLF")
    assert "--update-hashes" not in line


def test_a_rebase_in_a_sparse_checkout_leaves_the_provenance_in_the_tree(series, tree):
    """h140 case 35: in a sparse tree whose patterns leave out the provenance, rebase's checkout of its result left it
    out (skip-worktree, not on disk): status said "no c128patch series is applied" and advised checking out the
    branch already checked out; refresh refused. The rebase writes it, as apply's `add` does."""
    subprocess.run(["git", "-C", str(tree), "sparse-checkout", "set", "--no-cone", "/*.md"], check=True)
    assert invoke(*apply_args(tree, series, "v0.5.23")).code == 0

    def edit(idx: Git) -> None:
        blob = idx.out("hash-object", "-w", "--stdin", input="upstream\n")
        idx.run("update-index", "--add", "--cacheinfo", f"100644,{blob},UPSTREAM.md")

    onto = upstream_commit(Git(worktree=tree), "v0.5.23", "upstream adds a file", edit)
    res = invoke("rebase", "--onto", onto, "--tree", tree, "--series", series)
    assert res.code == 0, res.err
    assert (tree / "python/sglang/c128patch_provenance.json").is_file()
    res = invoke("status", "--tree", tree, "--series", series)
    assert res.code == 0, res.err


def test_the_operators_remote_settings_never_keep_a_url_mirror_from_fetching_a_new_rev(series, packed_release_repo,
                                                                                       tmp_path):
    """h140: `clone.defaultRemoteName = up` (or a `remote.origin.*` of their own) in the operator's global config named
    the `--repo URL` mirror's remote `up`; its later `fetch origin` failed, unsaid, and a rev upstream added after the
    first clone was an "unknown rev" for ever. The mirror is fetched from its URL now, whatever its remote is named."""
    source = tmp_path / "upstream.git"
    subprocess.run(["git", "clone", "--quiet", "--bare", "--shared", str(packed_release_repo), str(source)], check=True)
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text('[clone]\n\tdefaultRemoteName = up\n[remote "origin"]\n\ttagOpt = --no-tags\n')
    env = {"HOME": str(home), "GIT_CONFIG_GLOBAL": None, "C128PATCH_CACHE": str(tmp_path / "cache")}
    url = source.as_uri()
    res = invoke("check", "--sglang-rev", "v0.5.23", "--repo", url, "--series", series, env=env)
    assert res.code == 0, res.err
    subprocess.run(["git", "-C", str(source), "tag", "v9-new", "v0.5.23"], check=True)
    res = invoke("check", "--sglang-rev", "v9-new", "--repo", url, "--series", series, env=env)
    assert res.code == 0, res.err


def _partial_clone(repo: Path, dest: Path, how: str) -> Path:
    """A blobless clone of ``repo`` (through a file:// server that serves filters) at ``dest``; ``repo`` is
    ``packed_release_repo``: a clone through a URL, here and the full one the refusal prints, reuses its deltas."""
    server = dest.parent / "server.git"
    subprocess.run(["git", "clone", "--quiet", "--bare", "--shared", str(repo), str(server)], check=True)
    subprocess.run(["git", "-C", str(server), "config", "uploadpack.allowFilter", "true"], check=True)
    subprocess.run(["git", "clone", "--quiet", how, "--filter=blob:none", server.as_uri(), str(dest)], check=True)
    return dest


def test_a_partial_clone_whose_remote_names_a_program_runs_nothing_on_a_missing_object(series, marker,
                                                                                        packed_release_repo, tmp_path):
    """h140: a `--repo` that is a partial clone (`--filter=blob:none`: remote.origin.promisor) with
    `remote.origin.uploadpack = <program>`: `check` read a blob it lacks, git fetched it lazily from the promisor remote
    and ran the program. Now refused in one line; and no call of the tool's but a clone or fetch reaches a remote at
    all (`protocol.*.allow=never`), whatever the repository's own `protocol.file.allow` says."""
    prog, mark = marker
    partial = _partial_clone(packed_release_repo, tmp_path / "partial.git", "--bare")
    for key, value in (("remote.origin.uploadpack", f"{prog} </dev/null; git-upload-pack"),
                       ("protocol.file.allow", "always")):
        subprocess.run(["git", "-C", str(partial), "config", key, value], check=True)
    refused(["check", "--sglang-rev", "v0.5.23", "--repo", partial, "--series", series], None,
            "a partial clone (remote.origin.promisor = true)")
    refused(["apply", "--sglang-rev", "v0.5.23", "--repo", partial, "--tree", tmp_path / "t", "--series", series], None,
            "(remote.origin.promisor = true)")
    # past the refusal (as a promisor remote the check did not see would be): the missing blob is missing, nothing ran
    git = Git(git_dir=partial, filters_off=[])
    assert git.blob("v0.5.23", CUH) is None
    assert not mark.exists() and not (tmp_path / "t").exists()


def test_the_full_clone_a_partial_clones_refusal_prints_is_taken_as_printed(series, packed_release_repo, tmp_path):
    """The refusal of a partial clone names a command making a full one from its remote: run as printed (bash), then
    `check --repo` on what it made."""
    partial = _partial_clone(packed_release_repo, tmp_path / "my sglang", "--no-checkout")
    line = refused(["check", "--sglang-rev", "v0.5.23", "--repo", partial, "--series", series], None,
                   "use a full clone: ")
    command, _, repo = line.split("use a full clone: ", 1)[1].rpartition(", then --repo ")
    assert run_printed(command, tmp_path).returncode == 0
    full = run_printed(f"printf %s {repo}").stdout
    assert full == f"{partial}-full"
    res = invoke("check", "--sglang-rev", "v0.5.23", "--repo", full, "--series", str(series))
    assert res.code == 0, res.err


@pytest.mark.parametrize("how", ["fix", "error-all"])
def test_a_trees_whitespace_settings_never_change_or_refuse_the_series_commits(series, tree, sglang_release_repo,
                                                                              tmp_path, how):
    """h140: the tree's `apply.whitespace = fix` with `core.whitespace = indent-with-non-tab` had `git am` re-indent the
    series' added lines with tabs (Python with a TabError), and apply still said "identical to a fresh apply";
    `error-all` made the entry a conflict. Now the same commits as in a plain clone, the line as the patch has it."""
    clean = small_clone(sglang_release_repo, tmp_path / "clean").worktree
    assert invoke(*apply_args(clean, series, "v0.5.23")).code == 0
    for key, value in {"core.whitespace": "indent-with-non-tab,tabwidth=4", "apply.whitespace": how}.items():
        subprocess.run(["git", "-C", str(tree), "config", key, value], check=True)
    res = invoke(*apply_args(tree, series, "v0.5.23"))
    assert res.code == 0, res.err
    assert Git(worktree=tree).out("log", "--format=%H", "v0.5.23..HEAD") == \
        Git(worktree=clean).out("log", "--format=%H", "v0.5.23..HEAD")
    assert EDIT[CUH][1] in (tree / CUH).read_text()


@pytest.mark.parametrize("settings", [
    {"commit.cleanup": "strip", "core.commentChar": "C"},
    {"trailer.where": "start", "trailer.ifexists": "replace", "trailer.separators": "#"},
    {"i18n.commitEncoding": "latin1", "am.threeWay": "true", "mailinfo.scissors": "true"},
], ids=["cleanup", "trailers", "encoding"])
def test_a_trees_commit_settings_never_change_the_tools_commits(series, tree, sglang_release_repo, tmp_path, settings):
    """h140: the tree's `commit.cleanup = strip` with `core.commentChar = C` stripped the `C128patch-Entry` trailer
    `commit --trailer` adds, `trailer.where`/`ifexists` moved or replaced it: apply refused its own commit, half done;
    `i18n.commitEncoding = latin1` gave every commit an `encoding` header, other ids. Now the same commits as in a
    plain clone; a setting aimed at the tool's own trailer (`trailer.<x>.key = C128patch-Entry`) is one line."""
    clean = small_clone(sglang_release_repo, tmp_path / "clean").worktree
    assert invoke(*apply_args(clean, series, "v0.5.23")).code == 0
    for key, value in settings.items():
        subprocess.run(["git", "-C", str(tree), "config", key, value], check=True)
    res = invoke(*apply_args(tree, series, "v0.5.23"))
    assert res.code == 0, res.err
    assert Git(worktree=tree).out("log", "--format=%H", "v0.5.23..HEAD") == \
        Git(worktree=clean).out("log", "--format=%H", "v0.5.23..HEAD")
    if "trailer.where" in settings:
        Git(worktree=tree).run("checkout", "-q", "main")
        subprocess.run(["git", "-C", str(tree), "config", "trailer.x.key", "C128patch-Entry"], check=True)
        refs = subprocess.run(["git", "-C", str(tree), "show-ref", "--head"], capture_output=True, text=True).stdout
        refused([*apply_args(tree, series, "v0.5.23"), "--branch", "again"], None,
                "how git writes c128patch's own trailer (trailer.x.key = C128patch-Entry)")
        assert subprocess.run(["git", "-C", str(tree), "show-ref", "--head"], capture_output=True, text=True).stdout \
            == refs


def test_a_sha256_upstream_is_one_line_for_check_and_apply_alike(series, tmp_path):
    """h140: a `--repo` whose objects are SHA-256 (`git init --object-format=sha256`): `check` printed every entry as
    `error` ("git update-index --index-info failed: malformed index info 0 0000...": a SHA-1 id) and predicted apply
    to be refused, while apply went on. Both are one line now, nothing made."""
    repo = tmp_path / "sha256.git"
    subprocess.run(["git", "init", "--quiet", "--bare", "--object-format=sha256", str(repo)], check=True)
    empty = subprocess.run(["git", "-C", str(repo), "mktree"], input="", capture_output=True, text=True,
                           check=True).stdout.strip()
    commit = subprocess.run(["git", "-C", str(repo), "-c", "user.name=u", "-c", "user.email=u@x.invalid", "commit-tree",
                             empty, "-m", "x"], capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run(["git", "-C", str(repo), "tag", "v0.5.23", commit], check=True)
    for args in (["check", "--sglang-rev", "v0.5.23", "--repo", repo, "--series", series],
                 ["apply", "--sglang-rev", "v0.5.23", "--repo", repo, "--tree", tmp_path / "t", "--series", series]):
        refused(args, None, "its objects are named by sha256 (extensions.objectFormat)")
    assert not (tmp_path / "t").exists()


def test_a_folder_inside_a_work_tree_is_no_repo_and_no_tree_to_apply_to(series, tree, sglang_release_repo):
    """h140: `apply --repo R/python` (a folder inside the work tree R) took that folder for the tree: git ran from the
    top but the overlay was written at R/python/python/sglang/..., the apply stopped half done. `--repo` and an
    existing `--tree` name a work tree's top now, else one line naming it."""
    inside = tree / "python"
    for args in (apply_args(inside, series, "v0.5.23"),
                 ["apply", "--sglang-rev", "v0.5.23", "--repo", sglang_release_repo, "--tree", inside,
                  "--series", series],
                 ["check", "--sglang-rev", "v0.5.23", "--repo", inside, "--series", series]):
        refused(args, tree, f"is a folder inside the work tree {tree}, not its top")
    assert not (inside / "python").exists()


def test_an_overlay_file_is_staged_as_its_bytes_whatever_the_trees_attributes(tmp_path):
    """`plan.written_blob` and `plan._probe_apply` ran `git hash-object -w -- FILE` without `--no-filters`: the target
    tree's committed `.gitattributes` (`* text ident`), its `.git/info/attributes` or `core.autocrlf=true` (an upstream
    commits one, or the operator's clone has it) turned an overlay file's CRLF into LF and its `$Id: ...$` into
    `$Id$`: the commit and the probe held other bytes than the series' file. Staged as its bytes now."""
    from types import SimpleNamespace

    from c128patch.git import blob_id
    from c128patch.series.plan import _probe_apply, written_blob

    repo = tmp_path / "r"
    git = Git(worktree=repo)
    repo.mkdir()
    git.run("init", "-q")
    (repo / ".gitattributes").write_bytes(b"* text ident\n")
    git.run("add", ".gitattributes")
    git.run("commit", "-qm", "c")
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "attributes").write_text("* text eol=crlf\n")
    git.run("config", "core.autocrlf", "true")
    overlay = tmp_path / "series" / "overlay.py"
    overlay.parent.mkdir()
    overlay.write_bytes(b"# $Id: 0123456789 $\r\nA = 1\r\n")
    want = blob_id(overlay.read_bytes())
    assert written_blob(git, overlay) == want
    idx = git.with_env(GIT_INDEX_FILE=str(tmp_path / "probe.index"))
    _probe_apply(idx, SimpleNamespace(patch=None, path=overlay, entry=SimpleNamespace(target="python/overlay.py")))
    assert idx.out("ls-files", "-s").split()[1] == want


def test_extract_from_a_repository_whose_path_holds_a_newline(tmp_path):
    """`Git.extract` borrowed the objects through an alternates file, one path a line: a repository (or the release
    cache) whose path holds a newline was "object directory ... does not exist". GIT_OBJECT_DIRECTORY names it."""
    repo = tmp_path / "a\nb" / "r"
    repo.mkdir(parents=True)
    git = Git(worktree=repo)
    git.run("init", "-q")
    (repo / "a.txt").write_bytes(b"hi\n")
    git.run("add", "a.txt")
    git.run("commit", "-qm", "c")
    git.extract("HEAD", ".", tmp_path / "out")
    assert (tmp_path / "out" / "a.txt").read_bytes() == b"hi\n"


def test_extract_onto_a_full_disk_says_so(tmp_path, monkeypatch):
    """`treecheck` with TMPDIR on a nearly full disk (2 MiB of room for sglang's 87 MB): "git -c core.symlinks=false
    --work-tree failed: error: unable to write file python/...": git names no errno. It says the disk is full."""
    import collections

    import c128patch.git as git_module

    repo = tmp_path / "r"
    repo.mkdir()
    git = Git(worktree=repo)
    git.run("init", "-q")
    (repo / "python").mkdir()
    (repo / "python" / "a.py").write_bytes(b"A = 1\n")
    git.run("add", "python/a.py")
    git.run("commit", "-qm", "c")
    dest = tmp_path / "out"
    dest.mkdir()
    real = Git.run

    def run(self, *args, **kw):  # git's own words on a full disk
        if "checkout-index" in args:
            raise GitError(["git", *args], 128, "error: unable to write file python/a.py\n")
        return real(self, *args, **kw)

    monkeypatch.setattr(Git, "run", run)
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(git_module.shutil, "disk_usage", lambda p: usage(1 << 30, 1 << 30, 4096))
    with pytest.raises(C128Error, match=r"cannot write the files into .*out: no space left on its disk \(4 KiB free\)"):
        git.extract("HEAD", ".", dest)


def test_two_tags_whose_variant_file_names_meet_never_share_one_file(series, tree):
    """helper 166: refresh names a variant's file `<stem>.<tag with '/' as '-'>.patch`: upstream's tags `v0.5.24-x`
    and `v0.5.24/x` (both plain words, refresh.LABEL) named one file, the second refresh writing its patch over the
    first's variant, whose recorded sha256 no longer matched its file."""
    git = Git(worktree=tree)
    assert invoke(*apply_args(tree, series), as_json=False).code == 0
    for tag, note in (("v0.5.24-x", "first"), ("v0.5.24/x", "second")):
        def edit(idx: Git, note: str = note) -> None:
            text = git.blob("v0.5.23", CUH).decode().replace(LINE, LINE.rstrip("\n") + f"  // upstream's {note}\n")
            blob = idx.out("hash-object", "-w", "--stdin", input=text)
            idx.run("update-index", "--cacheinfo", f"100644,{blob},{CUH}")
        onto = upstream_commit(git, "v0.5.23", f"upstream edits our line ({note})", edit)
        git.run("tag", tag, onto)
        assert invoke("rebase", "--onto", tag, "--tree", tree, "--series", series, as_json=False).code == 1
        text = (tree / CUH).read_text()
        start, end = text.index("<<<<<<<"), text.index(">>>>>>>")
        (tree / CUH).write_text(text[:start] + LINE.rstrip("\n") + f"  // resolved {note}\n"
                                + text[text.index("\n", end) + 1:])
        git.run("add", CUH)
        res = invoke("rebase", "--continue", "--tree", tree, as_json=False)
        assert res.code == 0, res.err
        before = {p: p.read_bytes() for p in series.rglob("*") if p.is_file()}
        res = invoke("refresh", "--variant", "--tree", tree, "--series", series, as_json=False)
        assert res.code == (0 if note == "first" else 2), res.err
    assert "would be named as those of the series' base v0.5.24-x" in res.err, res.err
    assert {p: p.read_bytes() for p in series.rglob("*") if p.is_file()} == before
    assert invoke("lint", "--offline", "--series", series, as_json=False).code == 0
    assert run_printed(res.err.split("them (", 1)[1].split("), and run again")[0]).returncode == 0  # as printed
    assert invoke("refresh", "--variant", "--tree", tree, "--series", series, as_json=False).code == 0
    assert invoke("lint", "--offline", "--series", series, as_json=False).code == 0
    assert (series / "patches" / f"0001-test.{onto[:12]}.patch").is_file(), sorted((series / "patches").iterdir())


@pytest.mark.parametrize("report", ["rebase-report.md", "rebase-report.json"])
def test_a_link_at_the_rebase_report_is_replaced_never_written_through(series, tree, tmp_path, report):
    """helper 166: rebase wrote `.git/c128patch/rebase-report.md` with write_text, through a link there (whoever can
    write the tree's git dir): the file it named (~/.bashrc) was overwritten with the report. Now written as every
    state file is (``jsonio.write_atomic``: a new file renamed over the link); the JSON report too (helper 179)."""
    git, victim = Git(worktree=tree), tmp_path / "victim"
    victim.write_text("precious\n")
    assert invoke(*apply_args(tree, series), as_json=False).code == 0
    state = tree / ".git" / "c128patch"
    state.mkdir(exist_ok=True)
    (state / report).symlink_to(victim)
    assert invoke("rebase", "--onto", upstream_edits_the_same_line(git, tree), "--tree", tree, "--series", series,
                  as_json=False).code == 1
    assert victim.read_text() == "precious\n"
    assert not (state / report).is_symlink() and "conflict" in (state / report).read_text()


def test_a_hunkless_file_diff_without_git_prefixes_is_refused_as_corrupt(tmp_path):
    """helper 167: ``diff --git python/x.py python/x.py`` with ``new file mode`` and no hunk: git (-p1) makes ``x.py``,
    every check read ``python/x.py`` (no ``---`` line to compare)."""
    from c128patch.errors import C128Error
    from c128patch.series.patchfile import read_patch

    patch = tmp_path / "0001-x.patch"
    patch.write_text("From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\nFrom: t <t@t.invalid>\n"
                     "Subject: [PATCH] x\n\n---\ndiff --git python/x.py python/x.py\nnew file mode 100644\n"
                     "index 0000000..e69de29\n")
    with pytest.raises(C128Error, match="'diff --git python/x.py python/x.py' has no a/ and b/ prefixes"):
        read_patch(patch)
    patch.write_text(patch.read_text().replace("python/x.py python/x.py", "a/python/x.py b/python/x.py"))
    assert read_patch(patch).paths == ["python/x.py"]


def test_a_pack_index_over_64_mib_is_held_to_its_packs_checksum_not_refused_as_damaged(tmp_path):
    """Helper 174: every .idx over 64 MiB (a history of millions of objects) was "damaged": the operator's large clone
    refused by every verb. Such an index is held to its pack's checksum alone (not read whole on every verb)."""
    from c128patch.git import index_sound

    pack_sum = bytes(range(20))
    idx, pack = tmp_path / "pack-x.idx", tmp_path / "pack-x.pack"
    pack.write_bytes(b"PACK" + b"\0" * 100 + pack_sum)
    with open(idx, "wb") as f:  # (sparse: 65 MiB of zeros, then the pack's checksum and a made-up own one)
        f.truncate(65 << 20)
        f.seek(0, 2)
        f.write(pack_sum + b"\1" * 20)
    assert index_sound(idx)
    pack.write_bytes(b"PACK" + b"\0" * 100 + b"\2" * 20)  # another pack's checksum: damaged
    assert not index_sound(idx)


def test_a_full_disk_in_a_fresh_clone_says_it_was_removed_not_to_resume(sglang_release_repo, tmp_path, monkeypatch):
    """Helper 183: a 149 MB tmpfs took the clone and checkout, then ``git am`` ran out of space: "... Out of diskspace
    (fix that, then resume) (the new clone ... was removed)"; there is nothing to resume (``apply --continue``: "no
    such folder"). Now it says the clone was removed, and nothing of resuming."""
    fake = failing_git(tmp_path / "bin", '*" am "*', OUT_OF_DISK)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    tree = tmp_path / "sglang"
    res = invoke("apply", "--sglang-rev", "v0.5.23", "--tree", tree, as_json=False)
    assert res.code == 2 and "Out of diskspace" in res.err and f"(the new clone {tree} was removed)" in res.err, res.err
    assert "resume" not in res.err and not tree.exists(), res.err


def test_an_abort_the_disk_stops_says_the_apply_is_still_stopped_and_how_to_undo_it(series, tree, tmp_path,
                                                                                  monkeypatch):
    """Helper 183: `apply --continue` or `--abort` on a still full disk: "git status ... failed: ... Out of diskspace",
    nothing said of the apply (still stopped, its journal kept). Now it says so with both; the undo works as printed."""
    path = os.environ["PATH"]
    fake = failing_git(tmp_path / "bin", '*" am "*', OUT_OF_DISK)
    monkeypatch.setenv("PATH", f"{fake.parent}:{path}")
    assert invoke(*apply_args(tree, series), as_json=False).code == 2
    failing_git(fake.parent, '*" status "*', OUT_OF_DISK)
    undo, resume = (f"c128patch apply --{verb} --tree {tree.resolve()}" for verb in ("abort", "continue"))
    for verb in ("--continue", "--abort"):
        res = invoke("apply", verb, "--tree", tree, as_json=False)
        assert res.code == 2 and "Out of diskspace" in res.err, res.err
        assert f"the apply is still stopped (its journal kept); fix that, then: {resume}, or undo it: {undo}" in \
            res.err, res.err
    monkeypatch.setenv("PATH", path)
    done = invoke(*undo.split()[1:], as_json=False)
    assert done.code == 0 and "apply aborted" in done.text + done.err, done.err
