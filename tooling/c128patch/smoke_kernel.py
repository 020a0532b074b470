"""``smoke --tier kernel``: run the project's GPU suite (tests/gpu) on the patched sources, and
optionally under compute-sanitizer and side by side with the unpatched upstream sources.

The suite runs in a pytest subprocess with the harness API's environment (tests/gpu/harness.py:
C128PATCH_TREE, C128PATCH_UPSTREAM_TREE, C128PATCH_GPU_SCALE, C128PATCH_GPU_RESULTS_DIR); sglang's
own loader builds the kernels there. :mod:`c128patch.smoke_plugin` records one row per event,
so a pass that dies mid-test still says which test it was.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Callable

from . import smoke_sanitizer
from .errors import C128Error
from .provenance import PROVENANCE_PATH
from .smoke_plugin import ROWS_ENV
from .smoke_procs import Managed, exit_description

# The harness API (tests/gpu/harness.py); mirrored here because the suite is not importable.
TREE_ENV = "C128PATCH_TREE"
UPSTREAM_TREE_ENV = "C128PATCH_UPSTREAM_TREE"
SCALE_ENV = "C128PATCH_GPU_SCALE"
RESULTS_ENV = "C128PATCH_GPU_RESULTS_DIR"
SUITE_ENV = "C128PATCH_GPU_SUITE"
SUITE = "tests/gpu"
PROVENANCE_IN_ROOT = str(PurePosixPath(PROVENANCE_PATH).relative_to("python"))  # sglang/c128patch_provenance.json

BAD = ("failed", "error", "crashed")  # outcomes that fail a pass
Progress = Callable[[str], None]


# --------------------------------------------------------------------------- where things are


def default_suite_root() -> Path:
    """The GPU suite this tool carries: $C128PATCH_GPU_SUITE, the packaged copy, or the source
    checkout's tests/gpu (as manifest.default_series_root finds patches/)."""
    explicit = os.environ.get(SUITE_ENV)
    if explicit:
        return Path(explicit)
    here = Path(__file__).resolve().parent
    for candidate in (here / "_series" / SUITE, here.parents[1] / SUITE):
        if candidate.is_dir():
            return candidate
    raise C128Error(f"cannot find the GPU suite ({SUITE}); pass --suite DIR or set {SUITE_ENV}")


def check_suite(suite: Path) -> Path:
    suite = suite.resolve()
    if not suite.is_dir() or not any(suite.glob("test_*.py")):
        raise C128Error(f"no GPU suite at {suite} (expected test_*.py files there)")
    return suite


def resolve_tree(path: Path, what: str = "--tree") -> Path:
    """The folder holding ``sglang/``: ``<checkout>/python``, or the folder itself."""
    path = path.expanduser()
    if not path.exists():
        raise C128Error(f"{what}: {path} does not exist")
    for root in (path / "python", path):
        if (root / "sglang").is_dir():
            if not (root / "sglang" / "kernels" / "jit").is_dir():
                raise C128Error(f"{what}: {root / 'sglang'} has no kernels/jit (not an sglang source tree)")
            return root.resolve()
    raise C128Error(f"{what}: {path} holds neither python/sglang/ nor sglang/")


def unpack_wheel(wheel: Path, dest: Path) -> Path:
    """The ``sglang/`` package of a wheel, unpacked under ``dest``; returns ``dest``."""
    if not zipfile.is_zipfile(wheel):
        raise C128Error(f"--wheel: {wheel} is not a wheel (not a zip file)")
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        members = [m for m in zf.namelist() if m.startswith("sglang/") and not m.endswith("/")]
        if not members:
            raise C128Error(f"--wheel: {wheel.name} has no sglang/ package")
        for name in members:
            parts = PurePosixPath(name).parts
            if ".." in parts or name.startswith("/"):
                raise C128Error(f"--wheel: unsafe path in {wheel.name}: {name!r}")
            zf.extract(name, dest)
    return dest


def read_provenance(root: Path) -> dict | None:
    path = root / PROVENANCE_IN_ROOT
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise C128Error(f"{path}: provenance file is not valid JSON ({exc.msg})") from exc


def series_info(record: dict | None) -> dict | None:
    """What the report says about the applied series (from the provenance record)."""
    if record is None:
        return None
    return {
        "series": record.get("series", {}),
        "upstream": record.get("upstream", {}),
        "tool": record.get("tool", {}),
        "entries": [{k: e.get(k) for k in ("name", "kind", "gate")} for e in record.get("entries", [])],
    }


