"""``smoke server``: the patched sglang server on a model with PR #32035's settings under sustained multi-turn
load from sglang's own benchmark tools, then with the online-C128 envs off; crashes and capacity read from
its log. Bounded, loopback only, and everything it starts is stopped (smoke.procs)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from c128patch import SCHEMA_VERSION
from c128patch.errors import C128Error
from c128patch.jsonio import write_json_atomic
from c128patch.procs import without_credentials
from c128patch.smoke.device import NO_CWD, nvidia_smi, run_child
from c128patch.smoke.kernel import UNSEALED, unsealed
from c128patch.smoke.logs import ServerLog, Tail, load_summary
from c128patch.smoke.presets import LOAD_TOOLS, PRESETS
from c128patch.smoke.procs import Managed, exit_description
from c128patch.smoke.trees import read_provenance, series_info

HOST = "127.0.0.1"
# PR #32035: the online compressor under DSPARK is on with both.
ONLINE_ENVS = {"SGLANG_OPT_USE_ONLINE_COMPRESS": "1", "SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK": "1"}
COMPACT_ENV = {"SGLANG_RAGGED_VERIFY_MODE": "compact"}  # bug 1's setting (srt/environ.py: EnvStr("static"))
MODES = ("on", "off")
REPORT = "smoke-server.json"

# The soak load of docs/pr-32035.md (benchmark/hicache/bench_multiturn.py flags).
SOAK = {"request_length": 8192, "sub_question_input_length": 4096, "output_length": 2048, "num_clients": 64,
        "num_rounds": 30, "max_parallel": 32, "request_rate": 16, "seed": 422}
# Each load tool's arguments after its command, a word at a time formatted with SOAK and the run's values.
# serving: bench_serving's multi-turn generated-shared-prefix dataset, one conversation per group, an 8k shared
# prefix, 4k questions per turn, 2k outputs (no dataset download needed).
LOAD_ARGS = {
    "serving": "--backend sglang --host {host} --port {port} --model {model} --dataset-name generated-shared-prefix "
               "--gsp-num-groups {clients} --gsp-prompts-per-group 1 --gsp-system-prompt-len {request_length} "
               "--gsp-question-len {sub_question_input_length} --gsp-output-len {output_length} --gsp-num-turns "
               "{rounds} --request-rate {request_rate} --max-concurrency {parallel} --seed {seed} --output-file "
               "{result} --disable-tqdm --tag c128patch-smoke-{mode}",
    "multiturn": "--host {host} --port {port} --model-path {model} --disable-random-sample --request-length "
                 "{request_length} --sub-question-input-length {sub_question_input_length} --output-length "
                 "{output_length} --num-clients {clients} --num-rounds {rounds} --max-parallel {parallel} "
                 "--request-rate {request_rate} --ready-queue-policy random --disable-auto-run --enable-round-barrier "
                 "--seed {seed} --log-file {result} --tag c128patch-smoke-{mode}",
}
Progress = Callable[[str], None]


@dataclass
class ServerOptions:
    model_path: str
    tp: int = 1
    port: int = 30001
    duration: float = 900.0  # load seconds per mode
    max_requests: int | None = None
    compact: bool = False
    load: str = "serving"
    multiturn_script: Path | None = None
    preset: str = "soak"
    mem_fraction_static: float | None = None
    moe_runner_backend: str | None = "flashinfer_mxfp4"
    server_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    modes: tuple[str, ...] = MODES
    health_timeout: float = 1800.0
    launcher: list[str] | None = None  # default: [python, -m, sglang.launch_server]
    load_cmd: list[str] | None = None  # default: the tool's own command
    python: str = sys.executable
    out: Path = Path("smoke-server")
    grace: float = 30.0  # seconds from SIGTERM to SIGKILL when the server and the load are stopped
    settle: float = 3.0
    allow_unpatched: bool = False


def module_argv(python: str, module: str) -> list[str]:
    """``python -m module`` run as ``-m`` runs it, but with nothing of the current folder on sys.path: ``-m`` puts it
    first (run from an upstream tree, its top-level ``runpy.py``/``json.py`` ran as the operator before sglang); the
    smoke probes' ``NO_CWD``. ``PYTHONSAFEPATH`` (``server_env``, ``load_env``) keeps it off the children's path."""
    return [python, "-c", NO_CWD + f"import runpy; runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"]


# (Python >= 3.11: no current folder on sys.path of a child it starts, sglang's spawned schedulers among them)
SAFE_PATH = {"PYTHONSAFEPATH": "1"}


def _set_flag(args: list[str], flag: str, value: str) -> list[str]:
    """``args`` with ``flag``'s value replaced (a preset spells a flag and its value as two words)."""
    if flag in args:
        i = args.index(flag)
        args = args[:i] + args[i + 2:]
    return [*args, flag, value]


