"""c128patch treecheck [--tree DIR | --sglang-rev X] [--repo R] [--python PY] [--no-run] [--json]"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from c128patch import exitcodes
from c128patch.cli.common import (
    Run,
    Seconds,
    applied_tree_here,
    load_stack,
    locate_tree,
    repo_option,
    say,
    verb_options,
)
from c128patch.errors import C128Error


@click.command("treecheck")
@click.option("--tree", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="A tree c128patch applied the series in (its files on disk); default, without --sglang-rev: "
                   "the one here (else ./sglang).")
@click.option("--sglang-rev", "rev", default=None, help="An upstream revision: the series is replayed there and "
              "the result unpacked into a temporary folder.")
@repo_option
@click.option("--python", "python", default=None, help="The interpreter to import with, a path from the current "
              "folder or a name on PATH, never one inside the tree (default: an environment built from the target's "
              "own requirements, cached).")
@click.option("--timeout", type=Seconds(), default=600.0, show_default=True, help="Give the target's code this "
              "many seconds, gates off and on at once (past it: unchecked, exit 8).")
@click.option("--no-run", "no_run", is_flag=True, help="Run none of the tree's code: only resolve its imports "
              "(then unchecked, exit 8).")
@verb_options
def command(tree: Path | None, rev: str | None, repo: str | None, python: str | None, timeout: float, no_run: bool,
            series_dir: Path | None, layer_dirs: tuple[Path, ...], as_json: bool, run: Run) -> None:
    """Import every module the series adds or changes on a patched tree, gates off and on, in a sealed box and
    the target's own environment (or --python): each imported, imported with stand-ins, failed, or not checked,
    and resolve each one's sglang imports against the tree's files (a missing module or name fails); then run the
    series' DSPARK scenarios through the tree's own classes (startup rules, static and compact verify -> accept ->
    commit, decode against float64): each passed, failed (naming the scenario, our module and the upstream
    definition) or not run (a module it needs did not import). Exit 0 only when every module imported and every
    scenario passed, gates off and on; 1 when one fails (or the target's code floods its output past the box's
    limit); 8 (unchecked) when any could not be imported or run here (a package missing, no torch, --no-run,
    past --timeout)."""
    from c128patch.fit import contract, treecheck
    from c128patch.fit.env import describe
    from c128patch.fit.sandbox import NOTICE, interpreter
    from c128patch.git import Git
    from c128patch.progress import echo, reporter
    from c128patch.series.plan import validate_files
    from c128patch.upstream.source import open_upstream

    if rev is None and tree is None:
        tree = applied_tree_here("treecheck")
    series = load_stack(run, series_dir, layer_dirs, tree, repo)
    validate_files(series)
    if (rev is None) == (tree is None):
        raise C128Error("pass --tree DIR (default: the patched tree here) or --sglang-rev X (one of them)")
    python = interpreter(python, tree) if python else None
    if not no_run:
        echo(f"treecheck {NOTICE}")
    with reporter(not as_json, title="treecheck") as rep:
        if tree is not None:
            git = Git(worktree=locate_tree(tree))
            result = treecheck.run(series, git.worktree, git.changed_files(contract.tree_base(git), "HEAD"),
                                   python=python, timeout=timeout, run_code=not no_run, reporter=rep)
        else:
            upstream = open_upstream(repo, [rev], rep)
            result = treecheck.run_rev(series, upstream.git, rev, upstream.resolve(rev), python=python,
                                       timeout=timeout, run_code=not no_run, reporter=rep)
    payload = result.to_json()
    if as_json:
        run.emit(payload, series)
    else:
        say(*([describe(result.env)] if result.env else []),
            *(f"  {name}: {said}" for name, said in result.modules().items()),
            *(f"  failed: {f}" for f in result.failed), *(f"  {n}" for n in result.not_checked()),
            f"treecheck: {result.verdict()}")
    if not payload["ok"]:
        sys.exit(exitcodes.FAILED if result.failed else exitcodes.UNCHECKED)
