"""``verify-wheel``: does a patched wheel hold exactly what its provenance and SBOM say?

Checks, stopping at the first mismatch (one line, exit 1; bad input exits 2): RECORD and WHEEL's tags;
identity (METADATA, ``.dist-info`` and file name agree on the version its provenance implies); the
CycloneDX SBOM against the provenance, entry by entry (each patch's diff hashes to its sha256); every
entry's effect (overlays hash as recorded at their place in the chain: where a later entry, a layer's, edits one,
its file with the later diffs taken back; the diffs reverse-apply last to first, touched ``.py`` compile); with
``--series``/``--layer``, exactly that series and those layers; authenticity (``wheel.authentic``: upstream's
pinned wheel plus the declared diffs, else "cannot check", exit 2).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import unicodedata
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

from packaging.version import InvalidVersion, Version
from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from c128patch import procs
from c128patch.errors import C128Error, need_file
from c128patch.series.layers import layer_rows
from c128patch.series.manifest import Entry, Series
from c128patch.series.patchfile import hunk_header
from c128patch.series.provenance import record_problem
from c128patch.textsafe import plain
from c128patch.wheel.authentic import check_authentic, locate
from c128patch.wheel.patch import PACKAGE, WHEEL_PROVENANCE, apply_failure, loose_git, record_version
from c128patch.wheel.rules import wheel_path
from c128patch.wheel.sbom import (
    LAYER_FIELDS,
    LAYER_PREFIX,
    PROPERTY_PREFIX,
    SBOM_NAME,
    SPEC_VERSION,
    diff_bytes,
    indexed_properties,
    purl_pypi,
)
from c128patch.wheel.tools import InWheel, WheelMismatch, check_record, disk_errors, dist_info_dir


@dataclass
class VerifyResult:
    wheel: str
    version: str
    upstream: dict
    series: dict
    files: int
    entries: list[dict] = field(default_factory=list)
    compiled: int = 0
    authenticity: dict | None = None  # None: not checked (--no-authenticity)
    ok: bool = True
    layers: list[dict] = field(default_factory=list)  # the provenance's layers (name, version, base, digest, entries)
    unvouched: list[str] = field(default_factory=list)  # without authenticity: the members no check vouched for that
    # run code (entry points, compiled modules) or describe the install (.dist-info)


def _mismatch(wheel: Path, what: str) -> WheelMismatch:
    return WheelMismatch(f"{wheel.name}: {what}")


def _json(iw: InWheel, name: str, what: str) -> dict:
    if name not in iw.members():
        raise _mismatch(iw.wheel, f"no {what} ({name}); not a wheel made by c128patch")
    try:
        doc = json.loads(iw.read(name))
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer past Python's digit limit
        raise _mismatch(iw.wheel, f"{name} is not valid JSON ({exc})") from exc
    except RecursionError as exc:
        raise _mismatch(iw.wheel, f"{name} is nested too deeply to read") from exc
    if not isinstance(doc, dict):
        raise _mismatch(iw.wheel, f"{name} is not a JSON object")
    return doc


def _check_identity(iw: InWheel, record: dict) -> Version:
    if not iw.tags_match():
        raise _mismatch(iw.wheel, "the WHEEL file's tags differ from the file name's")
    meta = iw.metadata()
    if str(meta.name).lower() != PACKAGE:
        raise C128Error(f"not an sglang wheel: {iw.wheel.name} is {meta.name}")
    version = Version(str(meta.version))
    if version != iw.name.version:
        raise _mismatch(iw.wheel, f"METADATA version {version} differs from the file name's {iw.name.version}")
    if iw.dist_info != dist_info_dir(PACKAGE, version):
        raise _mismatch(iw.wheel, f".dist-info folder {iw.dist_info} does not match version {version}")
    try:
        want = record_version(record)
    except (InvalidVersion, C128Error) as exc:
        raise _mismatch(iw.wheel, f"provenance names no valid upstream version / series ({exc})") from exc
    if version != want:
        raise _mismatch(iw.wheel, f"version {version} is not the one its provenance implies ({want})")
    return version


def _check_sbom(iw: InWheel, doc: dict, record: dict, version: Version) -> list[bytes]:
    """SBOM vs provenance; returns each entry's diff, in series order."""
    comp = doc.get("metadata", {}).get("component", {})
    if doc.get("bomFormat") != "CycloneDX" or doc.get("specVersion") != SPEC_VERSION:
        raise _mismatch(iw.wheel, f"SBOM is not CycloneDX {SPEC_VERSION}")
    if (comp.get("name") != PACKAGE or comp.get("version") != str(version)
            or comp.get("purl") != purl_pypi(PACKAGE, str(version))):
        raise _mismatch(iw.wheel,
                        f"SBOM component is {comp.get('name')} {comp.get('version')}, not {PACKAGE} {version}")
    up = record.get("upstream", {})
    ancestors = comp.get("pedigree", {}).get("ancestors", [])
    if len(ancestors) != 1 or ancestors[0].get("purl") != purl_pypi(PACKAGE, str(up.get("version", ""))):
        raise _mismatch(iw.wheel, f"SBOM ancestor is not {purl_pypi(PACKAGE, str(up.get('version', '')))}")
    if up.get("wheel_sha256"):
        hashes = {h.get("alg"): h.get("content") for h in ancestors[0].get("hashes", [])}
        if hashes.get("SHA-256") != up["wheel_sha256"]:
            raise _mismatch(iw.wheel, "SBOM ancestor's sha256 differs from the provenance's upstream wheel_sha256")
    props = {p.get("name"): p.get("value") for p in comp.get("properties", [])}
    series = record.get("series", {})
    for key in ("name", "version", "digest"):
        if props.get(f"c128patch:series:{key}") != series.get(key):
            raise _mismatch(iw.wheel, f"SBOM series {key} {props.get(f'c128patch:series:{key}')!r} differs from the "
                                      f"provenance's {series.get(key)!r}")
    want_layers = [{k: str(r.get(k, "")) for k in LAYER_FIELDS} for r in record.get("layers", [])]
    have_layers = indexed_properties(doc, LAYER_PREFIX)
    if have_layers != want_layers:
        raise _mismatch(iw.wheel, f"SBOM layers {_names(have_layers)} differ from the provenance's "
                                  f"{_names(want_layers)} (name, version, base, digest)")
    patches = comp.get("pedigree", {}).get("patches", [])
    rows = indexed_properties(doc, PROPERTY_PREFIX)
    entries = record.get("entries", [])
    if not (len(patches) == len(rows) == len(entries)):
        raise _mismatch(iw.wheel,
                        f"SBOM lists {len(patches)} patches / {len(rows)} entries, the provenance {len(entries)}")
    return _entry_diffs(iw, patches, rows, entries)


