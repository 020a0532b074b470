"""smoke server without a GPU: upstream's real log formats parsed back, and the whole
on/off run driven against stand-in server and load processes (real subprocesses, real HTTP on
127.0.0.1): health timeout, crash detection, capacity, cleanup by pid, SIGINT/SIGTERM."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import smoke_upstream_formats as up
from c128patch.smoke import logs as smoke_logs
from c128patch.smoke import procs as smoke_procs
from c128patch.smoke import server as smoke_server
from smoke_helpers import alive, signal_when_ready
from support import invoke

STANDINS = Path(__file__).parent / "smoke_standins"
TOOLING = Path(__file__).resolve().parents[1] / "tooling"
TAG = "v0.5.23"
OFF, ON = 2_553_344, 3_167_232  # PR #32035's "full token size" without / with the online compressor
IMA = "NCCL: Cuda failure 'an illegal memory access was encountered'"  # bug 2's report (docs/pr-32035.md)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- upstream formats


@pytest.mark.parametrize("tag", ["v0.5.20", "v0.5.21", "v0.5.22", "v0.5.23"])
def test_capacity_and_decode_lines_parse_back(sglang_release_repo, tag):
    log = smoke_logs.ServerLog()
    log.feed(up.capacity_line(sglang_release_repo, tag, 987_654))
    log.feed(up.dsv4_line(sglang_release_repo, tag, ON, bytes_per_full_token=4321.75))
    log.feed(up.ready_line(sglang_release_repo, tag))
    for running, acc, tput, usage in ((32, 3.41, 1500.25, 0.42), (16, 2.59, 900.75, 0.96), (0, 0.0, 0.0, 0.10)):
        log.feed(up.decode_line(sglang_release_repo, tag, running=running, accept_len=acc, accept_rate=0.5,
                                throughput=tput, full_usage=usage))
    cap = log.capacity()
    assert cap["max_total_num_tokens"] == 987_654 and cap["dsv4_full_token"] == ON
    assert cap["tokens"] == ON and cap["source"] == "DSV4 memory calculation full_token"
    assert cap["dsv4"]["bytes_per_full_token"] == 4321.75
    dec = log.decode_stats()
    assert dec["decode_lines"] == 3 and dec["busy_lines"] == 2  # idle line (0 running) left out of the means
    assert dec["accept_len_mean"] == 3.0 and dec["gen_throughput_mean"] == 1200.5
    assert dec["token_usage_max"] == 0.96 and dec["running_req_max"] == 32
    assert log.ready and not log.fatal and not log.counts


def test_plain_token_usage_and_max_total_fallback(sglang_release_repo):
    log = smoke_logs.ServerLog()
    log.feed(up.capacity_line(sglang_release_repo, TAG, 555_000))
    log.feed(up.decode_line(sglang_release_repo, TAG, running=4, accept_len=1.75, accept_rate=0.2, throughput=42.0,
                            full_usage=0.33, hybrid_swa=False))
    assert log.capacity()["tokens"] == 555_000 and log.capacity()["source"] == "max_total_num_tokens"
    assert log.decode_stats()["token_usage_max"] == 0.33 and log.decode_stats()["accept_len_mean"] == 1.75


def test_crash_signatures(sglang_release_repo):
    check = up.runtime_check_message(sglang_release_repo, TAG, "/sgl/jit/csrc/deepseek_v4/c128_online_v2.cuh", 685,
                                     "RuntimeCheck(0 < extend_len && extend_len <= seq_len)")
    log = smoke_logs.ServerLog()
    log.feed_lines("\n".join([
        up.scheduler_exception_line(sglang_release_repo, TAG, "Traceback (most recent call last):"),
        '  File "x.py", line 1, in f',
        f"RuntimeError: {check}",
        IMA,
        "torch.AcceleratorError: CUDA error: an illegal memory access was encountered",
        "Traceback (most recent call last):",
    ]).splitlines())
    assert set(log.fatal) == {"illegal_memory_access", "cuda_error", "nccl", "runtime_check", "sglang_fatal"}
    assert log.counts["traceback"] == 1 and log.counts["illegal_memory_access"] == 2
    assert log.signatures["runtime_check"][0]["line"] == 3
    benign = smoke_logs.ServerLog()
    benign.feed_lines(["NCCL INFO Channel 00/24", "CUBLAS_STATUS_SUCCESS", "load weights: 100%"])
    assert not benign.fatal and not benign.counts


def test_bench_serving_summary_parses_back(sglang_release_repo):
    values = {"Successful requests:": 1920, "Benchmark duration (s):": 612.5,
              "Output token throughput (tok/s):": 4321.09, "Request throughput (req/s):": 3.13, "Accept length:": 3.37}
    text = "warming up\n" + up.bench_serving_summary(sglang_release_repo, TAG, values)
    parsed = smoke_logs.parse_bench_serving(text)
    assert {k + ":": parsed[k] for k in (v[:-1] for v in values)} == values
    summary = smoke_logs.load_summary("serving", text, Path("/nonexistent.jsonl"))
    assert summary == {"completed": 1920, "duration_s": 612.5, "output_throughput": 4321.09,
                       "request_throughput": 3.13, "accept_length": 3.37, "source": "printed summary"}


def test_bench_multiturn_summary():
    text = ("All requests completed\nPerformance metrics summary:\n"
            "  Total requests: 1920 at 16.0 requests per second\n  Average TTFT: 1.25\n"
            "  Output token throughput: 3210.50 tokens per second\n  Request Throughput: 1.57 requests per second\n")
    s = smoke_logs.load_summary("multiturn", text, Path("/nonexistent"))
    assert (s["completed"], s["output_throughput"], s["request_throughput"]) == (1920, 3210.5, 1.57)


def test_our_flags_and_envs_exist_upstream(sglang_release_repo, tmp_path):
    flags = up.server_flags(sglang_release_repo, TAG)
    for preset in smoke_server.PRESETS:
        opts = smoke_server.ServerOptions(model_path="/m", preset=preset, launcher=["srv"], out=tmp_path)
        used = [a for a in smoke_server.server_argv(opts) if a.startswith("--")]
        assert set(used) <= flags, set(used) - flags
    bench = up.bench_serving_flags(sglang_release_repo, TAG)
    opts = smoke_server.ServerOptions(model_path="/m", load_cmd=["b"], out=tmp_path)
    used = [a for a in smoke_server.load_argv(opts, "on", tmp_path / "r.jsonl") if a.startswith("--")]
    assert set(used) <= bench, set(used) - bench
    names = up.environ_names(sglang_release_repo, TAG)
    assert {"SGLANG_OPT_USE_ONLINE_COMPRESS", "SGLANG_RAGGED_VERIFY_MODE"} <= names
    # The DSPARK gate is what the PR (and our series) adds; upstream 0.5.23 has only the MTP one.
    assert "SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK" not in names and "SGLANG_EXPERIMENTAL_ONLINE_C128_MTP" in names


def test_server_command_and_envs(tmp_path):
    opts = smoke_server.ServerOptions(model_path="/models/dsv4-flash", tp=4, port=30123, compact=True,
                                      mem_fraction_static=0.8, server_args=("--hicache-storage-backend", "mooncake"),
                                      env={"SGLANG_DSPARK_RECORD_VERIFY_STREAMS": "1"}, python="py", out=tmp_path)
    argv = smoke_server.server_argv(opts)
    assert argv[:3] == smoke_server.module_argv("py", "sglang.launch_server")
    assert argv[argv.index("--tp-size") + 1] == "4" and argv[-4:] == ["--host", "127.0.0.1", "--port", "30123"]
    assert argv.count("--mem-fraction-static") == 1 and argv[argv.index("--mem-fraction-static") + 1] == "0.8"
    assert argv[argv.index("--speculative-algorithm") + 1] == "DSPARK"
    assert argv[argv.index("--moe-runner-backend") + 1] == "flashinfer_mxfp4"
    base = {"PATH": "/bin", "SGLANG_OPT_USE_ONLINE_COMPRESS": "1"}  # a stray setting must not leak into "off"
    on, off = smoke_server.server_env(opts, "on", base), smoke_server.server_env(opts, "off", base)
    assert {k: on[k] for k in smoke_server.ONLINE_ENVS} == {"SGLANG_OPT_USE_ONLINE_COMPRESS": "1",
                                                           "SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK": "1"}
    assert not set(smoke_server.ONLINE_ENVS) & set(off)
    assert on["SGLANG_RAGGED_VERIFY_MODE"] == off["SGLANG_RAGGED_VERIFY_MODE"] == "compact"
    assert off["SGLANG_DSPARK_RECORD_VERIFY_STREAMS"] == "1"


def test_the_server_and_load_launches_run_nothing_of_the_current_folder(tmp_path, monkeypatch):
    """`python -m sglang.launch_server` (and bench_serving) put the current folder first on sys.path: run from an
    upstream tree, its top-level runpy.py/json.py ran as the operator before sglang did. The launches the tool builds
    run the installed module with its arguments, and nothing of the folder they are started in (nor do its children
    on Python >= 3.11: PYTHONSAFEPATH)."""
    marker, here, site = tmp_path / "ran.txt", tmp_path / "tree", tmp_path / "site"
    here.mkdir(), (site / "sglang").mkdir(parents=True)
    for name in ("runpy.py", "json.py", "typing.py"):
        (here / name).write_text(f"open({str(marker)!r}, 'a').write({name!r} + ' ')\n")
    (site / "sglang" / "__init__.py").write_text("")
    for module in ("launch_server", "bench_serving"):  # each says its name, argv and whether a child sees the folder
        (site / "sglang" / f"{module}.py").write_text(
            "import json, subprocess, sys\nif __name__ == '__main__':\n"
            f"    open({str(marker)!r}, 'a').write({module!r} + ' ' + ' '.join(sys.argv[1:3]) + ' ')\n"
            "    subprocess.run([sys.executable, '-c', 'import json'])\n")
    monkeypatch.chdir(here)
    opts = smoke_server.ServerOptions(model_path="m", out=tmp_path / "out")
    base = {"PATH": os.environ["PATH"], "PYTHONPATH": str(site)}
    env = smoke_server.server_env(opts, "on", base)
    subprocess.run(smoke_server.server_argv(opts), env=env, check=True, timeout=60)
    monkeypatch.setenv("PYTHONPATH", str(site))
    subprocess.run(smoke_server.load_argv(opts, "on", tmp_path / "r.jsonl"), env=smoke_server.load_env(), check=True,
                   timeout=60)
    words = marker.read_text().split()
    assert words[:3] == ["launch_server", "--model-path", "m"] and words[3] == "bench_serving", words
    assert not {"runpy.py", "json.py", "typing.py"} & set(words), words  # (the children's: Python >= 3.11)


def test_load_is_bounded_by_max_requests():
    assert smoke_server.load_shape(None) == (64, 30)
    assert smoke_server.load_shape(200) == (64, 3)
    assert smoke_server.load_shape(10) == (10, 1)
    c, t = smoke_server.load_shape(1000)
    assert c * t <= 1000


def test_comparison_math():
    def mode(tokens, tput, acc, usage=0.9):
        return {"log_summary": {"capacity": {"tokens": tokens},
                                "decode": {"gen_throughput_mean": 1.0, "accept_len_mean": acc,
                                           "token_usage_max": usage}},
                "load": {"summary": {"output_throughput": tput}}}
    comp = smoke_server.compare_modes(mode(ON, 1100.0, 3.3), mode(OFF, 1000.0, 3.1))
    assert comp["capacity_gain_tokens"] == 613_888 and comp["capacity_gain_pct"] == 24.04
    assert comp["throughput_ratio"] == 1.1 and comp["output_throughput"]["source"] == "load tool"
    assert comp["accept_len"] == {"on": 3.3, "off": 3.1, "source": "server decode log"}
    missing = smoke_server.compare_modes(mode(None, None, None), mode(OFF, 0.0, None))
    assert missing["capacity_gain_tokens"] is None and missing["capacity_gain_pct"] is None
    # one run without a load summary: both columns come from the server log (1.0 / 1.0)
    assert missing["output_throughput"]["source"] == "server decode log" and missing["throughput_ratio"] == 1.0
    zero = smoke_server.compare_modes(mode(ON, 5.0, 3.0), mode(OFF, 0.0, 3.0))
    assert zero["throughput_ratio"] is None  # no division by a zero throughput


# --------------------------------------------------------------------------- real processes


@pytest.fixture
def fake(tmp_path, sglang_release_repo):
    """Config for the stand-ins, rendered from the release sources."""
    repo = sglang_release_repo

    def decode(acc, tput, usage):
        return up.decode_line(repo, TAG, running=32, accept_len=acc, accept_rate=0.5, throughput=tput, full_usage=usage)

    values = {"Successful requests:": 128, "Output token throughput (tok/s):": 2000.0, "Accept length:": 3.2}
    keys = up.bench_serving_result_keys(repo, TAG)
    result = {"completed": 128, "output_throughput": 2000.0, "accept_length": 3.2, "duration": 1.0}
    assert set(result) <= keys
    cfg = {
        "pidfile": str(tmp_path / "pids"), "envfile": str(tmp_path / "envs"),
        "ready_line": up.ready_line(repo, TAG),
        "modes": {
            "on": {"startup_lines": [up.capacity_line(repo, TAG, ON), up.dsv4_line(repo, TAG, ON)],
                   "decode_lines": [decode(3.3, 1100.0, 0.50), decode(3.5, 1300.0, 0.96)], "grandchild": True},
            "off": {"startup_lines": [up.capacity_line(repo, TAG, OFF), up.dsv4_line(repo, TAG, OFF)],
                    "decode_lines": [decode(3.1, 1000.0, 0.70)], "grandchild": True},
        },
        "load": {"flags": sorted(up.bench_serving_flags(repo, TAG)), "pidfile": str(tmp_path / "pids"),
                 "summary": up.bench_serving_summary(repo, TAG, values), "result": result},
    }

    class Fake:
        path = tmp_path / "fake.json"
        data = cfg

        def write(self) -> None:
            self.path.write_text(json.dumps(self.data))

        def pids(self) -> list[tuple[str, int]]:
            p = Path(self.data["pidfile"])
            return [(w, int(n)) for w, n in (ln.split() for ln in p.read_text().splitlines())] if p.exists() else []

        def envs(self) -> list[dict]:
            return [json.loads(ln) for ln in Path(self.data["envfile"]).read_text().splitlines()]

        def opts(self, **kw) -> smoke_server.ServerOptions:
            self.write()
            return smoke_server.ServerOptions(
                model_path="/models/dsv4", port=free_port(), duration=kw.pop("duration", 20.0),
                launcher=[sys.executable, str(STANDINS / "fake_server.py")],
                load_cmd=[sys.executable, str(STANDINS / "fake_load.py")], out=tmp_path / "out", settle=0.2,
                grace=5.0, **kw)

    os.environ["FAKE_CONFIG"] = str(Fake.path)
    yield Fake()
    os.environ.pop("FAKE_CONFIG", None)


def assert_all_gone(fake) -> None:
    pids = fake.pids()
    assert pids, "the stand-ins recorded no pids"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(alive(p) for _w, p in pids):
        time.sleep(0.05)
    assert not [(w, p) for w, p in pids if alive(p)]


def test_on_off_run_reports_capacity_gain_and_cleans_up(fake):
    report = smoke_server.run_server_tier(fake.opts(), "c128patch smoke server")
    assert report["ok"], report["problems"]
    on, off = report["modes"]["on"], report["modes"]["off"]
    assert on["health"]["ok"] and on["load"]["completed_run"] and on["load"]["summary"]["completed"] == 128
    assert on["load"]["summary"]["source"] == "result file"
    assert on["log_summary"]["capacity"]["tokens"] == ON and off["log_summary"]["capacity"]["tokens"] == OFF
    assert on["log_summary"]["ready"] and on["log_summary"]["decode"]["token_usage_max"] == 0.96
    comp = report["comparison"]
    assert comp["capacity_gain_tokens"] == ON - OFF and comp["capacity_gain_pct"] == 24.04
    assert comp["throughput_ratio"] == 1.0  # both loads reported 2000 tok/s
    # what the server got: envs on, then off; loopback; the PR's flags
    (e_on, e_off) = fake.envs()
    assert e_on["mode"] == "on" and e_on["env"]["SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK"] == "1"
    assert e_off["mode"] == "off" and "SGLANG_OPT_USE_ONLINE_COMPRESS" not in e_off["env"]
    assert "--speculative-algorithm" in e_on["argv"] and e_on["argv"][-4:-2] == ["--host", "127.0.0.1"]
    # the grandchildren escaped the process group; they are gone all the same
    assert [w for w, _p in fake.pids()].count("grandchild") == 2
    assert_all_gone(fake)
    assert (not on["leftover_pids"]
            and set(p for w, p in fake.pids() if w != "load") <= set(on["seen_pids"]) | set(off["seen_pids"]))
    saved = json.loads((fake.opts().out / "smoke-server.json").read_text())
    assert saved["comparison"] == comp


def test_health_wait_times_out(fake):
    fake.data["modes"]["on"]["health_delay"] = 60
    t0 = time.monotonic()
    report = smoke_server.run_server_tier(fake.opts(modes=("on",), health_timeout=2), "x")
    assert time.monotonic() - t0 < 15
    on = report["modes"]["on"]
    assert not on["health"]["ok"] and on["health"]["reason"] == "/health did not answer within 2s"
    assert "load" not in on and not on["crashed"] and not report["ok"]
    assert_all_gone(fake)


def test_crash_during_load_is_caught(fake, sglang_release_repo):
    """Bug 2's shape: minutes into the load, NCCL reports an illegal memory access; exit 137."""
    fake.data["modes"]["on"]["crash"] = {"after": 0.8, "lines": [IMA], "exit": 137}
    fake.data["load"]["hang"] = True
    report = smoke_server.run_server_tier(fake.opts(modes=("on",)), "x")
    on = report["modes"]["on"]
    assert on["crashed"] and report["crashed"] and not report["ok"]
    assert on["server_exit"] == 137 or on["server_exit_before_stop"] == 137
    assert {"illegal_memory_access", "nccl"} <= set(on["log_summary"]["fatal"])
    assert on["load"]["stopped"] in ("the server exited", "fatal error in the server log (illegal_memory_access, nccl)")
    assert any("fatal errors in the server log" in p for p in on["problems"])
    assert_all_gone(fake)


