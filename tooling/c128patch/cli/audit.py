"""c128patch audit [--sglang-rev X ...] [--repo R] [--json]"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from c128patch import exitcodes
from c128patch.cli.common import emit_json, handles_errors, json_option, repo_option, series_option


@click.command("audit")
@click.option("--sglang-rev", "revs", multiple=True,
              help="Upstream revision(s) to audit on (default: the series base).")
@repo_option
@series_option
@json_option
@handles_errors
def command(revs: tuple[str, ...], repo: str | None, series_dir: Path | None, layer_dirs: tuple[Path, ...],
            as_json: bool) -> None:
    """Gate audit: statements a gated entry adds with side effects must run only under its env gate."""
    from c128patch.ops.audit import RULES, audit_series
    from c128patch.progress import console, reporter
    from c128patch.series.layers import get_series, layer_rows
    from c128patch.series.plan import validate_files
    from c128patch.textsafe import plain
    from c128patch.upstream.source import open_upstream

    series = get_series(series_dir, layer_dirs)
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
        emit_json({"ok": ok, "rules": [r.name for r in RULES],
                   "revs": [{"rev": rev, "findings": [f.__dict__ for f in fs]} for rev, fs in rows]})
    else:
        out = console(stderr=False)
        for rev, f in ((rev, f) for rev, fs in rows for f in fs):
            out.print(plain(f"{rev}: {f.file}:{f.line}: [{f.rule}] {f.message} (entry {f.entry})"), markup=False)
        gated = [e.name for e in series.entries if e.gate]
        per = "".join(f", {len(set(r['entries']) & set(gated))} of layer {r['name']}" for r in layer_rows(series))
        out.print(f"gate audit ({', '.join(r.name for r in RULES)}) of {len(gated)} gated entries{per} on "
                  f"{', '.join(revs)}: {'clean' if ok else 'FINDINGS'}", markup=False)
    if not ok:
        sys.exit(exitcodes.FAILED)
