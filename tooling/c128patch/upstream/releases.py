"""Upstream from release wheels: a cached git history, one tagged commit per sglang release.

SGLang wheels ship the whole Python tree and the JIT CUDA sources. We lay them out as upstream's
repository does (``python/sglang/...``), sources only (no compiled extensions), and build the
history with ``git fast-import`` under a fixed identity and the wheel's own timestamps, so the same
releases give the same commit ids on every machine.

A release's commit id depends on that release alone, never on which other releases the cache
holds: its parent is the nearest older release of ``DEFAULT_RELEASES`` (the ones the tool
supports; that list only grows at the top), and an extra release (``check --sglang-rev v0.5.19``)
is imported beside them, never between them. The history is built from the canonical wheel of
each release (``HISTORY_TAGS``; the sources are the same in every interpreter's wheel, their
timestamps are not). Releases are added incrementally; a tag that ever has to move (a cache
written by an older layout) keeps its old commit under ``refs/c128patch/superseded/``, so trees
made from it still find it.
"""

from __future__ import annotations

import calendar
import hashlib
import importlib.metadata
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from c128patch.errors import C128Error
from c128patch.git import Git
from c128patch.jsonio import write_atomic
from c128patch.progress import NullReporter, Reporter, transfer
from c128patch.upstream.cache import cache_dir, ensure_folder, locked

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
SUPERSEDED_PREFIX = "refs/c128patch/superseded"
_IMPORT_REF = "refs/c128patch/import"


def release_version(rev: str) -> str | None:
    """'v0.5.23' or '0.5.23' -> '0.5.23'; None for anything that is not a release tag."""
    match = _RELEASE_TAG.match(rev.strip())
    return match.group(1) if match else None


def tag_for(version: str) -> str:
    return f"v{version}"


def wheelhouses() -> list[Path]:
    dirs = [Path(p) for p in os.environ.get("C128PATCH_WHEELHOUSE", "").split(os.pathsep) if p]
    return [*dirs, cache_dir() / "wheels"]


def wheel_tags(wheel: Path) -> tuple[str, str] | None:
    """(python tag, platform tag) of a wheel file name, e.g. ('cp311', 'manylinux_2_34_x86_64');
    None for a name that is not a wheel's."""
    try:
        _name, _ver, _build, tags = parse_wheel_filename(wheel.name)
    except InvalidWheelFilename:
        return None
    tag = sorted(tags, key=str)[0]
    return tag.interpreter, tag.platform


def local_wheels(version: str) -> list[Path]:
    """Every sglang ``version`` wheel in the wheelhouses ($C128PATCH_WHEELHOUSE, then the cache)."""
    want = Version(version)
    found = []
    for folder in wheelhouses():
        if not folder.is_dir():
            continue
        for candidate in sorted(folder.glob(f"{PACKAGE}-*.whl")):
            try:
                name, ver, _build, _tags = parse_wheel_filename(candidate.name)
            except InvalidWheelFilename:
                continue
            if name == PACKAGE and ver == want:
                found.append(candidate)
    return found


def find_wheel(version: str) -> Path | None:
    """The release's canonical wheel (``HISTORY_TAGS``) if a wheelhouse has it, else any of its wheels."""
    wheels = local_wheels(version)
    canonical = [w for w in wheels if wheel_tags(w) == HISTORY_TAGS]
    return (canonical or wheels or [None])[0]


Progress = Callable[[int, Optional[int]], None]  # (bytes so far, bytes in all)
_RAW_PROGRESS = re.compile(r"Progress (\d+) of (\d+)")


def _pip_reports_bytes() -> bool:
    """pip 24.1 and later print ``Progress N of M`` lines with ``--progress-bar raw``."""
    try:
        return Version(importlib.metadata.version("pip")) >= Version("24.1")
    except (importlib.metadata.PackageNotFoundError, InvalidVersion):
        return False


def pip_download(version: str, extra: tuple[str, ...] = (), progress: Progress | None = None) -> tuple[bool, str]:
    """``pip download`` one sglang wheel into the cache; (ok, pip's last line). ``progress`` hears the
    bytes as they come (where pip reports them)."""
    dest = ensure_folder(cache_dir() / "wheels")
    # Into a folder of its own, each finished wheel renamed into the cache: a killed download never
    # leaves a partial wheel under a wheel's name.
    with tempfile.TemporaryDirectory(prefix=".download-", dir=dest) as tmp:
        ok, last = _pip_download_into(Path(tmp), version, extra, progress)
        if ok:
            for wheel in Path(tmp).glob("*.whl"):
                os.replace(wheel, dest / wheel.name)
    return ok, last


