"""Local layers: a team's own entries on top of our series. docs/layers.md has the rules ``load_layer``
checks (a series folder, a PEP 440 label word as name, a base of ours, only its own entry trailer) and
where layers come from (``--layer``, else ``$C128PATCH_LAYERS``, else the operator's ``c128patch.toml``:
``lookup_layers``; never from inside a tree the tool patches or a repository given; else the verb takes a
layered tree's own: ``cli.common.load_stack``). ``Stack`` is the series and its layers as
one ``Series`` (ours, then each layer's entries as ``<layer>/<entry>``): everything that replays a
series replays it; ``part`` says which folder an entry's files and ledger live in."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from c128patch.errors import C128Error, what_is
from c128patch.git import Git, is_git_dir_name
from c128patch.series.manifest import (
    MANIFEST,
    Entry,
    Series,
    Variant,
    default_series_root,
    load_series,
    read_series_file,
    read_toml,
)
from c128patch.series.paths import confine, duplicates
from c128patch.series.trailers import ENTRY_TRAILER, message_trailers
from c128patch.textsafe import shell_join, shell_quote

if TYPE_CHECKING:
    from c128patch.series.patchfile import PatchInfo
    from c128patch.series.plan import Planned

LAYER_NAME = re.compile(r"[a-z][a-z0-9]{0,31}")
LAYER_NAME_RULE = "1-32 characters of a-z 0-9, starting with a letter (it goes into the wheel's PEP 440 label)"
SEP = "/"  # <layer>/<entry>
CONFIG = "c128patch.toml"
UPSTREAM_PACKAGE = "python/sglang"  # a tree in upstream's layout: one the tool patches
ENV = "C128PATCH_LAYERS"
MAX_CONFIG = 64 << 10  # bytes of a c128patch.toml: a few folder names (10 MB of them ran for minutes)


def check_layer_name(name: str, where: str) -> str:
    if not LAYER_NAME.fullmatch(name):
        raise C128Error(f"unsafe layer name in {where}: {name!r} (a layer name is {LAYER_NAME_RULE})")
    return name


def known_bases(series: Series) -> list[str]:
    """The bases our series was made on: where a layer may start."""
    bases = [series.base] if series.base else []
    return list(dict.fromkeys([*bases, *(v.base for e in series.entries for v in e.patch_files())]))


def check_layer_folder(folder: Path, done: str = "") -> None:
    """Refuse a layer folder inside git's own folder (any spelling ``git.is_git_dir_name`` folds to it); ``done``: what
    the refusal adds ("; nothing was written")."""
    if any(is_git_dir_name(p) for p in folder.resolve().parts):
        raise C128Error(f"unsafe layer folder {folder}: it is inside git's own folder{done}")


def load_layer(folder: Path, series: Series) -> Series:
    """The layer in ``folder``, checked against ``series`` (see the module doc); nothing is written."""
    check_layer_folder(folder)
    if os.path.lexists(folder) and not folder.is_dir():  # (a config's or the env's: "make one with layer new" failed)
        raise C128Error(f"layer folder {folder} is {what_is(folder)}, not a folder: name a layer's folder instead")
    if not os.path.lexists(folder / MANIFEST):  # (a FIFO or a link there: load_series says what it is, not "none")
        raise C128Error(f"no layer at {folder}: no {MANIFEST} (make one with c128patch layer new {shell_quote(folder)} "
                        "--name NAME)")  # (quoted: `layer new my layer` made my/, helper 167)
    layer = load_series(folder)
    where = str(layer.manifest_path)
    check_layer_name(layer.name, where)
    if layer.root == series.root:
        raise C128Error(f"layer {folder} is the series itself ({series.root})")
    bases = known_bases(series)
    if not layer.base:
        raise C128Error(f"{where}: the layer names no base (one of {', '.join(bases)})")
    if layer.base not in bases:
        raise C128Error(f"{where}: base {layer.base!r} is not one the series {series.name} was made on "
                        f"({', '.join(bases)}); make the layer on one of them")
    for e, path in ((e, layer.file_of(e, v)) for e in layer.entries for v in e.patch_files()):
        try:
            found = message_trailers(read_series_file(path)) if path.is_file() else []
        except ValueError as exc:
            raise C128Error(f"{where}: patch {path.name} is refused: {exc}") from None
        name = f"{layer.name}{SEP}{e.name}"
        for value in (v.strip() for k, v in found if k == ENTRY_TRAILER and v.strip() != name):
            raise C128Error(f"{where}: {path.name} carries '{ENTRY_TRAILER}: {value}', not '{ENTRY_TRAILER}: {name}' "
                            "(a layer's patch names its own entry only)")
    return layer


class Stack(Series):
    """Our series, then its layers (``head`` and ``layers``), as one series of namespaced entries."""

    def __init__(self, head: Series, layers: list[Series]) -> None:
        dupes = duplicates([head.name, *(layer.name for layer in layers)])
        if dupes:
            raise C128Error(f"two layers (or a layer and the series) are named {', '.join(dupes)}: each needs its own "
                            "name")
        entries = list(head.entries)
        self._parts: dict[str, tuple[Series, str]] = {}
        for layer in layers:
            for e in layer.entries:
                name = f"{layer.name}{SEP}{e.name}"
                entries.append(replace(e, name=name, variants=list(e.variants)))
                self._parts[name] = (layer, e.name)
        super().__init__(head.root, head.name, head.version, head.base, entries, gates=head.gates)
        self.head, self._layers = head, layers
        self.origin = "--layer"  # where the layers came from (``cli.common.load_stack``)

    @property
    def ours(self) -> Series:
        return self.head

    @property
    def layers(self) -> list[Series]:
        return self._layers

    def part(self, name: str) -> tuple[Series, str]:
        return self._parts.get(name, (self.head, name))

    def file_of(self, entry: Entry, variant: Variant | None = None) -> Path:
        return self.part(entry.name)[0].file_of(entry, variant)

    def digest(self) -> str:
        """A hash of our series' digest and every layer's (a stack has at least one layer: ``stack``)."""
        h = hashlib.sha256(self.head.digest().encode())
        for layer in self.layers:
            h.update(f"\0{layer.name}\0{layer.digest()}".encode())
        return h.hexdigest()

    def without(self, names: set[str]) -> Stack:
        return self.rebuilt([e for e in self.entries if e.name not in names], "")

    def rebuilt(self, entries: list[Entry], base: str) -> Stack:
        """The stack with ``entries`` (namespaced) sorted back into its parts, on ``base`` ("": each one's)."""
        mine: dict[int, list[Entry]] = {}
        owners = [self.head, *self.layers]
        for e in entries:
            part, local = self.part(e.name)
            mine.setdefault(id(part), []).append(replace(e, name=local))
        parts = [Series(p.root, p.name, p.version, base or p.base, mine.get(id(p), []), gates=p.gates) for p in owners]
        return Stack(parts[0], parts[1:])


def describe(series: Series) -> str:
    """"series c128patch 4", then " + layer acme 2" per layer."""
    return f"series {series.name} {series.version}" + "".join(f" + layer {x.name} {x.version}" for x in series.layers)


def layer_rows(stack: Series) -> list[dict]:
    """Each layer's name, version, base, digest and entries (namespaced), for provenance and reports."""
    return [{"name": layer.name, "version": layer.version, "base": layer.base, "digest": layer.digest(),
             "entries": [f"{layer.name}{SEP}{e.name}" for e in layer.entries]} for layer in stack.layers]


def layer_folders(series: Series) -> list[str]:
    """The layer folders of a stack, in order (journals keep them to resume with the same stack)."""
    return [str(layer.root) for layer in series.layers]


def layer_args(series: Series) -> list[str]:
    """``--layer DIR`` for each layer of a stack: what a printed command needs to name the same stack."""
    return [arg for layer in series.layers for arg in ("--layer", str(layer.root))]


def overlap_note(series: Series, earlier: Sequence[Planned], item: Planned, paths: Sequence[str], rev: str,
                 text: Callable[[str], str | None]) -> str:
    """"; it conflicts with ..." naming an earlier entry of another part that changed the lines a layer entry
    ``item`` edits in a ``paths`` file (a hunk of it where the entry's hunk is, or lines the entry's hunk needs and
    the file now lacks, or an overlay making the file); else "; REV has no line ..." when the file ``text`` gives
    (as it stood when ``item`` failed; None: unknown) lacks a line the entry's hunk edits that no earlier entry
    touches: upstream's, not ours ("": none, or an entry of our series)."""
    mine = series.part(item.entry.name)[0]
    if mine is series.ours:
        return ""
    missing: dict[str, list[str]] = {}
    for path in dict.fromkeys(paths):
        here = text(path)
        lines = {line.strip() for line in here.splitlines()} if here is not None else None
        gone = [v for v in _preimage(item, path) if lines is not None and v.strip() and v.strip() not in lines]
        for other in reversed(earlier):
            part = series.part(other.entry.name)[0]
            if part is mine or path not in other.touched or not _changes_for(series, item, other, path, gone):
                continue
            owner = f"series {part.name}" if part is series.ours else f"layer {part.name}"
            return f"; it conflicts with entry '{other.entry.name}' of {owner}, which changes lines it edits in {path}"
        if gone:
            missing[path] = gone
    for path, gone in missing.items():
        shown = next((v.strip() for v in gone if len(v.strip()) >= 8), gone[0].strip())
        return (f"; {rev} has no line `{shown[:80]}` that its hunk in {path} edits (nor does an entry before it add "
                f"it): upstream's {path} differs there, not an entry of ours")
    return ""


def _hunks(patch: PatchInfo, path: str, side: str) -> list:
    return [h for pf in patch.patchset if getattr(pf, side).removeprefix("a/").removeprefix("b/") == path for h in pf]


def _preimage(item: Planned, path: str) -> list[str]:
    """The lines ``item``'s hunks of ``path`` need there: those they remove (the lines they edit), then context."""
    lines = [line for h in (_hunks(item.patch, path, "source_file") if item.patch else []) for line in h]
    needed = sorted((x for x in lines if not x.is_added), key=lambda x: x.is_context)  # stable: removed first
    return [line.value.rstrip("\n") for line in needed]


def _changes_for(series: Series, item: Planned, other: Planned, path: str, gone: list[str]) -> bool:
    """Does ``other`` (an earlier entry changing ``path``) change what ``item``'s hunks there edit: an overlay making
    the file, a hunk of it where one of ``item``'s is (on the side each reads), or lines it adds or removes (in any
    of its files: ``item`` may have been made on another) that ``item`` needs and the file lacks (``gone``)?"""
    if other.patch is None or item.patch is None:
        return True
    theirs = _hunks(other.patch, path, "target_file")
    if gone:
        from c128patch.series.patchfile import read_patch  # unidiff: smoke imports this module without it

        files = {series.file_of(other.entry, v) for v in other.entry.patch_files()} - {other.path}
        patches = [other.patch, *(read_patch(f) for f in sorted(files) if f.is_file())]
        changed = {line.value.strip() for pt in patches for h in _hunks(pt, path, "target_file") for line in h
                   if line.is_added or line.is_removed}
        if any(v.strip() in changed for v in gone):
            return True
    spans = [(h.target_start, h.target_start + max(h.target_length, 1)) for h in theirs]
    return any(a < h.source_start + max(h.source_length, 1) and h.source_start < b
               for h in _hunks(item.patch, path, "source_file") for a, b in spans)


def read_config(path: Path) -> tuple[Path, ...]:
    """The layer folders ``path`` (a c128patch.toml) names, each inside the file's folder, once."""
    if path.stat().st_size > MAX_CONFIG:
        raise C128Error(f"{path}: not a valid c128patch config (over {MAX_CONFIG >> 10} KiB: it names a few layer "
                        "folders)")
    doc = read_toml(path, f"{path}: not a valid c128patch config")
    layers = doc.get("layers", {})
    if set(doc) - {"layers"} or not isinstance(layers, dict) or set(layers) - {"paths"}:
        raise C128Error(f"{path}: a c128patch config holds only [layers] paths = [\"DIR\", ...]")
    paths = layers.get("paths", [])
    if not isinstance(paths, list) or not all(isinstance(p, str) and p for p in paths):
        raise C128Error(f"{path}: [layers] paths must be an array of folder names")
    top = path.parent.resolve()
    folders = [confine(top, p, f"{path} [layers] paths") for p in paths]
    for folder in folders:  # each folder on the way from the config's to a layer: whoever may change one can swap the
        for step in reversed(folder.parents[:len(folder.relative_to(top).parts) - 1]):  # layer for a folder of theirs
            if os.path.lexists(step):  # (helper 168: only the config's folder and the layer's were held)
                _held(step, step, str(path), f"layer {folder} through", f"--layer or {ENV}")
    return owned(tuple(f.resolve() for f in folders), str(path))


def owned(folders: tuple[Path, ...], origin: str) -> tuple[Path, ...]:
    """``folders`` when each is the user's and no other user may write it (the rule for a layer folder a file names:
    the operator's ``c128patch.toml``, a tree's record of its layers); --layer and the env are the operator's word."""
    for folder in (f for f in folders if f.exists()):
        for path in _inside(folder):  # (its patches/ or series.toml another's: they choose what the layer holds)
            _held(folder, path, origin, "layer", f"--layer or {ENV}", folder)
    return folders


def owned_series(root: Path, origin: str) -> Path:
    """``root`` when it and the parts of it a series is read from are the user's and no other user may write them
    (``owned``'s rule, for a series folder a journal names: whoever owns it chooses what is applied)."""
    folders = (root / "patches", root / "csrc", root / "overlay")  # what ``load_series`` reads (a checkout holds more)
    if root.exists():
        _held(root, root, origin, "series", "--series")
        for part in (f for f in folders if f.is_dir()):
            for path in _inside(part):
                _held(root, path, origin, "series", "--series", part)
    return root


def _sources_held(series: Series, origin: str) -> None:
    """``owned_series``' rule for each overlay source the manifest names outside ``patches/``, ``csrc/`` and
    ``overlay/`` (``source = "extra/x.py"``: a file another user owns, in a folder others may write, was applied), and
    the folders on its way."""
    for entry in (e for e in series.entries if not e.is_patch):
        path = series.file_of(entry)
        for step in [path, *path.parents][: len(path.relative_to(series.root).parts)]:
            if os.path.lexists(step):
                _held(series.root, step, origin, "series", "--series")


def _held(folder: Path, path: Path, origin: str, what: str, instead: str, walked: Path | None = None) -> None:
    """Refuse ``path`` (``folder`` or in it) when another user owns it or may write it; ``walked``: the folder whose
    every entry is held so (the printed chmod takes it whole: one path a run took as many runs as it holds)."""
    at = "" if path == folder else f" (its {path.relative_to(folder)})"
    if (uid := path.lstat().st_uid) != os.getuid():
        raise C128Error(f"{origin} names {what} {folder}{at}, owned by another user (uid {uid}): not read (as "
                        f"git's safe.directory); {_made_yours(folder, True)}, or name it with {instead}")
    if not path.is_symlink() and (why := _others_write(path)):
        raise C128Error(f"{origin} names {what} {folder}{at}, {why}: not read (another user may change it); "
                        f"{shell_join(['chmod', '-R', 'go-w', walked] if walked else ['chmod', 'go-w', path])}, or "
                        f"name it with {instead}")


def _made_yours(path: Path, whole: bool) -> str:
    """How ``path`` (``whole``: and all it holds) becomes the user's, as a command that runs as printed: ``chown``,
    by root (no other user may give a file away)."""
    return f"to use it, make it yours (as root: {shell_join(['chown', *['-R'] * whole, str(os.getuid()), path])})"


MAX_LAYER_WALK = 10_000  # entries of a layer folder checked for their owner (a layer holds a few dozen)


def _inside(folder: Path) -> Iterator[Path]:
    """``folder``, then what it holds (links not followed; a ``.git`` folder, as a layer kept in its own repository
    has, is not read), at most ``MAX_LAYER_WALK`` entries."""
    yield folder
    count = 0
    for top, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not is_git_dir_name(d)]
        for name in (*dirs, *files):
            if (count := count + 1) > MAX_LAYER_WALK:
                raise C128Error(f"layer folder {folder} holds over {MAX_LAYER_WALK} files: not a layer")
            yield Path(top) / name


