"""The CLI starts light: the console entry prints `c128patch --help`, a verb's `--help` and `--version`
from help.txt (the click tree's own output) without importing click; through click, `--help` lists every
command from the table in cli/__init__.py without importing any command module, and a verb's `--help`
imports that verb's module only (no rich, unidiff, packaging or core module). Timing lives in
ci/bench/bench_startup.py; this checks what is imported, which is what the timing comes from."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import click
import pytest

from c128patch.cli import COMMANDS, main
from support import REPO_ROOT

CLI_DIR = REPO_ROOT / "tooling" / "c128patch" / "cli"
LIGHT = {"c128patch", "c128patch.cli", "c128patch.cli.common", "c128patch.errors", "c128patch.exitcodes",
         "c128patch.upstream"}
# what a verb's own options need to be listed (their choices and defaults)
EXTRA = {"capacity": {"c128patch.capacity", "c128patch.capacity.model"}}
# smoke's subcommands, each listed by `smoke --help` from its table, and what each one's --help imports
SMOKE = {"kernel": {"c128patch.smoke", "c128patch.smoke.presets", "c128patch.cli.smoke.options"},
         "upstream": {"c128patch.cli.smoke.options"},
         "server": {"c128patch.smoke", "c128patch.smoke.presets", "c128patch.cli.smoke.options"}}
HEAVY = ("rich", "unidiff", "packaging", "tomli_w", "wheel", "build")

PROBE = """
import json, sys
from c128patch.cli import main
try:
    main(sys.argv[1:], prog_name="c128patch")
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def loaded(*args: str) -> tuple[set[str], str]:
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "80"})
    report = json.loads(proc.stderr.strip().splitlines()[-1])
    assert report["code"] == 0, proc.stderr
    return set(report["modules"]), proc.stdout


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
    ours = {m for m in modules if m.startswith("c128patch")}
    assert ours == {"c128patch", "c128patch.cli"}, ours
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


def test_smoke_help_lists_its_subcommands_from_the_table():
    from c128patch.cli.smoke import SUBCOMMANDS

    _modules, out = loaded("smoke", "--help")
    listed = " ".join(out.split("Commands:")[1].split())
    assert all(f"{name} {line}" in listed for name, line in SUBCOMMANDS.items()), listed


def test_the_readme_gives_the_benchmarks_figures():
    result = json.loads((REPO_ROOT / "ci" / "bench" / "results" / "startup.json").read_text())
    cases = result["cases"]
    median = {name: c["median_cpu_s"] for name, c in cases.items()}
    verbs = [v for k, v in median.items() if k.startswith("c128patch ") and k != "c128patch --help"]
    before = [v for k, v in median.items() if k.startswith("before: c128patch ") and k != "before: c128patch --help"]
    click_alone = median["python -c 'import click'"]
    span = f"{min(verbs):.3f}" if f"{min(verbs):.3f}" == f"{max(verbs):.3f}" else f"{min(verbs):.3f}–{max(verbs):.3f}"
    readme = " ".join((REPO_ROOT / "README.md").read_text().split())
    assert (f"`c128patch --help` {median['c128patch --help']:.3f} s CPU (median, "
            f"{cases['c128patch --help']['x_python']}× `python -c pass`; printed without importing click, which "
            f"alone costs {click_alone:.3f} s; {median['before: c128patch --help']:.3f} s "
            f"before commands were imported on use), a verb's `--help` {span} s "
            f"({min(before):.3f}–{max(before):.3f} s before), at load {round(result['load_average'][0])} on the "
            f"2 cores;") in readme


# ---------------------------------------------------------------------------- the console entry's fast path
# `c128patch --help`, `c128patch VERB --help` and `--version` are printed from tooling/c128patch/help.txt by
# c128patch/__main__.py without importing click (click alone is most of the 0.06 s); the file must be what
# the click tree prints, so a command added, renamed or changed without `python ci/refresh_help.py` fails here.
ENTRY_PROBE = """
import sys
modules = set(sys.modules)  # what any python starts with
sys.argv[0] = "/venv/bin/c128patch"  # as pip's console script runs it
from c128patch.__main__ import main
try:
    code = main()
except SystemExit as exc:
    code = exc.code
added = sorted(set(sys.modules) - modules)
import json
print(json.dumps({"code": code, "modules": added}), file=sys.stderr)
"""
FAST = [["--help"], ["-h"], ["--version"], *([verb, option] for verb in sorted(COMMANDS) for option in ("--help", "-h"))]


