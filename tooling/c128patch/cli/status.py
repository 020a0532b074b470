"""c128patch status [--tree DIR] [--prove] [--json]"""

from __future__ import annotations

from pathlib import Path

import click

from c128patch.cli.common import DEFAULT_TREE, Run, exit_unless, locate_tree, say, tree_option, verb_options
from c128patch.errors import C128Error


@click.command("status")
@tree_option
@click.option("--prove", is_flag=True, help="Prove the tree again even where the recorded proof still holds.")
@verb_options
def command(tree: Path | None, prove: bool, series_dir: Path | None, layer_dirs: tuple[Path, ...],
            as_json: bool, run: Run) -> None:
    """Which series is applied on which upstream rev, and what changed since.

    Exit 0 when the tree equals a fresh apply of the series (HEAD proven identical, nothing uncommitted);
    1 when it does not (edits on the branch, uncommitted changes, an apply or rebase stopped or running,
    or nothing to prove against); 2 on an error. The proof apply or an earlier status recorded is read while
    HEAD, the series, the upstream and the tool are unchanged; else (or with --prove) the series is replayed.
    """
    from c128patch.cli.common import load_stack
    from c128patch.git import Git
    from c128patch.ops.status import patched_branches, tree_status
    from c128patch.textsafe import one_line, shell_join

    root = locate_tree(tree)
    unloaded = ""  # why the series the tree is compared with could not be loaded (its layer folder moved, say)
    try:
        series = load_stack(run, series_dir, layer_dirs, root)  # ./sglang from above: its layers
    except C128Error as exc:
        if series_dir or layer_dirs:  # named: a folder that is not one is the user's to fix, not silently dropped
            raise
        series, unloaded = None, exc.message
    try:
        info = tree_status(Git(worktree=root), series, prove_again=prove)
    except C128Error as exc:
        if exc.message.startswith("no c128patch series is applied") and (held := patched_branches(Git(worktree=root))):
            exc.hint = (f"HEAD is not a patched commit; branch {held[0]} is: "  # (a checkout below the record)
                        + shell_join(["git", "-C", str(root), "checkout", held[0]]))
        elif tree is None and exc.hint is None:
            exc.hint = (f"`c128patch apply` makes its tree in ./{DEFAULT_TREE} (or --tree DIR): run status there, "
                        "or pass --tree DIR")
        raise
    if unloaded:
        info["series_error"] = unloaded
    refs = info.get("recovery_refs") or []
    again = ["c128patch", "rebase", "--onto", str(info.get("upstream", {}).get("rev") or ""), "--tree", str(root),
             *(["--series", str(series_dir)] if series_dir else []), *(a for d in layer_dirs for a in ("--layer", d))]
    if as_json:
        run.emit(info, series)
    elif lines := [*_state(info), *(_applied(info, shell_join(map(str, again)), _own_layers(root, series, info)
                                            if info.get("series_current", {}).get("layers_differ") else "")
                                    if "series" in info else []),
                   *([f"  recovery refs (where HEAD was before an apply or rebase; newest first, {len(refs)}):"]
                     [:len(refs)]), *(f"    {r['ref']} {r['commit'][:12]} {r['subject']}" for r in refs[:10])]:
        say(*map(one_line, lines))  # each a line: what the tree's provenance and its commits say is data
    exit_unless(info.get("equals_series"))


def _state(info: dict) -> list[str]:
    """An index lock left over, an operation running or stopped."""
    tree, lock, lines = info["tree"], info.get("index_lock"), []
    if lock and not info.get("running"):
        lines += [f"{tree}: {lock['path']} is left over from a killed git or c128patch run; git refuses to write the "
                  "index while it is there. If no git command is running in this tree, clear it first:",
                  f"  clear:  {lock['clear']}"]
    if info.get("running"):
        r = info["running"]
        lines.append(f"{tree}: a c128patch {r['action']} is running (pid {r['pid']}, since {r['since']})")
    elif info.get("apply"):
        a = info["apply"]
        lines += [f"{tree}: {a['summary']}", f"  resume: {a['resume']}", f"  undo:   {a['undo']}"]
    if info.get("rebase"):
        r = info["rebase"]
        lines.append(f"{tree}: c128patch rebase {r['from']} -> {r['onto']} in progress, {r['done']}/{r['total']} "
                     "entries done" + (f", stopped at {r['current_entry']} ({r['paused']})" if r["paused"] else ""))
        lines += [f"  {label + ':':7} {r[label]}" for label in ("resume", "skip", "undo") if r[label]]
    return lines


