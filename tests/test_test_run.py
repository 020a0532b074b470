"""The test run itself (tests/conftest.py): it leaves nothing in the temp folder, passed or failed; it counts
every skip by reason; its heavy tier holds the all-release compile and the release matrices."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from support import REPO_ROOT

INNER = '''
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest


def test_writes_everywhere_then_fails(tmp_path):
    (tmp_path / "tree").write_text("x")
    Path(tempfile.mkdtemp(), "clone").write_text("x")
    assert False, "failed on purpose"


@pytest.mark.parametrize("n", [1, 2])
def test_torch_missing(n):
    pytest.skip("torch is not installed")


def test_no_gpu():
    pytest.skip("GPU tier: torch sees no CUDA GPU")


def test_stopped(tmp_path):
    if os.environ.get("STOP"):
        (tmp_path / "tree").write_text("x")
        os.kill(os.getpid(), signal.SIGTERM)
        threading.Event().wait(60)


def test_killed(tmp_path):
    if os.environ.get("KILL"):
        (tmp_path / "tree").write_text("x")
        os.kill(os.getpid(), signal.SIGKILL)


def test_burns():
    if os.environ.get("BURN"):
        subprocess.run([sys.executable, "-c", "import time\\nend = time.process_time() + 0.5\\n"
                        "while time.process_time() < end: pass"], check=True)
'''


def inner_run(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess,
                                                                                       Path]:
    """pytest on INNER with this conftest, its temp folder under a fresh TMPDIR (returned)."""
    (tmp_path / "inner").mkdir(exist_ok=True)
    (tmp_path / "inner" / "test_inner.py").write_text(INNER)
    temp = tmp_path / "temp"
    temp.mkdir(exist_ok=True)
    env = {**{k: v for k, v in os.environ.items() if k not in ("C128PATCH_TEST_TMP", "PYTEST_XDIST_WORKER")},
           **(env or {})}
    env.update(TMPDIR=str(temp), PYTHONPATH=os.pathsep.join([str(REPO_ROOT / "tests"), env.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-q", "-rN",
                           "--rootdir", str(tmp_path / "inner"), "-c", os.devnull, *args, str(tmp_path / "inner")],
                          cwd=tmp_path / "inner", env=env, capture_output=True, text=True)
    return proc, temp


def test_a_failed_run_leaves_nothing_in_the_temp_folder_and_counts_its_skips_by_reason(tmp_path):
    proc, temp = inner_run(tmp_path)
    assert proc.returncode == 1 and "failed on purpose" in proc.stdout, proc.stdout + proc.stderr
    assert list(temp.iterdir()) == []
    summary = proc.stdout.split("3 skipped, by reason", 1)[1].splitlines()
    assert summary[1:3] == ["    2  torch is not installed", "    1  GPU tier: torch sees no CUDA GPU"]


def test_a_run_stopped_by_sigterm_leaves_nothing_in_the_temp_folder(tmp_path):
    proc, temp = inner_run(tmp_path, "-k", "test_stopped", env={"STOP": "1"})
    assert proc.returncode == 2 and "KeyboardInterrupt" in proc.stdout, proc.stdout + proc.stderr
    assert list(temp.iterdir()) == []


def test_a_run_killed_before_its_cleanup_leaves_its_folder_to_the_next_run_which_removes_it(tmp_path):
    """SIGKILL (`timeout -k`, a CI runner's escalation after SIGTERM, while xdist waits for its workers) leaves the
    run's folder; the next run removes it, and keeps a live run's."""
    proc, temp = inner_run(tmp_path, "-k", "test_killed", env={"KILL": "1"})
    assert proc.returncode == -9, proc.stdout + proc.stderr
    (left,) = temp.iterdir()
    live = temp / f"c128patch-tests-{os.getpid()}-live"  # this run's controller is alive
    live.mkdir()
    proc, _ = inner_run(tmp_path, "-k", "test_no_gpu")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert list(temp.iterdir()) == [live], left


def test_the_cpu_seconds_of_each_file_are_summed_over_the_workers_children_included(tmp_path):
    proc, _ = inner_run(tmp_path, "-n", "1", "-k", "test_burns", env={"BURN": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = proc.stdout.split("CPU seconds by test file: ", 1)[1].splitlines()[1:2]
    assert rows and rows[0].split()[1] == "test_inner.py" and float(rows[0].split()[0]) >= 0.5, proc.stdout


def test_the_heavy_tier_holds_the_all_release_compile_and_the_older_releases_of_a_sweep():
    heavy = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-q",
                            "--collect-only", "-m", "heavy", "tests/test_compile_kernels.py", "tests/test_rebase.py",
                            "tests/test_contract.py", "tests/test_layers.py", "tests/test_reproducible.py"],
                           cwd=REPO_ROOT, capture_output=True, text=True)
    ids = heavy.stdout.split()
    assert "tests/test_compile_kernels.py::test_patched_kernels_and_probe_compile_for_sm90a_on_every_release" in ids
    assert "tests/test_rebase.py::test_rebase_between_releases_needs_no_stop[v0.5.22->v0.5.23]" in ids
    assert "tests/test_contract.py::test_the_contract_holds_on_every_supported_release[v0.5.22]" in ids
    assert "tests/test_contract.py::test_the_contract_holds_on_every_supported_release[v0.5.23]" not in ids
    assert "tests/test_compile_kernels.py::test_every_series_header_has_a_row" not in ids


def test_the_heavy_tier_holds_no_test_that_only_reads_a_fixture_the_light_tier_builds_whole():
    """test_layers' example_path and test_reproducible's runs build every release's results for their first test:
    all their readers are in one tier, or the heavy run would build them again."""
    files = {"test_layers.py": "example_path", "test_reproducible.py": "runs"}
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-q", "--collect-only", "-m"]
    tiers = [subprocess.run([*argv, tier, *(f"tests/{f}" for f in files)], cwd=REPO_ROOT, capture_output=True,
                            text=True).stdout.split() for tier in ("heavy", "not heavy")]
    for file, fixture in files.items():
        readers = set(re.findall(rf"\ndef (test_\w+)\([^)]*\b{fixture}\b", (REPO_ROOT / "tests" / file).read_text()))
        assert len(readers) > 3, (file, readers)
        read = [{i.split("::")[1].split("[")[0] for i in ids if i.startswith(f"tests/{file}::")} & readers
                for ids in tiers]
        assert read[0] | read[1] == readers and not (read[0] and read[1]), (file, read)
