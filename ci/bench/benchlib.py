"""The harness every tool benchmark shares: N interleaved runs of each case (wall and CPU seconds,
median/min/max), ratios in wall and CPU, targets, and a record stamped with what it was measured on
(date, commit, cores, load, command, series, each release's evidence key) appended to the history
in the results JSON. The file's top level repeats the latest record (README's figures read it)."""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

RESULTS = Path(__file__).resolve().parent / "results"


def parser(name: str, runs: int = 3) -> argparse.ArgumentParser:
    """--runs N and --out (default results/<name>.json; --out - writes nothing); the tool's bytecode compiled first
    (``compiled``)."""
    compiled()
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=runs)
    ap.add_argument("--out", default=str(RESULTS / f"{name}.json"))
    return ap


def compiled() -> None:
    """The tool's modules compiled to bytecode, as ``pip install`` leaves an installed tool. These machines set
    PYTHONDONTWRITEBYTECODE=1, so an editable checkout would otherwise compile every module again in every process
    timed (~50-70 ms CPU each: ``status`` 0.27 -> 0.15 s)."""
    import compileall

    import c128patch

    compileall.compile_dir(Path(c128patch.__file__).parent, quiet=1)


def cpu_now(children_only: bool = False) -> float:
    """CPU seconds (user + sys) of this process and its waited-for children, or of those alone."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    me = 0.0 if children_only else sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
    return me + kids.ru_utime + kids.ru_stime


def measure(fn: Callable[[], Any], children_only: bool = False) -> tuple[float, float, Any]:
    """(wall s, CPU s, fn's result)."""
    wall, cpu = time.perf_counter(), cpu_now(children_only)
    out = fn()
    return time.perf_counter() - wall, cpu_now(children_only) - cpu, out


def spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
            "max": round(max(values), 4)}


def interleaved(cases: dict[str, Callable[[int], Any]], runs: int, prepare: Callable[[int], Any] | None = None,
                children_only: bool = False, alternate: bool = False,
                warmup: int = 0) -> tuple[dict[str, dict], dict[str, Any]]:
    """Each case ``runs`` times, round by round (the machine's drift hits every case alike);
    ``prepare(i)`` runs untimed before round i. ``alternate``: the cases in reverse order every other round (ABBA:
    what running first or second costs falls on each case alike); ``warmup``: that many untimed rounds first, as
    ``-1``, ``-2``, ... (every case warmed the same way). Returns (figures, each case's last result)."""
    wall: dict[str, list[float]] = {name: [] for name in cases}
    cpu: dict[str, list[float]] = {name: [] for name in cases}
    last: dict[str, Any] = {}
    for i in range(-warmup, runs):
        if prepare is not None:
            prepare(i)
        order = list(cases.items())
        for name, fn in (order[::-1] if alternate and i % 2 else order):
            if i < 0:
                fn(i)
                continue
            w, c, last[name] = measure(lambda: fn(i), children_only)
            wall[name].append(w)
            cpu[name].append(c)
    return {name: {"wall": spread(wall[name]), "cpu": spread(cpu[name]),
                   "runs_wall": [round(x, 3) for x in wall[name]], "runs_cpu": [round(x, 3) for x in cpu[name]]}
            for name in cases}, last


def ratio(figures: dict, ours: str, raw: str) -> dict[str, float]:
    """Median over median, in wall and in CPU seconds."""
    return {on: round(figures[ours][on]["median"] / figures[raw][on]["median"], 3) for on in ("wall", "cpu")}


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """A distribution-free ``level`` interval of the median: the k-th smallest and k-th largest of ``values``, k the
    largest with P(Binomial(n, 1/2) < k) <= (1 - level) / 2 (n = 30: the 10th and 21st, 95.7 %)."""
    n, xs = len(values), sorted(values)
    k, tail = 0, 0.0
    while k < n and tail + math.comb(n, k) / 2 ** n <= (1 - level) / 2:
        tail += math.comb(n, k) / 2 ** n
        k += 1
    return (xs[0], xs[-1]) if k == 0 else (xs[k - 1], xs[n - k])


