"""Where the kernel tier's inputs are: the GPU suite, the patched and unpatched source trees
(a checkout's python/, a folder holding sglang/, an unpacked wheel), their provenance record,
and a carry-sized copy of them for a GPU machine."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterable, Iterator

from c128patch import PACKAGE_DIR
from c128patch.errors import C128Error, need_file
from c128patch.git import Git, is_work_tree, toplevel
from c128patch.procs import scratch_dir
from c128patch.series.paths import check_relpath, confine
from c128patch.series.provenance import PROVENANCE_PATH
from c128patch.smoke import load_file

SUITE_ENV = "C128PATCH_GPU_SUITE"
SUITE = "tests/gpu"
PROVENANCE_IN_ROOT = str(PurePosixPath(PROVENANCE_PATH).relative_to("python"))  # sglang/c128patch_provenance.json
ARCHIVE_PATHS = ("python/sglang",)


def default_suite_root() -> Path:
    """The GPU suite this tool carries: $C128PATCH_GPU_SUITE, the packaged copy, or the checkout's tests/gpu."""
    explicit = os.environ.get(SUITE_ENV)
    if explicit:
        return Path(explicit)
    for candidate in (PACKAGE_DIR / "_series" / SUITE, PACKAGE_DIR.parents[1] / SUITE):
        if candidate.is_dir():
            return candidate
    raise C128Error(f"cannot find the GPU suite ({SUITE}); pass --suite DIR or set {SUITE_ENV}")


def out_dir(out: Path | None, tier: str) -> Path:
    """``--out``, else a new temporary folder named for the tier."""
    return (out if out is not None else Path(tempfile.mkdtemp(prefix=f"c128patch-smoke-{tier}-"))).resolve()


@contextlib.contextmanager
def interrupted_out(out: Path, given: Path | None) -> Iterator[None]:
    """On a signal in the block, ``out`` removed where the tool made it (no ``--out``): "its scratch folders are
    removed", no report of a run that did not end left in a temporary folder."""
    try:
        yield
    except KeyboardInterrupt:
        if given is None:
            shutil.rmtree(out, ignore_errors=True)
        raise


def resolve_tree(path: Path, what: str = "--tree") -> Path:
    """The folder holding ``sglang/``: ``<checkout>/python``, or the folder itself."""
    path = path.expanduser()
    if not path.exists():
        raise C128Error(f"{what}: {path} does not exist")
    for root in (path / "python", path):
        if (root / "sglang").is_dir():
            if not (root / "sglang" / "kernels" / "jit").is_dir():
                raise C128Error(f"{what}: {root / 'sglang'} has no kernels/jit (not an sglang source tree)")
            return root.resolve()
    raise C128Error(f"{what}: {path} holds neither python/sglang/ nor sglang/")


