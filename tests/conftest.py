"""Shared fixtures: the real sglang release history (cached), clones of it, and test series."""

from __future__ import annotations

import gc
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest

from c128patch import progress
from c128patch.series.manifest import load_series
from c128patch.upstream.releases import ReleaseHistory
from support import RELEASES, REPO_ROOT, SLOW_FIRST, Lazy, patched_tree, release_tree, series_paths

# The commands the tests run in-process have their stderr compared line by line: on a busy machine a step
# over the tool's 10 s beat would add a heartbeat line (tests/test_pipe_output.py tests the beat itself).
progress.BEAT = 3600.0

# CI runs the suite twice, every test once (.ci/run): first without torch, writing the tests skipped for
# lack of it to $C128PATCH_TORCH_SKIPS; then, torch installed, only those ($C128PATCH_RUN_ONLY).
_TORCH = re.compile(r"\btorch\b")
_torch_skips: set[str] = set()
_skips: Counter[str] = Counter()  # reason -> how many tests skipped for it, printed at the end
_controller: list[bool] = []  # whether this process is the one that reports (not an xdist worker)
_cpu_by_file: Counter[str] = Counter()  # test file -> CPU seconds of its tests, fixtures and their subprocesses

# The heavy tier (`-m heavy`): the README's test command deselects it, .ci/run runs it as well. The rule: heavy is
# (a) what needs a real toolchain or environment (nvcc compiles, pip installs of sglang's lock, the package index);
# (b) a test whose subject is the releases other than the newest: the walk across every release or (from, onto)
# pair (a fixture that builds it whole; of a sweep, the older releases' cases), a series made at an older release,
# an older release joining the cache; (c) a second end-to-end `watch`/`rebase` of an outcome another default case
# already proves on v0.5.23 the same way. The default run keeps every unit-level test and, for every verb and
# feature, an end-to-end test on v0.5.23 (or on upstream commits made on it). Never a test that only reads a
# module fixture the default run builds whole: the heavy run would build it a second time for nothing.
HEAVY_TESTS = {  # a test, or one case of it (name[id])
    "test_compile_kernels.py::test_patched_kernels_and_probe_compile_for_sm90a_on_every_release",  # nvcc, 285 s
    "test_bench_variants.py::test_variants_compile_for_sm90a",  # nvcc
    "test_env.py::test_the_v0_5_23_environment_builds_from_its_lock_and_every_module_imports",  # pip: ~3 min, 3 GB
    "test_env.py::test_the_v0_5_20_environment_imports_every_module_with_torchvision_without_its_ops",  # pip, (b)
    "test_env.py::test_requirements_that_do_not_resolve_are_one_line_and_unchecked",  # asks the package index
    "test_watch_ci.py::test_the_recipe_as_written_builds_the_tiers_environment_and_is_clean_on_the_newest_release",
    # pip: the recipe's own environment, built on a fresh workspace
    "test_layers.py::test_docs_layers_md_walked_as_printed_across_the_releases_with_check_at_each_step",  # (b)
    "test_contract.py::test_watch_says_broken_naming_our_line_and_the_upstream_definition[renamed]",  # (c)
    "test_contract_names.py::test_watch_says_broken_naming_the_callback_and_bisect_agrees",  # (c): watch and bisect on
    # a contract break run by default in test_contract.py's [signature]; each case's contract finding by default here
    "test_contract_names.py::test_watch_says_broken_naming_a_renamed_instance_attribute_and_bisect_agrees",  # (c)
    "test_copies.py::test_a_method_copy_in_the_patched_class_behind_a_new_env_is_broken_and_bisect_finds_it",  # (c):
    # watch and bisect on a copy run by default on a file copy; the method copy's detection by its module-level twin
    "test_watch_behaviour.py::test_without_torch_a_behavioural_break_is_not_called_clean_either",  # (c): unchecked,
    # no torch, as test_without_torch_watch_is_unchecked_not_clean
    # (b): the custom op only 0.5.20-0.5.22 register (a smoke run of both trees per release); v0.5.22's stays
    "test_smoke_upstream_suite.py::test_fp8_wo_a_registers_its_op_at_import_through_our_direct_register_custom_op"
    "[v0.5.20]",
    "test_smoke_upstream_suite.py::test_fp8_wo_a_registers_its_op_at_import_through_our_direct_register_custom_op"
    "[v0.5.21]",
    "test_smoke_upstream_suite.py::test_direct_register_custom_op_is_listed_as_a_standin_taken_inside_a_function"
    "[v0.5.20]",
    "test_smoke_upstream_suite.py::test_direct_register_custom_op_is_listed_as_a_standin_taken_inside_a_function"
    "[v0.5.21]",
}
HEAVY_FILES = {"test_check_predicts.py", "test_scenarios.py", "test_scenarios_upstream.py"}  # the tier's real env
HEAVY_FIXTURES = {  # (b), built whole for their first test
    "rebased",  # test_rebase's (from, onto) matrix
    "example_path",  # test_layers: the example layer rebased across every release, a wheel of each
    "series_022",  # test_watch: a series made at v0.5.22 watched onto v0.5.23 (refreshed, and without its ledger)
    "runs",  # test_reproducible: 0.5.19 joins two caches
}
HEAVY_SWEEPS = {
    "test_contract.py::test_the_contract_holds_on_every_supported_release",
    "test_contract.py::test_the_behavioural_tier_passes_only_where_every_module_imported_on_every_release",
    "test_evidence.py::test_every_release_stages",
    "test_rebase.py::test_after_the_drop_apply_at_every_release_still_carries_every_entry",
    "test_audit.py::test_series_audit_clean_on_every_release",
    "test_smoke_upstream_suite.py::test_every_release_collects_upstreams_tests_on_both_trees",
}


