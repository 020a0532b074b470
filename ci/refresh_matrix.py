#!/usr/bin/env python3
"""Write `c128patch matrix --markdown` and the figures rendered from the committed results
(figures.py beside it: GPU evidence, kernel timings, tool benchmarks) into README.md
between their markers.

    python ci/refresh_matrix.py [--check]

Run after new evidence is collected (ci/gpu/collect_results.py, ci/compile_kernels.py --record,
ci/bench/*.py) or after a series change made some of it stale. --check exits 1 if README.md is
not current (tests/test_evidence.py checks the same).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
BEGIN, END = "<!-- matrix:begin -->\n", "<!-- matrix:end -->"
sys.path.insert(0, str(REPO / "tooling"))


def current_matrix() -> str:
    return subprocess.run([sys.executable, "-m", "c128patch", "matrix", "--markdown"], check=True,
                          capture_output=True, text=True, cwd=REPO).stdout


def with_matrix(text: str, matrix: str) -> str:
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + matrix + text[end:]


def example_layer_digest(series) -> str:
    from c128patch.series.layers import stack

    return stack(series, [REPO / "docs" / "examples" / "acme-layer"]).layers[0].digest()


def current_figures() -> dict[str, str]:
    """Each figures block of README, rendered from the committed results as of now."""
    import figures  # beside this script

    from c128patch.evidence.matrix import build_matrix
    from c128patch.evidence.results import results_root
    from c128patch.series.manifest import load_series
    from c128patch.upstream.releases import DEFAULT_RELEASES, ReleaseHistory, tag_for

    series = load_series(REPO)
    history = ReleaseHistory()
    revs = [tag_for(v) for v in DEFAULT_RELEASES]
    history.ensure(list(DEFAULT_RELEASES))
    root = results_root(series)
    rows = build_matrix(series, history.git, revs, root)
    today = {row.rev: row.key.to_json() for row in rows if row.key}

    def current(data: dict) -> bool:
        keys = data.get("keys") or {}
        layer = data.get("layer")  # bench_layers: the example layer is part of what it measured
        return (bool(keys) and all(today.get(rev) == key for rev, key in keys.items())
                and (layer is None or layer["digest"] == example_layer_digest(series)))

    return {
        "gpu-evidence": figures.gpu_evidence(rows, root),
        "kernel-figures": figures.kernel_figures(rows, root),
        "tool-benchmarks": figures.tool_benchmarks(REPO / "ci" / "bench" / "results", current),
    }


def render(text: str) -> str:
    import figures  # beside this script

    new = with_matrix(text, current_matrix())
    for name, body in current_figures().items():
        new = figures.with_block(new, name, body)
    return new


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    text = README.read_text()
    new = render(text)
    if args.check:
        if new != text:
            print("README.md's matrix or figures are not current: run python ci/refresh_matrix.py", file=sys.stderr)
            return 1
        return 0
    README.write_text(new)
    print(f"{README}: matrix and figures refreshed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
