"""What every command shares: --json, --series, and turning errors into one-line messages."""

from __future__ import annotations

import errno
import functools
import json
import os
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import click

from c128patch import SCHEMA_VERSION, exitcodes
from c128patch.errors import C128Error, what_is
from c128patch.upstream import DEFAULT_TREE

# A verb's module imports only click and this module at its top (a fast --help); the core in the bodies.

json_option = click.option("--json", "as_json", is_flag=True, help="Print a JSON report on stdout.")
series_dir_option = click.option(
    "--series", "series_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
    help="Folder holding patches/series.toml (default: the series this tool carries).")
layer_option = click.option(
    "--layer", "layer_dirs", multiple=True, type=click.Path(file_okay=False, path_type=Path),
    help="A layer folder (the series format) replayed after the series, in the order given; repeatable "
         "(default: $C128PATCH_LAYERS, else [layers] paths in c128patch.toml here or above, else those the tree's "
         "provenance names; always said; docs/layers.md).")
repo_option = click.option("--repo", default=None, help="Upstream: a local clone (PATH) or a git URL (cloned once "
                                                        "into the cache). Default: the sglang release wheels.")


class Seconds(click.FloatRange):
    """A time limit: a finite number of seconds from ``min`` to a week (``nan`` passed FloatRange's bounds: watch's
    ValueError traceback, bisect with no limit; ``inf`` or ``1e300``: watch's OverflowError traceback)."""

    name = "seconds"

    def __init__(self, min: float = 1) -> None:  # noqa: A002 (FloatRange's own word)
        super().__init__(min=min, max=7 * 86_400)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = super().convert(value, param, ctx)
        if seconds != seconds:  # nan: every comparison with a bound is false
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        return seconds


tree_option = click.option(
    "--tree", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
    help=f"The patched sglang tree (default: the repository you are in when it is one, else ./{DEFAULT_TREE}, "
         "where apply makes it).")


def primary_or_variant(as_primary: bool, as_variant: bool, default: str) -> bool | None:
    """``--primary`` (True), ``--variant`` (False) or neither (None); both: a usage error (one ``--primary/--variant``
    option let the last one win, silently)."""
    if as_primary and as_variant:
        raise click.UsageError(f"--primary and --variant together: give one of them, or neither ({default})")
    return True if as_primary else False if as_variant else None


def json_verb(fn: Callable) -> Callable:
    """A verb's body with --json, its errors handled (``handles_errors``)."""
    return json_option(handles_errors(fn))


def verb_options(fn: Callable) -> Callable:
    """``json_verb`` with --series DIR and --layer DIR (``series_dir``, ``layer_dirs``: ``get_series``'s arguments)."""
    return series_dir_option(layer_option(json_verb(fn)))


def say(*lines: str) -> None:
    """Lines on stdout, without rich markup or the controls a terminal acts on (``textsafe.plain``)."""
    from c128patch.progress import echo

    echo("\n".join(lines), stderr=False)


def exit_unless(ok: bool) -> None:
    """Exit 1 (``exitcodes.FAILED``) unless ``ok``."""
    if not ok:
        sys.exit(exitcodes.FAILED)


def applied_here(top: Path | None) -> bool:
    """Did c128patch apply (or is it rebasing) in the repository ``top`` (its ``work_tree_top``)?"""
    from c128patch.git import Git
    from c128patch.ops.treestate import c128_state_dir
    from c128patch.series.provenance import PROVENANCE_PATH

    return top is not None and ((top / PROVENANCE_PATH).is_file() or c128_state_dir(Git(worktree=top)).is_dir())


def locate_tree(tree: Path | None) -> Path:
    """The tree verbs work on: ``--tree``; else the repository here if c128patch is in it; else ./sglang; else here.
    One whose object store is damaged is refused here, for every verb (``git.refuse_damaged``)."""
    from c128patch.git import Git, refuse_damaged

    top = _locate_tree(tree)
    refuse_damaged(Git(worktree=top), top)
    return top


def _locate_tree(tree: Path | None) -> Path:
    from c128patch.git import refuse_git_dir, toplevel, work_tree_top

    if tree is not None:
        refuse_git_dir(tree)
        return toplevel(tree)
    here = Path.cwd()
    top = work_tree_top(here)
    if applied_here(top):
        return top
    default = here / DEFAULT_TREE
    default_top = work_tree_top(default)
    if default_top is not None and default_top.resolve() == default.resolve():  # its own repository
        return default_top
    if top is not None:
        return top
    raise C128Error(f"no sglang tree here: {here} is not in a git repository and ./{DEFAULT_TREE} (where "
                    "`c128patch apply` makes its tree) is not one; run from the tree, or pass --tree DIR")