ARCHIVE_PATHS = ("python/sglang",)


def _extract_archive(git_args: list[str], dest: Path, paths: tuple[str, ...] = ARCHIVE_PATHS) -> Path:
    """``git archive`` of ``paths`` (under python/) into ``dest`` (``dest/sglang/...``)."""
    dest.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(["git", *git_args, *paths], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            for member in tar:
                path = PurePosixPath(member.name)
                if path.parts[:1] != ("python",) or ".." in path.parts or not (member.isfile() or member.isdir()):
                    continue
                member.name = str(path.relative_to("python"))
                tar.extract(member, dest)
    except tarfile.TarError as exc:
        raise C128Error(f"git archive failed: {exc}") from exc
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.wait() != 0:
        raise C128Error(f"git archive failed: {err.strip().splitlines()[-1:] or ''}")
    return dest


def _git_has(git_dir_args: list[str], commit: str) -> bool:
    return subprocess.run(["git", *git_dir_args, "cat-file", "-e", f"{commit}^{{commit}}"],
                          capture_output=True).returncode == 0


def derive_upstream(patched_root: Path, record: dict | None, wheel: Path | None, workdir: Path,
                    paths: tuple[str, ...] = ARCHIVE_PATHS) -> tuple[Path, str]:
    """The unpatched sources matching a patched tree or wheel, extracted under ``workdir``:
    the recorded upstream commit from the tree's own repository or the release history, or
    for a wheel the release wheel of the same X.Y.Z."""
    from .release_source import ReleaseHistory, release_version  # packaging only, no network yet

    upstream = (record or {}).get("upstream", {})
    rev, commit = str(upstream.get("rev", "")), str(upstream.get("commit", ""))
    if wheel is not None:
        from packaging.utils import parse_wheel_filename
        from packaging.version import Version

        from .release_source import wheel_for

        version = release_version(rev) if rev else None
        if version is None:
            try:
                version = Version(str(parse_wheel_filename(wheel.name)[1])).base_version
            except Exception as exc:  # noqa: BLE001  (any unparsable name)
                raise C128Error(f"cannot tell the sglang release of {wheel.name}; pass --upstream-tree") from exc
        release = wheel_for(version)
        return unpack_wheel(release, workdir / "upstream"), f"release wheel {release.name}"
    if not commit and not rev:
        raise C128Error("--differential: the tree has no provenance record naming its upstream; pass --upstream-tree")
    want = commit or rev
    top = subprocess.run(["git", "-C", str(patched_root), "rev-parse", "--show-toplevel"],
                         capture_output=True, text=True)
    if top.returncode == 0 and _git_has(["-C", top.stdout.strip()], want):
        dest = _extract_archive(["-C", top.stdout.strip(), "archive", "--format=tar", want], workdir / "upstream", paths)
        return dest, f"git archive {want[:12]} of {top.stdout.strip()}"
    version = release_version(rev) if rev else None
    if version is None:
        raise C128Error(f"--differential: upstream {rev or want[:12]} is not in the tree's repository and not a "
                        "release; pass --upstream-tree")
    repo = ReleaseHistory().ensure([version])
    ref = commit if commit and _git_has(["--git-dir", str(repo)], commit) else f"v{version}"
    dest = _extract_archive(["--git-dir", str(repo), "archive", "--format=tar", ref], workdir / "upstream", paths)
    return dest, f"release history {ref[:12]} (sglang {version})"


def stage(suite: Path, trees: dict[str, Path], dest: Path) -> dict[str, dict[str, int]]:
    """Copy what the kernel tier reads from each tree into ``dest/<label>`` (to carry to a GPU
    machine): the suite's own subset list (tests/gpu/tree_subset.py) when it has one, else the
    whole ``sglang/``; the provenance record goes along."""
    subset = None
    helper = suite / "tree_subset.py"
    if helper.is_file():
        spec = importlib.util.spec_from_file_location("c128patch_suite_tree_subset", helper)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        subset = module.subset_files
    out = {}
    for label, root in trees.items():
        target = dest / label
        if target.exists():
            shutil.rmtree(target)
        files = [Path(p) for p in subset(root)] if subset else [
            p.relative_to(root) for p in (root / "sglang").rglob("*") if p.is_file() and "__pycache__" not in p.parts]
        if (root / PROVENANCE_IN_ROOT).is_file():
            files.append(Path(PROVENANCE_IN_ROOT))
        for rel in sorted(set(files)):
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / rel, target / rel)
        out[label] = {"files": len(set(files)), "bytes": sum((target / f).stat().st_size for f in set(files))}
    return out


