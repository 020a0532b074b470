"""``wheel``: patch a released sglang wheel with the series, without rebuilding it.

Each entry's file is chosen for the wheel's release as ``apply`` chooses it (``series.plan`` on the
release history), then ``git apply -p2`` (strict) edits the unpacked files where they lie
(``wheel.rules`` says which may be). The result is versioned ``X.Y.Z+c128.<series version>.<digest[:8]>``
(``.<layer>.<digest[:8]>`` per layer), carries ``apply``'s provenance record and a CycloneDX SBOM, and
is written reproducibly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from c128patch import exitcodes, procs
from c128patch.errors import C128Error, ConflictError
from c128patch.git import Git
from c128patch.ops.check import release_support_note
from c128patch.progress import NullReporter, Reporter
from c128patch.series import provenance
from c128patch.series.layers import layer_rows, overlap_note
from c128patch.series.manifest import Series, sha256_file
from c128patch.series.paths import check_relpath, confine
from c128patch.series.plan import Planned, plan, validate_files
from c128patch.upstream.releases import (
    BINARY_SUFFIXES,
    TREE_PREFIX,
    ReleaseHistory,
    WheelTarget,
    check_release_content,
    file_sha256,
    release_version,
    release_wheel_for,
    tag_for,
    wheel_timestamp,
)
from c128patch.wheel.rules import check_wheel_patchable, refuse_folded_collisions, wheel_path
from c128patch.wheel.sbom import SBOM_NAME, Ancestor, PatchEntry, sbom_text
from c128patch.wheel.tools import InWheel, binary_dirs, disk_errors, source_date_epoch

PACKAGE = "sglang"
WHEEL_PROVENANCE = wheel_path(provenance.PROVENANCE_PATH)  # sglang/c128patch_provenance.json
LOCAL_TAG = "c128"


@dataclass
class WheelResult:
    wheel: str
    version: str
    sha256: str
    upstream_version: str
    upstream_wheel: str
    upstream_sha256: str
    epoch: int
    series: dict
    entries: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    layers: list[dict] = field(default_factory=list)  # each layer: name, version, base, digest, entries
    support_note: str = ""  # the wheel is older than every release the series was made on


MAX_VERSION = 160  # characters: the wheel's file name (version, tags, platform) within a file system's 255 bytes


def patched_version(base: Version, series_version: str, digest: str,
                    layers: Sequence[tuple[str, str]] = ()) -> Version:
    """``X.Y.Z+c128.<series version>.<digest[:8]>`` then ``.<layer>.<digest[:8]>`` per (name, digest)."""
    label = f"{LOCAL_TAG}.{series_version}.{digest[:8]}" + "".join(f".{name}.{d[:8]}" for name, d in layers)
    if base.local:
        label = f"{base.local}.{label}"
    if (length := len(f"{base.public}+{label}")) > MAX_VERSION:  # (a file name holds 255 bytes: a traceback)
        raise C128Error(f"series version {series_version[:40]!r}... makes the wheel's version {length} characters "
                        f"long, over the {MAX_VERSION} its file and .dist-info names can hold")
    try:
        return Version(f"{base.public}+{label}")
    except (InvalidVersion, ValueError) as exc:  # (ValueError: a digit run over Python's int conversion limit)
        # the word at fault, named (a provenance's layer name '../../x' was blamed on the series version '4')
        words = [(f"series version {series_version!r}", series_version),
                 (f"series digest {digest[:8]!r}", digest[:8]), *((f"layer name {n!r}", n) for n, _ in layers),
                 *((f"layer digest {d[:8]!r}", d[:8]) for _, d in layers)]
        what = next((said for said, word in words if not _local_word(word)), f"series version {series_version!r}")
        raise C128Error(f"{what} cannot go into a PEP 440 local label (use letters, digits and dots)") from exc


def _local_word(word: str) -> bool:
    """Can ``word`` stand in a PEP 440 local label (``1+WORD``)?"""
    try:
        return bool(word) and Version(f"1+{word}").local is not None
    except (InvalidVersion, ValueError):
        return False


def record_version(record: dict) -> Version:
    """The version a provenance record implies (its upstream release, series and layers)."""
    s = record.get("series", {})
    layers = [(str(r.get("name")), str(r.get("digest", ""))) for r in record.get("layers", [])]
    return patched_version(Version(str(record.get("upstream", {}).get("version"))), str(s.get("version")),
                           str(s.get("digest", "")), layers)


def apply_failure(stderr: str, hunk_at: Callable[[str, int], tuple[int, str] | None]) -> str:
    """'<file> hunk #N @@ ... @@' (``hunk_at``: the hunk holding a line) or what ``git apply`` says."""
    lines = stderr.splitlines()
    for line in lines:
        if "patch failed:" in line:
            path, _, num = line.split("patch failed:", 1)[1].strip().rpartition(":")
            hunk = hunk_at(path, int(num)) if num.isdigit() else None
            return f"{path} hunk #{hunk[0]} {hunk[1]}" if hunk else f"{path} at line {num}"
    for line in lines:
        if "No such file" in line or "does not exist" in line:
            return f"{line.removeprefix('error: ').split(':')[0]} (file missing in the wheel)"
        if "already exists" in line:
            return f"{line.removeprefix('error: ').split(':')[0]} (file already exists in the wheel)"
    return (lines[-1].removeprefix("error: ") if lines else "git apply failed")


def loose_git(root: Path) -> Git:
    """git run in ``root`` as a plain folder (never a repository found above it)."""
    return Git(worktree=root).with_env(GIT_CEILING_DIRECTORIES=str(root.parent))


def refuse_foreign(iw: InWheel, git: Git, commit: str, label: str) -> None:
    """Refuse a member the release's own wheel does not hold (a ``.pth`` run at every interpreter start, a ``.git/``
    folder, ``*.data/scripts``): each must be a source file of the release (its history commit), a compiled
    extension of the package (the history leaves those out), or a file of the wheel's own ``.dist-info``."""
    sources = set(git.out("ls-tree", "-r", "--name-only", "-z", commit, "--", TREE_PREFIX + PACKAGE).split("\0"))
    for name in iw.members():
        folder, _, rest = name.partition("/")
        if TREE_PREFIX + name in sources or (folder == iw.dist_info and "/" not in rest.removeprefix("licenses/")) or \
                (folder == PACKAGE and name.endswith(BINARY_SUFFIXES) and check_relpath(name, label)):
            continue
        raise C128Error(f"{label}: member {name} is not a file of sglang {iw.name.version}'s release (its sources, "
                        "compiled extensions or .dist-info); refusing the wheel")


