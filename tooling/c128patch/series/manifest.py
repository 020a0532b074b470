"""The series manifest (patches/series.toml): what we carry, in order, and why."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import stat
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from c128patch import PACKAGE_DIR
from c128patch.errors import C128Error
from c128patch.git import Git, work_tree_top
from c128patch.jsonio import write_atomic
from c128patch.series import txn
from c128patch.series.gates import Gate, parse_gates
from c128patch.series.paths import check_entry_name, check_relpath, confine, duplicates

MANIFEST = "patches/series.toml"
KINDS = ("patch", "overlay")
_ENTRY_TEXT_FIELDS = ("why", "gate", "upstream", "upstream_status", "drop_when", "base")
# Written only when set, so that series without them keep their manifest byte for byte.
_ENTRY_OPTIONAL_FIELDS = ("base_commit", "merged_in")
ABSENT = "absent"  # a file a patch creates: not in its base's sources
MAX_SERIES_FILE = 64 << 20  # a patch or overlay a series carries: ours are under 1 MiB; a bigger one is not read


def check_size(path: Path, size: int) -> None:
    """Refuse a file a series carries over ``MAX_SERIES_FILE`` (a 20 GB sparse one ran every reader out of memory)."""
    if size > MAX_SERIES_FILE:
        raise C128Error(f"series file {path} is {size} bytes, over the {MAX_SERIES_FILE >> 20} MiB a patch or overlay "
                        "may be: not read")


def read_series_file(path: Path) -> bytes:
    """The bytes of a file a series carries (``check_size`` on the open file first; a FIFO does not hang the open)."""
    with open(path, "rb", opener=lambda name, flags: os.open(name, flags | os.O_NONBLOCK)) as fh:
        check_size(path, os.fstat(fh.fileno()).st_size)
        parts, left = [], MAX_SERIES_FILE + 1  # in pieces: ``read(n)`` takes n bytes of memory first (a 64 MiB
        while left > 0 and (part := fh.read(min(left, 1 << 20))):  # buffer a patch: MemoryError under ulimit -v)
            parts.append(part)
            left -= len(part)
        return b"".join(parts)


def sha256_file(path: Path) -> str:
    return hashlib.sha256(read_series_file(path)).hexdigest()


def hash_mismatch(path: Path, want: str) -> str:
    """Why series file ``path`` is not the manifest's (sha256 ``want``), "" where it is: a file whose lines end in
    CRLF where the manifest's end in LF says so (a checkout with core.autocrlf=true or core.eol=crlf: lint called
    each patch "corrupt" for a '---' line "naming another path than its diff header", and offered --update-hashes)."""
    data = read_series_file(path)
    if hashlib.sha256(data).hexdigest() == want:
        return ""
    if b"\r\n" in data and hashlib.sha256(data.replace(b"\r\n", b"\n")).hexdigest() == want:
        return ("its lines end in CRLF, the manifest's bytes in LF (a checkout with core.autocrlf=true or "
                f"core.eol=crlf, or an editor, wrote them): {_lf_again(path, want)}")
    return "sha256 does not match the manifest"


def _lf_again(path: Path, want: str) -> str:
    """How to write ``path`` again with the manifest's bytes (sha256 ``want``): where its checkout's HEAD holds them,
    git's own command for that one file (the line-end settings off: a layer's repository without ``* -text`` under
    core.autocrlf=true wrote CRLF again, and ``git checkout -- F`` skips a file whose stat matches the index);
    in the installed tool's series, reinstall it."""
    top = work_tree_top(path.parent)
    if top is not None:
        rel = os.path.relpath(os.path.realpath(path), os.path.realpath(top))
        committed = Git(worktree=top).run("cat-file", "blob", f"HEAD:{rel}", binary=True, check=False)
        if committed.returncode == 0 and hashlib.sha256(committed.stdout).hexdigest() == want:
            return (f"write it again as committed: git -C {shlex.quote(str(top))} --literal-pathspecs "
                    f"-c core.autocrlf=false -c core.eol=lf restore --source=HEAD -- {shlex.quote(rel)}")
    if path.resolve().is_relative_to((PACKAGE_DIR / "_series").resolve()):
        return "reinstall c128patch as you installed it (its installed series was changed)"
    return "write it again with LF line ends (its bytes as its author made them)"


