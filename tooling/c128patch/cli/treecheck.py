"""c128patch treecheck [--tree DIR | --sglang-rev X] [--repo R] [--python PY] [--json]"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from c128patch import exitcodes
from c128patch.cli.common import emit_json, handles_errors, json_option, repo_option, series_option
from c128patch.errors import C128Error


@click.command("treecheck")
@click.option("--tree", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="A tree c128patch applied the series in (its files on disk).")
@click.option("--sglang-rev", "rev", default=None, help="An upstream revision: the series is replayed there and "
              "the result unpacked into a temporary folder.")
@repo_option
@click.option("--python", "python", default=None, help="The interpreter to import with (default: this one).")
@series_option
@json_option
@handles_errors
def command(tree: Path | None, rev: str | None, repo: str | None, python: str | None, series_dir: Path | None,
            layer_dirs: tuple[Path, ...], as_json: bool) -> None:
    """Import every module the series adds or changes on a patched tree, with the gates off and on, in a
    subprocess: each ok, failed, or not checked (a package the interpreter lacks; no torch: nothing), and
    resolve each one's sglang imports against the tree's files (a missing module or name fails).
    Exit 1 when a module fails, or when nothing could be checked."""
    from c128patch.fit import contract, treecheck
    from c128patch.git import Git, toplevel
    from c128patch.progress import console
    from c128patch.series.layers import get_series
    from c128patch.series.plan import validate_files
    from c128patch.upstream.source import open_upstream

    series = get_series(series_dir, layer_dirs)
    validate_files(series)
    if (rev is None) == (tree is None):
        raise C128Error("pass --tree DIR or --sglang-rev X (one of them)")
    if tree is not None:
        git = Git(worktree=toplevel(tree))
        result = treecheck.run(series, git.worktree, git.changed_files(contract.tree_base(git), "HEAD"),
                               python=python)
    else:
        upstream = open_upstream(repo, [rev], None)
        result = treecheck.run_rev(series, upstream.git, rev, upstream.resolve(rev), python=python)
    payload = result.to_json()
    if as_json:
        emit_json(payload)
    else:
        out = console(stderr=False)
        for line in result.failed:
            out.print(f"  failed: {line}", markup=False)
        for line in result.not_checked():
            out.print(f"  {line}", markup=False)
        out.print(f"treecheck: {result.verdict()}", markup=False)
    if not payload["ok"]:
        sys.exit(exitcodes.FAILED)
