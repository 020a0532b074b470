"""The provenance record written into a patched tree (and into patched wheels)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from c128patch import __version__
from c128patch.errors import C128Error
from c128patch.git import Git
from c128patch.jsonio import MAX_JSON
from c128patch.series.layers import layer_rows
from c128patch.series.manifest import Series, sha256_file
from c128patch.series.paths import PROVENANCE_PATH, confine, inside
from c128patch.textsafe import shell_join

if TYPE_CHECKING:  # series.plan pulls unidiff; reading a provenance record must not need it
    from c128patch.series.plan import Planned

SCHEMA = 1


def build(series: Series, planned: list[Planned], upstream: dict[str, Any], results: list[dict[str, Any]]) -> dict:
    by_name = {r["name"]: r for r in results}
    entries = []
    for item in planned:
        e, v = item.entry, item.variant
        row: dict[str, Any] = {"name": e.name, "kind": e.kind, "gate": e.gate, "upstream": e.upstream,
                               "upstream_status": e.upstream_status, "sha256": sha256_file(item.path),
                               "files": item.touched}
        row.update({"file": v.file, "variant_base": v.base, "variant_commit": v.commit, "chosen_by": item.chosen_by}
                   if v else {"source": e.source, "target": e.target})
        row.update({key: value for key, value in by_name.get(e.name, {}).items() if key in ("applied", "commit")})
        entries.append(row)
    head = series.ours
    record = {"schema": SCHEMA, "tool": {"name": "c128patch", "version": __version__},
              "series": {"name": head.name, "version": head.version, "digest": head.digest()},
              "upstream": upstream, "entries": entries}
    layers = layer_rows(series)
    if layers:  # each layer with its version and digest; the stack's digest names the whole
        record["layers"] = layers
        record["stack"] = {"digest": series.digest()}
    return record


def applied_digest(record: dict) -> str:
    """The digest of what a record says was applied: the stack's when it has layers, else the series'."""
    stack = record.get("stack")
    if isinstance(stack, dict) and isinstance(stack.get("digest"), str):
        return stack["digest"]
    return str(record.get("series", {}).get("digest", ""))


def applied_layers(record: dict) -> list[str]:
    """The names of the layers a record says were applied, in order."""
    return [str(r.get("name")) for r in record.get("layers", []) if isinstance(r, dict)]


def starts_stack(record: dict, series: Series) -> bool:
    """Does the stack in effect start with the layers ``record`` says were applied (maybe with more on top)?"""
    applied = applied_layers(record)
    return applied == [layer.name for layer in series.layers][:len(applied)]


def dumps(record: dict) -> str:
    return json.dumps(record, indent=2, sort_keys=True) + "\n"


def read_provenance(tree: Path) -> dict:
    """The record in ``tree``; one that is not a c128patch record is a one-line error saying how to restore it."""
    path = tree / PROVENANCE_PATH
    if not path.is_file() and not path.is_symlink():
        raise C128Error(f"no c128patch series is applied in {tree} (no {PROVENANCE_PATH})")
    confine(tree, PROVENANCE_PATH, f"the tree {tree}", regular=True)  # never through a link, a pipe or a device
    size = path.stat().st_size
    data = path.read_bytes() if size <= MAX_JSON else b""
    problem = _problem(data) if size <= MAX_JSON else f"provenance file is {size} bytes (a record is far smaller)"
    if problem:
        committed = _blob(Git(worktree=tree), "HEAD")
        if committed is not None and committed != data and _problem(committed) is None:
            fix = "restore it (" + shell_join(["git", "-C", str(tree), "checkout", "HEAD", "--", PROVENANCE_PATH]) + ")"
        else:
            fix = _restore_from_below(tree)
        raise C128Error(f"{path}: {problem}; {fix}")
    return json.loads(data)


def _restore_from_below(tree: Path) -> str:
    """The way back from a damaged record HEAD commits: the command restoring the newest good one a commit below holds
    (a command that works as printed; "apply the series again (c128patch apply)" failed as printed, helper 164)."""
    git = Git(worktree=tree)
    for sha in git.lines("log", "--format=%H", "-n", "100", "HEAD", "--", PROVENANCE_PATH):
        data = _blob(git, sha)
        if data is not None and _problem(data) is None:
            return (f"HEAD holds the same; commit {sha[:12]} holds a good record: restore it from there ("
                    + shell_join(["git", "-C", str(tree), "checkout", sha, "--", PROVENANCE_PATH]) + ")")
    return ("HEAD holds the same and no commit below it a good record: apply the series again on a new branch "
            "(c128patch apply --sglang-rev REV --branch NAME)")


def committed(git: Git, rev: str) -> dict | None:
    """The record ``rev`` holds (a tree's state: input); None where it holds none or one ``_problem`` refuses."""
    data = _blob(git, rev)
    return json.loads(data) if data is not None and _problem(data) is None else None


def _blob(git: Git, rev: str) -> bytes | None:
    """The record file ``rev`` holds, unless it is bigger than any record (a blob of zeros compresses to nothing)."""
    size = git.run("cat-file", "-s", f"{rev}:{PROVENANCE_PATH}", check=False).stdout.strip()
    return git.blob(rev, PROVENANCE_PATH) if size.isdigit() and int(size) <= MAX_JSON else None


def _problem(data: bytes) -> str | None:
    try:
        record = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return f"provenance file is not valid JSON ({getattr(exc, 'msg', None) or 'not UTF-8'})"
    except RecursionError:
        return "provenance file is nested too deeply to read"
    problem = record_problem(record)
    return f"not a c128patch provenance record ({problem})" if problem else None


def record_problem(record: Any) -> str | None:
    """What makes ``record`` unusable as a provenance record (None: nothing)."""
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not an object"
    for key in ("series", "upstream", "tool"):
        if not isinstance(record.get(key, {}), dict):
            return f"'{key}' is not an object"
        if bad := next((k for k, v in record.get(key, {}).items() if not isinstance(v, str) and v is not None), None):
            return f"'{key}.{bad}' is not a string"
    layers = record.get("layers", [])
    if not isinstance(layers, list) or not all(isinstance(r, dict) and all(isinstance(r.get(k), str) for k in
                                               ("name", "version", "digest")) for r in layers):
        return "'layers' is not a list of layers (name, version, digest)"
    entries = record.get("entries", [])
    if not isinstance(entries, list):
        return "'entries' is not a list"
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or not isinstance(e.get("name"), str) or not isinstance(e.get("kind"), str):
            return f"entry #{i + 1} has no name and kind"
        if not isinstance(e.get("files", []), list) or not all(isinstance(f, str) for f in e.get("files", [])):
            return f"entry '{e['name']}': 'files' is not a list of paths"
        bad = next((f for f in e.get("files", []) if not inside(f)), None)
        if bad is not None:
            return f"entry '{e['name']}': file {bad!r} is not a path inside the tree"
        if e["kind"] == "overlay" and not inside(e.get("target") if isinstance(e.get("target"), str) else ""):
            return f"overlay entry '{e['name']}' has no target inside the tree"
    return None
