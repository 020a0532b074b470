"""c128patch check [--sglang-rev X ...] [--strict] [--repo R] [--json]"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from c128patch import exitcodes
from c128patch.cli.common import Run, exit_unless, load_stack, repo_option, say, verb_options

if TYPE_CHECKING:
    from c128patch.git import Git
    from c128patch.ops.check import EntryCheck, RevCheck, Verdict
    from c128patch.series.manifest import Entry, Series


def _cell(entry: Entry, e: EntryCheck) -> str:
    """What happened, then which file (the primary, or the variant of a base) and by which rule."""
    what = {"clean": "strict", "3way": "3-way (tree only)", "ledger": "ledger",  # (the names matrix and watch use)
            "whitespace": "whitespace-merged (tree only)"}.get(e.status, f"{e.status}: {e.detail}")
    what += "".join(f"\nfollowed rename {a} -> {b}" for a, b in e.renamed.items())
    what += "".join(f"\n{h}" for h in e.hints)
    if not entry.is_patch or not e.file:
        return what
    return f"{what}\n{entry.role(e.file)} ({e.chosen_by.split(':', 1)[0]})"


def _contract(series: Series, git: Git, r: RevCheck) -> dict:
    """``ops.contract`` on the series replayed at ``r`` (a rev it does not apply to is not checked)."""
    from c128patch.fit import contract

    if not r.ok:
        return {"ok": False, "verdict": "not checked: the series does not apply here", "failing": []}
    result = contract.check(series, git, r.commit, contract.patched_tree(series, git, r.rev, r.commit))
    return {"ok": result.ok, "verdict": result.verdict(),
            "failing": [f.message for f in result.errors + result.warnings]}


def _verdict(verb: str, v: Verdict | None) -> str:
    if v is None:
        return f"{verb}: no release wheel"
    if v.exit == exitcodes.OK:
        return f"{verb}: applies"
    what = "refused before anything is done" if v.exit == exitcodes.USAGE else f"stops at {v.entry}"
    detail = (f" ({v.detail})" if v.detail and v.exit == exitcodes.FAILED
              else f" ({v.entry}: {v.detail})" if v.entry else "")
    return f"{verb}: {what}{detail}, exit {v.exit}"


@click.command("check")
@click.option("--sglang-rev", "revs", multiple=True,
              help="Upstream revision(s) to check; repeat for several (default: every release the series supports).")
@click.option("--strict", is_flag=True,
              help="Exit 1 unless every entry applies with exact context, as `wheel` needs (3-way merges count as "
                   "failures).")
@click.option("--deep", is_flag=True,
              help="Also check the series' API contract on each rev it applies to (c128patch contract; no checkout); "
                   "exit 1 unless it holds.")
@repo_option
@verb_options
def command(revs: tuple[str, ...], strict: bool, deep: bool, repo: str | None, series_dir: Path | None,
            layer_dirs: tuple[Path, ...], as_json: bool, run: Run) -> None:
    """Does the series apply to each REV, and what would apply and wheel do? Nothing is checked out.
    Per entry: which file was chosen and by which rule (exact/most preimage blobs, ancestor,
    strict, primary, only)."""
    from rich.table import Table

    from c128patch.ops.check import check_upstream, exact, supported_releases
    from c128patch.progress import reporter, table_console
    from c128patch.series.layers import describe, layer_rows
    from c128patch.textsafe import text

    series = load_stack(run, series_dir, layer_dirs, repo=repo)
    revs = revs or tuple(supported_releases(series))
    with reporter(not as_json, total=len(revs), title="check") as rep:
        upstream, results, elapsed = check_upstream(series, repo, revs, rep)
        contracts: dict[str, dict] = {}
        if deep:
            rep.step("the API contract on each rev")
            contracts = {r.rev: _contract(series, upstream.git, r) for r in results}
    ok = all(r.ok and (not strict or exact(r)) for r in results) and all(c["ok"] for c in contracts.values())
    if as_json:
        run.emit({"ok": ok, "strict": strict, "seconds": round(elapsed, 4),
                   "series": {"name": series.name, "version": series.version}, "layers": layer_rows(series),
                   "revs": [{**r.to_json(), **({"contract": contracts[r.rev]} if deep else {})} for r in results]},
                  series)
        return exit_unless(ok)
    table = Table(title=text(describe(series)))  # within 100 columns, piped too (issue 37; every detail in --json)
    table.add_column("entry", no_wrap=True)  # a name whole, the cells wrapped beside it
    for r in results:
        table.add_column(text(r.rev), overflow="fold")  # a --repo rev (`^{/[/x]}`) and a version are not markup
    rows = [{row.name: row for row in r.entries} for r in results]
    for entry in series.entries:
        table.add_row(*map(text, [entry.name, *(_cell(entry, by[entry.name]) if entry.name in by else "error"
                                                 for by in rows)]))
    table_console().print(table)
    for r in results:
        c = contracts.get(r.rev)
        say(*([f"{r.rev}: {r.error}"] if r.error else []),
            f"{r.rev}: {_verdict('apply', r.apply)}; {_verdict('wheel', r.wheel)}",
            *([f"{r.rev}: note: {r.note}"] if r.note else []),
            *([f"{r.rev}: contract {c['verdict']}" + "".join(f"\n  {f}" for f in c["failing"])] if c else []))
    verdict = "all apply" + (" with exact context" if strict else "") if ok else "NOT all apply" + (
        " with exact context" if strict and all(r.ok for r in results) else "")
    if stops := [r.rev for r in results if r.ok and r.wheel is not None and r.wheel.exit != exitcodes.OK]:
        verdict += f"; the wheel stops on {', '.join(stops)} (its line above; --strict makes that an exit 1)"
    say(f"{verdict} ({elapsed:.2f} s for {len(results)} rev(s))")
    exit_unless(ok)
