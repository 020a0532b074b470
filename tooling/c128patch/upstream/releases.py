"""Upstream from release wheels: a cached git history, one tagged commit per sglang release.

The wheels' sources (``python/sglang/...``, no compiled extensions) are laid out as upstream's
repository and imported with ``git fast-import`` under a fixed identity and the wheel's own
timestamps, so the same releases give the same commit ids on every machine. A release's commit
depends on it alone: its parent is the nearest older ``DEFAULT_RELEASES`` entry (a list that only
grows at the top), an extra release (``check --sglang-rev v0.5.19``) is imported beside them, and
each is made from the release's canonical wheel (``HISTORY_TAGS``). A tag that has to move (a cache
of an older layout) keeps its old commit under ``refs/c128patch/superseded/``.

``wheel --from-release`` patches the release's wheel pip would install here (``packaging.tags.sys_tags()``)
or the one ``--python-tag`` / ``--platform`` names (``WheelTarget``), from the wheelhouses
($C128PATCH_WHEELHOUSE, the cache), else ``pip download``ed into the cache. When none fits, the error
lists the release's wheels there and on the index (PEP 691 listing, $PIP_INDEX_URL or PyPI). The cache
($C128PATCH_CACHE, else XDG's) is outside any repository.
"""

from __future__ import annotations

import calendar
import contextlib
import errno
import hashlib
import json
import os
import re
import stat
import struct
import subprocess
import sys
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Optional

from packaging.version import InvalidVersion, Version

from c128patch import jsonio, procs
from c128patch.errors import C128Error
from c128patch.git import Git, blob_id, damaged_index, not_plain
from c128patch.jsonio import write_atomic
from c128patch.progress import NullReporter, Reporter, transfer
from c128patch.series.paths import check_relpath
from c128patch.textsafe import one_line, shell_join, shell_quote

if TYPE_CHECKING:  # packaging.tags (and importlib.metadata): imported where a wheel is chosen, not at every start
    from packaging.tags import Tag

DEFAULT_RELEASES: tuple[str, ...] = ("0.5.20", "0.5.21", "0.5.22", "0.5.23")
PACKAGE = "sglang"
TREE_PREFIX = "python/"
BINARY_SUFFIXES = (".so", ".pyd", ".dylib", ".dll")
# The wheel each release's history commit is made from (every release 0.5.x ships it).
HISTORY_TAGS = ("cp311", "manylinux_2_34_x86_64")
_PIN_ARGS = ("--python-version", "3.11", "--implementation", "cp", "--platform", HISTORY_TAGS[1])
_N = r"\d{1,6}"  # a release number; longer runs of digits are no release (and overflow int())
_RELEASE_TAG = re.compile(rf"^v?({_N}\.{_N}\.{_N}(?:\.post{_N}|rc{_N})?)$")
RELEASE_AUTHOR = "sglang release wheel <release@sglang.invalid>"
HISTORY_LAYOUT = "2"  # 2: parent = nearest older DEFAULT_RELEASES entry (1: the previous release in the cache)
# The tree each default release's wheel gives in this layout (``wheel_tree``; PyPI's wheels never change): a tag
# moved together with its line in the cache's own record (``c128patch-trees``) is refused by these, which the cache
# cannot forge; an operator's wheelhouse is theirs (``ReleaseHistory._check``)
KNOWN_TREES = {"0.5.20": "395926a6992bb9cbc44542bb7a155733c023fa41",
               "0.5.21": "fbcd5847d04b69b3f19f93fbbb019e4196788919",
               "0.5.22": "ca7ed25b97a032e52ff6f6bc36a96ebb1c031fb6",
               "0.5.23": "5285b82a15b5ffcaeb2dd4b5668cab4f8f2bc3e2"}
