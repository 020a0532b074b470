"""``lint``: is the manifest sound? Files, hashes, patch syntax, paths, collisions."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import PurePosixPath

from c128patch.errors import C128Error
from c128patch.git import Git
from c128patch.series import txn
from c128patch.series.contract import read_lock
from c128patch.series.gates import ENVIRON_PATH, SeriesText, declaration_problems, declarations, gate_problems
from c128patch.series.ledger import Ledger
from c128patch.series.manifest import Entry, Series, Variant, hash_mismatch, load_series, sha256_file
from c128patch.series.patchfile import read_patch
from c128patch.series.paths import not_a_file, symlink_on_path
from c128patch.series.plan import base_holding, merged_entries, prefixes, sources_at, symlink_refusal, tree_modes
from c128patch.series.trailers import GATE_TRAILER

OVERLAY_ROOTS = ("csrc", "overlay")
TREE_ROOT = "python"


@dataclass
class Finding:
    entry: str
    message: str
    level: str = "error"


def _file_findings(series: Series, e: Entry, variant: Variant | None, patched: dict[str, str]) -> list[Finding]:
    """What is wrong with one file of entry ``e`` (a patch file's paths go into ``patched``)."""
    path = series.file_of(e, variant)
    rel = path.relative_to(series.root)
    if not path.is_file():
        return [Finding(e.name, f"{rel} {not_a_file(path)}")]
    found = []
    if symlink_on_path(series.root, path) is not None:
        found.append(Finding(e.name, f"{rel} is (or goes through) a symlink"))
    want = variant.sha256 if variant else e.sha256
    if not want:
        found.append(Finding(e.name, f"{rel} has no sha256 in the manifest"))
    elif why := hash_mismatch(path, want):
        found.append(Finding(e.name, f"{rel}: {why}"))
        if not why.startswith("sha256"):  # (its parse would call it corrupt for each '\r')
            return found
    if variant is None:
        return found
    try:
        info = read_patch(path)
    except C128Error as exc:
        return [*found, Finding(e.name, exc.message)]
    if refusal := symlink_refusal(e, str(rel), info):
        found.append(Finding(e.name, refusal.split(": ", 1)[1]))
    if (info.trailers.get(GATE_TRAILER) or " ").split()[:1] != [e.gate or "none"]:
        found.append(Finding(e.name, f"{rel}: header must say '{GATE_TRAILER}: {e.gate or 'none (<why>)'}'"))
    for f in info.files:
        if not f.startswith(f"{TREE_ROOT}/"):
            found.append(Finding(e.name, f"{rel} touches {f}, outside {TREE_ROOT}/"))
        patched.setdefault(f, e.name)
    return found


def lint_series(series: Series, upstream: Git | None = None) -> list[Finding]:
    """Every finding about the series; an empty list means it is sound."""
    found: list[Finding] = []
    targets: dict[str, str] = {}
    patched: dict[str, str] = {}
    for e in series.entries:
        for variant in e.patch_files() if e.is_patch else [None]:
            found += _file_findings(series, e, variant, patched)
        if not e.is_patch:  # where the overlay installs from and to (``targets``: the overlays before it)
            if PurePosixPath(e.source).parts[0] not in OVERLAY_ROOTS:
                found.append(Finding(e.name, f"overlay source {e.source} must live under csrc/ or overlay/"))
            if not e.target.startswith(f"{TREE_ROOT}/"):
                found.append(Finding(e.name, f"overlay target {e.target} is outside {TREE_ROOT}/"))
            if e.target in targets:
                found.append(Finding(e.name, f"overlay target {e.target} collides with entry '{targets[e.target]}'"))
            targets[e.target] = e.name
        elif len({v.base for v in e.patch_files()}) != len(e.patch_files()):
            found.append(Finding(e.name, "two patch files of this entry share a base"))
    found += [Finding(name, f"overlay target {target} is also patched by entry '{patched[target]}'")
              for target, name in targets.items() if target in patched]
    if not any(f.level == "error" for f in found):  # the files are sound: read what they write
        text = SeriesText()  # the lines every patch file adds (all variants) and every overlay source, per entry
        for e in series.entries:
            if e.is_patch:
                text.added[e.name] = [line for v in e.patch_files() for line in read_patch(series.file_of(e, v)).added]
            else:
                text.overlays[e.name] = series.file_of(e).read_text(errors="replace")
        found += [Finding(where, message) for where, message in
                  gate_problems(series.gates, {e.name: e.gate for e in series.entries}, text)]
    if upstream is not None:
        found += _upstream_collisions(series, upstream) + _upstream_gates(series, upstream)
        found += _variant_bases(series, upstream) + _merged_at_a_base(series, upstream)
    return found


def _merged_at_a_base(series: Series, git: Git) -> list[Finding]:
    """A ``merged_in`` commit that a base of the entry's own files contains: upstream did not hold the entry there
    (its file changes something there). ``merged_entries`` ignores it, so no wheel loses the entry; an error here,
    as a hand edit (or an older refresh after a backward rebase's skip) wrote what cannot be true."""
    found = []
    for e in (e for e in series.entries if e.merged_in):
        commit = git.rev_parse(e.merged_in)
        if commit is not None and (label := base_holding(git, e, commit)):
            found.append(Finding(e.name, f"merged_in = {e.merged_in[:12]} is in {label}, a release this entry has a "
                                         "file made on: upstream does not hold it there (apply, check and wheel "
                                         "ignore it); remove the merged_in line from series.toml"))
    return found


def _upstream_gates(series: Series, git: Git) -> list[Finding]:
    """Each upstream gate of the env reference as upstream's environ.py declares it at the series base."""
    blob = git.blob(series.base, ENVIRON_PATH) if series.base and git.rev_parse(series.base) else None
    if blob is None:
        return []
    declared = declarations(blob.decode(errors="replace"))
    return [Finding(g.name, p) for g in series.gates if g.declared_by == "upstream"
            for p in declaration_problems(g, declared, f"{ENVIRON_PATH} at {series.base}")]


def _variant_bases(series: Series, git: Git) -> list[Finding]:
    """Each patch file's base, in this repository, holds the sources the manifest records (by content)."""
    found = []
    for e, v in ((e, v) for e in series.entries for v in e.patch_files()):
        at = ((git.rev_parse(f"refs/tags/{v.base}") if v.base else None)
              or (git.rev_parse(v.commit) if v.commit else None))
        if at is None:
            found.append(Finding(e.name, f"{v.file}: base {v.base} is not in the upstream repository: not checked",
                                 "warning"))
            continue
        if not v.sources:
            found.append(Finding(e.name, f"{v.file}: base {v.base} has no recorded sources (a manifest from before "
                                         "bases by content; `c128patch refresh` records them): not checked", "warning"))
            continue
        here = dict(sources_at(git, at, [p for p, _ in v.sources]))
        if other := [p for p, blob in v.sources if here.get(p) != blob]:
            found.append(Finding(e.name, f"{v.file}: {v.base} in this repository has other sources than the variant "
                                         f"was made on: {', '.join(other)}"))
    return found


def _upstream_collisions(series: Series, git: Git) -> list[Finding]:
    base = series.base
    if not base or git.rev_parse(base) is None:
        return [Finding("series", f"series base {base!r} is not in the upstream repository", "warning")]
    merged = {e.name for e in merged_entries(series, git, git.rev_parse(base) or base)}
    overlays = [e for e in series.entries if not e.is_patch and e.name not in merged]  # upstream's own now
    present = tree_modes(git, base, prefixes([e.target for e in overlays]))
    found = []
    for e in overlays:
        if e.target in present:
            found.append(Finding(e.name, f"overlay target {e.target} already exists upstream at {base}"))
        found += [Finding(e.name, f"overlay target {e.target} goes through the symlink {prefix} upstream")
                  for prefix in prefixes([e.target]) if present.get(prefix) == "120000"]
    return found


def lint_stack(series: Series, upstream: Git | None = None) -> list[Finding]:
    """``lint_series`` of each part (a layer's as ``<layer>/<entry>``), plus overlay collisions across parts."""
    found = lint_series(series.ours, upstream)
    for layer in series.layers:
        found += [replace(f, entry=f"{layer.name}/{f.entry}") for f in lint_series(layer, upstream)]
    for part in (series.ours, *series.layers):
        # a symlinked, non-UTF-8 or malformed contract lock; the ledger's rows as rebase reads them (an entry or a
        # file that leaves, a bad key: lint passed them, found only where a rebase used the row), and their diffs
        for read in (lambda: read_lock(part.patches_dir), lambda: Ledger(part).diffs()):
            try:
                read()
            except C128Error as exc:
                found.append(Finding(part.name, exc.message))
    targets: dict[str, str] = {}
    for e in (e for e in series.entries if not e.is_patch):  # (within one part, lint_series said so already)
        other = targets.setdefault(e.target, e.name)
        if series.part(other)[0] is not series.part(e.name)[0]:
            found.append(Finding(e.name, f"overlay target {e.target} collides with entry '{other}'"))
    return found


def update_hashes(series: Series) -> int:
    """Write the current sha256 of every file into its manifest; returns how many changed. Each part is read again and
    written under its folder's lock (``txn.locked``: `layer add-entry` and `refresh` write under it; a manifest read
    before it was taken would write back over an entry another writer added meanwhile)."""
    if series.layers:
        return sum(update_hashes(part) for part in (series.ours, *series.layers))
    with txn.locked(series.root):
        return _update_hashes(load_series(series.root))


def _update_hashes(series: Series) -> int:
    def hashes() -> list[str]:
        return [h for e in series.entries for h in (e.sha256, *(v.sha256 for v in e.variants))]

    before = hashes()
    for e in series.entries:
        try:
            e.variants = [replace(v, sha256=sha256_file(series.file_of(e, v))) for v in e.variants]
            e.sha256 = sha256_file(series.file_of(e))
        except OSError as exc:  # (a file the manifest names gone: FileNotFoundError's traceback)
            raise C128Error(f"{series.manifest_path}: entry {e.name}'s file {exc.filename} cannot be read "
                            f"({exc.strerror or exc}); restore it or remove the entry; nothing was written") from None
    try:
        series.save()
    except OSError as exc:  # a read-only or full series folder
        raise C128Error(f"cannot write {series.manifest_path} ({exc.strerror or exc}); it is as it was") from None
    return sum(a != b for a, b in zip(before, hashes()))
