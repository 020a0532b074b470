"""Open a wheel, edit it as a folder, write it back reproducibly (after auditwheel's ``InWheel``).

``save()`` regenerates RECORD (``WheelFile``), orders entries (package first, ``.dist-info`` last),
stamps SOURCE_DATE_EPOCH, normalises modes to 0644/0755, keeps the deflate stream of a member it did not change
(``WheelZip.deflated``: read whole, CRC checked, exactly its content; only from a wheel whose bytes are known,
``keep_streams``) under headers of its own: the same inputs give the same bytes. It writes inside the destination
and renames at the end; a killed run's folders (by pid) are swept.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import errno
import hashlib
import io
import os
import re
import shutil
import stat
import time
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Iterator
from unittest import mock

from packaging.metadata import InvalidMetadata, Metadata, parse_email
from packaging.tags import parse_tag
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version
from wheel.wheelfile import MINIMUM_TIMESTAMP, WHEEL_INFO_RE, WheelError, WheelFile

from c128patch import exitcodes
from c128patch.errors import C128Error, need_file
from c128patch.git import folded_name, is_git_dir_name
from c128patch.ops.treestate import fault_point
from c128patch.procs import scratch_dir
from c128patch.series.paths import CONTROL
from c128patch.upstream.releases import BINARY_SUFFIXES, WheelZip


@dataclass(frozen=True)
class WheelName:
    """The parts of a wheel file name (PEP 427), kept as written so tags survive a rename."""

    name: str
    version: Version
    build: str
    tags: str  # "pyver-abi-plat", exactly as in the file name

    @classmethod
    def parse(cls, path: Path) -> "WheelName":
        if not path.name.endswith(".whl"):
            raise C128Error(f"not a wheel: {path} (the file name must end in .whl)")
        try:
            name, version, _build, _tags = parse_wheel_filename(path.name)
        except InvalidWheelFilename as exc:
            raise C128Error(f"not a wheel: {path} ({exc})") from exc
        match = WHEEL_INFO_RE.match(path.name)
        return cls(str(name), version, match.group("build") or "",
                   f"{match.group('pyver')}-{match.group('abi')}-{match.group('plat')}")

    def filename(self, version: Version) -> str:
        """The file name with ``version`` in place of ours (tags and build number unchanged)."""
        build = f"-{self.build}" if self.build else ""
        return f"{dist_name(self.name)}-{version}{build}-{self.tags}.whl"


def dist_name(name: str) -> str:
    """The distribution name as wheel file names and .dist-info folders spell it."""
    return canonicalize_name(name).replace("-", "_")


def dist_info_dir(name: str, version: Version) -> str:
    return f"{dist_name(name)}-{version}.dist-info"


MAX_EPOCH = 4354819199  # 2107-12-31 23:59:59 UTC: the zip format's last date
MAX_UNPACKED = 2 << 30  # bytes: sglang 0.5.23 unpacks to 123 MB
MAX_RATIO = 100  # unpacked / archive size: sglang wheels are ~3.3:1
_READABLE = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA)  # what zipfile reads
_FILE_TYPES = {stat.S_IFLNK: "a symlink", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
               stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket"}


def check_archive(infos: list[zipfile.ZipInfo], wheel: Path, error: type[C128Error] = C128Error) -> None:
    """Refuse members that are unsafe (outside the unpack folder, not plain), duplicate, or over the size limits."""
    seen: set[str] = set()
    files = {i.filename for i in infos if not i.is_dir()}
    folded: dict[str, str] = {}  # a case-insensitive file system (macOS, Windows) unpacks one over the other
    for info in infos:
        name = info.filename
        parts = [p for p in name.split("/") if p not in ("", ".")]  # as PurePosixPath(name).parts has them
        if (not name or name.startswith("/") or "\\" in name or ":" in name or ".." in parts or CONTROL.search(name)
                or any(is_git_dir_name(p) for p in parts)):  # (":": an NTFS stream, ``x.py::$DATA``)
            raise error(f"not a wheel: {wheel} has an unsafe member name {name!r}")
        # case, NFC, trailing dots and spaces: one file to some file systems; pip installs <dist>.data/purelib/X
        # (and platlib/) at X: one file with the member X (helper 100: a payload over a file the series patches)
        installed = parts[2:] if len(parts) > 2 and parts[0].endswith(".data") and parts[1] in ("purelib", "platlib") \
            else parts
        key = "/".join(folded_name(p) for p in installed)
        if (other := folded.setdefault(key, name.rstrip("/"))) != name.rstrip("/"):
            raise error(f"{wheel.name}: members {other!r} and {name!r} are one file on some file systems (case, "
                        "Unicode normalisation or trailing dots and spaces: one overwrites the other); refusing the "
                        "wheel")
        folders = ["/".join(parts[:n]) for n in range(len(parts) - 1, 0, -1)] + (["."] if parts else [])  # parents
        if clash := next((folder for folder in folders if folder in files), None):
            raise error(f"{wheel.name}: member {clash} is a file and the folder of {name}; refusing the wheel")
        if info.flag_bits & 0x1 or info.compress_type not in _READABLE:  # (a traceback where it was read)
            raise error(f"{wheel.name}: member {name} is encrypted or compressed by a method zipfile cannot read "
                        f"(flags {info.flag_bits:#x}, method {info.compress_type}); refusing the wheel")
        kind = _FILE_TYPES.get(stat.S_IFMT(info.external_attr >> 16))
        if kind:
            raise error(f"{wheel.name}: member {name} is {kind}, not a regular file; refusing the wheel")
        if name in seen:
            raise error(f"{wheel.name}: duplicate archive member {name!r} (one copy shadows the other); "
                        "refusing the wheel")
        seen.add(name)
    total = sum(i.file_size for i in infos)
    size = max(wheel.stat().st_size, 1)
    if total > MAX_UNPACKED or total > MAX_RATIO * size:
        raise C128Error(f"{wheel.name}: unpacks to {total / 2**20:.0f} MiB from {size / 2**20:.1f} MiB "
                        f"({total / size:.0f}:1); the limits are {MAX_UNPACKED >> 30} GiB in total and {MAX_RATIO}:1 "
                        "(a zip bomb?)")


def record_hash(data: bytes) -> str:
    """A file's hash as RECORD writes it."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def record_hashes(text: str) -> dict[str, str]:
    """name -> sha256 hash of the RECORD rows that carry one."""
    rows = csv.reader(io.StringIO(text, newline=""))
    return {row[0]: row[1] for row in rows if len(row) >= 2 and row[1].startswith("sha256=")}


