"""c128patch bisect --onto REV [--repo PATH|URL] [--timeout S] [--behaviour [--python PY]] [--json]"""

from __future__ import annotations

from pathlib import Path

import click

from c128patch.cli.common import Run, Seconds, load_stack, repo_option, say, verb_options


@click.command("bisect")
@click.option("--onto", required=True, help="The upstream revision the series does not fit.")
@repo_option
@click.option("--timeout", type=Seconds(), default=600.0, show_default=True,
              help="Give up after this many seconds.")
@click.option("--behaviour", is_flag=True, help="Each step also runs the behavioural tier (c128patch treecheck): "
              "finds a commit that breaks a module's import or behaviour the contract does not see.")
@click.option("--python", "python", default=None, help="The interpreter the behavioural tier imports with.")
@verb_options
def command(onto: str, repo: str | None, timeout: float, behaviour: bool, python: str | None, series_dir: Path | None,
            layer_dirs: tuple[Path, ...], as_json: bool, run: Run) -> None:
    """Find the first upstream commit between the series' base and REV at which the series stops
    applying or fitting by the checks watch judges by: its API contract, the nvcc signature probe (where nvcc is),
    copies upstream made of what it patches (with --behaviour, also its behavioural tier); git bisect in a scratch
    clone. Print it, its subject and what fails there."""
    from c128patch.fit.bisect import bisect
    from c128patch.fit.sandbox import isolation
    from c128patch.progress import echo, reporter
    from c128patch.series.plan import validate_files

    series = load_stack(run, series_dir, layer_dirs, repo=repo)
    validate_files(series)
    if behaviour:  # as watch and treecheck say it: what the box cuts off here, or why it cannot
        echo("bisect --behaviour runs the target tree's code at each step, in the sealed box (leave out --behaviour "
             f"to run none): {isolation()}")
    with reporter(not as_json, title="bisect") as rep:
        report = bisect(series, repo, onto, timeout=timeout, behaviour=behaviour, python=python, reporter=rep)
    if as_json:
        return run.emit(report, series)
    from c128patch.textsafe import one_line

    found = [f"first bad commit: {report['commit']} {report['subject']}", *(f"  {f}" for f in report["failing"])]
    say(*map(one_line, [*(found if report["found"] else []), report["summary"]]))  # upstream's file names: data