SUPERSEDED_PREFIX = "refs/c128patch/superseded"
_IMPORT_REF = "refs/c128patch/import"
_VERSION_LINE = re.compile(rb"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"\n]{1,80})['"]""", re.M)


def cache_dir() -> Path:
    explicit = os.environ.get("C128PATCH_CACHE")
    try:
        # absolute: git runs in other folders (a relative cache was "corrupt: rm -rf" it, the printed fix deleting a
        # sound cache; one starting with "-" an option to that rm)
        root = (Path(explicit) if explicit
                else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "c128patch").absolute()
    except RuntimeError as exc:  # no HOME and no passwd entry
        raise C128Error(f"cannot find a cache folder ({exc}); set C128PATCH_CACHE to a writable folder") from None
    ensure_folder(root)
    history = root / "sglang-releases.git"  # (and what of it decides which tree a tag names: its refs, its objects)
    # (contract-probe: cached nvcc verdicts, taken in place of a compile)
    _owned([root, root / "wheels", root / "contract-probe", history, history / "refs", history / "refs" / "tags",
            history / "packed-refs", history / "objects", history / "objects" / "pack", history / "objects" / "info",
            history / "config"])
    return root


def _changeable(st: os.stat_result) -> str:
    """Why a user other than the current one (root aside) may change what ``st`` describes, else "": another owner,
    everyone's write bit, or a group's that is not the user's own (a user private group, umask 002, is theirs)."""
    return f"owned by another user (uid {st.st_uid})" if st.st_uid not in (os.getuid(), 0) else \
        "writable by every user" if st.st_mode & stat.S_IWOTH else \
        f"writable by group {st.st_gid}" if st.st_mode & stat.S_IWGRP and st.st_gid not in (os.getgid(), 0) else ""


def _owned(folders: list[Path]) -> None:
    """Refuse the cache when a folder of it another user may change (``_changeable``): whoever can change it swaps the
    wheels and the history the tool patches and calls upstream's. The printed chmod takes every such folder at once
    (one a run: a cache made writable by all took nine runs, helper 159)."""
    changed = []
    for folder in folders:
        try:
            st = os.stat(folder)
        except OSError:  # (not made yet: made by us)
            continue
        if why := _changeable(st):
            changed.append((folder, why))
    if changed:
        folder, why = next((c for c in changed if c[1].startswith("owned")), changed[0])
        mine = "" if why.startswith("owned") else f"{shell_join(['chmod', 'go-w', *(f for f, _ in changed)])}, or "
        more = f" (and {len(changed) - 1} more of its folders)" if len(changed) > 1 else ""
        raise C128Error(f"the cache folder {folder} is {why}{more}: not used (whoever can change it chooses the wheels "
                        f"and the history the tool takes as upstream's); {mine}set C128PATCH_CACHE to a folder of "
                        "your own")


def ensure_folder(folder: Path) -> Path:
    """Make a folder of the cache; one that cannot be made says how to move the cache."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise unwritable(folder, exc) from None
    return folder


def unwritable(folder: Path, exc: OSError) -> C128Error:
    return C128Error(f"cannot write the cache folder {folder} ({exc.strerror}); "
                     "set C128PATCH_CACHE to a writable folder (export C128PATCH_CACHE=/path/to/cache)")


def locked(path: Path) -> contextlib.AbstractContextManager[None]:
    """``jsonio.locked`` on the lock file ``path`` (made here), so parallel runs don't build the same cache twice."""
    ensure_folder(path.parent)
    try:  # never through a link, nor a pipe
        fd = jsonio.open_regular(path, os.O_CREAT | os.O_WRONLY)
    except OSError as exc:
        raise unwritable(path.parent, exc) from None
    if fd is None:
        raise C128Error(f"the lock file {path} of the cache {path.parent} is not a regular file (a link, a pipe or a "
                        f"folder): not used; remove it (rm -r {shell_quote(str(path))}) and run again")
    os.close(fd)
    return jsonio.locked(path)


def release_version(rev: str) -> str | None:
    """'v0.5.23' or '0.5.23' -> '0.5.23'; None for anything that is not a release tag."""
    match = _RELEASE_TAG.match(rev.strip())
    return match.group(1) if match else None


def tag_for(version: str) -> str:
    return f"v{version}"


def wheelhouses() -> list[Path]:
    dirs = [Path(p) for p in os.environ.get("C128PATCH_WHEELHOUSE", "").split(os.pathsep) if p]
    return [*dirs, cache_dir() / "wheels"]


def parsed_name(wheel: Path) -> tuple | None:
    """``packaging``'s (name, version, build, tags) of a wheel file name; None for a name that is not a wheel's."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    try:
        return parse_wheel_filename(wheel.name)
    except InvalidWheelFilename:
        return None


def wheel_tags(wheel: Path) -> tuple[str, str] | None:
    """(python tag, platform tag) of a wheel file name, e.g. ('cp311', 'manylinux_2_34_x86_64')."""
    tag = sorted(parsed[3], key=str)[0] if (parsed := parsed_name(wheel)) else None
    return (tag.interpreter, tag.platform) if tag else None


def local_wheels(version: str) -> list[Path]:
    """Every sglang ``version`` wheel in the wheelhouses ($C128PATCH_WHEELHOUSE, then the cache)."""
    return [w for folder in wheelhouses() if folder.is_dir() for w in sorted(folder.glob(f"{PACKAGE}-*.whl"))
            if (parsed := parsed_name(w)) and parsed[:2] == (PACKAGE, Version(version))]


def find_wheel(version: str) -> Path | None:
    """The release's canonical wheel (``HISTORY_TAGS``) if a wheelhouse has it, else any of its wheels."""
    wheels = local_wheels(version)
    canonical = [w for w in wheels if wheel_tags(w) == HISTORY_TAGS]
    return (canonical or wheels or [None])[0]


Progress = Callable[[int, Optional[int]], None]  # (bytes so far, bytes in all)
_RAW_PROGRESS = re.compile(r"Progress (\d+) of (\d+)")


def _pip_reports_bytes() -> bool:
    """pip 24.1 and later print ``Progress N of M`` lines with ``--progress-bar raw``."""
    import importlib.metadata

    try:
        return Version(importlib.metadata.version("pip")) >= Version("24.1")
    except (importlib.metadata.PackageNotFoundError, InvalidVersion):
        return False


def pip_download(version: str, extra: tuple[str, ...] = (), progress: Progress | None = None) -> tuple[bool, str]:
    """``pip download`` one sglang wheel into the cache; (ok, pip's last line); ``progress`` hears the bytes."""
    dest = ensure_folder(cache_dir() / "wheels")
    # each finished wheel renamed in from a folder of its own: a killed download leaves no partial wheel
    with procs.scratch(".download-", dest) as tmp:
        ok, last = _pip_download_into(Path(tmp), version, extra, progress)
        if ok:
            for wheel in Path(tmp).glob("*.whl"):
                _record_sum(dest, wheel.name, file_sha256(wheel))
                os.replace(wheel, dest / wheel.name)
    return ok, last


SUMS = "SHA256SUMS"  # the cache's wheels as downloaded (``sha256sum`` lines)


def file_sha256(path: Path) -> str:
    """A file's sha256, read in blocks (a wheel: never held whole, nor under a series file's size limit)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _sums(folder: Path) -> dict[str, str]:
    path = folder / SUMS
    try:  # never through a link, a pipe or a device, nor a file bigger than any record (read whole: MemoryError)
        with open(path, "rb", opener=lambda name, flags: os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK)) as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_size > 1 << 20:
                raise OSError(0, "not a regular file of at most 1 MiB")
            if why := _changeable(st):
                raise OSError(0, why)
            text = f.read().decode(errors="replace")
    except FileNotFoundError:
        text = ""
    except OSError as exc:
        raise C128Error(f"the cache's record of its wheels {path} cannot be read ({exc.strerror}); remove the "
                        f"wheels and it (rm -rf {shell_quote(str(folder))}) and run again: they are downloaded "
                        "again") from None
    return {name: digest for digest, _, name in (line.partition("  ") for line in text.split("\n")) if name}


def _record_sum(folder: Path, name: str, digest: str) -> None:
    sums = {**_sums(folder), name: digest}
    write_atomic(folder / SUMS, "".join(f"{d}  {n}\n" for n, d in sorted(sums.items())).encode())


def cached_wheel(wheel: Path) -> Path:
    """A wheel of the cache, checked before use: its bytes as downloaded (``SHA256SUMS``; one the record does not
    name yet is recorded now), and a release's canonical wheel giving the tree the release history recorded for it
    (``c128patch-trees``); else one line naming it and the fix. An operator's wheelhouse is theirs: not checked."""
    folder = cache_dir() / "wheels"
    if wheel.parent.resolve() != folder.resolve():
        return wheel
    fix = f"remove it (rm {shell_quote(str(wheel))}) and run again: it is downloaded again"
    try:  # never read through a link, from a device or a pipe (/dev/zero, a FIFO: an endless read)
        regular = stat.S_ISREG(os.lstat(wheel).st_mode)
    except OSError as exc:
        raise C128Error(f"the cached wheel {wheel} cannot be read ({exc.strerror}); {fix}") from None
    if not regular:
        raise C128Error(f"the cached wheel {wheel} in the cache {folder} is not a regular file (a link, a device or a "
                        f"pipe); {fix}")
    if why := _changeable(os.lstat(wheel)):
        raise C128Error(f"the cached wheel {wheel} is {why}: not used (whoever can change it chooses what the tool "
                        f"patches and calls upstream's); {fix}")
    have, recorded = file_sha256(wheel), _sums(folder).get(wheel.name)
    if recorded is not None and recorded != have:
        raise C128Error(f"the cached wheel {wheel} changed since it was downloaded (sha256 {have[:16]}…, recorded "
                        f"{recorded[:16]}…); {fix}")
    history = ReleaseHistory()
    if (parsed := parsed_name(wheel)) and (said := metadata_version(wheel)) is not None and \
            not _is_version(said, parsed[1]):
        # (a 0.5.21 wheel renamed 0.5.22, its records gone: `wheel` refused it later naming neither the cache nor a fix)
        raise C128Error(f"the cached wheel {wheel} in the cache {folder} says version {said} in its METADATA, not the "
                        f"{parsed[1]} of its name (a renamed wheel); {fix}")
    if parsed:
        lines = history._state(history._trees_file).split("\n")  # (a damaged one: one line, not a traceback)
        tree = KNOWN_TREES.get(str(parsed[1])) or dict(line.split(" ", 1) for line in lines if " " in line).get(
            str(parsed[1]))  # (PyPI's trees pinned: a record forged with the wheel is not taken)
        # the canonical wheel gives that tree; any other of the release the same sources, their executable bits aside
        # (a cp312 wheel swapped with its SHA256SUMS line went into `wheel --from-release --python-tag cp312`)
        if tree and (wheel_tree(wheel) != tree if wheel_tags(wheel) == HISTORY_TAGS else
                     _sources_differ(wheel, history.git, tree.strip(), CACHED)):
            raise C128Error(f"the cached wheel {wheel} does not give the sources the release history recorded for "
                            f"sglang {parsed[1]} (a changed wheel); {fix}")
    if recorded is None:
        _record_sum(folder, wheel.name, have)
    return wheel


def damaged_cached_wheel(version: str) -> tuple[Path, str] | None:
    """The cache's canonical wheel of ``version`` (``HISTORY_TAGS``) and why it is no whole zip; None when it is one
    or none is cached:
    its end-of-central-directory record and the directory it points to must end the file. One open and one read of at
    most 64 KiB (``check`` predicts ``wheel`` from the release's sources, never reading the wheel: a truncated one got
    "wheel: applies" while ``wheel`` refused it); its bytes are checked where it is used (``cached_wheel``)."""
    name = f"{PACKAGE}-{version}-{HISTORY_TAGS[0]}-{HISTORY_TAGS[0]}-{HISTORY_TAGS[1]}.whl"
    path = cache_dir() / "wheels" / name
    try:  # never through a link, nor a pipe or a device
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return path, "is a link" if exc.errno == errno.ELOOP else f"cannot be read ({exc.strerror})"
    with open(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            return path, "is not a regular file"
        f.seek(max(0, st.st_size - (22 + 0xFFFF)))
        tail = f.read()
    at = tail.rfind(b"PK\x05\x06")
    end = st.st_size - len(tail) + at
    if at < 0 or len(tail) - at < 22:
        return path, "is not a whole zip (no end of its central directory: truncated?)"
    size, offset = struct.unpack("<II", tail[at + 12:at + 20])
    if 0xFFFFFFFF not in (size, offset) and offset + size != end:
        return path, "is not a whole zip (its central directory is not where its end says)"
    return None


def check_release_content(wheel: Path, git: Git, commit: str, version: str) -> bool:
    """``wheel``, taken as sglang ``version``'s release wheel, checked against what is known of that release: its bytes
    against the cache's record of the wheel of that name as downloaded (``SHA256SUMS``), and its sources byte for byte
    against the release history's ``commit`` where there is no record (any platform's wheel of the release has the
    same sources; only their executable bits may differ); else one line. Its compiled extensions are checked only by
    that record. True: its bytes are the download's (not only its content: how each member is encoded too)."""
    fix = (f"start from sglang {version}'s own wheel (c128patch wheel --from-release {version}, or pip download "
           f"sglang=={version}); to label a changed sglang, build it from source (c128patch build)")
    recorded = _sums(cache_dir() / "wheels").get(wheel.name)
    if recorded is not None:  # the download itself: its sources are the release's (~1 s of reading spared)
        if (digest := file_sha256(wheel)) != recorded:
            raise C128Error(f"{wheel} is not sglang {version}'s release wheel {wheel.name}: its sha256 is "
                            f"{digest[:16]}…, the one downloaded into the cache {recorded[:16]}…; {fix}")
        return True
    # (not the cache's fix: its "rm it: it is downloaded again" deleted the operator's wheel, never downloaded)
    changed = _sources_differ(wheel, git, commit, GIVEN)
    if not changed:  # its metadata (Requires-Dist: what pip installs with it; entry points) the release wheel's
        if (release := find_wheel(version)) is None:
            raise C128Error(f"{wheel}: no wheel of sglang {version} in the cache to check its .dist-info against "
                            f"(c128patch wheel --from-release {version} downloads it)")
        have, want = _metadata(wheel), _metadata(cached_wheel(release))  # and its compiled modules the release's
        changed = sorted(p for p in want.keys() | have.keys() if want.get(p) != have.get(p))
    if changed:
        more = f" and {len(changed) - 1} more" if len(changed) > 1 else ""
        raise C128Error(f"{wheel} is not sglang {version}'s release wheel: {changed[0].removeprefix(TREE_PREFIX)}"
                        f"{more} {'differ' if more else 'differs'} from the release's "
                        f"{'sources' if changed[0].startswith(TREE_PREFIX) else 'wheel'}; {fix}")
    return False


def _sources_differ(wheel: Path, git: Git, rev: str, fix: str) -> list[str]:
    """The source paths (``TREE_PREFIX``...) where ``wheel`` and the history's ``rev`` (a commit or a tree) differ in
    content, sorted; executable bits aside (a release's wheels differ in them)."""
    want = {}
    for row in git.out("ls-tree", "-r", "-z", rev, "--", TREE_PREFIX + PACKAGE).split("\0"):
        if row:
            meta, _, path = row.partition("\t")
            want[path] = meta.split()[-1]
    have = {path: blob_id(data) for path, _, data in iter_wheel_sources(wheel, fix)}
    return sorted(p for p in want.keys() | have.keys() if want.get(p) != have.get(p))


_PER_WHEEL = ("RECORD", "WHEEL")  # .dist-info files a release's wheels differ in (hashes, tags)


def _metadata(wheel: Path) -> dict[str, str]:
    """name -> blob id of each file of a wheel's .dist-info but ``_PER_WHEEL``, WHEEL's ``Root-Is-Purelib`` and
    ``Wheel-Version`` (where pip installs it: h144), and the module each compiled extension is (its name up to the
    first dot) with the kinds of its files (``cpython.so``, ``abi3.so``: a release's wheels differ in the ABI tag and
    bytes, never in the modules: one more, ``server_args.cpython-313-x86_64-linux-gnu.so``, is imported in the place of
    ``server_args.py``; ``_bench.abi3.so`` beside ``_bench.cpython-311-...so`` is a second file of that module)."""
    modules: dict[str, set[str]] = {}
    with WheelZip(wheel) as zf:
        for name in zf.namelist():
            if name.endswith(BINARY_SUFFIXES):
                suffix = name.rsplit("/", 1)[-1].partition(".")[2]
                modules.setdefault(name.split(".")[0], set()).add(re.sub(r"^(cpython|cp|pypy)[-\w]*", r"\1", suffix))
        infos = [i for i in zf.infolist() if not i.is_dir() and i.filename.split("/")[0].endswith(".dist-info")]
        found = {i.filename: blob_id(zf.read(i)) for i in infos if i.filename.rsplit("/")[-1] not in _PER_WHEEL}
        for i in infos:
            if i.filename.count("/") == 1 and i.filename.endswith("/WHEEL"):
                fields = [line.partition(":") for line in zf.read(i).decode(errors="replace").splitlines()]
                for key in ("Root-Is-Purelib", "Wheel-Version"):
                    found[f"{i.filename} {key}"] = "|".join(v.strip().lower() for k, _, v in fields
                                                            if k.strip().lower() == key.lower())
    return {m: "compiled " + " ".join(sorted(kinds)) for m, kinds in modules.items()} | found


def _pip_download_into(dest: Path, version: str, extra: tuple[str, ...], progress: Progress | None) -> tuple[bool, str]:
    """``_pip_run`` with pip's own temporary folders (pip-download-*, pip-build-tracker-*) in a scratch folder of ours:
    pip killed with the tool (SIGTERM, SIGHUP) had left them in $TMPDIR."""
    with procs.scratch("c128patch-pip-") as tmp:
        return _pip_run(dest, version, extra, progress, {**os.environ, "TMPDIR": tmp})


def _pip_run(dest: Path, version: str, extra: tuple[str, ...], progress: Progress | None,
             env: dict[str, str]) -> tuple[bool, str]:
    # run in ``dest`` (ours, empty): ``-m`` puts the current folder first on sys.path, and pip imports ``typing``
    # before it drops it: run from an upstream tree, its top-level typing.py ran as the operator, tokens and all.
    # A ``procs.Group`` (helper 167: a plain Popen's pip outlived a SIGTERM or SIGHUP of the tool, the cache's lock
    # given up, downloading on into the cache)
    dest = dest.absolute()
    base = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(dest), *extra]
    last = ""
    if progress is not None and _pip_reports_bytes():
        with procs.Group([*base, "--progress-bar", "raw", f"{PACKAGE}=={version}"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, cwd=dest, env=env) as pip:
            for line in pip.stdout:  # type: ignore[union-attr]
                match = _RAW_PROGRESS.fullmatch(line.strip())
                if match:
                    progress(int(match.group(1)), int(match.group(2)) or None)
                elif line.strip():
                    last = line.strip()
        return pip.returncode == 0, last
    # quiet, or an older pip that says no bytes: the time it takes, then the size it got
    with tempfile.TemporaryFile("w+") as out, procs.Group(
            [*base, "-q", f"{PACKAGE}=={version}"], stdout=out, stderr=subprocess.STDOUT, text=True, cwd=dest,
            env=env) as pip:
        while True:
            try:
                pip.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                if progress is not None:
                    progress(-1, None)  # bytes unknown: the reporter says how long it has taken
        out.seek(0)
        last = (out.read().strip().splitlines() or [""])[-1]
    size = sum(w.stat().st_size for w in dest.glob("*.whl"))
    if progress is not None and pip.returncode == 0 and size:
        progress(size, size)
    return pip.returncode == 0, last


def wheel_for(version: str, progress: Progress | None = None) -> Path:
    """The wheel the history is made from: the canonical one (``HISTORY_TAGS``), else any of the release's."""
    found = find_wheel(version)
    if found is not None and wheel_tags(found) == HISTORY_TAGS:
        return found
    for extra in (_PIN_ARGS, ()):
        ok, last = pip_download(version, extra, progress)
        if ok or found is not None:
            found = find_wheel(version)
            if found is not None:
                return found
    raise C128Error(f"unknown release 'v{version}': no sglang {version} wheel on the package index ({last})")


CACHED = "remove it (rm {wheel}) and run again: it is downloaded again"  # WheelZip's fix for a wheel of the cache
GIVEN = "a truncated download? delete it and fetch it again"  # for one the operator gives (never downloaded again)


class WheelZip(zipfile.ZipFile):
    """A wheel's zip archive; truncated or corrupt (opened, or a member read): one line naming it and the ``fix``."""

    def __init__(self, wheel: Path, fix: str = GIVEN) -> None:
        self.fix = fix = fix.format(wheel=shell_quote(str(wheel)))
        with contextlib.suppress(OSError):  # (a missing one: zipfile says so below)
            if not stat.S_ISREG(os.stat(wheel).st_mode):  # a device or a pipe (/dev/zero, a FIFO): an endless read
                raise C128Error(f"not a wheel: {wheel} is not a regular file (a device or a pipe); {fix}")
        try:
            super().__init__(wheel)
            at, other, unlike = self._stray_bytes(), self._other_directory(), self._unlike_local()
        except (zipfile.BadZipFile, OSError, struct.error) as exc:
            self.close()
            raise C128Error(f"not a wheel: {wheel} is not a whole wheel ({exc}); {fix}") from None
        if unlike:
            self.close()
            raise C128Error(f"not a wheel: {wheel}: {unlike} (a reader going from the start, as some installers do, "
                            f"takes the member's bytes otherwise than zipfile); {fix}")
        if other:
            self.close()
            raise C128Error(f"not a wheel: {wheel} has {other} (two central directories: readers disagree on its "
                            f"members, `unzip -l` lists others than zipfile); {fix}")
        if at is not None:
            self.close()
            raise C128Error(f"not a wheel: {wheel} holds bytes at offset {at} that no member of its central "
                            "directory accounts for (another archive, which a reader going from the start, as some "
                            f"installers do, would unpack instead); {fix}")

    def _unlike_local(self) -> str:
        """A member whose local header names another compression method, encryption or data descriptor than the
        central directory's ("": none): zipfile goes by the directory; a reader going from the start took a deflated
        member's stream as its stored content, or (a descriptor only the local header has) read on from the stream's
        end, past the extent ``_short_record`` compared, to a record hidden there (`jar t < wheel` listed it)."""
        assert self.fp is not None
        for info in self.infolist():
            self.fp.seek(info.header_offset + 6)
            flags, method = struct.unpack("<HH", self.fp.read(4))
            if method != info.compress_type or (flags ^ info.flag_bits) & 0x9:
                return (f"member {info.filename}'s local header says compression method {method}, flags {flags:#x}; "
                        f"its central directory {info.compress_type}, {info.flag_bits:#x}")
        return ""

    def _stray_bytes(self) -> int | None:
        """Where the members' local records stop tiling the file from its first byte to the central directory
        (zipfile reads the directory at the end and skips whatever lies before or between): None when they do."""
        pos, fp = 0, self.fp
        assert fp is not None
        for info in sorted(self.infolist(), key=lambda i: i.header_offset):
            if info.header_offset != pos:
                return pos
            fp.seek(pos)
            head = fp.read(30)
            if len(head) < 30 or head[:4] != b"PK\x03\x04":
                return pos
            name, extra = struct.unpack("<HH", head[26:30])
            end = self._short_record(info, head, fp.read(name + extra)[name:], pos + 30 + name + extra)
            if end is not None:
                return end
            pos += 30 + name + extra + info.compress_size
            if info.flag_bits & 0x08:  # a data descriptor: its signature optional, its sizes 8 bytes each in zip64
                fp.seek(pos)
                pos += (4 if fp.read(4) == b"PK\x07\x08" else 0) + \
                    (20 if max(info.compress_size, info.file_size) >= 0xFFFFFFFF else 12)
        return None if pos == self.start_dir else pos

    def _other_directory(self) -> str:
        """What, past the central directory zipfile read, lets another reader take another one ("": nothing): the end
        records must follow it exactly, the zip64 locator point to the zip64 record zipfile reads (it reads the one
        before the locator; `unzip`, Go go by the locator's offset), the classic record's fields be the zip64 one's
        (or its 0xFFFF.. marks), the member count the directory's, the comment reach the file's end and hold no
        record's signature."""
        fp = self.fp
        assert fp is not None
        fp.seek(0, 2)
        size = fp.tell()
        at = zipfile._EndRecData(fp)[-1]  # noqa: SLF001 (where zipfile found the end record it read)
        fp.seek(at)
        _sig, disk, disk_cd, count_here, count, cd_size, cd_at, length = struct.unpack("<4s4H2LH", fp.read(22))
        if at + 22 + length != size:
            return "an archive comment that does not end at the file's end"
        if any(sig in fp.read(length) for sig in (b"PK\x01\x02", b"PK\x03\x04", b"PK\x05\x06", b"PK\x06\x06",
                                                  b"PK\x06\x07")):
            return "an archive comment holding zip records"
        cd_end = at
        fp.seek(max(0, at - 20))
        locator = fp.read(20) if at >= 20 else b""
        if locator[:4] == b"PK\x06\x07":
            _sig, _disk, record_at, _disks = struct.unpack("<4sLQL", locator)
            cd_end = at - 20 - 56
            fp.seek(cd_end)
            _sig, record_size, _v, _n, disk, disk_cd, here64, count64, size64, at64 = struct.unpack(
                "<4sQ2H2L4Q", fp.read(56))
            if record_at != cd_end or record_size != 44:
                return f"a zip64 locator naming a zip64 end record at {record_at}, not the one at {cd_end}"
            pairs = ((count_here, here64, 0xFFFF), (count, count64, 0xFFFF), (cd_size, size64, 0xFFFFFFFF),
                     (cd_at, at64, 0xFFFFFFFF))
            if any(classic not in (mark, wide) for classic, wide, mark in pairs):
                return "a classic end record naming another directory than its zip64 end record"
            count_here, count, cd_size, cd_at = here64, count64, size64, at64
        if (disk, disk_cd) != (0, 0) or cd_at != self.start_dir or cd_at + cd_size != cd_end:
            return f"an end record naming a directory at {cd_at} ({cd_size} bytes), not the one at {self.start_dir}"
        if count_here != count or count != len(self.filelist):
            return f"an end record counting {count} members where its directory lists {len(self.filelist)}"
        return ""

    def deflated(self, info: zipfile.ZipInfo, data: bytes) -> bytes | None:
        """The member's deflate stream as the archive stores it, when it inflates to exactly ``data`` (its content, as
        ``read`` took it in full and checked its CRC) and ends at its last byte (no bytes hidden after the stream's
        end, which readers skip); None otherwise (not deflated, or not so): the content is to be deflated anew."""
        if info.compress_type != zipfile.ZIP_DEFLATED or info.flag_bits & 0x1:
            return None
        assert self.fp is not None
        self.fp.seek(info.header_offset)  # the local header (its name and extra field lengths), as ``read`` found it
        head = self.fp.read(30)
        if len(head) < 30 or head[:4] != b"PK\x03\x04":
            return None
        name, extra = struct.unpack("<HH", head[26:30])
        self.fp.seek(info.header_offset + 30 + name + extra)
        raw = self.fp.read(info.compress_size)
        inflate = zlib.decompressobj(-zlib.MAX_WBITS)
        try:
            same = len(raw) == info.compress_size and inflate.decompress(raw) == data and inflate.eof \
                and not inflate.unused_data
        except zlib.error:
            return None
        return raw if same else None

    def _short_record(self, info: zipfile.ZipInfo, head: bytes, extra: bytes, data: int) -> int | None:
        """Where a reader going from the start takes ``info``'s data to end when that is before the central directory's
        end of it (None: the same): its local header's sizes (a record hidden inside a member's compressed extent after
        the deflate stream's end: zipfile reads the directory's extent and stops at the stream's end, `jar t < wheel`
        went by the local sizes and unpacked the hidden member, h152); with a data descriptor (no local sizes), the
        deflate stream's own end."""
        assert self.fp is not None
        if not info.flag_bits & 0x08:
            crc, size, file_size = struct.unpack("<III", head[14:26])
            at = 0
            while 0xFFFFFFFF in (size, file_size) and at + 4 <= len(extra):  # zip64: its extra field's sizes
                kind, length = struct.unpack("<HH", extra[at:at + 4])
                if kind == 1 and length >= 16:  # (uncompressed, compressed)
                    file_size, size = struct.unpack("<QQ", extra[at + 4:at + 20])
                at += 4 + length
            same = (crc, size, file_size) == (info.CRC, info.compress_size, info.file_size)
            return None if same else data + max(0, min(size, info.compress_size))
        if info.compress_type != zipfile.ZIP_DEFLATED:
            return None
        self.fp.seek(data)
        inflate, left = zlib.decompressobj(-15), info.compress_size
        while left > 0 and not inflate.eof and (chunk := self.fp.read(min(left, 1 << 20))):
            left -= len(chunk)
            inflate.decompress(chunk, 1 << 16)
            while inflate.unconsumed_tail and not inflate.eof:
                inflate.decompress(inflate.unconsumed_tail, 1 << 16)
        return None if left == 0 and not inflate.unused_data else data + info.compress_size - left - \
            len(inflate.unused_data)

    def read(self, name: str | zipfile.ZipInfo, pwd: bytes | None = None) -> bytes:
        try:
            return super().read(name, pwd)
        # (NotImplementedError, RuntimeError: a compression method zipfile lacks, an encrypted member)
        except (zipfile.BadZipFile, EOFError, zlib.error, NotImplementedError, RuntimeError) as exc:
            member = name.filename if isinstance(name, zipfile.ZipInfo) else name
            raise C128Error(f"not a wheel: {self.filename}: member {member} cannot be read ({exc}); "
                            f"{self.fix}") from None


def iter_wheel_sources(wheel: Path, fix: str = CACHED) -> Iterator[tuple[str, str, bytes]]:
    """(path, git mode, content) of each source file of an sglang wheel, as upstream's repository has it (``fix``: what
    a member that cannot be read prints: a wheel of the cache's, by default)."""
    with WheelZip(wheel, fix) as zf:
        for info in sorted(zf.infolist(), key=lambda i: i.filename):
            name = info.filename
            if info.is_dir() or not name.startswith(f"{PACKAGE}/") or name.endswith(BINARY_SUFFIXES):
                continue
            check_relpath(name, f"the wheel {wheel}")  # (a newline would write commands into fast-import's stream)
            executable = (info.external_attr >> 16) & 0o111
            yield TREE_PREFIX + name, "100755" if executable else "100644", zf.read(info)


def metadata_version(wheel: Path, fix: str = CACHED) -> str | None:
    """The ``Version:`` its ``.dist-info/METADATA`` says (None: no such member or field)."""
    with WheelZip(wheel, fix) as zf:
        name = next((n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")), None)
        text = zf.read(name).decode(errors="replace") if name else ""
    return next((line[8:].strip() for line in text.split("\n") if line.startswith("Version:")), None)


def _is_version(text: str, version: Version) -> bool:
    try:
        return Version(text) == version
    except InvalidVersion:
        return False


def wheel_tree(wheel: Path) -> str:
    """git's tree id of the wheel's sources as the history lays them out (computed, nothing written)."""
    root: dict = {}
    for path, mode, data in iter_wheel_sources(wheel):
        *folders, name = path.split("/")
        node = root
        for folder in folders:
            node = node.setdefault(folder, {})
        node[name] = (mode, blob_id(data))

    def tree_id(node: dict) -> str:
        body = b""
        for name in sorted(node, key=lambda n: (n + "/" if isinstance(node[n], dict) else n).encode()):
            mode, sha = ("40000", tree_id(node[name])) if isinstance(node[name], dict) else node[name]
            body += f"{mode} {name}".encode() + b"\0" + bytes.fromhex(sha)
        return hashlib.sha1(b"tree %d\0" % len(body) + body).hexdigest()  # noqa: S324 (git's id)

    return tree_id(root)


def wheel_timestamp(wheel: Path) -> int:
    """The release time recorded in the wheel (its dist-info/WHEEL entry), as a UTC epoch."""
    with WheelZip(wheel, CACHED) as zf:
        for info in zf.infolist():
            if info.filename.endswith(".dist-info/WHEEL"):
                return calendar.timegm((*info.date_time, 0, 0, 0))
    raise C128Error(f"{wheel.name} is not a wheel (no .dist-info/WHEEL)")


def history_parent(version: str) -> str | None:
    """``version``'s parent in the history: the nearest older ``DEFAULT_RELEASES`` entry, never an extra one."""
    return max((d for d in DEFAULT_RELEASES if Version(d) < Version(version)), key=Version, default=None)


def _fast_import_stream(versions: list[str], wheels: dict[str, Path], present: dict[str, str],
                        reporter: Reporter) -> Iterator[bytes]:
    """Commits for ``versions`` (oldest first); parents already there named by id (``present``)."""
    marks: dict[str, int] = {}  # version -> the mark of its commit
    for n, version in enumerate(versions, 1):
        wheel, when, marks[version] = wheels[version], wheel_timestamp(wheels[version]), n
        reporter.step(f"importing sglang {version}")
        message = f"sglang {version}\n\nSources of the release wheel {wheel.name}.\n".encode()
        # reset: a fresh line of history, no parent unless one is named below
        yield (f"reset {_IMPORT_REF}\ncommit {_IMPORT_REF}\nmark :{n}\nauthor {RELEASE_AUTHOR} {when} +0000\n"
               f"committer {RELEASE_AUTHOR} {when} +0000\ndata {len(message)}\n").encode() + message
        parent = history_parent(version)
        if parent is not None:
            yield f"from :{marks[parent]}\n".encode() if parent in marks else f"from {present[parent]}\n".encode()
        yield b"deleteall\n"
        for path, mode, data in iter_wheel_sources(wheel):  # (fast-import stores a blob met again once)
            yield f"M {mode} inline {path}\ndata {len(data)}\n".encode() + data + b"\n"
        yield f"\nreset refs/tags/{tag_for(version)}\nfrom :{n}\n\n".encode()


def import_releases(dest: Path, versions: Iterable[str], reporter: Reporter = NullReporter()) -> None:
    """Add ``versions``' commits to the bare repository ``dest`` (made if missing); parents there or among them."""
    ordered = sorted(set(versions), key=Version)
    wheels = {}
    for i, v in enumerate(ordered, 1):
        reporter.step(f"fetching sglang {v} wheel")
        what = f"downloading sglang {v} wheel (file {i} of {len(ordered)})"
        wheels[v] = wheel_for(v, lambda done, total, what=what: transfer(reporter, what, done, total))
    git = Git(git_dir=dest)
    if not (dest / "HEAD").is_file():
        dest.mkdir(parents=True, exist_ok=True)
        git.run("init", "--quiet", "--bare", "--initial-branch=releases", str(dest))
        git.run("config", "gc.auto", "0")
    tags = {v: git.rev_parse(f"refs/tags/{tag_for(v)}") for v in {*ordered, *DEFAULT_RELEASES}}
    present = {v: c for v, c in tags.items() if c and v not in ordered}
    # --force: a tag written by an older layout moves (its old commit is kept, below); a wheel that cannot be
    # read: fast-import is killed without "done", writing no ref. No deltas, zlib level 1: half the CPU, pack +13 %
    with git.stream("-c", "pack.compression=1", "fast-import", "--quiet", "--done", "--force", "--depth=0") as proc:
        with contextlib.suppress(BrokenPipeError):
            for chunk in _fast_import_stream(ordered, wheels, present, reporter):
                proc.stdin.write(chunk)
            proc.stdin.write(b"done\n")
            proc.stdin.close()
        err = proc.stderr.read().decode(errors="replace")
        proc.wait()  # (its refs written before the group is ended)
    if proc.returncode != 0:
        raise C128Error(f"building the release history failed: {err.strip().splitlines()[-1:] or ''}")
    for v in ordered:  # keep what an older layout tagged: trees made from it still name it
        old, new = tags.get(v), git.rev_parse(f"refs/tags/{tag_for(v)}")
        if old and old != new:
            git.run("update-ref", f"{SUPERSEDED_PREFIX}/{tag_for(v)}-{old[:12]}", old)
    newest = max([*ordered, *present], key=Version)
    git.run("update-ref", "refs/heads/releases", f"refs/tags/{tag_for(newest)}")
    git.run("update-ref", "-d", _IMPORT_REF, check=False)



class ReleaseHistory:
    """The cached release-history repository (bare)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or cache_dir() / "sglang-releases.git"
        self._versions_file = self.root / "c128patch-versions"
        self._layout_file = self.root / "c128patch-layout"
        self._trees_file = self.root / "c128patch-trees"  # version -> the tree its release wheel gives

    @property
    def git(self) -> Git:
        return Git(git_dir=self.root)

    def _state(self, path: Path) -> str:
        """A state file of the history ("" when there is none); one that cannot be read: one line saying how to
        rebuild the cache."""
        try:  # never through a link, nor a pipe or a device; a state file is a few lines
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            return ""
        except OSError as exc:
            raise C128Error(f"the release cache {self.root}: {path.name} cannot be read ({exc.strerror}); rebuild it: "
                            f"rm -rf {shell_quote(str(self.root))} (the next run imports the releases again)") from None
        try:
            with open(fd, "rb") as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode) or st.st_size > 1 << 20:
                    raise OSError(0, "not a regular file of at most 1 MiB")
                if why := _changeable(st):
                    raise OSError(0, why)
                return f.read().decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else exc
            raise C128Error(f"the release cache {self.root}: {path.name} cannot be read ({why}); rebuild it: "
                            f"rm -rf {shell_quote(str(self.root))} (the next run imports the releases again)") from None

    def versions(self) -> list[str]:
        found = self._state(self._versions_file).split()
        for v in found:  # (a damaged file: InvalidVersion's traceback where the versions are sorted)
            try:
                Version(v)
            except (InvalidVersion, ValueError):
                raise C128Error(f"the release cache {self.root}: {self._versions_file.name} holds {v!r}, not a "
                                f"release version; rebuild it: rm -rf {shell_quote(str(self.root))} (the next run "
                                "imports the releases again)") from None
        return found

    def layout(self) -> str:
        return self._state(self._layout_file).strip() or "1"

    def ensure(self, extra: Iterable[str] = (), reporter: Reporter = NullReporter()) -> Path:
        """The history's path, holding the default releases and ``extra`` (only missing ones imported)."""
        for v in extra:
            try:
                Version(v)
            except (InvalidVersion, ValueError) as exc:
                raise C128Error(f"not a release version: {v!r}") from exc
        with locked(self.root.with_suffix(".lock")):
            self._plain_files()
            have = set(self.versions())
            if self.layout() != HISTORY_LAYOUT and have != set(DEFAULT_RELEASES):
                have = set()  # layout 1 chained extras in: re-import all (moved tags are kept)
            want = set(self.versions()) | set(DEFAULT_RELEASES) | set(extra)
            missing = want - have
            if missing:  # parents come first: a default release missing from a partial cache is imported too
                import_releases(self.root, missing, reporter)
                write_atomic(self._versions_file, ("\n".join(sorted(want, key=Version)) + "\n").encode())
                write_atomic(self._layout_file, (HISTORY_LAYOUT + "\n").encode())
            self._check(want, fresh=missing)
        return self.root

    def _plain_files(self) -> None:
        """``git.not_plain`` before any git call on the history: a FIFO at its HEAD made git wait forever."""
        if why := not_plain(self.root):
            raise C128Error(f"the release cache {self.root}: {why} as git writes it (git would wait on a FIFO there, "
                            f"or follow a link out of the cache); rebuild it: rm -rf {shell_quote(str(self.root))} "
                            "(the next run imports the releases again)")

    def _check(self, versions: set[str], fresh: set[str]) -> None:
        """Refuse (saying how to rebuild) a corrupt pack or a tag not naming its release wheel's sources."""
        rebuild = f"rebuild it: rm -rf {shell_quote(str(self.root))} (the next run imports the releases again)"
        # never written here (fast-import, gc.auto 0): a forged graph names other trees for the tags' commits, and an
        # alternates file borrows another object store, its graph read as well
        info = self.root / "objects" / "info"
        for foreign in (info / "commit-graph", info / "commit-graphs", info / "alternates", info / "http-alternates"):
            if os.path.lexists(foreign):
                raise C128Error(f"the release cache {self.root} holds objects/info/{foreign.name}, which this tool "
                                f"never writes (git would read the releases' trees from it, not from the commits); "
                                f"{rebuild}")
        if bad := damaged_index(self.root / "objects"):  # (~1 ms: ~320 KB hashed)
            # damaged: git found some objects where they are not, the patches "did not apply"
            raise C128Error(f"the release cache {self.root} is corrupt ({bad} fails its checksum); "
                            f"{rebuild}")
        # an annotated tag names its commit's tree under `*tree` (peeled once: a tag of a tag, or of a tree, names none)
        proc = self.git.run("for-each-ref", "--format=%(refname) %(tree)%(*tree) %(objecttype)%(*objecttype)",
                            check=False)
        if proc.returncode != 0:
            raise C128Error(f"the release cache {self.root} is corrupt ({proc.stderr.strip()[-200:]}); {rebuild}")
        refs = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
        kinds = {r: k.rpartition(" ")[2] for r, k in refs.items()}
        refs = {r: k.rpartition(" ")[0] for r, k in refs.items()}
        # a ref the import never makes: `refs/v0.5.23` wins over the tag where git resolves `v0.5.23` (gitrevisions)
        for ref in (r for r in refs if not r.startswith(("refs/tags/", "refs/heads/", "refs/c128patch/"))):
            raise C128Error(f"the release cache {self.root} holds the ref {ref!r}, which no import makes (it shadows "
                            f"a release's tag where a rev is resolved); {rebuild}")
        trees = {r.removeprefix("refs/tags/"): t for r, t in refs.items() if r.startswith("refs/tags/")}
        lines = self._state(self._trees_file).split("\n")
        recorded = {**dict(line.split(" ", 1) for line in lines if " " in line),
                    **{v: trees.get(tag_for(v), "") for v in fresh}}
        for v in sorted(versions - set(recorded), key=Version):
            wheel = find_wheel(v)
            recorded[v] = wheel_tree(wheel) if wheel is not None else trees.get(tag_for(v), "")
        pinned = {} if os.environ.get("C128PATCH_WHEELHOUSE") else KNOWN_TREES
        for v in sorted(versions, key=Version):
            if (kind := kinds.get(f"refs/tags/{tag_for(v)}", "commit")) not in ("commit", "tagcommit"):
                raise C128Error(f"the release cache {self.root}: tag {tag_for(v)} does not name a commit (it names a "
                                f"{kind.removeprefix('tag') or 'tag'}: a release is a commit or an annotated tag of "
                                f"one); {rebuild}")
            if trees.get(tag_for(v)) != pinned.get(v, recorded[v]):
                raise C128Error(f"the release cache {self.root}: tag {tag_for(v)} does not name the sources of the "
                                f"sglang {v} release wheel (a moved tag); {rebuild}")
        self._no_shadow(sorted(versions, key=Version), rebuild)
        self._says_its_version(sorted(versions, key=Version), rebuild)
        if set(recorded) - set(r.split(" ", 1)[0] for r in lines if r):
            write_atomic(self._trees_file, "".join(f"{v} {t}\n" for v, t in sorted(recorded.items())).encode())


    def _says_its_version(self, versions: list[str], rebuild: str) -> None:
        """Each release tag's sources say that release (``python/sglang/_version.py``, where they hold one): a tag moved
        to another release's commit together with its line in ``c128patch-trees`` (the wheel and its sum untouched)
        passed the check against that record, and `apply --sglang-rev v0.5.23` built on 0.5.22's sources, "identical
        ... on v0.5.23". One `git grep` (~3 ms; no stdin: as few open files as any git call)."""
        path = f"{TREE_PREFIX}{PACKAGE}/_version.py"
        proc = self.git.run("grep", "--null", "-I", "--no-color", "-E", "-e", r"^__version__[[:space:]]*=",
                            *(f"refs/tags/{tag_for(v)}" for v in versions), "--", path, binary=True, check=False)
        said: dict[str, bytes] = {}
        for line in proc.stdout.split(b"\n") if proc.returncode == 0 else []:  # split at newlines only, as Git.lines
            name, _, text = line.partition(b"\0")
            tag = name.removeprefix(b"refs/tags/").removesuffix(f":{path}".encode()).decode("utf-8", "replace")
            if (m := _VERSION_LINE.match(text)) is not None:
                said.setdefault(tag, m[1])
        for v in versions:
            if (found := said.get(tag_for(v))) is None:
                continue  # (a release without the file, or no such line, says nothing)
            try:
                same = Version(found.decode("ascii", "replace")) == Version(v)
            except InvalidVersion:
                same = False
            if not same:
                raise C128Error(f"the release cache {self.root}: tag {tag_for(v)} names the sources of sglang "
                                f"{one_line(found.decode('ascii', 'replace'))[:40]} (its {path}), not of {v} (a moved "
                                f"tag and its record); {rebuild}")

    def _no_shadow(self, versions: list[str], rebuild: str) -> None:
        """Each release's tag name resolves to its tag: a file ``v0.5.23`` at the top of the git dir (which
        ``for-each-ref`` does not list) wins over ``refs/tags/v0.5.23`` where git resolves the name, and `apply
        --sglang-rev v0.5.23` built on 0.5.22's commit and said "identical to a fresh apply ... on v0.5.23"."""
        tags = [tag_for(v) for v in versions]
        proc = self.git.run("rev-parse", *tags, *(f"refs/tags/{t}" for t in tags), check=False)
        said = proc.stdout.split()
        for tag, short, full in zip(tags, said, said[len(tags):]):
            if short != full:
                raise C128Error(f"the release cache {self.root}: {tag} resolves to {short[:12]}, not to its tag's "
                                f"commit {full[:12]} (a file or ref of that name shadows the tag); {rebuild}")
        if proc.returncode != 0 or len(said) != 2 * len(tags):
            raise C128Error(f"the release cache {self.root}: the release tags do not resolve "
                            f"({one_line(proc.stderr.strip())[-200:]}); {rebuild}")


_PYTHON_TAG = re.compile(r"(cp|pp)([0-9])([0-9]{0,2})")  # fullmatch: cp3, cp312 (pip's --python-version 3.12)
_PLATFORM_TAG = re.compile(r"[a-z0-9_]{1,80}")  # fullmatch: no trailing newline, no 300-character tag
DEFAULT_INDEX = "https://pypi.org/simple"


def _shown(value: str) -> str:
    return repr(value[:40]) + ("… (%d characters)" % len(value) if len(value) > 40 else "")


@dataclass(frozen=True)
class WheelTarget:
    """The interpreter and platform a wheel must fit (``python_tag``/``platform`` None: this machine's)."""

    python_tag: str | None = None
    platform: str | None = None

    def __post_init__(self) -> None:
        if self.python_tag is not None and not _PYTHON_TAG.fullmatch(self.python_tag):
            raise C128Error(f"--python-tag {_shown(self.python_tag)}: expected an interpreter tag such as cp312")
        if self.platform is not None and not _PLATFORM_TAG.fullmatch(self.platform):
            raise C128Error(f"--platform {_shown(self.platform)}: expected a platform tag such as "
                            "manylinux_2_34_x86_64")

    @property
    def is_here(self) -> bool:
        return self.python_tag is None and self.platform is None

    def describe(self) -> str:
        from packaging.tags import sys_tags

        if self.is_here:
            here = next(iter(sys_tags()))
            return f"this interpreter ({here.interpreter}, {here.platform})"
        return f"{self.python_tag or 'this interpreter'} / {self.platform or 'this platform'}"

    def rank(self, tag: Tag) -> int | None:
        """How well ``tag`` fits (lower is better); None when it does not."""
        from packaging.tags import sys_tags

        here = list(sys_tags())
        if self.is_here:
            return here.index(tag) if tag in here else None
        platforms = [self.platform] if self.platform else list(dict.fromkeys(t.platform for t in here))
        if tag.platform not in platforms and tag.platform != "any":
            return None
        generic = tag.abi == "none" and tag.interpreter in ("py3", f"py{(self.python_tag or 'cp3')[2]}")
        if self.python_tag and tag.interpreter != self.python_tag and not generic:
            return None
        if not self.python_tag and tag.interpreter not in {t.interpreter for t in here}:
            return None
        return platforms.index(tag.platform) if tag.platform in platforms else len(platforms)

    def pip_args(self) -> tuple[str, ...]:
        """``pip download`` options that select this target (none: pip's own, this interpreter)."""
        from packaging.tags import sys_tags

        if self.is_here:
            return ()
        here = list(sys_tags())
        tag = _PYTHON_TAG.fullmatch(self.python_tag or here[0].interpreter)  # this interpreter's: cp311, pp310
        impl, major, minor = tag.groups()  # type: ignore[union-attr]
        args = ["--implementation", impl, "--python-version", f"{major}.{minor}" if minor else major]
        for platform in [self.platform] if self.platform else dict.fromkeys(t.platform for t in here):
            args += ["--platform", platform]
        return tuple(args)


def fit(wheel: Path, target: WheelTarget) -> int | None:
    """The best rank of any of the wheel's tags for ``target`` (None: it does not fit)."""
    parsed = parsed_name(wheel)
    ranks = [r for r in (target.rank(t) for t in (parsed[3] if parsed else ())) if r is not None]
    return min(ranks) if ranks else None


def best_local(version: str, target: WheelTarget) -> Path | None:
    ranked = sorted((r, w.name, w) for w in local_wheels(version) if (r := fit(w, target)) is not None)
    return ranked[0][2] if ranked else None


def index_url() -> str:
    return (os.environ.get("PIP_INDEX_URL") or DEFAULT_INDEX).rstrip("/")


def available(version: str) -> tuple[list[str], str]:
    """(the release's wheel file names in the wheelhouses and the index's PEP 691 listing, where they were looked)."""
    import urllib.request  # lazy: only a release without a fitting wheel reads the index

    names = {w.name for w in local_wheels(version)}
    try:
        request = urllib.request.Request(f"{index_url()}/{PACKAGE}/",
                                         headers={"Accept": "application/vnd.pypi.simple.v1+json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            listed = [str(item.get("filename", "")) for item in json.load(response).get("files", [])]
        names.update(n for n in listed if (w := parsed_name(Path(n))) and w[1] == Version(version))  # (None: no wheel)
        note = f"the wheelhouses and {index_url()}"
    except (OSError, ValueError) as exc:  # (urllib's URLError is an OSError)
        note = f"the wheelhouses only ({index_url()} could not be read: {getattr(exc, 'reason', exc)})"
    return sorted(names), note


def release_wheel_for(version: str, target: WheelTarget, reporter: Reporter = NullReporter()) -> Path:
    """The release's wheel that fits ``target``: from a wheelhouse, else downloaded into the cache."""
    found = best_local(version, target)
    if found is None:
        what = f"downloading sglang {version} wheel"
        ok, last = pip_download(version, target.pip_args(), lambda done, total: transfer(reporter, what, done, total))
        found = best_local(version, target) if ok else None
    if found is not None:
        return cached_wheel(found)
    names, note = available(version)
    if not names:
        raise C128Error(f"unknown release 'v{version}': no sglang {version} wheel in {note} ({last})")
    if fits := [n for n in names if fit(Path(n), target) is not None]:  # listed, yet pip got none: its own failure
        # (a full disk was "no wheel for this interpreter", the fitting wheel listed below that claim)
        raise C128Error(f"downloading {fits[0]} into the cache {cache_dir() / 'wheels'} failed (pip: "
                        f"{one_line(last)[-300:] or 'no wheel written'}); fix that and run again, or pass the wheel "
                        "with --from-wheel FILE")
    raise C128Error(
        f"sglang {version} has no wheel for {target.describe()}: {len(names)} wheel(s) in {note}",
        hint="\n".join([*(f"  {n}" for n in names),
                        "pick one with --python-tag TAG [--platform PLATFORM] (e.g. --python-tag cp312), "
                        "or pass it with --from-wheel FILE"]),
    )