def test_runtime_check_while_server_keeps_running(fake, sglang_release_repo):
    """Bug 1's shape: the first verify dies at a RuntimeCheck; the scheduler logs it."""
    check = up.runtime_check_message(sglang_release_repo, TAG, "c128_online_v2.cuh", 685, "extend_len == 0")
    fake.data["modes"]["on"]["crash"] = {"after": 1.5, "lines": [
        up.scheduler_exception_line(sglang_release_repo, TAG, "Traceback (most recent call last):"),
        f"RuntimeError: {check}"]}
    fake.data["load"]["hang"] = True
    report = smoke_server.run_server_tier(fake.opts(modes=("on",)), "x")
    on = report["modes"]["on"]
    assert on["crashed"] and set(on["log_summary"]["fatal"]) == {"runtime_check", "sglang_fatal"}
    assert on["load"]["stopped"].startswith("fatal error in the server log")
    assert on["load"]["seconds"] < 10  # stopped early, not at the 20 s duration
    assert_all_gone(fake)


def test_server_exiting_at_startup(fake):
    fake.data["modes"]["on"]["health_delay"] = 60
    fake.data["modes"]["on"]["startup_lines"].append("torch.OutOfMemoryError: CUDA out of memory.")
    report = smoke_server.run_server_tier(fake.opts(modes=("on",), health_timeout=30), "x")
    on = report["modes"]["on"]
    assert on["health"]["reason"] == "the server logged out_of_memory while starting" and on["crashed"]
    assert_all_gone(fake)


