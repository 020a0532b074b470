"""smoke kernel on a CPU machine: prerequisites, real pytest passes of throwaway GPU-marked
suites (rows, skips, crashes, timeouts, differential, sanitizer plumbing), trees and wheels."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import pytest

from c128patch.smoke import device as smoke_device
from c128patch.smoke import passes as smoke_pass
from c128patch.smoke import trees as smoke_trees
from smoke_helpers import H200, alive, make_suite, make_tree, one_line_error, provenance_record, signal_when_ready
from support import invoke as run_cli

TOOLING = Path(__file__).resolve().parents[1] / "tooling"


@pytest.fixture(autouse=True)
def _quick_child_pytest(monkeypatch):
    """The suites' pytest children skip this machine's unrelated plugins (startup time)."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


def invoke(args: list[str], device: dict | None = None, monkeypatch: pytest.MonkeyPatch | None = None):
    if device is not None:
        assert monkeypatch is not None
        monkeypatch.setattr(smoke_device, "probe_device", lambda python: dict(device))
    return run_cli("smoke", "kernel", *args, as_json=False)


# --------------------------------------------------------------------------- prerequisites


@pytest.mark.parametrize("change, contains", [
    ({"torch_error": "ModuleNotFoundError: No module named 'torch'"}, "torch does not import"),
    ({"torch": "2.13.0+cpu", "torch_cuda": None}, "is a CPU build"),
    ({"cuda_available": False}, "sees no CUDA GPU"),
    ({"nvcc": None}, "nvcc not found"),
    ({"nvcc_version": "12.8"}, "torch is built for CUDA 13.0 but nvcc is 12.8"),
    ({"tvm_ffi": None, "tvm_ffi_error": "ModuleNotFoundError: No module named 'tvm_ffi'"}, "tvm_ffi does not import"),
    ({"python_error": "/nope/python: No such file"}, "cannot run the suite's Python"),
    ({"pytest_error": "ModuleNotFoundError: No module named 'pytest'"}, "pytest does not import"),
])
def test_missing_prerequisite_is_one_line_and_nothing_runs(tmp_path, monkeypatch, change, contains):
    suite = make_suite(tmp_path / "suite", {"test_a.py": "def test_a():\n    raise SystemExit('must not run')\n"})
    tree = make_tree(tmp_path / "tree")
    out = tmp_path / "out"
    device = {**H200, **change}
    res = invoke(["--tree", str(tree), "--suite", str(suite), "--out", str(out)], device, monkeypatch)
    one_line_error(res, contains)
    assert not out.exists()  # refused before running anything


def test_sanitizer_needs_compute_sanitizer(tmp_path, monkeypatch):
    suite = make_suite(tmp_path / "suite", {"test_a.py": "def test_a():\n    pass\n"})
    res = invoke(["--tree", str(make_tree(tmp_path / "tree")), "--suite", str(suite), "--sanitizer", "memcheck"],
                 H200, monkeypatch)
    one_line_error(res, "compute-sanitizer not found")


def test_h200_description_passes_the_check():
    assert smoke_device.prerequisite_problem(H200) is None
    assert smoke_device.prerequisite_problem({**H200, "compute_sanitizer": "/x/cs"}, ("memcheck",)) is None


def test_the_probe_says_when_pytest_does_not_import_in_the_suites_python(tmp_path, monkeypatch):
    """The suite runs as `python -m pytest`: a --python without pytest (a serving venv, the behavioural tier's
    environment) ran nothing, and `--list` said only "collected no test" with no reason."""
    blocker = tmp_path / "no-pytest"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text("import sys\nsys.modules['pytest'] = None  # as if not installed\n")
    monkeypatch.setenv("PYTHONPATH", str(blocker))
    probe = smoke_device.probe_python(sys.executable)
    assert "pytest" in probe["pytest_error"]
    assert smoke_device.prerequisite_problem({**H200, **probe}).startswith("pytest does not import")


