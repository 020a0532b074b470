"""c128patch apply --sglang-rev X [--repo R] [--branch B] [--tree DIR] | --continue | --abort [--tree DIR]"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import click

from c128patch.cli.common import (
    emit_json,
    handles_errors,
    json_option,
    locate_tree,
    repo_option,
    series_option,
)
from c128patch.errors import C128Error, ConflictError, Interrupted
from c128patch.upstream import DEFAULT_TREE

if TYPE_CHECKING:
    from c128patch.git import Git
    from c128patch.ops.apply import ApplyResult
    from c128patch.series.manifest import Series


@click.command("apply")
@click.option("--sglang-rev", "rev", default=None,
              help="Upstream revision: a release tag (v0.5.23) or, with --repo, any commit-ish.")
@repo_option
@click.option("--branch", default=None, help="Branch to create (default: c128/<rev>).")
@click.option("--tree", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Working tree to patch when upstream is a URL or the releases (default: ./sglang). With a local "
                   "--repo, the repo is the tree. With --continue/--abort: the tree the apply stopped in "
                   "(default: the current directory).")
@click.option("--continue", "cont", is_flag=True,
              help="Finish an apply that stopped: after a kill or Ctrl-C, or a conflict resolved with git am.")
@click.option("--abort", is_flag=True,
              help="Undo an apply that stopped: back to the original branch or HEAD; the new branch (or the clone "
                   "it made) is removed.")
@series_option
@json_option
@handles_errors
def command(rev: str | None, repo: str | None, branch: str | None, tree: Path | None, cont: bool, abort: bool,
            series_dir: Path | None, layer_dirs: tuple[Path, ...], as_json: bool) -> None:
    """Check out REV on a new branch and apply the series, one commit per entry."""
    from c128patch.git import Git
    from c128patch.ops.apply import Apply, clone_template
    from c128patch.ops.check import support_note
    from c128patch.progress import reporter
    from c128patch.series.layers import get_series
    from c128patch.series.plan import check_paths_at, plan
    from c128patch.upstream.source import discard_fresh_tree, is_url, open_upstream, prepare_tree, refuse_git_dir

    chosen = [n for n, on in (("--sglang-rev", rev), ("--continue", cont), ("--abort", abort)) if on]
    if len(chosen) != 1:
        raise C128Error("give exactly one of --sglang-rev REV, --continue, --abort")
    if rev is None:
        if branch:
            raise C128Error("--branch goes with --sglang-rev")
        _finish(tree or (Path(repo) if repo and not is_url(repo) else None), cont, series_dir, layer_dirs, as_json)
        return
    series = get_series(series_dir, layer_dirs)
    if tree is not None:
        refuse_git_dir(tree)
    with reporter(not as_json, title="apply") as rep:
        upstream = open_upstream(repo, [rev], rep)
        commit = upstream.resolve(rev)
        older = support_note(series, upstream.git, rev, commit)  # still tried, as check does
        # refuse a broken series before anything is cloned or checked out
        planned = plan(series, upstream.git, commit)
        check_paths_at(upstream.git, commit, planned)
        info = {"rev": rev, "commit": commit, "source": upstream.kind}
        if upstream.kind == "url":
            info["url"] = upstream.location
        if tree is None and upstream.kind != "path":
            _refuse_switching(DEFAULT_TREE, rev, commit, branch or f"c128/{rev}")
        existed = (tree or DEFAULT_TREE).exists()
        template = clone_template(series, rev, commit, branch, str(upstream.git.git_dir or upstream.git.worktree),
                                  existed, info)
        try:
            worktree, fresh = prepare_tree(upstream, tree, commit, rep, template=template)
        finally:
            shutil.rmtree(template, ignore_errors=True)
        try:
            result = Apply(Git(worktree=worktree), series, rep).start(rev, commit, branch=branch, fresh_clone=fresh,
                                                                     upstream_info=info, planned=planned)
        except KeyboardInterrupt:
            raise _interrupted(worktree.resolve()) from None
        except C128Error as exc:
            # A conflict leaves the branch for inspection (its hint says how to resume or undo); any
            # other failure in a clone made just now leaves nothing behind.
            if fresh and not isinstance(exc, ConflictError):
                discard_fresh_tree(worktree, existed)
                exc.message += f" (the new clone {worktree} was removed)"
                exc.hint = None  # nothing is left to resume or undo
            if older and isinstance(exc, ConflictError):  # why it stops, before how to resolve it
                exc.hint = "\n".join([f"note: {older}", *([exc.hint] if exc.hint else [])])
            raise
    _report(result, series, Git(worktree=worktree), as_json, older)


def _refuse_switching(tree: Path, rev: str, commit: str, branch: str) -> None:
    """The default tree holds another upstream commit: switching it to a new branch is asked for
    with --tree, never done unasked."""
    import json

    from c128patch.git import Git, is_work_tree
    from c128patch.series.provenance import PROVENANCE_PATH

    if not tree.is_dir() or not is_work_tree(tree):
        return
    git = Git(worktree=tree)
    head = git.rev_parse("HEAD")
    record = git.blob("HEAD", PROVENANCE_PATH) if head else None
    try:
        upstream = json.loads(record)["upstream"] if record else {"commit": head, "rev": (head or "")[:12]}
    except (ValueError, KeyError, TypeError):
        upstream = {"commit": head, "rev": (head or "")[:12]}
    if head is None or upstream.get("commit") == commit:
        return
    on = git.run("symbolic-ref", "--short", "-q", "HEAD", check=False).stdout.strip()
    held = f"{upstream.get('rev')}" + (f" + series (branch {on})" if record and on else f" (branch {on})" if on else "")
    switch = shlex.join(["c128patch", "apply", "--sglang-rev", rev, "--tree", str(tree)])
    beside = shlex.join(["c128patch", "apply", "--sglang-rev", rev, "--tree", f"{tree}-{rev}"])
    raise C128Error(f"./{tree} holds {held}: applying {rev} there would switch it to a new branch {branch}; "
                    "say which you want",
                    hint=f"  switch ./{tree} (its branch stays): {switch}\n  a second tree beside it: {beside}")


def _interrupted(tree: Path) -> Interrupted:
    from c128patch.ops.treestate import apply_commands

    resume, undo = apply_commands(tree)
    return Interrupted(f"interrupted: the apply journal is intact; resume with `{resume}` or undo with `{undo}`")


def _finish(where: Path | None, cont: bool, series_dir: Path | None, layer_dirs: tuple[Path, ...], as_json: bool) -> None:
    """--continue / --abort, in ``where`` (None: the tree ``locate_tree`` finds, as status does)."""
    from c128patch.git import Git
    from c128patch.ops.apply import Apply
    from c128patch.progress import console, reporter
    from c128patch.series.layers import get_series

    if where is not None and not where.is_dir():
        raise C128Error(f"no such folder: {where}")
    git = Git(worktree=locate_tree(where))
    with reporter(not as_json and cont, title="apply") as rep:
        op = Apply(git, get_series(series_dir, layer_dirs) if series_dir else None, rep)
        try:
            if cont:
                result = op.resume()
            else:
                aborted = op.abort()
        except KeyboardInterrupt:
            raise _interrupted(git.worktree) from None  # type: ignore[arg-type]
    if cont:
        assert op.series is not None
        _report(result, op.series, git, as_json)
        return
    if as_json:
        emit_json(aborted)
        return
    if aborted["removed_clone"]:
        say = f"apply aborted: the clone {aborted['tree']} it made was removed"
    else:
        where_to = aborted["branch"] or f"detached HEAD at {str(aborted['head'])[:12]}"
        say = f"apply aborted: {aborted['tree']} is back on {where_to}"
        if aborted["stash"]:
            listing = shlex.join(["git", "-C", aborted["tree"], "stash", "list"])
            say += f"; uncommitted changes are in stash {aborted['stash'][:12]} ({listing})"
    console(stderr=False).print(say, markup=False)


def _report(result: ApplyResult, series: Series, git: Git, as_json: bool, older: str = "") -> None:
    from c128patch.evidence.matrix import verification_note
    from c128patch.progress import console
    from c128patch.series.layers import describe, layer_rows

    note = verification_note(series.ours, git, result.upstream_commit, result.rev)
    if as_json:
        emit_json({"ok": True, **result.to_json(), "evidence_note": note, "support_note": older,
                   "layers": layer_rows(series)})
        return
    out = console(stderr=False)
    if result.already_applied:
        on_top = f", {result.commits_on_top} commit(s) of yours on top" if result.commits_on_top else ""
        checkout = shlex.join(["git", "-C", result.tree, "checkout", result.branch])
        where = "" if result.checked_out else f"; not checked out: {checkout}"
        out.print(f"{result.tree}: {result.branch} already holds {result.rev} + {describe(series)} "
                  f"(at {result.head[:12]}{on_top}): nothing to do{where}", markup=False)
        return
    for row in result.entries:
        if row.get("status") == "skipped":
            out.print(f"  skipped {row['name']} ({row['detail']})", markup=False)
            continue
        how = {"3way": " (needed a 3-way merge)", "resolved": " (resolved by hand)"}.get(row.get("applied", ""), "")
        out.print(f"  applied {row['name']}{how}", markup=False)
    out.print(f"{result.tree}: {result.branch} = {result.rev} + {describe(series)} "
              f"({len(result.entries)} entries), HEAD {result.head[:12]}", markup=False)
    out.print(f"  {result.equivalence['summary']}", markup=False)
    if note:
        out.print(note, markup=False)
    if older:
        out.print(f"note: {older}", markup=False)
    if not result.orig_head:
        return
    if result.orig_branch:
        out.print(f"  your branch {result.orig_branch} is untouched at {result.orig_head[:12]} "
                  f"(recovery ref {result.recovery_ref})", markup=False)
    elif result.orig_unreachable:
        keep = shlex.join(["git", "-C", result.tree, "branch", f"c128patch-saved-{result.orig_head[:8]}",
                           result.recovery_ref])
        out.print(f"  note: HEAD was detached at {result.orig_head[:12]} with {result.orig_unreachable} commit(s) "
                  f"that no branch holds; they are kept at {result.recovery_ref} (on a branch: {keep})", markup=False)
    else:
        out.print(f"  HEAD was detached at {result.orig_head[:12]} (recovery ref {result.recovery_ref})", markup=False)