def applied_tree_here(verb: str) -> Path | None:
    """For a verb whose --tree is optional: the tree ``apply`` made that this folder is in (else ./sglang), said
    on stderr (--json too: the report does not name it); None where there is none."""
    from c128patch.progress import echo

    try:
        top = _locate_tree(None)
    except C128Error:
        return None
    if not applied_here(top):
        return None
    locate_tree(top)  # (its damage said, not taken for "no tree here")
    echo(f"{verb}: on the patched tree here, {top} (--tree {top})", stderr=True)
    return top


@dataclass
class Run:
    """One verb's run: ``handles_errors`` makes it and passes it to the verb as ``run``."""

    as_json: bool = False  # --json: the layers in effect are said in its report, not on stderr
    stack: Any = None  # the series ``load_stack`` gave: its layers go into an error object too
    emitted: bool = False  # its --json object is printed (an interrupt after it prints no second one)

    def emit(self, data: dict[str, Any], series: Any = None) -> None:
        """``emit_json``, once the verb's report is ready."""
        emit_json(data, series)
        self.emitted = True


def load_stack(run: Run, series_dir: Path | None, layer_dirs: tuple[Path, ...], tree: Path | None = None,
               repo: str | None = None) -> Any:
    """``get_series`` with the layers named, else the operator's (the env, a c128patch.toml outside ``tree`` and
    ``repo``), else those the provenance of ``tree`` (else of the repository here, else of ./sglang, where ``apply``
    makes its tree) names; the layers in effect are said on stderr (unless named with --layer, or with --json:
    in its report, ``emit_json``); ``run`` keeps the stack for an error object."""
    from c128patch.git import Git
    from c128patch.ops.treestate import tree_layers  # not ops.layer: status stays light
    from c128patch.series.layers import ENV, get_series, lookup_layers
    from c128patch.textsafe import one_line
    from c128patch.upstream import local_repo  # (a file:// URL names a folder here too)

    def top(folder: Path) -> Path | None:  # the repository holding folder (a bare one: itself), no git run
        chain = [folder.resolve(), *folder.resolve().parents]
        found = next((f for f in chain if (f / ".git").exists() or (f / "HEAD").is_file() or (f / "HEAD").is_symlink()),
                     None)  # (a symlinked HEAD: a bare repository to git)
        # a work tree's git dir (--repo R/.git) names the work tree too: its committed config and layer were stacked
        return found.parent if found is not None and found.name == ".git" else found

    for option, folder in [("--series", series_dir), *(("--layer", f) for f in layer_dirs)]:
        if folder is not None and os.path.lexists(folder) and not Path(folder).is_dir():  # (a FIFO: "no manifest")
            raise C128Error(f"{option} {folder} is {what_is(folder)}, not a folder")
    pointed = [t for t in (top(Path(p)) for p in (tree, local_repo(repo)) if p and Path(p).is_dir()) if t]
    folders, origin = lookup_layers(layer_dirs, exclude=pointed)
    here = top(tree) if tree else top(Path.cwd()) or top(Path.cwd() / DEFAULT_TREE)
    if not origin and here and (folders := tree_layers(Git(worktree=here))):
        origin = "the tree's provenance"
    series = run.stack = get_series(series_dir, folders, exclude=pointed)
    if series.layers:
        series.origin = origin
        if origin != "--layer" and not run.as_json:  # named on the command line: known
            click.echo(one_line(f"layers from {origin}: {', '.join(map(str, folders))}"), err=True)  # a tree's
    elif origin == f"${ENV}":  # set and empty: no layers, whatever c128patch.toml or the tree says (docs/layers.md)
        series.origin = origin
        if not run.as_json:
            click.echo(f"layers: none (${ENV} is set and empty; unset it to take c128patch.toml's or the tree's)",
                       err=True)
    elif origin and origin != "--layer":  # a c128patch.toml naming none (paths = []): said, as the env's empty is
        series.origin = origin  # (status said "from nowhere", and no verb said the tree's layers were not taken)
        if not run.as_json:
            click.echo(one_line(f"layers: none ({origin} names none; name some there, or remove it to take the "
                                "tree's)"), err=True)
    return series


