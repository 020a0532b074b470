"""Evidence per release: keys, staging every release for one GPU call, the committed results made
from real smoke reports, the matrix (verified / failed / stale / unverified), and the one-line
notes of apply and wheel. On the real release history and the product series."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from c128patch.errors import C128Error
from c128patch.evidence import staging
from c128patch.evidence.keys import EvidenceKey, key_for, key_from_provenance, series_hash
from c128patch.evidence.matrix import build_matrix, release_note, verification_note
from c128patch.evidence.results import KINDS, RESULTS_UNDER, load_results, summarize, write_result
from c128patch.git import Git
from c128patch.ops.check import support_note
from c128patch.series.manifest import load_series
from support import RELEASES, REPO_ROOT, invoke, make_test_series, needs_torch

sys.path.insert(0, str(REPO_ROOT / "ci" / "gpu"))  # the GPU run's harness and collector live beside their scripts
sys.path.insert(0, str(REPO_ROOT / "ci"))  # README's figures, beside ci/refresh_matrix.py
import figures  # noqa: E402
import gpu_run  # noqa: E402
from collect_results import collect_run, compare_bench, from_smoke_report  # noqa: E402

OLD_REPORT = REPO_ROOT / "ci" / "gpu" / "results" / "smoke-2026-11-29.json"
SUITE = REPO_ROOT / "tests" / "gpu"
CUH = "python/sglang/kernels/jit/csrc/deepseek_v4/c128_online_v2.cuh"


def run(*args: str):
    res = invoke(*args, as_json=False)
    return res.code, res.text, res.err


@pytest.fixture(scope="module")
def history(sglang_release_repo: Path) -> Git:
    return Git(git_dir=sglang_release_repo)


@pytest.fixture(scope="module")
def staged(history: Git, real_series, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """v0.5.20 and v0.5.23 staged, v0.5.20 also with the series of this checkout's HEAD (a clone of any
    branch, or detached, has one)."""
    dest = tmp_path_factory.mktemp("stage")
    before = staging.export_series(Git(worktree=REPO_ROOT), "HEAD", tmp_path_factory.mktemp("before-series"))
    staging.stage(real_series, history, ["v0.5.20", "v0.5.23"], dest, SUITE, before=before,
                  before_revs=("v0.5.20",), before_from="HEAD")
    return dest


# --------------------------------------------------------------------------- keys


def test_key_is_the_keyed_sources_and_the_hash_of_the_files_the_rev_plans(history: Git, real_series):
    commit = history.rev_parse("v0.5.20")
    key = key_for(real_series, history, commit)
    files = dict(key.files)
    assert files["python/sglang/kernels"] == "tree " + history.out("rev-parse", "v0.5.20:python/sglang/kernels")
    assert (files["python/sglang/srt/environ.py"]
            == "blob " + history.out("rev-parse", "v0.5.20:python/sglang/srt/environ.py"))
    touched = {p for e in real_series.entries for p in ([e.target] if not e.is_patch else [])}
    assert touched <= set(files) and all(files[t] == "absent" for t in touched)  # overlay targets: absent upstream
    assert key.sources == series_hash(sorted(key.files))
    assert key != key_for(real_series, history, history.rev_parse("v0.5.23"))


def test_committed_results_are_keyed_by_content_and_equal_the_staged_trees_keys(staged: Path):
    """The migration (ci/rekey_results.py) proven: the content key of the staged trees (the tool's own
    history, computed now) is the key every committed result of that release carries."""
    results = REPO_ROOT / "ci" / "gpu" / "results"
    for rel in staging.read_manifest(staged)["releases"]:
        key = EvidenceKey.from_json(rel["trees"]["patched"]["key"])
        for kind in ("compile", "suite", "differential", "memcheck", "racecheck", "upstream-suite", "simulation"):
            data = json.loads((results / rel["rev"] / f"{kind}.json").read_text())
            assert data["key"]["sources"] == key.sources, (rel["rev"], kind)  # the upstream part, always
            if kind in ("compile", "suite", "differential", "simulation"):  # re-run on today's series
                assert EvidenceKey.from_json(data["key"]) == key, (rel["rev"], kind)
                assert dict(key.files) == data["key"]["files"]
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "ci" / "rekey_results.py"), "--check"],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and "would re-key 0 result(s)" in proc.stdout, proc.stdout + proc.stderr


def test_rekey_converts_an_old_style_key_and_is_idempotent(history: Git, real_series, tmp_path: Path):
    sys.path.insert(0, str(REPO_ROOT / "ci"))
    import rekey_results

    key = key_for(real_series, history, history.rev_parse("v0.5.22"))
    old = {"upstream_tree": history.out("rev-parse", "v0.5.22^{tree}"), "series_hash": key.series_hash}
    path = tmp_path / "v0.5.22" / "racecheck.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"kind": "racecheck", "key": old, "ok": True}, indent=1) + "\n")
    (tmp_path / "v0.5.22" / "notes.json").write_text('{"key": null}\n')  # no key: left alone
    changed, problems = rekey_results.rekey(tmp_path, real_series, history)
    data = json.loads(path.read_text())
    assert changed == [path] and not problems and EvidenceKey.from_json(data["key"]) == key
    assert data["rekeyed_from"]["upstream_tree"] == old["upstream_tree"] and path.read_text().startswith('{\n "')
    assert rekey_results.rekey(tmp_path, real_series, history) == ([], [])
    path.write_text(json.dumps({"key": {**old, "upstream_tree": "0" * 40}}))
    changed, problems = rekey_results.rekey(tmp_path, real_series, history)
    assert not changed and "is no release commit of the history" in problems[0]


def test_key_changes_with_a_file_that_rev_plans_and_not_with_another_revs_variant(history: Git, tmp_path: Path):
    root = tmp_path / "series"
    for folder in ("patches", "csrc", "overlay"):
        shutil.copytree(REPO_ROOT / folder, root / folder)
    series = load_series(root)
    before = {rev: key_for(series, history, history.rev_parse(rev)) for rev in ("v0.5.20", "v0.5.23")}
    variant = root / "patches" / "0003-c128-dspark-record-streams.v0.5.20.patch"  # chosen for 0.5.20 only
    variant.write_text(variant.read_text() + "\n")
    from c128patch.ops.lint import update_hashes

    update_hashes(load_series(root))
    series = load_series(root)
    after = {rev: key_for(series, history, history.rev_parse(rev)) for rev in ("v0.5.20", "v0.5.23")}
    assert after["v0.5.20"].series_hash != before["v0.5.20"].series_hash
    assert after["v0.5.23"] == before["v0.5.23"]


# --------------------------------------------------------------------------- staging


def test_staged_tree_carries_a_provenance_record_with_its_key(staged: Path, history: Git, real_series):
    manifest = staging.read_manifest(staged)
    rel = {r["rev"]: r for r in manifest["releases"]}["v0.5.20"]
    record = json.loads((staged / "v0.5.20/patched/sglang/c128patch_provenance.json").read_text())
    key = key_for(real_series, history, history.rev_parse("v0.5.20"))
    assert key_from_provenance(record) == key
    assert EvidenceKey.from_json(rel["trees"]["patched"]["key"]) == key
    assert record["upstream"]["rev"] == "v0.5.20"


def test_stage_holds_patched_upstream_and_before_trees_of_the_suites_subset(staged: Path):
    ours = "sglang/kernels/jit/csrc/deepseek_v4/online_c128_dspark.cuh"
    assert ((staged / "v0.5.20/patched" / ours).read_text()
            == (REPO_ROOT / "csrc/deepseek_v4/online_c128_dspark.cuh").read_text())
    assert not (staged / "v0.5.20/upstream" / ours).exists()
    main_cuh = Git(worktree=REPO_ROOT).blob("HEAD", "csrc/deepseek_v4/online_c128_dspark.cuh")
    assert (staged / "v0.5.20/before" / ours).read_bytes() == main_cuh
    assert not (staged / "v0.5.23/before").exists()
    size = sum(p.stat().st_size for p in staged.rglob("*") if p.is_file())
    assert size < 16 * 1024 * 1024  # all four releases stay far under a device call's 64 MiB


def test_stage_refuses_a_release_the_series_does_not_apply_to(history: Git, sglang_release_repo: Path, tmp_path: Path):
    only_023 = "from sglang.kernels.ops.speculative.dspark.static_accept_tail import static_accept_tail\n"
    series = load_series(make_test_series(tmp_path / "s", sglang_release_repo, {
        "python/sglang/srt/speculative/dspark_components/dspark_verify.py": (only_023, only_023 + "# x\n")},
        overlay=False))
    with pytest.raises(C128Error, match="the series does not apply to v0.5.20: test-patch: conflict"):
        staging.patched_sources(series, history, "v0.5.20", tmp_path / "out")


@pytest.mark.parametrize("rev", ["..", "../victim", "/tmp/victim", "."])
def test_stage_confines_a_rev_before_removing_its_folder(real_series, history: Git, tmp_path: Path, rev: str):
    """``stage`` removed ``dest/<rev>`` before anything checked ``rev``: ".." took ``dest``'s parent with it."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("x")
    (tmp_path / "dest" / "old").mkdir(parents=True)
    with pytest.raises(C128Error, match="unsafe path in the releases to stage"):
        staging.stage(real_series, history, [rev if rev != "/tmp/victim" else str(victim)], tmp_path / "dest", SUITE)
    assert (victim / "keep").exists() and (tmp_path / "dest" / "old").exists()