def test_a_list_that_collects_no_test_leaves_no_temporary_folder(tmp_path, monkeypatch):
    """``smoke kernel --list`` that collects nothing (a suite with no test, or torch missing) failed in one line and
    left the temporary folder it made, unsaid. It is removed; a folder given with --out stays."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    suite, tree = make_suite(tmp_path / "suite", {"test_a.py": "X = 1\n"}), make_tree(tmp_path / "tree")
    one_line_error(invoke(["--list", "--tree", str(tree), "--suite", str(suite)]), "--list collected no test")
    assert list(scratch.iterdir()) == []
    one_line_error(invoke(["--list", "--tree", str(tree), "--suite", str(suite), "--out", str(tmp_path / "out")]),
                   "--list collected no test")
    assert (tmp_path / "out").is_dir()


def test_real_probe_of_this_machine():
    """Not monkeypatched: this CPU machine has torch 2.13 CPU, nvcc 13.0 and tvm_ffi."""
    device = smoke_device.probe_device(sys.executable)
    assert device["python"] == ".".join(map(str, sys.version_info[:3]))
    problem = smoke_device.prerequisite_problem(device)
    try:
        import torch
    except ImportError:
        assert "torch does not import" in problem
        return
    if torch.version.cuda is None:
        assert problem == f"torch {torch.__version__} is a CPU build (torch.version.cuda is None); install a CUDA build"
    elif not torch.cuda.is_available():
        assert "sees no CUDA GPU" in problem


def test_bad_inputs_refused(tmp_path, monkeypatch):
    suite = make_suite(tmp_path / "suite", {"test_a.py": "def test_a():\n    pass\n"})
    one_line_error(invoke(["--tree", str(tmp_path / "nope"), "--suite", str(suite)], H200, monkeypatch),
                   "does not exist")
    (tmp_path / "plain").mkdir()
    one_line_error(invoke(["--tree", str(tmp_path / "plain"), "--suite", str(suite)], H200, monkeypatch),
                   "holds neither python/sglang/ nor sglang/")
    one_line_error(invoke(["--suite", str(suite)], H200, monkeypatch), "--tree PATH or --wheel FILE")
    one_line_error(invoke(["--tree", str(make_tree(tmp_path / "t")), "--suite", str(tmp_path / "plain")], H200,
                          monkeypatch),
                   "no GPU suite")
    not_zip = tmp_path / "x.whl"
    not_zip.write_text("no")
    one_line_error(invoke(["--wheel", str(not_zip), "--suite", str(suite)], H200, monkeypatch), "not a wheel")


# --------------------------------------------------------------------------- real passes


SUITE_BASIC = {
    "test_basic.py": '''
        import json, os
        from pathlib import Path
        import pytest
        from conftest import write_result

        def test_sees_harness_env(patched_tree):
            assert (patched_tree / "sglang" / "kernels" / "jit").is_dir()
            write_result("env", {"scale": os.environ["C128PATCH_GPU_SCALE"],
                                 "upstream": os.environ.get("C128PATCH_UPSTREAM_TREE"),
                                 "caching": os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING")})

        def test_skips_without_gpu(patched_tree):
            pytest.skip("GPU tier: torch sees no CUDA GPU")

        def test_fails(patched_tree):
            assert 1 == 2, "wrong bytes"

        @pytest.fixture
        def broken():
            raise RuntimeError("setup broke")

        def test_setup_error(broken):
            pass

        @pytest.mark.xfail(reason="known", strict=True)
        def test_xfail(patched_tree):
            assert False
    ''',
}


def test_report_from_a_real_run(tmp_path, monkeypatch):
    suite = make_suite(tmp_path / "suite", SUITE_BASIC)
    tree = make_tree(tmp_path / "tree", provenance_record())
    out = tmp_path / "out"
    res = invoke(["--tree", str(tree), "--suite", str(suite), "--out", str(out), "--scale", "0.5", "--json"],
                 H200, monkeypatch)
    assert res.code == 1, res.err  # a failing test fails the command
    report = json.loads(res.text)
    assert report == json.loads((out / "smoke-kernel.json").read_text())
    assert report["command"].startswith("c128patch smoke kernel --tree ")
    assert report["device"]["gpu"] == "NVIDIA H200" and report["tree"] == str((tree / "python").resolve())
    assert report["provenance"]["series"]["name"] == "c128" and report["series"]["version"] == "1"
    assert [e["gate"] for e in report["provenance"]["entries"]] == ["", "SGLANG_DSPARK_RECORD_VERIFY_STREAMS"]
    by = {t["nodeid"]: t for t in report["tests"]}
    assert {k: v["outcome"] for k, v in by.items()} == {
        "test_basic.py::test_sees_harness_env": "passed",
        "test_basic.py::test_skips_without_gpu": "skipped",
        "test_basic.py::test_fails": "failed",
        "test_basic.py::test_setup_error": "error",
        "test_basic.py::test_xfail": "xfailed",
    }
    assert by["test_basic.py::test_skips_without_gpu"]["message"] == "GPU tier: torch sees no CUDA GPU"
    assert "wrong bytes" in by["test_basic.py::test_fails"]["message"]
    assert "setup broke" in by["test_basic.py::test_setup_error"]["message"]
    assert all("gpu" in t["markers"] for t in report["tests"])
    assert (report["passed"], report["failed"], report["skipped"], report["errors"]) == (1, 1, 1, 1)
    env = report["passes"]["patched"]["results"]["env"]
    assert env == {"scale": "0.5", "upstream": None, "caching": None}
    assert report["sanitizer"] is None and not report["ok"]
    assert any("1 failed" in p and "1 error" in p for p in report["problems"])
    assert (out / "junit-patched.xml").is_file() and (out / "pytest-patched.log").is_file()


def test_a_suite_that_only_skips_is_not_ok(tmp_path, monkeypatch):
    """Where the GPU is missing after all, every test skips with the reason: not a pass."""
    suite = make_suite(tmp_path / "suite", {"test_s.py": "def test_a(patched_tree):\n    pass\n"})
    monkeypatch.setenv("FAKE_NO_GPU", "1")
    res = invoke(["--tree", str(make_tree(tmp_path / "tree")), "--suite", str(suite), "--json"], H200, monkeypatch)
    assert res.code == 1
    report = json.loads(res.text)
    assert report["tests"][0]["outcome"] == "skipped"
    assert report["tests"][0]["message"] == "GPU tier: torch sees no CUDA GPU"
    assert report["problems"] == ["patched: no test passed (1 skipped)"]
    assert report["provenance"] is None and "no provenance record" in report["notes"][0]


def test_all_passing_run_prints_a_table(tmp_path, monkeypatch):
    suite = make_suite(tmp_path / "suite", {"test_ok.py": "def test_one(patched_tree):\n    pass\n"})
    res = invoke(["--tree", str(make_tree(tmp_path / "tree", provenance_record())), "--suite", str(suite),
                  "--out", str(tmp_path / "out")], H200, monkeypatch)
    assert res.code == 0, res.text + res.err
    assert "test_ok.py::test_one" in res.text and "passed" in res.text
    assert "series c128 1 (2 entries) on upstream v0.5.23" in res.text
    assert "OK  report:" in res.text


def test_crash_names_the_test_that_took_the_process_down(tmp_path):
    suite = make_suite(tmp_path / "suite", {"test_crash.py": '''
        import os, signal
        def test_a_before(patched_tree):
            pass
        def test_b_illegal_access(patched_tree):
            os.kill(os.getpid(), signal.SIGSEGV)
        def test_c_after(patched_tree):
            pass
    '''})
    tree = make_tree(tmp_path / "tree") / "python"
    spec = smoke_pass.PassSpec("patched", tree)
    res = smoke_pass.run_passes([spec], suite, sys.executable, tmp_path / "out")["patched"]
    outcomes = {t["nodeid"].split("::")[1]: t["outcome"] for t in res["tests"]}
    assert outcomes == {"test_a_before": "passed", "test_b_illegal_access": "crashed", "test_c_after": "not run"}
    assert res["exit_code"] == -11 and res["exit"] == "killed by SIGSEGV" and not res["finished"]
    problems = smoke_pass.pass_problems(res)
    assert "patched: 1 crashed" in problems and any("did not finish" in p for p in problems)


def test_timeout_kills_the_pass_and_leaves_nothing(tmp_path):
    pidfile = tmp_path / "pids"
    suite = make_suite(tmp_path / "suite", {"test_slow.py": f'''
        import os, subprocess, time
        def test_hangs(patched_tree):
            child = subprocess.Popen(["sleep", "300"])          # a stray process of the test
            open({str(pidfile)!r}, "w").write(f"{{os.getpid()}} {{child.pid}}")
            time.sleep(300)
    '''})
    tree = make_tree(tmp_path / "tree") / "python"
    spec = smoke_pass.PassSpec("patched", tree, timeout=2)
    res = smoke_pass.run_passes([spec], suite, sys.executable, tmp_path / "out")[spec.label]
    assert res["timed_out"] and res["exit"] == "timed out after 2s"
    assert res["tests"][0]["outcome"] == "crashed" and res["tests"][0]["message"] == "killed at the pass timeout"
    pids = [int(p) for p in pidfile.read_text().split()]
    assert not any(alive(p) for p in pids), pids
    assert "leftover_pids" not in res


SUITE_DIFF = {
    "test_diff.py": '''
        import pytest
        def test_zero_row_plan(patched_tree):
            # the series' fix: present only in the patched tree
            if not (patched_tree / "sglang" / "FIXED").exists():
                raise RuntimeError("Failed at c128_online_v2.cuh:685: extend_len == 0")
        def test_shared_path(patched_tree):
            pass
        def test_needs_upstream(patched_tree):
            import os
            if not os.environ.get("C128PATCH_UPSTREAM_TREE"):
                pytest.skip("GPU tier: C128PATCH_UPSTREAM_TREE is not set")
        def test_series_module(patched_tree):
            # code only the series has: upstream lacks the module
            import importlib, sys
            sys.path.insert(0, str(patched_tree))
            for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
                del sys.modules[name]
            importlib.import_module("sglang.c128_series_only")
        def test_series_name(patched_tree):
            # a name only the series' version of a module has
            text = (patched_tree / "sglang" / "shared_mod.py").read_text()
            if "series_symbol" not in text:
                raise ImportError("cannot import name 'series_symbol' from 'sglang.shared_mod' (x)")
        def test_missing_third_party(patched_tree):
            # a module neither tree has is not the series' code: a failure like any other
            if not (patched_tree / "sglang" / "FIXED").exists():
                raise ModuleNotFoundError("No module named 'flashinfer'")
    ''',
}


def _series_and_upstream_trees(tmp_path: Path) -> tuple[Path, Path]:
    patched = make_tree(tmp_path / "patched", provenance_record(), marker="FIXED")
    (patched / "python" / "sglang" / "c128_series_only.py").write_text("X = 1\n")
    (patched / "python" / "sglang" / "shared_mod.py").write_text("def series_symbol():\n    pass\n")
    upstream = make_tree(tmp_path / "upstream")
    (upstream / "python" / "sglang" / "shared_mod.py").write_text("def other():\n    pass\n")
    return patched, upstream


def test_differential_columns_and_verdicts(tmp_path, monkeypatch):
    make_suite(tmp_path / "suite", SUITE_DIFF)
    _, upstream = _series_and_upstream_trees(tmp_path)
    monkeypatch.chdir(tmp_path)  # relative paths: the suite runs in its own folder
    res = invoke(["--tree", "patched", "--upstream-tree", "upstream", "--differential", "--suite", "suite",
                  "--json", "--out", "out"], H200, monkeypatch)
    assert res.code == 0, res.text + res.err
    report = json.loads(res.text)
    cols = {t["nodeid"].split("::")[1]: (t["outcome"], t["upstream"], t["verdict"]) for t in report["tests"]}
    assert cols == {
        "test_zero_row_plan": ("passed", "failed", "fixed"),
        "test_shared_path": ("passed", "passed", "same"),
        "test_needs_upstream": ("passed", "passed", "same"),
        "test_series_module": ("passed", "failed", "n/a"),
        "test_series_name": ("passed", "failed", "n/a"),
        "test_missing_third_party": ("passed", "failed", "fixed"),
    }
    assert report["differential"]["summary"] == {"same": 2, "fixed": 2, "n/a": 2, "regressed": 0, "differs": 0}
    needs = {t["nodeid"].split("::")[1]: t.get("needs") for t in report["tests"]}
    assert needs["test_series_module"] == "module sglang.c128_series_only"
    assert needs["test_series_name"] == "sglang.shared_mod.series_symbol"
    assert needs["test_zero_row_plan"] is None
    assert report["upstream_how"] == "--upstream-tree" and report["ok"]
    assert report["passes"]["upstream"]["tree"] == str((upstream / "python").resolve())


def test_differential_regression_fails(tmp_path, monkeypatch):
    suite = make_suite(tmp_path / "suite", {"test_r.py": '''
        def test_broken_by_series(patched_tree):
            assert not (patched_tree / "sglang" / "FIXED").exists()
        def test_other(patched_tree):
            pass
    '''})
    res = invoke(["--tree", str(make_tree(tmp_path / "p", marker="FIXED")), "--upstream-tree",
                  str(make_tree(tmp_path / "u")), "--differential", "--suite", str(suite), "--json"], H200, monkeypatch)
    assert res.code == 1
    report = json.loads(res.text)
    assert report["differential"]["summary"]["regressed"] == 1
    assert "differential: 1 test(s) pass upstream and fail patched" in report["problems"]


def test_a_differential_over_failing_tests_headlines_the_failures(tmp_path, monkeypatch):
    """Issue 38: tests failing on both trees are "same" (the unpatched side lacks our module), so the
    differential reads "0 regressed"; the printed verdict leads with the failures instead."""
    suite = make_suite(tmp_path / "suite", {"test_f.py": '''
        def test_needs_our_module(patched_tree):
            assert False, "our module is broken"
        def test_ok(patched_tree):
            pass
    '''})
    patched, upstream = _series_and_upstream_trees(tmp_path)
    res = invoke(["--tree", str(patched), "--upstream-tree", str(upstream), "--differential", "--suite", str(suite),
                  "--out", str(tmp_path / "out")], H200, monkeypatch)
    assert res.code == 1, res.text + res.err
    lines = [line for line in res.text.splitlines() if line.strip()]
    assert lines[0].startswith("FAILING: 1 of 2 test(s) fail on the patched tree: test_f.py::test_needs_our_module")
    diff = next(line for line in lines if line.startswith("differential: "))
    assert diff.startswith("differential: 1 of 2 fail on the patched tree (1 on both: same); "), diff
    assert "0 regressed" in diff and not diff.startswith("differential: 0 regressed")


def test_an_all_passing_differential_has_no_failing_headline(tmp_path, monkeypatch):
    suite = make_suite(tmp_path / "suite", {"test_ok.py": "def test_one(patched_tree):\n    pass\n"})
    patched, upstream = _series_and_upstream_trees(tmp_path)
    res = invoke(["--tree", str(patched), "--upstream-tree", str(upstream), "--differential", "--suite", str(suite),
                  "--out", str(tmp_path / "out")], H200, monkeypatch)
    assert res.code == 0, res.text + res.err
    assert "FAILING" not in res.text and "differential: 1 same, 0 fixed" in res.text


def test_differential_without_upstream_is_refused(tmp_path, monkeypatch):
    suite = make_suite(tmp_path / "suite", {"test_a.py": "def test_a():\n    pass\n"})
    plain = make_tree(tmp_path / "tree")  # no provenance, not in git
    one_line_error(invoke(["--tree", str(plain), "--differential", "--suite", str(suite)], H200, monkeypatch),
                   "no provenance record naming its upstream; pass --upstream-tree")


# --------------------------------------------------------------------------- compute-sanitizer

MEMCHECK_ERRORS = """\
========= COMPUTE-SANITIZER
test_x.py .
========= Invalid __global__ write of size 4 bytes
=========     at compress_online_prefill_kernel+0x2a0 in c128_online_v2.cuh:412
=========     by thread (5,0,0) in block (3,0,0)
=========     Address 0x7f3c1a000200 is out of bounds
=========     and is 512 bytes after the nearest allocation at 0x7f3c1a000000 of size 512 bytes
=========
========= Program hit cudaErrorLaunchFailure (error 719) due to "unspecified launch failure" on CUDA API call \
to cudaStreamSynchronize.
=========
========= ERROR SUMMARY: 2 errors
"""
MEMCHECK_CHILD_CLEAN = "========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n"
RACECHECK = """\
========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at 0x1c0 in mtp_commit_kernel(float *, int)
=========     and Read access at 0x1e0 in mtp_commit_kernel(float *, int) [4 hazards]
=========
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
========= COMPUTE-SANITIZER
========= RACECHECK SUMMARY: 2 hazards displayed (0 errors, 2 warnings)
"""


def test_sanitizer_summaries_parse():
    found = smoke_pass.parse_sanitizer(MEMCHECK_ERRORS + MEMCHECK_CHILD_CLEAN, "memcheck")
    assert found["errors"] == 2 and found["processes"] == 2 and found["error_summaries"] == [2, 0]
    assert found["reports"] == [
        "Invalid __global__ write of size 4 bytes",
        'Program hit cudaErrorLaunchFailure (error 719) due to "unspecified launch failure" on CUDA API call to '
        "cudaStreamSynchronize.",
    ]
    assert smoke_pass.parse_sanitizer("========= ERROR SUMMARY: 1 error\n", "memcheck")["errors"] == 1
    assert smoke_pass.parse_sanitizer(MEMCHECK_CHILD_CLEAN, "memcheck")["errors"] == 0
    assert smoke_pass.parse_sanitizer("test_x.py .\nkilled\n", "memcheck")["errors"] is None  # no summary: unfinished
    race = smoke_pass.parse_sanitizer(RACECHECK, "racecheck")
    assert (race["errors"], race["warnings"], race["processes"]) == (1, 2, 2)
    assert race["reports"][0].startswith("Error: Race reported between Write access")
    clean = smoke_pass.parse_sanitizer("========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n"
                                  "========= ERROR SUMMARY: 0 errors\n", "racecheck")
    assert clean["errors"] == 0


FAKE_SANITIZER = """#!{python}
# Stands in for compute-sanitizer: checks our flags, runs the command, prints a real-format summary.
import os, subprocess, sys
args = sys.argv[1:]
assert args[:4] == ["--tool", os.environ["EXPECT_TOOL"], "--error-exitcode", "99"], args
rc = subprocess.call(args[4:])
print("========= COMPUTE-SANITIZER")
n = int(os.environ.get("FAKE_SANITIZER_ERRORS", "0"))
if n:
    print("========= Invalid __global__ read of size 16 bytes")