def recorded_layers_said(run: Run, series: Any) -> Any:
    """``series``, taken from an apply or rebase journal (``--continue``, ``--skip``, ``--drop``): its layers said as
    ``load_stack`` says them (on stderr, unless --json, whose report and error object carry them)."""
    from c128patch.textsafe import one_line

    run.stack = series
    origin = getattr(series, "origin", "")
    if series.layers and origin and origin != "--layer" and not run.as_json:
        click.echo(one_line(f"layers from {origin}: {', '.join(str(layer.root) for layer in series.layers)}"),
                   err=True)
    return series


def check_output_dir(path: Path, option: str) -> Path:
    """Refuse, before any work, an output folder that cannot be made or written (a file on its way, no write)."""
    probe = path
    while not os.path.lexists(probe) and probe.parent != probe:
        probe = probe.parent
    if os.path.lexists(probe) and not probe.is_dir():
        raise C128Error(f"{option} {path}: {probe} is a file, not a folder; pass a folder that is (or can be) made")
    if probe.is_dir() and not os.access(probe, os.W_OK | os.X_OK):
        raise C128Error(f"{option} {path}: {probe} is not writable; pass a folder you can write")
    if probe.is_dir():  # access() says yes where a write is still refused (root: sysfs, an immutable folder; EPERM
        from c128patch import procs  # was wheel's traceback after the work, helper 167): a folder made and removed

        try:
            with procs.scratch(".c128patch-probe-", probe):
                pass
        except OSError as exc:
            raise C128Error(f"{option} {path}: cannot write in {probe} ({exc.strerror or exc}); pass a folder you "
                            "can write") from None
    return path


def emit_json(data: dict[str, Any], series: Any = None) -> None:
    """Print a --json report (an error object too) on stdout, carrying the layout's version as "schema" and the
    layers of ``series`` in effect (``load_stack``)."""
    from c128patch.series.layers import layer_rows
    from c128patch.textsafe import decoded

    effect = {"layers_in_effect": {"from": getattr(series, "origin", "--layer"), "layers": [
        {**row, "folder": str(layer.root)} for row, layer in zip(layer_rows(series), series.layers)]}} \
        if getattr(series, "layers", None) or getattr(series, "origin", "") else {}  # (folder: two layers of one name)
    # (a layer folder or any field holding a byte that is not UTF-8: U+FFFD, as every line of ours shows it)
    click.echo(json.dumps(decoded({**effect, **data, "schema": SCHEMA_VERSION}), indent=2, sort_keys=True,
                          default=str))


