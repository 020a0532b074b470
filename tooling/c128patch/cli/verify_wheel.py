"""c128patch verify-wheel WHEEL [--series DIR] [--upstream-wheel PATH | --no-authenticity] [--compile-all] [--json]"""

from __future__ import annotations

from pathlib import Path

import click

from c128patch.cli.common import Run, json_verb, say


@click.command("verify-wheel")
@click.argument("wheel", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--series", "series_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Also require the wheel to be made from exactly this series (patches/series.toml in DIR).")
@click.option("--upstream-wheel", "upstream_wheel", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The upstream wheel the provenance pins (default: the wheelhouses/cache, else downloaded).")
@click.option("--no-authenticity", "no_authenticity", is_flag=True,
              help="Skip the comparison with the upstream wheel (integrity checks only; nothing proves the "
                   "untouched files are upstream's).")
@click.option("--compile-all", is_flag=True,
              help="Compile every .py of the wheel, not only the ones the series touches.")
@click.option("--layer", "layer_dirs", multiple=True, type=click.Path(file_okay=False, path_type=Path),
              help="Also require the wheel to be made with this layer folder, after the series, in the order given; "
                   "repeatable (only those given: $C128PATCH_LAYERS and c128patch.toml are not read here; without "
                   "--series or --layer, the layers its provenance declares; docs/layers.md).")
@json_verb
def command(wheel: Path, series_dir: Path | None, layer_dirs: tuple[Path, ...], upstream_wheel: Path | None,
            no_authenticity: bool, compile_all: bool, as_json: bool, run: Run) -> None:
    """Check a patched wheel: RECORD, version, SBOM vs provenance, every entry's effect present, and
    (unless --no-authenticity) that it is exactly its upstream wheel plus the declared diffs.

    Exit 0 when everything matches, 1 at the first mismatch (named), 2 for bad input or when
    authenticity cannot be checked (no upstream wheel at hand)."""
    from c128patch.errors import C128Error
    from c128patch.series.layers import stack
    from c128patch.series.manifest import default_series_root, load_series
    from c128patch.wheel.verify import verify_wheel

    if no_authenticity and upstream_wheel is not None:
        raise C128Error("--upstream-wheel is for the authenticity check, which --no-authenticity skips")
    # with --series/--layer: made from exactly that series (or this tool's) and these layers; without,
    # a wheel claiming this tool's series by name and version must carry it
    ours = load_series(series_dir or default_series_root())
    series = stack(ours, layer_dirs) if series_dir is not None or layer_dirs else None
    run.stack = series  # its layers in an error object too
    result = verify_wheel(wheel, series, compile_all, authenticity=not no_authenticity, upstream_wheel=upstream_wheel,
                          known=ours)
    if as_json:
        return run.emit(vars(result), series)
    from c128patch.textsafe import one_line as o  # the wheel's strings: one line each, never a line of ours

    s, u, a = result.series, result.upstream, result.authenticity
    say(f"{wheel.name}: OK",
        f"  sglang {result.version} = upstream {o(u.get('version'))} + series {o(s.get('name'))} "
        f"{o(s.get('version'))} ({o(str(s.get('digest', ''))[:12])}); {result.files} files match RECORD; "
        f"{result.compiled} .py compiled",
        *(f"  + layer {o(layer['name'])} {o(layer['version'])} ({o(str(layer['digest'])[:12])})"
          for layer in result.layers),
        *(f"  {o(row['name'])} ({o(row['kind'])}): present" for row in result.entries),
        f"  authenticity NOT checked (--no-authenticity): nothing proves the files no entry touches are upstream's, "
        f"among them {_unvouched(result.unvouched)}" if a is None else
        f"  authentic: {a['identical']} files byte-identical to upstream's {a['upstream_wheel']} "
        f"({a['found']}), {a['derived']} made by the declared diffs")


def _unvouched(names: list[str]) -> str:
    """The members authenticity alone vouches for, as one phrase: the .dist-info files by name, compiled modules
    counted."""
    from c128patch.textsafe import one_line

    meta = [one_line(n.split(".dist-info/", 1)[1]) for n in names if ".dist-info/" in n]
    compiled = len(names) - len(meta)
    return ", ".join([*meta, f"{compiled} compiled module(s)"])
