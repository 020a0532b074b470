#!/usr/bin/env python3
"""How the cost grows, beside raw git's, N runs interleaved, the per-unit cost fitted by least squares:
`check` over 1/4/16/64 revs and `rebase` of the patched v0.5.23 branch onto 1/10/50/200 upstream commits
(synthetic, on top of v0.5.23, alternately touching a file the series patches, away from its hunks, and
one it does not), and `apply` with a layer of 1/10/50 entries (raw: git am of the same patches).
Targets (issue 35): check's per-rev cost from 16 to 64 revs within 1.2x of that from 1 to 4 and at
most raw's (CPU); rebase per upstream commit <= 3x raw's (CPU); a layer entry <= 25 ms CPU.
Raw rebase, twice: ``git rebase syn-K`` as a user types it (``raw plain rebase``: it also skips our commits that
upstream already has, by patch-id over the range, as ours looks for entries upstream holds: the per-commit
target's comparator), and ``git rebase --onto syn-K v0.5.23`` (``raw rebase``: no upstream detection, so no cost
per upstream commit; kept beside it, as recorded before 2026-12-05 evening).
  python ci/bench/bench_growth.py [--runs 3] [--out ci/bench/results/growth.json]
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace

from bench_apply import raw_git
from bench_check import ours_check, raw_check
from benchlib import append, c128patch, interleaved, mirror, parser, ratio, slope, table, target
from unidiff import PatchSet

from c128patch.git import Git
from c128patch.series.manifest import default_series_root, load_series
from c128patch.series.plan import plan

REVS, COMMITS, ENTRIES = (1, 4, 16, 64), (1, 10, 50, 200), (1, 10, 50)


def synthetic(repo: Path, items: list, n: int) -> list[str]:
    """``n`` commits on top of v0.5.23 (one fast-import), tagged syn-1..syn-n; their ids."""
    git = Git(git_dir=repo)
    ends = {}  # a patched file -> the last line its hunks reach
    for item in items:
        for f in PatchSet(item.path.read_text()) if item.patch else ():
            ends[f.path] = max(h.source_start + h.source_length for h in f)
    files = git.out("ls-tree", "-r", "--name-only", "v0.5.23", "python/sglang/srt/layers").split()
    touched = [p for p, end in ends.items() if git.blob("v0.5.23", p).count(b"\n") > end + 10]
    others = [p for p in files if p.endswith(".py") and p not in ends][:len(touched)]
    text = {p: git.blob("v0.5.23", p) for p in touched + others}
    stream = []
    for i in range(1, n + 1):
        pool = (touched, others)[i % 2]
        path = pool[i // 2 % len(pool)]
        text[path] += f"# synthetic upstream commit {i}\n".encode()
        msg = f"synthetic {i}\n".encode()
        parent = b":%d" % (i - 1) if i > 1 else git.rev_parse("v0.5.23").encode()
        stream += [b"commit refs/heads/synthetic", b"mark :%d" % i, b"committer b <b@b> %d +0000" % (1e9 + i),
                   b"data %d" % len(msg), msg, b"from " + parent,
                   b"M 100644 inline " + path.encode(), b"data %d" % len(text[path]), text[path],
                   b"reset refs/tags/syn-%d" % i, b"from :%d" % i, b""]
    git.run("fast-import", "--quiet", input=b"\n".join(stream), binary=True)
    return [git.rev_parse(f"syn-{i}") for i in range(1, n + 1)]


def layer(folder: Path, n: int) -> Path:
    """A layer of ``n`` entries, each a patch adding one small module."""
    entries = []
    for i in range(n):
        body = f"VALUE = {i}\n".encode()
        blob = hashlib.sha1(b"blob %d\0" % len(body) + body).hexdigest()
        path = f"python/sglang/bench_layer/mod_{i}.py"
        patch = folder / "patches" / f"{i + 1:04d}-bench-{i}.patch"
        patch.parent.mkdir(parents=True, exist_ok=True)
        patch.write_text(f"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\nFrom: b <b@b>\n"
                         f"Date: Thu, 1 Jan 1970 00:00:00 +0000\nSubject: [PATCH] bench {i}\n\nC128patch-Entry: "
                         f"bench/bench-{i}\n\ndiff --git a/{path} b/{path}\nnew file mode 100644\nindex "
                         f"0000000000000000000000000000000000000000..{blob}\n--- /dev/null\n+++ b/{path}\n"
                         f"@@ -0,0 +1 @@\n+VALUE = {i}\n")
        entries.append(f'[[entries]]\nname = "bench-{i}"\nkind = "patch"\nfile = "{patch.name}"\nwhy = "bench"\n'
                       f'base = "v0.5.23"\nsha256 = "{hashlib.sha256(patch.read_bytes()).hexdigest()}"\n\n'
                       f'[entries.base_sources]\n"{path}" = "absent"\n')
    (folder / "patches" / "series.toml").write_text('[series]\nname = "bench"\nversion = "1"\nbase = "v0.5.23"\n\n'
                                                    + "\n".join(entries))
    return folder


def fitted(figures: dict, names: dict[int, str], on: str = "cpu") -> float:
    return slope(list(names), [figures[name][on]["median"] for name in names.values()])


def grown(series, repo: Path, work: Path, runs: int) -> dict:
    """figures of check, rebase and the layer at each size, interleaved."""
    git = Git(git_dir=repo)
    commits = synthetic(repo, plan(series, git, git.rev_parse("v0.5.23")), max(COMMITS))
    plans = {c: plan(series, git, c) for c in commits[:max(REVS)]}
    template = work / "template"
    c128patch("apply", "--sglang-rev", "v0.5.23", "--repo", str(repo), "--tree", str(template), "--series",
              str(series.root))
    layers, trees = {k: layer(work / f"layer{k}", k) for k in ENTRIES}, work / "trees"
    series_items = plan(series, git, git.rev_parse("v0.5.23"))
    cases = {}
    for k in REVS:
        revs = {f"syn-{i + 1}": c for i, c in enumerate(commits[:k])}
        cases[f"raw check, {k} revs"] = lambda i, r=revs: raw_check(git, {c: plans[c] for c in r.values()})
        cases[f"check, {k} revs"] = lambda i, r=revs: ours_check(series, git, r)
    for k in COMMITS:
        cases[f"raw rebase, {k} commits"] = lambda i, k=k: Git(worktree=trees / f"raw{k}").run(
            "rebase", "--onto", f"syn-{k}", "v0.5.23")
        cases[f"raw plain rebase, {k} commits"] = lambda i, k=k: Git(worktree=trees / f"plain{k}").run(
            "rebase", f"syn-{k}")
        cases[f"rebase, {k} commits"] = lambda i, k=k: c128patch(
            "rebase", "--onto", f"syn-{k}", "--tree", str(trees / f"ours{k}"), "--series", str(series.root))
    for k, folder in layers.items():
        patches = [SimpleNamespace(path=p, patch=True) for p in sorted(folder.glob("patches/*.patch"))]
        cases[f"raw apply, layer of {k}"] = lambda i, k=k, p=patches: raw_git(repo, trees / f"rawl{k}",
                                                                               series_items + p)
        cases[f"apply, layer of {k}"] = lambda i, k=k, f=folder: c128patch(
            "apply", "--sglang-rev", "v0.5.23", "--repo", str(repo), "--tree", str(trees / f"l{k}"), "--series",
            str(series.root), "--layer", str(f))

    def prepare(i: int) -> None:  # fresh (hard-linked: git replaces files, never edits them) copies to rebase
        shutil.rmtree(trees, ignore_errors=True)
        Git(git_dir=repo).run("worktree", "prune")
        for k in COMMITS:
            for side in ("raw", "plain", "ours"):
                shutil.copytree(template, trees / f"{side}{k}", symlinks=True, copy_function=os.link)

    return interleaved(cases, runs, prepare)[0]


def targets(per_unit: dict, low: float, high: float) -> list[dict]:
    """Issue 35's; ours against a multiple of raw's as a difference (raw's fitted slope can be ~0 or below)."""
    ours, raw = ({what: sides[side]["cpu"] for what, sides in per_unit.items()} for side in ("", "raw "))
    plain = per_unit["rebase"]["raw plain "]["cpu"]
    return [target("check per rev, 16-64 / 1-16 (CPU)", high / low, 1.2, "cpu"),
            target("check per rev, ours - raw's (s)", ours["check"] - raw["check"], 0.0, "cpu"),
            target("rebase per commit, ours - 3x raw plain `git rebase syn-K`'s (ms)",
                   (ours["rebase"] - 3 * plain) * 1e3, 0.0, "cpu"),  # (ms: in s, a 0.2 ms miss read "0 > 0")
            target("apply per layer entry (s)", ours["apply"], 0.025, "cpu")]


def main() -> int:
    args = parser("growth").parse_args()
    series = load_series(default_series_root())
    work = Path(tempfile.mkdtemp(prefix="bench-growth-"))
    try:
        figures = grown(series, mirror(work), work, args.runs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    table(figures)
    per_unit = {what: {side: {on: fitted(figures, {k: f"{side}{what}, {k} {unit}" for k in sizes}, on)
                              for on in ("wall", "cpu")} for side in ("", "raw ")}
                for what, unit, sizes in (("check", "revs", REVS), ("rebase", "commits", COMMITS))}
    per_unit["rebase"]["raw plain "] = {on: fitted(figures, {k: f"raw plain rebase, {k} commits" for k in COMMITS},
                                                   on) for on in ("wall", "cpu")}
    per_unit["apply"] = {side: {on: fitted(figures, {k: f"{side}apply, layer of {k}" for k in ENTRIES}, on)
                                for on in ("wall", "cpu")} for side in ("", "raw ")}
    low = fitted(figures, {k: f"check, {k} revs" for k in REVS[:3]})
    high = fitted(figures, {k: f"check, {k} revs" for k in REVS[2:]})
    for what, sides in per_unit.items():
        print(f"{what} per unit: ours {sides['']['cpu'] * 1e3:.1f} ms CPU, raw {sides['raw ']['cpu'] * 1e3:.1f} ms")
    sized = [f"{what}, {k} {unit}" for what, unit, sizes in (("check", "revs", REVS), ("rebase", "commits", COMMITS))
             for k in sizes] + [f"apply, layer of {k}" for k in ENTRIES]
    record = {"runs": args.runs, "figures": figures, "per_unit_s": per_unit,
              "ratios": {**{f"{name} / raw": ratio(figures, name, f"raw {name}") for name in sized},
                         **{f"rebase, {k} commits / raw plain": ratio(figures, f"rebase, {k} commits",
                                                                      f"raw plain rebase, {k} commits")
                            for k in COMMITS}},
              "check_per_rev_cpu_s": {"1-16": low, "16-64": high}, "targets": targets(per_unit, low, high)}
    return int(append(args.out, record, revs=("v0.5.23",))["missed"])


if __name__ == "__main__":
    raise SystemExit(main())