def handles_errors(fn: Callable) -> Callable:
    """Run a command body; a C128Error becomes one line on stderr (plus hints) and its exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from c128patch.progress import echo
        from c128patch.textsafe import one_line

        main = threading.current_thread() is threading.main_thread()
        held = {sig: signal.signal(sig, _stop) for sig in _STOPS if signal.getsignal(sig) != signal.SIG_IGN} \
            if main else {}  # (one the operator ignores, ``nohup``'s SIGHUP, stays ignored)
        run = Run(as_json=kwargs.get("as_json", False))
        try:
            _here()
            return fn(*args, run=run, **kwargs)
        except C128Error as exc:
            from c128patch.textsafe import one_line

            if run.as_json and not run.emitted:  # (docs/schemas/README.md: an error object carries the layers too)
                emit_json({"ok": False, "error": exc.message, **({"hint": exc.hint} if exc.hint else {}),
                           **({"report": exc.report} if getattr(exc, "report", None) else {})}, run.stack)
            said = filter(None, (f"c128patch: error: {one_line(exc.message)}", exc.hint))  # a newline of an input
            echo("\n".join(said))
            sys.exit(exc.exit_code)
        except OSError as exc:  # a limit of the machine's (E2BIG, ENAMETOOLONG): one line
            _fail(run, _limit_met(exc))
        except (MemoryError, RuntimeError) as exc:  # (ulimit -v, -u, a full machine): one line, never a traceback
            if isinstance(exc, RuntimeError) and "can't start new thread" not in str(exc):
                raise
            _fail(run, "out of memory or threads (its limits, ulimit -v and -u, or the machine's): it stopped there "
                  "(c128patch status says what is left in a tree); raise the limit and run it again")
        except KeyboardInterrupt as exc:
            signum = exc.args[0] if exc.args and isinstance(exc.args[0], int) else signal.SIGINT
            said = f"interrupted ({signal.Signals(signum).name}): no outcome; its scratch folders are removed"
            if run.as_json and not run.emitted:  # every --json run prints one object (schemas/README)
                emit_json({"ok": False, "error": said}, run.stack)
            echo(f"c128patch: {said}")
            sys.exit(exitcodes.SIGNAL + signum)
        finally:
            VERB_ENDED[0] = True  # a signal from here on is past the verb (``cli.LazyGroup.invoke``)
            for sig, handler in held.items():
                signal.signal(sig, handler)
            if os.environ.get("C128PATCH_FAULT"):  # (the fault-injection tests: a signal just past the verb)
                from c128patch.ops.treestate import fault_point

                fault_point("at", "verb-ended")

    return wrapper



# Has this invocation's verb body ended (returned, exited, said its error or interruption)? A signal after it (click's
# and the interpreter's way out) changes nothing it did: ``cli.LazyGroup`` reads it, and resets it as each run starts.
VERB_ENDED = [False]


def _limit_met(exc: OSError) -> str:
    """The one line for an OSError of the machine's limits; any other is raised again."""
    from c128patch.textsafe import one_line

    if exc.errno == errno.ENAMETOOLONG:  # a folder given (--series, --tree, --repo, $C128PATCH_SERIES) with a part over
        # 255 bytes, or past PATH_MAX: OSError's traceback where it was first looked at (helper 168)
        return (f"a path is too long for the file system ({exc.strerror}): {one_line(str(exc.filename))[:120]}...; "
                "name a shorter one")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):  # a write the verb did not expect to fail: a full
        # release cache (its trees record) gave OSError's traceback (helper 181)
        where = os.path.dirname(str(exc.filename)) if exc.filename else "a folder"
        return (f"cannot write in {one_line(where)[:200]} ({exc.strerror}): it stopped there (c128patch status says "
                "what is left in a tree); free space (or raise ulimit -f) and run it again")
    if exc.errno in (errno.EMFILE, errno.ENFILE):  # (verify-wheel under ulimit -n 12: its scratch folder's rmtree
        # gave OSError's traceback, exit 1; helper 183)
        import resource

        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return (f"too many open files ({exc.strerror}; the limit, ulimit -n {limit}, is too low): it stopped there (a "
                "scratch folder left is removed by the next run); raise it and run it again")
    if exc.errno == errno.E2BIG:  # a child the environment leaves no room for
        size = sum(len(k) + len(v) + 2 for k, v in os.environ.items())
        return (f"cannot start {exc.filename or 'a child process'}: {exc.strerror} (the environment holds {size} "
                "bytes, near the system's limit for a program's arguments and environment); unset large variables and "
                "run it again")
    raise exc


def _fail(run: Run, message: str) -> None:
    """Exit 2 with ``message``: one line on stderr, and with --json its error object on stdout (every --json run prints
    one: an E2BIG or out-of-memory stop printed none, helper 159)."""
    from c128patch.progress import echo

    if run.as_json and not run.emitted:
        emit_json({"ok": False, "error": message}, run.stack)
    echo(f"c128patch: error: {message}")
    sys.exit(exitcodes.USAGE)


def _here() -> None:
    """The current folder must exist: every verb reads it (``Path.cwd()``: a traceback in a folder removed)."""
    try:
        os.getcwd()
    except FileNotFoundError:
        raise C128Error("the current folder was removed (the shell is still in it); cd into a folder that exists and "
                        "run it again; nothing was done") from None


_STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _stop(signum: int, _frame: object) -> None:
    """SIGTERM and SIGHUP unwind a verb as Ctrl-C does: scratch folders removed, children ended, nothing claimed. A
    second signal while it unwinds (Ctrl-C pressed twice) waits: it cut the removal of a scratch folder short."""
    for sig in _STOPS:
        if signal.getsignal(sig) == _stop:
            signal.signal(sig, _unwinding)
    raise KeyboardInterrupt(signum)


def _unwinding(_signum: int, _frame: object) -> None:
    """A stop signal that came while a verb unwinds from the first: it changes nothing (the exit is the first's)."""
