"""c128patch verify-wheel WHEEL [--series DIR] [--compile-all] [--json]"""

from __future__ import annotations

from pathlib import Path

import click

from c128patch.cli.common import emit_json, handles_errors, json_option


@click.command("verify-wheel")
@click.argument("wheel", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--series", "series_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Also require the wheel to be made from exactly this series (patches/series.toml in DIR).")
@click.option("--compile-all", is_flag=True, help="Compile every .py of the wheel, not only the ones the series touches.")
@json_option
@handles_errors
def command(wheel: Path, series_dir: Path | None, compile_all: bool, as_json: bool) -> None:
    """Check a patched wheel: RECORD, version, SBOM vs provenance, every entry's effect present.

    Exit 0 when everything matches, 1 at the first mismatch (named), 2 for bad input."""
    from c128patch.progress import console
    from c128patch.series.manifest import load_series
    from c128patch.wheel.verify import verify_wheel

    series = load_series(series_dir) if series_dir is not None else None
    result = verify_wheel(wheel, series, compile_all)
    if as_json:
        emit_json(result.to_json())
        return
    out = console(stderr=False)
    s, u = result.series, result.upstream
    out.print(f"{wheel.name}: OK", markup=False)
    out.print(f"  sglang {result.version} = upstream {u.get('version')} + series {s.get('name')} {s.get('version')} "
              f"({str(s.get('digest', ''))[:12]}); {result.files} files match RECORD; {result.compiled} .py compiled",
              markup=False)
    for row in result.entries:
        out.print(f"  {row['name']} ({row['kind']}): present", markup=False)