def paired(figures: dict, a: str, b: str) -> dict:
    """A/B per pair (wall and CPU): median, min, max and the median's 95 % interval."""
    out = {}
    for on in ("wall", "cpu"):
        r = [x / y for x, y in zip(figures[a][f"runs_{on}"], figures[b][f"runs_{on}"])]
        lo, hi = median_interval(r)
        out[on] = {"median": round(statistics.median(r), 3), "min": round(min(r), 3), "max": round(max(r), 3),
                   "ci95": [round(lo, 3), round(hi, 3)]}
    return out


def verdict(ci: list[float], limit: float) -> str:
    return "met" if ci[1] <= limit else "missed" if ci[0] > limit else "undecided"


def target(what: str, value: float, limit: float, on: str = "wall") -> dict:
    return {"what": what, "on": on, "value": round(value, 3), "max": limit, "missed": value > limit}


def slope(sizes: Sequence[float], seconds: Sequence[float]) -> float:
    """Least-squares seconds per unit."""
    return round(statistics.linear_regression(sizes, seconds).slope, 5)


def c128patch(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """The whole CLI in a fresh process, with --json."""
    proc = subprocess.run([sys.executable, "-m", "c128patch", *args, "--json"], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise SystemExit(f"c128patch {shlex.join(args)} failed: {proc.stderr.strip()[-2000:]}")
    return proc


def mirror(work: Path) -> Path:
    """A bare clone of the release history: the user's mirror, read by both sides."""
    from c128patch.upstream.releases import ReleaseHistory

    repo = work / "mirror.git"
    subprocess.run(["git", "clone", "--quiet", "--bare", str(ReleaseHistory().ensure()), str(repo)], check=True)
    return repo


def stamp(revs: Sequence[str], series_root: Path | None = None) -> dict:
    """Command, device, dates, commit, load, series and ``keys`` (rev -> evidence key)."""
    from c128patch.evidence.keys import key_for
    from c128patch.series.manifest import default_series_root, load_series
    from c128patch.upstream.releases import ReleaseHistory

    series = load_series(series_root or default_series_root())
    git = ReleaseHistory().git
    now = datetime.datetime.now(datetime.timezone.utc)
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                          cwd=RESULTS).stdout.strip()
    device = f"{platform.machine()} {platform.python_version()}, {os.cpu_count()} cores"
    return {"command": "python " + shlex.join(sys.argv), "device": device, "bytecode": "compiled (benchlib.compiled)",
            "date": now.date().isoformat(),
            "time": now.isoformat(timespec="seconds"), "commit": head, "cores": os.cpu_count(),
            "load": [round(x, 2) for x in os.getloadavg()],
            "series": {"name": series.name, "version": series.version, "digest": series.digest()},
            "keys": {rev: key_for(series, git, git.rev_parse(rev)).to_json() for rev in revs}}


def append(out: str, record: dict, *, revs: Sequence[str] = (), series_root: Path | None = None,
           headline: bool = True) -> dict:
    """Stamp ``record``, append it to ``out``'s history and (``headline``) repeat it at the top level;
    prints its targets. Returns the stamped record."""
    targets = record.get("targets", [])
    record = {**stamp(revs, series_root), **record, "missed": any(t["missed"] for t in targets)}
    for t in targets:
        print(f"target {t['what']} ({t['on']}): {t['value']:g} <= {t['max']:g}: {'MISSED' if t['missed'] else 'met'}")
    if out != "-":
        path = Path(out)
        old = json.loads(path.read_text()) if path.is_file() else {}
        history = old.pop("history", [old] if old else []) + [record]
        top = record if headline else old
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**top, "history": history}, indent=1) + "\n")
    return record


def table(figures: dict) -> None:
    print(f"{'what':56} {'wall median [min-max] s':>26} {'CPU median s':>13}")
    for name, f in figures.items():
        w = f["wall"]
        print(f"{name:56} {w['median']:10.3f} [{w['min']:.3f}-{w['max']:.3f}] {f['cpu']['median']:13.3f}")
