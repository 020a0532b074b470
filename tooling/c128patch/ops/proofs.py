"""A tree's proof (``ops.equivalence``) recorded in its git dir (``c128patch/proof.json``) by apply, rebase,
refresh and status, under a key of all it depends on, with the fresh replay's trees where apply or rebase made it (the
next rebase compares the branch's commits with them instead of replaying the series on the old base). A user can forge
it (it is in .git): forged trees can only make a rebase take an edited entry commit for the series' (the edit is not
carried; the recovery ref keeps it); a record whose key differs in any field (another HEAD, series, upstream or tool
version) is never read; one not parsing is a miss."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from c128patch import __version__
from c128patch.git import Git
from c128patch.jsonio import read_json, write_json_atomic
from c128patch.series.manifest import Series, read_series_file
from c128patch.series.paths import symlink_on_path

PROOF = "proof.json"  # in the c128patch state dir (``treestate.c128_state_dir``), beside layers.json
_OBJECT_ID = re.compile(r"[0-9a-f]{40}([0-9a-f]{24})?")
Trees = dict[str, tuple[str, str]]  # entry -> (tree before it, tree after it): ``ops.equivalence.Trees``


def proof_key(git: Git, series: Series, rev: str, commit: str, head: str = "HEAD", tree: str = "") -> dict[str, str]:
    """What a proof of ``head`` (with ``tree``: a commit of that tree) against ``series`` on upstream ``commit``
    depends on: the series by its digest and by what a replay reads beside it (each part's manifest and ledgers)."""
    h = hashlib.sha256()
    for part in (series.ours, *series.layers):
        for path in [part.manifest_path, *sorted((part.patches_dir / "resolutions").rglob("*"))]:
            # what the ledger reads (``Ledger._confined``): no link on the way, at most 64 MiB a file (an 8 GB sparse
            # file there was read whole, out of memory at every apply's proof and status)
            if symlink_on_path(part.root, path) is None and path.is_file():
                h.update(f"\0{path.relative_to(part.root)}\0".encode() + read_series_file(path))
    if not tree:
        head, tree = git.out("rev-parse", head, f"{head}^{{tree}}").split()
    return {"head": head, "tree": tree, "digest": series.digest(), "manifests_and_ledgers": h.hexdigest(),
            "upstream": commit, "rev": rev, "tool": __version__}


def _read(state: Path, key: dict[str, str], part: str) -> object:
    """``part`` of the record in the state dir ``state`` if it is recorded under ``key`` (else None)."""
    data = read_json(state / PROOF, dict) or {}
    return data.get(part) if data.get("key") == key else None


def recorded(state: Path, key: dict[str, str]) -> dict | None:
    """The proof recorded under ``key`` in the state dir ``state`` (None: none, another key's, or unreadable)."""
    proof = _read(state, key, "equivalence")
    ok = isinstance(proof, dict) and isinstance(proof.get("identical"), bool) and isinstance(proof.get("summary"), str)
    return proof if ok else None  # type: ignore[return-value]


def recorded_trees(state: Path, key: dict[str, str]) -> Trees | None:
    """The fresh replay's trees recorded with the proof under ``key`` (a rebase compares the branch with them)."""
    trees = _read(state, key, "trees")
    ok = isinstance(trees, dict) and all(isinstance(v, list) and len(v) == 2 and all(  # object ids, never options
        isinstance(t, str) and _OBJECT_ID.fullmatch(t) for t in v) for v in trees.values())
    return {name: (v[0], v[1]) for name, v in trees.items()} if ok else None  # type: ignore[union-attr]


def record(state: Path, key: dict[str, str], equivalence: dict, trees: Trees | None = None) -> None:
    """Record a proof (``trees``: its fresh replay's); where it cannot be written (a read-only .git) the next status
    proves again."""
    try:
        extra = {"trees": trees} if trees else {}
        write_json_atomic(state / PROOF, {"key": key, "equivalence": equivalence, **extra}, sync=False)
    except OSError:
        pass