@dataclass(frozen=True)
class Variant:
    """One patch file of an entry, made on upstream ``base`` (a tag; ``commit`` for a base no tag names), by
    content ``sources``: each touched file's blob id at that base (``absent``: one it creates)."""

    file: str
    base: str
    sha256: str = ""
    commit: str = ""
    sources: tuple[tuple[str, str], ...] = ()  # (path, blob id | absent), sorted


@dataclass
class Entry:
    name: str
    kind: str
    why: str
    gate: str = ""
    upstream: str = ""
    upstream_status: str = ""
    drop_when: str = ""
    base: str = ""
    base_commit: str = ""  # only for a base no tag names (Variant.commit)
    base_sources: tuple[tuple[str, str], ...] = ()  # the primary patch's base, by content (Variant.sources)
    merged_in: str = ""  # upstream commit that holds this entry: skipped where it is an ancestor
    sha256: str = ""
    file: str = ""  # patch
    source: str = ""  # overlay: file in this repo
    target: str = ""  # overlay: path in the upstream tree
    variants: list[Variant] = field(default_factory=list)

    @property
    def is_patch(self) -> bool:
        return self.kind == "patch"

    def patch_files(self) -> list[Variant]:
        """The primary patch first, then the older-base variants."""
        if not self.is_patch:
            return []
        return [Variant(self.file, self.base, self.sha256, self.base_commit, self.base_sources), *self.variants]

    def role(self, path: str) -> str:
        """Which of its files ``path`` (``patches/<file>``) is, in ``check``'s words: ``primary`` or ``<base>
        variant`` (``path`` itself where it is none of them)."""
        variant = next((v for v in self.patch_files() if f"patches/{v.file}" == path), None)
        return path if variant is None else "primary" if variant.file == self.file else f"{variant.base} variant"

    def to_toml(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "kind": self.kind,
                               **({"file": self.file} if self.is_patch
                                  else {"source": self.source, "target": self.target}),
                               **{key: getattr(self, key) for key in _ENTRY_TEXT_FIELDS},
                               **{key: getattr(self, key) for key in _ENTRY_OPTIONAL_FIELDS if getattr(self, key)},
                               "sha256": self.sha256}
        if self.base_sources:
            out["base_sources"] = dict(self.base_sources)
        if self.variants:
            out["variants"] = [{"file": v.file, "base": v.base, **({"commit": v.commit} if v.commit else {}),
                                "sha256": v.sha256, **({"sources": dict(v.sources)} if v.sources else {})}
                               for v in self.variants]
        return out


@dataclass
class Series:
    root: Path  # the folder holding patches/, csrc/, overlay/
    name: str
    version: str
    base: str
    entries: list[Entry]
    gates: list[Gate] = field(default_factory=list)  # the env reference (series.gates); not in the digest

    @property
    def ours(self) -> Series:
        """Our series: this one (``layers.Stack``: its first part, without the layers)."""
        return self

    @property
    def layers(self) -> list[Series]:
        """The layers stacked on it, in order (``layers.Stack``; none here)."""
        return []

    @property
    def manifest_path(self) -> Path:
        return self.root / MANIFEST

    @property
    def patches_dir(self) -> Path:
        return self.root / "patches"

    def entry(self, name: str) -> Entry:
        for e in self.entries:
            if e.name == name:
                return e
        raise C128Error(f"no entry named {name!r} in {self.manifest_path}")

    def without(self, names: set[str]) -> Series:
        """The series less the entries ``names`` (``layers.Stack``: each part less its own)."""
        return replace(self, entries=[e for e in self.entries if e.name not in names])

    def part(self, name: str) -> tuple[Series, str]:
        """The series an entry's files and ledger live in, and its name there (``layers.Stack``: a layer's)."""
        return self, name

    def file_of(self, entry: Entry, variant: Variant | None = None) -> Path:
        """The file in this repository that an entry (or one of its variants) carries."""
        if entry.is_patch:
            return self.patches_dir / (variant.file if variant else entry.file)
        return self.root / entry.source

    def digest(self) -> str:
        """A hash of everything the series carries, for version labels and caches."""
        h = hashlib.sha256()
        h.update(f"{self.name}\0{self.version}\0".encode())
        for e in self.entries:
            h.update(f"{e.name}\0{e.kind}\0{e.target}\0{e.gate}\0".encode())
            for v in e.patch_files() or [Variant(e.source, e.base)]:
                path = self.file_of(e, v if e.is_patch else None)
                try:
                    h.update(read_series_file(path))
                except OSError as exc:  # (a series from a pull request that lost a variant: status's traceback)
                    raise C128Error(f"entry '{e.name}': {path} cannot be read ({exc.strerror or exc})") from None
        return h.hexdigest()

    def to_toml(self) -> str:
        import tomli_w  # lazy: reading a series (and `smoke`) must not need it

        doc: dict[str, Any] = {"series": {"name": self.name, "version": self.version, "base": self.base}}
        if self.entries:  # (a new layer has none)
            doc["entries"] = [e.to_toml() for e in self.entries]
        if self.gates:
            doc["gates"] = [g.to_toml() for g in self.gates]
        text = tomli_w.dumps(doc)
        try:  # a value the file holds already keeps the text it was written in (a user's quoting, a trailing comment)
            return keep_written(self.manifest_path.read_text("utf-8"), text)
        except (OSError, UnicodeDecodeError):
            return text

    def save(self) -> None:
        write_atomic(self.manifest_path, self.to_toml().encode())