# --------------------------------------------------------------------------- results from smoke reports


def test_results_from_a_real_smoke_report_carry_counts_device_and_relative_paths():
    report = json.loads(OLD_REPORT.read_text())
    key = EvidenceKey("t" * 40, "s" * 64)
    files = from_smoke_report(report, rev="v0.5.23", label="patched", key=key, date="2026-11-29",
                              roots={"/tmp/smoke": "$OUT/smoke"})
    assert sorted(files) == ["differential", "memcheck", "racecheck", "simulation", "suite"]  # it ran the simulation
    suite = files["suite"]
    assert (suite["passed"], suite["failed"], suite["ok"]) == (52, 0, True)
    assert suite["key"] == key.to_json() and suite["device"].startswith("NVIDIA H200 (sm_90)")
    assert files["memcheck"]["sanitizer"]["errors"] == 0 and files["racecheck"]["ok"]
    assert files["differential"]["summary"]["regressed"] == 0
    assert "/tmp/smoke" not in json.dumps(files)


def test_a_failed_test_makes_the_suite_result_not_ok():
    report = json.loads(OLD_REPORT.read_text())
    report["passes"]["patched"]["counts"] = {**report["passes"]["patched"]["counts"], "passed": 51, "failed": 1}
    files = from_smoke_report(report, rev="v0.5.23", label="patched", key=None, date="d", roots={})
    assert (files["suite"]["failed"], files["suite"]["ok"]) == (1, False)


def _run_record(manifest: dict, report_dir: Path, dry: bool = False) -> dict:
    return {"phase": "plain", "repo_root": "/machine/repo", "results_root": str(report_dir), "dry_run": dry,
            "manifest": manifest, "jobs": [{"name": "v0.5.20-patched-plain", "rev": "v0.5.20", "label": "patched",
                                            "kinds": ["suite", "differential"], "rc": 0, "seconds": 1.0}]}


def test_collect_writes_the_kinds_a_job_proves_under_the_staged_key(staged: Path, tmp_path: Path):
    job_dir = tmp_path / "res" / "v0.5.20-patched-plain"
    job_dir.mkdir(parents=True)
    (job_dir / "smoke-kernel.json").write_text(OLD_REPORT.read_text())
    manifest = staging.read_manifest(staged)
    written = collect_run(_run_record(manifest, tmp_path / "res"), tmp_path / "res", tmp_path / "out", "2026-12-01")
    assert sorted(str(p.relative_to(tmp_path / "out")) for p, _ in written) == [
        "v0.5.20/differential.json", "v0.5.20/simulation.json", "v0.5.20/suite.json"]
    suite = json.loads((tmp_path / "out/v0.5.20/suite.json").read_text())
    assert suite["key"] == manifest["releases"][0]["trees"]["patched"]["key"]
    assert suite["job"] == {"name": "v0.5.20-patched-plain", "exit": 0, "seconds": 1.0}