def _entry_diffs(iw: InWheel, patches: list[dict], rows: list[dict], entries: list[dict]) -> list[bytes]:
    """Each SBOM patch and entry row against the provenance's entry; returns each entry's diff."""
    diffs = []
    for i, (patch, row, entry) in enumerate(zip(patches, rows, entries), 1):
        want = {"name": entry.get("name"), "kind": entry.get("kind"), "gate": entry.get("gate") or "none",
                "upstream": entry.get("upstream"), "upstream_status": entry.get("upstream_status"),
                "file": entry.get("file") or entry.get("source"), "sha256": entry.get("sha256")}
        for key, value in want.items():
            if row.get(key) != value:
                raise _mismatch(iw.wheel, f"SBOM entry {i} ({row.get('name')}): {key} {row.get(key)!r} differs from "
                                          f"the provenance's {value!r}")
        if patch.get("type") != "unofficial":
            raise _mismatch(iw.wheel, f"SBOM patch {i} ({entry.get('name')}) is not of type 'unofficial'")
        diff = diff_bytes(patch)
        if entry.get("kind") == "patch" and hashlib.sha256(diff).hexdigest() != entry.get("sha256"):
            raise _mismatch(iw.wheel, f"SBOM diff of entry '{entry.get('name')}' does not hash to its recorded sha256")
        diffs.append(diff)
    return diffs