def is_heavy(item: pytest.Item) -> bool:
    """Is ``item`` in the heavy tier (``HEAVY_*``; of a sweep, the cases of an older release than the newest)?"""
    name = f"{item.path.name}::{getattr(item, 'originalname', item.name)}"
    if (item.path.name in HEAVY_FILES or {name, f"{item.path.name}::{item.name}"} & HEAVY_TESTS
            or HEAVY_FIXTURES & set(getattr(item, "fixturenames", ()))):
        return True
    params = item.callspec.params.values() if name in HEAVY_SWEEPS and hasattr(item, "callspec") else ()
    return any(isinstance(value, str) and value in RELEASES[:-1] for value in params)


def pytest_configure(config: pytest.Config) -> None:
    """The controller puts every temporary file of the run (pytest's, the tool's, its subprocesses') in one
    folder of its own, removed when the run ends, passed, failed or stopped (SIGTERM, Ctrl-C); workers and nested
    runs inherit it. A run killed before its cleanup (SIGKILL: `timeout -k`, a CI runner's escalation after
    SIGTERM while xdist waits for its workers) leaves it to the next run, which removes it."""
    _controller.append(not hasattr(config, "workerinput"))
    gc.set_threshold(100_000, 50, 100)  # as the CLI's entry (c128patch.__main__) has it for the commands run here
    # torch's CPU ops on one thread each (read at its import, after this): a worker per core already, and each op's
    # second OpenMP thread spun while it waited on a busy machine (test_series3_controller_cpu.py's v0.5.23 decodes:
    # 24-42 CPU-s with 2 threads, 6-7 with one); the float64 reference checks are the same on either
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # the tier imports with this interpreter unless a test asks for the target's environment (tests/test_env.py)
    os.environ.setdefault("C128PATCH_TIER_PYTHON", sys.executable)
    if _controller[-1] and not os.environ.get("C128PATCH_TEST_TMP"):
        parent = _memory_folder() or tempfile.gettempdir()
        _remove_killed_runs(Path(parent))
        root = tempfile.mkdtemp(prefix=f"{_ROOT_PREFIX}{os.getpid()}-", dir=parent)
        os.environ["C128PATCH_TEST_TMP"] = os.environ["TMPDIR"] = tempfile.tempdir = root
        if os.environ.pop("PYTHONDONTWRITEBYTECODE", None):  # each `c128patch` a test starts would compile the
            # tool again: once, in the run's folder, or in the caller's (.ci/run's, shared by its three runs)
            os.environ.setdefault("PYTHONPYCACHEPREFIX", os.path.join(root, "pycache"))
        config.add_cleanup(lambda: shutil.rmtree(root, ignore_errors=True))
        signal.signal(signal.SIGTERM, _interrupted)  # a run stopped by `timeout` or a CI job cleans up too


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: one worker more than the cores this run may use (``--maxprocesses`` caps it); a worker often
    waits on the git and c128patch processes its test starts, and on a machine busy with other work the run gets a
    larger share. PYTEST_XDIST_AUTO_NUM_WORKERS still decides where it is set."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    return len(os.sched_getaffinity(0)) + 1