def server_argv(opts: ServerOptions) -> list[str]:
    if opts.preset not in PRESETS:
        raise C128Error(f"unknown preset {opts.preset!r} (known: {', '.join(PRESETS)})")
    args = list(PRESETS[opts.preset])
    if opts.mem_fraction_static is not None:
        args = _set_flag(args, "--mem-fraction-static", str(opts.mem_fraction_static))
    if opts.moe_runner_backend:
        args = _set_flag(args, "--moe-runner-backend", opts.moe_runner_backend)
    # later flags win in argparse: the extra ones last
    launcher = opts.launcher or module_argv(opts.python, "sglang.launch_server")
    return [*launcher, "--model-path", opts.model_path, "--tp-size", str(opts.tp), *args, *opts.server_args,
            "--host", HOST, "--port", str(opts.port)]


# the one credential the server may need (a gated model it downloads from the Hub); the rest of the operator's are
# not its (``procs.CREDENTIAL``: GITHUB_TOKEN, AWS_*, SSH_AUTH_SOCK), nor the load driver's
HF_CREDENTIALS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


def server_env(opts: ServerOptions, mode: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The server's environment for ``mode`` "on" (online C128 envs set) or "off" (unset)."""
    env = without_credentials(dict(os.environ if base is None else base), HF_CREDENTIALS)  # unsealed: the model's only
    for key in (*ONLINE_ENVS, *COMPACT_ENV):
        env.pop(key, None)
    env.update(opts.env)
    if mode == "on":  # "off": unset
        env.update(ONLINE_ENVS)
    if opts.compact:
        env.update(COMPACT_ENV)
    env.update(PYTHONUNBUFFERED="1", **SAFE_PATH)
    return env


def load_shape(max_requests: int | None) -> tuple[int, int]:
    """(conversations, turns) of the soak load, their product within ``max_requests``."""
    clients, rounds = SOAK["num_clients"], SOAK["num_rounds"]
    if max_requests is None:
        return clients, rounds
    if max_requests < 1:
        raise C128Error("--max-requests must be >= 1")
    clients = min(clients, max_requests)
    return clients, max(1, min(rounds, max_requests // clients))


def load_argv(opts: ServerOptions, mode: str, result_file: Path) -> list[str]:
    """sglang's own load tool with the PR's soak settings against our server."""
    clients, rounds = load_shape(opts.max_requests)
    if opts.load not in LOAD_ARGS:
        raise C128Error(f"unknown load tool {opts.load!r} (known: {', '.join(LOAD_TOOLS)})")
    if opts.load_cmd:
        prefix = opts.load_cmd
    elif opts.load == "serving":
        prefix = module_argv(opts.python, "sglang.bench_serving")
    elif opts.multiturn_script is not None:
        prefix = [opts.python, str(opts.multiturn_script)]
    else:
        raise C128Error("--load multiturn needs --multiturn-script PATH (benchmark/hicache/bench_multiturn.py "
                        "of an sglang checkout; the wheel does not ship it)")
    values = {**SOAK, "host": HOST, "port": opts.port, "model": opts.model_path, "clients": clients,
              "rounds": rounds, "parallel": min(SOAK["max_parallel"], clients), "result": result_file, "mode": mode}
    return [*prefix, *(word.format(**values) for word in LOAD_ARGS[opts.load].split())]


def port_free(port: int) -> bool:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def installed_sglang(python: str) -> dict[str, Any]:
    """Where ``python`` imports sglang from (its __init__ not run) and the provenance recorded there."""
    code = ("import sys; at = sys.path[:]\n" + NO_CWD + "import importlib.util, json\n"  # json of the folder: not run
            "sys.path[:] = at; s = importlib.util.find_spec('sglang'); "  # (found there as a launch would: not run)
            "print(json.dumps([s.origin is None, list(s.submodule_search_locations or [])] if s else None))")
    out = run_child([python, "-c", code], 120)[0].strip()
    namespace, found = (json.loads(out.splitlines()[-1]) if out else None) or (False, None)
    if not found or namespace:  # a folder named sglang with no __init__.py (apply's ./sglang checkout, say)
        here = f" ({', '.join(found)} is a folder, not the package)" if found else ""
        raise C128Error(f"sglang is not installed for {python}{here}: install the patched build (c128patch wheel) "
                        "first")
    root = Path(found[0]).parent
    record = read_provenance(root)
    return {"package": found[0], "provenance": series_info(record), "patched": record is not None}


def health(port: int, timeout: float = 5.0) -> bool:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _follow(server: Managed, tail: Tail, log: ServerLog, done: Callable[[], bool], timeout: float) -> str:
    """Read the server's log until ``done()``: "done", else what came first ("exited", "fatal", "timeout")."""
    start = time.monotonic()
    while True:
        log.feed_lines(tail.read_lines())
        if server.poll() is not None:
            return "exited"
        if log.fatal:
            return "fatal"
        if done():
            return "done"
        if time.monotonic() - start >= timeout:
            return "timeout"
        time.sleep(0.5)


def run_mode(opts: ServerOptions, mode: str, progress: Progress = lambda _m: None) -> dict[str, Any]:
    """Start the server for ``mode``, wait for health, load it, stop it; what happened."""
    out = opts.out
    out.mkdir(parents=True, exist_ok=True)
    server_log, load_log = out / f"server-{mode}.log", out / f"load-{mode}.log"
    result_file = out / f"load-{mode}.jsonl"
    for stale in (server_log, load_log, result_file):
        stale.unlink(missing_ok=True)
    deadline = time.monotonic() + 60
    while not port_free(opts.port):
        if time.monotonic() > deadline:
            raise C128Error(f"port {opts.port} on {HOST} is in use (another server?): pass --port")
        time.sleep(1)
    argv, env = server_argv(opts), server_env(opts, mode)
    record: dict[str, Any] = {"mode": mode, "argv": argv, "log": str(server_log),
                              "env": {k: env[k] for k in (*ONLINE_ENVS, *COMPACT_ENV, *opts.env) if k in env},
                              "problems": []}
    log, tail = ServerLog(), Tail(server_log)
    unsealed(f"[{mode}] ")
    server = Managed(f"server {mode}", argv, server_log, env=env, grace=opts.grace)
    died: str | None = None
    try:
        with server:
            record["pid"] = server.pid
            progress(f"[{mode}] starting the server (pid {server.pid}), waiting for /health")
            start = time.monotonic()  # /health answers 200, or the server exits, logs a fatal error or times out
            end = _follow(server, tail, log, lambda: health(opts.port, timeout=2.0), opts.health_timeout)
            ok, secs = end == "done", time.monotonic() - start
            why = {"exited": f"the server exited ({exit_description(server.poll())}) before /health answered",
                   "fatal": f"the server logged {', '.join(log.fatal)} while starting",
                   "timeout": f"/health did not answer within {opts.health_timeout:.0f}s"}.get(end, "")
            record["health"] = {"ok": ok, "seconds": round(secs, 1), "reason": why}
            if not ok:
                record["problems"].append(why)
                if server.poll() is not None:
                    died = "startup"
            else:
                progress(f"[{mode}] healthy after {secs:.0f}s; load for at most {opts.duration:.0f}s")
                record["load"], died = _drive_load(opts, mode, server, tail, log, result_file, load_log)
                time.sleep(opts.settle)
                log.feed_lines(tail.read_lines())
                if died is None and server.poll() is not None:
                    died = "after load"
                if died is None:
                    record["health_after_load"] = health(opts.port)
                    if not record["health_after_load"]:
                        record["problems"].append("/health failed after the load")
            record["server_exit_before_stop"] = server.poll()
    finally:
        log.feed_lines(tail.flush())
        record["server_exit"] = server.proc.returncode if server.proc else None
        record["leftover_pids"] = server.leftover
        record["seen_pids"] = sorted(server.seen)
        record["log_summary"] = log.summary()
    record["problems"] += _run_problems(record, died, log, server.leftover)
    record["crashed"] = bool(died or log.fatal)
    record["ok"] = not record["problems"]
    return record


def _run_problems(record: dict[str, Any], died: str | None, log: ServerLog, leftover: list[int]) -> list[str]:
    """What went wrong in a run, beyond the health checks ``run_mode`` recorded as it went."""
    problems = []
    if died:
        problems.append(f"the server died during {died} ({exit_description(record['server_exit_before_stop'])})")
    if log.fatal:
        problems.append(f"fatal errors in the server log: {', '.join(log.fatal)}")
    if log.counts.get("traceback"):
        problems.append(f"{log.counts['traceback']} Python traceback(s) in the server log")
    if leftover:
        problems.append(f"processes left behind: {leftover}")
    return problems


def load_env() -> dict[str, str]:
    """The load driver's environment: the operator's, no credential (it drives the server), ``SAFE_PATH``."""
    return {**without_credentials(dict(os.environ)), "PYTHONUNBUFFERED": "1", **SAFE_PATH}


def _drive_load(opts: ServerOptions, mode: str, server: Managed, tail: Tail, log: ServerLog,
                result_file: Path, load_log: Path) -> tuple[dict[str, Any], str | None]:
    argv = load_argv(opts, mode, result_file)
    env = load_env()
    load = Managed(f"load {mode}", argv, load_log, env=env, grace=opts.grace)
    start = time.monotonic()
    with load:
        end = _follow(server, tail, log, lambda: load.poll() is not None, opts.duration)
        died = "load" if end == "exited" or (end == "fatal" and server.poll() is not None) else None
    stopped = {"exited": "the server exited", "fatal": f"fatal error in the server log ({', '.join(log.fatal)})",
               "timeout": f"duration reached ({opts.duration:.0f}s)"}.get(end)
    code = load.proc.returncode if load.proc else None
    stdout = load_log.read_text(errors="replace") if load_log.is_file() else ""
    info = {"tool": opts.load, "argv": argv, "log": str(load_log), "result_file": str(result_file),
            "seconds": round(time.monotonic() - start, 1), "exit_code": code,
            "exit": exit_description(code), "stopped": stopped, "completed_run": stopped is None and code == 0,
            "summary": load_summary(opts.load, stdout, result_file), "leftover_pids": load.leftover}
    return info, died


def compare_modes(on: dict[str, Any], off: dict[str, Any]) -> dict[str, Any]:
    """Capacity gain, throughput and acceptance, envs on vs off."""
    runs = (("on", on), ("off", off))

    def decode(key: str) -> dict[str, Any]:
        return {mode: rec["log_summary"]["decode"][key] for mode, rec in runs}

    def load(key: str) -> dict[str, Any]:
        return {mode: ((rec.get("load") or {}).get("summary") or {}).get(key) for mode, rec in runs}

    # One source for both columns: the load tool's throughput where both runs have it, else the
    # server's own decode log (gen throughput); the decode log's accept len, else the load tool's.
    tput = load("output_throughput")
    tput = {**tput, "source": "load tool"} if None not in tput.values() else {
        **decode("gen_throughput_mean"), "source": "server decode log"}
    accept = decode("accept_len_mean")
    accept = {**accept, "source": "server decode log"} if None not in accept.values() else {
        **load("accept_length"), "source": "load tool"}
    cap = {mode: rec["log_summary"]["capacity"]["tokens"] for mode, rec in runs}
    gain = cap["on"] - cap["off"] if None not in cap.values() else None
    return {"capacity_tokens": cap, "capacity_gain_tokens": gain,
            "capacity_gain_pct": round(100.0 * gain / cap["off"], 2) if gain is not None and cap["off"] else None,
            "output_throughput": tput,
            "throughput_ratio": round(tput["on"] / tput["off"], 4) if tput["on"] is not None and tput["off"] else None,
            "accept_len": accept, "token_usage_max": decode("token_usage_max")}


def validate(opts: ServerOptions) -> None:
    """Refuse bad settings before starting anything."""
    if opts.tp < 1:
        raise C128Error("--tp must be >= 1")
    if not 1 <= opts.port <= 65535:
        raise C128Error(f"--port {opts.port} is not a TCP port")
    if opts.duration <= 0 or opts.health_timeout <= 0:
        raise C128Error("--duration and --health-timeout must be positive")
    bad = [m for m in opts.modes if m not in MODES]
    if bad or not opts.modes:
        raise C128Error(f"--modes takes on and/or off, not {', '.join(bad) or 'nothing'}")
    server_argv(opts)
    load_argv(opts, opts.modes[0], opts.out / "probe.jsonl")
    if opts.multiturn_script is not None and not opts.multiturn_script.is_file():
        raise C128Error(f"--multiturn-script: {opts.multiturn_script} does not exist")
    if not port_free(opts.port):
        raise C128Error(f"port {opts.port} on {HOST} is in use (another server?): pass --port")


def run_server_tier(opts: ServerOptions, command: str, progress: Progress = lambda _m: None) -> dict[str, Any]:
    validate(opts)
    report: dict[str, Any] = {"command": command, "tier": "server", "model_path": opts.model_path, "tp": opts.tp,
                              "port": opts.port, "compact": opts.compact, "preset": opts.preset,
                              "load_tool": opts.load, "duration_s": opts.duration, "max_requests": opts.max_requests,
                              "load_shape": dict(zip(("conversations", "turns"), load_shape(opts.max_requests))),
                              "modes": {}, "interrupted": None, "runs_target_code": UNSEALED}
    if opts.launcher is None:
        report["install"] = installed_sglang(opts.python)
        if not report["install"]["patched"] and not opts.allow_unpatched:
            raise C128Error(f"{report['install']['package']} is not a c128patch build (no provenance record); "
                            "pass --allow-unpatched to smoke an upstream install")
        gpus, why = nvidia_smi("name,memory.total")  # a prerequisite: refused before any server starts
        if len(gpus) < opts.tp:
            raise C128Error(f"the server needs {opts.tp} GPU(s) (--tp {opts.tp}); "
                            + (f"nvidia-smi lists {len(gpus)}" if gpus else f"no NVIDIA GPU here ({why})"))
    try:
        for mode in opts.modes:
            report["modes"][mode] = run_mode(opts, mode, progress)
            _conclude(report, opts.out)
    except BaseException as exc:
        report["interrupted"] = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        _conclude(report, opts.out)
        raise
    return report


def _conclude(report: dict[str, Any], out: Path) -> None:
    """The report's comparison, problems and verdict from its modes so far, written to ``out``."""
    modes = report["modes"]
    if "on" in modes and "off" in modes:
        report["comparison"] = compare_modes(modes["on"], modes["off"])
    report["crashed"] = any(m.get("crashed") for m in modes.values())
    report["problems"] = [f"{k}: {p}" for k, m in modes.items() for p in m.get("problems", [])]
    if report.get("interrupted"):
        report["problems"].append(f"interrupted ({report['interrupted']})")
    report["ok"] = not report["problems"] and bool(modes)
    write_json_atomic(out / REPORT, {**report, "schema": SCHEMA_VERSION})