def test_collect_keeps_an_old_style_stage_key_for_the_rekey_script(staged: Path, history: Git, real_series,
                                                                   tmp_path: Path):
    """A stage made before keys were by content (its key names the whole tree): the collected result
    keeps that key (never None), so ci/rekey_results.py converts it; the matrix says so meanwhile."""
    job_dir = tmp_path / "res" / "v0.5.20-patched-plain"
    job_dir.mkdir(parents=True)
    (job_dir / "smoke-kernel.json").write_text(OLD_REPORT.read_text())
    manifest = staging.read_manifest(staged)
    new = EvidenceKey.from_json(manifest["releases"][0]["trees"]["patched"]["key"])
    old = {"upstream_tree": history.out("rev-parse", "v0.5.20^{tree}"), "series_hash": new.series_hash}
    manifest["releases"][0]["trees"]["patched"]["key"] = old
    collect_run(_run_record(manifest, tmp_path / "res"), tmp_path / "res", tmp_path / "out", "2026-12-01")
    assert json.loads((tmp_path / "out/v0.5.20/suite.json").read_text())["key"] == old
    cell = _row(real_series, history, tmp_path / "out", "v0.5.20").cells["suite"]
    assert cell.state == "stale" and "python ci/rekey_results.py" in cell.detail
    sys.path.insert(0, str(REPO_ROOT / "ci"))
    import rekey_results

    rekey_results.rekey(tmp_path / "out", real_series, history)
    assert _row(real_series, history, tmp_path / "out", "v0.5.20").cells["suite"].state == "verified"


def test_collect_refuses_a_dry_run_bundle(staged: Path, tmp_path: Path):
    with pytest.raises(C128Error, match="--dry-run .* proves nothing"):
        collect_run(_run_record(staging.read_manifest(staged), tmp_path, dry=True), tmp_path, tmp_path / "o", "d")


@pytest.mark.parametrize("rev, label", [("../../escape", "patched"), ("v0.5.20", "../../../escape"),
                                        ("ABSOLUTE", "patched")])
def test_collect_refuses_a_bundle_whose_job_names_a_rev_or_label_outside_the_results(tmp_path: Path, rev, label):
    """helper 172: a bundle's job names its rev and label, joined unchecked into the results folder: a rev
    ``../../escape`` wrote ``suite.json`` outside it. Now confined (``result_path``): refused, nothing written."""
    rev = str(tmp_path / "abs") if rev == "ABSOLUTE" else rev
    job_dir = tmp_path / "res" / "job"
    job_dir.mkdir(parents=True)
    (job_dir / "smoke-kernel.json").write_text(OLD_REPORT.read_text())
    run = {**_run_record({"releases": [{"rev": rev, "trees": {label: {"key": None}}}]}, tmp_path / "res"),
           "jobs": [{"name": "job", "rev": rev, "label": label, "kinds": ["suite"], "rc": 0, "seconds": 1.0}]}
    dest = tmp_path / "a" / "out"
    with pytest.raises(C128Error, match="unsafe path in a result of rev"):
        collect_run(run, tmp_path / "res", dest, "2026-12-01")
    assert not list(tmp_path.rglob("suite.json"))


# --------------------------------------------------------------------------- the matrix


@pytest.fixture
def results(tmp_path: Path) -> Path:
    return tmp_path / "results"


def _result(key: EvidenceKey | None, ok: bool) -> dict:
    return {"schema": 1, "kind": "suite", "key": key.to_json() if key else None, "ok": ok, "passed": 3, "failed": 0}


def _row(real_series, history: Git, results: Path, rev: str = "v0.5.21"):
    (row,) = build_matrix(real_series, history, [rev], results)
    return row


def test_matrix_cell_is_unverified_without_a_result(real_series, history: Git, results: Path):
    row = _row(real_series, history, results)
    assert {c.state for c in row.cells.values()} == {"unverified"}
    assert row.applies_summary == "strict"


def test_matrix_cell_is_verified_by_a_passing_result_under_todays_key(real_series, history: Git, results: Path):
    key = key_for(real_series, history, history.rev_parse("v0.5.21"))
    write_result(results, "v0.5.21", "suite", _result(key, True))
    assert _row(real_series, history, results).cells["suite"].state == "verified"


def test_matrix_cell_is_failed_by_a_failing_result_under_todays_key(real_series, history: Git, results: Path):
    key = key_for(real_series, history, history.rev_parse("v0.5.21"))
    write_result(results, "v0.5.21", "suite", _result(key, False))
    assert _row(real_series, history, results).cells["suite"].state == "failed"


def test_matrix_cell_is_stale_when_the_series_files_changed(real_series, history: Git, results: Path):
    key = key_for(real_series, history, history.rev_parse("v0.5.21"))
    write_result(results, "v0.5.21", "suite", _result(replace(key, series_hash="0" * 64), True))
    cell = _row(real_series, history, results).cells["suite"]
    assert cell.state == "stale" and "key" in cell.detail


def test_matrix_with_a_layer_keys_the_cells_by_the_series_and_says_the_layer_is_not_covered(
        real_series, history: Git, results: Path, tmp_path: Path):
    """Helper 96: with a layer in effect every cell read "stale" (the stack's key), and nothing said the evidence
    is of the series alone. The cells are the series' evidence; the layer is named as what it does not cover."""
    from c128patch.series.layers import stack

    key = key_for(real_series, history, history.rev_parse("v0.5.21"))
    write_result(results, "v0.5.21", "suite", _result(key, True))
    (tmp_path / "layer" / "patches").mkdir(parents=True)
    (tmp_path / "layer" / "patches" / "series.toml").write_text('[series]\nname = "site"\nversion = "1"\n'
                                                                 'base = "v0.5.23"\n')
    layered = stack(real_series, [tmp_path / "layer"])
    row = _row(layered, history, results)
    assert row.cells["suite"].state == "verified", row.cells["suite"]
    assert f"layer(s) site not covered (the evidence is of series {real_series.name} {real_series.version} alone)" \
        in row.missing(), row.missing()


