"""The figures README.md quotes, rendered from the committed results (never typed): the GPU evidence per
release, the kernel benchmark and the tool benchmarks, each between its markers (``refresh_matrix.py`` beside it;
tests/test_evidence.py checks README is current). A figure whose file is not under today's key is *stale*.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from c128patch.evidence.matrix import ReleaseRow
from c128patch.evidence.results import BENCH_REFERENCE, BENCH_TOLERANCE, SANITIZER_KINDS

BLOCKS = ("gpu-evidence", "kernel-figures", "tool-benchmarks")
CURRENT = ("verified", "failed")


def begin(name: str) -> str:
    return f"<!-- {name}:begin -->\n"


def end(name: str) -> str:
    return f"<!-- {name}:end -->"


def with_block(text: str, name: str, body: str) -> str:
    start, stop = text.index(begin(name)) + len(begin(name)), text.index(end(name))
    return text[:start] + body + text[stop:]


def _load(root: Path, row: ReleaseRow, kind: str) -> tuple[dict[str, Any] | None, str]:
    cell = row.cells.get(kind)
    if cell is None or cell.path is None:
        return None, "unverified"
    return json.loads((root / cell.path).read_text()), cell.state


def _per_release(rows: list[ReleaseRow], root: Path, kind: str, say: Callable[[dict[str, Any]], str]) -> str:
    """`say(data)` for every release; one phrase when every release says the same."""
    said = []
    for row in rows:
        data, state = _load(root, row, kind)
        if data is None:
            said.append((row.rev, "not measured"))
            continue
        text = say(data)
        said.append((row.rev, text if state in CURRENT else f"{text} (*stale*: another series or sources)"))
    texts = {t for _, t in said}
    if texts == {"not measured"}:
        return "no completed run recorded on any release"
    if len(texts) == 1:
        return f"{texts.pop()} on every release ({', '.join(r for r, _ in said)})"
    return "; ".join(f"{rev}: {t}" for rev, t in said)


def _failing(d: dict[str, Any]) -> str:
    names = d.get("failing") or [t["nodeid"] for t in d.get("tests", [])
                                 if t.get("outcome") in ("failed", "error", "crashed")]
    if not names or len(names) > 3:
        return ""
    return f": {', '.join(f'`{n}`' for n in names)}"


def _suite(d: dict[str, Any]) -> str:
    return f"{d.get('passed', 0)} passed, {d.get('failed', 0)} failed{_failing(d)}, {d.get('skipped', 0)} skipped"


def _differential(d: dict[str, Any]) -> str:
    s = d.get("summary") or {}
    return (f"**{s.get('regressed', 0)} regressed**, {s.get('fixed', 0)} *fixed*, {s.get('n/a', 0)} *n/a*, "
            f"{s.get('same', 0)} *same*")


def _sanitizer(d: dict[str, Any]) -> str:
    errors = (d.get("sanitizer") or {}).get("errors")
    failed = f", {d['failed']} failed{_failing(d)}" if d.get("failed") else ""
    return f"**{'no summary' if errors is None else errors} errors** ({d.get('passed', 0)} passed{failed}, " \
           f"{d.get('skipped', 0)} skipped)"


def _ours(d: dict[str, Any]) -> str:
    o = d.get("ours") or {}
    return (f"{o.get('chunk_mismatches')} of {o.get('chunks_checked')} emitted chunks wrong, "
            f"{o.get('state_mismatches')} of {o.get('states_checked')} request states wrong "
            f"(max rel. err {o.get('max_chunk_err', 0):.1e})")


def _theirs(d: dict[str, Any]) -> str:
    u, c = d.get("upstream_mtp_lazy") or {}, d.get("counts") or {}
    if not u:
        return "not run (no such controller in the tree)"
    return (f"**{u.get('chunk_mismatches')} of {u.get('chunks_checked')} chunks wrong**, "
            f"{u.get('state_mismatches')} of {u.get('states_checked')} request states wrong, "
            f"{u.get('requests_affected')} requests affected, {c.get('up_commits_dropped_by_prefill')} of "
            f"{c.get('up_commits_needed')} needed commits dropped by interleaved prefills")


def _upstream_suite(d: dict[str, Any]) -> str:
    c = d.get("counts") or {}
    return f"{c.get('same', 0)} *same*, **{c.get('regressed', 0)} regressed**, {c.get('both fail', 0)} fail on both"


def _bench_check(d: dict[str, Any]) -> str:
    vs = d.get("vs_reference")
    if vs and vs.get("is_reference"):
        return f"the reference run ({len(d.get('rows', []))} rows)"
    if not vs:
        return "no 0.5.23 run of the same series to compare with"
    line = f"{vs['within']} of {vs['rows']} rows within {BENCH_TOLERANCE:.0%} of {vs['reference']}"
    paths = vs.get("by_path") or {}
    if paths:
        names = {"ours": "ours", "floor": "the one-node floor", "upstream": "upstream's (its code differs by release)"}
        line += " (" + "; ".join(f"{names.get(p, p)} {c['within']}/{c['rows']}" for p, c in paths.items()) + ")"
        worst = [o for o in vs.get("outside", []) if o["path"] == "ours"]
        if worst:
            o = max(worst, key=lambda o: abs(o["ratio"] - 1))
            line += f"; ours furthest: {o['what']} B = {o['B']}, W = {o['W']} at {o['ratio']:.2f}x"
    return line


def gpu_evidence(rows: list[ReleaseRow], root: Path) -> str:
    """The GPU evidence bullets of README (per release, collapsed when all agree)."""
    first = rows[0] if rows else None
    sim, _ = _load(root, first, "simulation") if first else (None, "")
    sim_setup = (f"{sim.get('steps')} steps, {(sim.get('counts') or {}).get('requests')} requests joining and "
                 f"leaving, interleaved prefills, {sim.get('layers')} layers, W = {sim.get('W')}") if sim else "not run"
    lines = [
        f"- **GPU suite** (`suite.json`): {_per_release(rows, root, 'suite', _suite)}.",
        f"- **Differential against unpatched upstream** (`differential.json`, the same suite on both trees): "
        f"{_per_release(rows, root, 'differential', _differential)}. *fixed*: the test ran on both trees, "
        "fails upstream and passes patched (the zero-row planner crash); *n/a*: it needs code upstream does not "
        "have (a module or name only the series adds, read from the failure and checked on both trees), so it "
        "says nothing about upstream's behaviour.",
    ]
    for tool in SANITIZER_KINDS:
        lines.append(f"- compute-sanitizer **{tool}** (`{tool}.json`, one tool and one release at a time, small "
                     f"scale; the CUDA-graph and deliberate-trap tests skip there, visibly): "
                     f"{_per_release(rows, root, tool, _sanitizer)}.")
    before = [(row.rev, root / row.rev / "before" / "suite.json") for row in rows]
    before = [(rev, json.loads(p.read_text())) for rev, p in before if p.is_file()]
    for rev, data in before:
        lines.append(f"- **Before the kernel fix** (`{rev}/before/suite.json`, an older series kept as a record): "
                     f"{_suite(data)}.")
    lines += [
        f"- **Upstream's own kernel tests** (`upstream-suite.json`, run on patched and unpatched trees): "
        f"{_per_release(rows, root, 'upstream-suite', _upstream_suite)}.",
        f"- **Simulated DSPARK decode** (`simulation.json`, written by tests/gpu/test_dspark_simulation.py: "
        f"{sim_setup}). Ours, checked against exact offline pooling of the accepted stream: "
        f"{_per_release(rows, root, 'simulation', _ours)}. The same decode through each release's "
        "`OnlineC128MTPController` class, driven by the test's own scheduler model on a stand-in backend that "
        "hands it the state pools (uniform W, not a server run): "
        f"{_per_release(rows, root, 'simulation', _theirs)}.",
        f"- **Kernel benchmark per release** (`kernel-bench.json`): "
        f"{_per_release(rows, root, 'kernel-bench', _bench_check)}.",
    ]
    return "\n".join(lines) + "\n"


def _pick(rows: list[dict], B: int, W: int, path: str, what: str) -> dict | None:
    return next((r for r in rows if (r["B"], r["W"], r["path"]) == (B, W, path) and r["what"].startswith(what)
                 and not r["what"].endswith("(eager)")), None)


def kernel_figures(rows: list[ReleaseRow], root: Path, rev: str = BENCH_REFERENCE) -> str:
    """README's kernel timing sentence, from ``rev``'s kernel-bench.json (B = 48, W = 8)."""
    row = next((r for r in rows if r.rev == rev), None)
    data, state = _load(root, row, "kernel-bench") if row else (None, "unverified")
    if data is None:
        return f"No kernel benchmark of {rev} is committed.\n"
    bench = data["rows"]

    def us(B: int, W: int, path: str, what: str, value: str = "us") -> float:
        r = _pick(bench, B, W, path, what)
        return r[value] if r else float("nan")

    def pct(B: int, W: int, what: str) -> float:
        return us(B, W, "ours", what, "pct_ceiling")

    fused, added = us(48, 8, "ours", "fused step"), us(48, 8, "ours", "added by the fused path")
    up = us(48, 8, "upstream", "step overhead")
    missed = [f"{name.replace('_', ' ')} ({t['value']} vs {t['goal']})" for name, t in data.get("targets", {}).items()
              if not t.get("met")]
    stale = "" if state in CURRENT else " (*stale*: measured on another series)"
    return (
        f"From `ci/gpu/results/{rev}/kernel-bench.json`{stale} ({data.get('device', '?')}, {data.get('date', '?')}; "
        f"B = 48, W = 8, {data.get('layers')} layers, CUDA graph, L2 flushed): plan + fused verify compress "
        f"×{data.get('layers')} + commit **{fused:.1f} µs** per verify step, of which {added:.1f} µs is what it "
        f"adds over the compress alone (upstream: {up:.0f} µs protocol overhead, {up / added:.0f}× that, plus "
        f"{us(48, 8, 'upstream', 'online prefill compress_forward'):.0f} µs prefill compress); standalone plan + "
        f"write prefix ×{data.get('layers')} + commit {us(48, 8, 'ours', 'added per step'):.1f} µs; fused "
        f"compress at {pct(48, 8, 'fused verify_compress x31'):.1f} % of the copy ceiling "
        f"({data.get('copy_ceiling_gbps', 0):.0f} GB/s). Commit of all {data.get('layers')} layers: one launch "
        f"alone (a lone graph node) at {pct(48, 4, 'commit, 31 layers, 1 launch'):.1f} % / "
        f"{pct(48, 8, 'commit, 31 layers, 1 launch'):.1f} % of the ceiling (W = 4 / W = 8), per launch in a chain "
        f"of 8 launches at {pct(48, 4, 'commit, 31 layers, per launch in a chain'):.1f} % / "
        f"{pct(48, 8, 'commit, 31 layers, per launch in a chain'):.1f} %. Targets not met: "
        f"{'; '.join(missed) if missed else 'none'}.\n"
    )


def _span(values: list[float]) -> str:
    low, high = f"{min(values):.3f}", f"{max(values):.3f}"
    return low if low == high else f"{low}–{high}"


TOOL_BENCHES = ("apply", "check", "layers", "rebase", "wheel", "startup")


def _cpu_target(record: dict, name: str) -> str:
    """The CPU ratio of ``name`` and its target, as README says them ("" where the record has none)."""
    cpu = (record.get("ratios") or {}).get(name, {}).get("cpu")
    hit = [t for t in record.get("targets", []) if t["what"] == name]
    if cpu is None or not hit:
        return ""
    return f", {cpu:.2f}× in CPU (target ≤ {hit[0]['max']:g}×: {'*missed*' if hit[0]['missed'] else 'met'})"


def tool_benchmarks(bench_root: Path, current: Callable[[dict[str, Any]], bool]) -> str:
    """README's tool benchmark sentence from ci/bench/results/<TOOL_BENCHES>.json;
    ``current(data)`` says whether a file was measured on today's series (else *stale*)."""
    got: dict[str, dict[str, Any]] = {}
    for name in TOOL_BENCHES:
        path = bench_root / f"{name}.json"
        if path.is_file():
            got[name] = json.loads(path.read_text())

    def mark(name: str, other: str = "another series") -> str:
        data = got[name]
        when = f"{data.get('date', 'undated')}, {data.get('device') or data.get('machine', '?')}"
        return f" [{when}{'' if current(data) else f'; *stale*: {other}'}]"

    parts = []
    if "apply" in got:
        a = got["apply"]
        t = next((t for t in a.get("targets", []) if t.get("what", "").startswith("apply / raw")), None)
        verdict = (f"; pair by pair {t['value']:.2f}×, 95 % {t['ci95'][0]:.2f}–{t['ci95'][1]:.2f}, target ≤ "
                   f"{t['max']:g}×: {'*missed*' if t['missed'] else 'met'}") if t and t.get("ci95") else ""
        parts.append(f"`apply`, its proof included, {a['apply_s']:.2f} s vs raw `git worktree add` + `git am -3` "
                     f"{a['raw_git_s']:.2f} s ({a['ratio']:.2f}×{verdict}){mark('apply')}")
    if "layers" in got:
        y = got["layers"]
        parts.append(f"`apply` with a layer of {y['layer']['entries']} entries ([docs/layers.md](docs/layers.md), "
                     f"the example `{y['layer']['name']}`) {y['apply_with_layer_s']:.2f} s vs without "
                     f"{y['apply_s']:.2f} s ({y['ratio']:.2f}×, target ≤ {y['target']:g}×: "
                     f"{'met' if y['within_target'] else '*missed*'}){mark('layers', 'another series or layer')}")
    if "rebase" in got:
        r = got["rebase"]
        parts.append(f"`rebase` {r['rebase']} {r['rebase_s']:.2f} s vs raw `git rebase` + trained rerere "
                     f"{r['raw_git_rebase_rerere_s']:.2f} s ({r['ratio']:.2f}×{_cpu_target(r, 'rebase / raw')}; "
                     f"raw replays the old release's "
                     f"commits and stops {r['raw_git_stops']} times, ours replays the new release's files, looks "
                     f"for merged-upstream evidence, proves the result and checks the API contract){mark('rebase')}")
    if "check" in got:
        c = got["check"]
        target = (f" (target ≤ {c['target_s']:g} s: {'met' if c['within_target'] else '*missed*'})"
                  if "target_s" in c else "")
        calls = f", {c['git_calls_per_rev']:.0f} git calls per rev" if "git_calls_per_rev" in c else ""
        load = f", at load {round(c['load_average'][0])}" if "load_average" in c else ""
        parts.append(f"`check` over the 4 releases {c['four_releases_s']:.2f} s, over {c['commits']} real upstream "
                     f"release commits {c['commits_s']:.1f} s{calls}{target}{load}{mark('check')}")
    if "startup" in got:  # CLI start-up (ci/bench/bench_startup.py): the series plays no part in it
        t = got["startup"]
        cases = t["cases"]
        med = {name: c["median_cpu_s"] for name, c in cases.items()}
        verbs = [v for k, v in med.items() if k.startswith("c128patch ") and k != "c128patch --help"]
        before = [v for k, v in med.items() if k.startswith("before: ")]
        was = f" ({_span(before)} s before)" if before else ""
        cores = str(t.get("machine", "")).split(", ")[-1] or "?"
        click_alone, top = med["python -c 'import click'"], cases["c128patch --help"]
        parts.append(f"`c128patch --help` {top['median_cpu_s']:.3f} s CPU (median of {t['runs']}, {top['x_python']}× "
                     f"`python -c pass`; click's own help, importing click alone {click_alone:.3f} s; target "
                     f"≤ {t['target_cpu_s']:g} s: {'met' if top['within_target'] else '*missed*'}), a verb's "
                     f"`--help` {_span(verbs)} s{was}, at load {round(t['load_average'][0])} on the {cores}")
    if "wheel" in got:
        w = got["wheel"]
        parts.append(f"patching the {w['upstream_wheel_mb']:.0f} MB 0.5.23 wheel {w['wheel_cli_s']:.1f} "
                     f"s{mark('wheel')}")
    return ("Benchmarks (ci/bench/, JSON in `ci/bench/results/`; ratios measured side by side in one run): "
            + "; ".join(parts) + ".\n")
