"""c128patch build --sglang-rev X [--repo R] [--tree DIR] [-o DIR] [--base-version V] [--no-isolation] [--json]"""

from __future__ import annotations

from pathlib import Path

import click

from c128patch.cli.common import Run, check_output_dir, load_stack, repo_option, say, verb_options


@click.command("build")
@click.option("--sglang-rev", "rev", required=True, help="Upstream revision: a tag or, with --repo, any commit-ish.")
@repo_option
@click.option("--tree", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Working tree to patch and build (as for apply; default ./sglang, or the --repo clone itself).")
@click.option("-o", "--out-dir", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("dist"),
              show_default=True, help="Folder for the built wheel.")
@click.option("--base-version", default=None, help="Upstream version to build as (default: from the rev's vX.Y.Z tag).")
@click.option("--no-isolation", is_flag=True,
              help="Pass --no-isolation to python -m build (build dependencies must be installed).")
@verb_options
def command(rev: str, repo: str | None, tree: Path | None, out_dir: Path, base_version: str | None,
            no_isolation: bool, series_dir: Path | None, layer_dirs: tuple[Path, ...], as_json: bool, run: Run) -> None:
    """Source-build a patched sglang wheel (PEP 517), for commits that have no release wheel.

    Applies the series first unless the tree already is REV + this series; the wheel gets the same
    version label, provenance and SBOM as `c128patch wheel`.

    It runs the target tree's build backend (its code) in the sealed box (fit/sandbox.py): scrubbed
    environment, HOME a scratch folder, writes only to its build folder; the network and your pip
    settings only with build isolation (not with --no-isolation)."""
    from c128patch.fit.build_box import run_build
    from c128patch.progress import reporter
    from c128patch.upstream.source import open_upstream
    from c128patch.wheel.srcbuild import build_wheel

    check_output_dir(out_dir, "-o")
    series = load_stack(run, series_dir, layer_dirs, tree, repo)
    with reporter(not as_json, title="build") as rep:
        upstream = open_upstream(repo, [rev], rep)
        result = build_wheel(series, upstream, rev, tree, out_dir, runner=run_build, base_override=base_version,
                             no_isolation=no_isolation, reporter=rep)
    if as_json:
        return run.emit({"ok": True, **vars(result)}, series)
    say(str(result.wheel), f"  sglang {result.version} built from {result.tree} ({rev} = "
                           f"{result.upstream_commit[:12]}) in {result.seconds:.0f} s")
