#!/usr/bin/env python3
"""apply with one layer of 3 entries (docs/examples/acme-layer) vs apply without it, on the real 0.5.23
tree: the two whole CLI applies (proof included), N paired runs, interleaved; target: the wall ratio
of the medians <= 1.2.
  python ci/bench/bench_layers.py [--runs 3] [--out ci/bench/results/layers.json]
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from benchlib import append, c128patch, interleaved, mirror, parser, ratio, table, target

from c128patch.series.layers import stack
from c128patch.series.manifest import default_series_root, load_series

LAYER = Path(__file__).resolve().parents[2] / "docs" / "examples" / "acme-layer"
TARGET = 1.2


def apply(repo: Path, dest: Path, series_root: Path, layers: list[Path]) -> None:
    proc = c128patch("apply", "--sglang-rev", "v0.5.23", "--repo", str(repo), "--tree", str(dest),
                     "--series", str(series_root), *[a for layer in layers for a in ("--layer", str(layer))])
    if not json.loads(proc.stdout)["equivalence"]["identical"]:
        raise SystemExit(f"apply's proof failed: {proc.stdout[-2000:]}")


def main() -> int:
    args = parser("layers").parse_args()
    series = load_series(default_series_root())
    layer = stack(series, [LAYER]).layers[0]
    work = Path(tempfile.mkdtemp(prefix="bench-layers-"))
    try:
        repo = mirror(work)
        figures, _ = interleaved({
            f"c128patch apply --sglang-rev v0.5.23 ({len(series.entries)} entries)":
                lambda i: apply(repo, work / f"plain{i}", series.root, []),
            f"  ... --layer docs/examples/acme-layer (+{len(layer.entries)} entries)":
                lambda i: apply(repo, work / f"layer{i}", series.root, [LAYER])}, args.runs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    plain, layered = figures
    r, medians = ratio(figures, layered, plain), {name: f["wall"]["median"] for name, f in figures.items()}
    table(figures)
    record = {"runs": args.runs, "figures": figures, "ratios": {"with the layer / without": r},
              "targets": [target("apply with the layer / without", r["wall"], TARGET)],
              # README's figures (c128patch.evidence.figures)
              "series_entries": len(series.entries), "layer": {
                  "name": layer.name, "version": layer.version, "entries": len(layer.entries),
                  "digest": layer.digest()},
              "apply_s": medians[plain], "apply_with_layer_s": medians[layered],
              "ratio": r["wall"], "target": TARGET, "within_target": r["wall"] <= TARGET}
    return int(append(args.out, record, revs=("v0.5.23",))["missed"])


if __name__ == "__main__":
    raise SystemExit(main())
