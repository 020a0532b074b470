"""Rich tables for capacity results and for PR #32035's explanation (the CLI and ci/bench print them)."""

from __future__ import annotations

from rich.table import Table

from c128patch.capacity import model as cap


def _gib(n: float) -> str:
    return f"{cap.gib(n):.3f}"


def _tokens(mode: cap.ModeResult) -> str:
    return f"{mode.full_tokens:,}" + (" (refused)" if mode.refusal else "")


COLUMNS = ("model", "R", "W", "B/full token", "c128 state off GiB", "c128 state on GiB",
           "full tokens off", "full tokens on", "Δ tokens", "Δ %")


def _cells(r: cap.CapacityResult) -> list[str]:
    pct = 100.0 * r.delta_tokens / r.off.full_tokens if r.off.full_tokens else float("inf")
    return [r.inputs.layout.name, str(r.max_running_requests_per_worker), str(r.draft_banks),
            f"{r.bytes_per_full_token:,.1f}", _gib(r.off.c128_fixed_bytes), _gib(r.on.c128_fixed_bytes),
            _tokens(r.off), _tokens(r.on), f"{r.delta_tokens:+,}", f"{pct:+.1f}"]


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
        table.add_row(
            row["label"],
            str(row["max_running_requests"]),
            str(row["draft_tokens"]),
            f"{row['bytes_per_full_token']:,.1f}",
            f"{row['unfloored_delta_tokens']:,.0f}",
            "yes" if row["exact"] else "no",
            f"{cap.gib(budget):.4f}" if budget else "-",
        )
    return table