def test_apply_and_wheel_name_a_stale_result_as_the_matrix_does(real_series, history: Git, results: Path):
    key = key_for(real_series, history, history.rev_parse("v0.5.21"))
    write_result(results, "v0.5.21", "suite", _result(replace(key, series_hash="0" * 64), True))
    assert _row(real_series, history, results).cells["suite"].state == "stale"
    note = verification_note(real_series, history, history.rev_parse("v0.5.21") or "", "v0.5.21", results)
    missing = note.split(" (", 1)[1].split(")", 1)[0].split(", ")
    assert "suite stale" in missing and "suite unverified" not in missing, note


def test_matrix_names_the_files_that_differ_from_the_nearest_evidenced_release(real_series, history: Git,
                                                                              results: Path):
    key = key_for(real_series, history, history.rev_parse("v0.5.21"))
    files = dict(key.files)
    files["python/sglang/srt/environ.py"] = "blob " + "1" * 40
    files["python/sglang/kernels"] = "tree " + history.out("rev-parse", "v0.5.20:python/sglang/kernels")
    other = replace(key, sources=series_hash(sorted(files.items())), files=tuple(sorted(files.items())))
    write_result(results, "v0.5.21", "suite", _result(other, True))
    row = _row(real_series, history, results)
    changed = history.out("diff-tree", "-r", "--name-only", "v0.5.20:python/sglang/kernels",
                          "v0.5.21:python/sglang/kernels").split()
    assert changed and row.differs.rev == "v0.5.21"
    assert row.differs.files == [f"python/sglang/kernels/{p}" for p in changed] + ["python/sglang/srt/environ.py"]
    assert row.missing()[0].startswith(f"{len(row.differs.files)} files differ from v0.5.21's evidenced sources: ")


def test_matrix_json_lists_what_is_missing(real_series):
    code, out, err = run("matrix", "--sglang-rev", "v0.5.22", "--json")
    assert code == 0, err
    (row,) = json.loads(out)["releases"]
    assert row["rev"] == "v0.5.22" and row["applies"] == "strict"
    assert set(row["cells"]) == {"compile", "suite", "differential", "memcheck", "racecheck", "initcheck", "synccheck",
                                 "upstream-suite", "simulation", "kernel-bench"}
    assert row["fully_verified"] is (not row["missing"])


def test_matrix_table_has_a_heading_for_every_kind():
    res = invoke("matrix", "--sglang-rev", "v0.5.22", as_json=False, env={"COLUMNS": "400"})
    assert res.code == 0, res.err
    for heading in ("compiles sm_90a", "GPU suite", "differential", "memcheck", "racecheck", "initcheck", "synccheck",
                    "upstream's own tests", "DSPARK simulation", "kernel benchmark"):
        assert heading in res.text


@pytest.mark.parametrize("columns", ["100", "400"])
def test_matrix_fits_100_columns_piped_or_wide(columns: str):
    res = invoke("matrix", as_json=False, env={"COLUMNS": columns})
    assert res.code == 0, res.err
    assert max(len(line) for line in res.text.splitlines()) <= 100
    assert "v0.5.20" in res.text and "v0.5.23" in res.text


def test_matrix_refuses_a_rev_that_is_not_a_release():
    code, _, err = run("matrix", "--sglang-rev", "main")
    assert code != 0
    assert "c128patch: error: --sglang-rev main: not a release tag (vX.Y.Z)" in err


def test_readme_shows_the_current_matrix_and_figures():
    """README's matrix block is `c128patch matrix --markdown` as of now and every figures block is
    rendered from the committed results: a result that went stale (or new evidence) must be
    reflected there in the same change (python ci/refresh_matrix.py)."""
    sys.path.insert(0, str(REPO_ROOT / "ci"))
    import refresh_matrix

    readme = (REPO_ROOT / "README.md").read_text()
    assert refresh_matrix.render(readme) == readme, "README.md is stale: python ci/refresh_matrix.py"


def test_every_rendered_tool_benchmark_says_what_it_was_measured_on():
    """Each ci/bench/results file README renders carries benchlib's stamp (command, device, date,
    series, keys), so README can date it and mark it stale; all but start-up are keyed by release."""

    for name in figures.TOOL_BENCHES:
        data = json.loads((REPO_ROOT / "ci" / "bench" / "results" / f"{name}.json").read_text())
        assert {"command", "device", "date", "series", "keys"} <= data.keys(), name
        assert data["command"].startswith("python ") and f"bench_{name}.py" in data["command"], name
        assert bool(data["keys"]) == (name != "startup"), name  # start-up reads no release


def test_the_layer_benchmark_is_rendered_from_its_result_and_marked_stale_under_another_layer(tmp_path: Path):

    data = json.loads((REPO_ROOT / "ci/bench/results/layers.json").read_text())
    data.update(apply_s=2.0, apply_with_layer_s=3.0, ratio=1.5, within_target=False)
    (tmp_path / "layers.json").write_text(json.dumps(data))
    said = figures.tool_benchmarks(tmp_path, lambda d: d["layer"]["digest"] == "today")
    assert ("`apply` with a layer of 3 entries" in said
            and "3.00 s vs without 2.00 s (1.50×, target ≤ 1.2×: *missed*)" in said)
    assert "*stale*: another series or layer" in said
    sys.path.insert(0, str(REPO_ROOT / "ci"))
    import refresh_matrix

    assert data["layer"]["digest"] == refresh_matrix.example_layer_digest(load_series(REPO_ROOT))


# a measured figure: a number with a unit of time, size, rate or share, or a count of outcomes
# (a tolerance, "within 5 %", is not one)
MEASURED = re.compile(r"(?<![\w.#§~-])(?<!≈ )(?<!within )\d[\d,]*(?:\.\d+)?\s?(?:µs|ms|s\b|%|×|GB/s|MB\b|GiB\b|"
                      r"errors?\b|passed\b|failed\b|fixed\b|same\b|regressed\b|skipped\b|chunks\b|n/a\b)")


def measured_outside_blocks(text: str) -> list[str]:
    """Measured figures of ``text`` outside code and outside the rendered blocks (matrix, figures).
    An approximate size (``~150 MB``, ``≈ 12 MB``) is not a measurement."""

    for name in ("matrix", *figures.BLOCKS):
        text = re.sub(rf"<!-- {name}:begin -->.*?<!-- {name}:end -->", "", text, flags=re.S)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return [m.group(0) for m in MEASURED.finditer(text)]


