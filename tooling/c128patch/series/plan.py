"""Pieces shared by everything that replays the series on an upstream rev."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from c128patch.errors import C128Error
from c128patch.git import Git
from c128patch.series.manifest import Entry, Series, Variant, sha256_file, symlink_on_path
from c128patch.series.patchfile import PatchInfo, read_patch

ENTRY_TRAILER = "C128patch-Entry"
SERIES_TRAILER = "C128patch-Series"


def select_variant(git: Git, entry: Entry, target: str, distances: dict[str, int | None] | None = None) -> Variant:
    """The patch file made against the nearest ancestor of ``target`` (else the primary one).
    ``distances`` caches base -> commits from it to ``target`` (None: not an ancestor)."""
    files = entry.patch_files()
    if len(files) == 1:
        return files[0]
    cache = {} if distances is None else distances
    best: tuple[int, Variant] | None = None
    for variant in files:
        if variant.base not in cache:
            base = git.rev_parse(variant.base)
            ok = base is not None and git.is_ancestor(base, target)
            cache[variant.base] = git.count(f"{base}..{target}") if ok else None
        distance = cache[variant.base]
        if distance is not None and (best is None or distance < best[0]):
            best = (distance, variant)
    return best[1] if best else files[0]


@dataclass
class Planned:
    """One entry as it will be replayed on a given upstream commit."""

    entry: Entry
    variant: Variant | None
    path: Path  # the patch file, or the overlay source
    patch: PatchInfo | None

    @property
    def touched(self) -> list[str]:
        return self.patch.files if self.patch else [self.entry.target]

    @property
    def label(self) -> str:
        return f"patches/{self.variant.file}" if self.variant else self.entry.source


def verify_file(series: Series, entry: Entry, variant: Variant | None) -> Path:
    path = series.file_of(entry, variant)
    if not path.is_file():
        raise C128Error(f"entry '{entry.name}': {path} is missing")
    link = symlink_on_path(series.root, path)
    if link is not None:
        raise C128Error(f"unsafe path in entry '{entry.name}': {path} goes through the symlink {link}")
    want = variant.sha256 if variant else entry.sha256
    if want and sha256_file(path) != want:
        raise C128Error(
            f"corrupt series file {path.relative_to(series.root)}: sha256 does not match the manifest "
            "(restore it, or record the change with `c128patch lint --update-hashes`)"
        )
    return path


def validate_files(series: Series) -> None:
    """Every file of every entry (all variants) exists, matches its hash and parses."""
    for entry in series.entries:
        for variant in entry.patch_files() or [None]:
            path = verify_file(series, entry, variant)
            if variant is not None:
                read_patch(path)


def plan(series: Series, git: Git, target: str) -> list[Planned]:
    """Choose each entry's file for ``target`` and validate it; touches nothing."""
    out = []
    distances: dict[str, int | None] = {}
    for entry in series.entries:
        if entry.is_patch:
            variant = select_variant(git, entry, target, distances)
            path = verify_file(series, entry, variant)
            out.append(Planned(entry, variant, path, read_patch(path)))
        else:
            out.append(Planned(entry, None, verify_file(series, entry, None), None))
    return out


def prefixes(paths: list[str]) -> list[str]:
    seen: dict[str, None] = {}
    for path in paths:
        parts = PurePosixPath(path).parts
        for i in range(1, len(parts) + 1):
            seen["/".join(parts[:i])] = None
    return list(seen)


def check_paths_at(git: Git, treeish: str, planned: list[Planned]) -> set[str]:
    """Refuse paths that go through a symlink in the upstream tree, and overlays that hit upstream
    files. Returns which of the touched paths (and their folders) exist at ``treeish``."""
    paths = [p for item in planned for p in item.touched]
    listing = git.out("ls-tree", treeish, "--", *prefixes(paths)) if paths else ""
    kinds = {}
    for line in listing.splitlines():
        meta, name = line.split("\t", 1)
        kinds[name] = meta.split()[0]
    for item in planned:
        for path in item.touched:
            for prefix in prefixes([path]):
                if kinds.get(prefix) == "120000":
                    raise C128Error(
                        f"unsafe path in entry '{item.entry.name}': {path} goes through the symlink {prefix} upstream"
                    )
        if not item.entry.is_patch and item.entry.target in kinds:
            raise C128Error(
                f"overlay '{item.entry.name}' collides with upstream: {item.entry.target} already exists at {treeish[:12]}"
            )
    return set(kinds)


def overlay_message(entry: Entry, series: Series) -> str:
    gate = entry.gate or "none"
    return (
        f"c128: add {PurePosixPath(entry.target).name} (overlay)\n\n{entry.why}\n\n"
        f"Installs {entry.source} at {entry.target}.\n\n"
        f"{ENTRY_TRAILER}: {entry.name}\n{SERIES_TRAILER}: {series.name} {series.version}\n"
        f"C128patch-Gate: {gate}\n"
    )
