"""``c128patch capacity``: KV tokens with online C128 off and on."""

from __future__ import annotations

from typing import Any, Optional

import click

from c128patch.capacity import model as cap
from c128patch.cli.common import emit_json

_POSITIVE = click.FloatRange(0, min_open=True)
_FRACTION = click.FloatRange(0, 1, min_open=True)


@click.command("capacity")
@click.option("--preset", "presets", type=click.Choice(sorted(cap.PRESETS)), multiple=True,
              help="Layer layout preset(s); default flash and pro.")
@click.option("--compress-ratios", help="Comma-separated per-layer ratios (0/4/128); replaces --preset.")
@click.option("--context-len", type=click.IntRange(min=1),
              help="Context length for the estimate path (default 1,048,576).")
@click.option("--budget-gib", type=_POSITIVE, help="KV budget per GPU in GiB (what the configurator divides).")
@click.option("--budget-bytes", type=click.IntRange(min=1), help="KV budget per GPU in bytes.")
@click.option("--gpu-gib", type=_POSITIVE, help="GPU memory in GiB (with --mem-fraction-static, --non-kv-gib).")
@click.option("--mem-fraction-static", type=_FRACTION, help="Static memory fraction.")
@click.option("--non-kv-gib", type=click.FloatRange(min=0),
              help="Weights and other non-KV use inside the static fraction, GiB.")
@click.option("--tp", "tp_size", type=click.IntRange(min=1), default=8, show_default=True,
              help="Tensor parallel size (recorded; the DSV4 latent is replicated per rank).")
@click.option("--dp", "attn_dp_size", type=click.IntRange(min=1), default=1, show_default=True,
              help="Attention DP size; R is per DP worker (R // dp).")
@click.option("--swa-full-tokens-ratio", type=_FRACTION, default=cap.DEFAULT_SWA_FULL_TOKENS_RATIO, show_default=True)
@click.option("--max-running-requests", "max_rr", default="auto", show_default=True,
              help="INT, auto (256: a DSV4 target's default), dspark (48: DSPARK's default, "
                   "non-DSV4 targets only) or estimate (the configurator's unset path).")
@click.option("--draft-tokens", "num_draft_tokens", type=click.IntRange(min=1), default=cap.DSPARK_DEFAULT_DRAFT_TOKENS,
              show_default=True, help="W = gamma + 1 (DSPARK default gamma 7; DSV4 DSpark checkpoints set 5).")
@click.option("--state-dtype", type=click.Choice(["fp32", "bf16"]), default="fp32", show_default=True)
@click.option("--page-size", type=click.IntRange(min=1), default=cap.DSV4_PAGE_SIZE, show_default=True)
@click.option("--speculative/--no-speculative", default=True, show_default=True)
@click.option("--formula", type=click.Choice(list(cap.FORMULAS)), default="0.5.23", show_default=True,
              help="Release whose arithmetic to mirror; 0.5.20 is also PR #32035's July base.")
@click.option("--kv-layout", type=click.Choice(["v4", "v41"]), default="v4", show_default=True)
@click.option("--explain-pr", is_flag=True, help="Also show how PR #32035's numbers come out.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.option("--markdown", is_flag=True, help="Print the rows as a Markdown table (what docs/capacity.md carries).")
def command(presets: tuple[str, ...], compress_ratios: Optional[str], context_len: Optional[int],
            budget_gib: Optional[float], budget_bytes: Optional[int], gpu_gib: Optional[float],
            mem_fraction_static: Optional[float], non_kv_gib: Optional[float], max_rr: str, explain_pr: bool,
            as_json: bool, markdown: bool, **given: Any) -> None:
    """KV capacity (full tokens) with DeepSeek-V4 online C128 off and on."""
    from c128patch.capacity import pr as capacity_pr
    from c128patch.capacity.tables import markdown_table, print_report, report_json

    try:
        r, r_mode = cap.max_running_requests(max_rr)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--max-running-requests")
    try:
        layouts = cap.layouts(presets, compress_ratios, context_len)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--compress-ratios")
    try:
        budget = cap.kv_budget(budget_gib, budget_bytes, gpu_gib, mem_fraction_static, non_kv_gib)
        results = [cap.compute(cap.CapacityInputs(budget_bytes=budget, layout=layout, max_running_requests=r, **given))
                   for layout in layouts]
    except ValueError as e:
        raise click.UsageError(str(e))
    explained = capacity_pr.explain() if explain_pr else None
    if as_json:
        emit_json(report_json(results, r_mode, explained))
    elif markdown:
        click.echo(markdown_table(results), nl=False)
    else:
        print_report(results, r_mode, explained)
