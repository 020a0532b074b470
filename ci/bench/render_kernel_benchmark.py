#!/usr/bin/env python3
"""Render the DSPARK c128 kernel benchmark results as the markdown tables of docs/kernel-benchmark.md.

  python ci/bench/render_kernel_benchmark.py ci/gpu/results > docs/kernel-benchmark.md

Reads every release's keyed `<rev>/kernel-bench.json` (ci/gpu/h200_run.py bench, collected by
ci/gpu/collect_results.py): the full tables of the 0.5.23 run, then every row of every release
side by side with its `within 5 % of 0.5.23` check. Every number comes from those files; nothing
is typed in (tests/test_evidence.py keeps the document equal to this rendering).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

STEP_COLUMNS = (
    ("upstream MTP overhead (plan+mark+commit×31 eager+write prefix×31)", "upstream", "step overhead"),
    ("upstream prefill compress ×31", "upstream", "online prefill compress_forward"),
    ("ours: plan + write prefix ×31 + commit (standalone)", "ours", "added per step"),
    ("ours: plan + fused compress ×31 + commit", "ours", "fused step"),
    ("ours: compress alone ×31", "ours", "compress alone"),
    ("ours: added by the fused path (fused step − compress alone)", "ours", "added by the fused path"),
    ("floor: 31 graph nodes, 1 DRAM round trip each", "floor", "31 graph nodes"),
)
KERNEL_ROWS = (
    ("fused verify compress ×31", "ours", "fused verify_compress x31"),
    ("write prefix ×31 (standalone)", "ours", "write_prefix x31 (standalone)"),
    ("upstream write_prefix_states ×31", "upstream", "write_prefix_states x31"),
    ("commit, 31 layers, 1 launch (lone graph node)", "ours", "commit, 31 layers, 1 launch"),
    ("commit, 31 layers, per launch in a chain of 8", "ours", "commit, 31 layers, per launch in a chain"),
    ("upstream commit_pending ×31", "upstream", "commit_pending x31"),
)


def pick(rows: list[dict], B: int, W: int, path: str, what: str) -> dict | None:
    return next((r for r in rows if (r["B"], r["W"], r["path"]) == (B, W, path) and r["what"].startswith(what)
                 and not r["what"].endswith("(eager)")), None)


def table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in body])


REFERENCE = "v0.5.23"


def _short_key(key: dict | None) -> str:
    key = key or {}
    return f"{str(key.get('sources') or key.get('upstream_tree') or '?')[:10]}/{str(key.get('series_hash', '?'))[:10]}"

TOLERANCE = 0.05


def render(data: dict, others: dict[str, dict] | None = None, missing: list[str] | None = None) -> str:
    rows = data["rows"]
    configs = sorted({(r["B"], r["W"]) for r in rows})
    out = [
        "# Online C128 DSPARK kernels: H200 benchmark",
        "",
        f"{data.get('rev', '?')}, measured {data.get('date', '?')} on {data['device']} (key "
        f"{_short_key(data.get('key'))}): "
        f"`{data.get('command', '?')}`. {data['layers']} c128 layers, fp32 state, "
        f"uniform W tokens per row, CUDA graphs replayed with L2 flushed; median of {data['reps']} replays. "
        f"Copy ceiling measured in the same run: {data['copy_ceiling_gbps']:.0f} GB/s (1 GiB device-to-device, "
        "bytes read + written). Raw rows: `ci/gpu/results/<rev>/kernel-bench.json`; rendered by "
        "`ci/bench/render_kernel_benchmark.py ci/gpu/results`.",
        "",
        "Bytes counted per kernel: verify tokens read (4 KiB each), bank 0 read when a chunk is open, banks "
        "written (6 KiB each), emitted rows (2 KiB); commit: 6 KiB read + 6 KiB written per copied row per layer. "
        "\"Compress alone\" is the fused kernel with its bank stores cut out (`ci/bench/kernel_variants.py`): the "
        "pooling a verify step does anyway, so fused step − compress alone is what the bank writes, the plan and "
        "the commit add. Upstream's overhead excludes its compress kernels the same way.",
        "",
        "## Per verify step (µs)",
        "",
    ]
    body = []
    for B, W in configs:
        cells = [str(B), str(W)]
        for _, path, what in STEP_COLUMNS:
            r = pick(rows, B, W, path, what)
            cells.append(f"{r['us']:.1f}" if r else "–")
        body.append(cells)
    out += [table(["B", "W", *(c[0] for c in STEP_COLUMNS)], body), "",
            "## Kernels: bytes, GB/s, % of the copy ceiling", ""]
    body = []
    for B, W in configs:
        for label, path, what in KERNEL_ROWS:
            r = pick(rows, B, W, path, what)
            if r:
                body.append([str(B), str(W), label, str(r["launches"]), f"{r['us']:.1f}", f"{r['mbytes']:.1f}",
                             f"{r['gbps']:.0f}", f"{r['pct_ceiling']:.1f}"])
    out += [table(["B", "W", "kernel", "launches", "µs", "MB", "GB/s", "% ceiling"], body), "", "## Targets", ""]
    body = [[name, "met" if t["met"] else "**not met**", f"{t['value']}", f"{t['goal']}", t["how"]]
            for name, t in data["targets"].items()]
    out += [table(["target", "result", "value", "goal", "measured as"], body), ""]
    if others:
        out += releases_table(data, others, missing or [])
    return "\n".join(out)


def releases_table(ref: dict, others: dict[str, dict], missing: list[str]) -> list[str]:
    """Every row of the reference run, each release's time beside it and whether it is within
    TOLERANCE of the reference (a release measured on another series is not compared)."""
    revs = sorted(others)
    head = ["B", "W", "path", "what", *[f"{rev} µs" for rev in revs], f"within {TOLERANCE:.0%} of {ref.get('rev')}"]
    index = {rev: {(r["B"], r["W"], r["path"], r["what"]): r["us"] for r in d["rows"]} for rev, d in others.items()}
    comparable = [rev for rev in revs if others[rev].get("series_digest") == ref.get("series_digest")]
    body, within, total = [], 0, 0
    ours_within, ours_total = 0, 0
    for r in ref["rows"]:
        k = (r["B"], r["W"], r["path"], r["what"])
        cells = [f"{index[rev][k]:.1f}" if k in index[rev] else "–" for rev in revs]
        misses = [rev for rev in comparable if rev != ref.get("rev") and k in index[rev]
                  and abs(index[rev][k] / r["us"] - 1) > TOLERANCE] if r["us"] > 0 else []
        checked = [rev for rev in comparable if rev != ref.get("rev") and k in index[rev]]
        total += len(checked)
        within += len(checked) - len(misses)
        if r["path"] == "ours":
            ours_total += len(checked)
            ours_within += len(checked) - len(misses)
        verdict = "yes" if checked and not misses else ("**no**: " + ", ".join(
            f"{rev} {index[rev][k] / r['us'] - 1:+.1%}" for rev in misses) if misses else "not compared")
        body.append([str(r["B"]), str(r["W"]), r["path"], r["what"], *cells, verdict])
    skipped = [rev for rev in revs if rev not in comparable]
    return ["## Every release against " + str(ref.get("rev")), "",
            f"The same rows on every release (one run per release, in sequence on one GPU, same series): "
            f"{within} of {total} (release, row) pairs within {TOLERANCE:.0%} of {ref.get('rev')}; of our kernels' "
            f"rows {ours_within} of {ours_total} (the upstream rows run each release's own code, which differs)."
            + (f" Not compared (another series): {', '.join(skipped)}." if skipped else "")
            + (f" No run committed for {', '.join(missing)}." if missing else ""), "",
            table(head, body), ""]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    root = Path(argv[0])
    runs = {p.parent.name: json.loads(p.read_text()) for p in sorted(root.glob("v*/kernel-bench.json"))}
    if REFERENCE not in runs:
        print(f"no {REFERENCE}/kernel-bench.json under {root}", file=sys.stderr)
        return 2
    missing = sorted(p.name for p in root.glob("v*") if p.is_dir() and p.name not in runs)
    sys.stdout.write(render(runs[REFERENCE], runs, missing))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