def apply_entries(iw: InWheel, planned: list[Planned], label: str, reporter: Reporter, series: Series) -> list[dict]:
    """Apply every entry to the wheel's files, as ``apply`` does: overlay collisions refused first (exit 2);
    the first entry that does not apply (exit 1) named with its file, hunk and an overlapping entry of ours."""
    git = loose_git(iw.root)
    members = set(iw.members())
    for item in planned:
        target = wheel_path(item.entry.target) if item.patch is None else ""
        if target and (target in members or (iw.root / target).exists()):
            raise C128Error(f"overlay '{item.entry.name}' collides with {label}: {target} already exists in the wheel")
    rows = []
    for i, item in enumerate(planned):
        reporter.step(f"applying {item.entry.name}")
        if item.patch is not None:
            iw.extract([wheel_path(p) for p in item.patch.paths])  # both sides of renames
            proc = git.run("apply", "-p2", "--verbose", str(item.path.resolve()), check=False)
            if proc.returncode != 0:
                why = apply_failure(proc.stderr, lambda path, n: item.patch.hunk_at("python/" + path, n))
                overlap = overlap_note(series, planned[:i], item, item.touched, f"sglang {iw.name.version}",
                                       lambda rel: _member_text(iw.root, wheel_path(rel)))
                raise ConflictError(f"entry '{item.entry.name}' ({item.label}) does not apply to {label}: {why}"
                                    f"{overlap}; no wheel was written")
        else:
            target = wheel_path(item.entry.target)
            dest = confine(iw.root, target, f"overlay '{item.entry.name}'")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(item.path.read_bytes())
        rows.append({"name": item.entry.name, "kind": item.entry.kind, "file": item.label, "applied": "clean"})
    return rows