def _pip_download_into(dest: Path, version: str, extra: tuple[str, ...], progress: Progress | None) -> tuple[bool, str]:
    base = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(dest)]
    if progress is None:
        proc = subprocess.run([*base, "-q", *extra, f"{PACKAGE}=={version}"], capture_output=True, text=True)
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        return proc.returncode == 0, last[0]
    if not _pip_reports_bytes():  # an older pip says no bytes: the time it takes, then the size it got
        return _pip_download_timed(base, dest, version, extra, progress)
    last = ""
    with subprocess.Popen([*base, "--progress-bar", "raw", *extra, f"{PACKAGE}=={version}"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as pip:
        assert pip.stdout is not None
        for line in pip.stdout:
            match = _RAW_PROGRESS.fullmatch(line.strip())
            if match:
                progress(int(match.group(1)), int(match.group(2)) or None)
            elif line.strip():
                last = line.strip()
    return pip.returncode == 0, last


def _pip_download_timed(base: list[str], dest: Path, version: str, extra: tuple[str, ...],
                       progress: Progress) -> tuple[bool, str]:
    with tempfile.TemporaryFile("w+") as out, subprocess.Popen(
            [*base, "-q", *extra, f"{PACKAGE}=={version}"], stdout=out, stderr=subprocess.STDOUT, text=True) as pip:
        while True:
            try:
                pip.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                progress(-1, None)  # bytes unknown: the reporter says how long it has taken
        out.seek(0)
        last = out.read().strip().splitlines()[-1:] or [""]
    size = sum(w.stat().st_size for w in dest.glob("*.whl"))
    if pip.returncode == 0 and size:
        progress(size, size)
    return pip.returncode == 0, last[0]


def wheel_for(version: str, progress: Progress | None = None) -> Path:
    """The wheel the release history is made from: the canonical one (``HISTORY_TAGS``) from a
    wheelhouse or the index; else any wheel of the release (a release without that wheel)."""
    found = find_wheel(version)
    if found is not None and wheel_tags(found) == HISTORY_TAGS:
        return found
    last = ""
    for extra in (_PIN_ARGS, ()):
        ok, last = pip_download(version, extra, progress)
        if ok or found is not None:
            found = find_wheel(version)
            if found is not None:
                return found
    raise C128Error(f"unknown release 'v{version}': no sglang {version} wheel on the package index ({last})")


@dataclass(frozen=True)
class SourceFile:
    path: str  # path in the upstream tree, e.g. python/sglang/srt/environ.py
    mode: str  # git file mode
    data: bytes


def _zip(wheel: Path) -> zipfile.ZipFile:
    """A cached or given wheel opened; a truncated or corrupt one is one line naming it."""
    try:
        return zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as exc:
        raise C128Error(f"{wheel}: not a readable wheel ({exc}); a truncated download? delete it and run "
                        "again") from None


def iter_wheel_sources(wheel: Path) -> Iterator[SourceFile]:
    """The source files of an sglang wheel, laid out as upstream's repository."""
    with _zip(wheel) as zf:
        for info in sorted(zf.infolist(), key=lambda i: i.filename):
            name = info.filename
            if info.is_dir() or not name.startswith(f"{PACKAGE}/") or name.endswith(BINARY_SUFFIXES):
                continue
            executable = (info.external_attr >> 16) & 0o111
            yield SourceFile(TREE_PREFIX + name, "100755" if executable else "100644", zf.read(info))


def wheel_timestamp(wheel: Path) -> int:
    """The release time recorded in the wheel (its dist-info/WHEEL entry), as a UTC epoch."""
    with _zip(wheel) as zf:
        for info in zf.infolist():
            if info.filename.endswith(".dist-info/WHEEL"):
                return calendar.timegm((*info.date_time, 0, 0, 0))
    raise C128Error(f"{wheel.name} is not a wheel (no .dist-info/WHEEL)")


def history_parent(version: str) -> str | None:
    """The release whose commit is ``version``'s parent in the history: the nearest older one of
    ``DEFAULT_RELEASES`` (None below the oldest). Never an extra release, so adding one to the
    cache changes no other release's commit id."""
    v = Version(version)
    older = [d for d in DEFAULT_RELEASES if Version(d) < v]
    return max(older, key=Version) if older else None


def _fast_import_stream(versions: list[str], wheels: dict[str, Path], present: dict[str, str],
                        reporter: Reporter) -> Iterator[bytes]:
    """Commits for ``versions`` (oldest first); parents already in the repository are named by
    commit id (``present``: version -> commit)."""
    marks: dict[str, int] = {}
    commit_marks: dict[str, int] = {}
    next_mark = 1
    for version in versions:
        wheel = wheels[version]
        reporter.step(f"importing sglang {version}")
        files: list[tuple[str, str, int]] = []
        for src in iter_wheel_sources(wheel):
            key = hashlib.sha1(b"blob %d\0" % len(src.data) + src.data).hexdigest()
            if key not in marks:
                marks[key] = next_mark
                yield b"blob\nmark :%d\ndata %d\n" % (next_mark, len(src.data)) + src.data + b"\n"
                next_mark += 1
            files.append((src.mode, src.path, marks[key]))
        when = wheel_timestamp(wheel)
        message = f"sglang {version}\n\nSources of the release wheel {wheel.name}.\n".encode()
        commit_marks[version] = next_mark
        next_mark += 1
        head = [
            f"reset {_IMPORT_REF}".encode(),  # a fresh line of history: no parent unless named below
            f"commit {_IMPORT_REF}".encode(),
            b"mark :%d" % commit_marks[version],
            f"author {RELEASE_AUTHOR} {when} +0000".encode(),
            f"committer {RELEASE_AUTHOR} {when} +0000".encode(),
            b"data %d" % len(message),
        ]
        yield b"\n".join(head) + b"\n" + message
        parent = history_parent(version)
        if parent is not None:
            yield ((b"from :%d\n" % commit_marks[parent]) if parent in commit_marks
                   else f"from {present[parent]}\n".encode())
        yield b"deleteall\n"
        for mode, path, mark in files:
            yield f"M {mode} :{mark} {path}\n".encode()
        yield b"\n"
        yield f"reset refs/tags/{tag_for(version)}\nfrom :{commit_marks[version]}\n\n".encode()


def _fast_import(git_dir: Path, stream: Iterable[bytes]) -> None:
    # --force: a tag written by an older layout moves (its old commit is kept, see import_releases)
    argv, env = Git(git_dir=git_dir).command("fast-import", "--quiet", "--done", "--force")
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=git_dir)
    assert proc.stdin is not None
    try:
        for chunk in stream:
            proc.stdin.write(chunk)
        proc.stdin.write(b"done\n")
        proc.stdin.close()
    except BrokenPipeError:
        pass
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.wait() != 0:
        raise C128Error(f"building the release history failed: {err.strip().splitlines()[-1:] or ''}")


def import_releases(dest: Path, versions: Iterable[str], reporter: Reporter = NullReporter()) -> None:
    """Add the commits of ``versions`` to the bare repository ``dest`` (created if missing). Each
    parent (``history_parent``) must be among ``versions`` or already tagged in ``dest``."""
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
    _fast_import(dest, _fast_import_stream(ordered, wheels, present, reporter))
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

    @property
    def git(self) -> Git:
        return Git(git_dir=self.root)

    def versions(self) -> list[str]:
        if not self._versions_file.is_file():
            return []
        return [v for v in self._versions_file.read_text().split() if v]

    def layout(self) -> str:
        return self._layout_file.read_text().strip() if self._layout_file.is_file() else "1"

    def ensure(self, extra: Iterable[str] = (), reporter: Reporter = NullReporter()) -> Path:
        """Make sure the history holds the default releases plus ``extra``; returns its path.
        Only missing releases are imported; the commits of those already there never change."""
        for v in extra:
            try:
                Version(v)
            except (InvalidVersion, ValueError) as exc:
                raise C128Error(f"not a release version: {v!r}") from exc
        with locked(self.root.with_suffix(".lock")):
            have = set(self.versions())
            if self.layout() != HISTORY_LAYOUT and have != set(DEFAULT_RELEASES):
                have = set()  # layout 1 chained extras in: re-import all (moved tags are kept)
            want = set(self.versions()) | set(DEFAULT_RELEASES) | set(extra)
            missing = want - have
            if not missing:
                return self.root
            # Parents come first: a default release missing from a partial cache is imported too.
            import_releases(self.root, missing, reporter)
            write_atomic(self._versions_file, ("\n".join(sorted(want, key=Version)) + "\n").encode())
            write_atomic(self._layout_file, (HISTORY_LAYOUT + "\n").encode())
        return self.root
