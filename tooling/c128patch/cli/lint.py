"""c128patch lint [--update-hashes] [--offline] [--json]"""

from __future__ import annotations

from pathlib import Path

import click

from c128patch.cli.common import Run, exit_unless, load_stack, repo_option, say, verb_options

OFFLINE_UNCHECKED = ("--offline: the bases (each patch file's sources at its base tag), the overlays' collisions "
                     "with upstream files, the gates upstream declares and the gate audit")


@click.command("lint")
@click.option("--update-hashes", is_flag=True,
              help="Record the current sha256 of every series file in the manifest first.")
@click.option("--offline", is_flag=True,
              help="Skip the checks that need upstream (collisions with upstream files, gate audit).")
@repo_option
@verb_options
def command(update_hashes: bool, offline: bool, repo: str | None, series_dir: Path | None, layer_dirs: tuple[Path, ...],
            as_json: bool, run: Run) -> None:
    """Validate the series manifest and its files."""
    from c128patch.ops.audit import audit_series
    from c128patch.ops.lint import Finding, lint_stack
    from c128patch.ops.lint import update_hashes as record_hashes
    from c128patch.progress import reporter
    from c128patch.series.layers import describe, get_series
    from c128patch.upstream.source import open_upstream

    series = load_stack(run, series_dir, layer_dirs, repo=repo)
    if update_hashes:
        record_hashes(series)
        series = get_series(series_dir, [layer.root for layer in series.layers])
    with reporter(not as_json, title="lint") as rep:
        upstream = None if offline else open_upstream(repo, [series.base] if repo is None else [], rep)
        rep.step("the files, hashes, paths and gates of each part")
        findings = lint_stack(series, upstream.git if upstream else None)
        if upstream and not any(f.level == "error" for f in findings) and upstream.git.rev_parse(series.base):
            rep.step(f"the gate audit on {series.base}")  # on the series applied to its base
            findings += [Finding(f.file, str(f))
                         for f in audit_series(series, upstream.git, series.base, upstream.resolve(series.base))]
    errors = [f for f in findings if f.level == "error"]
    unchecked = OFFLINE_UNCHECKED if offline else ""
    if as_json:
        run.emit({"ok": not errors, "series": {"name": series.name, "version": series.version},
                   "entries": len(series.entries), "findings": [vars(f) for f in findings],
                   "unchecked": unchecked}, series)
    else:
        say(*(f"{f.level}: {f.entry}: {f.message}" for f in findings),
            f"{describe(series).removeprefix('series ')}: {len(series.entries)} entries, {len(errors)} error(s), "
            f"{len(findings) - len(errors)} warning(s)" + (f"; not checked: {unchecked}" if unchecked else ""))
    exit_unless(not errors)