def test_load_is_bounded_by_duration(fake):
    fake.data["load"]["hang"] = True
    report = smoke_server.run_server_tier(fake.opts(modes=("off",), duration=1.5), "x")
    off = report["modes"]["off"]
    assert off["load"]["stopped"] == "duration reached (2s)" and not off["load"]["completed_run"]
    assert off["load"]["seconds"] < 6 and not off["crashed"]
    assert off["log_summary"]["decode"]["gen_throughput_mean"] == 1000.0  # from the server log instead
    assert_all_gone(fake)


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 128 + signal.SIGTERM)])
def test_signal_stops_everything(fake, tmp_path, sig, code):
    fake.data["load"]["hang"] = True
    opts = fake.opts()
    cmd = [sys.executable, "-m", "c128patch", "smoke", "server", "--model-path", "/models/dsv4",
           "--port", str(opts.port), "--launcher", " ".join(opts.launcher), "--load-cmd", " ".join(opts.load_cmd),
           "--out", str(opts.out), "--duration", "60"]
    signal_when_ready(cmd, {**os.environ, "PYTHONPATH": str(TOOLING)},
                      lambda: "load" in [w for w, _p in fake.pids()], sig, code, poll=0.1)
    assert_all_gone(fake)
    partial = json.loads((opts.out / "smoke-server.json").read_text())
    assert partial["interrupted"] and not partial["ok"]