def _member_text(root: Path, rel: str) -> str | None:
    """A wheel member's text as extracted and patched so far (None: not extracted)."""
    try:
        return (root / rel).read_text(errors="replace")
    except (OSError, ValueError):
        return None


def _overlay_diff(root: Path, target: str, source: Path | None) -> bytes:
    """A git new-file diff adding ``target`` as ``root`` holds it; with ``source`` (an overlay a later entry, a layer's,
    edits), as the overlay writes it: the chain's step (verify-wheel takes the later diffs back, then hashes it)."""
    with procs.scratch("c128patch-overlay-") as tmp:
        if source is not None:
            root = Path(tmp)
            (root / target).parent.mkdir(parents=True)
            (root / target).write_bytes(source.read_bytes())
        proc = loose_git(root).run("diff", "--no-index", "--binary", "--full-index", "--no-color",
                                   "--src-prefix=a/python/", "--dst-prefix=b/python/", "/dev/null", target,
                                   check=False, binary=True)
    if proc.returncode not in (0, 1) or not proc.stdout:
        raise C128Error(f"cannot describe overlay {target}: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout


def finish(iw: InWheel, series: Series, planned: list[Planned], rows: list[dict], *, upstream: dict, ancestor: Ancestor,
           base: Version, epoch: int, out_dir: Path, build: str) -> tuple[Path, Version]:
    """Write provenance and SBOM, give the wheel its patched version, save it into ``out_dir``."""
    record = provenance.build(series, planned, upstream, rows)
    version = record_version({**record, "upstream": {"version": str(base)}})
    series_info = {k: record["series"][k] for k in ("name", "version", "digest")}
    prov = iw.root / WHEEL_PROVENANCE
    prov.parent.mkdir(parents=True, exist_ok=True)
    prov.write_text(provenance.dumps(record))
    entries = []  # each entry's diff: its patch file, or a git new-file diff adding the overlay's file
    for i, item in enumerate(planned):
        e = item.entry
        diff = item.path.read_bytes()
        if item.patch is None:
            target = wheel_path(e.target)
            iw.extract([target])
            if not (iw.root / target).is_file():
                raise C128Error(f"overlay '{e.name}': {target} is not in the wheel (left out by the build?)")
            diff = _overlay_diff(iw.root, target, item.path if any(
                e.target in p.touched for p in planned[i + 1:]) else None)
        entries.append(PatchEntry(e.name, e.kind, e.gate, e.upstream, e.upstream_status,
                                  item.variant.file if item.variant else e.source, sha256_file(item.path), diff, e.why))
    dist_info = iw.rename_dist_info(version)
    sbom_path = iw.root / dist_info / "sboms" / SBOM_NAME
    sbom_path.parent.mkdir(parents=True, exist_ok=True)
    sbom_path.write_text(sbom_text(PACKAGE, str(version), ancestor, entries, series_info, epoch, build,
                                   record.get("layers", [])))
    return iw.save(out_dir, version, epoch), version


def patch_wheel(series: Series, wheel: Path, out_dir: Path, reporter: Reporter = NullReporter()) -> WheelResult:
    """Patch the upstream sglang wheel ``wheel`` with ``series``; the new wheel goes to ``out_dir``."""
    start = time.perf_counter()
    validate_files(series)
    with disk_errors(f"patching {wheel.name}"), InWheel(wheel) as iw:
        meta, upstream_version = iw.metadata(), iw.name.version  # an upstream sglang wheel, not one of ours
        if iw.name.name != PACKAGE or str(meta.name).lower() != PACKAGE:
            raise C128Error(f"not an sglang wheel: {wheel.name} is {meta.name} {meta.version}")
        if Version(str(meta.version)) != upstream_version:
            raise C128Error(f"{wheel.name}: METADATA says version {meta.version}, the file name {upstream_version}")
        if not iw.tags_match():  # (a 2_34 build renamed manylinux_2_28: its label would claim an older glibc)
            raise C128Error(f"{wheel.name}: the tags of its {iw.dist_info}/WHEEL differ from its file name's (a "
                            "renamed wheel?); start from the wheel as it was published")
        if WHEEL_PROVENANCE in iw.members():
            raise C128Error(f"{wheel.name} is already patched by c128patch (it has {WHEEL_PROVENANCE}); "
                            "start from the upstream wheel")
        rel = release_version(str(upstream_version))
        if rel is None:
            raise C128Error(f"unknown release 'v{upstream_version}': only sglang release versions (X.Y.Z) can be "
                            "patched as wheels")
        history = ReleaseHistory()
        git = Git(git_dir=history.ensure([rel], reporter))
        tag = tag_for(rel)
        commit = git.rev_parse(tag)
        if commit is None:
            raise C128Error(f"unknown release '{tag}' (the release source knows "
                            f"{', '.join('v' + v for v in history.versions())})")
        refuse_foreign(iw, git, commit, wheel.name)
        # the label and provenance say it is the release's wheel; one checked by its content only is deflated anew
        iw.keep_streams = check_release_content(wheel, git, commit, rel)
        planned = plan(series, git, commit)
        tree = git.out("rev-parse", f"{commit}^{{tree}}")  # upstream by content, unlike the cache's commit
        check_wheel_patchable(planned, binary_dirs(iw.members()))
        refuse_folded_collisions(planned, iw.members())
        rows = apply_entries(iw, planned, wheel.name, reporter, series)
        upstream_sha = file_sha256(wheel)  # (sha256_file is a series file's: 64 MiB at most)
        epoch = source_date_epoch(wheel_timestamp(wheel))
        # By content only (release, source tree, wheel hash): the same wheel gives the same bytes on any cache.
        upstream = {"rev": tag, "tree": tree, "source": "release-wheel", "version": str(upstream_version),
                    "wheel": wheel.name, "wheel_sha256": upstream_sha}
        ancestor = Ancestor(PACKAGE, str(upstream_version), upstream_sha, wheel.name, tree=tree)
        reporter.step("writing the wheel")
        out, version = finish(iw, series, planned, rows, upstream=upstream, ancestor=ancestor,
                              base=upstream_version, epoch=epoch, out_dir=out_dir, build="wheel")
    ours = {"name": series.name, "version": series.version, "digest": series.ours.digest()}
    return WheelResult(str(out), str(version), file_sha256(out), str(upstream_version), str(wheel), upstream_sha, epoch,
                       ours, rows, round(time.perf_counter() - start, 3), layer_rows(series))


def patch_from(series: Series, wheel: Path | None, release: str | None, target: WheelTarget, out_dir: Path,
               reporter: Reporter = NullReporter()) -> WheelResult:
    """The upstream ``wheel`` (or ``release``'s that fits ``target``) patched; a wheel older than the
    series' releases is still tried, and when an entry then does not apply that note leads the hint."""
    wheel = wheel if wheel is not None else release_wheel(str(release), target, reporter)
    try:
        older = release_support_note(series, parse_wheel_filename(wheel.name)[1].public)
    except InvalidWheelFilename:
        older = ""  # patch_wheel says what is wrong with it
    try:
        result = patch_wheel(series, wheel, out_dir, reporter)
    except C128Error as exc:
        if older and exc.exit_code == exitcodes.FAILED:
            exc.hint = "\n".join([f"note: {older}", *([exc.hint] if exc.hint else [])])
        raise
    return replace(result, support_note=older)


def release_wheel(version: str, target: WheelTarget = WheelTarget(), reporter: Reporter = NullReporter()) -> Path:
    """Release ``version``'s upstream wheel for ``target`` (wheelhouse/cache, else downloaded)."""
    rel = release_version(version)
    if rel is None:
        raise C128Error(f"not a release version: {version!r} (expected X.Y.Z, e.g. 0.5.23)")
    return release_wheel_for(rel, target, reporter)
