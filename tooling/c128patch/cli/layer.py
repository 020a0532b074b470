"""c128patch layer new DIR --name N [--base B] | layer add-entry --layer DIR --from-commit C [--gate ENV] --why TEXT"""

from __future__ import annotations

from pathlib import Path

import click

from c128patch.cli.common import (
    Run,
    applied_here,
    exit_unless,
    json_verb,
    locate_tree,
    say,
    series_dir_option,
    tree_option,
)


@click.group("layer")
def command() -> None:
    """Your own entries on top of the series, in a folder of the series format (docs/layers.md)."""


@command.command("new")
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
@click.option("--name", required=True, help="The layer's name (a-z 0-9, starting with a letter): in entry names "
                                            "(<name>/<entry>) and the wheel's label.")
@click.option("--base", default="", help="The release the layer is made on (default: the series base).")
@series_dir_option
@json_verb
def new(folder: Path, name: str, base: str, series_dir: Path | None, as_json: bool, run: Run) -> None:
    """Make an empty layer in FOLDER (FOLDER/patches/series.toml)."""
    from c128patch.ops.layer import new_layer
    from c128patch.series.manifest import default_series_root, load_series
    from c128patch.textsafe import shell_join

    layer = new_layer(folder, name, load_series(series_dir or default_series_root()), base)
    if as_json:
        return run.emit({"ok": True, "layer": {"name": layer.name, "version": layer.version,
                                                "base": layer.base, "path": str(layer.root)}})
    add = shell_join(["c128patch", "layer", "add-entry", "--layer", str(folder), "--from-commit", "COMMIT", "--why",
                      "WHY"])
    say(f"layer {layer.name} {layer.version} on {layer.base} in {layer.root}",
        f"  next: commit your change on a patched branch, then {add}")


@command.command("add-entry")
@click.option("--layer", "folder", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="The layer folder to add the entry to.")
@click.option("--from-commit", "commit", required=True, help="A commit of the patched branch (in --tree).")
@click.option("--why", required=True, help="Why the layer carries it (one line; the manifest's 'why').")
@click.option("--gate", default="", help="The env variable that turns the change on (default: none, always on).")
@click.option("--name", default="", help="The entry's name in the layer (default: from the commit's subject).")
@tree_option
@series_dir_option
@json_verb
def add_entry(folder: Path, commit: str, why: str, gate: str, name: str, tree: Path | None, series_dir: Path | None,
              as_json: bool, run: Run) -> None:
    """Turn a commit of the patched branch into a layer entry: format-patch --full-index, manifest
    row, hash, lint. A commit lint would refuse as an entry is refused, nothing written; the branch is not
    changed; exit 1 when the layer's lint finds an error in another entry."""
    from c128patch.git import Git
    from c128patch.ops.layer import add_entry as add
    from c128patch.ops.treestate import tree_layers
    from c128patch.series.manifest import default_series_root, load_series
    from c128patch.series.provenance import applied_layers, read_provenance
    from c128patch.textsafe import shell_join
    from c128patch.upstream.releases import release_version

    git = Git(worktree=locate_tree(tree))
    done = add(folder, load_series(series_dir or default_series_root()), git, commit, why, gate, name)
    errors = [f for f in done.findings if f.level == "error"]
    if as_json:
        run.emit({"ok": not errors, **vars(done), "findings": [vars(f) for f in done.findings]})
    else:
        lint = shell_join(["c128patch", "lint", "--layer", str(folder)])
        record = read_provenance(git.worktree)
        rev = str(record.get("upstream", {}).get("rev") or "")  # the layer's base
        carried = done.layer in applied_layers(record)
        # a tree applied with the layer takes its new entry in place (a rebase makes the commit the entry); else
        # beside the branch, which keeps the commit
        beside = git.worktree if carried else Path(f"{git.worktree}-{done.layer}")
        layers = [str(folder.resolve()) if name == done.layer else str(f)  # the tree's whole stack, this layer's
                  for name, f in zip(applied_layers(record), tree_layers(git))] if carried else [str(folder)]  # here
        stack = shell_join(["c128patch", "rebase", "--onto", rev, "--tree", str(beside),
                            *(a for f in layers for a in ("--layer", f))]
                           if carried or beside.is_dir() and applied_here(beside) else  # a first next made it
                           ["c128patch", "apply", "--sglang-rev", rev, "--layer", str(folder), "--tree", str(beside)])
        say(*([done.took] if done.took else []),
            f"entry {done.entry} ({done.file} in {folder}) from commit {done.commit[:12]}: {', '.join(done.files)}; "
            f"gate {done.gate or 'none'}"
            + (f"; placed before {done.before} (its commit is above this one on the branch)" if done.before else ""),
            *(f"  lint {f.level}: {f.entry}: {f.message}" for f in done.findings),
            *([f"  the entry is written (not again: it is one); fix the layer, then: {lint}"] if errors else
              [f"  next: {stack}"] if release_version(rev) else []))
    exit_unless(not errors)