def _memory_folder() -> str | None:
    """/dev/shm where TMPDIR is unset and it has 12 GiB free (a run peaks at ~7 GB): the tests write thousands of
    sglang trees, 30-44 % faster there on two cores (.ci/run does the same for CI's clone); else the temp folder."""
    if os.environ.get("TMPDIR"):
        return None
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return None
    return "/dev/shm" if st.f_bavail * st.f_frsize > 12 * 2**30 and os.access("/dev/shm", os.W_OK) else None


_ROOT_PREFIX = "c128patch-tests-"  # then the controller's pid


def _remove_killed_runs(parent: Path) -> None:
    """Remove the run folders in ``parent`` whose controller is gone (killed before its cleanup)."""
    for path in parent.glob(f"{_ROOT_PREFIX}*-*"):
        pid = path.name.removeprefix(_ROOT_PREFIX).split("-", 1)[0]
        if pid.isdigit() and path.is_dir() and not path.is_symlink() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _record_skip(report: pytest.CollectReport | pytest.TestReport) -> None:
    if not report.skipped or hasattr(report, "wasxfail") or not (_controller and _controller[-1]):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    _skips[reason.removeprefix("Skipped: ")] += 1
    if os.environ.get("C128PATCH_TORCH_SKIPS") and _TORCH.search(reason):
        _torch_skips.add(report.nodeid)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    _record_skip(report)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _record_skip(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A report holding a lone surrogate (a failure's message quoting a name made of bytes that are not UTF-8) is
    made UTF-8 (backslash escapes): xdist could not send it, its worker died with INTERNALERROR and the run lost the
    failure and every test queued on that worker (CI on d3f14ea: 1712 of ~2240 ran)."""
    outcome = yield
    report = outcome.get_result()
    if report.longrepr is not None and not isinstance(report.longrepr, tuple):
        text = str(report.longrepr)
        if _SURROGATE.search(text):
            report.longrepr = text.encode("utf-8", "backslashreplace").decode("utf-8")
    report.sections = [(k, v.encode("utf-8", "backslashreplace").decode("utf-8")) for k, v in report.sections]


_SURROGATE = re.compile("[\ud800-\udfff]")


def _cpu() -> float:
    """CPU seconds of this process and of the children it waited for (git, the tool's subprocesses)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    start = _cpu()
    yield
    _cpu_by_file[item.path.name] += _cpu() - start


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """xdist: a worker's CPU seconds by file reach the controller."""
    _cpu_by_file.update(getattr(node, "workeroutput", {}).get("cpu_by_file", {}))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _cpu_by_file:
        top = sorted(_cpu_by_file.items(), key=lambda kv: -kv[1])[:15]
        terminalreporter.section(f"CPU seconds by test file: {sum(_cpu_by_file.values()):.0f} in all, the top 15")
        for name, seconds in top:
            terminalreporter.line(f"{seconds:7.1f}  {name}")
    if _skips:
        terminalreporter.section(f"{sum(_skips.values())} skipped, by reason")
        for reason, count in sorted(_skips.items(), key=lambda kv: (-kv[1], kv[0])):
            terminalreporter.line(f"{count:5d}  {reason}")


def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["cpu_by_file"] = dict(_cpu_by_file)
    path = os.environ.get("C128PATCH_TORCH_SKIPS")
    if path and _controller and _controller[-1]:
        Path(path).write_text("".join(f"{nodeid}\n" for nodeid in sorted(_torch_skips)))


def slow_files_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """``items`` with SLOW_FIRST's files first, then the other files by number of tests (most first);
    each file's tests in their own order."""
    per_file: dict[str, int] = {}
    for item in items:
        per_file[item.path.name] = per_file.get(item.path.name, 0) + 1

    def rank(item: pytest.Item) -> tuple[int, int]:
        name = item.path.name
        return (SLOW_FIRST.index(name), 0) if name in SLOW_FIRST else (len(SLOW_FIRST), -per_file[name])

    return sorted(items, key=rank)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by mark
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if is_heavy(item):
            item.add_marker(pytest.mark.heavy)
    path = os.environ.get("C128PATCH_RUN_ONLY")
    if path:
        wanted = set(Path(path).read_text().splitlines())
        keep = [i for i in items if i.nodeid in wanted or i.nodeid.split("::", 1)[0] in wanted]
        dropped = [i for i in items if i.nodeid not in wanted and i.nodeid.split("::", 1)[0] not in wanted]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = keep
    items[:] = slow_files_first(items)


@pytest.fixture(scope="session")
def sglang_release_repo() -> Path:
    """A bare git repo with one tagged commit per sglang release (0.5.20-0.5.23), built once from
    the release wheels and cached outside the repository (~/.cache/c128patch or $C128PATCH_CACHE)."""
    return ReleaseHistory().ensure()


@pytest.fixture(scope="session")
def packed_release_repo(sglang_release_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``sglang_release_repo`` (the same commits and tags) with its objects in one pack, for the tests that clone it
    through a URL (``--repo file://...``): git's upload-pack then reuses the pack's deltas instead of computing them
    again for each clone (7.1 -> 3.1 CPU-s a mirror). The repack searches no new deltas (``--window=0``: 0.4 CPU-s,
    4.8 with git's default window, for the same clone cost). Shared: do not write."""
    dest = tmp_path_factory.mktemp("packed") / "sglang-releases.git"
    subprocess.run(["git", "clone", "--quiet", "--mirror", str(sglang_release_repo), str(dest)], check=True)
    subprocess.run(["git", "-C", str(dest), "repack", "-a", "-d", "-q", "--window=0"], check=True)
    return dest


@pytest.fixture
def upstream_clone(sglang_release_repo: Path, tmp_path: Path) -> Path:
    """A working clone of the release history, checked out at v0.5.23 on branch 'main'."""
    dest = tmp_path / "sglang"
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(sglang_release_repo), str(dest)], check=True)
    subprocess.run(["git", "-C", str(dest), "checkout", "--quiet", "-b", "main", "v0.5.23"], check=True)
    return dest


@pytest.fixture
def sparse_clone(sglang_release_repo: Path, tmp_path: Path) -> Path:
    """A cheap clone at v0.5.23 (branch 'main') with only a few upstream files checked out:
    for tests of commands that must refuse before touching the tree."""
    dest = tmp_path / "sglang"
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(sglang_release_repo), str(dest)], check=True)
    subprocess.run(["git", "-C", str(dest), "sparse-checkout", "set", "--no-cone",
                    "/python/sglang/srt/environ.py", "/python/sglang/kernels/jit/csrc/deepseek_v4/"], check=True)
    subprocess.run(["git", "-C", str(dest), "checkout", "--quiet", "-b", "main", "v0.5.23"], check=True)
    return dest


@pytest.fixture(scope="session")
def real_series():
    return load_series(REPO_ROOT)


@pytest.fixture(scope="session")
def release_trees(sglang_release_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """tag -> folder holding the kernel-tier part of that release's ``sglang/`` (unpatched), made when first read."""
    root = tmp_path_factory.mktemp("releases")
    return Lazy(lambda tag: release_tree(sglang_release_repo, tag, root / tag))


@pytest.fixture(scope="session")
def patched_tree_023(sglang_release_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The kernel-tier part of v0.5.23 with the product series applied (holds ``sglang/``)."""
    return patched_tree(REPO_ROOT, sglang_release_repo, "v0.5.23", tmp_path_factory.mktemp("patched") / "v0.5.23")


@pytest.fixture(scope="session")
def patched_trees(sglang_release_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """tag -> the kernel-tier part of that release with the product series applied (holds ``sglang/``), made when
    first read. Shared: do not write into them."""
    root = tmp_path_factory.mktemp("patched-all")
    return Lazy(lambda tag: patched_tree(REPO_ROOT, sglang_release_repo, tag, root / tag))


@pytest.fixture(scope="session")
def series_trees(sglang_release_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """tag -> (patched, upstream): the files the product series writes (``support.series_paths``) and the
    upstream ones the series III tests run beside them (``series3_tree.SERIES3_READS``), with the whole
    series applied and as released; each folder holds ``sglang/``. Shared: do not write into them."""
    from series3_tree import SERIES3_READS

    root = tmp_path_factory.mktemp("series")
    paths = series_paths(load_series(REPO_ROOT)) + SERIES3_READS
    return {tag: (patched_tree(REPO_ROOT, sglang_release_repo, tag, root / "patched" / tag, paths),
                  release_tree(sglang_release_repo, tag, root / "upstream" / tag, paths))
            for tag in RELEASES}
