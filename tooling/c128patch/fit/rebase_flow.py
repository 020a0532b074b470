"""The ``rebase`` workflow, as the command runs it and a script can: one verb of ``ops.rebase`` under
the repository lock, the series' API contract (``fit.contract``) checked on the new tip beside the
checkout and the proof; the refresh to run next is ``ops.refresh.refresh_command``."""

from __future__ import annotations

import contextlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal

from c128patch.errors import C128Error, ConflictError, Interrupted
from c128patch.fit import contract as contract_ops
from c128patch.git import Git, machine_failed
from c128patch.jsonio import write_atomic
from c128patch.ops.rebase import Journal, Rebase
from c128patch.ops.treestate import fault_point, own_index_lock, rebase_command, rebase_journal, repo_lock
from c128patch.progress import reporter
from c128patch.series.layers import get_series, recorded_stack
from c128patch.series.manifest import Series, default_series_root, load_series
from c128patch.textsafe import shell_join
from c128patch.upstream.releases import release_version
from c128patch.upstream.source import fetch_into, open_upstream

Verb = Literal["onto", "continue", "skip", "drop", "abort"]


@dataclass
class Rebased:
    """One verb's outcome: the report the command prints (``--json`` as it is) and the series it used."""

    git: Git
    series: Series
    report: dict

    @property
    def report_md(self) -> Path:
        return rebase_journal(self.git).parent / "rebase-report.md"


def rebase(git: Git, verb: Verb, *, onto: str = "", repo: str | None = None, drop_merged: bool = False,
           drop: tuple[str, ...] = (), series_dir: Path | None = None, layer_dirs: tuple[Path, ...] = (),
           report_dir: Path | None = None, stack: Series | None = None) -> Rebased:
    """``verb`` on ``git``'s tree. Past ``onto`` a verb goes on with the series (and layers) the rebase
    started with, unless others are given; ``drop``: with ``onto`` the entries dropped from the start,
    else the one the rebase stopped at; ``report_dir``: the reports copied there (at a stop too); ``stack``: the
    series the verb uses, as the caller found it (``cli.common.load_stack``, or ``series_of`` past ``onto``: not looked
    up again here)."""
    series = stack if stack is not None else _undoing(git) if verb == "abort" else \
        series_of(git, verb, series_dir, layer_dirs)
    rb = Rebase(git, series)
    report: dict = {}
    pool = ThreadPoolExecutor(max_workers=1)  # the contract is checked on the new tip beside the checkout and proof
    contracts: dict[str, Future] = {}
    rb.on_tip = lambda base, head: contracts.setdefault(head, pool.submit(contract_row, series, git, base, head))
    verbs = {"onto": lambda: rb.start(onto, onto_commit(git, onto, repo), drop_merged=drop_merged, drop=drop,
                                      if_needed=True),
             "continue": rb.resume, "skip": rb.skip, "drop": lambda: rb.skip(drop[0]), "abort": rb.abort}
    head, started = git.head(), rb.path.is_file()
    try:
        with own_index_lock(git.worktree or Path.cwd()), repo_lock(git, "rebase"):
            report = verbs[verb]()
    except C128Error as exc:  # refused past the journal's first write (a ledger the loop reads): said, with the way out
        if verb == "onto" and not started and rb.path.is_file() and not isinstance(exc, ConflictError):
            assert git.worktree is not None
            exc.hint = "\n".join(filter(None, (exc.hint, (
                f"  the rebase is in progress (its journal kept); fix that, then "
                f"`{rebase_command(git.worktree, 'continue')}`, or undo it: "
                f"`{rebase_command(git.worktree, 'abort')}`"))))
        elif verb != "onto" and rb.path.is_file() and not exc.hint and machine_failed(exc.message):  # (a full
            assert git.worktree is not None  # disk at git reset, read-tree: git's line alone; helper 183)
            exc.hint = (f"  the rebase is still in progress (its journal kept); fix that, then "
                        f"`{rebase_command(git.worktree, 'continue')}`, or undo it: "
                        f"`{rebase_command(git.worktree, 'abort')}`")
        raise
    except KeyboardInterrupt as stop:
        if not rb.path.is_file() and verb == "onto" and git.head() == head:
            raise  # before the journal was written: no rebase was started ("no outcome", as apply says)
        raise _interrupted(stop, git, verb, rb.path.is_file()) from None
    finally:  # at a stop too: the reports are written at every stop
        pool.shutdown(wait=True)
        if report_dir and verb != "abort" and not report.get("already_on"):  # (a report there is an older one)
            _copy_reports(git, rb.state, report_dir)
    if not report.get("aborted") and not report.get("already_on") and report.get("head"):
        head = report["head"]
        with said_finished(git, verb):
            fault_point("at", "rebase-done")  # C128PATCH_FAULT=sigterm-at:rebase-done (ops.treestate)
            report["contract"] = (contracts[head].result() if head in contracts
                                  else contract_row(series, git, report["new_base"]["commit"], head))
    return Rebased(git, series, report)


