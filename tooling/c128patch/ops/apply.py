"""``apply``: check out an upstream rev on a new branch and replay the series, one commit per entry.

Choice on a conflict: the branch stays at the last entry that applied, with the failing entry,
file and hunk named and the commands to inspect or undo; the user's original branch is untouched
and a recovery ref points at it. A finished apply is proven: its tree must equal a fresh replay of
the series in a temporary index (``ops.equivalence``), else the command fails with the hunk shown.
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from c128patch.errors import C128Error, ConflictError, DifferenceError
from c128patch.git import Git
from c128patch.ops.equivalence import prove
from c128patch.ops.treestate import c128_state_dir, ensure_clean, ensure_idle
from c128patch.progress import NullReporter, Reporter
from c128patch.series import provenance
from c128patch.series.manifest import Series
from c128patch.series.patchfile import PatchInfo
from c128patch.series.plan import ENTRY_TRAILER, Planned, check_paths_at, merged_entries, overlay_message, plan

RECOVERY_PREFIX = "refs/c128patch/recovery"


@dataclass
class ApplyResult:
    tree: str
    rev: str
    upstream_commit: str
    branch: str
    head: str = ""
    recovery_ref: str = ""
    entries: list[dict] = field(default_factory=list)
    provenance: str = provenance.PROVENANCE_PATH
    equivalence: dict = field(default_factory=dict)  # the proof: the tree against a fresh replay of the series
    already_applied: bool = False  # the branch held this series on this rev already: nothing was done
    commits_on_top: int = 0
    checked_out: bool = True

    def to_json(self) -> dict:
        return asdict(self)


def _q(path: Path | str) -> str:
    return shlex.quote(str(path))


def _failure_detail(git: Git, item: Planned, output: str) -> tuple[str, str]:
    """(file, hunk description) of the first failing hunk, as git reports it."""
    patch: PatchInfo = item.patch  # type: ignore[assignment]
    proc = git.run("apply", "--check", "--verbose", str(item.path), check=False)
    text = output + "\n" + proc.stderr
    for line in text.splitlines():
        if "patch failed:" in line:
            loc = line.split("patch failed:", 1)[1].strip()
            path, _, num = loc.rpartition(":")
            hunk = patch.hunk_at(path, int(num)) if num.isdigit() else None
            return path, f"hunk #{hunk[0]} {hunk[1]}" if hunk else f"at line {num}"
        if "does not exist in index" in line or "No such file" in line:
            return line.split(":")[1].strip() if ":" in line else "?", "file missing upstream"
        if "already exists" in line:
            return line.split(":")[1].strip() if ":" in line else "?", "file already exists upstream"
    for line in text.splitlines():
        if line.startswith("CONFLICT"):
            return line.rsplit(" ", 1)[-1], "3-way merge conflict"
    return (patch.files[0] if patch.files else "?"), "does not apply"


def already_applied(series: Series, git: Git, branch: str, upstream_commit: str, rev: str) -> ApplyResult | None:
    """The result of an earlier apply when ``branch`` already holds this series on this upstream
    commit (its provenance at the tip, or below the user's own commits); None otherwise."""
    tip = git.rev_parse(f"refs/heads/{branch}")
    if tip is None:
        return None
    prov_commit = git.out("log", "-1", "--format=%H", tip, "--", provenance.PROVENANCE_PATH)
    blob = git.blob(tip, provenance.PROVENANCE_PATH) if prov_commit else None
    try:
        record = json.loads(blob) if blob else {}
    except json.JSONDecodeError:
        return None
    if record.get("series", {}).get("digest") != series.digest() or \
            record.get("upstream", {}).get("commit") != upstream_commit:
        return None
    result = ApplyResult(str(git.worktree), rev, upstream_commit, branch, head=tip, already_applied=True,
                         commits_on_top=git.count(f"{prov_commit}..{tip}"), checked_out=git.current_branch() == branch)
    result.entries = [{"name": e["name"], "kind": e["kind"], "file": e.get("file", e.get("source", "")),
                       "status": "applied", "applied": e.get("applied", ""), "commit": e.get("commit", "")}
                      for e in record.get("entries", [])]
    return result


def apply_series(
    series: Series,
    git: Git,
    rev: str,
    upstream_commit: str,
    *,
    branch: str | None = None,
    fresh_clone: bool = False,
    upstream_info: dict | None = None,
    reporter: Reporter = NullReporter(),
) -> ApplyResult:
    tree = git.worktree
    assert tree is not None
    branch = branch or f"c128/{rev}"
    if not git.ok("check-ref-format", "--branch", branch):
        raise C128Error(f"invalid branch name: {branch!r}")
    if not fresh_clone:
        ensure_idle(git, "apply")
        done = already_applied(series, git, branch, upstream_commit, rev)
        if done is not None:
            return done
        ensure_clean(git, "apply")
    if git.rev_parse(f"refs/heads/{branch}"):
        # A checked-out branch cannot be deleted: the fix detaches first.
        detach = f"git -C {_q(tree)} checkout --quiet --detach && " if git.current_branch() == branch else ""
        raise C128Error(
            f"branch {branch} already exists in {tree} (not this series on {rev}); pass --branch NAME or delete it "
            f"({detach}git -C {_q(tree)} branch -D {branch}); nothing was changed"
        )
    # Everything that can be checked without touching the tree is checked first.
    planned = plan(series, git, upstream_commit)
    check_paths_at(git, upstream_commit, planned)

    result = ApplyResult(str(tree), rev, upstream_commit, branch)
    orig_branch = None if fresh_clone else git.current_branch()
    orig_head = None if fresh_clone else git.head()
    if orig_head:
        result.recovery_ref = f"{RECOVERY_PREFIX}/{time.strftime('%Y%m%dT%H%M%S')}-{orig_head[:8]}"
        git.run("update-ref", "-m", "c128patch apply: recovery point", result.recovery_ref, orig_head)
    state = c128_state_dir(git)
    state.mkdir(parents=True, exist_ok=True)
    (state / "last-apply.json").write_text(
        json.dumps({"branch": branch, "orig_branch": orig_branch, "orig_head": orig_head,
                    "recovery_ref": result.recovery_ref, "rev": rev}, indent=2)
    )
    date = git.out("log", "-1", "--format=%cI", upstream_commit)  # (`show -s` costs 0.5 s on a release commit)
    dated = git.with_env(GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)
    reporter.step(f"checking out {rev} on {branch}")
    git.run("checkout", "--quiet", "-b", branch, upstream_commit)

    back = orig_branch or orig_head or ""
    undo = (
        f"git -C {_q(tree)} checkout {back} && git -C {_q(tree)} branch -D {branch}"
        if back
        else f"rm -rf {_q(tree)}"
    )
    result.entries += [{"name": e.name, "kind": e.kind, "status": "skipped",
                        "detail": f"merged upstream in {e.merged_in[:12]}"} for e in merged_entries(series, git, upstream_commit)]
    for i, item in enumerate(planned):
        reporter.step(f"applying {item.entry.name}")
        row = {"name": item.entry.name, "kind": item.entry.kind, "file": item.label}
        if item.patch is not None:
            proc = dated.run("am", "--3way", "--committer-date-is-author-date", str(item.path), check=False)
            output = proc.stdout + proc.stderr
            if proc.returncode != 0:
                git.run("am", "--abort", check=False)
                path, hunk = _failure_detail(git, item, output)
                last = planned[i - 1].entry.name if i else f"upstream {rev}"
                row.update(status="conflict", failed_file=path, failed_hunk=hunk)
                result.entries.append(row)
                result.entries += [{"name": p.entry.name, "kind": p.entry.kind, "status": "not-reached"} for p in planned[i + 1 :]]
                result.head = git.head() or ""
                raise ConflictError(
                    f"entry '{item.entry.name}' ({item.label}) does not apply to {rev}: {path} {hunk}",
                    hint=(
                        f"{branch} is left at the last good entry ({last}); your branch {back or '(none)'} is untouched.\n"
                        f"  inspect: git -C {_q(tree)} am -3 {_q(item.path)}   (then git -C {_q(tree)} status; git -C {_q(tree)} am --abort)\n"
                        f"  undo:    {undo}"
                        + (f"\n  recovery ref: {result.recovery_ref}" if result.recovery_ref else "")
                    ),
                    report=result.to_json(),
                )
            row["applied"] = "3way" if "Falling back to patching base and 3-way merge" in output else "clean"
            if not item.patch.trailers.get(ENTRY_TRAILER):
                dated.run("commit", "--quiet", "--amend", "--no-edit", "--no-verify",
                          "--trailer", f"{ENTRY_TRAILER}: {item.entry.name}")
        else:
            dest = tree / item.entry.target
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(item.path.read_bytes())
            git.run("add", "--", item.entry.target)
            dated.run("commit", "--quiet", "--no-verify", "-m", overlay_message(item.entry, series))
            row["applied"] = "clean"
        row["status"] = "applied"
        row["commit"] = git.head() or ""
        result.entries.append(row)

    reporter.step("writing provenance")
    record = provenance.build(series, planned, upstream_info or {"rev": rev, "commit": upstream_commit}, result.entries)
    (tree / provenance.PROVENANCE_PATH).write_text(provenance.dumps(record))
    git.run("add", "--", provenance.PROVENANCE_PATH)
    dated.run("commit", "--quiet", "--no-verify", "-m",
              f"c128patch: provenance (series {series.name} {series.version} on {rev})\n\n"
              f"{ENTRY_TRAILER}: provenance\n")
    result.head = git.head() or ""
    reporter.step("proving the tree against a fresh replay of the series")
    proof = prove(series, git, rev, upstream_commit, result.head, accept=lambda edit: False)
    result.equivalence = proof.to_json()
    if not proof.ok:
        shown = "\n".join(f"  {h.path} {h.header}" for d in proof.unattributed for h in d.hunks[:20])
        raise DifferenceError(f"applied to {rev}, but the tree is not what the series says: {proof.summary()}",
                              hint=f"{shown}\n  {branch} is kept as it is for inspection\n  undo: {undo}",
                              report=result.to_json())
    return result
