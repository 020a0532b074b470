"""Upstream from release wheels: a cached git history, one tagged commit per sglang release.

SGLang wheels ship the whole Python tree and the JIT CUDA sources. We lay them out as upstream's
repository does (``python/sglang/...``), sources only (no compiled extensions), and build the
history with ``git fast-import`` under a fixed identity and the wheel's own timestamps, so the same
releases give the same commit ids on every machine.
"""

from __future__ import annotations

import calendar
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from c128patch.errors import C128Error
from c128patch.git import Git
from c128patch.progress import NullReporter, Reporter
from c128patch.upstream.cache import cache_dir, locked

DEFAULT_RELEASES: tuple[str, ...] = ("0.5.20", "0.5.21", "0.5.22", "0.5.23")
PACKAGE = "sglang"
TREE_PREFIX = "python/"
BINARY_SUFFIXES = (".so", ".pyd", ".dylib", ".dll")
_PIN_ARGS = ("--python-version", "3.11", "--implementation", "cp", "--platform", "manylinux_2_34_x86_64")
_RELEASE_TAG = re.compile(r"^v?(\d+\.\d+\.\d+(?:\.post\d+|rc\d+)?)$")
RELEASE_AUTHOR = "sglang release wheel <release@sglang.invalid>"


def release_version(rev: str) -> str | None:
    """'v0.5.23' or '0.5.23' -> '0.5.23'; None for anything that is not a release tag."""
    match = _RELEASE_TAG.match(rev.strip())
    return match.group(1) if match else None


def tag_for(version: str) -> str:
    return f"v{version}"


def wheelhouses() -> list[Path]:
    dirs = [Path(p) for p in os.environ.get("C128PATCH_WHEELHOUSE", "").split(os.pathsep) if p]
    return [*dirs, cache_dir() / "wheels"]


def find_wheel(version: str) -> Path | None:
    want = Version(version)
    for folder in wheelhouses():
        if not folder.is_dir():
            continue
        for candidate in sorted(folder.glob(f"{PACKAGE}-*.whl")):
            try:
                name, ver, _build, _tags = parse_wheel_filename(candidate.name)
            except InvalidWheelFilename:
                continue
            if name == PACKAGE and ver == want:
                return candidate
    return None


def download_wheel(version: str) -> Path:
    dest = cache_dir() / "wheels"
    dest.mkdir(parents=True, exist_ok=True)
    base = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(dest)]
    last = ""
    for extra in (_PIN_ARGS, ()):
        proc = subprocess.run([*base, *extra, f"{PACKAGE}=={version}"], capture_output=True, text=True)
        if proc.returncode == 0:
            found = find_wheel(version)
            if found:
                return found
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        last = last[0]
    raise C128Error(f"unknown release 'v{version}': no sglang {version} wheel on the package index ({last})")


def wheel_for(version: str) -> Path:
    return find_wheel(version) or download_wheel(version)


@dataclass(frozen=True)
class SourceFile:
    path: str  # path in the upstream tree, e.g. python/sglang/srt/environ.py
    mode: str  # git file mode
    data: bytes


def iter_wheel_sources(wheel: Path) -> Iterator[SourceFile]:
    """The source files of an sglang wheel, laid out as upstream's repository."""
    with zipfile.ZipFile(wheel) as zf:
        for info in sorted(zf.infolist(), key=lambda i: i.filename):
            name = info.filename
            if info.is_dir() or not name.startswith(f"{PACKAGE}/") or name.endswith(BINARY_SUFFIXES):
                continue
            executable = (info.external_attr >> 16) & 0o111
            yield SourceFile(TREE_PREFIX + name, "100755" if executable else "100644", zf.read(info))


def wheel_timestamp(wheel: Path) -> int:
    """The release time recorded in the wheel (its dist-info/WHEEL entry), as a UTC epoch."""
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if info.filename.endswith(".dist-info/WHEEL"):
                return calendar.timegm((*info.date_time, 0, 0, 0))
    raise C128Error(f"{wheel.name} is not a wheel (no .dist-info/WHEEL)")


def _fast_import_stream(versions: list[str], wheels: dict[str, Path], reporter: Reporter) -> Iterator[bytes]:
    marks: dict[str, int] = {}
    next_mark = 1
    parent: int | None = None
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
        commit_mark = next_mark
        next_mark += 1
        head = [
            b"commit refs/heads/releases",
            b"mark :%d" % commit_mark,
            f"author {RELEASE_AUTHOR} {when} +0000".encode(),
            f"committer {RELEASE_AUTHOR} {when} +0000".encode(),
            b"data %d" % len(message),
        ]
        yield b"\n".join(head) + b"\n" + message
        if parent is not None:
            yield b"from :%d\n" % parent
        yield b"deleteall\n"
        for mode, path, mark in files:
            yield f"M {mode} :{mark} {path}\n".encode()
        yield b"\n"
        yield f"reset refs/tags/{tag_for(version)}\nfrom :{commit_mark}\n\n".encode()
        parent = commit_mark


def build_history(dest: Path, versions: Iterable[str], reporter: Reporter = NullReporter()) -> None:
    """Create a bare repository at ``dest`` holding one commit per release, oldest first."""
    ordered = sorted(set(versions), key=Version)
    wheels = {}
    for v in ordered:
        reporter.step(f"fetching sglang {v} wheel")
        wheels[v] = wheel_for(v)
    git = Git(git_dir=dest)
    dest.mkdir(parents=True, exist_ok=True)
    git.run("init", "--quiet", "--bare", "--initial-branch=releases", str(dest))
    git.run("config", "gc.auto", "0")
    proc = subprocess.Popen(
        ["git", "fast-import", "--quiet", "--done"],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "GIT_DIR": str(dest)},
    )
    assert proc.stdin is not None
    try:
        for chunk in _fast_import_stream(ordered, wheels, reporter):
            proc.stdin.write(chunk)
        proc.stdin.write(b"done\n")
        proc.stdin.close()
    except BrokenPipeError:
        pass
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.wait() != 0:
        raise C128Error(f"building the release history failed: {err.strip().splitlines()[-1:] or ''}")
    (dest / "c128patch-versions").write_text("\n".join(ordered) + "\n")


class ReleaseHistory:
    """The cached release-history repository (bare)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or cache_dir() / "sglang-releases.git"

    @property
    def git(self) -> Git:
        return Git(git_dir=self.root)

    def versions(self) -> list[str]:
        marker = self.root / "c128patch-versions"
        if not marker.is_file():
            return []
        return [v for v in marker.read_text().split() if v]

    def ensure(self, extra: Iterable[str] = (), reporter: Reporter = NullReporter()) -> Path:
        """Make sure the history holds the default releases plus ``extra``; returns its path."""
        for v in extra:
            try:
                Version(v)
            except InvalidVersion as exc:
                raise C128Error(f"not a release version: {v!r}") from exc
        with locked(self.root.with_suffix(".lock")):
            have = set(self.versions())
            want = have | set(DEFAULT_RELEASES) | set(extra)
            if want == have:
                return self.root
            tmp = Path(tempfile.mkdtemp(prefix="releases-", dir=self.root.parent))
            try:
                build_history(tmp / "repo.git", want, reporter)
                if self.root.exists():
                    shutil.rmtree(self.root)
                (tmp / "repo.git").rename(self.root)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return self.root
