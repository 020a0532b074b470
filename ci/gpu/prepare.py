#!/usr/bin/env python3
"""Stage everything the GPU evidence run needs under .gpu/ (git-ignored; the device `carry` is [".gpu"]):

  .gpu/stage.json                  what was staged: revs, commits, evidence keys (c128patch.evidence.staging)
  .gpu/<rev>/patched/sglang        the suite's kernel-tier subset of <rev> + the series, with provenance
  .gpu/<rev>/upstream/sglang       the same subset of <rev> as released (the differential pass)
  .gpu/<rev>/before/sglang         with --before COMMIT: <rev> + the series as committed at COMMIT
  .gpu/whl/*.whl                   apache-tvm-ffi and msgspec wheels for the GPU machine's Python 3.12

  python ci/gpu/prepare.py [--rev vX.Y.Z ...] [--before COMMIT [--before-rev v0.5.20]] [--dest .gpu] [--no-wheels]

Default: every supported release. Then on the device: python3 ci/gpu/h200_run.py plain|sanitizers.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tooling"))

from c128patch.evidence.staging import export_series, stage  # noqa: E402
from c128patch.git import Git  # noqa: E402
from c128patch.series.manifest import load_series  # noqa: E402
from c128patch.upstream.releases import DEFAULT_RELEASES, ReleaseHistory, release_version, tag_for  # noqa: E402

# the kernels' JIT (tvm-ffi), upstream's imports (msgspec), and the tool's own pure-Python needs
# the GPU machine lacks (series.plan reads patch files with unidiff; the ledger writes TOML)
WHEELS = ("apache-tvm-ffi==0.1.11", "msgspec==0.23.0", "unidiff==0.7.5", "tomli-w==1.2.0")
PLATFORM_ARGS = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
                 *[a for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
                   for a in ("--platform", p)]]
CARRY_LIMIT = 64 * 1024 * 1024


def fetch_wheels(whl: Path) -> None:
    whl.mkdir(parents=True, exist_ok=True)
    for spec in WHEELS:
        name = spec.split("==")[0].replace("-", "_")
        if any(whl.glob(f"{name}-{spec.split('==')[1]}-*.whl")):
            continue
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", *PLATFORM_ARGS,
                        "-d", str(whl), spec], check=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", action="append", default=[], help="release to stage (repeatable; default: all supported)")
    ap.add_argument("--before", default="", help="a commit of this repository: stage --before-rev with its series too")
    ap.add_argument("--before-rev", action="append", default=[],
                    help="release(s) for the before tree (default v0.5.20)")
    ap.add_argument("--dest", type=Path, default=REPO / ".gpu")
    ap.add_argument("--no-wheels", action="store_true", help="do not fetch the wheels (CPU dry runs)")
    args = ap.parse_args()

    revs = args.rev or [tag_for(v) for v in DEFAULT_RELEASES]
    before_revs = tuple(args.before_rev or (["v0.5.20"] if args.before else []))
    versions = [release_version(r) for r in (*revs, *before_revs)]
    if None in versions:
        raise SystemExit(f"not release tags: {[r for r in (*revs, *before_revs) if release_version(r) is None]}")
    if set(before_revs) - set(revs):
        raise SystemExit(f"--before-rev {sorted(set(before_revs) - set(revs))} must also be staged (--rev)")
    history = ReleaseHistory()
    history.ensure([v for v in versions if v])
    series = load_series(REPO)
    with tempfile.TemporaryDirectory(prefix="c128-before-") as tmp:
        before = export_series(Git(worktree=REPO), args.before, Path(tmp)) if args.before else None
        for old in [p for p in args.dest.glob("v*") if p.is_dir()]:
            shutil.rmtree(old)
        manifest = stage(series, history.git, revs, args.dest, REPO / "tests" / "gpu", before=before,
                         before_revs=before_revs, before_from=Git(worktree=REPO).rev_parse(args.before) or "")
    if not args.no_wheels:
        fetch_wheels(args.dest / "whl")
    size = sum(p.stat().st_size for p in args.dest.rglob("*") if p.is_file())
    for rel in manifest["releases"]:
        keys = ", ".join(f"{label} {t['key']['series_hash'][:10]}" for label, t in rel["trees"].items() if "key" in t)
        print(f"{rel['rev']}: {', '.join(rel['trees'])} ({keys})")
    print(f"{args.dest}: {size / 1e6:.1f} MB to carry (limit {CARRY_LIMIT / 1e6:.0f} MB with the repository)")
    if size > CARRY_LIMIT // 2:
        raise SystemExit(f"{args.dest} is {size / 1e6:.1f} MB: over half of what a device call carries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
