"""The c128patch command line: a thin click layer over the core modules."""

from __future__ import annotations

import importlib
import sys
from typing import Any, NoReturn

import click

from c128patch import SCHEMA_VERSION, __version__  # noqa: F401  (SCHEMA_VERSION: the --json reports' layout)

# One module per verb (cli/<verb>.py, exposing `command`) and the line `--help` lists, in its order (imports none).
COMMANDS: dict[str, str] = {
    "apply": "Check out REV on a new branch and apply the series.",
    "audit": "Gate audit: gated side effects run only under their gate.",
    "bisect": "The first upstream commit where the series stops fitting.",
    "build": "Source-build a patched sglang wheel (PEP 517).",
    "capacity": "KV capacity (full tokens) with online C128 off and on.",
    "check": "Would the series apply to each REV? Nothing is checked out.",
    "contract": "Does the series still fit REV? Its upstream API, checked.",
    "doctor": "Will the installed sglang do what the envs ask?",
    "gates": "The env reference: every variable the series adds or reads.",
    "layer": "Start a layer of your own entries, or add a commit to one.",
    "lint": "Validate the series manifest and its files.",
    "matrix": "Releases x evidence, read from the committed results.",
    "rebase": "Move the patched branch onto another upstream rev.",
    "refresh": "Export the patched branch back into the series.",
    "smoke": "GPU smoke tests of a patched build.",
    "status": "Which series is applied on which rev, and what changed since.",
    "treecheck": "Import the series' modules on a patched tree, gates off/on.",
    "verify-wheel": "Check a patched wheel: RECORD, version, SBOM, effects.",
    "watch": "Carry the series onto REV in a scratch clone and report it.",
    "wheel": "Patch a released sglang wheel with the series (no rebuild).",
}


def report_usage_error(exc: click.UsageError, argv: list[str]) -> NoReturn:
    """A usage error (bad option, choice, flag or verb) as any error: one line, a JSON one with --json, exit 2."""
    from c128patch import exitcodes
    from c128patch.cli.common import emit_json
    from c128patch.textsafe import shell_join

    if isinstance(exc, getattr(click.exceptions, "NoArgsIsHelpError", ())) and exc.ctx is not None:
        click.echo(exc.ctx.get_help())  # a group run bare (`c128patch`, `c128patch layer`): its help, as it reads
        sys.exit(exitcodes.USAGE)
    message = " ".join(exc.format_message().split())
    if exc.ctx is not None:
        verb = exc.ctx.command_path.removeprefix(exc.ctx.find_root().info_name).strip()
    else:  # click's parser names no command (an option without its value): the verb is the leading words
        words, command = [], main
        for word in argv:
            command = command.get_command(None, word) if isinstance(command, click.Group) else None
            if command is None:
                break
            words.append(word)
        verb = " ".join(words)
    if isinstance(exc, click.NoSuchOption) and exc.possibilities == ["--help"]:  # click's nearest, not a fix
        message = f"No such option: {exc.option_name}{_verbs_with(exc.option_name)}"
    line = f"{message} (see `{f'c128patch {verb}' if verb else 'c128patch'} --help`)"
    if isinstance(exc, click.NoSuchOption) and exc.ctx is not None and "--" not in argv and exc.option_name in argv \
            and any(getattr(p, "nargs", 1) == -1 for p in exc.ctx.command.params) \
            and not set(exc.possibilities or ()) - {"--help"}:  # doctor's launch arguments; not a misspelt own option
        at = argv.index(exc.option_name)
        flags = {n for p in exc.ctx.command.params if getattr(p, "is_flag", False) for n in p.opts}  # --json stays
        ours, theirs = [*argv[:at], *(a for a in argv[at:] if a in flags)], [a for a in argv[at:] if a not in flags]
        line += f"; launch arguments go after `--`: {shell_join(['c128patch', *ours, '--', *theirs])}"
    if "--json" in (argv[: argv.index("--")] if "--" in argv else argv):
        emit_json({"ok": False, "error": line, "usage_error": True})
    from c128patch.textsafe import one_line  # an argument's controls and newlines (click quotes only its own)

    click.echo(f"c128patch: error: {one_line(line)}", err=True)
    sys.exit(exitcodes.USAGE)


