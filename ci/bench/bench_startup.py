#!/usr/bin/env python3
"""CLI start-up: CPU time (user + sys of the child) of `c128patch --help` and of verbs' `--help` (click's
own help; the verbs listed from cli/__init__.py's table, none imported), beside `python -c pass` and
`import click` in the same run (N runs, interleaved, at least 11); the target, <= 0.12 s median, is
`c128patch --help`'s (exit 1 over it), the verbs' figures are shown beside it.
With --before DIR (a `tooling/` folder of an older commit: `git archive REV tooling | tar -x -C DIR`)
the same commands run from there too, side by side.

  python ci/bench/bench_startup.py [--runs 11] [--before DIR] [--out ci/bench/results/startup.json]
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

from benchlib import append, interleaved, parser, target

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

TARGET_S = 0.12
# the console script pip installs beside this Python (else `-m c128patch`, which adds runpy's cost)
SCRIPT = Path(sys.executable).with_name("c128patch")
CLI = [str(SCRIPT)] if SCRIPT.is_file() else ["-m", "c128patch"]
ENTRY = tuple(tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
              ["project"]["scripts"]["c128patch"].split(":"))
CASES = {
    "python -c pass": ["-c", "pass"],
    "python -c 'import click'": ["-c", "import click"],  # the floor of any `--help`
    "c128patch --help": [*CLI, "--help"],
    "c128patch apply --help": [*CLI, "apply", "--help"],
    "c128patch check --help": [*CLI, "check", "--help"],
    "c128patch smoke --help": [*CLI, "smoke", "--help"],
    "c128patch watch --help": [*CLI, "watch", "--help"],
}


def child(args: list[str], pythonpath: str | None = None) -> None:
    env = {**os.environ, "PYTHONPATH": pythonpath} if pythonpath else None
    subprocess.run([sys.executable, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env=env)


def main() -> int:
    ap = parser("startup", runs=11)
    ap.add_argument("--before", type=Path, default=None, help="a tooling/ folder to compare with")
    args = ap.parse_args()
    if args.runs < 11:
        ap.error("--runs: at least 11")
    if SCRIPT.is_file() and f"from {ENTRY[0]} import {ENTRY[1]}" not in SCRIPT.read_text():
        ap.error(f"{SCRIPT} does not run {':'.join(ENTRY)} (pyproject.toml's entry point): pip install -e . again")
    runs = {name: (case, None) for name, case in CASES.items()}
    if args.before:
        runs.update({f"before: {name}": (case, str(args.before.resolve()))
                     for name, case in CASES.items() if name.startswith("c128patch")})
    for case, path in runs.values():  # warm the bytecode and file caches
        child(case, path)
    figures, _ = interleaved({name: lambda i, c=c, p=p: child(c, p) for name, (c, p) in runs.items()}, args.runs,
                             children_only=True)
    base = figures["python -c pass"]["cpu"]["median"]
    rows = {name: {"median_cpu_s": f["cpu"]["median"], "min_cpu_s": f["cpu"]["min"], "max_cpu_s": f["cpu"]["max"],
                   "x_python": round(f["cpu"]["median"] / base, 2), "within_target": f["cpu"]["median"] <= TARGET_S}
            for name, f in figures.items()}
    print(f"{'command':36} {'median CPU s':>12} {'min':>7} {'max':>7} {'x python -c pass':>17}")
    for name, r in rows.items():
        print(f"{name:36} {r['median_cpu_s']:12.3f} {r['min_cpu_s']:7.3f} {r['max_cpu_s']:7.3f} {r['x_python']:17.2f}")
    record = {"runs": args.runs, "figures": figures, "target_cpu_s": TARGET_S, "cases": rows,
              "targets": [target("c128patch --help (s)", rows["c128patch --help"]["median_cpu_s"], TARGET_S, "cpu")],
              "how": "the console script" if SCRIPT.is_file() else "python -m c128patch",
              "before": args.before.resolve().parent.name if args.before else None,
              "load_average": [round(x, 1) for x in os.getloadavg()],
              "machine": f"{platform.machine()} {platform.python_version()}, {os.cpu_count()} cores"}
    return int(append(args.out, record)["missed"])  # the target is `--help`'s; verbs' are shown


if __name__ == "__main__":
    raise SystemExit(main())
