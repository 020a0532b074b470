"""c128patch refresh [--tree DIR] [--check] [--primary|--variant] [--version V] [--json]"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from c128patch import exitcodes
from c128patch.cli.common import emit_json, handles_errors, json_option, locate_tree, series_option, tree_option


@click.command("refresh")
@tree_option
@click.option("--check", "check_only", is_flag=True, help="Change nothing; exit 1 if refreshing would change any file.")
@click.option("--primary/--variant", default=None,
              help="Make the branch's patches the primary files (series base moves to the tree's base), or the "
                   "variants for the tree's base. Default: primary when the tree's base is the series base.")
@click.option("--version", "version", default=None,
              help="Series version to record (default: bumped when anything changed).")
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
    from c128patch.ops.refresh import refresh
    from c128patch.progress import console
    from c128patch.series.layers import describe, get_series

    series = get_series(series_dir, layer_dirs)
    done = refresh(series, Git(worktree=locate_tree(tree)), check=check_only, primary=primary, version=version,
                   accept_differences=accept_differences, lock_items=lock_items)
    if as_json:
        emit_json(done.to_json())
    else:
        out = console(stderr=False)
        out.print(f"tree: {done.result.equivalence.summary()}", markup=False)  # type: ignore[union-attr]
        for note in done.result.notes:
            out.print(f"note: {note}", markup=False)
        verb = "would change" if check_only else "changed"
        for path in done.changes:
            out.print(f"  {verb} {path}", markup=False)
        out.print(f"{describe(done.result.series)} on {done.result.series.base}: "  # type: ignore[union-attr,arg-type]
                  f"{len(done.changes)} file(s) {verb}" if done.changes else "series is up to date with the branch",
                  markup=False)
    if done.failed:
        sys.exit(exitcodes.FAILED)
