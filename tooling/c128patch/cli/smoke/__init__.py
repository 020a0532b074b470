"""c128patch smoke kernel|upstream|server: GPU smoke tests of a patched build; what the subcommands share."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any, Callable

import click

from c128patch.cli import VerbTable
from c128patch.cli.common import Run, Seconds, check_output_dir, exit_unless, json_verb, locate_tree
from c128patch.errors import C128Error

# One module per subcommand (cli/smoke/<name>.py, exposing `command`) and the line `smoke --help` lists (cli.VerbTable).
SUBCOMMANDS: dict[str, str] = {
    "kernel": "The project's GPU suite on the patched sources (one GPU).",
    "upstream": "Upstream's own kernel tests, patched vs unpatched.",
    "server": "A real server on a model under load, envs on then off.",
}


class _Subcommands(VerbTable):
    table, package = SUBCOMMANDS, "c128patch.cli.smoke"


@click.group("smoke", cls=_Subcommands)
def command() -> None:
    """GPU smoke tests of a patched build (docs/smoke.md)."""


class Recording(click.Command):
    """Keeps the raw arguments, so the report can say what was run."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["c128patch.args"] = list(args)
        return super().parse_args(ctx, args)


def command_line(ctx: click.Context) -> str:
    from c128patch.textsafe import shell_join

    return f"c128patch smoke {ctx.info_name} " + shell_join(ctx.meta.get("c128patch.args", []))


def progress(as_json: bool) -> Callable[[str], None]:
    """Progress lines on stderr (none for --json)."""
    from c128patch.progress import echo

    return (lambda m: None) if as_json else echo


def report_staged(staged: dict[str, Any], run: Run, then: list[str], **extra: Any) -> None:
    """What --stage copied, and the command to run on the GPU machine (``then``: after `smoke`)."""
    if run.as_json:
        run.emit({"ok": True, "staged": staged, **extra})
        return
    say = progress(run.as_json)
    for label, info in staged.items():
        say(f"{label}: {info['files']} files, {info['bytes'] / 1e6:.2f} MB -> {info['path']}")
    from c128patch.textsafe import shell_join

    say("on the GPU machine: " + shell_join(["python", "-m", "c128patch", "smoke", *then]))


def finish(report: dict[str, Any], run: Run, show: Callable[[], None]) -> None:
    """The report (JSON or ``show``); exit 1 when it is not ok."""
    run.emit(report) if run.as_json else show()
    exit_unless(report["ok"])


def common_options(fn: Callable) -> Callable:
    """--python, --out DIR and --json, which every subcommand takes; its errors handled (``handles_errors``)."""
    fn = click.option("--out", type=click.Path(file_okay=False, path_type=Path),
                      help="Folder for the report and logs.")(json_verb(fn))
    return click.option("--python", default=sys.executable, show_default="the Python running c128patch",
                        help="The Python that runs the suite / server.")(fn)


def check_outputs(**folders: Path | None) -> None:
    """Refuse an --out or --stage folder that cannot be written, before any work."""
    for option, folder in folders.items():
        if folder is not None:
            check_output_dir(folder, f"--{option}")


_TREE_OPTIONS = (
    click.option("--tree", type=click.Path(file_okay=False, path_type=Path),
                 help="Patched sources: a checkout (uses python/) or a folder holding sglang/ "
                      "(default, without --wheel: the tree `status` finds)."),
    click.option("--wheel", type=click.Path(dir_okay=False, path_type=Path), help="A patched sglang wheel."),
    click.option("--upstream-tree", type=click.Path(file_okay=False, path_type=Path),
                 help="Unpatched sources (default: derived from the tree's provenance record)."),
    click.option("--list", "--collect-only", "collect_only", is_flag=True, help="List the tests, run none."),
    click.option("-k", "keyword", help="Only tests matching this pytest -k expression."),
    click.option("--suite", type=click.Path(file_okay=False, path_type=Path),
                 help="The GPU suite (default: the one this tool carries)."),
    click.option("--timeout", type=Seconds(), default=1800.0, show_default=True, help="Seconds per pytest pass."),
    click.option("--stage", "stage_dir", type=click.Path(file_okay=False, path_type=Path),
                 help="Copy what the tests read from the trees into DIR (to carry to a GPU machine) and stop."),
)


def tree_options(fn: Callable) -> Callable:
    """The patched and the unpatched sources and how the suite runs: kernel's and upstream's."""
    for decorator in reversed(_TREE_OPTIONS):
        fn = decorator(fn)
    return fn


def kernel_options(fields: dict[str, Any], **more: Any) -> Any:
    """The shared options as a ``smoke.trees.KernelOptions``; no --tree or --wheel: the sglang tree `status` finds."""
    from c128patch.smoke.trees import KernelOptions

    if fields["tree"] is None and fields["wheel"] is None:
        with contextlib.suppress(C128Error):
            found = locate_tree(None)
            fields["tree"] = found if (found / "python" / "sglang").is_dir() else None
    return KernelOptions(**fields, **more)
