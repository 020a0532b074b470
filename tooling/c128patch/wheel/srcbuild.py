"""``build``: a real source build (PEP 517) of a patched sglang checkout, for unreleased commits.

Takes ``apply``'s ``--sglang-rev/--repo/--tree`` and applies first unless the tree is already this
series on this commit, committed and clean (any other patched tree is refused); the commit must hold
``python/pyproject.toml``. The version is forced through setuptools-scm's
``SETUPTOOLS_SCM_PRETEND_VERSION_FOR_SGLANG``: ``X.Y.Z`` at a release tag, else the guess-next-dev
``X.Y.(Z+1).devN+g<sha>`` (or ``--base-version``). ``python -m build --wheel`` runs on HEAD exported
with ``Git.extract`` at the commit's time, by the ``runner`` it is handed (``cli/build.py``: the sealed box,
``fit.build_box.run_build``: it runs the tree's build backend), must yield that version, and the wheel then gets
``wheel``'s label, provenance and SBOM and passes ``verify-wheel``'s checks before it is moved out.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import stat
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from packaging.version import InvalidVersion, Version

from c128patch import procs
from c128patch.errors import C128Error
from c128patch.git import Git
from c128patch.ops.applier import Apply
from c128patch.procs import scratch_dir
from c128patch.progress import NullReporter, Reporter, echo
from c128patch.series import provenance
from c128patch.series.layers import describe
from c128patch.series.manifest import Series
from c128patch.series.plan import Planned, plan
from c128patch.upstream.releases import file_sha256, release_version
from c128patch.upstream.source import Target, Upstream, prepare_tree
from c128patch.wheel.patch import PACKAGE, finish
from c128patch.wheel.sbom import Ancestor
from c128patch.wheel.tools import InWheel, WheelName
from c128patch.wheel.verify import verify_wheel

PYPROJECT = "python/pyproject.toml"
PRETEND_ENV = "SETUPTOOLS_SCM_PRETEND_VERSION_FOR_SGLANG"
_DESCRIBE = re.compile(r"^v(?P<tag>\d+\.\d+\.\d+(?:\.post\d+|rc\d+)?)-(?P<n>\d+)-g(?P<sha>[0-9a-f]+)$")

NOTICE = ("runs the target tree's PEP 517 build backend (its code: python -m build) in a sealed box: scrubbed "
          "environment (HOME a scratch folder, no token), isolated Python, no writes outside its build folder, no "
          "reads outside the system's folders and what it builds, its own processes only, where the host allows it; "
          "with build isolation it has the network and your pip settings (to install the build requirements), with "
          "--no-isolation neither")

Runner = Callable[[list[str], dict[str, str], Path, Path], int]


@dataclass
class BuildResult:
    wheel: str
    version: str
    base_version: str
    sha256: str
    tree: str
    rev: str
    upstream_commit: str
    applied: bool  # whether this run applied the series (else the tree was already patched)
    command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    runs_target_code: str = NOTICE  # what the build ran of the target's, and how


def base_version(git: Git, rev: str, commit: str, override: str | None = None) -> Version:
    """The upstream version a source build of ``commit`` gets."""
    if override:
        try:
            return Version(override)
        except InvalidVersion as exc:
            raise C128Error(f"--base-version {override!r} is not a PEP 440 version") from exc
    rel = release_version(rev)
    if rel is not None:
        return Version(rel)
    proc = git.run("describe", "--tags", "--long", "--abbrev=9", "--match", "v[0-9]*", commit, check=False)
    match = _DESCRIBE.match(proc.stdout.strip()) if proc.returncode == 0 else None
    if match is None:
        raise C128Error(f"cannot tell the upstream version of {rev}: no vX.Y.Z tag before it in "
                        f"{git.git_dir or git.worktree}; fetch upstream's tags or pass --base-version X.Y.Z")
    tag, n = Version(match["tag"]), int(match["n"])  # at the tag, else guess-next-dev
    return tag if n == 0 else Version(f"{tag.major}.{tag.minor}.{tag.micro + 1}.dev{n}+g{match['sha']}")


def build_command(python_dir: Path, outdir: Path, no_isolation: bool = False) -> list[str]:
    isolation = ["--no-isolation"] if no_isolation else []
    return [sys.executable, "-m", "build", "--wheel", "--outdir", str(outdir), *isolation, str(python_dir)]


def build_env(version: Version, epoch: int) -> dict[str, str]:
    return {PRETEND_ENV: str(version), "SOURCE_DATE_EPOCH": str(epoch)}


def _patched_state(git: Git, tree: Path, series: Series, commit: str) -> dict | None:
    """The provenance of a tree patched with this series on ``commit`` (clean, at HEAD); None: unpatched."""
    path = tree / provenance.PROVENANCE_PATH
    if not path.is_file():
        return None
    record = provenance.read_provenance(tree)
    digest = series.digest()  # a stack's: the series and its layers
    have = record.get("series", {})
    if provenance.applied_digest(record) != digest or record.get("upstream", {}).get("commit") != commit:
        layers = "".join(f" + layer {r.get('name')} {r.get('version')}" for r in record.get("layers", []))
        raise C128Error(f"{tree} is patched with series {have.get('name')} {have.get('version')}{layers} on "
                        f"{str(record.get('upstream', {}).get('commit', '?'))[:12]}, not {describe(series)} on "
                        f"{commit[:12]}; check out an unpatched branch or pass --tree to a new folder")
    last = git.out("log", "-1", "--format=%H", "--", provenance.PROVENANCE_PATH)
    if last != git.head():
        raise C128Error(f"{tree} has commits on top of the patched series; a built wheel would not match its "
                        "provenance")
    if git.status_porcelain():
        raise C128Error(f"{tree} has uncommitted changes; a built wheel would not match its provenance")
    return record


class _BuildFailed(C128Error):
    """The PEP 517 build itself failed: its log is kept (the hint names it)."""


def _validate(series: Series, upstream: Upstream, target: Target, base_override: str | None,
              runner: Runner) -> tuple[Version, list[Planned]]:
    """(base version, plan), before anything is touched."""
    rev, commit = target.rev, target.commit
    if upstream.git.run("cat-file", "-e", f"{commit}:{PYPROJECT}", check=False).returncode != 0:
        rel = release_version(rev)
        hint = f"; to patch that release, use c128patch wheel --from-release {rel}" if rel else ""
        raise C128Error(f"{PYPROJECT} is missing at {rev} in {upstream.describe()}: a source build needs an upstream "
                        f"source checkout (the release-wheel history has no build files){hint}")
    if importlib.util.find_spec("build") is None:
        raise C128Error("the PEP 517 front end 'build' is not installed (pip install build)")
    return base_version(upstream.git, rev, commit, base_override), plan(series, upstream.git, commit)


def _log_tail(log: Path) -> str:
    """The last line of the build's log (its last 64 KiB read), only where it is still a regular file: the box writes
    that folder, and a link it left there (to a file of the operator's it cannot read, to /dev/zero) is not followed."""
    try:
        fd = os.open(log, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return "(its log is gone or a link: not read)" if os.path.lexists(log) else ""
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return "(its log is not a regular file: not read)"
        f.seek(max(0, info.st_size - 65536))
        return (f.read(65536).decode(errors="replace").strip().splitlines() or ["(no output)"])[-1]


def _keep_log(log: Path) -> Path | None:
    """A failed build's log (a regular file: ``_log_tail`` said so) moved out of its scratch folder, which goes: any
    later run sweeps a dead run's folder, so a log left there was gone once the operator read the hint naming it. Its
    own file in the temporary folder, named by no pid (output the operator reads, not scratch)."""
    try:
        fd, kept = tempfile.mkstemp(prefix="c128patch-build-log-", suffix=".log")
        os.close(fd)
        shutil.move(log, kept)
    except OSError:  # (a full temporary folder): no log to point at
        return None
    return Path(kept)


def _run_build(git: Git, work: Path, base: Version, epoch: int, no_isolation: bool, runner: Runner,
               reporter: Reporter) -> tuple[Path, list[str], dict[str, str]]:
    """HEAD exported into ``work`` and built: (the one wheel built, the command, its env)."""
    reporter.step("exporting the patched tree (HEAD)")  # committed files only: the provenance's, no untracked ones
    (work / "src").mkdir(parents=True)
    git.extract("HEAD", ".", work / "src")
    python_dir = work / "src" / "python"
    dist_dir = work / "dist"
    cmd, env = build_command(python_dir, dist_dir, no_isolation), build_env(base, epoch)
    echo(f"build {NOTICE}")  # said as it starts, on stderr, on a terminal or not, with --json too (runs_target_code)
    reporter.step(f"building sglang {base} from {python_dir} (python -m build --wheel, in the sealed box)")
    log = work / "build.log"
    code = runner(cmd, env, python_dir, log)
    if code != 0:
        tail = _log_tail(log)
        kept = not tail.startswith("(its log ")  # a link or not a file: nothing to point the operator at
        raise _BuildFailed(f"the source build failed (exit {code}): {tail}", hint=f"full log: {log}" if kept else None)
    built = sorted(dist_dir.glob("*.whl"))
    if len(built) != 1:
        raise C128Error(f"the source build produced {len(built)} wheels, expected one")
    if dist_dir.is_symlink() or not stat.S_ISREG(os.lstat(built[0]).st_mode):  # the box writes that folder
        raise C128Error(f"the source build's wheel {built[0].name} is a link, not a wheel it wrote (or not a regular "
                        "file): nothing is read through it")
    name = WheelName.parse(built[0])
    if name.name != PACKAGE or name.version != base:
        raise C128Error(f"the source build produced {built[0].name}, not sglang {base}: {PRETEND_ENV} was not "
                        "honoured (does python/pyproject.toml still take its version from setuptools-scm?)")
    return built[0], cmd, env


def _label_and_verify(built: Path, out_dir: Path, series: Series, planned: list[Planned], rows: list[dict],
                      info: dict, base: Version, epoch: int, reporter: Reporter) -> tuple[Path, Version]:
    """The built wheel given its label, provenance and SBOM, verified, then moved into ``out_dir``."""
    reporter.step("adding provenance and SBOM")
    out_dir.mkdir(parents=True, exist_ok=True)
    stage = Path(procs.scratch_dir(".c128patch-stage-", out_dir))
    try:
        with InWheel(built) as iw:
            ancestor = Ancestor(PACKAGE, str(base), commit=info["commit"])
            staged, version = finish(iw, series, planned, rows, upstream=info, ancestor=ancestor, base=base,
                                     epoch=epoch, out_dir=stage, build="source")
        reporter.step("verifying the built wheel")
        verify_wheel(staged, series)
        final = out_dir / staged.name
        os.replace(staged, final)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return final, version


def build_wheel(series: Series, upstream: Upstream, rev: str, tree: Path | None, out_dir: Path, *,
                runner: Runner, base_override: str | None = None, no_isolation: bool = False,
                reporter: Reporter = NullReporter()) -> BuildResult:
    """Patch (unless done) and source-build ``rev``; the labelled, verified wheel goes to ``out_dir``."""
    start = time.perf_counter()
    target = Target.of(upstream, rev)
    commit = target.commit
    base, planned = _validate(series, upstream, target, base_override, runner)
    worktree, fresh = prepare_tree(upstream, tree, commit, reporter)
    git = Git(worktree=worktree)
    record = None if fresh else _patched_state(git, worktree, series, commit)  # None: not patched yet
    applied = record is None  # whether this run applies the series
    rows = (Apply(git, series, reporter).start(target, fresh_clone=fresh).entries if applied
            else record.get("entries", []))
    info = {**target.to_json(), "version": str(base), "build": "source"}  # how it was made
    epoch = int(git.out("show", "-s", "--format=%ct", commit))
    work = Path(scratch_dir("c128patch-build-"))  # (a SIGKILLed run's swept by pid)
    created = not out_dir.exists()
    try:
        built, cmd, env = _run_build(git, work, base, epoch, no_isolation, runner, reporter)
        final, version = _label_and_verify(built, out_dir, series, planned, rows, info, base, epoch, reporter)
    except BaseException as exc:
        if isinstance(exc, _BuildFailed) and exc.hint:
            kept = _keep_log(work / "build.log")
            exc.hint = f"full log: {kept}" if kept else None
        if created:
            shutil.rmtree(out_dir, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return BuildResult(str(final), str(version), str(base), file_sha256(final), str(git.worktree), rev, commit,
                       applied, cmd, env, round(time.perf_counter() - start, 3))