def _names(rows: list) -> str:
    """Names (or name-version-digest tuples) as words, never a Python list."""
    return ", ".join(" ".join(str(x) for x in r) if isinstance(r, tuple) else str(r.get("name")) for r in rows) \
        or "none"


def _check_series(iw: InWheel, record: dict, series: Series) -> None:
    digest = series.ours.digest()
    have = record.get("series", {})
    if have.get("digest") != digest:
        raise _mismatch(iw.wheel, f"made from series {have.get('name')} {have.get('version')} "
                                  f"({str(have.get('digest'))[:8]}), not from {series.root} ({series.name} "
                                  f"{series.version}, {digest[:8]})")
    layers = [(r.get("name"), r.get("version"), str(r.get("digest", ""))[:8]) for r in record.get("layers", [])]
    want = [(r["name"], r["version"], r["digest"][:8]) for r in layer_rows(series)]
    if layers != want:
        said = [f"the layers {_names(rows)} (name, version, digest)" if rows else "no layers"
                for rows in (layers, want)]
        raise _mismatch(iw.wheel, f"made with {said[0]}, not {said[1]}")
    for r, w, layer in zip(record.get("layers", []), layer_rows(series), series.layers):  # (its entries: doctor's)
        if r.get("entries") != w["entries"]:
            raise _mismatch(iw.wheel, f"its record of layer {w['name']} lists other entries than {layer.root} has "
                                      "(the provenance was edited)")
    names = {e.name for e in series.entries}
    for entry in record.get("entries", []):
        if entry.get("name") not in names:  # a mismatch of the wheel (exit 1), not bad input
            raise _mismatch(iw.wheel, f"entry {str(entry.get('name'))!r} is not one of {series.root}'s")
        e = series.entry(entry["name"])
        want = e.sha256
        if entry.get("file"):
            want = next((v.sha256 for v in e.patch_files() if v.file == entry["file"]), "")
        if want and entry.get("sha256") != want:
            raise _mismatch(iw.wheel, f"entry '{e.name}': its file's sha256 differs from the manifest's")
        if why := _unlike(entry, e):
            raise _mismatch(iw.wheel, f"entry '{e.name}': {why} {series.root}'s")
    dropped = record.get("dropped", [])
    if not isinstance(dropped, list) or not all(isinstance(d, dict) for d in dropped):
        raise _mismatch(iw.wheel, "its provenance's dropped entries are not a list of records (the provenance was "
                                  "edited)")
    _left_out(iw, record.get("entries", []), dropped, series, f"made from {series.root} by its digest")


def _unlike(row: dict, e: Entry) -> str:
    """How a provenance row differs from the series' entry ``e`` in what its hashes do not cover: its kind, its gate, an
    overlay's place (its file hashed, where it lies not: an overlay moved to another module verified as the series)."""
    if row.get("kind") != e.kind:
        return f"its kind {str(row.get('kind'))!r} is not"
    if (row.get("gate") or "") != (e.gate or ""):
        return f"its gate {str(row.get('gate'))!r} is not"
    if e.kind == "overlay" and row.get("target") != e.target:  # (its files: only its target, `_check_effects`)
        return f"its overlay's place {str(row.get('target'))!r} is not"
    return ""


def _left_out(iw: InWheel, listed: list[dict], dropped: list[dict], series: Series, said: str) -> None:
    """Every entry of ``series`` is listed, or dropped where the series records its upstream merge: the series' digest
    vouches for every entry (``said``: how the wheel takes the series)."""
    entries = {e.name: e for e in series.entries}
    rows = {r.get("name") for r in listed}
    if missing := [name for name in entries if name not in rows | {d.get("name") for d in dropped}]:
        raise _mismatch(iw.wheel, f"{said}, but lists no entry {missing[0]!r} (the provenance was edited)")
    if unmerged := [name for name in entries if name not in rows and not entries[name].merged_in]:
        # our digest vouches for every entry: one left out is vouched for only where the series records it upstream
        raise _mismatch(iw.wheel, f"{said}, but leaves out entry {unmerged[0]!r}, which that series records no "
                                  "upstream merge of (a wheel of a tree a rebase dropped it from: refresh the series, "
                                  "which records the merge, then build again)")


