"""c128patch matrix [--repo PATH|URL] [--sglang-rev X ...] [--results DIR] [--json]: what is proven per release
(or per commit of the user's own repository: the evidence is keyed by content)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from c128patch.cli.common import emit_json, handles_errors, json_option, series_option

if TYPE_CHECKING:
    from rich.table import Table

    from c128patch.evidence.matrix import ReleaseRow

STYLE = {"verified": "green", "failed": "red", "stale": "yellow", "unverified": "dim"}
HEADINGS = {"compile": "compiles sm_90a", "suite": "GPU suite", "memcheck": "memcheck", "racecheck": "racecheck",
            "initcheck": "initcheck", "synccheck": "synccheck", "differential": "differential",
            "upstream-suite": "upstream's own tests", "simulation": "DSPARK simulation",
            "kernel-bench": "kernel benchmark"}
APPLY_STYLE = {"clean": "strict", "3way": "3-way", "conflict": "CONFLICT", "collision": "COLLISION"}


def _cell(state: str, detail: str) -> str:
    text = f"{state}: {detail}" if detail else state
    return f"[{STYLE[state]}]{text}[/{STYLE[state]}]"


def release_table(rows: list[ReleaseRow]) -> Table:
    from rich.table import Table

    from c128patch.evidence.results import KINDS

    table = Table(title="evidence per release (committed results, keyed by upstream sources / series hash)")
    table.add_column("release")
    table.add_column("key (sources/series)")
    table.add_column("applies")
    for kind in KINDS:
        table.add_column(HEADINGS[kind], overflow="fold")
    for row in rows:
        table.add_row(row.rev, row.key.short() if row.key else "-", row.applies_summary,
                      *[_cell(row.cells[k].state, row.cells[k].detail) for k in KINDS])
    return table


def entry_table(rows: list[ReleaseRow]) -> Table:
    from rich.table import Table

    table = Table(title="entries x releases: applies (replayed now)")
    table.add_column("entry")
    for row in rows:
        table.add_column(row.rev)
    names = list(dict.fromkeys(n for row in rows for n in row.applies))
    for name in names:
        table.add_row(name, *[APPLY_STYLE.get(row.applies.get(name, ""), row.applies.get(name, "-")) for row in rows])
    return table


@click.command("matrix")
@click.option("--sglang-rev", "revs", multiple=True,
              help="Release(s) to show (default: every supported release); with --repo any revision of it.")
@click.option("--repo", default=None, metavar="PATH|URL",
              help="Evaluate these revisions of your own SGLang repository (verified where its sources are the "
                   "evidenced ones).")
@click.option("--results", "results_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Results folder (default: the series' ci/gpu/results).")
@click.option("--markdown", "as_markdown", is_flag=True, help="Print the release table as Markdown (README.md).")
@series_option
@json_option
@handles_errors
def command(revs: tuple[str, ...], repo: str | None, results_dir: Path | None, as_markdown: bool,
            series_dir: Path | None, layer_dirs: tuple[Path, ...], as_json: bool) -> None:
    """Releases x {applies strict / 3-way, compiles for sm_90a, GPU suite, memcheck, racecheck,
    differential}, read from the committed results; stale or missing evidence says so."""
    from rich.console import Console

    from c128patch.evidence.matrix import markdown, matrix_for
    from c128patch.evidence.results import results_root
    from c128patch.progress import console, reporter
    from c128patch.series.layers import get_series

    series = get_series(series_dir, layer_dirs)
    root = results_dir or results_root(series)
    with reporter(not (as_json or as_markdown), title="matrix") as rep:
        rows = matrix_for(series, repo, list(revs), root, rep)
    if as_json:
        emit_json({"ok": True, "series": {"name": series.name, "version": series.version}, "repo": repo,
                   "results": str(root), "releases": [r.to_json() for r in rows]})
        return
    if as_markdown:
        click.echo(markdown(rows), nl=False)
        return
    out = Console(width=220, highlight=False, soft_wrap=False) if sys.stdout.isatty() else console(stderr=False)
    out.print(release_table(rows))
    out.print(entry_table(rows))
    for row in rows:
        missing = row.missing()
        out.print(f"{row.rev}: " + ("fully verified" if not missing else "not fully verified: " + ", ".join(missing)),
                  markup=False)
