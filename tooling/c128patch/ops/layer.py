"""``layer new`` and ``layer add-entry``: scaffolding a team's own layer (docs/layers.md).

``add_entry`` turns a commit of a patched branch into a layer entry: refresh's ``format_patch`` with the entry
and gate trailers, numbered after the layer's last file, its manifest row (base by content, sha256), written as
one ``series.txn``, then linted. Every refusal comes before any write."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from c128patch import procs
from c128patch.errors import C128Error
from c128patch.git import Git
from c128patch.ops.lint import Finding, lint_series
from c128patch.ops.merged import entries_making, entry_making
from c128patch.ops.refresh import base_label, bumped, format_patch, slug
from c128patch.ops.replay import FAILED, replay_in_index
from c128patch.ops.treestate import fault_point, tree_layers
from c128patch.series import txn
from c128patch.series.layers import SEP, check_layer_folder, check_layer_name, known_bases, load_layer, stack
from c128patch.series.manifest import MANIFEST, Entry, Series, load_series
from c128patch.series.paths import check_entry_name, check_relpath, confine, not_a_file
from c128patch.series.plan import sources_at
from c128patch.series.provenance import PROVENANCE_PATH, applied_layers, read_provenance
from c128patch.series.trailers import ENTRY_TRAILER
from c128patch.textsafe import shell_join

_ENV = re.compile(r"[A-Z][A-Z0-9_]{0,127}")


@dataclass
class NewEntry:
    layer: str
    entry: str  # namespaced: <layer>/<entry>
    file: str
    commit: str
    gate: str
    files: list[str]
    findings: list[Finding] = field(default_factory=list)
    took: str = ""  # why ``commit`` is not the one named (the tool's provenance record was named: the one below)
    before: str = ""  # the entry it was placed before (made by a commit above it on the branch), "": last


def new_layer(folder: Path, name: str, series: Series, base: str = "") -> Series:
    """An empty layer in ``folder`` on ``base`` (default: the series base)."""
    check_layer_name(name, "layer new --name")
    check_layer_folder(folder, "; nothing was written")  # (before the write: `layer new .git/x` wrote its manifest
    # into git's own folder, then load_layer refused it, helper 175)
    if name == series.name:  # (every verb refuses such a stack later: say so before writing anything)
        raise C128Error(f"layer new --name {name}: that is the series' own name; a layer needs its own; nothing was "
                        "written")
    confine(folder, MANIFEST, f"layer new {folder}")  # (a link at patches/: the manifest was written into its target,
    # then load_layer refused it, "nothing was written", helper 185)
    exists = f"{folder / MANIFEST} exists already: {folder} holds a layer or a series; nothing was written"
    if (folder / MANIFEST).exists():
        raise C128Error(exists)
    base = base or series.base
    if base not in known_bases(series):
        raise C128Error(f"base {base!r} is not one the series {series.name} was made on "
                        f"({', '.join(known_bases(series))}); nothing was written")
    layer = Series(folder.resolve(), name, "1", base, [])
    made = [p for p in (folder / "patches", *(folder / "patches").parents) if not os.path.lexists(p)]
    try:
        (folder / "patches").mkdir(parents=True, exist_ok=True)
        with txn.locked(folder):  # two `layer new` at once both said it was made, the first one's overwritten
            if (folder / MANIFEST).exists():
                raise C128Error(exists)
            layer.save()
    except OSError as exc:  # a file on the way, a read-only or full disk, /proc
        for path in made:  # the folders it made, empty (a full disk): taken back
            with contextlib.suppress(OSError):
                path.rmdir()
        raise C128Error(f"cannot make a layer in {folder}: {exc.strerror}; nothing was written") from None
    return load_layer(folder, series)


def _refuse_unsound(layer: Series, updated: Series, name: str, files: dict[str, bytes], sha: str,
                    replay: Callable[[Path], None]) -> None:
    """Lint the layer as ``updated`` in a scratch copy: an error about the new entry's patch file (what the commit
    changes) refuses it before anything is written (it was written, then reported, with no way back but editing the
    manifest; helper 101); then ``replay`` (``_refuse_unreplayable``) that copy."""
    for rel in files:  # (a folder or FIFO at the new patch's name: IsADirectoryError's traceback in the trial copy;
        # a link to a file: the trial copy wrote through it, outside the layer, helper 185)
        at = layer.root / rel
        if at.is_symlink() or (os.path.lexists(at) and not at.is_file()):
            what = f"is a link (to {os.readlink(at)})" if at.is_symlink() else not_a_file(at)
            raise C128Error(f"cannot add commit {sha[:12]} to layer {layer.name}: {rel} {what} "
                            f"in {layer.root} (the new entry's patch goes there: move it away); nothing was written")
    with procs.scratch("c128layer-") as tmp:
        trial = Path(tmp) / "layer"
        try:  # (a full TMPDIR, ulimit -f: "cannot write in a folder", naming none; helper 183)
            shutil.copytree(layer.root, trial, symlinks=True,
                            ignore=shutil.ignore_patterns(".git", txn.TXN, txn.STAGING))
            for rel, data in {**files, MANIFEST: updated.to_toml().encode()}.items():
                (trial / rel).write_bytes(data)
        except OSError as exc:
            why = exc.strerror or "a file could not be copied"  # (shutil.Error: none)
            raise C128Error(f"cannot add commit {sha[:12]} to layer {layer.name}: its trial copy in {tmp} cannot be "
                            f"written ({why}); nothing was written in {layer.root}; free space there (or set TMPDIR, "
                            "raise ulimit -f) and run it again") from None
        errors = [f for f in lint_series(load_series(trial)) if f.level == "error" and f.entry == name
                  and f.message.startswith(tuple(files))]  # the patch's own (a gate the layer must describe: the
        # layer is fixed after, as docs/layers.md has it)
        if errors:
            raise C128Error(f"commit {sha[:12]} cannot be an entry of layer {layer.name}: {errors[0].message} (lint); "
                            "change the commit (git commit --amend), then add it; nothing was written")
        replay(trial)


def _refuse_unreplayable(series: Series, git: Git, layer: Series, trial: Path, full: str, sha: str, base: str) -> None:
    """The stack the printed ``next`` replays (the tree's layers, this one as ``trial``; or this one alone), replayed
    at ``base``: a new entry that does not apply there is refused, naming the commits of yours below it the layer
    lacks (one made on a commit the layer does not carry was written, and the `apply` printed stopped at it)."""
    record = read_provenance(git.cwd)
    names = applied_layers(record)
    folders = [trial if n == layer.name else f for n, f in zip(names, tree_layers(git))] \
        if layer.name in names else [trial]
    with procs.scratch("c128layer-") as tmp:
        result, _ = replay_in_index(stack(series, folders), git, layer.base, base, Path(tmp) / "index",
                                    keep_index=False)
    row = next((r for r in result.entries if r.name == full), None)
    if row is None or row.status not in FAILED:
        return
    carried = set(entries_making(git, layer, git.lines("rev-list", f"{base}..{sha}^")))
    lacking = [c[:12] for c in git.lines("rev-list", "--reverse", f"{base}..{sha}^")
               if c not in carried and not _entry_of(git, c)]
    raise C128Error(f"commit {sha[:12]} does not apply on {layer.base} with the series and the layers' entries "
                    f"before it ({row.status}: {row.detail or ', '.join(row.conflicts)}); "
                    + (f"it is made on commits of yours the layer does not carry ({', '.join(lacking)}): add those "
                       "first (layer add-entry --from-commit, oldest first), then this one" if lacking else
                       "change the commit so that it does") + "; nothing was written")


def add_entry(folder: Path, series: Series, git: Git, commit: str, why: str, gate: str = "",
              name: str = "") -> NewEntry:
    """Commit ``commit`` of the patched tree in ``git`` as a new entry of the layer in ``folder``."""
    if not folder.is_dir():  # no layer there: its one line (the lock below opens the folder: a traceback)
        load_layer(folder, series)
    return _add_entry(folder, series, git, commit, why, gate, name)


@txn.serialised  # two add-entry runs on one layer: one after the other
def _add_entry(folder: Path, series: Series, git: Git, commit: str, why: str, gate: str = "",
               name: str = "") -> NewEntry:
    layer, tree = load_layer(folder, series), git.cwd
    if not why.strip() or not why.isprintable():
        raise C128Error("--why must say, on one line, why the layer carries this commit; nothing was written")
    if gate and not _ENV.fullmatch(gate):
        raise C128Error(f"--gate {gate!r} is not an environment variable name (A-Z 0-9 _); nothing was written")
    upstream = read_provenance(tree).get("upstream", {})
    base_commit, rev = upstream.get("commit", ""), upstream.get("rev", "")
    sha = git.rev_parse(f"{commit}^{{commit}}")
    if sha is None:
        raise C128Error(f"no commit {commit!r} in {tree}; nothing was written")
    sha, took = _below_provenance(git, sha, commit)
    if not base_commit or git.rev_parse(base_commit) is None:
        raise C128Error(f"the upstream base recorded in {PROVENANCE_PATH} is not in {tree}; nothing was written")
    parents = git.out("rev-list", "--parents", "-n", "1", sha).split()[1:]
    if len(parents) != 1 or not git.is_ancestor(base_commit, parents[0]) or not git.is_ancestor(sha, "HEAD"):
        raise C128Error(f"commit {sha[:12]} is not a commit of the patched branch in {tree} (one parent, above its "
                        f"upstream base {rev or base_commit[:12]}, below HEAD); nothing was written")
    label = base_label(git, base_commit, rev)
    if label != layer.base:
        # the commit goes with the tree: rebased onto the layer's base, the provenance record on top, the user's
        # commits below it in their order (the commit's id changes: named from HEAD)
        above = [c for c in git.lines("rev-list", f"{sha}..HEAD") if _entry_of(git, c) != "provenance"]
        back = shell_join(["c128patch", "rebase", "--onto", layer.base, "--tree", str(tree)])
        again = shell_join(["c128patch", "layer", "add-entry", "--layer", str(folder), "--from-commit",
                            f"HEAD~{len(above) + 1}", "--tree", str(tree), "--why", why,
                            *(["--gate", gate] if gate else []), *(["--name", name] if name else [])])
        raise C128Error(f"the tree is on {label}, the layer {layer.name} on {layer.base}: add entries on a tree at the "
                        f"layer's base; to take this commit there, rebase this tree back and add it ({back} && "
                        f"{again}); nothing was written")
    if trailer := git.out("log", "-1", f"--format=%(trailers:key={ENTRY_TRAILER},valueonly,unfold)", sha).strip():
        raise C128Error(f"commit {sha[:12]} is entry '{trailer}' already ({ENTRY_TRAILER}); nothing was written")
    if same := entry_making(git, layer, sha):
        raise C128Error(f"commit {sha[:12]} is entry '{layer.name}{SEP}{same}' of layer {layer.name} already (the "
                        "same change); nothing was written")
    name = check_entry_name(name or slug(git.out("log", "-1", "--format=%s", sha)), "layer add-entry --name")
    if any(e.name == name for e in layer.entries):
        raise C128Error(f"layer {layer.name} has an entry '{name}' already; pass --name; nothing was written")
    full = f"{layer.name}{SEP}{name}"
    touched = [p for p in git.out("diff-tree", "-r", "-z", "--name-only", "--no-commit-id", sha).split("\0") if p]
    if not touched:
        raise C128Error(f"commit {sha[:12]} changes nothing; nothing was written")
    for path in touched:
        check_relpath(path, f"commit {sha[:12]}")
    data = format_patch(git, sha, full, gate or f"none ({why})")
    number = max((int(m.group(1)) for e in layer.entries for v in e.patch_files()
                  if (m := re.match(r"^(\d+)-", v.file))), default=0) + 1
    file = f"{number:04d}-{name}.patch"
    entry = Entry(name=name, kind="patch", why=why, gate=gate, base=layer.base,
                  base_commit=base_commit if label == base_commit[:12] else "",
                  base_sources=sources_at(git, base_commit, touched), sha256=hashlib.sha256(data).hexdigest(),
                  file=file)
    version = bumped(layer.version) if layer.entries else layer.version  # a new stack: its name and version say so
    at = _place(git, layer, sha)
    updated = Series(layer.root, layer.name, version, layer.base, [*layer.entries[:at], entry, *layer.entries[at:]],
                     gates=layer.gates)
    _refuse_unsound(layer, updated, name, {f"patches/{file}": data}, sha,
                    lambda trial: _refuse_unreplayable(series, git, layer, trial, full, sha, base_commit))
    txn.commit_all([(layer.root, {layer.patches_dir / file: data, layer.manifest_path: updated.to_toml().encode()},
                     [], layer.manifest_path)], fault=lambda point: fault_point("at", point))
    return NewEntry(layer.name, full, f"patches/{file}", sha, gate, touched, lint_series(load_series(layer.root)),
                    took, f"{layer.name}{SEP}{layer.entries[at].name}" if at < len(layer.entries) else "")


def _place(git: Git, layer: Series, sha: str) -> int:
    """Where the entry of commit ``sha`` goes in the layer: before the first entry made by a commit above it on the
    branch (added first, it would be replayed before the change it is made on: `apply` stopped at it), else last."""
    above = set(entries_making(git, layer, git.lines("rev-list", f"{sha}..HEAD")).values())
    return next((i for i, e in enumerate(layer.entries) if e.name in above), len(layer.entries))


def _entry_of(git: Git, sha: str) -> str:
    """A commit's entry trailer ("provenance": the tool's record; "": a commit of the user's)."""
    return git.out("log", "-1", f"--format=%(trailers:key={ENTRY_TRAILER},valueonly,unfold)", sha).strip()


def _below_provenance(git: Git, sha: str, named: str) -> tuple[str, str]:
    """``sha``, or where it is the tool's provenance record (``--from-commit HEAD`` after a rebase, which writes it
    on top), the user's commit below it, with a line saying so; none of the user's there: refused, saying which."""
    if _entry_of(git, sha) != "provenance":
        return sha, ""
    below = sha
    while _entry_of(git, below) == "provenance" and (parent := git.rev_parse(f"{below}^")):
        below = parent
    if (entry := _entry_of(git, below)) or below == sha:
        raise C128Error(f"commit {sha[:12]} ({named}) is c128patch's provenance record, not a change of yours, and "
                        f"no commit of yours is below it (the one below is entry '{entry}'); commit your change on "
                        "the branch, then add it; nothing was written")
    subject = git.named("log", "-1", "--format=%s", below)
    return below, (f"{named} ({sha[:12]}) is c128patch's provenance record, not a change of yours: took your commit "
                   f"{below[:12]} ({subject}) below it")