def _claims(s: dict, known: Series) -> bool:
    """Does the record ``s`` claim ``known``: by the digest the wheel's version label shows (its first 8 characters:
    a series of another name but that prefix read as ours, helper 100), or by its name as a reader sees it (any case,
    no zero-width characters, NFKC) and its version as the label prints it."""
    if str(s.get("digest", ""))[:8] == known.digest()[:8]:
        return True
    try:
        same = Version(f"0+{s.get('version')}") == Version(f"0+{known.version}")
    except InvalidVersion:
        same = s.get("version") == known.version
    seen = unicodedata.normalize("NFKC", plain(str(s.get("name")))).strip().casefold()
    return same and seen == known.name.casefold()


def _check_known(iw: InWheel, record: dict, known: Series) -> None:
    """A wheel claiming this tool's series (``_claims``: by the digest its version label shows, or by its name and
    version as a reader takes them) carries that series' digest, files and gates."""
    s = record.get("series", {})
    if not _claims(s, known):
        return
    if (s.get("name"), s.get("version")) != (known.name, known.version):
        raise _mismatch(iw.wheel, f"claims series {known.name} {known.version} as {str(s.get('name'))!r} "
                                  f"{str(s.get('version'))!r} (the provenance was edited)")
    if s.get("digest") != known.digest():
        raise _mismatch(iw.wheel, f"claims series {known.name} {known.version}, but its digest "  # (in full: the
                                  f"{plain(str(s.get('digest')))} is not that series' ({known.digest()})")  # label's 8
        # characters may be the same)
    entries = {e.name: e for e in known.entries}
    layered = set()  # a layer's entries are "<layer>/<entry>": a name of ours listed under a layer is still ours
    for r in record.get("layers", []):
        names = r.get("entries", [])
        if not isinstance(names, list) or not all(isinstance(n, str) and n.startswith(f"{r.get('name')}/")
                                                  and n not in entries for n in names):
            raise _mismatch(iw.wheel, f"layer {str(r.get('name'))!r} lists entries not named '<layer>/<entry>' "
                                      "(the provenance was edited)")
        layered |= set(names)
    listed, dropped = record.get("entries", []), record.get("dropped", [])
    if not all(isinstance(x, list) and all(isinstance(r, dict) for r in x) for x in (listed, dropped)):
        raise _mismatch(iw.wheel, "its provenance's entries or dropped entries are not a list of records (the "
                                  "provenance was edited)")
    _left_out(iw, listed, dropped, known, f"claims series {known.name} {known.version}")
    for row in (r for r in record.get("entries", []) if r.get("name") not in layered):
        e = entries.get(row.get("name"))
        files = ({v.sha256 for v in e.patch_files()} | {e.sha256}) - {""} if e is not None else set()
        if e is None or (files and row.get("sha256") not in files) or _unlike(row, e):
            raise _mismatch(iw.wheel, f"entry '{row.get('name')}': its file, gate, kind or overlay's place is not "
                                      f"series {known.name} {known.version}'s (the provenance was edited)")


def _post_image_hunk(diff: bytes, path: str, num: int) -> tuple[int, str] | None:
    """(number, header) of the hunk of ``diff`` whose post-image holds a line (what ``git apply -R`` refuses)."""
    try:
        for pf in PatchSet(diff.decode("utf-8", errors="replace")):
            for n, hunk in enumerate(pf if wheel_path(pf.path) == path else [], 1):
                if hunk.target_start <= num < hunk.target_start + max(hunk.target_length, 1):
                    return n, hunk_header(hunk)
    except UnidiffParseError:
        pass
    return None


def _edited_later(entries: list[dict]) -> dict[int, str]:
    """Overlay index -> the name of the first later entry whose files hold its target (a layer's edit of our file)."""
    out = {}
    for i, e in enumerate(entries):
        if e.get("kind") == "overlay":
            later = next((x for x in entries[i + 1:] if e.get("target") in x.get("files", [])), None)
            if later is not None:
                out[i] = str(later.get("name"))
    return out


