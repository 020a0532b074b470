#!/usr/bin/env python3
"""Run `c128patch watch --onto REV --json` with no other options (the tier in the environment watch builds itself
from REV's requirements, issue 38's must-show) for each REV and append what it said to
ci/watch/results/releases.json: the command, when and where, the verdict and exit code, the environment (key, lock,
built now or cached, what was kept without its ops or stood in for), per gate state the modules imported of those the
series adds or changes and the scenarios passed. Every path in it is repo-relative (the cache's is dropped).
  python ci/watch/record.py v0.5.21 v0.5.22 v0.5.23 [--out ci/watch/results/releases.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "ci" / "watch" / "results" / "releases.json"


def record(rev: str) -> dict:
    command = ["c128patch", "watch", "--onto", rev, "--json"]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as here:  # watch's report folder (./c128patch-watch) lands there, not in ROOT
        proc = subprocess.run([sys.executable, "-m", "c128patch", *command[1:]], capture_output=True, text=True,
                              cwd=here)
    wall = round(time.perf_counter() - started, 1)
    report = json.loads(proc.stdout)
    tier = report["behaviour"]
    env = tier.get("env") or {}
    gates = {t["gates"]: t for t in tier.get("json", {}).get("tiers", [])}
    now = datetime.datetime.now(datetime.timezone.utc)
    return {
        "command": " ".join(command), "date": now.date().isoformat(), "time": now.isoformat(timespec="seconds"),
        "commit": subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                                 cwd=ROOT).stdout.strip(),
        "device": f"{platform.machine()} {platform.python_version()}, {os.cpu_count()} cores",
        "load": [round(x, 2) for x in os.getloadavg()], "wall_s": wall,
        "onto": report["onto"], "outcome": report["outcome"], "exit_code": proc.returncode,
        "headline": report["headline"], "unchecked": report["unchecked"], "tier": tier["verdict"],
        "env": {"key": env.get("key"), "lock": env.get("lock"), "built_now": env.get("built"),
                "without_ops": sorted(env.get("defined", {})), "stood_in": sorted(env.get("untried", {})),
                "dropped": len(env.get("dropped", []))},
        "gates": {state: {"imported": sorted(n for n, m in t["modules"].items() if m["status"] == "ok"),
                          "modules": len(t["modules"]),
                          "with_stand_ins": {n: m["stand_ins"] for n, m in t["modules"].items() if m["stand_ins"]},
                          "scenarios_passed": sorted(n for n, s in t["scenarios"].items() if s["status"] == "passed"),
                          "scenarios": len(t["scenarios"])} for state, t in gates.items()},
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("revs", nargs="+")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    out = Path(args.out)
    history = json.loads(out.read_text())["history"] if out.is_file() else []
    for rev in args.revs:
        history.append(record(rev))
        run = history[-1]
        print(f"{run['command']}: {run['outcome']} (exit {run['exit_code']}), "
              + "; ".join(f"gates {s}: {len(g['imported'])}/{g['modules']} modules imported, "
                          f"{len(g['scenarios_passed'])}/{g['scenarios']} scenarios passed"
                          for s, g in run["gates"].items()))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"history": history}, indent=1) + "\n")
    return 0 if all(r["exit_code"] == 0 for r in history[-len(args.revs):]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