# --------------------------------------------------------------------------- one pytest pass


@dataclass
class PassSpec:
    label: str
    tree: Path
    upstream: Path | None = None
    scale: float = 1.0
    sanitizer: str | None = None  # tool name
    sanitizer_exe: str | None = None
    timeout: float = 1800.0
    keyword: str | None = None
    collect_only: bool = False
    extra_env: dict[str, str] = field(default_factory=dict)


def _package_parent() -> str:
    return str(Path(__file__).resolve().parent.parent)


def pytest_argv(spec: PassSpec, suite: Path, python: str, out_dir: Path) -> list[str]:
    ini = out_dir / "pytest.ini"
    ini.write_text("[pytest]\n")  # not the repo's ini: its addopts and timeout are for the CPU suite
    argv = [python, "-m", "pytest", str(suite), "-c", str(ini), "--rootdir", str(suite), "--confcutdir", str(suite),
            "-p", "no:cacheprovider", "-p", "c128patch.smoke_plugin", "-q", "-rfEs",
            "--junitxml", str(out_dir / f"junit-{spec.label}.xml")]
    if spec.collect_only:
        argv.append("--collect-only")
    if spec.keyword:
        argv += ["-k", spec.keyword]
    if spec.sanitizer:
        assert spec.sanitizer_exe
        argv = smoke_sanitizer.command(spec.sanitizer, spec.sanitizer_exe) + argv
    return argv


def pytest_env(spec: PassSpec, rows: Path, results: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_package_parent(), env.get("PYTHONPATH", "")) if p)
    env.update({ROWS_ENV: str(rows), TREE_ENV: str(spec.tree), SCALE_ENV: repr(spec.scale),
                RESULTS_ENV: str(results), "PYTHONUNBUFFERED": "1"})
    if spec.upstream is not None:
        env[UPSTREAM_TREE_ENV] = str(spec.upstream)
    else:
        env.pop(UPSTREAM_TREE_ENV, None)
    if spec.sanitizer:
        env.update(smoke_sanitizer.SANITIZER_ENV)
    env.update(spec.extra_env)
    return env


def tests_from_rows(rows: list[dict], end_time: float, timed_out: bool = False) -> list[dict]:
    """Per-test rows from the plugin's events. Outcomes: passed, failed, error (setup, teardown
    or collection failed), skipped, xfailed, xpassed, crashed (started and never finished: the
    process died or was killed during it), not run (collected, never started)."""
    tests: dict[str, dict] = {}
    state: dict[str, dict] = {}  # nodeid -> {"started": t, "finished": bool}

    def row(nodeid: str) -> dict:
        return tests.setdefault(nodeid, {"nodeid": nodeid, "outcome": "not run", "seconds": 0.0, "message": ""})

    for ev in rows:
        kind, nodeid = ev.get("event"), ev.get("nodeid", "")
        if kind == "collected":
            row(nodeid)["markers"] = ev.get("markers", [])
        elif kind == "start":
            row(nodeid)
            state[nodeid] = {"started": ev.get("t", end_time), "finished": False}
        elif kind == "report":
            r = row(nodeid)
            r["seconds"] += ev.get("duration", 0.0)
            when, outcome, msg = ev.get("when"), ev.get("outcome"), ev.get("message", "")
            if when == "collect" or (when == "setup" and outcome == "failed"):
                r.update(outcome="error", message=msg)
            elif when == "setup" and outcome == "skipped":
                r.update(outcome="skipped", message=msg)
            elif when == "call":
                if "xfail" in ev:
                    outcome = "xfailed" if outcome == "skipped" else "xpassed"
                    msg = msg or ev["xfail"]
                r.update(outcome=outcome, message=msg)
            elif when == "teardown":
                if outcome == "failed":
                    r.update(outcome="error", message=msg or r["message"])
                state.setdefault(nodeid, {"started": end_time})["finished"] = True
    for nodeid, st in state.items():
        if not st["finished"]:
            r = tests[nodeid]
            r["outcome"] = "crashed"
            r["seconds"] = max(r["seconds"], end_time - st["started"])
            r["message"] = "killed at the pass timeout" if timed_out else "the process died during this test"
    for r in tests.values():
        r["seconds"] = round(r["seconds"], 3)
    return list(tests.values())


