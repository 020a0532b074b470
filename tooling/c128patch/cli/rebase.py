"""c128patch rebase --onto REV [--drop ENTRY ...] | --continue | --skip | --drop ENTRY | --abort [--tree DIR]"""

from __future__ import annotations

from pathlib import Path

import click

from c128patch.cli.common import Run, check_output_dir, locate_tree, repo_option, say, tree_option, verb_options
from c128patch.errors import C128Error


@click.command("rebase")
@click.option("--onto", "onto", default=None,
              help="Upstream revision to move the patched branch onto (the one it is on, with the series it has: "
                   "nothing to do).")
@click.option("--continue", "cont", is_flag=True, help="Go on after resolving (and staging) a conflict.")
@click.option("--skip", is_flag=True, help="Drop the entry that stopped the rebase.")
@click.option("--abort", is_flag=True, help="Restore the branch as it was before the rebase.")
@click.option("--drop-merged", is_flag=True,
              help="Drop entries found merged upstream (they are listed, never dropped silently).")
@click.option("--drop", "drop", multiple=True, metavar="ENTRY",
              help="Drop ENTRY as merged upstream (recorded with merged_in; refresh keeps it so): with --onto, "
                   "from the start; alone, the entry the rebase stopped at.")
@click.option("--report", "report_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Also write rebase-report.md/.json here.")
@tree_option
@repo_option
@verb_options
def command(onto: str | None, cont: bool, skip: bool, abort: bool, drop_merged: bool, drop: tuple[str, ...],
            report_dir: Path | None, tree: Path | None, repo: str | None, series_dir: Path | None,
            layer_dirs: tuple[Path, ...], as_json: bool, run: Run) -> None:
    """Move the patched branch onto another upstream rev: each entry replays the file the series
    chooses there, your edits are carried, the result is proven equal to a fresh apply."""
    from rich.table import Column, Table

    from c128patch.cli.common import load_stack, recorded_layers_said
    from c128patch.fit.contract import lock_items
    from c128patch.fit.rebase_flow import rebase, said_finished, series_of
    from c128patch.git import Git
    from c128patch.ops.refresh import refresh_command
    from c128patch.progress import table_console
    from c128patch.textsafe import count, one_line, text

    chosen = [n for n, on in (("onto", onto), ("continue", cont), ("skip", skip), ("abort", abort),
                              ("drop", drop and not onto)) if on]
    if len(chosen) != 1:
        raise C128Error("give exactly one of --onto REV, --continue, --skip, --drop ENTRY, --abort")
    if drop and not onto and len(drop) != 1:
        raise C128Error("at a stop, --drop names one entry: the one the rebase stopped at")
    git = Git(worktree=locate_tree(tree))
    if report_dir is not None:
        check_output_dir(report_dir, "--report")
    stack = None
    if onto:
        stack = load_stack(run, series_dir, layer_dirs, git.worktree, repo)
        layer_dirs = tuple(layer.root for layer in stack.layers)
    elif not abort:  # the journal's layers (or those named): said as --onto says them
        stack = recorded_layers_said(run, series_of(git, "continue", series_dir, layer_dirs))
    verb = chosen[0]  # (``chosen`` is a column's below)
    done = rebase(git, verb, onto=onto or "", repo=repo, drop_merged=drop_merged,  # type: ignore[arg-type]
                  drop=drop, series_dir=series_dir, layer_dirs=layer_dirs, report_dir=report_dir, stack=stack)
    report = done.report
    if as_json:  # where the layers came from (docs/schemas); no refresh_command: it replays the series again
        return run.emit(report, stack if onto else done.series)
    if report.get("already_on"):
        return say(f"{git.worktree}: {report['branch'] or 'HEAD'} is already on {report['rev']} + {report['stack']} "
                   f"(at {report['head'][:12]}): nothing to do" + ("; no report written" if report_dir else ""))
    if report.get("aborted"):
        return say(f"rebase aborted: {report['branch'] or 'HEAD'} is back at {report['head'][:12]}"
                   + (f"; your uncommitted work is in stash {report['stash'][:12]}" if report["stash"] else ""))
    old, new = one_line(report["old_base"]["rev"]), one_line(report["new_base"]["rev"])  # a tree's journal: data
    table = Table(Column("entry", no_wrap=True), *(Column(h, overflow="fold") for h in ("status", "file (chosen by)",
                                                                                       "detail")),
                  title=text(f"rebase {old} -> {new} ({report['direction']}, "
                             f"{count(report['upstream_commits_between'], 'upstream commit')} added, "
                             f"{len(report['upstream_commits_removed'])} left behind)"))
    ours = {entry.name: entry for entry in done.series.entries}  # a file named as check names it (the path: --json)
    for e in report["entries"]:
        detail = e["detail"] + (f" [{', '.join(e['ledger'])}]" if e["ledger"] else "")
        detail += " [your edit carried]" if e.get("edit_from") else ""
        entry, chosen = ours.get(e["name"]), e.get("chosen_by", "").split(":", 1)[0]
        file = e["kind"] if not e.get("file") else chosen if entry and not entry.is_patch else \
            f"{entry.role(e['file']) if entry else e['file']} ({chosen})"
        table.add_row(*map(text, (e["name"], e["status"], file, detail)))
    table_console().print(table)  # within 100 columns, piped too (issue 37; every detail in --json)
    contract, renamed = report["contract"], report.get("renamed_branch")
    with said_finished(git, verb):  # the rebase is done: a signal in the refresh check is no "no outcome"
        nxt, note = refresh_command(git, done.series, report, lock_items)
    say(one_line(report["equivalence"]["summary"]), f"contract on {new}: {contract['verdict']}"
        + "".join(f"\n  {f}" for f in contract["failing"]),
        *([f"branch {renamed['from']} is now {renamed['to']} (the old tip: {report['recovery_ref']})"]
          if renamed else []),
        *([f"branch {report['branch']} keeps its name, which names {old}"
           + (f" ({report['branch_name_taken']} is another branch already, left as it is)"
              if report.get("branch_name_taken") else "")
           + f"; to rename it: {report['branch_keeps_name']}"] if report.get("branch_keeps_name") else []),
        one_line(f"report: {done.report_md}" + (f"; next: {nxt}" if nxt else f"; note: {note}" if note else
                                                "; the series is up to date (refresh --check changes nothing)")))
