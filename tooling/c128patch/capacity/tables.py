"""Rich tables for capacity results and for PR #32035's explanation (the CLI and ci/bench print them)."""

from __future__ import annotations

from typing import Any, Optional

from rich.table import Table

from c128patch.capacity import model as cap

COLUMNS = ("model", "R", "W", "B/full token", "c128 state off GiB", "c128 state on GiB",
           "full tokens off", "full tokens on", "Δ tokens", "Δ %")


def _cells(r: cap.CapacityResult) -> list[str]:
    pct = 100.0 * r.delta_tokens / r.off.full_tokens if r.off.full_tokens else float("inf")
    return [r.inputs.layout.name, str(r.max_running_requests_per_worker), str(r.draft_banks),
            f"{r.bytes_per_full_token:,.1f}", *(f"{cap.gib(m.c128_fixed_bytes):.3f}" for m in (r.off, r.on)),
            *(f"{m.full_tokens:,}" + (" (refused)" if m.refusal else "") for m in (r.off, r.on)),
            f"{r.delta_tokens:+,}", f"{pct:+.1f}"]


def render_table(results: list[cap.CapacityResult], title: str) -> Table:
    table = Table(title=title)
    for col in COLUMNS:
        table.add_column(col, justify="left" if col == "model" else "right")
    for r in results:
        table.add_row(*_cells(r))
    return table


def markdown_table(results: list[cap.CapacityResult]) -> str:
    """The same rows as Markdown (``capacity --markdown``: what docs/capacity.md carries)."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|---|" + "---:|" * (len(COLUMNS) - 1)]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in results]
    return "\n".join(lines) + "\n"


def render_pr(explained: dict) -> Table:
    table = Table(title=f"PR #{explained['pr']}: reported {explained['reported']['off']:,} → "
                        f"{explained['reported']['on']:,} full tokens")
    for col in ("hypothesis", "R", "W", "B/full token", "Δ (unfloored)", "both exact", "budget GiB"):
        table.add_column(col, justify="left" if col == "hypothesis" else "right")
    for row in [explained["explanation"], *explained["alternatives"]]:
        budget = row["example_budget_bytes"]
        table.add_row(row["label"], str(row["max_running_requests"]), str(row["draft_tokens"]),
                      f"{row['bytes_per_full_token']:,.1f}", f"{row['unfloored_delta_tokens']:,.0f}",
                      "yes" if row["exact"] else "no", f"{cap.gib(budget):.4f}" if budget else "-")
    return table


def report_json(results: list[cap.CapacityResult], r_mode: str, explained: Optional[dict]) -> dict[str, Any]:
    """``capacity --json``."""
    out = {"budget_bytes": results[0].inputs.budget_bytes, "max_running_requests_mode": r_mode,
           "dspark_default_max_running_requests": cap.DSPARK_DEFAULT_MAX_RUNNING_REQUESTS,
           "dsv4_default_max_running_requests": cap.DSV4_DEFAULT_MAX_RUNNING_REQUESTS}
    return out | {"results": [res.to_dict() for res in results]} | ({"pr_32035": explained} if explained else {})


def print_report(results: list[cap.CapacityResult], r_mode: str, explained: Optional[dict]) -> None:
    """The table, what R is, each refusal, the notes and (``explained``) PR #32035's numbers."""
    from c128patch.progress import table_console

    console = table_console()  # within 100 columns, piped too (issue 37; the rows whole: --markdown, --json)
    inp = results[0].inputs
    title = (f"KV budget {cap.gib(inp.budget_bytes):.2f} GiB/GPU, TP{inp.tp_size}, formula {inp.formula}, "
             f"swa ratio {inp.swa_full_tokens_ratio}, {inp.state_dtype} state, "
             f"{'DSPARK' if inp.speculative else 'no speculation'}")
    console.print(render_table(results, title))
    if r_mode == "auto":
        dsv4 = cap.DSV4_DEFAULT_MAX_RUNNING_REQUESTS
        console.print(f"R = {dsv4}: a DSV4 target with no --max-running-requests gets the DSV4 hook's {dsv4}; DSPARK's "
                      f"own default ({cap.DSPARK_DEFAULT_MAX_RUNNING_REQUESTS}) only fills the field when it is still "
                      "unset, which it is not for DSV4. Use --max-running-requests dspark to see R = 48.")
    for res in results:
        for mode in (res.off, res.on):
            if mode.refusal:
                state = "on" if mode.online else "off"
                console.print(f"[red]{res.inputs.layout.name}, online {state}: {mode.refusal}[/red]")
    for note in sorted({n for res in results for n in res.notes}):
        console.print(f"note: {note}")
    if explained:
        console.print(render_pr(explained))