def unpack_wheel(wheel: Path, dest: Path) -> Path:
    """The ``sglang/`` package of a wheel, unpacked under ``dest``; returns ``dest``."""
    from c128patch.upstream.releases import WheelZip  # (packaging: only when a wheel is unpacked)
    from c128patch.wheel.tools import check_archive

    with WheelZip(wheel) as zf:
        members = [check_relpath(m, f"--wheel {wheel.name}") for m in zf.namelist()
                   if m.startswith("sglang/") and not m.endswith("/")]
        if not members:
            raise C128Error(f"--wheel: {wheel.name} has no sglang/ package")
        check_archive(zf.infolist(), wheel)  # (a 1000:1 bomb was unpacked whole: a disk filled)
        for name in members:
            zf.extract(name, dest)
    return dest


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path`` (None: no such file), else a one-line error."""
    from c128patch.jsonio import MAX_JSON

    if not path.is_file():
        return None
    try:  # (a FIFO swapped in after the check: never waited on)
        with open(path, "rb", opener=lambda name, flags: os.open(name, flags | os.O_NONBLOCK)) as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                return None
            if (size := os.fstat(fh.fileno()).st_size) > MAX_JSON:  # (an 8 GB sparse one was read into memory)
                raise C128Error(f"{path}: {size} bytes, over the {MAX_JSON >> 20} MiB a JSON file of ours may hold; "
                                "not read")
            doc = json.loads(fh.read(MAX_JSON + 1).decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise C128Error(f"{path}: not UTF-8 (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise C128Error(f"{path}: not valid JSON ({exc.msg})") from exc
    except RecursionError:
        raise C128Error(f"{path}: nested too deeply to read") from None
    except ValueError:  # (an integer past Python's digit limit: a ValueError traceback, helper 173)
        raise C128Error(f"{path}: not valid JSON (a number too long to read)") from None
    except OSError as exc:
        raise C128Error(f"cannot read {path}: {exc.strerror}") from None
    if not isinstance(doc, dict):
        raise C128Error(f"{path}: a JSON {type(doc).__name__}, not an object")
    return doc


def read_provenance(root: Path) -> dict | None:
    return read_json(root / PROVENANCE_IN_ROOT)


def series_info(record: dict | None) -> dict | None:
    """What the report says about the applied series (from the provenance record)."""
    if record is None:
        return None
    return {
        "series": record.get("series", {}),
        "upstream": record.get("upstream", {}),
        "tool": record.get("tool", {}),
        "entries": [{k: e.get(k) for k in ("name", "kind", "gate")} for e in record.get("entries", [])],
    }


@dataclass
class KernelOptions:
    tree: Path | None = None
    wheel: Path | None = None
    upstream_tree: Path | None = None
    sanitizers: tuple[str, ...] = ()
    differential: bool = False
    scale: float = 1.0
    sanitizer_scale: float = 0.05
    sanitizer_only: bool = False
    collect_only: bool = False
    suite: Path | None = None
    timeout: float = 1800.0
    keyword: str | None = None
    python: str = sys.executable
    out: Path | None = None


@dataclass
class Prepared:
    """Trees resolved, suite found."""

    patched: Path
    upstream: Path | None
    upstream_how: str
    suite: Path
    record: dict | None


def validate(opts: KernelOptions) -> Path:
    """Cheap checks of the inputs, before the machine is probed; returns the suite."""
    if (opts.tree is None) == (opts.wheel is None):
        raise C128Error("give the patched sources one way: --tree PATH or --wheel FILE")
    suite = (opts.suite or default_suite_root()).resolve()
    if not suite.is_dir() or not any(suite.glob("test_*.py")):
        raise C128Error(f"no GPU suite at {suite} (expected test_*.py files there)")
    if opts.tree is not None:
        root = resolve_tree(opts.tree)
        upstream = (read_provenance(root) or {}).get("upstream", {})
        if opts.differential and opts.upstream_tree is None and not opts.collect_only and not (
                upstream.get("commit") or upstream.get("rev")):
            raise C128Error("--differential: the tree has no provenance record naming its upstream; "
                            "pass --upstream-tree")
    if opts.wheel is not None:
        need_file(opts.wheel, "--wheel", "--wheel")
        if not zipfile.is_zipfile(opts.wheel):
            raise C128Error(f"--wheel: {opts.wheel} is not a wheel (not a zip file)")
    if opts.upstream_tree is not None:
        resolve_tree(opts.upstream_tree, "--upstream-tree")
    return suite


@contextlib.contextmanager
def prepare(opts: KernelOptions, progress: Callable[[str], None] = lambda _m: None) -> Iterator[Prepared]:
    """Resolve the suite and the trees (unpacking a wheel, deriving upstream when asked); temp folders removed after."""
    suite = validate(opts)
    work = Path(scratch_dir("c128patch-smoke-"))  # (a SIGKILLed run's swept by pid)
    try:
        if opts.wheel is not None:
            progress(f"unpacking {opts.wheel.name}")
            patched = resolve_tree(unpack_wheel(opts.wheel, work / "patched"), "--wheel")
        else:  # validate: --tree when there is no --wheel
            patched = resolve_tree(opts.tree or Path())
        record = read_provenance(patched)
        upstream, how = None, ""
        if opts.upstream_tree is not None:
            upstream, how = resolve_tree(opts.upstream_tree, "--upstream-tree"), "--upstream-tree"
        elif opts.differential and not opts.collect_only:
            progress("extracting the unpatched upstream sources")
            root, how = derive_upstream(patched, record, opts.wheel, work)
            upstream = resolve_tree(root, "upstream")
        if upstream is not None and upstream == patched:
            raise C128Error("the upstream tree is the patched tree; pass the unpatched sources")
        yield Prepared(patched, upstream, how, suite, record)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def extract_python(git: Git, ref: str, workdir: Path, paths: tuple[str, ...]) -> Path:
    """``paths`` of ``ref`` under ``workdir/upstream`` (``Git.extract``); its python/ folder (holding sglang/)."""
    for path in paths:
        git.extract(ref, path, workdir / "upstream")
    return workdir / "upstream" / "python"


def derive_upstream(patched_root: Path, record: dict | None, wheel: Path | None, workdir: Path,
                    paths: tuple[str, ...] = ARCHIVE_PATHS) -> tuple[Path, str]:
    """The unpatched sources of a patched tree (its recorded upstream commit, from its repository or the release
    history) or wheel (the release wheel of the same X.Y.Z), extracted under ``workdir``."""
    from c128patch.upstream.releases import ReleaseHistory, release_version  # packaging only, no network yet

    upstream = (record or {}).get("upstream", {})
    rev, commit = str(upstream.get("rev", "")), str(upstream.get("commit", ""))
    if wheel is not None:
        from packaging.utils import parse_wheel_filename
        from packaging.version import Version

        from c128patch.upstream.releases import wheel_for

        version = release_version(rev) if rev else None
        if version is None:
            try:
                version = Version(str(parse_wheel_filename(wheel.name)[1])).base_version
            except Exception as exc:  # noqa: BLE001  (any unparsable name)
                raise C128Error(f"cannot tell the sglang release of {wheel.name}; pass --upstream-tree") from exc
        release = wheel_for(version)
        return unpack_wheel(release, workdir / "upstream"), f"release wheel {release.name}"
    if not commit and not rev:
        raise C128Error("--differential: the tree has no provenance record naming its upstream; pass --upstream-tree")
    want = commit or rev
    top = toplevel(patched_root) if is_work_tree(patched_root) else None
    if top is not None and Git(worktree=top).rev_parse(want):
        return extract_python(Git(worktree=top), want, workdir, paths), f"git archive {want[:12]} of {top}"
    version = release_version(rev) if rev else None
    if version is None:
        raise C128Error(f"--differential: upstream {rev or want[:12]} is not in the tree's repository and not a "
                        "release; pass --upstream-tree")
    repo = ReleaseHistory().ensure([version])
    ref = commit if commit and Git(git_dir=repo).rev_parse(commit) else f"v{version}"
    return extract_python(Git(git_dir=repo), ref, workdir, paths), f"release history {ref[:12]} (sglang {version})"


def stage(suite: Path, trees: dict[str, Path], dest: Path,
          extra: Callable[[str, Path], Iterable[Path]] | None = None) -> dict[str, dict[str, int]]:
    """Copy into ``dest/<label>`` what the kernel tier reads of each tree (tests/gpu/tree_subset.py's list, else
    all of ``sglang/``), the provenance record and ``extra(label, root)``'s paths (relative to the root)."""
    helper = suite / "tree_subset.py"
    subset = load_file("c128patch_suite_tree_subset", helper).subset_files if helper.is_file() else None
    out = {}
    for label, root in trees.items():
        files = [Path(p) for p in subset(root)] if subset else [
            p.relative_to(root) for p in (root / "sglang").rglob("*") if p.is_file() and "__pycache__" not in p.parts]
        if (root / PROVENANCE_IN_ROOT).is_file():
            files.append(Path(PROVENANCE_IN_ROOT))
        out[label] = copy_files(root, [*files, *(extra(label, root) if extra else [])], dest / label)
    return out


def copy_files(root: Path, files: Iterable[Path], target: Path) -> dict[str, int]:
    """``files`` (relative to ``root``) copied into ``target``, made afresh; how many and their bytes."""
    if target.exists():
        shutil.rmtree(target)
    unique = sorted(set(files))
    for rel in unique:  # a file of the tree that is a link (to ~/.ssh/id_rsa, say) was copied with its target's bytes
        src = confine(root, rel.as_posix(), f"the tree {root}", regular=True)
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target / rel)
    return {"files": len(unique), "bytes": sum((target / rel).stat().st_size for rel in unique)}