def count(tests: list[dict]) -> dict[str, int]:
    keys = ("passed", "failed", "error", "skipped", "xfailed", "xpassed", "crashed", "not run")
    return {k: sum(1 for t in tests if t["outcome"] == k) for k in keys}


def _read_rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a kill
    return rows


def _read_results(folder: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            out[path.stem] = json.loads(path.read_text())
        except json.JSONDecodeError:
            out[path.stem] = {"unreadable": str(path)}
    return out


def run_pass(spec: PassSpec, suite: Path, python: str, out_dir: Path) -> dict[str, Any]:
    """Run the suite once; the pass's rows, counts, exit and (under a sanitizer) its findings."""
    out_dir = out_dir.resolve()  # the child runs in the suite's folder
    out_dir.mkdir(parents=True, exist_ok=True)
    rows_path = out_dir / f"rows-{spec.label}.jsonl"
    log = out_dir / f"pytest-{spec.label}.log"
    results = out_dir / "results" / spec.label
    for stale in (rows_path, log):
        stale.unlink(missing_ok=True)
    results.mkdir(parents=True, exist_ok=True)
    argv = pytest_argv(spec, suite, python, out_dir)
    start = time.time()
    proc = Managed(f"pytest {spec.label}", argv, log, env=pytest_env(spec, rows_path, results), cwd=suite)
    with proc:
        code = proc.wait(spec.timeout)
        timed_out = code is None
    code = proc.proc.returncode if proc.proc else None
    end = time.time()
    rows = _read_rows(rows_path)
    finished = any(r.get("event") == "finish" for r in rows)
    tests = tests_from_rows(rows, end, timed_out)
    text = log.read_text(errors="replace")
    result: dict[str, Any] = {
        "label": spec.label,
        "tree": str(spec.tree),
        "upstream_tree": str(spec.upstream) if spec.upstream else None,
        "scale": spec.scale,
        "exit_code": code,
        "exit": "timed out after %ds" % spec.timeout if timed_out else exit_description(code),
        "timed_out": timed_out,
        "finished": finished,
        "seconds": round(end - start, 1),
        "log": str(log),
        "counts": count(tests),
        "tests": tests,
        "results": _read_results(results),
        "argv": argv,
    }
    if proc.leftover:
        result["leftover_pids"] = proc.leftover
    if not finished and not spec.collect_only:
        result["log_tail"] = text.strip().splitlines()[-20:]
    if spec.sanitizer:
        found = smoke_sanitizer.parse(text, spec.sanitizer)
        result["sanitizer"] = {**found, "exit_code": code}
    return result


def pass_problems(p: dict[str, Any], collect_only: bool = False) -> list[str]:
    """Why a pass does not count as clean (empty list: clean)."""
    label, c = p["label"], p["counts"]
    problems = []
    if p["timed_out"]:
        problems.append(f"{label}: {p['exit']}")
    bad = {k: c[k] for k in ("failed", "error", "crashed") if c[k]}
    if bad:
        problems.append(f"{label}: " + ", ".join(f"{n} {k}" for k, n in bad.items()))
    if not collect_only and not p["timed_out"]:
        if c["passed"] == 0:
            problems.append(f"{label}: no test passed ({', '.join(f'{n} {k}' for k, n in c.items() if n) or 'none collected'})")
        if not p["finished"]:
            problems.append(f"{label}: pytest did not finish ({p['exit']})")
        elif p["exit_code"] not in (0, 1, smoke_sanitizer.ERROR_EXIT_CODE) and not bad:
            problems.append(f"{label}: pytest {p['exit']}")
    san = p.get("sanitizer")
    if san:
        if san["errors"] is None:
            problems.append(f"{label}: compute-sanitizer printed no summary ({p['exit']})")
        elif san["errors"]:
            problems.append(f"{label}: compute-sanitizer {san['tool']} found {san['errors']} error(s)")
    if p.get("leftover_pids"):
        problems.append(f"{label}: processes left behind {p['leftover_pids']}")
    return problems


# --------------------------------------------------------------------------- differential


def compare(patched: dict[str, Any], upstream: dict[str, Any]) -> dict[str, Any]:
    """Both columns per test and a verdict: same, fixed (passes patched, fails upstream: the
    zero-row crash, patched-only code), regressed (fails patched, passes upstream), differs."""
    up = {t["nodeid"]: t for t in upstream["tests"]}
    rows = []
    order = [t["nodeid"] for t in patched["tests"]] + [n for n in up if n not in {t["nodeid"] for t in patched["tests"]}]
    pt = {t["nodeid"]: t for t in patched["tests"]}
    for nodeid in order:
        a = pt.get(nodeid, {"outcome": "absent", "seconds": 0.0, "message": ""})
        b = up.get(nodeid, {"outcome": "absent", "seconds": 0.0, "message": ""})
        if a["outcome"] == b["outcome"]:
            verdict = "same"
        elif a["outcome"] == "passed" and b["outcome"] in BAD:
            verdict = "fixed"
        elif a["outcome"] in BAD and b["outcome"] == "passed":
            verdict = "regressed"
        else:
            verdict = "differs"
        rows.append({"nodeid": nodeid, "patched": a["outcome"], "upstream": b["outcome"], "verdict": verdict,
                     "patched_seconds": a["seconds"], "upstream_seconds": b["seconds"],
                     "upstream_message": b.get("message", "")})
    summary = {v: sum(1 for r in rows if r["verdict"] == v) for v in ("same", "fixed", "regressed", "differs")}
    shared = sorted(set(patched["results"]) & set(upstream["results"]))
    results = {name: patched["results"][name] == upstream["results"][name] for name in shared}
    return {"rows": rows, "summary": summary, "results_identical": results}


# --------------------------------------------------------------------------- the tier


@dataclass
class KernelOptions:
    tree: Path | None = None
    wheel: Path | None = None
    upstream_tree: Path | None = None
    sanitizers: tuple[str, ...] = ()
    differential: bool = False
    scale: float = 1.0
    sanitizer_scale: float = 0.05
    collect_only: bool = False
    suite: Path | None = None
    timeout: float = 1800.0
    keyword: str | None = None
    python: str = sys.executable
    out: Path | None = None


@dataclass
class Prepared:
    """Trees resolved, suite found; temp folders to remove at the end."""

    patched: Path
    upstream: Path | None
    upstream_how: str
    suite: Path
    record: dict | None
    temp: list[Path] = field(default_factory=list)

    def cleanup(self) -> None:
        for path in self.temp:
            shutil.rmtree(path, ignore_errors=True)


def validate(opts: KernelOptions) -> Path:
    """Cheap checks of the inputs, before the machine is probed; returns the suite."""
    if (opts.tree is None) == (opts.wheel is None):
        raise C128Error("give the patched sources one way: --tree PATH or --wheel FILE")
    suite = check_suite(opts.suite or default_suite_root())
    if opts.tree is not None:
        root = resolve_tree(opts.tree)
        upstream = (read_provenance(root) or {}).get("upstream", {})
        if opts.differential and opts.upstream_tree is None and not opts.collect_only and not (
                upstream.get("commit") or upstream.get("rev")):
            raise C128Error("--differential: the tree has no provenance record naming its upstream; "
                            "pass --upstream-tree")
    if opts.wheel is not None:
        if not opts.wheel.is_file():
            raise C128Error(f"--wheel: {opts.wheel} does not exist")
        if not zipfile.is_zipfile(opts.wheel):
            raise C128Error(f"--wheel: {opts.wheel} is not a wheel (not a zip file)")
    if opts.upstream_tree is not None:
        resolve_tree(opts.upstream_tree, "--upstream-tree")
    return suite


def prepare(opts: KernelOptions, progress: Progress = lambda _m: None) -> Prepared:
    """Resolve the suite and the trees (unpacking a wheel, deriving upstream when asked)."""
    if (opts.tree is None) == (opts.wheel is None):
        raise C128Error("give the patched sources one way: --tree PATH or --wheel FILE")
    suite = check_suite(opts.suite or default_suite_root())
    temp: list[Path] = []
    try:
        if opts.wheel is not None:
            if not opts.wheel.is_file():
                raise C128Error(f"--wheel: {opts.wheel} does not exist")
            work = Path(tempfile.mkdtemp(prefix="c128patch-smoke-"))
            temp.append(work)
            progress(f"unpacking {opts.wheel.name}")
            patched = resolve_tree(unpack_wheel(opts.wheel, work / "patched"), "--wheel")
        else:
            assert opts.tree is not None
            patched = resolve_tree(opts.tree)
        record = read_provenance(patched)
        upstream, how = None, ""
        if opts.upstream_tree is not None:
            upstream, how = resolve_tree(opts.upstream_tree, "--upstream-tree"), "--upstream-tree"
        elif opts.differential and not opts.collect_only:
            work = Path(tempfile.mkdtemp(prefix="c128patch-smoke-upstream-"))
            temp.append(work)
            progress("extracting the unpatched upstream sources")
            root, how = derive_upstream(patched, record, opts.wheel, work)
            upstream = resolve_tree(root, "upstream")
        if upstream is not None and upstream == patched:
            raise C128Error("the upstream tree is the patched tree; pass the unpatched sources")
        return Prepared(patched, upstream, how, suite, record, temp)
    except BaseException:
        for path in temp:
            shutil.rmtree(path, ignore_errors=True)
        raise


def plan_passes(opts: KernelOptions, prep: Prepared, sanitizer_exe: str | None) -> list[PassSpec]:
    common = dict(timeout=opts.timeout, keyword=opts.keyword, collect_only=opts.collect_only)
    passes = [PassSpec("patched", prep.patched, prep.upstream, opts.scale, **common)]
    if opts.collect_only:
        return passes
    if opts.differential:
        assert prep.upstream is not None
        passes.append(PassSpec("upstream", prep.upstream, prep.upstream, opts.scale, **common))
    for tool in opts.sanitizers:
        passes.append(PassSpec(f"patched-{tool}", prep.patched, prep.upstream, opts.sanitizer_scale,
                               sanitizer=tool, sanitizer_exe=sanitizer_exe, **common))
    return passes


def build_report(command: str, opts: KernelOptions, prep: Prepared, device: dict[str, Any],
                 passes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The JSON report: the patched pass on top, the other passes beside it."""
    main = passes.get("patched")
    problems = [p for res in passes.values() for p in pass_problems(res, opts.collect_only)]
    report: dict[str, Any] = {
        "command": command,
        "tier": "kernel",
        "mode": "collect-only" if opts.collect_only else "run",
        "device": device,
        "tree": str(prep.patched),
        "wheel": str(opts.wheel) if opts.wheel else None,
        "suite": str(prep.suite),
        "provenance": series_info(prep.record),
        "scale": opts.scale,
        "upstream_tree": str(prep.upstream) if prep.upstream else None,
        "upstream_how": prep.upstream_how or None,
        "passes": {k: {x: v for x, v in res.items() if x != "tests"} for k, res in passes.items()},
    }
    if prep.record is None:
        report["notes"] = ["the tree has no provenance record (sglang/c128patch_provenance.json): "
                           "is it a c128patch-patched tree?"]
    if main:
        report.update({k: main["counts"][k] for k in ("passed", "failed", "skipped")})
        report.update(errors=main["counts"]["error"], crashed=main["counts"]["crashed"])
        report["tests"] = [dict(t) for t in main["tests"]]
    if "upstream" in passes and main:
        diff = compare(main, passes["upstream"])
        report["differential"] = {k: v for k, v in diff.items() if k != "rows"}
        report["differential"]["upstream_counts"] = passes["upstream"]["counts"]
        by_id = {r["nodeid"]: r for r in diff["rows"]}
        for t in report["tests"]:
            r = by_id.get(t["nodeid"])
            if r:
                t.update(upstream=r["upstream"], upstream_seconds=r["upstream_seconds"], verdict=r["verdict"])
        report["differential"]["rows"] = [r for r in diff["rows"] if r["nodeid"] not in {t["nodeid"] for t in main["tests"]}]
        regressed = diff["summary"]["regressed"]
        if regressed:
            problems.append(f"differential: {regressed} test(s) pass upstream and fail patched")
        # The upstream pass's own failures are expected (that is what the series fixes).
        problems = [p for p in problems if not p.startswith("upstream:") or "did not finish" in p or "left behind" in p]
    san_runs = [res["sanitizer"] | {"pass": k, "scale": res["scale"], "counts": res["counts"],
                                    "failing": [t["nodeid"] for t in res["tests"] if t["outcome"] in BAD]}
                for k, res in passes.items() if res.get("sanitizer")]
    if san_runs:
        errors = [r["errors"] for r in san_runs]
        report["sanitizer"] = {
            "tool": "+".join(r["tool"] for r in san_runs),
            "errors": None if any(e is None for e in errors) else sum(errors),
            "runs": san_runs,
        }
    else:
        report["sanitizer"] = None
    report["problems"] = problems
    report["ok"] = not problems
    return report


def write_report(report: dict[str, Any], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "smoke-kernel.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2, sort_keys=True, default=str) + "\n")
    tmp.replace(path)
    return path