def _others_write(path: Path) -> str:
    """"writable by others" or "by group G" when a user other than the owner may write ``path`` (a folder with the
    sticky bit, as /tmp, lets none of them replace an entry it holds), else ""; a group that is the user's own (a
    user private group, umask 002) is theirs."""
    st = path.stat()
    if path.is_dir() and st.st_mode & stat.S_ISVTX:
        return ""
    return "writable by others" if st.st_mode & stat.S_IWOTH else f"writable by group {st.st_gid}" \
        if st.st_mode & stat.S_IWGRP and st.st_gid != os.getgid() else ""


def _patched_top(folder: Path) -> bool:
    """Is ``folder`` the top of a tree the tool patches (upstream's layout; a repository or not: a tarball or an sdist
    has no ``.git``, helper 100), a sparse checkout of one too, whose work tree leaves ``python/`` out while its HEAD
    holds it (helper 153: the upstream's committed config and layer were read there)?"""
    if (folder / UPSTREAM_PACKAGE).is_dir():
        return True
    try:
        return _sparse(folder) and Git(worktree=folder).ok("cat-file", "-e", f"HEAD:{UPSTREAM_PACKAGE}")
    except C128Error:  # a repository git or the tool refuses (another user's, a config including a file): not the
        return True  # operator's to take a config from; said by the verb that works in it, if one does