def test_readme_carries_no_measured_number_outside_the_rendered_blocks():
    assert measured_outside_blocks((REPO_ROOT / "README.md").read_text()) == []


def test_the_number_check_catches_a_typed_figure():
    typed = "Kernel timings: commit **105.1 µs** per step; 90/90 passed, 77 fixed, memcheck 0 errors, 61.2 % ceiling."
    assert measured_outside_blocks(typed) == ["105.1 µs", "90 passed", "77 fixed", "0 errors", "61.2 %"]
    assert measured_outside_blocks("each row within 5 % of 0.5.23; ~150 MB once; ≈ 12 MB") == []
    assert measured_outside_blocks("<!-- gpu-evidence:begin -->\n90 passed\n<!-- gpu-evidence:end -->") == []


def test_kernel_benchmark_doc_is_rendered_from_the_committed_results():
    """docs/kernel-benchmark.md is ci/bench/render_kernel_benchmark.py over ci/gpu/results."""
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "ci/bench/render_kernel_benchmark.py"),
                           str(REPO_ROOT / "ci/gpu/results")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (REPO_ROOT / "docs/kernel-benchmark.md").read_text(), \
        "docs/kernel-benchmark.md is stale: python ci/bench/render_kernel_benchmark.py ci/gpu/results"


# --------------------------------------------------------------------------- apply / wheel notes


def test_note_names_what_is_not_verified(real_series, history: Git, results: Path):
    note = verification_note(real_series, history, history.rev_parse("v0.5.21"), "v0.5.21", results)
    assert note == ("note: v0.5.21 + this series is not fully verified (compile unverified, suite unverified, "
                    "differential unverified, memcheck unverified, racecheck unverified, initcheck unverified, "
                    "synccheck unverified, upstream-suite unverified, simulation unverified, kernel-bench "
                    "unverified); see `c128patch matrix`")


def test_no_note_when_every_kind_is_verified(real_series, history: Git, results: Path):
    key = key_for(real_series, history, history.rev_parse("v0.5.21"))
    for kind in KINDS:
        write_result(results, "v0.5.21", kind, {**_result(key, True), "kind": kind})
    assert verification_note(real_series, history, history.rev_parse("v0.5.21"), "v0.5.21", results) is None
    assert len(load_results(results)) == len(KINDS) == 10


def test_upstream_suite_cell_says_regressions_and_what_both_trees_share(real_series, history: Git, results: Path):
    key = key_for(real_series, history, history.rev_parse("v0.5.21"))
    counts = {"regressed": 0, "same": 153, "fixed": 0, "both fail": 3, "not applicable": 0}
    write_result(results, "v0.5.21", "upstream-suite",
                 {**_result(key, True), "kind": "upstream-suite", "counts": counts})
    cell = _row(real_series, history, results).cells["upstream-suite"]
    assert (cell.state, cell.detail) == ("verified", "3 FAIL on the patched tree: 0 regressed, 153 same, 3 both fail")


def test_apply_prints_one_line_when_the_rev_is_not_fully_verified(upstream_clone: Path, sglang_release_repo: Path,
                                                                 tmp_path: Path):
    series = make_test_series(tmp_path / "s", sglang_release_repo, {CUH: (
        "    const uint32_t prefix_len = seq_len - extend_len;\n",
        "    const uint32_t prefix_len = seq_len - extend_len;  // t\n")})
    code, out, err = run("apply", "--sglang-rev", "v0.5.22", "--repo", str(upstream_clone), "--series", str(series))
    assert code == 0, err
    notes = [line for line in out.splitlines() if line.startswith("note:")]
    assert notes[0] == ("note: v0.5.22 + this series is not fully verified (compile unverified, suite unverified, "
                        "differential unverified, memcheck unverified, racecheck unverified, initcheck unverified, "
                        "synccheck unverified, upstream-suite unverified, simulation unverified, kernel-bench "
                        "unverified); see `c128patch matrix`")
    # the test series was made on v0.5.23: the rev is older, as check says too
    git = Git(worktree=upstream_clone)
    older = support_note(load_series(series), git, "v0.5.22", git.rev_parse("v0.5.22"))
    assert older.startswith("v0.5.22 is older than") and notes[1:] == [f"note: {older}"]


def test_wheel_note_is_looked_up_on_the_release_history(real_series, tmp_path: Path):
    from c128patch.upstream.releases import ReleaseHistory

    git = ReleaseHistory().git
    commit = git.rev_parse("v0.5.21")
    assert release_note(real_series, "0.5.21") == verification_note(real_series, git, commit, "sglang 0.5.21")
    assert verification_note(real_series, git, commit, "sglang 0.5.21", tmp_path / "none").startswith(
        "note: sglang 0.5.21 + this series is not fully verified (")


def test_wheel_note_for_a_release_outside_the_history_says_unverified(real_series):
    assert release_note(real_series, "9.9.9") == ("note: sglang 9.9.9 + this series is unverified (not in the release "
                                                  "history); see `c128patch matrix`")


# --------------------------------------------------------------------------- the GPU run's plumbing


def test_plain_phase_runs_each_release_with_its_differential_and_the_before_tree(staged: Path):
    jobs = gpu_run.plan_jobs(staging.read_manifest(staged), ".gpu", "plain", "/o")
    assert [(j.name, j.kinds) for j in jobs] == [
        ("v0.5.20-patched-plain", ("suite", "differential")), ("v0.5.20-before-plain", ("suite",)),
        ("v0.5.23-patched-plain", ("suite", "differential"))]
    assert jobs[0].args[:5] == ["--tree", ".gpu/v0.5.20/patched", "--upstream-tree", ".gpu/v0.5.20/upstream",
                                "--differential"]