def test_an_exception_mid_run_stops_everything(fake, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("load tool blew up")

    monkeypatch.setattr(smoke_server, "_drive_load", broken)
    opts = fake.opts(modes=("on",))
    with pytest.raises(RuntimeError, match="load tool blew up"):
        smoke_server.run_server_tier(opts, "x")
    assert_all_gone(fake)
    partial = json.loads((opts.out / "smoke-server.json").read_text())
    assert partial["interrupted"] == "RuntimeError: load tool blew up" and not partial["ok"]


def test_port_in_use_is_refused_before_starting(fake, tmp_path):
    opts = fake.opts()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", opts.port))
        busy.listen()
        res = invoke("smoke", "server", "--model-path", "/m", "--port", str(opts.port),
                     "--launcher", " ".join(opts.launcher), "--out", str(tmp_path / "o"), as_json=False)
    assert res.code == 2 and res.err.strip() == (
        f"c128patch: error: port {opts.port} on 127.0.0.1 is in use (another server?): pass --port")
    assert fake.pids() == []


def test_refuses_an_unpatched_install(tmp_path, monkeypatch):
    pkg = tmp_path / "site" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise SystemExit('must not be imported')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    info = smoke_server.installed_sglang(sys.executable)
    assert info["package"] == str(pkg) and not info["patched"]
    res = invoke("smoke", "server", "--model-path", "/m", "--port", str(free_port()),
                 "--out", str(tmp_path / "o"), as_json=False)
    assert res.code == 2 and "is not a c128patch build" in res.err
    (pkg / "c128patch_provenance.json").write_text(json.dumps({"series": {"name": "c128"}, "upstream": {},
                                                               "entries": []}))
    assert smoke_server.installed_sglang(sys.executable)["patched"]


def test_a_checkout_folder_named_sglang_is_not_an_install(tmp_path, monkeypatch):
    """Run where `apply` made ./sglang (a folder without __init__.py), `python -c` found it as a namespace
    package: smoke said "<cwd>/sglang is not a c128patch build (no provenance record)" of a patched checkout."""
    (tmp_path / "sglang" / "python" / "sglang").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    res = invoke("smoke", "server", "--model-path", "/m", "--port", str(free_port()),
                 "--out", str(tmp_path / "o"), as_json=False)
    assert res.code == 2, res.err
    assert res.err.strip() == (f"c128patch: error: sglang is not installed for {sys.executable} ({tmp_path / 'sglang'} "
                               "is a folder, not the package): install the patched build (c128patch wheel) first")


def test_no_gpu_is_a_missing_prerequisite_and_nothing_starts(tmp_path, monkeypatch):
    """docs/smoke.md: a missing prerequisite is one line, exit 2, nothing started. On a GPU-less machine smoke
    started the real server twice (on, off), each died, and it said `crashed`, exit 1."""
    pkg = tmp_path / "site" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise SystemExit('must not be imported')\n")
    (pkg / "c128patch_provenance.json").write_text(json.dumps({"series": {"name": "c128"}, "upstream": {},
                                                               "entries": []}))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    started = []

    def run_mode(opts, mode, progress):
        started.append(mode)
        raise KeyboardInterrupt  # as if stopped at once: the server would have started here

    monkeypatch.setattr(smoke_server, "run_mode", run_mode)
    for gpus, why, said in (([], "nvidia-smi not found", "no NVIDIA GPU here (nvidia-smi not found)"),
                            ([("H200", "143771 MiB")], "", "nvidia-smi lists 1")):
        monkeypatch.setattr(smoke_server, "nvidia_smi", lambda fields, rows=gpus, why=why: (rows, why), raising=False)
        res = invoke("smoke", "server", "--model-path", "/m", "--tp", "4", "--port", str(free_port()),
                     "--out", str(tmp_path / "o"), as_json=False)
        assert res.code == 2 and res.err.strip() == f"c128patch: error: the server needs 4 GPU(s) (--tp 4); {said}"
    assert not started and not (tmp_path / "o").exists()


def test_server_options_refused(tmp_path):
    def refused(args, text):
        res = invoke("smoke", "server", *args, as_json=False)
        assert res.code == 2 and text in res.err, res.err
    refused([], "Missing option '--model-path'")
    refused(["--model-path", "/m", "--tree", "x"], "No such option '--tree'")
    refused(["--model-path", "/m", "--modes", "on,sideways", "--launcher", "x"], "--modes takes on and/or off")
    refused(["--model-path", "/m", "--load", "multiturn", "--launcher", "x"],
            "--load multiturn needs --multiturn-script")
    refused(["--model-path", "/m", "--max-requests", "0", "--launcher", "x"], "--max-requests must be >= 1")


def test_a_reused_pid_is_never_signalled(tmp_path):
    """A pid seen under us that now belongs to another process (reuse) is left alone."""
    managed = smoke_procs.Managed("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"],
                                  tmp_path / "log").start()
    bystander = subprocess.Popen(["sleep", "60"])  # not ours
    try:
        managed.seen[bystander.pid] = 1  # as if a process of ours had held this pid, started at tick 1
        managed.stop(grace=2)
        assert not alive(managed.pid) and managed.proc.returncode == -signal.SIGTERM
        assert bystander.poll() is None and managed.leftover == []
    finally:
        bystander.kill()
        bystander.wait()


