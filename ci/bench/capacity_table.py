#!/usr/bin/env python3
"""KV capacity with online C128 off/on: Flash and Pro at R = 48, 128, 256, plus PR #32035.

Prints the tables and, with ``--out``, writes the same rows as JSON. The budget
defaults to the one that reproduces PR #32035's numbers (~39.04 GiB per GPU) so the
rows are comparable with the PR; give ``--budget-gib`` for your own hardware.

    python ci/bench/capacity_table.py --out ci/bench/results/capacity.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tooling"))

import click  # noqa: E402

from c128patch.capacity import model as cap  # noqa: E402
from c128patch.capacity import pr as capacity_pr  # noqa: E402
from c128patch.capacity.tables import render_pr, render_table  # noqa: E402
from c128patch.progress import table_console  # noqa: E402

R_VALUES = (
    (cap.DSPARK_DEFAULT_MAX_RUNNING_REQUESTS, "DSPARK default (non-DSV4 targets)"),
    (128, "explicit"),
    (cap.DSV4_DEFAULT_MAX_RUNNING_REQUESTS, "DSV4 default (what an unset flag gives)"),
)


def build_rows(budget_bytes: int, draft_tokens: int, formula: str) -> list[tuple[str, cap.CapacityResult]]:
    rows = []
    for layout in (cap.FLASH, cap.PRO):
        for r, why in R_VALUES:
            inp = cap.CapacityInputs(
                budget_bytes=budget_bytes, layout=layout, max_running_requests=r,
                num_draft_tokens=draft_tokens, formula=formula,
            )
            rows.append((f"{layout.name}, R={r}: {why}", cap.compute(inp)))
    return rows


def pr_row() -> tuple[str, cap.CapacityResult]:
    fit = capacity_pr.fit(capacity_pr.PR_HYPOTHESIS)
    budget = fit.example_budget() or fit.off_interval[0]
    return (f"PR #{capacity_pr.PR_NUMBER} setting ({capacity_pr.PR_HYPOTHESIS.label})",
            cap.compute(capacity_pr.pr_inputs(budget)))


@click.command()
@click.option("--budget-gib", type=float, help="KV budget per GPU (default: the PR's solved budget).")
@click.option("--draft-tokens", type=int, default=cap.DSPARK_DEFAULT_DRAFT_TOKENS, show_default=True)
@click.option("--formula", type=click.Choice(list(cap.FORMULAS)), default="0.5.23", show_default=True)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="Write JSON here.")
def main(budget_gib: float | None, draft_tokens: int, formula: str, out: Path | None) -> None:
    label, pr_result = pr_row()
    budget = int(budget_gib * (1 << 30)) if budget_gib else pr_result.inputs.budget_bytes
    rows = build_rows(budget, draft_tokens, formula)

    console = table_console()  # within 100 columns, piped too, as `c128patch capacity`'s (issue 37)
    console.print(render_table([r for _, r in rows],
                               f"online C128 off/on, {cap.gib(budget):.2f} GiB KV budget per GPU, "
                               f"formula {formula}, W={draft_tokens}, fp32 state, swa ratio 0.1"))
    console.print(render_table([pr_result], label))
    explained = capacity_pr.explain()
    console.print(render_pr(explained))

    if out:
        data = {
            "budget_bytes": budget,
            "formula": formula,
            "draft_tokens": draft_tokens,
            "rows": [{"label": name, **res.to_dict()} for name, res in rows],
            "pr_row": {"label": label, **pr_result.to_dict()},
            "pr_32035": explained,
        }
        for row in [*data["rows"], data["pr_row"]]:
            row["inputs"]["layout"].pop("compress_ratios")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(data, indent=2) + "\n")
        console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
