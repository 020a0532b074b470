"""c128patch matrix [--repo R] [--sglang-rev X ...] [--results DIR]: what is proven per release (or repo commit)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from c128patch.cli.common import Run, load_stack, verb_options
from c128patch.errors import C128Error, what_is

STYLE = {"verified": "green", "failed": "red", "stale": "yellow", "unverified": "dim"}
HEADINGS = {"compile": "compiles sm_90a", "suite": "GPU suite", "memcheck": "memcheck", "racecheck": "racecheck",
            "initcheck": "initcheck", "synccheck": "synccheck", "differential": "differential",
            "upstream-suite": "upstream's own tests", "simulation": "DSPARK simulation",
            "kernel-bench": "kernel benchmark"}
APPLY_STYLE = {"clean": "strict", "3way": "3-way", "conflict": "CONFLICT", "collision": "COLLISION"}


@click.command("matrix")
@click.option("--sglang-rev", "revs", multiple=True,
              help="Release(s) to show (default: every supported release); with --repo any revision of it.")
@click.option("--repo", default=None, metavar="PATH|URL",
              help="Evaluate these revisions of your own SGLang repository (verified where its sources are the "
                   "evidenced ones).")
@click.option("--results", "results_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Results folder (default: the series' ci/gpu/results).")
@click.option("--markdown", "as_markdown", is_flag=True, help="Print the release table as Markdown (README.md).")
@verb_options
def command(revs: tuple[str, ...], repo: str | None, results_dir: Path | None, as_markdown: bool,
            series_dir: Path | None, layer_dirs: tuple[Path, ...], as_json: bool, run: Run) -> None:
    """What the committed results prove per release: applies strict / 3-way, compiles for sm_90a, GPU
    suite, sanitizers, differential, upstream's own tests; stale or missing evidence says so."""
    from rich.table import Table

    from c128patch.evidence.matrix import markdown, matrix_for
    from c128patch.evidence.results import KINDS, results_root
    from c128patch.progress import reporter, table_console
    from c128patch.textsafe import one_line, text

    if results_dir is not None and not os.path.lexists(results_dir):  # (read as "no evidence": all unverified, exit 0)
        raise C128Error(f"--results {results_dir} does not exist")
    if results_dir is not None and not results_dir.is_dir():  # (a FIFO, a dangling link: no table)
        raise C128Error(f"--results {results_dir} is {what_is(results_dir)}, not a folder")
    series = load_stack(run, series_dir, layer_dirs)
    root = results_dir or results_root(series)
    with reporter(not (as_json or as_markdown), title="matrix") as rep:
        rows = matrix_for(series, repo, list(revs), root, rep)
    if as_json:
        return run.emit({"ok": True, "series": {"name": series.name, "version": series.version}, "repo": repo,
                          "results": str(root), "releases": [r.to_json() for r in rows]}, series)
    if as_markdown:
        return click.echo(markdown(rows), nl=False)
    out = table_console()
    # evidence kinds x releases, one state per cell (the details are in --markdown / --json); entries x releases
    evidence = Table(title="evidence per release (details: --markdown, --json)")
    entries = Table(title="entries x releases: applies (replayed now)")
    for table, first in ((evidence, "evidence"), (entries, "entry")):
        table.add_column(first, overflow="fold")
        for row in rows:
            table.add_column(text(row.rev), overflow="fold" if table is evidence else "ellipsis")  # not markup
    evidence.add_row("applies", *[text(row.applies_summary) for row in rows])  # a refusal quotes upstream: data
    for kind in KINDS:
        states = [row.cells[kind].state for row in rows]
        evidence.add_row(HEADINGS[kind], *[f"[{STYLE[s]}]{s}[/{STYLE[s]}]" for s in states])
    for name in dict.fromkeys(n for row in rows for n in row.applies):
        entries.add_row(name, *[APPLY_STYLE.get(row.applies.get(name, ""), row.applies.get(name, "-"))
                                for row in rows])
    out.print(evidence)
    out.print(entries)
    for row in rows:
        missing = row.missing()
        out.print(one_line(f"{row.rev}: " + ("fully verified" if not missing else "not fully verified: "
                                             + ", ".join(missing))), markup=False)
