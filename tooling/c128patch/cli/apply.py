"""c128patch apply --sglang-rev X [--repo R] [--branch B] [--tree DIR]"""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from c128patch.cli.common import emit_json, get_series, handles_errors, json_option, repo_option, series_option
from c128patch.errors import C128Error, ConflictError
from c128patch.evidence.matrix import verification_note
from c128patch.git import Git
from c128patch.ops.apply import apply_series
from c128patch.progress import console, reporter
from c128patch.upstream.source import DEFAULT_TREE, discard_fresh_tree, open_upstream, prepare_tree


@click.command("apply")
@click.option("--sglang-rev", "rev", required=True, help="Upstream revision: a release tag (v0.5.23) or, with --repo, any commit-ish.")
@repo_option
@click.option("--branch", default=None, help="Branch to create (default: c128/<rev>).")
@click.option("--tree", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Working tree to patch when upstream is a URL or the releases (default: ./sglang). With a local --repo, the repo is the tree.")
@series_option
@json_option
@handles_errors
def command(rev: str, repo: str | None, branch: str | None, tree: Path | None, series_dir: Path | None, as_json: bool) -> None:
    """Check out REV on a new branch and apply the series, one commit per entry."""
    series = get_series(series_dir)
    with reporter(not as_json, title="apply") as rep:
        upstream = open_upstream(repo, [rev], rep)
        commit = upstream.resolve(rev)
        existed = (tree or DEFAULT_TREE).exists()
        worktree, fresh = prepare_tree(upstream, tree, commit, rep)
        info = {"rev": rev, "commit": commit, "source": upstream.kind}
        if upstream.kind == "url":
            info["url"] = upstream.location
        try:
            result = apply_series(series, Git(worktree=worktree), rev, commit, branch=branch, fresh_clone=fresh,
                                  upstream_info=info, reporter=rep)
        except C128Error as exc:
            # A conflict leaves the branch for inspection (its hint says how to undo); any
            # other failure in a clone made just now leaves nothing behind.
            if fresh and not isinstance(exc, ConflictError):
                discard_fresh_tree(worktree, existed)
                exc.message += f" (the new clone {worktree} was removed)"
            raise
    note = verification_note(series, Git(worktree=worktree), commit, rev)
    if as_json:
        emit_json({"ok": True, **result.to_json(), "evidence_note": note})
        return
    out = console(stderr=False)
    if result.already_applied:
        on_top = f", {result.commits_on_top} commit(s) of yours on top" if result.commits_on_top else ""
        where = "" if result.checked_out else f"; not checked out: git -C {shlex.quote(result.tree)} checkout {result.branch}"
        out.print(f"{result.tree}: {result.branch} already holds {rev} + series {series.name} {series.version} "
                  f"(at {result.head[:12]}{on_top}): nothing to do{where}", markup=False)
        return
    for row in result.entries:
        if row.get("status") == "skipped":
            out.print(f"  skipped {row['name']} ({row['detail']})", markup=False)
            continue
        how = " (needed a 3-way merge)" if row.get("applied") == "3way" else ""
        out.print(f"  applied {row['name']}{how}", markup=False)
    out.print(f"{result.tree}: {result.branch} = {rev} + series {series.name} {series.version} "
              f"({len(result.entries)} entries), HEAD {result.head[:12]}", markup=False)
    out.print(f"  {result.equivalence['summary']}", markup=False)
    if note:
        out.print(note, markup=False)
