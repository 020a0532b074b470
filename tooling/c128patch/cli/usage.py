"""Usage errors (a missing option, a bad choice, an unknown flag or command) as every other error:
one line on stderr, a JSON error object on stdout when --json is among the arguments, exit 2.
Imports only click: the top-level group uses it, and `c128patch --help` must start fast."""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

import click


def _json_requested(argv: list[str]) -> bool:
    words = argv[: argv.index("--")] if "--" in argv else argv
    return "--json" in words


def report_usage_error(exc: click.UsageError, argv: list[str]) -> NoReturn:
    message = " ".join(exc.format_message().split())
    verb = exc.ctx.command_path.partition(" ")[2] if exc.ctx is not None else ""
    where = f"c128patch {verb}" if verb else "c128patch"
    line = f"{message} (see `{where} --help`)"
    if _json_requested(argv):
        click.echo(json.dumps({"ok": False, "error": line, "usage_error": True}, indent=2, sort_keys=True))
    click.echo(f"c128patch: error: {line}", err=True)
    sys.exit(exc.exit_code)


class OneLineUsageErrors(click.Group):
    """A group whose own and whose commands' usage errors are reported by ``report_usage_error``."""

    def main(self, args: Any = None, *rest: Any, **kwargs: Any) -> Any:
        self._argv = list(sys.argv[1:] if args is None else args)
        return super().main(args, *rest, **kwargs)

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except click.UsageError as exc:
            report_usage_error(exc, getattr(self, "_argv", []))

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            report_usage_error(exc, getattr(self, "_argv", []))
