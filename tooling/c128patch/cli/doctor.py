"""c128patch doctor [--python PATH] [--json] [-- <launch args>]"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from c128patch.cli.common import Run, exit_unless, load_stack, verb_options
from c128patch.errors import C128Error

_STYLE = {"ok": "green", "info": "dim", "warn": "yellow", "error": "red"}


@click.command("doctor")  # launch arguments go after `--`: an unknown option before it is named as doctor's
@click.option("--python", "python", default=sys.executable, show_default="this Python",
              help="The Python that will serve (a venv's bin/python).")
@click.argument("launch_args", nargs=-1, type=click.UNPROCESSED)
@verb_options
def command(python: str, series_dir: Path | None, layer_dirs: tuple[Path, ...], as_json: bool, run: Run,
            launch_args: tuple[str, ...]) -> None:
    """Will the installed sglang do what the envs ask? Run it where the server will run.

    \b
    Which sglang is installed and from where; whether it is a c128patch build and intact
    (version label, provenance, SBOM, RECORD); the entries it carries and their gates; the
    series' env vars as this sglang reads them; what its startup would refuse for the launch
    arguments after `--` (e.g. c128patch doctor -- --speculative-algorithm DSPARK --tp 8);
    nvcc, apache-tvm-ffi and the GPU. The verdict comes first. Exit 1 when something would not do
    what the envs ask.
    """
    from c128patch.progress import console, reporter
    from c128patch.serve.doctor import diagnose
    from c128patch.textsafe import one_line

    refused = ""
    try:
        series = load_stack(run, series_dir, layer_dirs)
    except C128Error as exc:
        if series_dir is not None:
            raise
        series, refused = None, exc.message  # doctor still reads the install; the env reference is missing
    with reporter(not as_json, title="doctor") as rep:  # (its probes wait up to 300 s: said while waiting)
        report = diagnose(python, list(launch_args), series, rep)
    if refused:  # (said: a refused layer, a hostile journal in it too, was dropped with no word, "envs not read")
        report.add("error", "series", f"the series and its layers were not read, so the envs they declare are not "
                                      f"checked: {one_line(refused)}")
    if as_json:
        run.emit(report.to_json(), series)
    else:
        out = console(stderr=False)
        errors = sum(f.level == "error" for f in report.findings)
        warnings = sum(f.level == "warn" for f in report.findings)
        verdict = "this sglang would not do what the envs ask (errors below)" if errors else "no error"
        out.print(f"doctor: {errors} error(s), {warnings} warning(s): {verdict}", markup=False)
        for f in report.findings:
            out.print(f"[{_STYLE[f.level]}]{f.level:<5}[/] {f.topic:<8} ", end="")
            out.print(one_line(f.message), markup=False)  # what the serving python and the env say: data
    exit_unless(report.ok)
