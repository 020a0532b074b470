"""``apply``'s workflows for the CLI and scripts: ``apply_rev``, ``continue_apply``. The steps, the journal, the
proof, ``--abort`` (``Apply.abort``) and an apply in a tree the caller has (``Apply.start``): ``ops.applier``."""

from __future__ import annotations

import shutil
from pathlib import Path

from c128patch import procs
from c128patch.errors import C128Error, ConflictError, Interrupted
from c128patch.git import Git, is_work_tree, refuse_git_dir
from c128patch.ops.applier import (
    RESUME_NOTE,
    Apply,
    ApplyJournal,
    ApplyResult,
    already_applied,
    interrupts_said,
    users_commits,
)
from c128patch.ops.check import support_note
from c128patch.progress import NullReporter, Reporter
from c128patch.series.layers import describe, layer_args
from c128patch.series.manifest import Series, default_series_root
from c128patch.series.plan import check_paths_at, plan
from c128patch.series.provenance import PROVENANCE_PATH, committed, starts_stack
from c128patch.textsafe import shell_join
from c128patch.upstream import DEFAULT_TREE
from c128patch.upstream.source import (
    Target,
    damage_note,
    damaged_source,
    discard_fresh_tree,
    open_upstream,
    prepare_tree,
)


def apply_rev(series: Series, repo: str | None, rev: str, *, tree: Path | None = None, branch: str | None = None,
              reporter: Reporter = NullReporter()) -> tuple[ApplyResult, str]:
    """``series`` applied to ``rev`` of ``repo`` (None: the releases) in ``tree`` (None: a local ``repo``, else
    ./sglang); a fresh clone is removed on a failure but a conflict. Returns the result and ``support_note``."""
    if tree is not None:
        refuse_git_dir(tree)
    upstream = open_upstream(repo, [rev], reporter)
    target = Target.of(upstream, rev)
    reporter.step(f"planning the series on {rev}")
    older = support_note(series, upstream.git, rev, target.commit)
    planned = plan(series, upstream.git, target.commit)
    check_paths_at(upstream.git, target.commit, planned)
    if tree is None and upstream.kind != "path":
        refuse_switching(DEFAULT_TREE, target, branch or target.branch, series, repo)
    existed = (tree or DEFAULT_TREE).exists()
    template = Path(procs.scratch_dir("c128patch-template-"))  # for git clone --template: the journal, first
    source = str(upstream.git.git_dir or upstream.git.worktree)
    ApplyJournal.new(series, target, branch or target.branch, planned, fresh_clone=True, tree_existed=existed,
                     source=source, cloning=procs.owner_tag()).save(template / "c128patch" / "apply.json")
    reporter.step(f"preparing the tree for {target.commit[:12]}")
    dest = tree or DEFAULT_TREE
    cloning = upstream.kind != "path" and (not existed or dest.is_dir() and not any(dest.iterdir()))
    try:
        worktree, fresh = prepare_tree(upstream, tree, target.commit, reporter, template=template, refused=True)
    except KeyboardInterrupt:  # git killed mid-clone leaves a half clone holding the journal: nothing of it stays
        if cloning:
            discard_fresh_tree(dest, existed)
        raise
    finally:
        shutil.rmtree(template, ignore_errors=True)
    if not fresh:
        refuse_taken_branch(series, Git(worktree=worktree), branch or target.branch, target)
    try:
        with interrupts_said(worktree.resolve()):
            result = Apply(Git(worktree=worktree), series, reporter).start(target, branch=branch, fresh_clone=fresh,
                                                                          planned=planned)
    except Interrupted:
        raise
    except ConflictError as exc:  # the branch stays for inspection; the note says why it stops, first
        if fresh and (damaged := damaged_source(upstream, source)):  # (a clone shares the source's pack index)
            removed = discard_fresh_tree(worktree, existed)
            raise C128Error(damaged + ("" if removed else f" (the new clone {worktree} could not be removed: remove "
                                                         "it by hand)")) from None
        if older:
            exc.hint = "\n".join([f"note: {older}", *([exc.hint] if exc.hint else [])])
        raise
    except C128Error as exc:
        if fresh:  # any other failure in a clone made just now leaves nothing behind (nothing to resume)
            exc.message = exc.message.replace(RESUME_NOTE, "")
            exc.message += f" (the new clone {worktree} was removed)" if discard_fresh_tree(worktree, existed) else \
                f" (the new clone {worktree} could not be removed: remove it by hand)"
            exc.hint = None  # nothing is left to resume or undo
            exc.message += damage_note(upstream, source, exc.message)
        raise
    return result, older