def test_sanitizer_phase_runs_each_tool_on_each_release_tool_by_tool_at_small_scale(staged: Path):
    jobs = gpu_run.plan_jobs(staging.read_manifest(staged), ".gpu", "sanitizers", "/o")
    assert [j.name for j in jobs] == [f"{rev}-patched-{tool}"
                                      for tool in ("memcheck", "racecheck", "initcheck", "synccheck")
                                      for rev in ("v0.5.20", "v0.5.23")]
    assert "--sanitizer-only" in jobs[0].args and jobs[0].args[jobs[0].args.index("--sanitizer-scale") + 1] == "0.02"
    assert [j.kinds for j in jobs[::2]] == [("memcheck",), ("racecheck",), ("initcheck",), ("synccheck",)]
    assert "sanitizers" in gpu_run.SEQUENTIAL  # one at a time: several at once on one GPU ran ~14x slower
    two = gpu_run.plan_jobs(staging.read_manifest(staged), ".gpu", "sanitizers", "/o", tools=("synccheck", "initcheck"))
    assert [j.name for j in two] == ["v0.5.20-patched-synccheck", "v0.5.23-patched-synccheck",
                                     "v0.5.20-patched-initcheck", "v0.5.23-patched-initcheck"]
    with pytest.raises(C128Error, match="unknown sanitizer tool"):
        gpu_run.plan_jobs(staging.read_manifest(staged), ".gpu", "sanitizers", "/o", tools=("leakcheck",))


def test_bench_phase_runs_the_kernel_benchmark_per_release(staged: Path):
    jobs = gpu_run.plan_jobs(staging.read_manifest(staged), ".gpu", "bench", "/o")
    assert [(j.name, j.kinds, j.script) for j in jobs] == [
        (f"{rev}-patched-bench", ("kernel-bench",), "ci/bench/bench_online_c128_dspark.py")
        for rev in ("v0.5.20", "v0.5.23")]
    assert jobs[0].args == ["--tree", ".gpu/v0.5.20/patched", "--out",
                            "/o/v0.5.20-patched-bench/online_c128_dspark.json"]
    assert gpu_run.smoke_argv("py", jobs[0])[:2] == ["py", "ci/bench/bench_online_c128_dspark.py"]


def test_sequential_jobs_never_overlap_and_the_deadline_leaves_the_rest_unstarted(tmp_path: Path):
    import time

    script = tmp_path / "job.py"
    script.write_text("import sys, time\nopen(sys.argv[1], 'a').write(f'{time.time()} start\\n')\ntime.sleep(0.6)\n"
                      "open(sys.argv[1], 'a').write(f'{time.time()} end\\n')\n")
    jobs = [gpu_run.Job(f"j{i}", "v", "patched", ("kernel-bench",), [str(tmp_path / f"j{i}.txt")], script=str(script))
            for i in range(4)]
    said: list = []
    gpu_run.run_jobs(jobs, sys.executable, dict(os.environ), tmp_path / "logs", time.monotonic() + 1.5, tmp_path,
                     say=said.append, parallel=1)
    ran = [j for j in jobs if j.rc is not None]
    assert [j.rc for j in ran] == [0] * len(ran) and 1 <= len(ran) <= 3 and jobs[-1].rc is None
    spans = [tuple(float(line.split()[0]) for line in (tmp_path / f"{j.name}.txt").read_text().splitlines())
             for j in ran]
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), spans  # one at a time
    assert f"deadline: {jobs[-1].name} not started" in said
    assert gpu_run.job_summary(jobs[-1], tmp_path) == "j3: NOT STARTED (the deadline came first)"


def test_a_big_log_is_cut_to_head_and_tail_before_bundling(tmp_path: Path):
    (tmp_path / "big.log").write_bytes(b"a" * 100 + b"b" * 100)
    assert gpu_run.cap_logs(tmp_path, cap=50) == ["big.log"]
    data = (tmp_path / "big.log").read_bytes()
    assert data.startswith(b"a" * 25) and data.endswith(b"b" * 25) and b"150 bytes cut" in data


def _dry_run(tmp_path: Path, phase: str) -> Path:
    """Stage v0.5.21 (no wheels) and run ``h200_run.py PHASE --dry-run``: its $OUT folder."""
    stage, out = tmp_path / "gpu", tmp_path / "out"
    prep = subprocess.run([sys.executable, str(REPO_ROOT / "ci/gpu/prepare.py"), "--rev", "v0.5.21",
                           "--dest", str(stage), "--no-wheels"], capture_output=True, text=True)
    assert prep.returncode == 0, prep.stderr
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "ci/gpu/h200_run.py"), phase, "--stage", str(stage),
                           "--dry-run", "--out", str(out), "--work", str(tmp_path / "work")], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


