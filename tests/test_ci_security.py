"""The CI recipes users copy into `.github/workflows/` (ci/github/): `zizmor --offline` finds nothing
at any persona (regular, pedantic, auditor) except what a `# zizmor: ignore[...]` comment suppresses with
its reason, and every `uses:` names a full commit id with the version beside it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support import REPO_ROOT

RECIPES = sorted((REPO_ROOT / "ci" / "github").glob("*.yml"))
USES = re.compile(r"^\s*(?:-\s+)?uses:\s*(\S+)(.*)$")


def test_there_are_recipes():
    assert {p.name for p in RECIPES} >= {"c128patch-watch.yml", "c128patch-gpu-smoke.yml"}


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_every_action_is_pinned_to_a_commit_with_its_version(recipe):
    uses = [USES.match(line) for line in recipe.read_text().splitlines()]
    uses = [m for m in uses if m]
    assert uses
    for m in uses:
        ref, rest = m.groups()
        assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", ref), f"{recipe.name}: {ref} is not pinned to a commit"
        assert re.match(r"\s+# v\d+\.\d+\.\d+\b", rest), f"{recipe.name}: {ref} has no `# vX.Y.Z` comment"


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_every_suppression_says_why(recipe):
    for line in recipe.read_text().splitlines():
        if "zizmor:" in line:
            m = re.search(r"# zizmor: ignore\[[\w-]+(?:,\s*[\w-]+)*\]\s+(.*)$", line)
            assert m and len(m.group(1).split()) >= 4, f"{recipe.name}: a suppression without its reason: {line}"


def test_zizmor_finds_nothing_unsuppressed(tmp_path):
    zizmor = shutil.which("zizmor", path=str(Path(sys.executable).parent)) or shutil.which("zizmor")  # venv unactivated
    assert zizmor, "zizmor is not installed (it is in the [test] extra: pip install -e '.[test]')"
    workflows = tmp_path / ".github" / "workflows"
    workflows.mkdir(parents=True)
    for recipe in RECIPES:
        shutil.copy(recipe, workflows / recipe.name)
    for persona in ("regular", "pedantic", "auditor"):
        proc = subprocess.run([zizmor, "--offline", "--persona", persona, "--format", "json", "--no-progress", "."],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert proc.stdout.strip(), proc.stderr  # it ran (exit 10 and up means findings, below)
        findings = [f for f in json.loads(proc.stdout) if not f.get("ignored")]
        assert findings == [], f"{persona}: " + "; ".join(where(f) for f in findings)
        assert proc.returncode == 0, proc.stderr


def where(finding: dict) -> str:
    loc = finding["locations"][0]
    path = loc["symbolic"]["key"].get("Local", {}).get("verbatim_path", "?")
    return f"{finding['ident']} at {path}:{loc['concrete']['location']['start_point']['row'] + 1}"