def continue_apply(git: Git, series: Series | None = None,
                   reporter: Reporter = NullReporter()) -> tuple[ApplyResult, Series]:
    """Finish the apply that stopped in the tree of ``git``; ``series``: None for the one its journal names."""
    op = Apply(git, series, reporter)
    result = op.resume()  # (``Apply._run`` keeps its layers, before the proof: proven, unproven or cut short)
    assert op.series is not None
    return result, op.series


def refuse_taken_branch(series: Series, git: Git, branch: str, target: Target) -> None:
    """Refuse a ``branch`` holding another apply with the user's commits on it: say how to apply beside it."""
    tip = git.rev_parse(f"refs/heads/{branch}")
    prov = git.out("log", "-1", "--format=%H", tip, "--", PROVENANCE_PATH) if tip else ""
    record = committed(git, prov) if prov and tip else None
    mine = users_commits(git, prov, tip or "", record) if record is not None else 0
    if record is None or already_applied(series, git, branch, target) is not None:
        return
    ours = record.get("series", {})
    held = " + ".join([f"series {ours.get('name')} {ours.get('version')}",
                       *(f"layer {r['name']} {r['version']}" for r in record.get("layers", []))])
    if not mine and ours.get("name") == series.ours.name and starts_stack(record, series):  # an earlier version
        # of this stack: as status
        rebase = shell_join(["c128patch", "rebase", "--onto", target.rev, "--tree", str(Path(git.cwd).resolve()),
                             *layer_args(series),
                             *([] if series.ours.root == default_series_root().resolve() else
                               ["--series", str(series.ours.root)])])  # advice, as a rebase would keep it (helper 101)
        raise C128Error(f"branch {branch} in {git.cwd} holds {held} on {record.get('upstream', {}).get('rev')}, not "
                        f"{describe(series)} on {target.rev}: take it there with {rebase}; or pass --branch NAME; "
                        "nothing was changed")
    if not mine:
        return
    beside = shell_join(["c128patch", "apply", "--sglang-rev", target.rev, "--tree", str(git.cwd), "--branch",
                         f"{branch}-{series.layers[-1].name if series.layers else 'new'}", *layer_args(series),
                         *([] if series.ours.root == default_series_root().resolve() else
                           ["--series", str(series.ours.root)])])
    raise C128Error(f"branch {branch} in {git.cwd} holds {held} on {record.get('upstream', {}).get('rev')} with "
                    f"{mine} commit(s) of yours on top, not {describe(series)} on {target.rev}; nothing was changed",
                    hint=f"  keep it and apply beside it: {beside}\n"
                         f"  or move your commits into a layer: c128patch layer add-entry --tree {git.cwd} ... "
                         "(docs/layers.md)")


def refuse_switching(tree: Path, target: Target, branch: str, series: Series, repo: str | None = None) -> None:
    """Refuse to switch the default tree holding another upstream commit unasked (``--tree`` asks); the commands it
    prints name the same stack and upstream."""
    if not tree.is_dir() or not is_work_tree(tree):
        return
    git = Git(worktree=tree)
    head = git.rev_parse("HEAD")
    record = committed(git, "HEAD") if head else None
    upstream = (record or {}).get("upstream", {"commit": head, "rev": (head or "")[:12]})
    if head is None or upstream.get("commit") == target.commit:
        return
    on, rev = git.current_branch() or "", target.rev
    held = f"{upstream.get('rev')}" + (f" + series (branch {on})" if record and on else f" (branch {on})" if on else "")
    same = [*(["--repo", repo] if repo else []), *layer_args(series),
            *([] if series.ours.root == default_series_root().resolve() else ["--series", str(series.ours.root)])]
    switch = shell_join(["c128patch", "apply", "--sglang-rev", rev, "--tree", str(tree), *same])
    beside = shell_join(["c128patch", "apply", "--sglang-rev", rev, "--tree", f"{tree}-{rev}", *same])
    raise C128Error(f"./{tree} holds {held}: applying {rev} there would switch it to a new branch {branch}; "
                    "say which you want",
                    hint=f"  switch ./{tree} (its branch stays): {switch}\n  a second tree beside it: {beside}")
