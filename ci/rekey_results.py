#!/usr/bin/env python3
"""Re-key committed results by content: every result under ci/gpu/results whose key names the
whole upstream tree (``upstream_tree``, the old style) gets the content key of the same sources
(evidence.keys), nothing re-run: the sources and the series files are the same bytes.

    python ci/rekey_results.py [--results DIR] [--check]

The old tree id is looked up in the release history (every release tag, and the commits kept
under refs/c128patch/superseded/); the keyed paths are those of the series' plan on that
commit. The series hash stays as recorded (it is over the files that were applied). A result
whose series hash is not the plan's now (a "before" record) is keyed with the paths of the plan
now and says so (``rekeyed_from.paths``); it stays stale either way. Idempotent: a result keyed
by content already is left alone. --check: exit 1 if any result would change.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tooling"))

from c128patch.errors import C128Error  # noqa: E402
from c128patch.evidence.keys import is_old_style, key_of, planned_hash, source_files, source_paths  # noqa: E402
from c128patch.git import Git  # noqa: E402
from c128patch.series.manifest import Series, load_series  # noqa: E402
from c128patch.series.plan import plan  # noqa: E402
from c128patch.upstream.releases import SUPERSEDED_PREFIX, ReleaseHistory  # noqa: E402


def release_trees(git: Git) -> dict[str, str]:
    """Tree id -> commit, for every release commit the history holds (tags first)."""
    out: dict[str, str] = {}
    refs = git.out("for-each-ref", "--format=%(objectname) %(refname)", "refs/tags", SUPERSEDED_PREFIX)
    for line in refs.splitlines():
        ref = line.split()[1]
        commit = git.rev_parse(ref)
        tree = git.run("rev-parse", "--verify", "--quiet", f"{ref}^{{tree}}", check=False).stdout.strip()
        if commit and tree:
            out.setdefault(tree, commit)
    return out


def new_key(series: Series, git: Git, commit: str, old: dict[str, Any]) -> tuple[dict[str, Any], str]:
    planned = plan(series, git, commit)
    exact = planned_hash(planned) == old["series_hash"]
    files = source_files(git, commit, source_paths(p for item in planned for p in item.touched))
    return key_of(files, str(old["series_hash"])).to_json(), "the plan's" if exact else "the series' plan now"


def rekey(root: Path, series: Series, git: Git, write: bool = True) -> tuple[list[Path], list[str]]:
    """(files re-keyed (or to be), problems)."""
    trees = release_trees(git)
    changed, problems = [], []
    for path in sorted(root.rglob("*.json")):
        text = path.read_text()
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            continue
        if not isinstance(data, dict) or not is_old_style(data.get("key")):
            continue
        old = data["key"]
        commit = trees.get(str(old["upstream_tree"]))
        if commit is None or not old.get("series_hash"):
            problems.append(f"{path.relative_to(root)}: upstream tree {str(old['upstream_tree'])[:12]} is no release "
                            "commit of the history: not re-keyed")
            continue
        key, paths = new_key(series, git, commit, old)
        data["key"] = key
        data["rekeyed_from"] = {"upstream_tree": old["upstream_tree"], "commit": commit, "paths": paths}
        changed.append(path)
        if write:
            indent = len(text.split("\n", 2)[1]) - len(text.split("\n", 2)[1].lstrip(" ")) or 2
            path.write_text(json.dumps(data, indent=indent, sort_keys=True) + "\n")
    return changed, problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=REPO / "ci" / "gpu" / "results")
    ap.add_argument("--check", action="store_true", help="exit 1 if a result would be re-keyed")
    args = ap.parse_args()
    try:
        history = ReleaseHistory()
        history.ensure()
        changed, problems = rekey(args.results, load_series(REPO), history.git, write=not args.check)
    except C128Error as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    for line in problems:
        print(f"warning: {line}", file=sys.stderr)
    verb = "would re-key" if args.check else "re-keyed"
    print(f"{verb} {len(changed)} result(s)" + "".join(f"\n  {p.relative_to(args.results)}" for p in changed))
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