def _sparse(folder: Path) -> bool:
    """Is ``folder`` a work tree git checks out sparsely (its git dir, or a linked work tree's, has
    ``info/sparse-checkout``)? No git is run: this is asked of every repository top above the current folder."""
    dot = folder / ".git"
    try:
        if dot.is_dir():
            git_dir = dot
        elif dot.is_file() and dot.stat().st_size <= 4096:  # a linked work tree's "gitdir: PATH"
            git_dir = folder / dot.read_text(errors="replace").strip().removeprefix("gitdir:").strip()
        else:
            return False
        return (git_dir / "info" / "sparse-checkout").is_file()
    except (OSError, ValueError):
        return False


def _git_dir(folder: Path) -> bool:
    """Is ``folder`` a git dir, a bare repository's root (git's own test: ``HEAD``, ``objects/``, ``refs/``)? A ``HEAD``
    that is a symlink (``core.preferSymlinkRefs``; to a branch with no commit yet) is one to git too (helper 159)."""
    head = folder / "HEAD"
    return (head.is_file() or head.is_symlink()) and (folder / "objects").is_dir() and (folder / "refs").is_dir()


def find_config(start: Path, exclude: Sequence[Path] = ()) -> Path | None:
    """The operator's ``c128patch.toml`` at or above ``start`` up to a repository top (a work tree's, or a bare
    repository's root: ``_git_dir``), outside patched trees and
    ``exclude`` (the repositories a verb was pointed at)."""
    chain = [start, *start.parents]
    tops = [i for i, folder in enumerate(chain) if (folder / ".git").exists() or _git_dir(folder)]
    inside = max([i + 1 for i, f in enumerate(chain) if _patched_top(f) or f in exclude], default=0)
    last = min([i for i in tops if i >= inside], default=len(chain) - 1)
    # the nearest one there decides, whatever it is (a FIFO or a dangling link was passed over for a parent's config)
    config = next((f / CONFIG for f in chain[inside:last + 1] if os.path.lexists(f / CONFIG)), None)
    if config is not None and config.is_symlink():  # whoever made the link chose the folder its paths are under
        raise C128Error(f"{config} is a symlink (-> {os.readlink(config)}): not read; put the file itself there, or "
                        f"name the layers with --layer or {ENV}")
    if config is not None and not config.is_file():
        raise C128Error(f"{config} is {what_is(config)}, not a regular file: not read; put the config file itself "
                        f"there (or remove it), or name the layers with --layer or {ENV}")
    for path in (chain[last], chain[last] / ".git") if config is not None and last in tops else ():
        with contextlib.suppress(OSError):  # the repository it lies in, as git's safe.directory: its top, its git dir
            if (uid := path.stat().st_uid) != os.getuid():
                raise C128Error(f"{config}: the repository {path} is owned by another user (uid {uid}): not read (git "
                                f"refuses it: safe.directory); {_made_yours(path, False)}, or name the layers with "
                                f"--layer or {ENV}")
    for path in (config, config.parent) if config is not None else ():  # whoever owns the folder may swap the file
        if path.stat().st_uid != os.getuid():
            raise C128Error(f"{config}: {path} is owned by another user (uid {path.stat().st_uid}): not read (as "
                            f"git's safe.directory); {_made_yours(path, False)}, or name the layers with --layer or "
                            f"{ENV}")
        if why := _others_write(path):  # as another owner: whoever may write it (or swap the file) chooses the layers
            raise C128Error(f"{config}: {path} is {why}: not read (another user may change it); chmod go-w "
                            f"{shell_quote(path)}, or name the layers with --layer or {ENV}")
    return config


