"""The GitHub Actions recipe in ci/github/: valid YAML, the matrix and cache key the docs promise,
and every c128patch command line in it accepted by the real CLI."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from c128patch.cli import main
from c128patch.upstream.releases import DEFAULT_RELEASES
from support import workflow_commands

yaml = pytest.importorskip("yaml")

WORKFLOW = Path(__file__).resolve().parents[1] / "ci" / "github" / "c128patch-gpu-smoke.yml"


@pytest.fixture(scope="module")
def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


SAMPLE = {"TP": "8", "DURATION": "900", "UPSTREAM_REV": "v0.5.23"}  # the rest become paths


def commands(script: str) -> list[list[str]]:
    return workflow_commands(script, SAMPLE)


def test_parses_with_matrix_and_triggers(workflow):
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` key as true
    assert {"workflow_dispatch", "push", "schedule"} <= set(triggers)
    job = workflow["jobs"]["smoke"]
    assert "self-hosted" in job["runs-on"] and "gpu" in job["runs-on"]
    matrix = job["strategy"]["matrix"]
    assert matrix["tier"] == ["kernel", "server"]
    assert matrix["upstream"] == [f"v{v}" for v in DEFAULT_RELEASES]
    assert job["env"]["UPSTREAM_REV"] == "${{ matrix.upstream }}"


def test_no_pull_request_reaches_the_self_hosted_runner(workflow):
    triggers = workflow.get("on", workflow.get(True))
    assert not {"pull_request", "pull_request_target", "workflow_run", "issue_comment"} & set(triggers)
    job = workflow["jobs"]["smoke"]
    assert "github.event.pull_request.head.repo.full_name == github.repository" in job["if"]


def test_the_token_reads_and_is_not_kept(workflow):
    assert workflow["permissions"] == {} and workflow["jobs"]["smoke"]["permissions"] == {"contents": "read"}
    [checkout] = [s for s in workflow["jobs"]["smoke"]["steps"] if s.get("uses", "").startswith("actions/checkout@")]
    assert checkout["with"] == {"persist-credentials": False}


def test_results_cached_by_rev_and_series_hash(workflow):
    steps = workflow["jobs"]["smoke"]["steps"]
    uses = {s.get("uses", "").split("@")[0]: s for s in steps if "uses" in s}
    key = uses["actions/cache/restore"]["with"]["key"]
    for part in ("matrix.tier", "matrix.upstream", "hashFiles('patches/**', 'csrc/**', 'overlay/**', 'tests/gpu/**'"):
        assert part in key, key
    assert uses["actions/cache/save"]["with"]["key"] == "${{ steps.cache.outputs.cache-primary-key }}"
    assert "success()" in uses["actions/cache/save"]["if"]
    assert uses["actions/upload-artifact"]["if"] == "always()"
    runs = [s for s in steps if "run" in s and "c128patch smoke" in s["run"]]
    assert all("cache-hit != 'true'" in s["if"] for s in runs)  # a cached cell is not run again


def test_every_command_line_is_accepted_by_the_cli(workflow):
    seen = []
    for step in workflow["jobs"]["smoke"]["steps"]:
        for args in commands(step.get("run", "")):
            cmd = main.get_command(click.Context(main), args[0])
            assert cmd is not None, args
            cmd.make_context(args[0], args[1:])  # raises on an unknown or malformed option
            seen.append(" ".join(args[:3]))
    assert ("smoke --tier kernel" in seen and seen.count("smoke --tier server") == 2
            and "apply --sglang-rev v0.5.23" in seen)
