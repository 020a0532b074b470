"""ci/bench's results keep their misses: a run is appended to the file's history, docs/benchmarks.md
renders the latest run with its spread and says which targets were missed in the last 3 runs, and the
committed page is current with the committed results (no benchmark runs here)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "ci" / "bench"))

import benchlib  # noqa: E402
import render  # noqa: E402


def test_docs_benchmarks_is_current_with_the_results():
    assert render.render(REPO / "ci" / "bench" / "results") == render.PAGE.read_text(), (
        "docs/benchmarks.md is stale: python ci/bench/render.py")


def test_every_tool_benchmark_has_a_history_that_starts_with_its_earlier_records():
    for name in ("apply", "check", "contract", "keys", "layers", "rebase", "startup", "verify_wheel", "wheel"):
        history = json.loads((REPO / "ci" / "bench" / "results" / f"{name}.json").read_text())["history"]
        assert "recorded_in" in history[0] and "figures" not in history[0], name  # seeded from git
        assert all("targets" in rec and "missed" in rec for rec in history), name


def record(day: int, missed: bool) -> dict:
    fig = {"median": 2.0, "min": 1.0, "max": 4.0}
    return {"date": f"2026-12-{day:02d}", "runs": 3, "load": [7.5, 6.0, 5.0], "cores": 2, "command": "python x",
            "figures": {"ours": {"wall": fig, "cpu": fig}}, "ratios": {"ours / raw": {"wall": 1.5, "cpu": 2.5}},
            "targets": [benchlib.target("ours / raw", 2.5 if missed else 0.5, 1.0, "cpu")], "missed": missed}


def test_a_miss_is_said_while_it_is_among_the_last_three_runs(tmp_path: Path):
    history = [record(1, False), record(2, True), record(3, False), record(4, False)]
    (tmp_path / "x.json").write_text(json.dumps({"history": history}))
    page = render.render(tmp_path)
    assert "| ours | 2.000 [1.000–4.000] | 2.000 [1.000–4.000] |" in page
    assert "load 7.5/6/5 on 2 cores" in page and "ours / raw: 1.50× wall, 2.50× CPU" in page
    assert "**Missed in 1 of the last 3 runs**: 2026-12-02: ours / raw (cpu) 2.5 > 1" in page
    history.append(record(5, False))
    (tmp_path / "x.json").write_text(json.dumps({"history": history}))
    assert "No target missed in the last 3 runs." in render.render(tmp_path)


def test_a_run_is_appended_to_the_history_and_repeated_at_the_top(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(benchlib, "stamp", lambda revs, series_root=None: {"date": "2026-12-03"})
    out = tmp_path / "x.json"
    out.write_text(json.dumps({"ratio": 3.0, "date": "2026-12-01"}))  # a file from before the history
    benchlib.append(str(out), {"ratio": 2.0, "targets": [benchlib.target("r", 2.0, 1.0)]})
    benchlib.append(str(out), {"ratio": 0.5, "targets": [benchlib.target("r", 0.5, 1.0)]})
    data = json.loads(out.read_text())
    assert [rec["ratio"] for rec in data["history"]] == [3.0, 2.0, 0.5]
    assert [rec.get("missed") for rec in data["history"]] == [None, True, False]
    assert data["ratio"] == 0.5 and not data["missed"]
    benchlib.append(str(out), {"ratio": 9.0, "targets": []}, headline=False)  # the top level stays
    data = json.loads(out.read_text())
    assert data["ratio"] == 0.5 and data["history"][-1]["ratio"] == 9.0


def test_the_per_unit_cost_is_a_least_squares_slope():
    assert benchlib.slope([1, 4, 16, 64], [1.0 + 0.07 * n for n in (1, 4, 16, 64)]) == 0.07
    assert benchlib.ratio({"a": {"wall": {"median": 3.0}, "cpu": {"median": 1.0}},
                           "b": {"wall": {"median": 2.0}, "cpu": {"median": 4.0}}}, "a", "b") == {"wall": 1.5,
                                                                                                   "cpu": 0.25}


def test_growth_targets_hold_ours_to_a_multiple_of_raw_even_when_raw_does_not_grow():
    import bench_growth

    per_unit = {what: {"": {"cpu": 0.02}, "raw ": {"cpu": -0.0001}} for what in ("check", "rebase", "apply")}
    per_unit["rebase"]["raw plain "] = {"cpu": -0.0001}  # rebase's comparator: ``git rebase syn-K`` as typed
    said = {t["what"]: t["missed"] for t in bench_growth.targets(per_unit, 0.1, 0.11)}
    rebase = "rebase per commit, ours - 3x raw plain `git rebase syn-K`'s (ms)"
    assert said == {"check per rev, 16-64 / 1-16 (CPU)": False, "check per rev, ours - raw's (s)": True,
                    rebase: True, "apply per layer entry (s)": False}
    per_unit["rebase"]["raw plain "] = {"cpu": 0.007}  # 3x 7 ms >= ours' 20 ms
    assert {t["what"]: t["missed"] for t in bench_growth.targets(per_unit, 0.1, 0.11)}[rebase] is False


def test_interleaved_warms_every_case_untimed_and_alternates_the_order_round_by_round():
    calls: list[tuple[str, int]] = []
    figures, _ = benchlib.interleaved({name: (lambda i, n=name: calls.append((n, i))) for name in ("a", "b")}, 3,
                                      alternate=True, warmup=2)
    assert calls == [("a", -2), ("b", -2), ("b", -1), ("a", -1),  # warm-up: each case, as timed rounds run them
                     ("a", 0), ("b", 0), ("b", 1), ("a", 1), ("a", 2), ("b", 2)]
    assert [len(figures[n]["runs_wall"]) for n in ("a", "b")] == [3, 3]  # the warm-up is not among the runs


def test_trust_cost_decides_only_when_the_median_pair_ratio_s_interval_is_on_one_side_of_the_target(tmp_path: Path):
    tc = benchlib  # (bench_trust_cost and bench_apply decide by these)

    assert tc.median_interval([float(x) for x in range(1, 31)]) == (10.0, 21.0)  # n = 30: 95.7 %
    assert tc.median_interval([1.0, 2.0, 3.0]) == (1.0, 3.0)  # too few pairs to leave any out
    assert [tc.verdict(ci, 1.05) for ci in ([0.9, 1.04], [1.06, 1.2], [1.0, 1.1])] == ["met", "missed", "undecided"]
    rec = record(1, False)
    rec["targets"][0] |= {"ci95": [1.0, 1.1], "verdict": "undecided"}
    rec |= {"load_before": [1.0, 2.0, 3.0], "work_on": "tmpfs /dev/shm"}
    (tmp_path / "x.json").write_text(json.dumps({"history": [rec]}))
    page = render.render(tmp_path)
    assert "the median's 95 % interval 1–1.1: undecided" in page
    assert "load 1/2/3 before, 7.5/6/5 on 2 cores, work on tmpfs /dev/shm" in page
