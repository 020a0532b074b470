#!/usr/bin/env python3
"""Stage what an H200 run needs under .gpu/ (git-ignored; name it in the device tool's `carry`):

  .gpu/patched/sglang   kernel-tier subset of the upstream release + the series (tests/gpu/tree_subset.py)
  .gpu/upstream/sglang  the same subset of the unpatched release (differential checks)
  .gpu/whl/*.whl        apache-tvm-ffi and msgspec wheels for the GPU machine's Python 3.12

  python ci/gpu/prepare.py [--rev v0.5.23] [--dest .gpu]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "gpu")]

import tree_subset  # noqa: E402
from c128patch.upstream.releases import ReleaseHistory  # noqa: E402
from support import patched_tree, release_tree  # noqa: E402

WHEELS = ("apache-tvm-ffi==0.1.11", "msgspec==0.23.0")
PLATFORM_ARGS = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
                 *[a for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
                   for a in ("--platform", p)]]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rev", default="v0.5.23")
    ap.add_argument("--dest", type=Path, default=REPO / ".gpu")
    args = ap.parse_args()
    repo = ReleaseHistory().ensure()
    shutil.rmtree(args.dest / "patched", ignore_errors=True)
    shutil.rmtree(args.dest / "upstream", ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tree_subset.copy_subset(patched_tree(REPO, repo, args.rev, tmp / "p"), args.dest / "patched")
        tree_subset.copy_subset(release_tree(repo, args.rev, tmp / "u"), args.dest / "upstream")
    whl = args.dest / "whl"
    whl.mkdir(parents=True, exist_ok=True)
    for spec in WHEELS:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", *PLATFORM_ARGS, "-d", str(whl), spec],
                       check=True)
    size = sum(p.stat().st_size for p in args.dest.rglob("*") if p.is_file())
    print(f"{args.dest}: {size / 1e6:.1f} MB ({args.rev} patched + upstream subsets, {len(list(whl.glob('*.whl')))} wheels)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
