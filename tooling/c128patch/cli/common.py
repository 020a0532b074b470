"""What every command shares: --json, --series, and turning errors into one-line messages."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any, Callable

import click

from c128patch.errors import C128Error, ConflictError
from c128patch.progress import console
from c128patch.series.manifest import Series, default_series_root, load_series

json_option = click.option("--json", "as_json", is_flag=True, help="Print a JSON report on stdout.")
series_option = click.option(
    "--series",
    "series_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Folder holding patches/series.toml (default: the series this tool carries).",
)
repo_option = click.option("--repo", default=None, help="Upstream: a local clone (PATH) or a git URL (cloned once into the cache). Default: the sglang release wheels.")


def get_series(series_dir: Path | None) -> Series:
    return load_series(series_dir or default_series_root())


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def handles_errors(fn: Callable) -> Callable:
    """Run a command body; a C128Error becomes one line on stderr (plus hints) and its exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        as_json = kwargs.get("as_json", False)
        try:
            return fn(*args, **kwargs)
        except C128Error as exc:
            if as_json:
                payload: dict[str, Any] = {"ok": False, "error": exc.message}
                if exc.hint:
                    payload["hint"] = exc.hint
                if isinstance(exc, ConflictError) and exc.report:
                    payload["report"] = exc.report
                emit_json(payload)
            err = console()
            err.print(f"c128patch: error: {exc.message}", markup=False)
            if exc.hint:
                err.print(exc.hint, markup=False)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            console().print("c128patch: interrupted", markup=False)
            sys.exit(130)

    return wrapper