def set_metadata_version(data: bytes, version: Version, where: str) -> bytes:
    """METADATA with its one ``Version:`` line set (not re-generated: that would re-fold sglang's page-long
    License); ``packaging.metadata`` parses both sides to prove no other field moved."""
    head_end = data.find(b"\n\n")
    head = data if head_end < 0 else data[: head_end + 1]
    lines = list(re.finditer(rb"^Version:[ \t]*(\S*)[ \t]*\r?$", head, re.MULTILINE))
    if len(lines) != 1:
        raise C128Error(f"{where}: METADATA must hold exactly one Version field, found {len(lines)}")
    out = data[: lines[0].start()] + b"Version: " + str(version).encode() + data[lines[0].end() :]
    before, _ = parse_email(data)
    after, _ = parse_email(out)
    if after.get("version") != str(version) or {**before, "version": None} != {**after, "version": None}:
        raise C128Error(f"{where}: rewriting the METADATA Version field changed other fields")
    return out


def source_date_epoch(default: int) -> int:
    raw = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if not raw:
        return default
    if not (raw.isascii() and raw.isdigit()):
        raise C128Error(f"SOURCE_DATE_EPOCH must be a whole number of seconds, not {raw!r}")
    if int(raw) > MAX_EPOCH:
        raise C128Error(f"SOURCE_DATE_EPOCH={raw} is after 2107-12-31, the last time a zip archive can store")
    return int(raw)