def entry(*args: str, columns: str = "80") -> tuple[int, set[str], str, str]:
    """The console entry run with ``args``: exit code, the modules it imported, stdout, stderr."""
    proc = subprocess.run([sys.executable, "-c", ENTRY_PROBE, *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": columns})
    report = json.loads(proc.stderr.strip().splitlines()[-1])
    return report["code"], set(report["modules"]), proc.stdout, proc.stderr


def refresh_help():
    sys.path.insert(0, str(REPO_ROOT / "ci"))
    import refresh_help

    return refresh_help


@pytest.fixture(scope="module")
def clicks_own() -> dict[tuple[str, ...], tuple[int, str]]:
    """(exit code, stdout) of the click CLI itself at 80 columns for each FAST argument list."""
    return dict(zip(map(tuple, FAST), refresh_help().clicks_output(FAST)))


def test_the_help_file_is_the_click_trees_own_rendering():
    from c128patch.__main__ import HELP_FILE

    assert HELP_FILE.read_text() == refresh_help().render(), "help.txt is stale: python ci/refresh_help.py"


def test_the_help_file_holds_nothing_of_this_machine():
    """It ships in the wheel: a default shown as this machine's interpreter or folders would be wrong
    everywhere else (and the test above fails on every other machine)."""
    from c128patch.__main__ import HELP_FILE

    text = HELP_FILE.read_text()
    for here in {sys.executable, str(REPO_ROOT), os.path.expanduser("~"), os.getcwd()}:
        assert here not in text, here


def test_the_entry_point_is_the_fast_one():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"c128patch": "c128patch.__main__:main"}


@pytest.mark.parametrize("args", FAST, ids=" ".join)
def test_the_fast_path_prints_what_click_prints(args, clicks_own):
    from c128patch.__main__ import fast_output

    code, out = clicks_own[tuple(args)]
    assert code == 0 and out
    assert fast_output(args, "c128patch") == out


@pytest.mark.parametrize("args", [["--help"], ["check", "--help"], ["--version"]], ids=" ".join)
def test_the_console_entry_answers_without_click(args, clicks_own):
    code, modules, out, err = entry(*args)
    assert code == 0, err
    assert modules == {"__future__", "c128patch", "c128patch.__main__"}  # not click, not even typing
    assert (code, out) == clicks_own[tuple(args)]


@pytest.mark.parametrize("args, columns", [
    (["--help"], "60"),                 # narrower than click's 80: click wraps at 58, so click answers
    (["apply", "--json", "--help"], "80"),
    (["nope", "--help"], "80"),         # an unknown command: click's one-line usage error
    (["apply"], "80"),
], ids=["narrow", "more-args", "unknown-verb", "no-help"])
def test_anything_else_goes_to_click(args, columns, monkeypatch):
    from c128patch.__main__ import fast_output

    monkeypatch.setenv("COLUMNS", columns)
    assert fast_output(args, "c128patch") is None
    if args[-1] == "--help":
        code, modules, out, err = entry(*args, columns=columns)
        assert "click" in modules
        assert [(code, out)] == refresh_help().clicks_output([args], int(columns))


def test_python_dash_m_is_named_as_click_names_it():
    from c128patch.__main__ import fast_output

    assert fast_output(["--help"], "__main__.py") is None
    proc = subprocess.run([sys.executable, "-m", "c128patch", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("Usage: python -m c128patch [OPTIONS]")


@pytest.mark.parametrize("columns", [None, "100", "80", "79", "0", "-3", "wide"])
def test_terminal_columns_are_shutils(monkeypatch, columns):
    import shutil

    from c128patch.__main__ import terminal_columns

    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    assert terminal_columns() == shutil.get_terminal_size().columns
