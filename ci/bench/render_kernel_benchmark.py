#!/usr/bin/env python3
"""Render the DSPARK c128 kernel benchmark JSON as the markdown tables of docs/kernel-benchmark.md.

  python ci/bench/render_kernel_benchmark.py ci/bench/results/online_c128_dspark.json > docs/kernel-benchmark.md

Every number comes from the JSON (one run, bench_online_c128_dspark.py); nothing is typed in.
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


def render(data: dict) -> str:
    rows = data["rows"]
    configs = sorted({(r["B"], r["W"]) for r in rows})
    out = [
        "# Online C128 DSPARK kernels: H200 benchmark",
        "",
        f"One run on an {data['device']}: `{data.get('command', '?')}`. {data['layers']} c128 layers, fp32 state, "
        f"uniform W tokens per row, CUDA graphs replayed with L2 flushed; median of {data['reps']} replays. "
        f"Copy ceiling measured in the same run: {data['copy_ceiling_gbps']:.0f} GB/s (1 GiB device-to-device, "
        "bytes read + written). Raw rows: `ci/bench/results/online_c128_dspark.json`; rendered by "
        "`ci/bench/render_kernel_benchmark.py`.",
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
    out += [table(["B", "W", *(c[0] for c in STEP_COLUMNS)], body), "", "## Kernels: bytes, GB/s, % of the copy ceiling", ""]
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
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    sys.stdout.write(render(json.loads(Path(argv[0]).read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
