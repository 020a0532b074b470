"""c128patch smoke upstream: upstream SGLang's own kernel tests, patched vs unpatched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from c128patch.cli import smoke as cli


@click.command("upstream", cls=cli.Recording)
@cli.tree_options
@click.option("--tests", type=click.Path(path_type=Path),
              help="The test/ folder of an sglang checkout, or the checkout (default: the tree's own repository).")
@click.option("--parallel-trees", is_flag=True,
              help="Run the patched and the unpatched pass at the same time (two pytest processes, sharing the "
                   "GPU; each builds its own JIT modules).")
@cli.common_options
@click.pass_context
def command(ctx: click.Context, stage_dir: Path | None, as_json: bool, run: cli.Run, tests: Path | None,
            parallel_trees: bool, **fields: Any) -> None:
    """Upstream SGLang's own kernel tests that reach what the series touches, from an sglang
    checkout, on the patched and on the unpatched tree side by side, with a verdict per test."""
    from c128patch.smoke import render
    from c128patch.smoke import upstream_suite as suite

    cli.check_outputs(out=fields["out"], stage=stage_dir)
    opts = cli.kernel_options(fields)
    say = cli.progress(as_json)
    if stage_dir is not None:
        staged, selection = suite.stage_run(opts, tests, stage_dir, say)
        cli.report_staged(staged, run, ["upstream", "--tree", staged["patched"]["path"], "--upstream-tree",
                                            staged["upstream"]["path"], "--tests", str(stage_dir / suite.STAGED_TESTS)],
                          selection=selection)
        return
    report, path = suite.run(opts, tests, cli.command_line(ctx), say, parallel_trees)
    cli.finish(report, run, lambda: render.print_upstream(report, path, suite.RESULT))