def lookup_layers(given: tuple[Path, ...] = (), cwd: Path | None = None,
                  exclude: Sequence[Path] = ()) -> tuple[tuple[Path, ...], str]:
    """The layer folders to use (the module doc's order) and where they came from (--layer, the env, the config's
    path; "": nowhere)."""
    env = os.environ.get(ENV)
    if given:
        return tuple(given), "--layer"
    start = (cwd or Path.cwd()).resolve()
    config = None if env is not None else find_config(start, [Path(p).resolve() for p in exclude])
    origin = f"${ENV}" if env is not None else str(config or "")
    folders = tuple((start / p).resolve() for p in (env or "").split(os.pathsep) if p) if env is not None \
        else read_config(config) if config else ()
    return operators(folders, origin), origin


def operators(folders: Sequence[Path], origin: str, series_first: bool = False) -> tuple[Path, ...]:
    """``folders`` (resolved) when none lies inside a tree the tool patches (layers come from the operator) and each
    is named once (20,000 times one folder loaded it as many times: minutes); ``series_first``: the first is the
    series' folder (a journal's), said as one."""
    if dupes := duplicates(map(str, folders)):
        raise C128Error(f"layer folder {dupes[0]} (from {origin}) is named twice: name each layer folder once")
    for i, folder in enumerate(folders):
        what, whose = ("series folder", "series") if series_first and i == 0 else ("layer folder", "layers")
        try:
            top = next((f for f in [folder, *folder.parents] if _patched_top(f)), None)
        except OSError as exc:  # (a part over 255 bytes: ENAMETOOLONG's traceback, helper 168)
            raise C128Error(f"{what} {folder} (from {origin}) cannot be looked at ({exc.strerror}): name another "
                            f"{what}") from None
        if top is not None:
            raise C128Error(f"{what} {folder} (from {origin}) is inside {top}, a tree c128patch patches: "
                            f"{whose} come from the operator, not from upstream")
    return tuple(folders)