def _units(text: str) -> Iterator[tuple[int, int, str]]:
    """Each ``key = value`` and table header of TOML ``text``: its first line, the line after its last, and what it
    says: a statement the one key and value it parses to, as JSON (a value over several lines, an array or a
    multi-line string, is one); a header its text after a ``[``, and the first statement under it."""
    lines, i, out = text.splitlines(keepends=True), 0, []
    while i < len(lines):
        line = lines[i].strip()
        if line.startswith("["):
            out.append((i, i + 1, "[" + line))
        elif line and not line.startswith("#"):
            for j in range(i + 1, len(lines) + 1):
                try:
                    said = tomllib.loads("".join(lines[i:j]))
                except tomllib.TOMLDecodeError as exc:
                    if "at end of document" in str(exc):
                        continue  # not closed yet: the next line is part of it
                    break  # not TOML there: not one to keep
                out.append((i, j, json.dumps(said, sort_keys=True, default=repr)))
                i = j - 1
                break
        i += 1
    for n, (i, j, said) in enumerate(out):
        after = out[n + 1][2] if n + 1 < len(out) else ""
        yield i, j, said + "\0" + after * (not after.startswith("[")) if said.startswith("[") else said


def _comments_above(lines: list[str], i: int) -> str:
    """The comment lines right above line ``i`` (blank lines among and below them kept, none above the first)."""
    j = i
    while j and (not lines[j - 1].strip() or lines[j - 1].lstrip().startswith("#")):
        j -= 1
    while j < i and not lines[j].lstrip().startswith("#"):
        j += 1
    return "".join(lines[j:i])


def keep_written(old: str, new: str) -> str:
    """``new`` (tomli_w's rendering) with each ``key = value`` that ``old`` holds the same (key and value) taken as
    ``old`` writes it: a user's ``default = '"INFO"'`` is not re-quoted ``"\\"INFO\\""`` by a rewrite that left it
    as it was (the k-th such statement of ``new`` takes the k-th of ``old``); and the comments above a statement or
    a table header, and at the end, kept above the same (a statement whose value changed: above the next one of its
    key still without them). The rest is tomli_w's."""
    if old == new:  # (a file the tool wrote: the common case, at no cost)
        return new
    lines, units = old.splitlines(keepends=True), list(_units(old))
    written: dict[str, list[str]] = {}
    comments: list[str] = []
    by: dict[str, list[int]] = {}  # a unit's text, or "=" and a statement's key -> its comments (indexes)
    for i, j, said in units:
        if not said.startswith("["):
            written.setdefault(said, []).append("".join(lines[i:j]).rstrip("\n") + "\n")
        if text := _comments_above(lines, i):
            comments.append(text)
            for key in [said] + ([] if said.startswith("[") else ["=" + next(iter(json.loads(said)), "")]):
                by.setdefault(key, []).append(len(comments) - 1)
    tail = _comments_above(lines + [""], len(lines)) if not units or units[-1][1] < len(lines) else ""
    used: set[int] = set()
    out, lines, at = [], new.splitlines(keepends=True), 0
    for i, j, said in _units(new):
        keys = [said] + ([] if said.startswith("[") else ["=" + next(iter(json.loads(said)), "")])
        found = next((n for key in keys for n in by.get(key, ()) if n not in used), None)
        used.add(found if found is not None else -1)
        out += lines[at:i] + [comments[found] if found is not None else "",
                              written[said].pop(0) if written.get(said) else "".join(lines[i:j])]
        at = j
    return "".join(out + lines[at:]) + tail


