"""The slowest test files start first (tests/support.py SLOW_FIRST, ordered by tests/conftest.py): with
--dist loadfile a long file handed out last is the run's tail, so the collection puts them first and
xdist keeps that order."""

from __future__ import annotations

import re
import subprocess
import sys

from support import REPO_ROOT, SLOW_FIRST, Lazy  # not from conftest: tests/gpu has its own

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


def test_every_slow_file_exists():
    assert all((REPO_ROOT / "tests" / name).is_file() for name in SLOW_FIRST)


def test_xdist_keeps_the_collections_order():
    addopts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    assert "--dist loadfile" in addopts and "--no-loadscope-reorder" in addopts


def test_the_collection_puts_the_slow_files_first():
    files = ["tests/test_layering.py", "tests/test_bench_variants.py", "tests/test_cli_startup.py",
             "tests/test_compile_kernels.py"]
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", *files],
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    order = list(dict.fromkeys(line.split("::")[0] for line in proc.stdout.splitlines() if "::" in line))
    # the slow ones in SLOW_FIRST's order, then the rest by number of tests (test_cli_startup has the most)
    assert order == ["tests/test_compile_kernels.py", "tests/test_bench_variants.py", "tests/test_cli_startup.py",
                     "tests/test_layering.py"], proc.stdout[-2000:]


def test_every_heavy_name_is_a_test_file_test_or_fixture_that_exists(pytestconfig):
    """A renamed test or fixture would silently fall back into the default run (tests/conftest.py HEAVY_*)."""
    heavy = pytestconfig.pluginmanager.get_plugin(str(REPO_ROOT / "tests" / "conftest.py"))
    sources = {p.name: p.read_text() for p in (REPO_ROOT / "tests").glob("*.py")}
    assert heavy.HEAVY_FILES <= set(sources)
    for name in heavy.HEAVY_TESTS | heavy.HEAVY_SWEEPS:
        (file, func), case = name.split("[")[0].split("::"), name.partition("[")[2].rstrip("]")
        assert f"\ndef {func}(" in sources.get(file, "") and f'"{case}"' in sources[file], name
    for fixture in heavy.HEAVY_FIXTURES:
        assert any(re.search(rf"@pytest\.fixture.*\ndef {fixture}\(", text) for text in sources.values()), fixture


def test_a_fixture_of_every_release_makes_only_the_releases_read():
    made = []
    trees = Lazy(lambda tag: made.append(tag) or f"tree of {tag}")
    assert trees["v0.5.23"] == trees["v0.5.23"] == "tree of v0.5.23" and trees.__getitem__("v0.5.22")
    assert made == ["v0.5.23", "v0.5.22"]
