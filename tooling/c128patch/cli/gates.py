"""c128patch gates [--markdown] [--series DIR] [--json]"""

from __future__ import annotations

from pathlib import Path

import click

from c128patch.cli.common import Run, load_stack, verb_options


@click.command("gates")
@click.option("--markdown", is_flag=True, help="Print the Markdown table docs/gates.md carries.")
@verb_options
def command(markdown: bool, series_dir: Path | None, layer_dirs: tuple[Path, ...], as_json: bool, run: Run) -> None:
    """The env reference: every variable the series adds or reads (then each layer's own, marked with the layer), its
    default, what it does, what it conflicts with."""
    from rich.table import Column, Table

    from c128patch.progress import console, table_console
    from c128patch.series.gates import render_markdown
    from c128patch.textsafe import text

    series = load_stack(run, series_dir, layer_dirs)
    entry_gates = {e.name: e.gate for e in series.entries}
    layer_of = {id(g): x.name for x in series.layers for g in x.gates}  # each layer's [[gates]]: its env reference
    gates = [*series.gates, *(g for x in series.layers for g in x.gates)]
    if as_json:
        return run.emit({"ok": True, "series": {"name": series.name, "version": series.version},
                          "gates": [{**g.to_toml(), **({"layer": layer_of[id(g)]} if id(g) in layer_of else {}),
                                     "requires": list(g.requires), "conflicts": list(g.conflicts),
                                     "entries": [e for e, gate in entry_gates.items() if gate == g.name]}
                                    for g in gates]}, series)
    if markdown:
        return console(stderr=False).print(render_markdown(gates, entry_gates, layer_of), markup=False, end="",
                                           soft_wrap=True)
    # within 100 columns, piped too (issue 37; the rows whole: --markdown, --json): its default under its name (whole),
    # what it needs or does not go with under what it does
    table = Table(Column("variable (declared by) default", no_wrap=True),
                  Column("what setting it does; needs / not with", overflow="fold"),
                  title=text(f"env reference of series {series.name} {series.version}"))  # a version's [/x]
    for g in gates:
        rel = [*(f"needs {n}" for n in g.requires), *(f"not with {n}" for n in g.conflicts)]
        by = f"{g.declared_by}, layer {layer_of[id(g)]}" if id(g) in layer_of else g.declared_by
        cells = (f"{g.name}\n({by}) {g.default} ({g.type})",
                 "\n".join([g.enables, *([g.notes] if g.notes else []), *rel]))
        table.add_row(*map(text, cells))  # plain text: [accept] is not markup
    table_console().print(table)