@contextlib.contextmanager
def said_finished(git: Git, verb: Verb) -> Iterator[None]:
    """A signal past ``verb``'s end (the contract checked, the report said) is no "no outcome": the rebase finished
    (or was undone), or stopped with its journal to resume, and the line says which."""
    try:
        yield
    except KeyboardInterrupt as stop:
        raise _interrupted(stop, git, verb, rebase_journal(git).is_file()) from None


def _copy_reports(git: Git, state: Path, report_dir: Path) -> None:
    """The reports copied into ``report_dir``, each whole or not at all; a full disk or a folder that cannot be
    written is one line (a traceback, an empty report left there, before)."""
    try:
        report_dir.mkdir(parents=True, exist_ok=True)
        for name in ("rebase-report.md", "rebase-report.json"):
            if (state / name).is_file():
                write_atomic(report_dir / name, (state / name).read_bytes())
    except OSError as exc:
        status = shell_join(["c128patch", "status", "--tree", str(git.cwd.resolve())])
        raise C128Error(f"cannot write the rebase report into {report_dir} ({exc.strerror or exc}); nothing half "
                        f"written is left there; the report is {state / 'rebase-report.md'}, and `{status}` says "
                        "where the rebase is") from None


def _interrupted(stop: KeyboardInterrupt, git: Git, verb: Verb, journal: bool) -> Interrupted:
    """What a signal in ``verb`` left: a journal to resume or undo, else a rebase finished or undone just before."""
    assert git.worktree is not None
    if journal:
        return Interrupted.by(stop, f"the rebase journal is intact; resume with "
                                    f"`{rebase_command(git.worktree, 'continue')}` or undo with "
                                    f"`{rebase_command(git.worktree, 'abort')}`")
    status = shell_join(["c128patch", "status", "--tree", str(git.worktree.resolve())])
    return Interrupted.by(stop, f"the rebase was {'undone' if verb == 'abort' else 'finished'} before it stopped; "
                                f"`{status}` says where the tree is")


def _undoing(git: Git) -> Series:
    """The series ``abort`` goes with: none of it is read (the journal's, else the tool's own, which always loads): a
    series or layer folder the journal names, moved or removed since, refused the undo ("no layer at ..."), the
    rebase left in progress for good."""
    try:
        return series_of(git, "abort", None, ())
    except C128Error:
        return load_series(default_series_root())


def series_of(git: Git, verb: Verb, series_dir: Path | None, layer_dirs: tuple[Path, ...]) -> Series:
    """The series given, or (past ``onto``) the one in the journal, with its layers unless others are given."""
    journal = rebase_journal(git)
    if verb == "onto" or not journal.is_file():
        return get_series(series_dir, layer_dirs)
    started = Journal.load(journal, git)
    root = str(series_dir or started.series_root)
    try:
        given = series_dir is not None
        return get_series(recorded_stack(root, [], journal, given).root, layer_dirs) if layer_dirs else \
            recorded_stack(root, started.layers, journal, given)
    except C128Error as exc:  # (a folder moved since the stop: "make one with layer new" is no way on)
        assert git.worktree is not None
        raise C128Error(f"{exc.message}; the rebase in {git.worktree} goes on with the series and layers its journal "
                        f"names: put it back, or undo the rebase: `{rebase_command(git.worktree, 'abort')}`") from None


def onto_commit(git: Git, rev: str, repo: str | None) -> str:
    """The commit of ``rev``: in the tree's repository, else fetched from the upstream (``--repo``)."""
    if repo is None:
        commit = git.rev_parse(rev)
        if commit:
            return commit
        if release_version(rev) is None:
            raise C128Error(f"unknown rev '{rev}' in {git.worktree} (pass --repo to fetch it)")
    with reporter(False) as rep:
        upstream = open_upstream(repo, [rev] if repo is None else [], rep)
        commit = upstream.resolve(rev)
        if git.rev_parse(commit) is None:
            fetch_into(git, str(upstream.git.git_dir or upstream.git.worktree), commit)
    return commit


def contract_row(series: Series, git: Git, base: str, head: str) -> dict:
    """The series' API contract on the rebased tree (``fit.contract``), next to the equivalence proof."""
    try:
        result = contract_ops.check(series, git, base, head)
    except C128Error as exc:
        return {"ok": False, "verdict": f"not checked: {exc.message}", "failing": []}
    return {"ok": result.ok, "verdict": result.verdict(),
            "failing": [f.message for f in result.errors + result.warnings]}