def read_toml(path: Path, bad: str, parsed: dict[bytes, Any] | None = None,
              limit: int = MAX_SERIES_FILE) -> dict[str, Any]:
    """``path`` read as TOML; a file that cannot be is one line: "BAD (why)". ``parsed``: content digest -> what it
    parsed to, kept there (the caller's, which must not change what it holds). ``limit``: its most bytes."""
    try:  # a pipe does not hang the open; a sparse file of gigabytes is not read into memory
        with open(path, "rb", opener=lambda name, flags: os.open(name, flags | os.O_NONBLOCK)) as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
                raise C128Error(f"{bad} (not a regular file of at most {limit >> 20} MiB: not read)")
            data = fh.read()
            if parsed is None:
                return tomllib.loads(data.decode("utf-8"))
            key = hashlib.sha256(data).digest()
            if key not in parsed:
                parsed.clear()  # (the last one only)
                parsed[key] = tomllib.loads(data.decode("utf-8"))
            return parsed[key]
    except UnicodeDecodeError as exc:
        why = f"not UTF-8 (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); save it as UTF-8"
    except OSError as exc:
        why = f"cannot read it: {exc.strerror}"
    except tomllib.TOMLDecodeError as exc:
        why = f"not valid TOML: {exc}"
    except ValueError as exc:  # (an integer past Python's digit limit: tomllib's int() raises it, not its own error)
        why = f"not readable as TOML: {exc}"
    except RecursionError:
        why = "nested too deeply to read"
    raise C128Error(f"{bad} ({why})") from None


def _toml_type(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a float", str: "a string", list: "an array",
            dict: "a table"}.get(type(value), f"a {type(value).__name__}")


def _str(table: dict, key: str, where: str, required: bool = False) -> str:
    value = table.get(key, "")
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise C128Error(f"{where}: '{key}' must be a string, not {_toml_type(value)}")
    if required and not str(value):
        raise C128Error(f"{where}: '{key}' is required")
    return str(value)


def _sources(raw: Any, where: str) -> tuple[tuple[str, str], ...]:
    """A base's sources: a table of path = blob id (or "absent")."""
    if raw is None:
        return ()
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise C128Error(f"{where}: sources must be a table of path = blob id, not {_toml_type(raw)}")
    for name, blob in raw.items():
        check_relpath(name, where)
        if blob != ABSENT and (len(blob) not in (40, 64) or any(c not in "0123456789abcdef" for c in blob)):
            raise C128Error(f"{where}: sources: {blob!r} for {name} is not a blob id")
    return tuple(sorted(raw.items()))


_ENTRY_KEYS = {"name", "kind", "file", "source", "target", "sha256", "variants", "base_sources", *_ENTRY_TEXT_FIELDS,
               *_ENTRY_OPTIONAL_FIELDS}


def _variant(raw: Any, where: str) -> Variant:
    if not isinstance(raw, dict):
        raise C128Error(f"{where} must be a table")
    base = _str(raw, "base", where, required=True)
    if not base.isprintable() or " " in base:  # (as the series' base: it reaches reports, progress and rev lookups)
        raise C128Error(f"{where}: unsafe base {base!r} (one word, no spaces or control characters)")
    return Variant(check_relpath(_str(raw, "file", where, required=True), where), base,
                   _str(raw, "sha256", where), _str(raw, "commit", where), _sources(raw.get("sources"), where))


