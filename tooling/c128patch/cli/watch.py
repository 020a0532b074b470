"""c128patch watch --onto REV [--repo PATH|URL] [--out DIR] [--timeout S] [--primary|--variant] [--python PY]
[--json]"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from c128patch import exitcodes
from c128patch.cli.common import emit_json, handles_errors, json_option, repo_option, series_option

EXIT_HELP = ", ".join(f"{name} {code}" for name, code in exitcodes.WATCH.items())


@click.command("watch", epilog=f"Exit codes: {EXIT_HELP}; bad input {exitcodes.USAGE}.")
@click.option("--onto", required=True,
              help="Upstream revision to carry the series onto (a branch such as main, a tag, a commit).")
@repo_option
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("c128patch-watch"),
              help="Where the report (and a refreshed series) go: a new or empty folder, or an earlier watch's "
                   "(default: ./c128patch-watch).")
@click.option("--timeout", type=click.FloatRange(min=1), default=1800.0, show_default=True,
              help="Give up after this many seconds (exit 124, the report says where it was).")
@click.option("--primary/--variant", default=None,
              help="A refreshed series takes REV's files as its primary files (base moves to REV) or as variants "
                   "for REV. Default: primary when REV is a release tag ahead of the series base.")
@click.option("--python", "python", default=None, help="The interpreter the behavioural tier imports the carried "
              "tree with (one with torch and sglang's dependencies checks the most; default: this one).")
@series_option
@json_option
@handles_errors
def command(onto: str, repo: str | None, out: Path, timeout: float, primary: bool | None, python: str | None,
            series_dir: Path | None, layer_dirs: tuple[Path, ...], as_json: bool) -> None:
    """Carry the series onto REV in a scratch clone (never your tree), prove and check the result, and
    say which of clean / refreshed / merged / conflict / failed / broken / unchecked it is, with a report under
    --out."""
    from rich.table import Table

    from c128patch.fit import watch as core
    from c128patch.progress import console, reporter
    from c128patch.series.layers import get_series
    from c128patch.series.plan import validate_files

    series = get_series(series_dir, layer_dirs)
    validate_files(series)
    with reporter(not as_json, title="watch") as rep:
        report = core.watch(series, repo, onto, out, timeout=timeout, primary=primary, python=python, reporter=rep)
    if as_json:
        emit_json(report)
        sys.exit(report["exit_code"])
    text = console(stderr=False)
    if report["entries"]:
        table = Table(title=f"series {series.name} {series.version}: {series.base} -> {onto}")
        for col in ("entry", "on the new base", "file (chosen by)", "detail"):
            table.add_column(col)
        for e in report["entries"]:
            chosen = e["chosen_by"].split(":", 1)[0]
            table.add_row(e["name"], e["on_rev"], f"{e['file']} ({chosen})" if chosen else e["file"], e["detail"])
        text.print(table)
    for c in report["checks"]:
        state = "not run" if c.get("skipped") else "ok" if c["ok"] else "FAILED"
        text.print(f"  check {c['name']}: {state}" + "".join(f"\n    {f}" for f in c["findings"][:5]), markup=False)
    if report.get("contract"):
        text.print(f"  contract: {report['contract']['verdict']}; C++: {report['contract'].get('cxx_probe', '')}"
                   + "".join(f"\n    {f}" for f in report["contract"]["failing"]), markup=False)
    if report.get("behaviour"):
        tier = report["behaviour"]
        text.print(f"  behavioural tier: {tier['verdict']}" + "".join(f"\n    failed: {f}" for f in tier["failed"])
                   + "".join(f"\n    {n}" for n in tier["not_checked"]), markup=False)
    for u in report.get("unchecked", []):
        text.print(f"  not checked here: {u}", markup=False)
    for p in report["problems"]:
        text.print(f"  problem: {p}", markup=False)
    text.print(f"{report['outcome']}: {report['headline']}", markup=False)
    for line in report["next"]:
        text.print(f"  {line}", markup=False)
    text.print(f"report: {Path(report['out']) / 'watch-report.md'} (exit {report['exit_code']})", markup=False)
    sys.exit(report["exit_code"])
