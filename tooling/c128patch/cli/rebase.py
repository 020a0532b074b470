"""c128patch rebase --onto REV [--drop ENTRY ...] | --continue | --skip | --drop ENTRY | --abort  [--tree DIR] [--json]"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import click

from c128patch.cli.common import (
    check_output_dir,
    emit_json,
    handles_errors,
    json_option,
    locate_tree,
    repo_option,
    series_option,
    tree_option,
)
from c128patch.errors import C128Error, Interrupted

if TYPE_CHECKING:
    from concurrent.futures import Future

    from c128patch.git import Git
    from c128patch.series.manifest import Series


def _onto_commit(git: Git, rev: str, repo: str | None) -> str:
    from c128patch.progress import reporter
    from c128patch.upstream.releases import release_version
    from c128patch.upstream.source import open_upstream

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
            git.run("fetch", "--quiet", str(upstream.git.git_dir or upstream.git.worktree), commit)
    return commit


@click.command("rebase")
@click.option("--onto", "onto", default=None, help="Upstream revision to move the patched branch onto.")
@click.option("--continue", "cont", is_flag=True, help="Go on after resolving (and staging) a conflict.")
@click.option("--skip", is_flag=True, help="Drop the entry that stopped the rebase.")
@click.option("--abort", is_flag=True, help="Restore the branch as it was before the rebase.")
@click.option("--drop-merged", is_flag=True, help="Drop entries found merged upstream (they are listed, never dropped silently).")
@click.option("--drop", "drop", multiple=True, metavar="ENTRY",
              help="Drop ENTRY as merged upstream (recorded with merged_in; refresh keeps it so): with --onto, "
                   "from the start; alone, the entry the rebase stopped at.")
@click.option("--report", "report_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Also write rebase-report.md/.json here.")
@tree_option
@repo_option
@series_option
@json_option
@handles_errors
def command(onto: str | None, cont: bool, skip: bool, abort: bool, drop_merged: bool, drop: tuple[str, ...],
            report_dir: Path | None, tree: Path | None, repo: str | None, series_dir: Path | None, layer_dirs: tuple[Path, ...],
            as_json: bool) -> None:
    """Move the patched branch onto another upstream rev: each entry replays the file the series
    chooses there, your edits are carried, the result is proven equal to a fresh apply."""
    from concurrent.futures import ThreadPoolExecutor

    from rich.table import Table

    from c128patch.git import Git
    from c128patch.ops.rebase import Journal, Rebase
    from c128patch.ops.treestate import rebase_command, rebase_journal, repo_lock
    from c128patch.progress import console
    from c128patch.series.layers import get_series, stack
    from c128patch.series.manifest import load_series

    chosen = [n for n, on in (("--onto", onto), ("--continue", cont), ("--skip", skip), ("--abort", abort),
                              ("--drop", drop and not onto)) if on]
    if len(chosen) != 1:
        raise C128Error("give exactly one of --onto REV, --continue, --skip, --drop ENTRY, --abort")
    if drop and not onto and len(drop) != 1:
        raise C128Error("at a stop, --drop names one entry: the one the rebase stopped at")
    git = Git(worktree=locate_tree(tree))
    if report_dir is not None:
        check_output_dir(report_dir, "--report")
    journal = rebase_journal(git)
    layers: list[str] | None = None
    if not onto and journal.is_file():  # go on with the series (and layers) the rebase started with
        started = Journal.load(journal, git)
        series_dir = series_dir or Path(started.series_root)
        layers = None if layer_dirs else started.layers
    series = get_series(series_dir, layer_dirs) if layers is None else stack(load_series(series_dir), [Path(p) for p in layers])
    rb = Rebase(git, series)
    report: dict = {}
    pool = ThreadPoolExecutor(max_workers=1)  # the contract is checked on the new tip beside the checkout and proof
    contracts: dict[str, Future] = {}
    rb.on_tip = lambda base, head: contracts.setdefault(head, pool.submit(_contract, series, git, base, head))
    try:
        with repo_lock(git, "rebase"):
            if onto:
                report = rb.start(onto, _onto_commit(git, onto, repo), drop_merged=drop_merged, drop=drop)
            elif cont:
                report = rb.resume()
            elif skip:
                report = rb.skip()
            elif drop:
                report = rb.drop(drop[0])
            else:
                report = rb.abort()
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted: the rebase journal is intact; resume with "
                          f"`{rebase_command(git.worktree, 'continue')}` or undo with "
                          f"`{rebase_command(git.worktree, 'abort')}`") from None
    finally:  # at a stop too: the reports are written at every stop
        pool.shutdown(wait=True)
        if report_dir and not abort:
            _copy_reports(rb.path.parent, report_dir)
    if not report.get("aborted") and report.get("head"):
        head = report["head"]
        report["contract"] = (contracts[head].result() if head in contracts
                              else _contract(series, git, report["new_base"]["commit"], head))
    if as_json:
        emit_json(report)
        return
    out = console(stderr=False)
    if report.get("aborted"):
        out.print(f"rebase aborted: {report['branch'] or 'HEAD'} is back at {report['head'][:12]}"
                  + (f"; your uncommitted work is in stash {report['stash'][:12]}" if report["stash"] else ""), markup=False)
        return
    table = Table(title=f"rebase {report['old_base']['rev']} -> {report['new_base']['rev']} ({report['direction']}, "
                        f"{report['upstream_commits_between']} upstream commits added, "
                        f"{len(report['upstream_commits_removed'])} left behind)")
    for col in ("entry", "status", "file (chosen by)", "detail"):
        table.add_column(col)
    for e in report["entries"]:
        detail = e["detail"] + (f" [{', '.join(e['ledger'])}]" if e["ledger"] else "")
        detail += " [your edit carried]" if e.get("edit_from") else ""
        file = f"{e['file']} ({e['chosen_by'].split(':', 1)[0]})" if e.get("file") else e["kind"]
        table.add_row(e["name"], e["status"], file, detail)
    out.print(table)
    out.print(report["equivalence"]["summary"], markup=False)
    contract = report["contract"]
    out.print(f"contract on {report['new_base']['rev']}: {contract['verdict']}"
              + "".join(f"\n  {f}" for f in contract["failing"]), markup=False)
    if report.get("renamed_branch"):
        out.print(f"branch {report['renamed_branch']['from']} is now {report['renamed_branch']['to']} "
                  f"(the old tip: {report['recovery_ref']})", markup=False)
    nxt = next_refresh(git, series, report)
    out.print(f"report: {rb.path.parent / 'rebase-report.md'}" + (f"; next: {nxt}" if nxt else
              "; the series is up to date (refresh --check changes nothing)"), markup=False)


def next_refresh(git: Git, series: Series, report: dict) -> str:
    """The refresh to run after a rebase, or "" when ``refresh --check`` would change nothing. Primary
    files only when the rebase went forward past the series base: never moves that base backwards."""
    from c128patch.fit.contract import lock_items
    from c128patch.ops import refresh as refresh_ops
    from c128patch.series.layers import layer_args

    base = git.rev_parse(series.base) if series.base else None
    onto = report["new_base"]["commit"]
    primary = report["direction"] == "forward" and (base is None or git.is_ancestor(base, onto))
    try:
        changes = refresh_ops.export(series, git, primary=primary, lock_items=lock_items).changes(series.root)
    except C128Error:
        changes = ["?"]  # refresh itself will say why
    if not changes:
        return ""
    return shlex.join(["c128patch", "refresh", "--primary" if primary else "--variant", "--tree", str(git.worktree),
                       "--series", str(series.root), *layer_args(series)])


def _contract(series: Series, git: Git, base: str, head: str) -> dict:
    """The series' API contract on the rebased tree (``ops.contract``), next to the equivalence proof."""
    from c128patch.fit import contract as contract_ops

    try:
        result = contract_ops.check(series, git, base, head)
    except C128Error as exc:
        return {"ok": False, "verdict": f"not checked: {exc.message}", "failing": []}
    return {"ok": result.ok, "verdict": result.verdict(),
            "failing": [f.message for f in result.errors + result.warnings]}


def _copy_reports(state: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("rebase-report.md", "rebase-report.json"):
        if (state / name).is_file():
            shutil.copyfile(state / name, dest / name)
