"""c128patch audit [--sglang-rev X ...] [--repo R] [--json]"""

from __future__ import annotations

from pathlib import Path

import click

from c128patch.cli.common import Run, exit_unless, load_stack, repo_option, say, verb_options


@click.command("audit")
@click.option("--sglang-rev", "revs", multiple=True,
              help="Upstream revision(s) to audit on (default: the series base).")
@repo_option
@verb_options
def command(revs: tuple[str, ...], repo: str | None, series_dir: Path | None, layer_dirs: tuple[Path, ...],
            as_json: bool, run: Run) -> None:
    """Gate audit: statements a gated entry adds with side effects must run only under its env gate."""
    from c128patch.ops.audit import RULES, audit_series
    from c128patch.progress import reporter
    from c128patch.series.layers import layer_rows
    from c128patch.series.plan import validate_files
    from c128patch.upstream.source import open_upstream

    series = load_stack(run, series_dir, layer_dirs, repo=repo)
    validate_files(series)
    revs = revs or (series.base,)
    rows = []
    with reporter(not as_json, total=len(revs), title="audit") as rep:
        upstream = open_upstream(repo, list(revs), rep)
        for rev in revs:
            rep.step(f"auditing on {rev}")
            rows.append((rev, audit_series(series, upstream.git, rev, upstream.resolve(rev))))
    ok = not any(f for _, f in rows)
    if as_json:
        run.emit({"ok": ok, "rules": [r.name for r in RULES],
                   "revs": [{"rev": rev, "findings": [f.__dict__ for f in fs]} for rev, fs in rows]}, series)
    else:
        gated = [e.name for e in series.entries if e.gate]
        per = "".join(f", {len(set(r['entries']) & set(gated))} of layer {r['name']}" for r in layer_rows(series))
        say(*(f"{rev}: {f} (entry {f.entry})" for rev, fs in rows for f in fs),
            f"gate audit ({', '.join(r.name for r in RULES)}) of {len(gated)} gated entries{per} on {', '.join(revs)}: "
            f"{'clean' if ok else 'FINDINGS'}")
    exit_unless(ok)
