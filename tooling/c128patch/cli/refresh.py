"""c128patch refresh [--tree DIR] [--check] [--primary|--variant] [--version V] [--json]"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from c128patch.cli.common import (
    Run,
    exit_unless,
    load_stack,
    locate_tree,
    primary_or_variant,
    say,
    tree_option,
    verb_options,
)


@click.command("refresh")
@tree_option
@click.option("--check", "check_only", is_flag=True, help="Change nothing; exit 1 if refreshing would change any file.")
@click.option("--primary", "as_primary", is_flag=True,
              help="Make the branch's patches the primary files (series base moves to the tree's base). Default "
                   "(neither this nor --variant): primary when the tree's base is the series base.")
@click.option("--variant", "as_variant", is_flag=True,
              help="Make the branch's patches the variants for the tree's base.")
@click.option("--version", "version", default=None,
              help="Series version to record (default: bumped when anything changed).")
@click.option("--accept-differences", is_flag=True,
              help="Export even when the tree differs from the series in ways no edit on the branch explains.")
@verb_options
def command(tree: Path | None, check_only: bool, as_primary: bool, as_variant: bool, version: str | None,
            accept_differences: bool, series_dir: Path | None,
            layer_dirs: tuple[Path, ...], as_json: bool, run: Run) -> None:
    """Export the patched branch back into patches/ and the manifest."""
    primary = primary_or_variant(as_primary, as_variant, "primary when the tree's base is the series base")
    from c128patch.fit.contract import lock_items
    from c128patch.git import Git
    from c128patch.ops.refresh import refresh

    root = locate_tree(tree)  # ./sglang from the folder above it: that tree's layers, as rebase takes them
    series = load_stack(run, series_dir, layer_dirs, root)
    done = refresh(series, Git(worktree=root), check=check_only, primary=primary, version=version,
                   accept_differences=accept_differences, lock_items=lock_items)
    try:  # past the write a signal is no "no outcome" (it said so over a series just written, helper 164)
        _say(done, check_only, as_json, run, series)
    except KeyboardInterrupt as stop:
        if check_only or not done.changes:
            raise
        from c128patch.errors import Interrupted

        raise Interrupted.by(stop, f"the refresh was written before it stopped: {len(done.changes)} file(s) changed "
                                   f"in {done.result.series.root}") from None  # type: ignore[union-attr]
    exit_unless(not done.failed)


def _say(done: Any, check_only: bool, as_json: bool, run: Run, series: Any) -> None:
    """What ``done`` did, as JSON or lines."""
    from c128patch.ops.refresh import lint_command
    from c128patch.series.layers import describe
    from c128patch.textsafe import one_line

    if os.environ.get("C128PATCH_FAULT"):  # (the fault-injection tests: a signal past the write)
        from c128patch.ops.treestate import fault_point

        fault_point("at", "refresh-written")
    new, verb = done.result.series, "would change" if check_only else "changed"
    if as_json:
        run.emit(done.to_json(), series)
    else:
        say(one_line(f"tree: {done.result.equivalence.summary()}"),  # type: ignore[union-attr]  # the tree's rev
            *(f"note: {note}" for note in done.result.notes), *(f"  {verb} {path}" for path in done.changes),
            f"{describe(new)} (base {new.base}), from a tree on {done.result.tree_base} as "  # type: ignore[union-attr]
            f"{'the primary files' if done.result.primary else 'its variants'}: {len(done.changes)} file(s) {verb}"
            if done.changes else "series is up to date with the branch",
            *(f"  lint error: {finding}" for finding in done.result.lint_errors),
            *([f"  written, but lint fails on it: fix the series, then: {lint_command(new)}"]  # type: ignore[arg-type]
              if done.result.lint_errors else []))