def test_grace_is_how_long_a_stop_waits_before_sigkill(tmp_path):
    """A process that ignores SIGTERM is killed after the Managed's grace, not a fixed 15 s."""
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    managed = smoke_procs.Managed("stubborn", [sys.executable, "-c", code], tmp_path / "log", grace=0.5).start()
    deadline = time.monotonic() + 10
    while "up" not in (tmp_path / "log").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    t0 = time.monotonic()
    managed.stop()
    assert time.monotonic() - t0 < 8 and managed.proc.returncode == -signal.SIGKILL


def test_server_options_grace_reaches_every_process(fake, monkeypatch):
    """ServerOptions.grace is the grace of the server's and the load tool's stop."""
    made: list[smoke_procs.Managed] = []

    class Spy(smoke_procs.Managed):
        def start(self) -> smoke_procs.Managed:
            made.append(self)
            return super().start()

    monkeypatch.setattr(smoke_server, "Managed", Spy)
    opts = fake.opts(modes=("on",), duration=3.0)
    opts.grace = 1.25
    smoke_server.run_server_tier(opts, "x")
    assert sorted(m.name for m in made) == ["load on", "server on"]
    assert {m.grace for m in made} == {1.25}
    assert_all_gone(fake)


@pytest.mark.parametrize("extra", [[], ["--port", "0"]])
def test_refused_server_calls_leave_no_temp_folder(tmp_path, monkeypatch, extra):
    """Without --out the report folder is a temporary one; a call refused before any report (no
    patched sglang for --python, a bad option) removes it."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    res = invoke("smoke", "server", "--model-path", "/models/dsv4", "--python", sys.executable, *extra,
                 as_json=False)
    assert res.code == 2, (res.code, res.err)
    assert res.err.startswith("c128patch: error: ")
    assert not list(tmp_path.glob("c128patch-smoke-server-*"))


def test_grace_is_an_option_of_smoke_server_with_the_options_default():
    from dataclasses import fields

    from c128patch.cli.smoke.server import command

    grace = next(p for p in command.params if p.name == "grace")
    assert grace.default == next(f.default for f in fields(smoke_server.ServerOptions) if f.name == "grace") == 30.0


def test_smokes_unsealed_children_see_no_credential_of_the_operator(monkeypatch, tmp_path):
    """Helper 147: smoke runs the patched tree's code as the operator, unsealed (its pytest passes, the server, the load
    driver): each was given the whole environment, GITHUB_TOKEN, AWS_SECRET_ACCESS_KEY, SSH_AUTH_SOCK and the like.
    None is now (the server keeps only the Hub's token, for a gated model; ``--env`` still sets what it is given)."""
    from c128patch.smoke import server as smoke_server
    from c128patch.smoke.passes import PassSpec, pytest_env

    secrets = {"GITHUB_TOKEN": "g", "GH_TOKEN": "g", "AWS_SECRET_ACCESS_KEY": "a", "AWS_ACCESS_KEY_ID": "i",
               "SSH_AUTH_SOCK": "/s", "MY_PASSWORD": "p", "NVIDIA_API_KEY": "n", "HF_TOKEN": "h"}
    for key, value in {**secrets, "CUDA_VISIBLE_DEVICES": "0", "TOKENIZERS_PARALLELISM": "false"}.items():
        monkeypatch.setenv(key, value)
    env = pytest_env(PassSpec("patched", tmp_path), tmp_path / "rows", tmp_path / "results")
    assert not set(secrets) & set(env) and env["CUDA_VISIBLE_DEVICES"] == "0", sorted(env)
    assert env["TOKENIZERS_PARALLELISM"] == "false"
    opts = smoke_server.ServerOptions(model_path="m", env={"MY_API_KEY": "given"})
    env = smoke_server.server_env(opts, "on")
    assert set(secrets) & set(env) == {"HF_TOKEN"} and env["MY_API_KEY"] == "given", sorted(env)


def test_smokes_probes_run_no_module_of_the_current_folder(monkeypatch, tmp_path):
    """Helper 147: smoke's probes of the Python it runs (``python -c``: the current folder first on sys.path) ran a
    top-level ``json.py`` or ``typing.py`` of the folder smoke was run from (an upstream tree's), as the operator, its
    tokens in the environment (as doctor's did, helper 139)."""
    import sys

    from c128patch.errors import C128Error
    from c128patch.smoke import server as smoke_server
    from c128patch.smoke.device import probe_python

    marker = tmp_path / "ran.txt"
    for name in ("json.py", "typing.py", "platform.py", "importlib.py"):
        (tmp_path / name).write_text(f"open({str(marker)!r}, 'a').write({name!r})\n")
    monkeypatch.chdir(tmp_path)
    probe_python(sys.executable)
    with contextlib.suppress(C128Error):
        smoke_server.installed_sglang(sys.executable)
    assert not marker.exists(), marker.read_text()


def test_a_rows_line_the_target_wrote_past_pythons_digit_limit_or_nested_deep_is_left_out(tmp_path):
    """Helper 173: the rows file (written by the target's code during a smoke run) was read catching only
    JSONDecodeError: a 5000-digit integer (a ValueError) or a line nested 10000 deep (RecursionError) ended the run
    in a traceback. Such a line is left out, as a line a kill cut."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text(f'{{"event": "start"}}\n{{"n": {"9" * 5000}}}\n{"[" * 10000}{"]" * 10000}\n{{"event": "finish"}}\n')
    assert smoke_logs.read_jsonl(rows) == [{"event": "start"}, {"event": "finish"}]