@needs_torch
def test_dry_run_goes_from_stage_to_bundle_to_collected_files(tmp_path: Path):
    """The device call's plumbing on this CPU machine: prepare one release, run the plain phase
    collect-only, collect the bundle (allowed for a dry run only)."""
    env, out = dict(os.environ), _dry_run(tmp_path, "plain")
    assert sorted(p.name for p in out.iterdir()) == ["plain-run.json", "plain-summary.txt", "plain.tgz"]
    assert "v0.5.21-patched-plain: exit 0" in (out / "plain-summary.txt").read_text()
    refused = subprocess.run([sys.executable, str(REPO_ROOT / "ci/gpu/collect_results.py"), str(out),
                              "--dest", str(tmp_path / "r")], capture_output=True, text=True, env=env)
    assert refused.returncode == 2 and "proves nothing" in refused.stderr
    done = subprocess.run([sys.executable, str(REPO_ROOT / "ci/gpu/collect_results.py"), str(out),
                           "--dest", str(tmp_path / "r"), "--allow-dry-run"], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    suite = json.loads((tmp_path / "r/v0.5.21/suite.json").read_text())
    assert suite["command"].startswith("c128patch smoke kernel --tree ") and suite["not_run"] > 50
    assert str(REPO_ROOT) not in json.dumps(suite) and suite["key"]["sources"]


@pytest.mark.parametrize("rev", RELEASES)
def test_every_release_stages(history: Git, real_series, rev: str, tmp_path: Path):
    staged = staging.stage_release(real_series, history, rev, tmp_path, SUITE)
    assert set(staged["trees"]) == {"patched", "upstream"} and staged["trees"]["patched"]["key"] is not None
    assert history.rev_parse(rev) == staged["commit"]


def test_jobs_share_no_jit_cache_and_split_the_cores():
    env = gpu_run.job_env({"SGLANG_JIT_CACHE_DIR": "/tmp/shared", "PYTHONPATH": "/x"}, "/repo/tooling", "/site", 3)
    assert "SGLANG_JIT_CACHE_DIR" not in env  # harness.default_jit_cache_dir: one cache per tree
    assert env["PYTHONPATH"] == os.pathsep.join(["/repo/tooling", "/site", "/x"]) and env["OMP_NUM_THREADS"] == "3"


# --------------------------------------------------------------------------- n/a, simulation, kernel benchmark


def test_differential_summary_counts_n_a_apart_from_fixed():
    data = {"summary": {"same": 13, "fixed": 28, "n/a": 49, "regressed": 0, "differs": 0}}
    assert summarize("differential", data) == "0 regressed, 28 fixed, 49 n/a, 13 same"


def test_a_differential_over_failing_tests_leads_with_the_failures():
    """Issue 38: 55 of 96 fail on the patched tree and on the unpatched one (it lacks our module): "same", so the
    counts alone read "0 regressed"; the cell leads with the failures, their count and names."""
    fail = [{"nodeid": f"test_dspark.py::test_{i}", "patched": "failed", "upstream": "error", "verdict": "same"}
            for i in range(55)]
    ok = [{"nodeid": f"test_c128.py::test_{i}", "patched": "passed", "upstream": "passed", "verdict": "same"}
          for i in range(41)]
    data = {"summary": {"same": 96, "fixed": 0, "n/a": 0, "regressed": 0, "differs": 0}, "tests": ok + fail}
    assert summarize("differential", data) == (
        "55 FAIL on the patched tree (test_dspark.py::test_0, test_dspark.py::test_1, test_dspark.py::test_2 and 52 "
        "more), 55 of them on both: same: 0 regressed, 0 fixed, 0 n/a, 96 same")
    assert summarize("differential", {**data, "tests": ok}) == "0 regressed, 0 fixed, 0 n/a, 96 same"


def test_the_recorded_upstream_suite_leads_with_its_failures_and_the_differential_has_none():
    for rev in ("v0.5.20", "v0.5.21", "v0.5.22", "v0.5.23"):
        suite = json.loads((REPO_ROOT / RESULTS_UNDER / rev / "upstream-suite.json").read_text())
        assert summarize("upstream-suite", suite) == (
            "3 FAIL on the patched tree (test_online_c128_mtp_plan.py::test_online_c128_mtp_plan, "
            "test_online_c128_spec.py::test_online_c128_spec_prefix_and_commit[False], "
            "test_online_c128_spec.py::test_online_c128_spec_prefix_and_commit[True]): 0 regressed, 153 same, "
            "3 both fail")
        diff = json.loads((REPO_ROOT / RESULTS_UNDER / rev / "differential.json").read_text())
        assert summarize("differential", diff) == "0 regressed, 28 fixed, 55 n/a, 13 same"


def test_simulation_and_new_sanitizers_come_from_the_smoke_report():
    report = json.loads(OLD_REPORT.read_text())
    sim = {"W": 8, "ours": {"chunk_mismatches": 0, "chunks_checked": 2137, "state_mismatches": 0},
           "upstream_mtp_lazy": {"chunk_mismatches": 571, "chunks_checked": 2137}}
    report["passes"]["patched"].setdefault("results", {})["dspark_simulation"] = sim
    run = dict(report["sanitizer"]["runs"][0], tool="initcheck", errors=0)
    report["sanitizer"]["runs"].append(run)
    key = EvidenceKey("t" * 40, "s" * 64)
    files = from_smoke_report(report, rev="v0.5.23", label="patched", key=key, date="2026-12-01", roots={})
    simulation = files["simulation"]
    assert simulation["ok"] and simulation["key"] == key.to_json() and simulation["date"] == "2026-12-01"
    assert simulation["command"] == report["command"] and simulation["device"].startswith("NVIDIA H200")
    assert simulation["test"] == "test_dspark_simulation.py::test_dspark_simulation_matches_offline_pooling"
    assert simulation["outcome"] == "passed"
    assert summarize("simulation", simulation) == "ours 0/2137 chunks wrong; upstream's controller 571/2137"
    assert files["initcheck"]["sanitizer"]["errors"] == 0 and files["initcheck"]["kind"] == "initcheck"
    sim["ours"]["chunk_mismatches"] = 1
    assert not from_smoke_report(report, rev="v0.5.23", label="patched", key=key, date="d",
                                 roots={})["simulation"]["ok"]


def test_bench_rows_are_compared_with_the_reference_within_5_percent():
    ref = {"rev": "v0.5.23", "series_digest": "d", "rows": [
        {"B": 8, "W": 4, "path": "ours", "what": "fused step", "us": 100.0},
        {"B": 8, "W": 4, "path": "ours", "what": "commit", "us": 10.0},
        {"B": 8, "W": 4, "path": "upstream", "what": "mark_pending", "us": 50.0}]}
    data = {"rows": [{"B": 8, "W": 4, "path": "ours", "what": "fused step", "us": 104.9},
                     {"B": 8, "W": 4, "path": "ours", "what": "commit", "us": 10.6},
                     {"B": 8, "W": 4, "path": "upstream", "what": "mark_pending", "us": 80.0}]}
    vs = compare_bench(data, ref)
    assert (vs["rows"], vs["within"], vs["reference"]) == (3, 1, "v0.5.23")
    assert vs["outside"][0] == {"B": 8, "W": 4, "path": "ours", "what": "commit", "us": 10.6, "reference_us": 10.0,
                                "ratio": 1.06}
    # ours apart from upstream's rows (upstream's code differs between releases)
    assert vs["by_path"] == {"ours": {"rows": 2, "within": 1}, "upstream": {"rows": 1, "within": 0}}
    assert summarize("kernel-bench", {"rows": data["rows"], "vs_reference": vs}) == (
        "3 rows, 1/3 within 5% of v0.5.23 (ours 1/2)")
    line = figures._bench_check({"rows": data["rows"], "vs_reference": vs})
    assert "ours 1/2" in line and "ours furthest: commit B = 8, W = 4 at 1.06x" in line


@needs_torch
def test_bench_dry_run_resolves_each_release_and_collects_nothing(tmp_path: Path):
    """The benchmark's --dry-run (what h200_run bench --dry-run passes) imports the staged tree and
    picks upstream's MTP calls for it (0.5.21 has no module functions: the JIT module's); its
    bundle is no measurement, so collecting it writes no kernel-bench."""
    env, out = dict(os.environ), _dry_run(tmp_path, "bench")
    assert "v0.5.21-patched-bench: exit 0" in (out / "bench-summary.txt").read_text()
    log = (tmp_path / "work/bench/logs/v0.5.21-patched-bench.log").read_text()
    assert "dry run: upstream MTP calls via jit module; ops ok" in log, log[-2000:]
    done = subprocess.run([sys.executable, str(REPO_ROOT / "ci/gpu/collect_results.py"), str(out),
                           "--dest", str(tmp_path / "r"), "--allow-dry-run"], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "r/v0.5.21/kernel-bench.json").exists()


def test_the_watch_records_say_clean_in_each_releases_own_environment():
    """ci/watch/results/releases.json (``python ci/watch/record.py``): the latest run of `watch --onto REV --json`
    with no other options, per release, is clean, exit 0, in the environment of REV's committed lock, every module
    the series adds or changes imported and every scenario passed, gates off and on; its paths repo-relative."""
    text = (REPO_ROOT / "ci" / "watch" / "results" / "releases.json").read_text()
    latest = {r["onto"]["rev"]: r for r in json.loads(text)["history"]}
    assert {"v0.5.21", "v0.5.22", "v0.5.23"} <= set(latest) <= set(RELEASES)
    ours = {e.target[len("python/"):-3].replace("/", ".") for e in load_series(REPO_ROOT).entries
            if not e.is_patch and e.target.endswith(".py")}  # the overlays; the patched modules besides
    for rev, run in latest.items():
        assert run["command"] == f"c128patch watch --onto {rev} --json", run["command"]
        assert (run["outcome"], run["exit_code"], run["unchecked"]) == ("clean", 0, []), (rev, run["unchecked"])
        assert run["env"]["lock"] == f"patches/env/{rev}.lock" and (REPO_ROOT / run["env"]["lock"]).is_file()
        assert set(run["gates"]) == {"off", "on"}
        for state in run["gates"].values():
            assert len(state["imported"]) == state["modules"] and ours < set(state["imported"]), (rev, state)
            assert state["imported"] == run["gates"]["off"]["imported"]
            assert len(state["scenarios_passed"]) == state["scenarios"] == 8, (rev, state)  # (tests/test_env's list)
    assert not re.search(r'"/|/root|/home|/tmp', text)


def test_a_huge_results_file_is_one_line_unread(tmp_path):
    """Helper 142: ``matrix --results DIR`` read a results file whole (smoke.trees.read_json): an 8 GB sparse
    ``suite.json`` hung matrix past a minute, reading it into memory. Now one line, unread; a FIFO is no result."""
    results = tmp_path / "results"
    shutil.copytree(REPO_ROOT / "ci" / "gpu" / "results", results)
    suite = results / "v0.5.23" / "suite.json"
    suite.unlink()
    os.mkfifo(suite)
    assert load_results(results)  # a FIFO: no result, never waited on
    suite.unlink()
    with suite.open("wb") as fh:
        fh.truncate(8 << 30)
    res = invoke("matrix", "--results", str(results), "--sglang-rev", "v0.5.23", as_json=False)
    assert res.code == 2 and res.err.strip() == f"c128patch: error: {suite}: {8 << 30} bytes, over the 64 MiB a JSON " \
        "file of ours may hold; not read", res.err


def test_a_results_file_with_a_number_past_pythons_digit_limit_is_one_line(tmp_path):
    """Helper 173: a committed result holding an integer of 5000 digits (json.loads: a ValueError, not a
    JSONDecodeError) ended `matrix` in a traceback. Now one line naming the file."""
    results = tmp_path / "results"
    shutil.copytree(REPO_ROOT / "ci" / "gpu" / "results", results)
    compile_json = results / "v0.5.23" / "compile.json"
    compile_json.write_text(compile_json.read_text().replace('"date"', f'"seconds": {"9" * 5000}, "date"', 1))
    res = invoke("matrix", "--results", str(results), "--sglang-rev", "v0.5.23", as_json=False)
    assert res.code == 2 and res.err.strip() == f"c128patch: error: {compile_json}: not valid JSON (a number too " \
        "long to read)", res.err


@pytest.mark.parametrize("field, value", [("kernels", None), ("kernels", "x"), ("kernels", [1]), ("ok", "false"),
                                          ("ok", [0]), ("ok", 1)])
def test_a_results_file_with_a_field_of_another_type_is_one_line_or_not_verified(tmp_path, field, value):
    """h146: `matrix` summarized a result without checking its fields' types: `"kernels": [1]` (or null, a string)
    in compile.json was a traceback; `"ok": "false"` (or [0], 1) read as verified. Now a field of another type is
    one line naming the file, and only JSON's true is ok (the cell failed)."""
    results = tmp_path / "results"
    shutil.copytree(REPO_ROOT / "ci" / "gpu" / "results", results)
    compile_json = results / "v0.5.23" / "compile.json"
    doc = json.loads(compile_json.read_text())
    compile_json.write_text(json.dumps({**doc, field: value}))
    res = invoke("matrix", "--results", str(results), "--sglang-rev", "v0.5.23")
    if field == "ok":
        assert res.code == 0 and res.out["releases"][0]["cells"]["compile"]["state"] == "failed", res.out
    else:
        said = f"c128patch: error: {compile_json}: not a valid compile.json result (a field of the wrong type: "
        assert res.code == 2 and res.err.strip().startswith(said), res.err


def test_matrix_results_naming_no_folder_is_one_line(tmp_path):
    """h146: `matrix --results DIR` with DIR missing (a typo) printed every cell unverified and exited 0."""
    res = invoke("matrix", "--results", str(tmp_path / "nope"), "--sglang-rev", "v0.5.23", as_json=False)
    assert res.code == 2 and res.err.strip() == f"c128patch: error: --results {tmp_path / 'nope'} does not exist", \
        res.err
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    res = invoke("matrix", "--results", str(tmp_path / "gone"), "--sglang-rev", "v0.5.23", as_json=False)
    assert res.code == 2 and res.err.strip().endswith("gone is a link to nothing, not a folder"), res.err
