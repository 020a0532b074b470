"""``c128patch capacity``: KV tokens with online C128 off and on."""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Optional

import click

from c128patch.capacity import model as cap
from c128patch.cli.common import emit_json

_R_KEYWORDS = {
    "auto": cap.DSV4_DEFAULT_MAX_RUNNING_REQUESTS,
    "dspark": cap.DSPARK_DEFAULT_MAX_RUNNING_REQUESTS,
    "estimate": None,
}


def parse_max_running_requests(value: str) -> tuple[Optional[int], str]:
    """INT, 'auto' (what a DSV4 target gets when the flag is unset), 'dspark' (DSPARK's
    own default, which applies to non-DSV4 targets only) or 'estimate'."""
    key = value.strip().lower()
    if key in _R_KEYWORDS:
        return _R_KEYWORDS[key], key
    try:
        n = int(key)
    except ValueError:
        raise click.BadParameter(f"expected an integer, auto, dspark or estimate; got {value!r}")
    if n < 1:
        raise click.BadParameter("must be >= 1")
    return n, "given"


def resolve_budget(
    budget_gib: Optional[float],
    budget_bytes: Optional[int],
    gpu_gib: Optional[float],
    mem_fraction_static: Optional[float],
    non_kv_gib: Optional[float],
) -> int:
    """The KV byte budget the configurator divides (one GPU)."""
    derived = (gpu_gib, mem_fraction_static, non_kv_gib)
    given = [budget_gib is not None, budget_bytes is not None, any(v is not None for v in derived)]
    if sum(given) != 1:
        raise click.UsageError(
            "give the KV budget one way: --budget-gib, --budget-bytes, or "
            "--gpu-gib with --mem-fraction-static and --non-kv-gib"
        )
    if budget_bytes is not None:
        budget = budget_bytes
    elif budget_gib is not None:
        budget = int(budget_gib * (1 << 30))
    else:
        if any(v is None for v in derived):
            raise click.UsageError("--gpu-gib, --mem-fraction-static and --non-kv-gib go together")
        budget = int((gpu_gib * mem_fraction_static - non_kv_gib) * (1 << 30))
    if budget <= 0:
        raise click.UsageError(f"the KV budget must be positive, got {budget} bytes")
    return budget


def _layouts(presets: tuple[str, ...], compress_ratios: Optional[str], context_len: Optional[int]) -> list[cap.Layout]:
    if compress_ratios:
        try:
            ratios = [int(x) for x in compress_ratios.replace(" ", "").split(",") if x]
            layout = cap.custom_layout(ratios)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--compress-ratios")
        layouts = [layout]
    else:
        layouts = [cap.PRESETS[p] for p in (presets or ("flash", "pro"))]
    if context_len is not None:
        layouts = [replace(l, context_len=context_len) for l in layouts]
    return layouts


@click.command("capacity")
@click.option("--preset", "presets", type=click.Choice(sorted(cap.PRESETS)), multiple=True,
              help="Layer layout preset(s); default flash and pro.")
@click.option("--compress-ratios", help="Comma-separated per-layer ratios (0/4/128); replaces --preset.")
@click.option("--context-len", type=int, help="Context length for the estimate path (default 1,048,576).")
@click.option("--budget-gib", type=float, help="KV budget per GPU in GiB (what the configurator divides).")
@click.option("--budget-bytes", type=int, help="KV budget per GPU in bytes.")
@click.option("--gpu-gib", type=float, help="GPU memory in GiB (with --mem-fraction-static, --non-kv-gib).")
@click.option("--mem-fraction-static", type=float, help="Static memory fraction.")
@click.option("--non-kv-gib", type=float, help="Weights and other non-KV use inside the static fraction, GiB.")
@click.option("--tp", type=int, default=8, show_default=True,
              help="Tensor parallel size (recorded; the DSV4 latent is replicated per rank).")
@click.option("--dp", "attn_dp", type=int, default=1, show_default=True,
              help="Attention DP size; R is per DP worker (R // dp).")
@click.option("--swa-full-tokens-ratio", type=float, default=cap.DEFAULT_SWA_FULL_TOKENS_RATIO, show_default=True)
@click.option("--max-running-requests", "max_rr", default="auto", show_default=True,
              help="INT, auto (256: a DSV4 target's default), dspark (48: DSPARK's default, "
                   "non-DSV4 targets only) or estimate (the configurator's unset path).")
@click.option("--draft-tokens", type=int, default=cap.DSPARK_DEFAULT_DRAFT_TOKENS, show_default=True,
              help="W = gamma + 1 (DSPARK default gamma 7; DSV4 DSpark checkpoints set 5).")
