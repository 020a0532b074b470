"""c128patch smoke server: a real server on a model under load, the online-C128 envs on then off."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path
from typing import Any

import click

from c128patch.cli import smoke as cli
from c128patch.cli.common import Seconds
from c128patch.smoke.presets import LOAD_TOOLS, PRESETS


def _kv(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--env")
        out[key] = value
    return out


def _argv(_ctx: click.Context, _param: click.Parameter, value: str | None) -> list[str] | None:
    return shlex.split(value) if value else None


@click.command("server", cls=cli.Recording)
@click.option("--model-path", required=True, help="The model (DeepSeek-V4 with a DSPARK draft).")
@click.option("--tp", type=int, default=1, show_default=True, help="Tensor parallel size.")
@click.option("--port", type=int, default=30001, show_default=True, help="Port on 127.0.0.1.")
@click.option("--duration", type=Seconds(), default=900.0, show_default=True, help="Load seconds per mode.")
@click.option("--max-requests", type=int, help="At most this many requests per mode (default: the soak's 64 x 30).")
@click.option("--compact", is_flag=True, help="SGLANG_RAGGED_VERIFY_MODE=compact (PR bug 1).")
@click.option("--load", type=click.Choice(list(LOAD_TOOLS)), default="serving", show_default=True,
              help="serving: python -m sglang.bench_serving (multi-turn shared prefix); "
                   "multiturn: benchmark/hicache/bench_multiturn.py (--multiturn-script).")
@click.option("--multiturn-script", type=click.Path(dir_okay=False, path_type=Path),
              help="Path of benchmark/hicache/bench_multiturn.py in an sglang checkout.")
@click.option("--preset", type=click.Choice(list(PRESETS)), default="soak", show_default=True,
              help="The PR's soak-test or precision-test server flags.")
@click.option("--mem-fraction-static", type=float, help="Override the preset's value.")
@click.option("--moe-runner-backend", default="flashinfer_mxfp4", show_default=True, help="'' to leave it to sglang.",
              callback=lambda _c, _p, value: value or None)
@click.option("--server-arg", "server_args", multiple=True, help="Extra server flag (repeatable).")
@click.option("--env", multiple=True, callback=_kv, help="KEY=VALUE for the server, both modes (repeatable).")
@click.option("--modes", default="on,off", show_default=True, help="Which of on,off to run, in order.",
              callback=lambda _c, _p, value: tuple(m.strip() for m in value.split(",") if m.strip()))
@click.option("--health-timeout", type=Seconds(), default=1800.0, show_default=True,
              help="Seconds to wait for /health.")
@click.option("--grace", type=Seconds(min=0), default=30.0, show_default=True,
              help="Seconds from SIGTERM to SIGKILL when the server and the load are stopped.")
@click.option("--launcher", callback=_argv, help="Server command (default: PYTHON -m sglang.launch_server).")
@click.option("--load-cmd", callback=_argv, help="Load tool command replacing the default prefix.")
@click.option("--allow-unpatched", is_flag=True, help="Run on an sglang without a c128patch provenance record.")
@cli.common_options
@click.pass_context
def command(ctx: click.Context, out: Path | None, as_json: bool, run: cli.Run, **fields: Any) -> None:
    """python -m sglang.launch_server with PR #32035's flags on a model, sustained multi-turn load
    with sglang's benchmark tools, crash watch, capacity from the log; then the same with the
    online-C128 envs off."""
    from c128patch.smoke import render
    from c128patch.smoke.server import REPORT, ServerOptions, run_server_tier
    from c128patch.smoke.trees import out_dir

    cli.check_outputs(out=out)
    opts = ServerOptions(**fields, out=out_dir(out, "server"))
    try:
        report = run_server_tier(opts, cli.command_line(ctx), cli.progress(as_json))
    except BaseException as exc:
        if out is None and (isinstance(exc, KeyboardInterrupt) or not (opts.out / REPORT).exists()):
            shutil.rmtree(opts.out, ignore_errors=True)  # refused before any report, or interrupted: no temp folder
        raise
    cli.finish(report, run, lambda: render.print_server(report, opts.out / REPORT))
