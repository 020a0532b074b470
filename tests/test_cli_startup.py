"""The CLI starts light: `--help` (click's own, no generated copy) lists every command from the table in
cli/__init__.py without importing any command module, and a verb's `--help` imports that verb's module
only (no rich, unidiff, packaging or core module); the console entry is that same click CLI. Timing lives
in ci/bench/bench_startup.py; this checks what is imported, which is what the timing comes from."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import click
import pytest

from c128patch.cli import COMMANDS, main
from support import REPO_ROOT

CLI_DIR = REPO_ROOT / "tooling" / "c128patch" / "cli"
LIGHT = {"c128patch", "c128patch.__main__", "c128patch.cli", "c128patch.cli.common", "c128patch.errors",
         "c128patch.exitcodes", "c128patch.upstream"}
# what a verb's own options need to be listed (their choices and defaults)
EXTRA = {"capacity": {"c128patch.capacity", "c128patch.capacity.model"}}
# smoke's subcommands, each listed by `smoke --help` from its table, and what each one's --help imports
SMOKE = {"kernel": {"c128patch.smoke", "c128patch.smoke.presets"},
         "upstream": set(),
         "server": {"c128patch.smoke", "c128patch.smoke.presets"}}
HEAVY = ("rich", "unidiff", "packaging", "tomli_w", "wheel", "build")

# the console entry as pip's console script runs it (the program named by argv[0])
PROBE = """
import json, sys
sys.argv[0] = "/venv/bin/c128patch"
from c128patch.__main__ import main
try:
    main()
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def loaded(*args: str, code: int = 0) -> tuple[set[str], str]:
    """The modules loaded by the console entry run with ``args`` (exit ``code``), and its stdout."""
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "80"})
    report = json.loads(proc.stderr.strip().splitlines()[-1])
    assert report["code"] == code, proc.stderr
    return set(report["modules"]), proc.stdout + proc.stderr.rsplit("\n", 2)[0]


def test_the_table_names_every_command_module():
    modules = {p.stem.replace("_", "-") for p in CLI_DIR.glob("*.py") if p.stem not in ("__init__", "common")}
    modules |= {p.parent.name for p in CLI_DIR.glob("*/__init__.py")}  # a verb with subcommands (smoke)
    assert set(COMMANDS) == modules
    assert all(0 < len(line) <= 62 and line.endswith((".", "?")) for line in COMMANDS.values())


def test_each_command_shows_the_line_of_the_table():
    ctx = click.Context(main)
    for name, line in COMMANDS.items():
        assert main.get_command(ctx, name).get_short_help_str(limit=200) == line


def test_help_imports_no_command_module():
    modules, out = loaded("--help")
    assert out.startswith("Usage: c128patch [OPTIONS] COMMAND [ARGS]...")
    ours = {m for m in modules if m.startswith("c128patch")}
    assert ours == {"c128patch", "c128patch.__main__", "c128patch.cli"}, ours
    assert not [m for m in modules if m.split(".")[0] in HEAVY]
    listed = " ".join(out.split("Commands:")[1].split())
    for name, line in COMMANDS.items():  # every line whole at 80 columns, none cut with "..."
        assert f" {name} {line} " in f" {listed} ", name


@pytest.mark.parametrize("verb", sorted(COMMANDS))
def test_a_verbs_help_imports_that_verb_only(verb):
    modules, out = loaded(verb, "--help")
    ours = {m for m in modules if m.startswith("c128patch")}
    assert ours - LIGHT == {f"c128patch.cli.{verb.replace('-', '_')}"} | EXTRA.get(verb, set()), ours
    assert not [m for m in modules if m.split(".")[0] in HEAVY]
    assert out.startswith(f"Usage: c128patch {verb} ")


@pytest.mark.parametrize("sub", sorted(SMOKE))
def test_a_smoke_subcommands_help_imports_that_subcommand_only(sub):
    modules, out = loaded("smoke", sub, "--help")
    ours = {m for m in modules if m.startswith("c128patch")}
    assert ours - LIGHT == {"c128patch.cli.smoke", f"c128patch.cli.smoke.{sub}"} | SMOKE[sub], ours
    assert not [m for m in modules if m.split(".")[0] in HEAVY]
    assert out.startswith(f"Usage: c128patch smoke {sub} [OPTIONS]")


