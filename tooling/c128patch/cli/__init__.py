"""The c128patch command line: a thin click layer over the core modules."""

from __future__ import annotations

import importlib

import click

from c128patch import __version__

# One module per command (cli/<verb>.py), each exposing `command`.
COMMANDS = ("apply", "check", "status", "lint", "audit", "refresh", "rebase", "capacity", "wheel", "build",
            "verify-wheel", "smoke", "matrix", "gates", "doctor", "watch", "contract", "treecheck", "bisect")


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module = importlib.import_module(f"c128patch.cli.{name.replace('-', '_')}")
        return module.command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="c128patch")
def main() -> None:
    """Carry DeepSeek-V4 online C128 under DSPARK onto a pinned SGLang: patch series, wheels, GPU smoke tests."""