def _verbs_with(option: str) -> str:
    """``; VERB has it`` for the verbs that take ``option`` (`rebase --check`: refresh has it), or ""."""
    verbs = [name for name in COMMANDS if any(option in p.opts for p in main.get_command(None, name).params)]
    return f"; {' and '.join(verbs[:3])} {'has' if len(verbs) == 1 else 'have'} it" if verbs else ""


class VerbTable(click.Group):
    """Verbs by name: `--help` lists ``table`` (name -> line); a verb's ``<package>.<name>`` is imported to run it."""

    table, package = COMMANDS, "c128patch.cli"

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.table)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.table:
            return None
        command = importlib.import_module(f"{self.package}.{name.replace('-', '_')}").command
        command.short_help = self.table[name]
        return command

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, Any, list[str]]:
        try:  # click's, with "did you mean" for an unknown verb close to a known one (`aply` -> `apply`)
            return super().resolve_command(ctx, args)
        except click.UsageError as exc:
            import difflib  # only for the error: it costs --help ~10 ms

            close = difflib.get_close_matches(args[0], self.table, n=1)
            if close and args[0] not in self.table:
                exc.message = f"{exc.message.rstrip('.')}; did you mean {close[0]!r}?"
            raise

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl(list(self.table.items()))


class LazyGroup(VerbTable):
    """The verbs of ``COMMANDS``; its usage errors and its verbs' are reported by ``report_usage_error``."""

    def main(self, args: Any = None, *rest: Any, **kwargs: Any) -> Any:
        self._argv = list(sys.argv[1:] if args is None else args)
        if common := sys.modules.get("c128patch.cli.common"):  # (an earlier run in this process: not imported for it)
            common.VERB_ENDED[0] = False
        return super().main(args, *rest, **kwargs)

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except click.UsageError as exc:
            report_usage_error(exc, getattr(self, "_argv", []))
        except KeyboardInterrupt as exc:
            interrupted_before_the_verb(exc, getattr(self, "_argv", []))

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            report_usage_error(exc, getattr(self, "_argv", []))
        except KeyboardInterrupt as exc:  # (in the verb, ``handles_errors`` takes it: it came before or after)
            if (common := sys.modules.get("c128patch.cli.common")) and common.VERB_ENDED[0]:
                interrupted_after_the_verb(exc)
            interrupted_before_the_verb(exc, getattr(self, "_argv", []))


def interrupted_after_the_verb(exc: KeyboardInterrupt) -> NoReturn:
    """A signal past the verb's end (its output printed, its write done): it said "no outcome; nothing was done"
    after `refresh` had written the series (helper 164). The line says what stands; 128+N; no second JSON object."""
    import signal

    from c128patch import exitcodes

    signum = exc.args[0] if exc.args and isinstance(exc.args[0], int) else signal.SIGINT
    click.echo(f"c128patch: interrupted ({signal.Signals(signum).name}) after the command ended: what it did and "
               "printed above stands", err=True)
    sys.exit(exitcodes.SIGNAL + signum)


def interrupted_before_the_verb(exc: KeyboardInterrupt, argv: list[str]) -> NoReturn:
    """Ctrl-C while the command line is read or the verb's module imported: click said "Aborted!" and exited 1, the
    code of a verb's finding (`lint`'s errors, `check`'s "does not apply"). One line (with --json, its one error
    object too) and 128+N, as in a verb."""
    import signal

    from c128patch import exitcodes
    from c128patch.cli.common import emit_json

    signum = exc.args[0] if exc.args and isinstance(exc.args[0], int) else signal.SIGINT
    said = f"interrupted ({signal.Signals(signum).name}): no outcome; nothing was done"
    if "--json" in (argv[: argv.index("--")] if "--" in argv else argv):
        emit_json({"ok": False, "error": said})
    click.echo(f"c128patch: {said}", err=True)
    sys.exit(exitcodes.SIGNAL + signum)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="c128patch")
def main() -> None:
    """Carry DeepSeek-V4 online C128 under DSPARK onto a pinned SGLang: patch series, wheels, GPU smoke tests."""