def _overlay_hash(iw: InWheel, e: dict, path: Path, later: str = "") -> None:
    """The overlay's file ``path`` (the wheel's, or as the chain has it before ``later``'s edit) hashes as recorded."""
    where = f" (as the wheel has it before the entries from '{later}' on)" if later else ""
    if not path.is_file():
        raise _mismatch(iw.wheel, f"overlay '{e['name']}': {wheel_path(e['target'])}{where} is missing from the wheel")
    if hashlib.sha256(path.read_bytes()).hexdigest() != e.get("sha256"):
        raise _mismatch(iw.wheel, f"overlay '{e['name']}': {wheel_path(e['target'])}{where} differs from the "
                                  "recorded sha256")


def _check_effects(iw: InWheel, record: dict, diffs: list[bytes]) -> tuple[list[dict], int]:
    """Each entry present: an overlay's file hashes as recorded at its place in the chain (the wheel's file, or, where a
    later entry edits it, that file with the later entries' diffs taken back), the diffs reverse-apply last to first."""
    entries = record.get("entries", [])
    touched = sorted({wheel_path(p) for e in entries for p in e.get("files", [])})
    iw.extract(touched)
    later = _edited_later(entries)
    for i, e in ((i, e) for i, e in enumerate(entries) if e.get("kind") == "overlay"):
        target = wheel_path(e["target"])
        if i not in later:
            if target not in iw.members():
                raise _mismatch(iw.wheel, f"overlay '{e['name']}': {target} is missing from the wheel")
            _overlay_hash(iw, e, iw.root / target)
        # its diff is not hashed (a git diff of the file as built): it may add that one file and nothing else
        sides = _diff_sides(diffs[i])
        if sides != [("/dev/null", f"b/python/{target}")] or [wheel_path(f) for f in e.get("files", [])] != [target]:
            raise _mismatch(iw.wheel, f"overlay '{e['name']}': its diff or files name more than the new file {target}"
                                      " (the SBOM or the provenance was edited)")
    compiled = _compile(iw, [p for p in touched if p in iw.members()])
    rows = []
    with procs.scratch("c128patch-verify-") as tmp:
        scratch = Path(tmp) / "tree"  # a copy: the reverse chain must not change the wheel's view
        for path in touched:
            if (iw.root / path).is_file():
                (scratch / path).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(iw.root / path, scratch / path)
        scratch.mkdir(exist_ok=True)
        git = loose_git(scratch)
        for i in reversed(range(len(entries))):
            e = entries[i]
            if i in later:  # every later entry's diff taken back: the file as this overlay wrote it
                _overlay_hash(iw, e, scratch / wheel_path(e["target"]), later[i])
            diff_file = Path(tmp) / f"{i:03d}.diff"  # outside the scratch tree
            diff_file.write_bytes(diffs[i])
            proc = git.run("apply", "-R", "-p2", str(diff_file), check=False)
            if proc.returncode != 0:
                raise _mismatch(iw.wheel, f"entry '{e['name']}' is not in the wheel as recorded: "
                                          f"{apply_failure(proc.stderr, partial(_post_image_hunk, diffs[i]))}")
            rows.append({"name": e["name"], "kind": e.get("kind"), "status": "present"})
    return list(reversed(rows)), compiled


def _diff_sides(diff: bytes) -> list[tuple[str, str]]:
    """(source, target) of each file of ``diff`` (none when it does not parse)."""
    try:
        return [(pf.source_file, pf.target_file) for pf in PatchSet(diff.decode("utf-8", errors="replace"))]
    except UnidiffParseError:
        return []