@click.option("--state-dtype", type=click.Choice(["fp32", "bf16"]), default="fp32", show_default=True)
@click.option("--page-size", type=int, default=cap.DSV4_PAGE_SIZE, show_default=True)
@click.option("--speculative/--no-speculative", default=True, show_default=True)
@click.option("--formula", type=click.Choice(list(cap.FORMULAS)), default="0.5.23", show_default=True,
              help="Release whose arithmetic to mirror; 0.5.20 is also PR #32035's July base.")
@click.option("--kv-layout", type=click.Choice(["v4", "v41"]), default="v4", show_default=True)
@click.option("--explain-pr", is_flag=True, help="Also show how PR #32035's numbers come out.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.option("--markdown", is_flag=True, help="Print the rows as a Markdown table (what docs/capacity.md carries).")
def command(
    presets: tuple[str, ...],
    compress_ratios: Optional[str],
    context_len: Optional[int],
    budget_gib: Optional[float],
    budget_bytes: Optional[int],
    gpu_gib: Optional[float],
    mem_fraction_static: Optional[float],
    non_kv_gib: Optional[float],
    tp: int,
    attn_dp: int,
    swa_full_tokens_ratio: float,
    max_rr: str,
    draft_tokens: int,
    state_dtype: str,
    page_size: int,
    speculative: bool,
    formula: str,
    kv_layout: str,
    explain_pr: bool,
    as_json: bool,
    markdown: bool,
) -> None:
    """KV capacity (full tokens) with DeepSeek-V4 online C128 off and on."""
    from rich.console import Console

    from c128patch.capacity import pr as capacity_pr
    from c128patch.capacity.tables import markdown_table, render_pr, render_table
    from c128patch.progress import console as plain_console

    r, r_mode = parse_max_running_requests(max_rr)
    budget = resolve_budget(budget_gib, budget_bytes, gpu_gib, mem_fraction_static, non_kv_gib)
    results = []
    for layout in _layouts(presets, compress_ratios, context_len):
        try:
            inp = cap.CapacityInputs(
                budget_bytes=budget, layout=layout, swa_full_tokens_ratio=swa_full_tokens_ratio,
                max_running_requests=r, attn_dp_size=attn_dp, tp_size=tp, speculative=speculative,
                num_draft_tokens=draft_tokens, state_dtype=state_dtype, page_size=page_size,
                formula=formula, kv_layout=kv_layout,
            )
            results.append(cap.compute(inp))
        except ValueError as e:
            raise click.UsageError(str(e))
    explained = capacity_pr.explain() if explain_pr else None

    if as_json:
        out = {
            "budget_bytes": budget,
            "max_running_requests_mode": r_mode,
            "dspark_default_max_running_requests": cap.DSPARK_DEFAULT_MAX_RUNNING_REQUESTS,
            "dsv4_default_max_running_requests": cap.DSV4_DEFAULT_MAX_RUNNING_REQUESTS,
            "results": [res.to_dict() for res in results],
        }
        if explained:
            out["pr_32035"] = explained
        emit_json(out)
        return

    if markdown:
        click.echo(markdown_table(results), nl=False)
        return

    # A pipe or a file gets the whole table rather than 80 wrapped columns.
    console = Console() if sys.stdout.isatty() else plain_console(stderr=False)
    title = (f"KV budget {cap.gib(budget):.2f} GiB/GPU, TP{tp}, formula {formula}, "
             f"swa ratio {swa_full_tokens_ratio}, {state_dtype} state, "
             f"{'DSPARK' if speculative else 'no speculation'}")
    console.print(render_table(results, title))
    if r_mode == "auto":
        console.print(
            f"R = {cap.DSV4_DEFAULT_MAX_RUNNING_REQUESTS}: a DSV4 target with no "
            f"--max-running-requests gets the DSV4 hook's {cap.DSV4_DEFAULT_MAX_RUNNING_REQUESTS}; "
            f"DSPARK's own default ({cap.DSPARK_DEFAULT_MAX_RUNNING_REQUESTS}) only fills the field "
            "when it is still unset, which it is not for DSV4. Use --max-running-requests dspark "
            "to see R = 48."
        )
    for res in results:
        for mode in (res.off, res.on):
            if mode.refusal:
                state = "on" if mode.online else "off"
                console.print(f"[red]{res.inputs.layout.name}, online {state}: {mode.refusal}[/red]")
    for note in sorted({n for res in results for n in res.notes}):
        console.print(f"note: {note}")
    if explained:
        console.print(render_pr(explained))