def _own_layers(root: Path, series: object, info: dict) -> str:
    """Where the layers in effect leave out or reorder the tree's: what says so, with the status that takes the tree's
    own (a rebase with them would rewrite the tree's stack: its layer entries carried as commits of the user's)."""
    from c128patch.git import Git
    from c128patch.ops.treestate import tree_layers
    from c128patch.series.layers import describe
    from c128patch.textsafe import shell_quote

    origin = getattr(series, "origin", "") or "nowhere"
    try:
        folders = tree_layers(Git(worktree=root))
    except C128Error:
        folders = ()
    named = " ".join(shell_quote(str(a)) for f in folders for a in ("--layer", f))
    theirs = " + ".join(f"layer {r.get('name')} {r.get('version')}" for r in info.get("layers", [])) or "none"
    return (f"the layers in effect ({describe(series).partition(' + ')[2] or 'none'}, from {origin}) differ from the "
            f"tree's ({theirs}): a rebase with them would carry the tree's layer entries as commits of yours, so none "
            "is proposed" + (f"; the tree against its own: c128patch status --tree {shell_quote(str(root))} {named}"
                             if folders else "")
            + ("" if origin in ("--layer", "nowhere") else f"; or make {origin} name the tree's layers first"))


def _applied(info: dict, again: str, own: str = "") -> list[str]:
    """``again``: the command that takes the series as it is now onto the rev the tree is on; ``own``: what
    ``_own_layers`` says where the layers in effect are not the tree's."""
    from c128patch.textsafe import count

    s, u = info["series"], info["upstream"]
    ours = [e for e in info["entries"] if "/" not in e["name"]]  # a layer's are <layer>/<entry>, counted below
    lines = [f"{info['tree']} on {info['branch'] or 'detached HEAD'}",
             f"  series {s.get('name')} {s.get('version')} ({count(len(ours), 'entry')}) on upstream "
             f"{u.get('rev')} ({str(u.get('commit', ''))[:12]})"]
    lines += [f"  + layer {layer.get('name')} {layer.get('version')} ({count(len(layer.get('entries', [])), 'entry')})"
              for layer in info.get("layers", [])]
    cur = info.get("series_current")
    lines += [f"  not compared with a series: {why}" for why in [info.get("series_error")] if why]
    if cur and cur.get("layers_differ"):
        lines.append(f"  {own}")
    elif cur and not cur["up_to_date"]:
        lines.append(f"  the series has changed since (now {cur.get('stack') or cur['version']}): to take it here, "
                     f"next: {again}")
    if info["commits_since"]:
        lines.append(f"  {info['commits_since']} commit(s) on top of the applied series")
    proof, uncommitted = info.get("equivalence"), info.get("uncommitted") or []
    if proof:
        if proof["identical"] and uncommitted:
            verdict = "HEAD equals the series, the working tree does not (uncommitted changes)"
        elif proof["identical"] and info["drift"]:  # the commits since the apply make it so: not as applied
            verdict = "HEAD equals the series by its files, through commit(s) made since the apply"
        else:
            verdict = "equals the series" if proof["identical"] else "differs"
        lines.append(f"  {verdict}: {proof['summary']} ({info['proof']} proof)")
    if uncommitted:
        from c128patch.textsafe import some

        lines.append(f"  uncommitted: {some(uncommitted, 5)}")
    if not info["drift"]:
        lines.append("  no drift: patched and overlaid files are as applied")
    loose = set(uncommitted)
    for d in info["drift"]:  # a file only commits on the branch changed is the user's work, not drift
        for committed, files in ((False, {p: h for p, h in d["files"].items() if p in loose}),
                                 (True, {p: h for p, h in d["files"].items() if p not in loose})):
            if files:
                lead = f"changed by the commit(s) on top, in {d['entry']}" if committed else f"drift in {d['entry']}"
                lines.append(f"  {lead}: " + ", ".join(f"{p} ({how})" for p, how in files.items()))
    return lines

