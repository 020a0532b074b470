"""The GPU evidence run over a stage (evidence.staging): the ``smoke kernel`` jobs of a phase, run on one
GPU under one deadline, and the bundle that comes back (three files per phase).

Phases: ``plain`` (per release the suite, patched with ``--differential`` against unpatched; per
"before" tree the suite), ``sanitizers`` (one tool and one release at a time, tool by tool: several at
once ran ~14x slower; jobs the deadline leaves unstarted are reported as not run), ``bench``
(``ci/bench/bench_online_c128_dspark.py`` per release, one at a time). Bundle: ``<phase>.tgz`` (every
job's folder), ``<phase>-run.json`` (jobs, exit codes, seconds, the stage manifest, the repository
root) and ``<phase>-summary.txt``. Stdlib only beyond the package: it runs on the GPU machine.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import tarfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from c128patch.errors import C128Error
from c128patch.smoke.presets import SANITIZER_TOOLS  # in run order

PHASES = ("plain", "sanitizers", "bench")
BENCH_SCRIPT = "ci/bench/bench_online_c128_dspark.py"
BENCH_FILE = "online_c128_dspark.json"
SEQUENTIAL = ("sanitizers", "bench")  # phases whose jobs run one at a time
LOG_CAP = 4 * 1024 * 1024  # a log larger than this is cut to its head and tail before bundling


@dataclass
class Job:
    name: str  # <rev>-<label>-<what>, also the folder of its smoke output
    rev: str
    label: str  # patched | before
    kinds: tuple[str, ...]  # the result files its report proves
    args: list[str]  # after `c128patch smoke kernel` (or `script`), paths relative to the repository
    rc: int | None = None  # None: not started (the deadline came first)
    seconds: float = 0.0
    script: str = ""  # a script run instead of `c128patch smoke kernel`

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Limits:
    """Per-pass pytest timeouts (smoke --timeout) and the sanitizer scale."""

    plain_timeout: float = 420.0
    sanitizer_timeout: float = 480.0
    sanitizer_scale: float = 0.02


def plan_jobs(manifest: dict[str, Any], stage: str, phase: str, out: str, limits: Limits = Limits(),
              tools: tuple[str, ...] = SANITIZER_TOOLS) -> list[Job]:
    """The jobs of ``phase`` over a stage manifest, in run order (``stage``, ``out``: as the command line says)."""
    if phase not in PHASES:
        raise C128Error(f"unknown phase {phase!r} (one of {', '.join(PHASES)})")
    unknown = [t for t in tools if t not in SANITIZER_TOOLS]
    if unknown:
        raise C128Error(f"unknown sanitizer tool(s) {', '.join(unknown)} (known: {', '.join(SANITIZER_TOOLS)})")
    releases = [(rel["rev"], {label: f"{stage}/{t['path']}" for label, t in rel["trees"].items()})
                for rel in manifest["releases"]]

    def job(rev: str, label: str, what: str, kinds: tuple[str, ...], args: list[str], timeout: float | None = None,
            script: str = "") -> Job:
        name = f"{rev}-{label}-{what}"
        limit = ["--timeout", f"{timeout:g}"] if timeout is not None else []
        return Job(name, rev, label, kinds,
                   [*args, *limit, "--out", f"{out}/{name}" + (f"/{BENCH_FILE}" if script else "")], script=script)

    if phase == "sanitizers":
        return [job(rev, "patched", tool, (tool,), ["--tree", trees["patched"], "--upstream-tree", trees["upstream"],
                                                     "--sanitizer", tool, "--sanitizer-only",
                                                     "--sanitizer-scale", f"{limits.sanitizer_scale:g}"],
                    limits.sanitizer_timeout) for tool in tools for rev, trees in releases]
    if phase == "bench":
        return [job(rev, "patched", "bench", ("kernel-bench",), ["--tree", trees["patched"]], script=BENCH_SCRIPT)
                for rev, trees in releases]
    jobs: list[Job] = []
    for rev, trees in releases:
        upstream = ["--upstream-tree", trees["upstream"]]
        jobs.append(job(rev, "patched", "plain", ("suite", "differential"),
                        ["--tree", trees["patched"], *upstream, "--differential"], limits.plain_timeout))
        jobs += [job(rev, label, "plain", ("suite",), ["--tree", trees[label], *upstream], limits.plain_timeout)
                 for label in trees if label not in ("patched", "upstream")]
    return jobs


def smoke_argv(python: str, job: Job) -> list[str]:
    if job.script:
        return [python, job.script, *job.args]
    return [python, "-m", "c128patch", "smoke", "kernel", *job.args]


def job_env(base: dict[str, str], package_parent: str, site: str | None, threads: int) -> dict[str, str]:
    """The tool and carried wheels importable, few threads each, unbuffered, no shared JIT cache (patched and
    unpatched trees must never share a build)."""
    env = dict(base)
    paths = [package_parent, *([site] if site else []), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env.setdefault("CUDA_HOME", "/usr/local/cuda")
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("SGLANG_JIT_CACHE_DIR", None)  # the harness then builds each tree in its own cache
    return env


def run_jobs(jobs: list[Job], python: str, env: dict[str, str], logs: Path, deadline: float,
             cwd: Path, say: Callable[[str], object] = print, parallel: int = 0) -> list[Job]:
    """Run the jobs in order, ``parallel`` at a time (0: all), until the ``deadline`` (monotonic): then none
    starts (rc None), running ones get SIGTERM (smoke keeps what finished) and SIGKILL 20 s later."""
    logs.mkdir(parents=True, exist_ok=True)
    queue = list(jobs)
    pending: list = []
    termed = False

    def start(job: Job) -> None:
        argv = smoke_argv(python, job)
        say(f"start {job.name}: {shlex.join(argv[1:])}")
        log = open(logs / f"{job.name}.log", "w")  # noqa: SIM115  (closed below)
        pending.append((job, subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                              start_new_session=True), log, time.monotonic()))

    while queue or pending:
        while queue and (parallel <= 0 or len(pending) < parallel) and time.monotonic() < deadline:
            start(queue.pop(0))
        if not pending:
            for job in queue:
                say(f"deadline: {job.name} not started")
            break
        for item in list(pending):
            job, proc, log, started = item
            if proc.poll() is not None:
                job.rc, job.seconds = proc.returncode, round(time.monotonic() - started, 1)
                log.close()
                pending.remove(item)
                say(f"done  {job.name}: exit {job.rc}, {job.seconds:.0f} s")
        now = time.monotonic()
        if pending and now >= deadline and not termed:
            for job, proc, _, _ in pending:
                say(f"deadline: stopping {job.name}")
                os.killpg(proc.pid, signal.SIGTERM)
            termed = True
        if pending and termed and now >= deadline + 20:
            for _, proc, _, _ in pending:
                os.killpg(proc.pid, signal.SIGKILL)
        time.sleep(0.5)
    return jobs


def cap_logs(folder: Path, cap: int = LOG_CAP) -> list[str]:
    """Cut every file over ``cap`` bytes to its first and last cap/2 bytes; returns their names."""
    cut = []
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.stat().st_size > cap:
            data = path.read_bytes()
            half = cap // 2
            path.write_bytes(data[:half] + f"\n[... {len(data) - cap} bytes cut by c128patch ...]\n".encode()
                             + data[-half:])
            cut.append(str(path.relative_to(folder)))
    return cut


def bundle(phase: str, results: Path, dest: Path, run: dict[str, Any], summary: str) -> list[Path]:
    """``<phase>.tgz`` of ``results``, ``<phase>-run.json``, ``<phase>-summary.txt`` in ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    run["logs_cut"] = cap_logs(results)
    tgz = dest / f"{phase}.tgz"
    with tarfile.open(tgz, "w:gz") as tar:
        tar.add(results, arcname=phase)
    run_path = dest / f"{phase}-run.json"
    run_path.write_text(json.dumps(run, indent=1, sort_keys=True) + "\n")
    text = dest / f"{phase}-summary.txt"
    text.write_text(summary)
    return [tgz, run_path, text]


def job_summary(job: Job, results: Path) -> str:
    """One line per job from its report (or why there is none)."""
    if job.rc is None:
        return f"{job.name}: NOT STARTED (the deadline came first)"
    if job.script:
        out = results / job.name / BENCH_FILE
        return (f"{job.name}: exit {job.rc}, {job.seconds:.0f} s, "
                f"{'wrote ' + BENCH_FILE if out.is_file() else 'NO RESULT'}")
    path = results / job.name / "smoke-kernel.json"
    if not path.is_file():
        return f"{job.name}: exit {job.rc}, {job.seconds:.0f} s, NO REPORT (see logs/{job.name}.log)"
    report = json.loads(path.read_text())
    counts = ", ".join(f"{k} {report.get(k, 0)}" for k in ("passed", "failed", "errors", "crashed", "skipped"))
    extra = f", sanitizer errors {report['sanitizer'].get('errors')}" if report.get("sanitizer") else ""
    if report.get("differential"):
        extra += ", differential " + ", ".join(f"{v} {k}" for k, v in report["differential"]["summary"].items())
    problems = "; ".join(report.get("problems", [])) or "none"
    return f"{job.name}: exit {job.rc}, {job.seconds:.0f} s, {counts}{extra}; problems: {problems}"
