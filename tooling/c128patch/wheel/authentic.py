"""Authenticity: a patched wheel is its upstream wheel plus exactly the diffs it declares.

With the upstream wheel the provenance pins (name, sha256: given, in a wheelhouse/the cache, or
downloaded), every SBOM diff is applied forward (``git apply -p2``, strict) to upstream's files,
``.dist-info`` renamed and METADATA's Version set: the patched wheel must hold exactly those files
with those bytes, plus the provenance and SBOM. No file the series does not touch can differ.
"""

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version
from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from c128patch import procs
from c128patch.errors import C128Error
from c128patch.upstream.releases import (
    PACKAGE,
    WheelTarget,
    WheelZip,
    cached_wheel,
    file_sha256,
    local_wheels,
    pip_download,
)
from c128patch.wheel.patch import WHEEL_PROVENANCE, loose_git
from c128patch.wheel.rules import wheel_path
from c128patch.wheel.sbom import SBOM_NAME
from c128patch.wheel.tools import (
    WheelMismatch,
    check_archive,
    dist_info_dir,
    record_hash,
    record_hashes,
    set_metadata_version,
)

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class AuthenticityUnknown(C128Error):
    """Authenticity cannot be checked here (no upstream wheel, or none to compare with)."""


@dataclass
class Authenticity:
    upstream_wheel: str
    upstream_sha256: str
    found: str  # given / wheelhouse / downloaded
    identical: int  # files byte-identical to upstream's
    derived: int  # files the declared diffs make (or remove) from upstream's


def pinned(record: dict, wheel: Path) -> tuple[str, str, Version]:
    """(upstream wheel file name, its sha256, its version) as the provenance pins them."""
    up = record.get("upstream", {})
    if up.get("source") != "release-wheel":
        raise AuthenticityUnknown(f"cannot check authenticity: {wheel.name} was built from source "
                                  f"({up.get('source')!r} at {str(up.get('rev') or up.get('commit') or '?')[:40]}), "
                                  "not patched from an upstream wheel; rerun with --no-authenticity for the integrity "
                                  "checks alone")
    name, sha, version = up.get("wheel"), up.get("wheel_sha256"), up.get("version")
    if not isinstance(sha, str) or not _SHA256.match(sha):
        raise WheelMismatch(f"{wheel.name}: provenance pins no upstream wheel sha256 (got {sha!r})")
    if not isinstance(name, str) or "/" in name or "\\" in name or name.startswith("."):
        raise WheelMismatch(f"{wheel.name}: provenance names no upstream wheel file (got {name!r})")
    try:
        dist, ver, _build, _tags = parse_wheel_filename(name)
        if str(dist) != PACKAGE or ver != Version(str(version)):
            raise WheelMismatch(f"{wheel.name}: provenance's upstream wheel {name} is not sglang {version}")
    except (InvalidWheelFilename, InvalidVersion) as exc:
        raise WheelMismatch(f"{wheel.name}: provenance's upstream wheel {name!r} is not a wheel name ({exc})") from exc
    return name, sha, ver


def locate(record: dict, wheel: Path, given: Path | None) -> tuple[Path, str]:
    """The pinned upstream wheel (given, a wheelhouse's, or downloaded); another sha256 is a mismatch (exit 1)."""
    name, sha, version = pinned(record, wheel)

    def checked(path: Path, found: str) -> tuple[Path, str]:
        have = file_sha256(path)
        if have != sha:
            raise WheelMismatch(f"{wheel.name}: not made from the upstream wheel at hand: its provenance pins {name} "
                                f"sha256 {sha[:16]}…, {path} has {have[:16]}…")
        return path, found

    if given is not None:
        if not given.is_file():
            raise C128Error(f"--upstream-wheel {given}: no such file")
        return checked(given, "given")
    for path in local_wheels(str(version)):
        if path.name == name:
            return checked(cached_wheel(path), "wheelhouse")
    _dist, _ver, _build, tags = parse_wheel_filename(name)
    tag = sorted(tags, key=str)[0]
    target = WheelTarget(tag.interpreter if tag.interpreter.startswith(("cp", "pp")) else None,
                         None if tag.platform == "any" else tag.platform)
    ok, last = pip_download(str(version), (*target.pip_args(), "--retries", "1", "--timeout", "15"))
    for path in local_wheels(str(version)):
        if path.name == name:
            return checked(cached_wheel(path), "downloaded")
    raise AuthenticityUnknown(f"cannot check authenticity: no upstream wheel {name} here (give --upstream-wheel PATH "
                              f"or go online; pip download: {last}); "
                              "--no-authenticity skips this check")


