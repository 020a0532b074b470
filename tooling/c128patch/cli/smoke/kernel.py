"""c128patch smoke kernel: the project's GPU suite on the patched sources."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from c128patch.cli import smoke as cli
from c128patch.errors import C128Error
from c128patch.smoke.presets import SANITIZER_TOOLS


@click.command("kernel", cls=cli.Recording)
@cli.tree_options
@click.option("--differential", is_flag=True, help="Also run the suite on the unpatched upstream sources and compare.")
@click.option("--sanitizer", "sanitizers", type=click.Choice(list(SANITIZER_TOOLS)), multiple=True,
              help="Also run the suite under compute-sanitizer with this tool (repeatable).")
@click.option("--sanitizer-only", is_flag=True,
              help="Only the --sanitizer passes (the plain pass ran in an earlier call).")
@click.option("--scale", type=float, default=1.0, show_default=True, help="C128PATCH_GPU_SCALE.")
@click.option("--sanitizer-scale", type=float, default=0.05, show_default=True,
              help="C128PATCH_GPU_SCALE under compute-sanitizer.")
@cli.common_options
@click.pass_context
def command(ctx: click.Context, stage_dir: Path | None, as_json: bool, run: cli.Run, differential: bool,
            sanitizers: tuple[str, ...], sanitizer_only: bool, **fields: Any) -> None:
    """The project's GPU suite (tests/gpu) on the patched sources, on any machine with one CUDA GPU,
    nvcc, torch and tvm_ffi; optionally under compute-sanitizer and against the unpatched upstream
    sources (--differential)."""
    from c128patch.smoke import kernel, render

    cli.check_outputs(out=fields["out"], stage=stage_dir)
    if fields["scale"] <= 0 or fields["sanitizer_scale"] <= 0:
        raise C128Error("--scale and --sanitizer-scale must be positive")
    if sanitizer_only and not sanitizers:
        raise C128Error(f"--sanitizer-only needs --sanitizer {'|'.join(SANITIZER_TOOLS)}")
    opts = cli.kernel_options(fields, sanitizers=tuple(dict.fromkeys(sanitizers)), sanitizer_only=sanitizer_only,
                          differential=differential and not sanitizer_only)
    say = cli.progress(as_json)
    if stage_dir is not None:
        staged = kernel.stage_trees(opts, stage_dir, say)
        up = ["--upstream-tree", staged["upstream"]["path"], "--differential"] if "upstream" in staged else []
        cli.report_staged(staged, run, ["kernel", "--tree", staged["patched"]["path"], *up])
        return
    report, path = kernel.run(opts, cli.command_line(ctx), say)
    cli.finish(report, run, lambda: render.print_kernel(report, path))
