"""The machine interface: every `--json` report carries `"schema": 1` and matches its verb's JSON Schema,
docs/schemas/<verb>.json (draft 2020-12); an error object matches docs/schemas/error.json. The reports are
real runs: cheap verbs on the product series, the tree verbs on a small real series applied to a clone of
the release history. Not validated here: `build` (a source build of sglang) and smoke's run report (a GPU
run: its `--stage` report is)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from c128patch.cli import COMMANDS, SCHEMA_VERSION
from support import REPO_ROOT, invoke, make_test_series

SCHEMAS = REPO_ROOT / "docs" / "schemas"
CUH = "python/sglang/kernels/jit/csrc/deepseek_v4/c128_online_v2.cuh"
NOT_VALIDATED = {"build"}  # a source build of sglang: its schema is read from the code alone

# cheap real invocations on the product series: (verb, arguments)
CHEAP = [
    ("gates", ["gates"]),
    ("matrix", ["matrix"]),
    ("lint", ["lint", "--offline"]),
    ("capacity", ["capacity", "--preset", "pro", "--formula", "0.5.20", "--draft-tokens", "6", "--budget-gib", "39.04",
                  "--explain-pr"]),
    ("check", ["check", "--sglang-rev", "v0.5.23"]),
    ("audit", ["audit"]),
    ("contract", ["contract", "--sglang-rev", "v0.5.23"]),
    ("bisect", ["bisect", "--onto", "v0.5.23"]),
    ("doctor", ["doctor"]),
]
ERRORS = [
    ["check", "--deep=yes"],  # a usage error: a flag given a value (bare check checks every release)
    ["aply"],  # a usage error: an unknown verb
    ["matrix", "--sglang-rev", "main"],  # a refusal (C128Error)
]


def schema_of(verb: str) -> dict:
    return json.loads((SCHEMAS / f"{verb}.json").read_text())


def validator():
    """jsonschema's Draft202012Validator, imported when a test here runs: its import builds a grammar (1.5 CPU-s),
    which every xdist worker paid at collection, in each of CI's three runs."""
    from jsonschema import Draft202012Validator

    return Draft202012Validator


def assert_valid(verb: str, report: dict) -> None:
    assert report.get("schema") == SCHEMA_VERSION, report
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in validator()(schema_of(verb)).iter_errors(report)]
    assert errors == [], (verb, errors)


def test_every_verb_has_a_schema_and_nothing_else_does():
    assert {p.stem for p in SCHEMAS.glob("*.json")} == {*COMMANDS, "error"}


@pytest.mark.parametrize("verb", [*sorted(COMMANDS), "error"])
def test_each_schema_is_draft_2020_12_of_this_version(verb):
    schema = schema_of(verb)
    validator().check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert "schema" in schema["required"] and schema["properties"]["schema"] == {"const": SCHEMA_VERSION}


def test_the_readme_says_what_the_version_means():
    text = " ".join((SCHEMAS / "README.md").read_text().split())
    assert f'"schema": {SCHEMA_VERSION}' in text and "docs/schemas/error.json" in text


def test_a_report_of_another_version_or_shape_is_refused():
    """The schemas can fail: a report of version 2, or one without a required key, does not match."""
    report = invoke("gates").out
    assert_valid("gates", report)
    for bad in ({**report, "schema": 2}, {k: v for k, v in report.items() if k != "gates"}):
        assert list(validator()(schema_of("gates")).iter_errors(bad))


@pytest.mark.parametrize("verb, args", CHEAP, ids=[verb for verb, _ in CHEAP])
def test_a_cheap_verbs_report_matches_its_schema(verb, args, sglang_release_repo):
    res = invoke(*args)
    assert res.out, (res.code, res.err)
    assert "error" not in res.out, res.out
    assert_valid(verb, res.out)


@pytest.mark.parametrize("args", ERRORS, ids=" ".join)
def test_an_error_object_matches_the_error_schema(args, sglang_release_repo):
    res = invoke(*args, "--json", as_json=False)
    assert res.code == 2 and res.out["ok"] is False, (res.code, res.text)
    assert_valid("error", res.out)


@pytest.fixture(scope="module")
def tree_reports(sglang_release_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    """Reports of the verbs that work on a tree or a wheel, run on a small real series (one patch, one
    overlay) in order: apply on v0.5.23, the same apply again, status, refresh --check, treecheck, smoke's
    --stage, a layer made and an entry added from a commit, rebase onto v0.5.22, watch onto v0.5.23, a
    wheel from the 0.5.20 release and its verification."""
    root = tmp_path_factory.mktemp("schemas")
    series = make_test_series(root / "series", sglang_release_repo, {CUH: (
        "    const uint32_t prefix_len = seq_len - extend_len;\n",
        "    const uint32_t prefix_len = seq_len - extend_len;  // c128patch test\n")})
    tree = root / "sglang"
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(sglang_release_repo), str(tree)], check=True)
    subprocess.run(["git", "-C", str(tree), "checkout", "--quiet", "-b", "main", "v0.5.23"], check=True)
    on = ["--series", str(series)]
    at = [*on, "--tree", str(tree)]
    runs = [
        ("apply", ["apply", "--sglang-rev", "v0.5.23", "--repo", str(tree), *on]),
        ("apply", ["apply", "--sglang-rev", "v0.5.23", "--repo", str(tree), *on]),
        ("status", ["status", *at]),
        ("refresh", ["refresh", "--check", *at]),
        ("treecheck", ["treecheck", *at]),
        ("smoke", ["smoke", "kernel", "--tree", str(tree), "--stage", str(root / "stage")]),
        ("layer", ["layer", "new", str(root / "layer"), "--name", "acme", *on]),
    ]
    reports: dict[str, list[dict]] = {}
    for verb, args in runs:
        reports.setdefault(verb, []).append(invoke(*args).out)
    (tree / "python" / "sglang" / "acme_note.py").write_text("NOTE = 1\n")
    subprocess.run(["git", "-C", str(tree), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@t.invalid", "commit", "--quiet",
                    "-m", "acme: a note"], check=True)
    later = [
        ("layer", ["layer", "add-entry", "--layer", str(root / "layer"), "--from-commit", "HEAD", "--why", "a note",
                   *at]),
        ("rebase", ["rebase", "--onto", "v0.5.22", *at]),
        ("watch", ["watch", "--onto", "v0.5.23", "--out", str(root / "watch"), *on]),
        ("wheel", ["wheel", "--from-release", "0.5.20", "-o", str(root / "dist"), *on]),
    ]
    for verb, args in later:
        reports.setdefault(verb, []).append(invoke(*args).out)
    wheel = next((root / "dist").glob("sglang-0.5.20+c128.*.whl"))
    reports["verify-wheel"] = [invoke("verify-wheel", str(wheel)).out]
    return reports


VALIDATED_ON_A_TREE = ["apply", "status", "refresh", "treecheck", "smoke", "layer", "rebase", "watch", "wheel",
                       "verify-wheel"]


@pytest.mark.parametrize("verb", VALIDATED_ON_A_TREE)
def test_a_tree_verbs_report_matches_its_schema(verb, tree_reports):
    for report in tree_reports[verb]:
        assert report and "error" not in report, report
        assert_valid(verb, report)


def test_every_verb_but_build_has_a_validated_report():
    assert {verb for verb, _ in CHEAP} | set(VALIDATED_ON_A_TREE) == set(COMMANDS) - NOT_VALIDATED