def test_an_error_and_the_lines_a_verb_says_load_no_rich(tmp_path):
    """rich draws (a progress bar on a terminal, tables, styled lines); an error and plain lines print without it."""
    modules, out = loaded("status", "--tree", str(tmp_path), code=2)
    assert out.startswith(f"c128patch: error: not a git repository: {tmp_path}")
    assert not [m for m in modules if m.startswith("rich")]
    modules, out = loaded("lint", "--offline")
    assert re.search(r"\d+ entries, 0 error\(s\)", out) and "c128patch.series.manifest" in modules
    assert not [m for m in modules if m.startswith("rich")]


def test_smoke_help_lists_its_subcommands_from_the_table():
    from c128patch.cli.smoke import SUBCOMMANDS

    _modules, out = loaded("smoke", "--help")
    listed = " ".join(out.split("Commands:")[1].split())
    assert all(f"{name} {line}" in listed for name, line in SUBCOMMANDS.items()), listed


def test_the_readme_gives_the_benchmarks_figures():
    result = json.loads((REPO_ROOT / "ci" / "bench" / "results" / "startup.json").read_text())
    assert result["command"].startswith("python ci/bench/bench_startup.py") and result["runs"] >= 11
    assert result["target_cpu_s"] == 0.12 and "--before" not in result["command"]
    cases = result["cases"]
    verbs = [c["median_cpu_s"] for name, c in cases.items()
             if name.startswith("c128patch ") and name != "c128patch --help"]
    span = f"{min(verbs):.3f}" if f"{min(verbs):.3f}" == f"{max(verbs):.3f}" else f"{min(verbs):.3f}–{max(verbs):.3f}"
    top, click_alone = cases["c128patch --help"], cases["python -c 'import click'"]["median_cpu_s"]
    assert top["median_cpu_s"] <= 0.12  # the committed measurement meets the target
    readme = " ".join((REPO_ROOT / "README.md").read_text().split())
    assert (f"`c128patch --help` {top['median_cpu_s']:.3f} s CPU (median of {result['runs']}, {top['x_python']}× "
            f"`python -c pass`; click's own help, importing click alone {click_alone:.3f} s; target ≤ 0.12 s: met), "
            f"a verb's `--help` {span} s, at load {round(result['load_average'][0])} on the 2 cores") in readme


def test_the_console_entry_is_the_click_cli(monkeypatch):
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    from c128patch import __main__

    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"c128patch": "c128patch.__main__:main"}
    called = []
    monkeypatch.setattr(__main__.cli, "main", lambda: called.append(True))
    __main__.main()
    assert called == [True]  # the entry runs the click group, after setting the collector's thresholds


def test_no_generated_copy_of_the_help_ships():
    """`--help` is rendered by click when asked: no copy of it is kept in the package or in the wheel."""
    assert not (REPO_ROOT / "tooling" / "c128patch" / "help.txt").exists()
    for path in ("README.md", "pyproject.toml", ".ci/run"):
        assert "help.txt" not in (REPO_ROOT / path).read_text(), path


@pytest.mark.parametrize("args, first", [(["--version"], "c128patch, version "),
                                         (["-h"], "Usage: c128patch [OPTIONS] COMMAND [ARGS]...")],
                         ids=["version", "h"])
def test_the_console_entry_answers_version_and_short_help(args, first):
    _, out = loaded(*args)
    assert out.startswith(first)


def test_python_dash_m_is_named_as_click_names_it():
    proc = subprocess.run([sys.executable, "-m", "c128patch", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("Usage: python -m c128patch [OPTIONS]")


def test_check_apply_s_stack_loads_no_wheel_choosing_module(sglang_release_repo):
    """packaging.tags and importlib.metadata choose a wheel for this interpreter (``wheel``, the release cache's
    download); check, apply and status never do, and importing them cost ~25 ms at every start
    (upstream.releases imports them where a wheel is chosen)."""
    modules, out = loaded("check", "--sglang-rev", "v0.5.23", "--repo", str(sglang_release_repo))
    assert "c128patch.ops.applier" in modules or "c128patch.ops.check" in modules, out
    assert "c128patch.upstream.releases" in modules
    assert not {"packaging.tags", "packaging.utils", "importlib.metadata"} & modules