def _entry(raw: Any, index: int, path: Path) -> Entry:
    where = f"{path}: entry #{index + 1}"
    if not isinstance(raw, dict):
        raise C128Error(f"{where}: must be a table")
    name = check_entry_name(_str(raw, "name", where, required=True), where)
    where = f"{path}: entry '{name}'"
    kind = _str(raw, "kind", where, required=True)
    if kind not in KINDS:
        raise C128Error(f"{where}: kind must be one of {', '.join(KINDS)}, not {kind!r}")
    entry = Entry(name=name, kind=kind, why=_str(raw, "why", where, required=True), sha256=_str(raw, "sha256", where),
                  base_sources=_sources(raw.get("base_sources"), f"{where} base_sources"),
                  **{key: _str(raw, key, where) for key in (*_ENTRY_TEXT_FIELDS[1:], *_ENTRY_OPTIONAL_FIELDS)})
    for key in _ENTRY_TEXT_FIELDS:  # into an overlay's commit message and reports: a line break there forged a
        if not str(getattr(entry, key)).isprintable():  # trailer of another entry (C128patch-Entry: c128-...)
            raise C128Error(f"{where}: '{key}' must be one line of printable text, not {getattr(entry, key)!r} (it "
                            "goes into commit messages and reports)")
    if kind == "patch":
        entry.file = check_relpath(_str(raw, "file", where, required=True), where)
        variants = raw.get("variants", [])
        if not isinstance(variants, list):
            raise C128Error(f"{where}: 'variants' must be an array of tables, not {_toml_type(variants)}")
        entry.variants = [_variant(v, f"{where} variant #{j + 1}") for j, v in enumerate(variants)]
    elif raw.get("variants"):
        raise C128Error(f"{where}: overlay entries have no variants")
    else:
        entry.source = check_relpath(_str(raw, "source", where, required=True), where)
        entry.target = check_relpath(_str(raw, "target", where, required=True), where)
    unknown = set(raw) - _ENTRY_KEYS
    if unknown:
        raise C128Error(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    return entry


def load_series(root: Path) -> Series:
    root = root.resolve()
    path = root / MANIFEST
    txn.recover(root)  # a refresh killed after its commit point is finished, one killed before it dropped
    if not os.path.lexists(path):
        raise C128Error(f"no series manifest at {path}")
    confine(root, MANIFEST, f"the series manifest {path}", regular=True)  # not through a link, not a device
    doc = read_toml(path, f"{path}: not a series manifest")
    head = doc.get("series")
    if not isinstance(head, dict):
        raise C128Error(f"{path}: missing [series] table")
    raw_entries = doc.get("entries", [])
    if not isinstance(raw_entries, list):
        raise C128Error(f"{path}: 'entries' must be an array of tables ([[entries]]), not {_toml_type(raw_entries)}")
    entries = [_entry(raw, i, path) for i, raw in enumerate(raw_entries)]
    dupes = duplicates(e.name for e in entries)
    if dupes:
        raise C128Error(f"{path}: duplicate entry name(s) {', '.join(dupes)}")
    where = f"{path} [series]"
    version, base = _str(head, "version", where, required=True), _str(head, "base", where)
    for key, value in (("version", version), ("base", base)):  # into trailers, wheel labels, progress and reports
        if not value.isprintable() or " " in value:
            raise C128Error(f"{where}: unsafe {key} {value!r} (one word, no spaces or control characters)")
    series = Series(root, check_entry_name(_str(head, "name", where, required=True), where), version, base, entries,
                    gates=parse_gates(doc.get("gates"), path))
    for file in (series.file_of(e, v) for e in entries for v in e.patch_files() or [None]):
        try:
            st = file.stat()  # (a link followed: readers follow it; a missing file is each verb's to report)
        except (OSError, ValueError):
            continue
        if stat.S_ISREG(st.st_mode):
            check_size(file, st.st_size)
    return series


def installed(root: Path) -> bool:
    """Is ``root`` the series packaged in an installed tool (``PACKAGE_DIR/_series``), never written?"""
    return root.resolve() == (PACKAGE_DIR / "_series").resolve()


def default_series_root() -> Path:
    """The series this tool carries: $C128PATCH_SERIES, the packaged copy, or the source checkout."""
    explicit = os.environ.get("C128PATCH_SERIES")
    if explicit:
        return Path(explicit)
    for candidate in (PACKAGE_DIR / "_series", PACKAGE_DIR.parents[1]):
        if (candidate / MANIFEST).is_file():
            return candidate
    raise C128Error("cannot find the patch series; pass --series DIR or set C128PATCH_SERIES")