@contextlib.contextmanager
def disk_errors(what: str) -> Iterator[None]:
    """A full disk, a quota or a file size limit (``ulimit -f``) while ``what`` runs: one line."""
    try:
        yield
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise C128Error(f"disk full while {what} ({exc.filename or 'a temporary file'}: {exc.strerror}); "
                            "nothing was written; free space (or set TMPDIR) and run it again") from None
        if exc.errno == errno.EFBIG:
            raise C128Error(f"file size limit reached while {what} ({exc.filename or 'a file'}: {exc.strerror}); "
                            "raise it (ulimit -f unlimited) and run it again; nothing was written") from None
        raise


TEMP_PREFIX = ".c128patch-"


class InWheel:
    """A wheel opened as a folder (``root``: the ``.dist-info`` plus what ``extract`` brings out). Anything written
    under ``root`` goes into the saved wheel; members never extracted are copied from the archive at ``save()``; a
    member extracted and then deleted is dropped."""

    def __init__(self, wheel: Path) -> None:
        need_file(wheel, "missing wheel", "not a wheel")
        self.wheel = wheel
        self.name = WheelName.parse(wheel)
        self._members: dict[str, zipfile.ZipInfo] = {}
        self._extracted: set[str] = set()
        self.dist_info = ""
        # save() copies an unchanged member's deflate stream (its encoding, not only its content: bits no reader looks
        # at, a crafted wheel's own): only from a wheel whose bytes are known (the release's download, our build)
        self.keep_streams = True

    def __enter__(self) -> "InWheel":
        self._zip = WheelZip(self.wheel)
        self._tmp = Path(scratch_dir("c128patch-wheel-"))
        self.root = self._tmp / "wheel"  # the wheel as a folder
        try:
            check_archive(self._zip.infolist(), self.wheel)
            self._members = {info.filename: info for info in self._zip.infolist() if not info.is_dir()}
            tops = {n.split("/", 1)[0] for n in self._members}
            dist_infos = sorted(t for t in tops if t.endswith(".dist-info"))
            if len(dist_infos) != 1:
                raise C128Error(f"not a wheel: {self.wheel} has {len(dist_infos)} .dist-info folders, not one")
            self.dist_info = dist_infos[0]
            for required in ("WHEEL", "METADATA", "RECORD"):
                if f"{self.dist_info}/{required}" not in self._members:
                    raise C128Error(f"not a wheel: {self.wheel} has no {self.dist_info}/{required}")
            self.root.mkdir()
            self.extract([n for n in self._members if n.startswith(f"{self.dist_info}/")])
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._zip.close()
        shutil.rmtree(self._tmp, ignore_errors=True)

    def members(self) -> list[str]:
        """The files of the original wheel, as archive names."""
        return sorted(self._members)

    def read(self, name: str) -> bytes:
        """A member's current bytes (the edited file if it was extracted)."""
        if name in self._extracted:
            return (self.root / name).read_bytes()
        return self._zip.read(self._members[name])

    def extract(self, names: list[str]) -> None:
        """Bring these members out into ``root`` (names not in the wheel are skipped)."""
        for name in names:
            info = self._members.get(name)
            if info is None or name in self._extracted:
                continue
            dest = self.root / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(self._zip.read(info))
            if (info.external_attr >> 16) & 0o111:  # executable in the archive
                dest.chmod(0o755)
            self._extracted.add(name)

    def tags_match(self) -> bool:
        """Do the WHEEL file's ``Tag:`` lines name exactly the file name's tags (a renamed wheel claims a platform or
        interpreter its build is not for)?"""
        text = self.read(f"{self.dist_info}/WHEEL").decode("utf-8", errors="replace")
        try:
            tags = {t for line in text.splitlines() if line.startswith("Tag:") for t in parse_tag(line[4:].strip())}
        except ValueError:
            return False
        return tags == set(parse_wheel_filename(self.wheel.name)[3])

    def metadata(self) -> Metadata:
        """METADATA parsed, with a Name and a valid Version (a bad one is a one-line error)."""
        try:
            meta = Metadata.from_email(self.read(f"{self.dist_info}/METADATA"), validate=False)
            meta.name, meta.version  # noqa: B018 (packaging validates fields lazily, on access)
            return meta
        except (InvalidMetadata, ValueError) as exc:
            raise C128Error(f"{self.wheel.name}: METADATA cannot be parsed ({exc})") from exc

    def files(self) -> list[str]:
        """Every file the saved wheel will hold, as archive names, sorted."""
        on_disk = {p.relative_to(self.root).as_posix() for p in self.root.rglob("*") if p.is_file() or p.is_symlink()}
        return sorted(on_disk | (set(self._members) - self._extracted))

    def rename_dist_info(self, version: Version) -> str:
        """Give the .dist-info folder and METADATA the new version; returns the new folder name."""
        meta_path = self.root / self.dist_info / "METADATA"
        meta_path.write_bytes(set_metadata_version(meta_path.read_bytes(), version, self.wheel.name))
        new = dist_info_dir(self.name.name, version)
        (self.root / self.dist_info).rename(self.root / new)
        self.dist_info = new
        return new

    def save(self, dest_dir: Path, version: Version, epoch: int) -> Path:
        """Write ``dest_dir/<name>-<version>-<tags>.whl`` (stamped ``epoch`` unless SOURCE_DATE_EPOCH is set)."""
        epoch = source_date_epoch(epoch)
        dest = dest_dir / self.name.filename(version)
        created = not dest_dir.exists()
        dest_dir.mkdir(parents=True, exist_ok=True)
        work = Path(scratch_dir(TEMP_PREFIX, dest_dir))  # a killed run's partial wheel swept first
        try:
            part = work / dest.name  # WheelFile takes the .dist-info name from the file name
            self._write(part, epoch)
            fault_point("at", "wheel-write")
            os.replace(part, dest)
        except BaseException as exc:
            if created:
                shutil.rmtree(dest_dir, ignore_errors=True)
            if isinstance(exc, OSError) and exc.filename is None:  # zipfile's writes name no file: "a temporary
                raise OSError(exc.errno, exc.strerror, str(dest_dir)) from None  # file ... set TMPDIR" (helper 183)
            raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return dest

    def _source(self, name: str) -> tuple[bytes, bool, bytes | None]:
        """(bytes, executable, deflate stream) of a file of the saved wheel; the stream (``WheelZip.deflated``) of a
        member never extracted, else None."""
        path = self.root / name
        if path.is_symlink():
            raise C128Error(f"refusing to pack a symlink: {name}")
        if name in self._extracted or name not in self._members or path.exists():
            return path.read_bytes(), bool(path.stat().st_mode & 0o111), None
        info = self._members[name]
        data = self._zip.read(info)  # in full, its CRC checked
        return data, bool((info.external_attr >> 16) & 0o111), self._zip.deflated(info, data) if self.keep_streams \
            else None

    def _write(self, path: Path, epoch: int) -> None:
        stamp = time.gmtime(max(epoch, MINIMUM_TIMESTAMP))[:6]
        names = [n for n in self.files() if not n.endswith(".dist-info/RECORD")]
        # The package first, then .dist-info (RECORD last, written by WheelFile on close).
        names.sort(key=lambda n: (n.startswith(f"{self.dist_info}/"), n))
        with mock.patch.dict(os.environ, SOURCE_DATE_EPOCH=str(max(epoch, MINIMUM_TIMESTAMP))):
            wf = _WheelWriter(path, "w")
            try:
                for name in names:
                    data, executable, stream = self._source(name)
                    info = zipfile.ZipInfo(name, date_time=stamp)  # our own header: name, stamp, mode, sizes, CRC
                    info.external_attr = (stat.S_IFREG | (0o755 if executable else 0o644)) << 16
                    info.compress_type = zipfile.ZIP_DEFLATED
                    wf.writestr(info, data, stream=stream)
                wf.close()  # writes RECORD
            except BaseException:
                fp, wf.fp = wf.fp, None  # a failed write (disk full...): no RECORD, no second attempt at exit
                if fp is not None:
                    fp.close()
                raise


