"""c128patch refresh [--tree DIR] [--check] [--primary|--variant] [--version V] [--json]"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from c128patch import exitcodes
from c128patch.cli.common import (
    emit_json,
    handles_errors,
    json_option,
    locate_tree,
    series_option,
    tree_option,
)


@click.command("refresh")
@tree_option
@click.option("--check", "check_only", is_flag=True, help="Change nothing; exit 1 if refreshing would change any file.")
@click.option("--primary/--variant", default=None,
              help="Make the branch's patches the primary files (series base moves to the tree's base), or the "
                   "variants for the tree's base. Default: primary when the tree's base is the series base.")
@click.option("--version", "version", default=None, help="Series version to record (default: bumped when anything changed).")
@click.option("--accept-differences", is_flag=True,
              help="Export even when the tree differs from the series in ways no edit on the branch explains.")
@series_option
@json_option
@handles_errors
def command(tree: Path | None, check_only: bool, primary: bool | None, version: str | None, accept_differences: bool,
            series_dir: Path | None, layer_dirs: tuple[Path, ...], as_json: bool) -> None:
    """Export the patched branch back into patches/ and the manifest."""
    from c128patch.fit.contract import lock_items
    from c128patch.git import Git
    from c128patch.ops import refresh as core
    from c128patch.ops.treestate import ensure_clean, ensure_idle, repo_lock
    from c128patch.progress import console
    from c128patch.series.layers import describe, get_series, layer_rows
    from c128patch.series.provenance import read_provenance

    series = get_series(series_dir, layer_dirs)
    git = Git(worktree=locate_tree(tree))
    with repo_lock(git, "refresh"):
        ensure_idle(git, "refresh")
        read_provenance(git.worktree)  # a damaged record is said as such (with the way back) before anything else
        ensure_clean(git, "refresh --check" if check_only else "refresh")  # uncommitted edits are not the branch
        result = core.export(series, git, primary=primary, version=version, lock_items=lock_items)
        changes = result.changes(series.root)
        proof = result.equivalence
        if not check_only:
            changes = core.write(series, result, accept_differences=accept_differences)
    unproven = check_only and not proof.ok
    payload = {"ok": not (check_only and changes) and not unproven, "check": check_only, "changed": changes,
               "notes": result.notes, "equivalence": proof.to_json(), "tree": proof.summary(),
               "series": {"name": result.series.name, "version": result.series.version, "base": result.series.base},
               "layers": layer_rows(result.series)}
    if as_json:
        emit_json(payload)
    else:
        out = console(stderr=False)
        out.print(f"tree: {proof.summary()}", markup=False)
        for note in result.notes:
            out.print(f"note: {note}", markup=False)
        verb = "would change" if check_only else "changed"
        for path in changes:
            out.print(f"  {verb} {path}", markup=False)
        out.print(f"{describe(result.series)} on {result.series.base}: "
                  f"{len(changes)} file(s) {verb}" if changes else "series is up to date with the branch", markup=False)
    if check_only and (changes or unproven):
        sys.exit(exitcodes.FAILED)
