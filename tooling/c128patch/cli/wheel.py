"""c128patch wheel (--from-wheel PATH | --from-release X.Y.Z [--python-tag TAG] [--platform P]) [-o DIR] [--json]"""

from __future__ import annotations

from pathlib import Path

import click

from c128patch.cli.common import Run, check_output_dir, load_stack, say, verb_options
from c128patch.errors import C128Error


@click.command("wheel")
@click.option("--from-wheel", "from_wheel", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="An upstream sglang release wheel (.whl).")
@click.option("--from-release", "from_release", default=None, metavar="X.Y.Z",
              help="An sglang release: its wheel is taken from the wheelhouse/cache or downloaded.")
@click.option("-o", "--out-dir", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("dist"),
              show_default=True, help="Folder for the patched wheel.")
@click.option("--python-tag", "python_tag", default=None, metavar="TAG",
              help="[--from-release] The serving interpreter, e.g. cp312 (default: the running one's).")
@click.option("--platform", "platform", default=None, metavar="PLATFORM",
              help="[--from-release] The serving platform, e.g. manylinux_2_34_aarch64 (default: this machine's).")
@verb_options
def command(from_wheel: Path | None, from_release: str | None, out_dir: Path, python_tag: str | None,
            platform: str | None, series_dir: Path | None,
            layer_dirs: tuple[Path, ...], as_json: bool, run: Run) -> None:
    """Patch a released sglang wheel with the series (no rebuild): new local version, provenance, SBOM."""
    from c128patch.evidence.matrix import release_note
    from c128patch.progress import reporter
    from c128patch.series.layers import describe
    from c128patch.textsafe import some
    from c128patch.upstream.releases import WheelTarget
    from c128patch.wheel.patch import patch_from

    if (from_wheel is None) == (from_release is None):
        raise C128Error("give exactly one of --from-wheel PATH and --from-release X.Y.Z")
    if from_wheel is not None and (python_tag or platform):
        raise C128Error("--python-tag/--platform choose the wheel of --from-release; --from-wheel names it already")
    target = WheelTarget(python_tag, platform)
    check_output_dir(out_dir, "-o")
    series = load_stack(run, series_dir, layer_dirs)
    with reporter(not as_json, title="wheel") as rep:
        result = patch_from(series, from_wheel, from_release, target, out_dir, rep)
    note = release_note(series.ours, result.upstream_version)
    made = Path(result.wheel)  # others of this release there: an install line's glob (README's) takes them too
    beside = sorted(p.name for p in made.parent.glob(f"sglang-{result.upstream_version}+*.whl") if p != made)
    if as_json:
        return run.emit({"ok": True, **vars(result), "evidence_note": note, "beside": beside}, series)
    say(*(f"  applied {row['name']} ({row['file']})" for row in result.entries), f"{result.wheel}",
        f"  sglang {result.version} = {result.upstream_version} + {describe(series)} ({len(result.entries)} entries), "
        f"sha256 {result.sha256[:16]}…, {result.seconds:.1f} s",
        *filter(None, (note, result.support_note and f"note: {result.support_note}")),
        *([f"note: {made.parent} also holds {some(beside, 2)}: install this wheel by its name ({made.name}), not by "
           "a pattern"] if beside else []))