class _Stored:
    """Stands in for zipfile's compressor: takes the content (zipfile still takes its CRC and size from it) and gives
    back the deflate stream that ``WheelZip.deflated`` proved inflates to exactly that content."""

    def __init__(self, stream: bytes) -> None:
        self.stream = stream

    def compress(self, data: bytes) -> bytes:
        return b""

    def flush(self) -> bytes:
        return self.stream


class _WheelWriter(WheelFile):
    """``WheelFile`` (RECORD from the content) that writes a member given its deflate stream without deflating it again
    (~80 % of a 0.5.23 wheel's build). zipfile writes the headers from our ``ZipInfo``; its one internal used is the
    write handle's ``_compressor`` (were it renamed, the content would be deflated anew: slower, the same content)."""

    _stream: bytes | None = None

    def writestr(self, zinfo_or_arcname: str | zipfile.ZipInfo, data: bytes | str, compress_type: int | None = None,
                 *, stream: bytes | None = None) -> None:
        self._stream = stream
        try:
            super().writestr(zinfo_or_arcname, data, compress_type)
        finally:
            self._stream = None

    def open(self, name_or_info: str | zipfile.ZipInfo, mode: str = "r", pwd: bytes | None = None) -> IO[bytes]:
        handle = super().open(name_or_info, mode, pwd)
        if mode == "w" and self._stream is not None and getattr(name_or_info, "compress_type", None) == \
                zipfile.ZIP_DEFLATED:  # (a stream is a deflate stream: never written under another method)
            handle._compressor = _Stored(self._stream)
        return handle