def _compile(iw: InWheel, names: list[str]) -> int:
    """Compile every ``.py`` of ``names`` (members, as edited); returns how many."""
    sources = [n for n in names if n.endswith(".py")]
    for name in sources:
        try:
            compile(iw.read(name), name, "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as exc:
            raise _mismatch(iw.wheel, f"{name} does not compile: {exc}") from exc
        except (RecursionError, MemoryError) as exc:  # (``1+1+...`` 200,000 deep: a traceback with --compile-all)
            raise _mismatch(iw.wheel, f"{name} does not compile: nested too deeply ({type(exc).__name__})") from None
    return len(sources)


def _code_at_start(iw: InWheel) -> list[str]:
    """Members that run as the wheel is installed or Python starts, and that no sglang release wheel has: a ``.pth``
    file where site-packages' root receives it (the wheel's root, its ``.data/purelib`` or ``platlib``), a
    ``.data/scripts`` program, a ``.data/data`` file (written anywhere under the environment's prefix)."""
    data = f"{iw.dist_info.removesuffix('.dist-info')}.data/"
    return [n for n in iw.members() if n.endswith(".pth") and n.count("/") == 0
            or n.startswith(data) and (n.split("/")[1] in ("scripts", "data") or n.endswith(".pth")
                                       and n.count("/") == 2)]


def _unvouched(iw: InWheel, record: dict) -> list[str]:
    """What only authenticity vouches for, of what runs code or describes the install: the ``.dist-info`` files (but
    RECORD, which is checked, and the SBOM) and the compiled modules no entry of ``record`` touches."""
    own = {f"{iw.dist_info}/RECORD", f"{iw.dist_info}/sboms/{SBOM_NAME}"}
    touched = {wheel_path(p) for e in record.get("entries", []) for p in e.get("files", [])}
    return [n for n in iw.members() if n not in own and n not in touched
            and (n.startswith(f"{iw.dist_info}/") or n.endswith((".so", ".pyd", ".dylib")))]


def verify_wheel(wheel: Path, series: Series | None = None, compile_all: bool = False, *, authenticity: bool = False,
                 upstream_wheel: Path | None = None, known: Series | None = None) -> VerifyResult:
    """Every check; authenticity against ``upstream_wheel``, a wheelhouse's, or one downloaded;
    ``known``: this tool's series, which a wheel claiming its name and version must match."""
    need_file(wheel, "missing wheel", "not a wheel")
    with disk_errors(f"verifying {wheel.name}"):
        rec = check_record(wheel)
        with InWheel(wheel) as iw:
            record = _json(iw, WHEEL_PROVENANCE, "c128patch provenance")
            problem = record_problem(record)
            if problem:
                raise _mismatch(wheel, f"{WHEEL_PROVENANCE} is not a c128patch provenance record ({problem})")
            version = _check_identity(iw, record)
            doc = _json(iw, f"{iw.dist_info}/sboms/{SBOM_NAME}", "c128patch SBOM")
            try:
                diffs = _check_sbom(iw, doc, record, version)
            except (AttributeError, TypeError, KeyError, ValueError) as exc:
                raise _mismatch(wheel, f"SBOM has the wrong shape ({type(exc).__name__}: {exc})") from exc
            if series is not None:
                _check_series(iw, record, series)
            elif known is not None:
                _check_known(iw, record, known)
            rows, compiled = _check_effects(iw, record, diffs)
            if compile_all:
                compiled = _compile(iw, iw.members())
            auth, unvouched = None, []
            if authenticity:
                path, found = locate(record, wheel, upstream_wheel)
                auth = asdict(check_authentic(wheel, rec.hashes, iw.dist_info, version, record, diffs, path, found))
            elif runs := _code_at_start(iw):  # (authenticity refuses them: not upstream's, no entry adds them)
                raise _mismatch(wheel, f"{plain(runs[0])}: a .pth at site-packages' root runs at every Python start, "
                                       ".data/scripts and .data/data are installed outside it; no sglang release "
                                       "wheel has one, and nothing vouches for it without upstream's wheel "
                                       "(--no-authenticity): run without it")
            else:
                unvouched = _unvouched(iw, record)
    return VerifyResult(str(wheel), str(version), record.get("upstream", {}), record.get("series", {}),
                        rec.files, rows, compiled, auth, layers=record.get("layers", []), unvouched=unvouched)
