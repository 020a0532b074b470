"""The console entry (`c128patch`) and `python -m c128patch`. `--help`, a verb's `--help` and `--version`
are printed from help.txt (the click tree's own output, written by ci/refresh_help.py) without importing
click; any other argument list, a terminal under HELP_WIDTH columns or another program name, runs the
click CLI."""

from __future__ import annotations

import os
import sys

from c128patch import __version__

HELP_WIDTH = 80  # click renders help at min(columns, 80) - 2: the same text at any width from 80 up
HELP_OPTIONS = ("--help", "-h")


def __getattr__(name: str) -> object:
    if name == "HELP_FILE":  # pathlib only where it is asked for
        from pathlib import Path

        return Path(__file__).with_name("help.txt")
    raise AttributeError(name)


def terminal_columns() -> int:
    """``shutil.get_terminal_size().columns`` (what click sizes help by), without importing shutil."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns > 0:
        return columns
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80
    except (AttributeError, ValueError, OSError):
        return 80


def fast_output(argv: list[str], prog: str) -> str | None:
    """What click would print for ``argv`` when it is `--help`, `VERB --help` or `--version`; else None."""
    if prog != "c128patch":  # click names the program in the usage line by argv[0]
        return None
    if argv == ["--version"]:
        return f"c128patch, version {__version__}\n"
    if not argv or argv[-1] not in HELP_OPTIONS or len(argv) > 2 or terminal_columns() < HELP_WIDTH:
        return None
    try:
        with open(os.path.join(os.path.dirname(__file__), "help.txt"), encoding="utf-8") as f:
            texts = dict(part.partition("\n")[::2] for part in f.read().split("\f")[1:])
    except OSError:  # not installed beside the package: click answers
        return None
    return texts.get(argv[0] if len(argv) == 2 else "")


def main() -> int:
    text = fast_output(sys.argv[1:], os.path.basename(sys.argv[0]))
    if text is not None:
        sys.stdout.write(text)
        return 0
    from c128patch.cli import main as cli

    return cli()


if __name__ == "__main__":
    sys.exit(main())