def get_series(series_dir: Path | None, layers: Sequence[Path] = (), exclude: Sequence[Path] = ()) -> Series:
    """The series in ``series_dir`` (default: the tool's) with ``layers``, else ``lookup_layers``', stacked on it."""
    series = load_series(series_dir or default_series_root())
    return stack(series, lookup_layers(tuple(layers), exclude=exclude)[0])


def recorded_stack(series_root: str, layers: Sequence[str], journal: Path, series_given: bool = False) -> Series:
    """The stack an apply or rebase ``journal`` (a state file: input) names, its folders the operator's (``operators``:
    none inside a tree the tool patches; ``owned``, ``owned_series``: the user's, but for the tool's own series or one
    the operator gave with --series)."""
    root, *folders = operators([Path(p).resolve() for p in [series_root, *layers]], str(journal), series_first=True)
    held = not series_given and root != default_series_root().resolve()
    if held:
        owned_series(root, str(journal))
    owned(tuple(folders), str(journal))
    series = load_series(root)
    if held:
        _sources_held(series, str(journal))
    made = stack(series, folders)
    if made.layers:  # (--json's layers_in_effect: from the journal, not "--layer", which nobody passed)
        made.origin = f"the {journal.stem} journal"  # type: ignore[attr-defined]
    return made


def stack(series: Series, folders: tuple[Path, ...] | list[Path]) -> Series:
    """``series`` with the layers in ``folders``; ``series`` itself when there are none."""
    return Stack(series, [load_layer(Path(f), series) for f in folders]) if folders else series
