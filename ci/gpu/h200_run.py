#!/usr/bin/env python3
"""One device call of the GPU evidence run (see gpu_run.py beside it for the phases).

    python3 ci/gpu/h200_run.py plain|sanitizers|bench [--stage .gpu] [--deadline 540] [--rev vX.Y.Z ...]
                               [--tool memcheck ...] [--dry-run]

Installs the wheels staged in .gpu/whl (no network there), runs the phase's jobs on the one
GPU (plain: the `c128patch smoke kernel` jobs in parallel; sanitizers: one tool and one
release at a time, tool by tool; bench: the kernel benchmark, one release at a time), stops
what is left at the deadline (seconds from start; the reports keep what finished, jobs not
started are listed as such), and writes $OUT/<phase>.tgz, $OUT/<phase>-run.json,
$OUT/<phase>-summary.txt.
--dry-run adds --collect-only to every smoke job and --dry-run to the benchmark (no GPU needed: checks the
stage, the jobs, the imports and calls the benchmark resolves per release, and the bundle).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tooling"))

# c128patch is imported in main(), after the staged wheels are installed: the GPU machine has no
# network and lacks some of the tool's dependencies (unidiff)


def install_wheels(whl: Path, site: Path) -> str | None:
    wheels = sorted(whl.glob("*.whl"))
    if not wheels:
        return None
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--upgrade", "--target", str(site), *map(str, wheels)], check=True)
    return str(site)


def device_line() -> str:
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        smi = "no nvidia-smi"
    return smi or "no GPU"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("phase", choices=("plain", "sanitizers", "bench"))
    ap.add_argument("--stage", default=".gpu", help="the staged folder, relative to the repository (default .gpu)")
    ap.add_argument("--deadline", type=float, default=540.0, help="seconds from start before jobs are stopped")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/c128-out")))
    ap.add_argument("--work", type=Path, default=Path("/tmp/c128-evidence"), help="job outputs before bundling")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads per job (default: cores / jobs)")
    ap.add_argument("--dry-run", action="store_true", help="collect only (no GPU needed)")
    ap.add_argument("--rev", action="append", default=[], help="only these staged releases (repeatable; a retry)")
    ap.add_argument("--tool", action="append", default=[], help="sanitizers: only these tools, in this order")
    args = ap.parse_args()

    start = time.monotonic()
    os.chdir(REPO)
    # the wheels are for the GPU machine's Python 3.12; a dry run uses this machine's packages
    site = None if args.dry_run else install_wheels(REPO / args.stage / "whl", args.work / "site")
    if site:
        sys.path.insert(0, site)
    import gpu_run  # beside this script

    from c128patch.evidence.staging import read_manifest

    manifest = read_manifest(REPO / args.stage)
    results = args.work / args.phase
    shutil.rmtree(results, ignore_errors=True)  # a warm machine keeps the last call's files
    tools = tuple(args.tool) or gpu_run.SANITIZER_TOOLS
    jobs = [job for job in gpu_run.plan_jobs(manifest, args.stage, args.phase, str(results), tools=tools)
            if not args.rev or job.rev in args.rev]
    if not jobs:
        raise SystemExit(f"no jobs: --rev {args.rev} names no staged release")
    if args.dry_run:
        for job in jobs:
            job.args = [*job.args, "--dry-run" if job.script else "--collect-only"]
    sequential = args.phase in gpu_run.SEQUENTIAL
    threads = args.threads or max(1, (os.cpu_count() or 1) // (1 if sequential else max(1, len(jobs))))
    env = gpu_run.job_env(dict(os.environ), str(REPO / "tooling"), site, threads)
    for job in jobs:
        (results / job.name).mkdir(parents=True, exist_ok=True)
    gpu_run.run_jobs(jobs, sys.executable, env, results / "logs", start + args.deadline, REPO,
                     parallel=1 if sequential else 0)
    lines = [f"phase {args.phase}: {len(jobs)} jobs, {time.monotonic() - start:.0f} s, device: {device_line()}"]
    lines += [gpu_run.job_summary(job, results) for job in jobs]
    summary = "\n".join(lines) + "\n"
    print(summary, end="")
    run = {"phase": args.phase, "repo_root": str(REPO), "results_root": str(results), "stage": args.stage,
           "dry_run": args.dry_run, "device": device_line(), "threads_per_job": threads,
           "seconds": round(time.monotonic() - start, 1), "manifest": manifest,
           "jobs": [job.to_json() for job in jobs]}
    for path in gpu_run.bundle(args.phase, results, args.out, run, summary):
        print(f"{path} ({path.stat().st_size / 1e6:.2f} MB)")
    return 0 if all(job.rc == 0 for job in jobs) else 1  # a job not started (rc None) fails the call too


if __name__ == "__main__":
    sys.exit(main())
