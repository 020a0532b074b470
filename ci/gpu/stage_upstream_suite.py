#!/usr/bin/env python3
"""Stage `smoke upstream` for the H200 (ci/gpu/upstream_suite_run.sh), one folder per release,
in a git-ignored folder of its own (default .gpu-upstream/, apart from ci/gpu/prepare.py's .gpu/):

  .gpu-upstream/<rev>/patched          the release + the series (c128patch apply): what the tests import
  .gpu-upstream/<rev>/upstream         the same files of the unpatched release
  .gpu-upstream/<rev>/upstream-tests   the selected upstream test files (never committed here)
  .gpu-upstream/whl/*.whl              apache-tvm-ffi and msgspec for the GPU machine's Python 3.12
  .gpu-upstream/STAGE.json             what was staged: releases, files and bytes, where the tests come from

  python ci/gpu/stage_upstream_suite.py --tests PATH [--rev v0.5.23 ...] [--dest .gpu-upstream] [--no-wheels]

PATH: the test/ folder of an sglang checkout (or a folder laid out like one). Each release is
applied with the real `c128patch apply` and staged with the real `c128patch smoke upstream --stage`.
The destination must be git-ignored (it holds upstream's files): say so in .git/info/exclude.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from prepare import PLATFORM_ARGS, WHEELS  # ci/gpu/prepare.py: the same wheels as the kernel tier's stage

REPO = Path(__file__).resolve().parents[2]
RELEASES = ("v0.5.20", "v0.5.21", "v0.5.22", "v0.5.23")
MANIFEST = "STAGE.json"


def c128patch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "c128patch", *args], capture_output=True, text=True)


def ignored(folder: Path) -> bool:
    """git ignores what ``folder`` will hold (asked for a file in it: it may not exist yet)."""
    return subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", str(folder / MANIFEST)]).returncode == 0


def stage_release(rev: str, tests: Path, dest: Path) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "sglang"
        for step in (("apply", "--sglang-rev", rev, "--tree", str(tree)),
                     ("smoke", "upstream", "--tree", str(tree), "--tests", str(tests),
                      "--stage", str(dest), "--json")):
            proc = c128patch(*step)
            if proc.returncode != 0:
                raise SystemExit(f"{rev}: c128patch {step[0]} failed:\n{proc.stderr or proc.stdout}")
    out = json.loads(proc.stdout)
    staged = {k: {"files": v["files"], "bytes": v["bytes"]} for k, v in out["staged"].items()}
    return {"rev": rev, "staged": staged, "selected": [s["file"] for s in out["selection"]["selected"]]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tests", type=Path, required=True)
    ap.add_argument("--rev", action="append", choices=RELEASES)
    ap.add_argument("--dest", type=Path, default=REPO / ".gpu-upstream")
    ap.add_argument("--no-wheels", action="store_true", help="skip the wheels (a dry run on this machine needs none)")
    args = ap.parse_args()
    dest = args.dest.resolve()
    if dest.is_relative_to(REPO) and not ignored(dest):
        print(f"{dest} is not git-ignored: it would hold upstream's files. Add it first: "
              f"echo /{dest.relative_to(REPO)}/ >> \"$(git rev-parse --git-common-dir)/info/exclude\"", file=sys.stderr)
        return 2
    if dest.exists():
        shutil.rmtree(dest)  # a stage is made whole each time: no release left over from an earlier one
    releases = []
    for rev in args.rev or RELEASES:
        rel = stage_release(rev, args.tests, dest / rev)
        size = sum(v["bytes"] for v in rel["staged"].values())
        print(f"{rev}: " + ", ".join(f"{k} {v['files']} files" for k, v in rel["staged"].items())
              + f", {size / 1e6:.1f} MB; {len(rel['selected'])} test files selected")
        releases.append(rel)
    if not args.no_wheels:
        for spec in WHEELS:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", *PLATFORM_ARGS,
                            "-d", str(dest / "whl"), spec], check=True)
    sources = args.tests.resolve() / "SOURCES.json"
    manifest = {"releases": releases, "wheels": sorted(p.name for p in (dest / "whl").glob("*.whl")),
                "tests_sources": json.loads(sources.read_text()) if sources.is_file() else None}
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    total = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    print(f"{dest}: {total / 1e6:.1f} MB ({total / 2**20:.1f} MiB) to carry")
    return 0


if __name__ == "__main__":
    sys.exit(main())
