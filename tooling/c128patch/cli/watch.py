"""c128patch watch --onto REV [--repo R] [--out DIR] [--timeout S] [--primary|--variant] [--python PY] [--no-run]"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from c128patch import exitcodes
from c128patch.cli.common import (
    Run,
    Seconds,
    check_output_dir,
    load_stack,
    primary_or_variant,
    repo_option,
    verb_options,
)

EXIT_HELP = ", ".join(f"{name} {code}" for name, code in exitcodes.WATCH.items())


@click.command("watch", epilog=f"Exit codes: {EXIT_HELP}; bad input {exitcodes.USAGE}.")
@click.option("--onto", required=True,
              help="Upstream revision to carry the series onto (a branch such as main, a tag, a commit).")
@repo_option
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("c128patch-watch"),
              help="Where the report (and a refreshed series) go: a new or empty folder, or an earlier watch's "
                   "(default: ./c128patch-watch).")
@click.option("--timeout", type=Seconds(), default=1800.0, show_default=True,
              help="Give up after this many seconds (exit 124, the report says where it was).")
@click.option("--primary", "as_primary", is_flag=True,
              help="A refreshed series takes REV's files as its primary files (base moves to REV). Default (neither "
                   "this nor --variant): primary when REV is a release tag ahead of the series base.")
@click.option("--variant", "as_variant", is_flag=True, help="A refreshed series takes REV's files as variants for REV.")
@click.option("--python", "python", default=None, help="The interpreter the behavioural tier imports the carried "
              "tree with, a path from the current folder or a name on PATH (one with torch and sglang's "
              "dependencies checks the most; default: this one).")
@click.option("--no-run", "no_run", is_flag=True, help="Run none of the target's code: the behavioural tier is "
              "skipped (then unchecked at best).")
@verb_options
def command(onto: str, repo: str | None, out: Path, timeout: float, as_primary: bool, as_variant: bool,
            python: str | None, no_run: bool, series_dir: Path | None, layer_dirs: tuple[Path, ...],
            as_json: bool, run: Run) -> None:
    """Carry the series onto REV in a scratch clone (never your tree), prove and check the result, and
    say which of clean / refreshed / merged / conflict / failed / broken / unchecked it is, with a report under
    --out."""
    from rich.markdown import Markdown

    from c128patch.fit import watch as core
    from c128patch.fit.watch_report import render
    from c128patch.progress import console, is_terminal, reporter
    from c128patch.series.plan import validate_files
    from c128patch.textsafe import plain

    primary = primary_or_variant(as_primary, as_variant, "primary when REV is a release tag ahead of the series base")
    series = load_stack(run, series_dir, layer_dirs, repo=repo)
    validate_files(series)
    check_output_dir(out, "--out")
    with reporter(not as_json, title="watch") as rep:
        report = core.watch(series, repo, onto, out, timeout=timeout, primary=primary, python=python,
                            run_code=not no_run, reporter=rep)
    if as_json:
        run.emit(report, series)
    else:  # the Markdown report, as a terminal shows it; off one (a log, a pipe) as written: rich would pad each
        # paragraph to the console's width, a million columns there (progress.console)
        body = plain(render(report))
        if is_terminal(sys.stdout):
            console(stderr=False).print(Markdown(body))
        else:
            click.echo(body.rstrip("\n") + "\n")
        click.echo(f"report: {Path(report['out']) / 'watch-report.md'} (exit {report['exit_code']})")
    sys.exit(report["exit_code"])