print("========= ERROR SUMMARY: %d error%s" % (n, "" if n == 1 else "s"))
sys.exit(99 if n else rc)
"""


@pytest.mark.parametrize("errors", [0, 3])
def test_sanitizer_pass_runs_the_suite_under_the_tool(tmp_path, monkeypatch, errors):
    fake = tmp_path / "bin" / "compute-sanitizer"
    fake.parent.mkdir()
    fake.write_text(FAKE_SANITIZER.format(python=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("EXPECT_TOOL", "memcheck")
    monkeypatch.setenv("FAKE_SANITIZER_ERRORS", str(errors))
    suite = make_suite(tmp_path / "suite", SUITE_BASIC)
    res = invoke(["--tree", str(make_tree(tmp_path / "tree")), "--suite", str(suite), "--sanitizer", "memcheck",
                  "-k", "harness_env", "--json", "--out", str(tmp_path / "out")],
                 {**H200, "compute_sanitizer": str(fake)}, monkeypatch)
    report = json.loads(res.text)
    san = report["sanitizer"]
    assert san["tool"] == "memcheck" and san["errors"] == errors
    run = san["runs"][0]
    assert run["pass"] == "patched-memcheck" and run["scale"] == 0.05 and run["exit_code"] == (99 if errors else 0)
    env = report["passes"]["patched-memcheck"]["results"]["env"]
    assert env["scale"] == "0.05" and env["caching"] == "1"  # PYTORCH_NO_CUDA_MEMORY_CACHING=1 under the tool
    assert report["passes"]["patched"]["results"]["env"]["caching"] is None  # not in the plain pass
    if errors:
        assert res.code == 1 and "patched-memcheck: compute-sanitizer memcheck found 3 error(s)" in report["problems"]
        assert run["reports"] == ["Invalid __global__ read of size 16 bytes"]
    else:
        assert res.code == 0 and report["ok"], report["problems"]


def test_sanitizer_only_skips_the_plain_pass(tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "compute-sanitizer"
    fake.parent.mkdir()
    fake.write_text(FAKE_SANITIZER.format(python=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("EXPECT_TOOL", "racecheck")
    suite = make_suite(tmp_path / "suite", SUITE_BASIC)
    res = invoke(["--tree", str(make_tree(tmp_path / "tree")), "--suite", str(suite), "--sanitizer", "racecheck",
                  "--sanitizer-only", "-k", "harness_env", "--json"], {**H200, "compute_sanitizer": str(fake)},
                 monkeypatch)
    assert res.code == 0, res.text + res.err
    report = json.loads(res.text)
    assert list(report["passes"]) == ["patched-racecheck"] and report["passed"] == 1
    assert report["sanitizer"]["tool"] == "racecheck" and report["sanitizer"]["errors"] == 0
    one_line_error(invoke(["--tree", str(make_tree(tmp_path / "t2")), "--suite", str(suite), "--sanitizer-only"],
                          H200, monkeypatch), "--sanitizer-only needs --sanitizer")


# --------------------------------------------------------------------------- trees, wheels, listing


def test_list_needs_no_gpu(tmp_path):
    suite = make_suite(tmp_path / "suite", SUITE_DIFF)
    res = run_cli("smoke", "kernel", "--list", "--tree", make_tree(tmp_path / "t"), "--suite", suite,
                  "--out", tmp_path / "out", as_json=False)
    assert res.code == 0, res.err
    assert res.text.splitlines()[:3] == ["test_diff.py::test_zero_row_plan", "test_diff.py::test_shared_path",
                                           "test_diff.py::test_needs_upstream"]
    assert "6 test(s) in" in res.text


def test_wheel_is_unpacked_and_removed(tmp_path, monkeypatch):
    wheel = tmp_path / "sglang-0.5.23+c128.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("sglang/__init__.py", "")
        zf.writestr("sglang/kernels/jit/__init__.py", "")
        zf.writestr("sglang/FIXED", "1")
        zf.writestr("sglang/c128patch_provenance.json", json.dumps(provenance_record()))
        zf.writestr("sglang-0.5.23+c128.1.dist-info/WHEEL", "Wheel-Version: 1.0\n")
    suite = make_suite(tmp_path / "suite", SUITE_DIFF)
    res = invoke(["--wheel", str(wheel), "--suite", str(suite), "-k", "zero_row", "--json"], H200, monkeypatch)
    assert res.code == 0, res.text + res.err
    report = json.loads(res.text)
    assert report["wheel"] == str(wheel) and report["provenance"]["upstream"]["rev"] == "v0.5.23"
    assert report["tests"][0]["outcome"] == "passed"  # it read the wheel's sglang/ (FIXED is there)
    assert not Path(report["tree"]).exists()  # the temp unpack is gone


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True).stdout.strip()


def test_upstream_derived_from_the_trees_own_history(tmp_path):
    """A patched checkout: its provenance names the upstream commit; git archive gives it back."""
    repo = tmp_path / "checkout"
    make_tree(repo)
    (repo / "python/sglang/kernels/jit/c128.cuh").write_text("upstream\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "upstream")
    base = _git(repo, "rev-parse", "HEAD")
    (repo / "python/sglang/kernels/jit/c128.cuh").write_text("patched\n")
    make_tree(repo, provenance_record(commit=base, rev="main"))
    root = smoke_trees.resolve_tree(repo)
    up, how = smoke_trees.derive_upstream(root, smoke_trees.read_provenance(root), None, tmp_path / "work")
    assert (up / "sglang/kernels/jit/c128.cuh").read_text() == "upstream\n"
    assert not (up / "sglang/c128patch_provenance.json").exists()
    assert how.startswith(f"git archive {base[:12]}")


def test_upstream_derived_from_the_release_history(tmp_path, sglang_release_repo):
    """A python/ folder outside git, patched from release v0.5.23: the cached release history."""
    tree = make_tree(tmp_path / "tree", provenance_record(commit="f" * 40, rev="v0.5.23")) / "python"
    paths = ("python/sglang/srt/environ.py", "python/sglang/kernels/jit/utils")  # the product takes python/sglang
    up, how = smoke_trees.derive_upstream(tree, smoke_trees.read_provenance(tree), None, tmp_path / "work", paths)
    assert how.startswith("release history v0.5.23")
    environ = subprocess.run(["git", "--git-dir", str(sglang_release_repo), "show",
                              "v0.5.23:python/sglang/srt/environ.py"],
                             check=True, capture_output=True).stdout
    assert (up / "sglang/srt/environ.py").read_bytes() == environ
    assert "SGLANG_OPT_USE_ONLINE_COMPRESS" in environ.decode()
    assert smoke_trees.resolve_tree(up, "upstream") == up.resolve()


def test_stage_uses_the_suites_subset_and_carries_provenance(tmp_path):
    suite = make_suite(tmp_path / "suite", {"test_a.py": "def test_a():\n    pass\n"})
    (suite / "tree_subset.py").write_text(
        "from pathlib import Path\n"
        "def subset_files(src):\n"
        "    return [Path('sglang/__init__.py'), Path('sglang/kernels/jit/keep.cuh')]\n")
    tree = make_tree(tmp_path / "tree", provenance_record()) / "python"
    (tree / "sglang/kernels/jit/keep.cuh").write_text("k")
    (tree / "sglang/kernels/jit/drop.cuh").write_text("d")
    res = run_cli("smoke", "kernel", "--tree", tree, "--suite", suite, "--stage", tmp_path / "stage")
    assert res.code == 0, res.err
    staged = tmp_path / "stage" / "patched"
    assert sorted(str(p.relative_to(staged)) for p in staged.rglob("*") if p.is_file()) == [
        "sglang/__init__.py", "sglang/c128patch_provenance.json", "sglang/kernels/jit/keep.cuh"]
    assert json.loads(res.text)["staged"]["patched"]["files"] == 3


def test_smoke_imports_no_extra_wheels(tmp_path):
    """On the GPU box only click, rich, packaging and pytest are there: smoke must not import
    unidiff, tomli_w or wheel on its way (real `c128patch smoke` runs with them blocked)."""
    suite = make_suite(tmp_path / "suite", SUITE_DIFF)
    tree = make_tree(tmp_path / "t", provenance_record(), marker="FIXED")
    code = ("import sys\n"
            "for m in ('unidiff', 'tomli_w', 'wheel', 'tomli'):\n"
            "    sys.modules[m] = None\n"
            "from c128patch.smoke import device as smoke_device\n"
            f"smoke_device.probe_device = lambda python: {H200!r}\n"
            "from c128patch.cli import main\n"
            "import c128patch.smoke.server, c128patch.smoke.kernel, c128patch.cli.smoke\n"
            "main()\n")
    env = {**os.environ, "PYTHONPATH": str(TOOLING)}
    for extra in (["--list"], ["-k", "zero_row", "--out", str(tmp_path / "out")]):
        proc = subprocess.run([sys.executable, "-c", code, "smoke", "kernel", "--tree", str(tree),
                               "--suite", str(suite), "--json", *extra], capture_output=True, text=True, env=env,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr
        report = json.loads(proc.stdout)
        assert report["mode"] == ("collect-only" if extra == ["--list"] else "run")
    assert report["passed"] == 1 and report["ok"]


@pytest.mark.parametrize("sig, code", [(2, 130), (15, 143)])
def test_signal_stops_the_suite(tmp_path, sig, code):
    """Ctrl-C or SIGTERM to `c128patch smoke`: the pytest child and what it started are gone."""
    pidfile = tmp_path / "pids"
    suite = make_suite(tmp_path / "suite", {"test_hang.py": f'''
        import os, subprocess, time
        def test_hangs(patched_tree):
            child = subprocess.Popen(["sleep", "300"], start_new_session=True)
            open({str(pidfile)!r}, "w").write(f"{{os.getpid()}} {{child.pid}}")
            time.sleep(300)
    '''})
    code_ = ("import json, sys\n"
             "from c128patch.smoke import device as smoke_device\n"
             f"smoke_device.probe_device = lambda python: {H200!r}\n"
             "from c128patch.cli import main\n"
             "main()\n")
    signal_when_ready([sys.executable, "-c", code_, "smoke", "kernel", "--tree",
                       str(make_tree(tmp_path / "t")), "--suite", str(suite), "--out", str(tmp_path / "out")],
                      {**os.environ, "PYTHONPATH": str(TOOLING)},
                      lambda: pidfile.exists() and len(pidfile.read_text().split()) >= 2, sig, code)
    pids = [int(p) for p in pidfile.read_text().split()]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    assert not any(alive(p) for p in pids), pids


def test_a_signal_leaves_no_temporary_out_folder(tmp_path):
    """Without --out the run's folder is the tool's own scratch (a temporary folder): a signal said "its scratch
    folders are removed" over a c128patch-smoke-kernel-* folder left in the temp folder, its report of passes that
    never ended in it."""
    pidfile, scratch = tmp_path / "pids", tmp_path / "tmp"
    scratch.mkdir()
    suite = make_suite(tmp_path / "suite", {"test_hang.py": f'''
        import os, time
        def test_hangs(patched_tree):
            open({str(pidfile)!r}, "w").write(str(os.getpid()))
            time.sleep(300)
    '''})
    code_ = ("from c128patch.smoke import device as smoke_device\n"
             f"smoke_device.probe_device = lambda python: {H200!r}\n"
             "from c128patch.cli import main\n"
             "main()\n")
    err = signal_when_ready([sys.executable, "-c", code_, "smoke", "kernel", "--tree", str(make_tree(tmp_path / "t")),
                             "--suite", str(suite)], {**os.environ, "PYTHONPATH": str(TOOLING), "TMPDIR": str(scratch)},
                            pidfile.exists, 15, 143)
    assert "interrupted (SIGTERM): no outcome; its scratch folders are removed" in err, err
    assert list(scratch.iterdir()) == [], list(scratch.iterdir())


# --------------------------------------------------------------------------- the command's shape


@pytest.mark.parametrize("sub, own, foreign", [("kernel", "--sanitizer", "--model-path"),
                                               ("upstream", "--tests", "--sanitizer"),
                                               ("server", "--model-path", "--tree")])
def test_each_subcommand_takes_only_its_own_options(sub, own, foreign):
    res = run_cli("smoke", sub, "--help", as_json=False)
    assert res.code == 0 and f"smoke {sub} [OPTIONS]" in res.text.splitlines()[0], res.text
    assert own in res.text and foreign not in res.text
    one_line_error(run_cli("smoke", sub, foreign, "x", as_json=False), f"No such option '{foreign}'")


@pytest.mark.parametrize("group", [[], ["layer"], ["smoke"]], ids=["c128patch", "layer", "smoke"])
def test_a_group_run_without_a_verb_prints_its_help_as_it_reads(group):
    """Bare `c128patch` printed its whole help squashed into one error line; `smoke` said "Missing command."."""
    res = run_cli(*group, as_json=False)
    assert res.code == 2 and not res.err, res.err
    usage = res.text.splitlines()[0]  # (in process, click calls the program "main")
    assert usage.startswith("Usage: ") and usage.endswith(" ".join([*group, "[OPTIONS] COMMAND [ARGS]..."]))
    assert "\nCommands:\n" in res.text and len(res.text.splitlines()) > 6


def test_the_lines_smoke_prints_of_the_targets_text_are_data(capsys):
    """smoke printed its plain lines with rich's console, which drops BEL and CR but not ESC: a test's id, the tail of
    a pytest pass's log (the target's output), a sanitizer's report and a tree's provenance wrote their escapes."""
    from c128patch.smoke import render

    evil = "\x1b]8;;http://evil.example\x07x\x1b]8;;\x07\x1b[2J\u202e\nforged: OK"
    provenance = {"series": {"name": evil, "version": "1"}, "upstream": {"rev": evil}, "entries": []}
    patched = {"counts": {"passed": 1}, "exit": 0, "seconds": 1.0, "scale": 1, "log_tail": [evil]}
    report = {"mode": "collect-only", "suite": "suite", "device": {"gpu": evil}, "provenance": provenance,
              "notes": [evil], "passes": {"patched": patched},
              "sanitizer": {"runs": [{"tool": "memcheck", "errors": 1, "processes": 1, "reports": [evil]}]},
              "tests": [{"nodeid": f"test_x.py::test[{evil}]", "outcome": "passed", "seconds": 1.0}],
              "problems": [], "ok": True}
    render.print_kernel(report, Path("/tmp/report.json"))
    render.print_failing([(f"test_x.py::test[{evil}]", "failed")])
    out = capsys.readouterr().out
    assert "forged: OK" in out and not any(c in out for c in "\x1b\x07\u202e"), out
    assert not any(line.lstrip(" |").startswith("forged") for line in out.splitlines()), out


@pytest.mark.parametrize("value", ["nan", "0", "-5", "inf"])
@pytest.mark.parametrize("argv", [["smoke", "kernel", "--timeout"], ["smoke", "upstream", "--timeout"],
                                  ["smoke", "server", "--model-path", "m", "--health-timeout"],
                                  ["smoke", "server", "--model-path", "m", "--duration"]])
def test_a_time_limit_that_is_no_number_of_seconds_is_refused_before_anything_runs(argv, value):
    """Helper 142: ``smoke kernel --timeout nan`` ran the suite, then "timed out after %ds" % nan was ValueError's
    traceback; 0 and -5 ran the suite and cut every pass at once (exit 1, a report of nothing)."""
    res = run_cli(*argv, value, as_json=False)
    assert res.code == 2 and res.err.startswith("c128patch: error: Invalid value for '--"), res.err
    assert len(res.err.strip().splitlines()) == 1


def test_staging_a_tree_refuses_a_file_that_is_a_link_out_of_it(tmp_path):
    """helper 172: ``stage`` (``smoke kernel --stage``, the GPU bundle) copied a tree's file that is a link with its
    target's bytes: an upstream committing ``sglang/x.py -> ~/.ssh/id_rsa`` had the key carried off. Now each file
    is confined (``copy_files``): refused by name, nothing copied."""
    secret = tmp_path / "id_rsa"
    secret.write_text("SECRET")
    tree = tmp_path / "tree"
    (tree / "sglang").mkdir(parents=True)
    (tree / "sglang" / "ok.py").write_text("x = 1\n")
    (tree / "sglang" / "leak.py").symlink_to(secret)
    suite = tmp_path / "suite"
    suite.mkdir()
    with pytest.raises(smoke_trees.C128Error, match="leak.py goes through the symlink"):
        smoke_trees.stage(suite, {"patched": tree}, tmp_path / "dest")
    assert not [p for p in (tmp_path / "dest").rglob("*") if p.is_file() and "SECRET" in p.read_text()]


def test_a_results_file_the_suite_wrote_past_pythons_digit_limit_is_unreadable_not_a_traceback(tmp_path):
    """Helper 173: the JSON files a pass's suite (the target's code) writes to its results folder were read catching
    only JSONDecodeError: a 5000-digit integer or a 10000-deep array ended the smoke run in a traceback. Now each is
    said unreadable, as invalid JSON is."""
    from types import SimpleNamespace

    results = tmp_path / "results"
    results.mkdir()
    (results / "digits.json").write_text(f'{{"n": {"9" * 5000}}}')
    (results / "deep.json").write_text("[" * 10000 + "]" * 10000)
    (tmp_path / "log").write_text("")
    spec = SimpleNamespace(label="x", tree=tmp_path, upstream=None, scale=1, timeout=1, collect_only=True,
                           sanitizer=None)
    proc = SimpleNamespace(proc=None, log=tmp_path / "log", argv=[], leftover=[])
    run = SimpleNamespace(spec=spec, proc=proc, rows_path=tmp_path / "rows.jsonl", results=results, start=0.0,
                          end=0.0, timed_out=False)
    got = smoke_pass._result(run)["results"]
    assert got == {"digits": {"unreadable": str(results / "digits.json")},
                   "deep": {"unreadable": str(results / "deep.json")}}, got
