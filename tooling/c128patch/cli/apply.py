"""c128patch apply --sglang-rev X [--repo R] [--branch B] [--tree DIR] | --continue | --abort [--tree DIR]"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import click

from c128patch.cli.common import (
    Run,
    applied_here,
    load_stack,
    locate_tree,
    recorded_layers_said,
    repo_option,
    say,
    verb_options,
)
from c128patch.errors import C128Error

if TYPE_CHECKING:
    from c128patch.ops.applier import Apply
    from c128patch.ops.apply import ApplyResult
    from c128patch.series.manifest import Series


@click.command("apply")
@click.option("--sglang-rev", "rev", default=None,
              help="Upstream revision: a release tag (v0.5.23) or, with --repo, any commit-ish.")
@repo_option
@click.option("--branch", default=None, help="Branch to create (default: c128/<rev>).")
@click.option("--tree", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Working tree to patch when upstream is a URL or the releases (default: the patched tree you "
                   "are in, else ./sglang). With a local "
                   "--repo, the repo is the tree. With --continue/--abort: the tree the apply stopped in "
                   "(default: the current directory).")
@click.option("--continue", "cont", is_flag=True,
              help="Finish an apply that stopped: after a kill or Ctrl-C, or a conflict resolved with git am.")
@click.option("--abort", is_flag=True,
              help="Undo an apply that stopped: back to the original branch or HEAD; the new branch (or the clone "
                   "it made) is removed. Changes of yours in the tree are stashed, never dropped; a clone it made "
                   "that holds some is kept, at REV with no branch of the series.")
@verb_options
def command(rev: str | None, repo: str | None, branch: str | None, tree: Path | None, cont: bool, abort: bool,
            series_dir: Path | None, layer_dirs: tuple[Path, ...], as_json: bool, run: Run) -> None:
    """Check out REV on a new branch and apply the series, one commit per entry."""
    from c128patch.git import Git, work_tree_top
    from c128patch.ops.applier import Apply
    from c128patch.ops.apply import apply_rev, continue_apply
    from c128patch.progress import reporter
    from c128patch.textsafe import shell_join
    from c128patch.upstream import is_url

    if sum(map(bool, (rev, cont, abort))) != 1:
        raise C128Error("give exactly one of --sglang-rev REV, --continue, --abort")
    local = Path(repo) if repo and not is_url(repo) else None  # a local --repo is the tree
    if rev is not None and tree is None and local is None and applied_here(top := work_tree_top(Path.cwd())):
        tree = top  # run from a patched tree: that tree, as status takes it, not a new ./sglang inside it
        if not as_json:
            say(f"applying in the tree you are in, {top} (pass --tree DIR for another)")
    if rev is not None:
        series = load_stack(run, series_dir, layer_dirs, tree or local, repo)
        with reporter(not as_json, title="apply") as rep:
            result, older = apply_rev(series, repo, rev, tree=tree, branch=branch, reporter=rep)
        return _report(run, result, series, older)
    if branch:
        raise C128Error("--branch goes with --sglang-rev")
    where = tree or local  # None: the tree locate_tree finds, as status
    if where is not None and not where.is_dir():
        raise C128Error(f"no such folder: {where}")
    git = Git(worktree=locate_tree(where))
    if cont:
        with reporter(not as_json, title="apply") as rep, _still_stopped(Apply(git)):
            result, series = continue_apply(git, load_stack(run, series_dir, layer_dirs, git.worktree)
                                            if series_dir else recorded_layers_said(run, Apply(git).recorded()),
                                            rep)
        return _report(run, result, series)
    with _still_stopped(Apply(git)) as undoing:
        aborted = undoing.abort()
    if as_json:
        return run.emit(aborted)
    if aborted["removed_clone"]:
        done = f"apply aborted: the clone {aborted['tree']} it made was removed"
    elif aborted["kept_clone"]:  # it holds the user's changes: at the rev, clean, the changes stashed (one line)
        listing = shell_join(["git", "-C", aborted["tree"], "stash", "list"])
        remove = shell_join(["rm", "-rf", aborted["tree"]])
        done = (f"apply aborted: the clone {aborted['tree']} it made is kept, as it holds changes of yours: they are "
                f"in stash {aborted['stash'][:12]} ({listing}); it is back at {aborted['rev']} "
                f"({str(aborted['head'])[:12]}, detached, none of the series applied); apply again: "
                f"{aborted['reapply']}; or remove the clone, your stash with it: {remove}")
    else:
        where_to = aborted["branch"] or f"detached HEAD at {str(aborted['head'])[:12]}"
        done = f"apply aborted: {aborted['tree']} is back on {where_to}"
        if aborted["stash"]:
            listing = shell_join(["git", "-C", aborted["tree"], "stash", "list"])
            done += f"; uncommitted changes are in stash {aborted['stash'][:12]} ({listing})"
    say(done)


@contextlib.contextmanager
def _still_stopped(stopped: Apply) -> Iterator[Apply]:
    """A --continue or --abort that fails with the apply's journal kept (a full disk at its git status or reset: git's
    line alone, not a word of the apply still stopped; helper 183) says so, with the resume and the undo."""
    try:
        yield stopped
    except C128Error as exc:
        from c128patch.git import machine_failed

        if stopped.path.is_file() and not exc.hint and machine_failed(exc.message):
            from c128patch.ops.treestate import apply_commands

            resume, undo = apply_commands(stopped.tree)
            exc.hint = f"the apply is still stopped (its journal kept); fix that, then: {resume}, or undo it: {undo}"
        raise


def _report(run: Run, r: ApplyResult, series: Series, older: str = "") -> None:
    from c128patch.evidence.matrix import verification_note
    from c128patch.git import Git
    from c128patch.series.layers import describe, layer_rows
    from c128patch.textsafe import count, shell_join

    note = verification_note(series.ours, Git(worktree=Path(r.tree)), r.upstream_commit, r.rev)
    if run.as_json:
        return run.emit({"ok": True, **r.to_json(), "evidence_note": note, "support_note": older,
                          "layers": layer_rows(series)}, series)
    if r.already_applied:
        on_top = f", {r.commits_on_top} commit(s) of yours on top" if r.commits_on_top else ""
        where = "" if r.checked_out else f"; not checked out: {shell_join(['git', '-C', r.tree, 'checkout', r.branch])}"
        return say(f"{r.tree}: {r.branch} already holds {r.rev} + {describe(series)} (at {r.head[:12]}{on_top}): "
                   f"nothing to do{where}", *_found_from_here(r, series))
    how = {"3way": " (needed a 3-way merge)", "resolved": " (resolved by hand)"}
    lines = [f"  skipped {row['name']} ({row['detail']})" if row.get("status") == "skipped"
             else f"  applied {row['name']}{how.get(row.get('applied', ''), '')}" for row in r.entries]
    lines += [f"{r.tree}: {r.branch} = {r.rev} + {describe(series)} ({count(len(r.entries), 'entry')}), "
              f"HEAD {r.head[:12]}",
              f"  {r.equivalence['summary']}", *([note] if note else []), *([f"note: {older}"] if older else [])]
    if r.orig_head and r.orig_branch:
        lines.append(f"  your branch {r.orig_branch} is untouched at {r.orig_head[:12]} "
                     f"(recovery ref {r.recovery_ref})")
    elif r.orig_head and r.orig_unreachable:
        keep = shell_join(["git", "-C", r.tree, "branch", f"c128patch-saved-{r.orig_head[:8]}", r.recovery_ref])
        lines.append(f"  note: HEAD was detached at {r.orig_head[:12]} with {r.orig_unreachable} commit(s) that no "
                     f"branch holds; they are kept at {r.recovery_ref} (on a branch: {keep})")
    elif r.orig_head:
        lines.append(f"  HEAD was detached at {r.orig_head[:12]} (recovery ref {r.recovery_ref})")
    say(*lines, *_found_from_here(r, series))


def _found_from_here(r: ApplyResult, series: Series) -> list[str]:
    """A tree status, rebase and refresh do not find from here (a local --repo, a --tree elsewhere): how to name it."""
    from c128patch.series.manifest import default_series_root
    from c128patch.textsafe import shell_join

    try:
        found: Path | None = locate_tree(None)
    except C128Error:
        found = None
    if found is not None and found.resolve() == Path(r.tree).resolve():
        return []
    own = series.ours.root == default_series_root().resolve()
    status = ["c128patch", "status", "--tree", r.tree, *([] if own else ["--series", str(series.ours.root)])]
    return [f"  from here, status, rebase and refresh need --tree; next: {shell_join(status)}"]
