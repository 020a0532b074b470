#!/usr/bin/env python3
"""Evidence keys by content: the time to compute one release's key (target <= 0.5 s per release),
beside the plan it is made from and the sources it hashes, in the tool's release history and in a
clone that looks like upstream's (tests/upstream_like.py: other commit ids, folders beside python/),
N runs interleaved, with the keys compared (they must be equal).
  python ci/bench/bench_keys.py [--runs 3] [--out ci/bench/results/keys.json]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from benchlib import append, interleaved, parser, table, target

from c128patch.evidence.keys import key_for, planned_key
from c128patch.git import Git
from c128patch.series.manifest import default_series_root, load_series
from c128patch.series.plan import plan
from c128patch.upstream.releases import DEFAULT_RELEASES, ReleaseHistory, tag_for

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import upstream_like  # noqa: E402  (tests/upstream_like.py)

TARGET_S = 0.5


def main() -> int:
    args = parser("keys").parse_args()
    series = load_series(default_series_root())
    history = Git(git_dir=ReleaseHistory().ensure())
    cases, keys = {}, {}
    with tempfile.TemporaryDirectory(prefix="c128bench-") as tmp:
        like = Git(git_dir=upstream_like.build(history.git_dir, Path(tmp) / "sglang.git"))
        for tag in map(tag_for, DEFAULT_RELEASES):
            for name, git in (("history", history), ("upstream_like", like)):
                commit, planned = git.rev_parse(tag) or "", plan(series, git, git.rev_parse(tag) or "")
                keys[tag, name] = key_for(series, git, commit)
                cases[f"{tag} key ({name})"] = lambda i, g=git, c=commit: key_for(series, g, c)
                cases[f"{tag}   of it: plan ({name})"] = lambda i, g=git, c=commit: plan(series, g, c)
                cases[f"{tag}   sources ({name})"] = lambda i, g=git, c=commit, p=planned: planned_key(g, c, p)
        figures, _ = interleaved(cases, args.runs)
    worst = max(f["wall"]["median"] for name, f in figures.items() if " key (" in name)
    same = {tag: keys[tag, "history"] == keys[tag, "upstream_like"] for tag in map(tag_for, DEFAULT_RELEASES)}
    table(figures)
    print(f"same key in both repositories: {same}")
    record = {"runs": args.runs, "figures": figures, "same_key": same, "worst_key_s": worst,
              "targets": [target("key, worst release (s)", worst, TARGET_S),
                          target("releases whose keys differ", sum(not s for s in same.values()), 0)]}
    return int(append(args.out, record)["missed"])


if __name__ == "__main__":
    raise SystemExit(main())