def _diff_paths(diff: bytes) -> list[str]:
    """The wheel paths a diff reads or writes (both sides of renames; none when it does not parse)."""
    try:
        files = PatchSet(diff.decode("utf-8", errors="replace"))
    except UnidiffParseError:
        return []
    sides = (side for pf in files for side in (pf.source_file, pf.target_file) if side != "/dev/null")
    return list(dict.fromkeys(wheel_path(side[2:] if side.startswith(("a/", "b/")) else side) for side in sides))


def _expected(upstream: zipfile.ZipFile, up_wheel: Path, dist_info: str, version: Version) -> dict[str, str]:
    """name -> RECORD hash of upstream's files as the patched wheel lays them out (RECORD left out)."""
    up_dist = dist_info_dir(PACKAGE, Version(str(parse_wheel_filename(up_wheel.name)[1])))
    try:  # upstream's RECORD (pinned by sha256, so upstream's): no need to rehash 120 MB
        listed = record_hashes(upstream.read(f"{up_dist}/RECORD").decode("utf-8"))
    except (KeyError, UnicodeDecodeError):
        listed = {}
    out: dict[str, str] = {}
    for info in upstream.infolist():
        if info.is_dir() or info.filename == f"{up_dist}/RECORD":
            continue
        name = info.filename
        if name.startswith(f"{up_dist}/"):
            name = f"{dist_info}/{name.removeprefix(up_dist + '/')}"
        if name == f"{dist_info}/METADATA":
            out[name] = record_hash(set_metadata_version(upstream.read(info), version, up_wheel.name))
        else:
            out[name] = listed.get(info.filename) or record_hash(upstream.read(info))
    return out


def check_authentic(wheel: Path, hashes: dict[str, str], dist_info: str, version: Version, record: dict,
                    diffs: list[bytes], upstream_wheel: Path, found: str) -> Authenticity:
    """``wheel`` (its checked RECORD ``hashes``) is ``upstream_wheel`` + ``diffs`` + provenance and SBOM."""
    entries = record.get("entries", [])
    with WheelZip(upstream_wheel) as up:
        check_archive(up.infolist(), upstream_wheel)
        expected = _expected(up, upstream_wheel, dist_info, version)
        with procs.scratch("c128patch-authentic-") as tmp:
            scratch = Path(tmp) / "tree"
            scratch.mkdir()
            git = loose_git(scratch)
            touched: set[str] = set()
            for i, diff in enumerate(diffs):
                diff_file = Path(tmp) / f"{i:03d}.diff"
                diff_file.write_bytes(diff)
                paths = _diff_paths(diff)
                for path in paths:
                    if path in touched or path not in expected or path.startswith(f"{dist_info}/"):
                        continue
                    dest = scratch / path
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    dest.write_bytes(up.read(path))
                touched |= set(paths)
                proc = git.run("apply", "-p2", str(diff_file), check=False)
                name = entries[i].get("name") if i < len(entries) else f"#{i + 1}"
                if proc.returncode != 0:
                    err = (proc.stderr.strip().splitlines() or ["git apply failed"])[-1].removeprefix("error: ")
                    raise WheelMismatch(f"{wheel.name}: entry '{name}' does not apply to upstream's "
                                        f"{upstream_wheel.name}: {err}")
            for path in sorted(touched):
                target = scratch / path
                if target.is_file():
                    expected[path] = record_hash(target.read_bytes())
                else:
                    expected.pop(path, None)
    own = {WHEEL_PROVENANCE, f"{dist_info}/sboms/{SBOM_NAME}"}
    have = {n: h for n, h in hashes.items() if n != f"{dist_info}/RECORD" and n not in own}
    for name in sorted(set(expected) - set(have)):
        raise WheelMismatch(f"{wheel.name}: {name} of upstream's {upstream_wheel.name} is missing and no entry removes "
                            "it")
    for name in sorted(set(have) - set(expected)):
        raise WheelMismatch(f"{wheel.name}: {name} is not in upstream's {upstream_wheel.name} and no entry adds it")
    for name in sorted(have):
        if have[name] != expected[name]:
            how = ("is not what the series' diffs make of upstream's" if name in touched
                   else f"differs from upstream's {upstream_wheel.name} and no entry changes it")
            raise WheelMismatch(f"{wheel.name}: {name} {how}")
    return Authenticity(upstream_wheel.name, str(record["upstream"]["wheel_sha256"]), found,
                        len(have) - len(touched & set(have)), len(touched))
