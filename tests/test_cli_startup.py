"""The CLI starts light: `c128patch --help` lists every command from the table in cli/__init__.py
without importing any command module, and a verb's `--help` imports that verb's module only (no
rich, unidiff, packaging or core module). Timing lives in ci/bench/bench_startup.py; this checks
what is imported, which is what the timing comes from."""

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
EXTRA = {"capacity": {"c128patch.capacity", "c128patch.capacity.model"},
         "smoke": {"c128patch.smoke", "c128patch.smoke.presets"}}
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


def test_the_readme_gives_the_benchmarks_figures():
    result = json.loads((REPO_ROOT / "ci" / "bench" / "results" / "startup.json").read_text())
    cases = result["cases"]
    median = {name: c["median_cpu_s"] for name, c in cases.items()}
    verbs = [v for k, v in median.items() if k.startswith("c128patch ") and k != "c128patch --help"]
    before = [v for k, v in median.items() if k.startswith("before: c128patch ") and k != "before: c128patch --help"]
    click_alone = median["python -c 'import click'"]
    readme = " ".join((REPO_ROOT / "README.md").read_text().split())
    assert (f"`c128patch --help` {median['c128patch --help']:.3f} s CPU (median, "
            f"{cases['c128patch --help']['x_python']}× `python -c pass`; `import click` alone "
            f"{click_alone:.3f} s; {median['before: c128patch --help']:.3f} s "
            f"before commands were imported on use), a verb's `--help` {min(verbs):.3f}–{max(verbs):.3f} s "
            f"({min(before):.3f}–{max(before):.3f} s before), at load {round(result['load_average'][0])} on the "
            f"2 cores;") in readme