class WheelMismatch(C128Error):
    """A wheel that does not match what it says about itself (RECORD, provenance, SBOM)."""

    exit_code = exitcodes.FAILED


@dataclass
class RecordCheck:
    files: int
    hashes: dict[str, str]  # name -> RECORD hash, every member checked


def check_record(wheel: Path) -> RecordCheck:
    """Every member is in RECORD with its sha256 (``WheelFile`` checks it) and size; every row is a member."""
    WheelZip(wheel).close()
    try:
        wf = WheelFile(wheel)
    except WheelError as exc:
        raise C128Error(f"{wheel.name}: {exc}") from exc
    except (ValueError, UnicodeDecodeError, csv.Error) as exc:
        raise WheelMismatch(f"{wheel.name}: RECORD cannot be read ({exc})") from exc
    with wf:
        check_archive(wf.infolist(), wheel, WheelMismatch)
        listed: dict[str, str] = {}
        hashes: dict[str, str] = {}
        for row in csv.reader(io.TextIOWrapper(wf.open(wf.record_path), encoding="utf-8", newline="")):
            if len(row) != 3:
                raise WheelMismatch(f"{wheel.name}: RECORD row {','.join(row)} does not have 3 fields")
            if row[0] in listed:
                raise WheelMismatch(f"{wheel.name}: RECORD lists {row[0]} twice")
            hashes[row[0]], listed[row[0]] = row[1], row[2]
        members = [i for i in wf.infolist() if not i.is_dir()]
        for missing in sorted(set(listed) - {i.filename for i in members}):
            raise WheelMismatch(f"{wheel.name}: RECORD lists {missing}, which is not in the wheel")
        for name in (i.filename for i in members if i.filename != wf.record_path):
            if name not in listed:
                raise WheelMismatch(f"{wheel.name}: {name} is not listed in RECORD")
            try:
                data = wf.read(name)  # WheelFile checks the RECORD hash while reading
            except WheelError as exc:
                raise WheelMismatch(f"{wheel.name}: RECORD hash mismatch: {exc}") from exc
            except (zipfile.BadZipFile, EOFError, zlib.error) as exc:
                raise C128Error(f"not a wheel: {wheel}: member {name} cannot be read ({exc})") from None
            if listed[name] != str(len(data)):
                raise WheelMismatch(f"{wheel.name}: RECORD size of {name} is {listed[name]}, the file has {len(data)} "
                                    "bytes")
        return RecordCheck(len(members), hashes)


def binary_dirs(names: list[str]) -> set[str]:
    """Folders (archive paths) that directly hold a compiled extension."""
    return {str(PurePosixPath(n).parent) for n in names if n.endswith(BINARY_SUFFIXES)}
