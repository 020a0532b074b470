"""c128patch smoke --tier kernel|server: GPU smoke tests of a patched build."""

from __future__ import annotations

import contextlib
import dataclasses
import shlex
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import click

from c128patch import exitcodes
from c128patch.cli.common import check_output_dir, emit_json, handles_errors, json_option, locate_tree
from c128patch.errors import C128Error
from c128patch.smoke.presets import LOAD_TOOLS, PRESETS, SANITIZER_TOOLS

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from c128patch.smoke import kernel as smoke_kernel
    from c128patch.smoke import server as smoke_server

STYLE = {"passed": "green", "failed": "red", "error": "red", "crashed": "bold red", "skipped": "yellow",
         "xfailed": "yellow", "xpassed": "red", "not run": "dim", "absent": "dim",
         "fixed": "green", "regressed": "bold red", "same": "", "differs": "yellow",
         "both fail": "yellow", "both skipped": "dim", "not applicable": "dim"}


class _RecordingCommand(click.Command):
    """Keeps the raw arguments, so the report can say what was run."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["c128patch.args"] = list(args)
        return super().parse_args(ctx, args)


def _stdout() -> Console:
    """The report console: a pipe or a file gets whole rows rather than 80 folded columns."""
    from c128patch.progress import console

    return console(stderr=False)


def _styled(text: str) -> str:
    style = STYLE.get(text, "")
    return f"[{style}]{text}[/{style}]" if style else text


def _out_dir(out: Path | None, tier: str) -> Path:
    return (out if out is not None else Path(tempfile.mkdtemp(prefix=f"c128patch-smoke-{tier}-"))).resolve()


# --------------------------------------------------------------------------- kernel tier


def kernel_table(report: dict[str, Any]) -> Table:
    from rich.table import Table

    passes = report["passes"]
    san_labels = [k for k in passes if k.startswith("patched-")]
    table = Table(title=f"GPU suite: {report['tree']}")
    table.add_column("test", overflow="fold")
    table.add_column("patched")
    table.add_column("s", justify="right")
    diff = "differential" in report
    if diff:
        table.add_column("upstream")
        table.add_column("s", justify="right")
        table.add_column("verdict")
    san_rows: dict[str, dict[str, str]] = {}
    for label in san_labels:
        table.add_column(label.removeprefix("patched-"))
        san_rows[label] = {t["nodeid"]: t["outcome"] for t in passes[label].get("tests_brief", [])}
    for t in report.get("tests", []):
        cells = [t["nodeid"], _styled(t["outcome"]), f"{t['seconds']:.1f}"]
        if diff:
            cells += [_styled(t.get("upstream", "absent")), f"{t.get('upstream_seconds', 0.0):.1f}",
                      _styled(t.get("verdict", ""))]
        cells += [_styled(san_rows[label].get(t["nodeid"], "absent")) for label in san_labels]
        table.add_row(*cells)
    return table


def print_kernel(report: dict[str, Any], path: Path) -> None:
    from c128patch.smoke import device as smoke_device

    out = _stdout()
    if report["mode"] == "collect-only":
        for t in report.get("tests", []):
            out.print(t["nodeid"], markup=False)
        out.print(f"{len(report.get('tests', []))} test(s) in {report['suite']}", markup=False)
    else:
        out.print(kernel_table(report))
    out.print(f"device: {smoke_device.describe(report['device'])}", markup=False)
    prov = report.get("provenance")
    if prov:
        s, u = prov["series"], prov["upstream"]
        out.print(f"series {s.get('name')} {s.get('version')} ({len(prov['entries'])} entries) on upstream "
                  f"{u.get('rev')} {str(u.get('commit', ''))[:12]}", markup=False)
    for note in report.get("notes", []):
        out.print(f"note: {note}", markup=False)
    for label, p in report["passes"].items():
        counts = ", ".join(f"{n} {k}" for k, n in p["counts"].items() if n) or "nothing collected"
        out.print(f"{label}: {counts} ({p['exit']}, {p['seconds']:.0f}s, scale {p['scale']})", markup=False)
        for line in p.get("log_tail", [])[-8:]:
            out.print(f"  | {line}", markup=False)
    if "differential" in report:
        s = report["differential"]["summary"]
        out.print("differential: " + ", ".join(f"{n} {k}" for k, n in s.items()), markup=False)
    san = report.get("sanitizer")
    if san:
        for run in san["runs"]:
            found = "no summary" if run["errors"] is None else f"{run['errors']} error(s)"
            out.print(f"compute-sanitizer {run['tool']}: {found} in {run['processes']} process(es)", markup=False)
            for line in run["reports"][:5]:
                out.print(f"  {line}", markup=False)
    for problem in report["problems"]:
        out.print(f"[red]problem:[/red] {problem}")
    verdict = "[green]OK[/green]" if report["ok"] else "[red]NOT OK[/red]"
    out.print(f"{verdict}  report: {path}")


def run_kernel(opts: smoke_kernel.KernelOptions, command: str, stage_dir: Path | None, as_json: bool) -> None:
    from c128patch.progress import console
    from c128patch.smoke import device as smoke_device
    from c128patch.smoke import kernel as smoke_kernel
    from c128patch.smoke import passes as smoke_pass
    from c128patch.smoke import trees as smoke_trees

    err = console()
    say = (lambda m: None) if as_json else (lambda m: err.print(m, markup=False))
    # Cheap checks of the inputs first, then the machine, then the slow preparation.
    suite = smoke_kernel.validate(opts)
    opts.suite = suite
    device: dict[str, Any] = {}
    if stage_dir is None and not opts.collect_only:
        device = smoke_device.probe_device(opts.python)
        problem = smoke_device.prerequisite_problem(device, opts.sanitizers)
        if problem:
            raise C128Error(problem)
    prep = smoke_kernel.prepare(opts, say)
    try:
        if stage_dir is not None:
            trees = {"patched": prep.patched, **({"upstream": prep.upstream} if prep.upstream else {})}
            staged = smoke_trees.stage(suite, trees, stage_dir)
            if as_json:
                emit_json({"ok": True, "staged": {k: {**v, "path": str(stage_dir / k)} for k, v in staged.items()}})
                return
            for label, info in staged.items():
                say(f"{label}: {info['files']} files, {info['bytes'] / 1e6:.2f} MB -> {stage_dir / label}")
            up = ["--upstream-tree", str(stage_dir / "upstream"), "--differential"] if "upstream" in staged else []
            say("on the GPU machine: " + shlex.join(["python", "-m", "c128patch", "smoke", "--tier", "kernel", "--tree",
                                                     str(stage_dir / "patched"), *up]))
            return
        sanitizer_exe = device.get("compute_sanitizer")
        out = _out_dir(opts.out, "kernel")
        opts.out = out
        passes: dict[str, dict] = {}
        report: dict[str, Any] = {}
        path = out / "smoke-kernel.json"
        for spec in smoke_kernel.plan_passes(opts, prep, sanitizer_exe):
            what = f" under compute-sanitizer {spec.sanitizer}" if spec.sanitizer else ""
            if not opts.collect_only:
                say(f"running the GPU suite on {spec.label} ({spec.tree}){what}, scale {spec.scale}")
            result = smoke_pass.run_pass(spec, suite, opts.python, out)
            result["tests_brief"] = [{"nodeid": t["nodeid"], "outcome": t["outcome"]} for t in result["tests"]]
            passes[spec.label] = result
            report = smoke_kernel.build_report(command, opts, prep, device, passes)
            path = smoke_kernel.write_report(report, out)
        if opts.collect_only and not report.get("tests"):
            probe = smoke_device.probe_python(opts.python)
            why = (f": torch does not import in {opts.python} ({probe['torch_error']}) and the suite's files skip "
                   "without it" if "torch_error" in probe else "")
            raise C128Error(f"--list collected no test of {suite} on {prep.patched}{why}")
    finally:
        prep.cleanup()
    if as_json:
        emit_json(report)
    else:
        print_kernel(report, path)
    if not report["ok"]:
        sys.exit(exitcodes.FAILED)


# --------------------------------------------------------------------------- upstream's own tests


def print_upstream(report: dict[str, Any], path: Path) -> None:
    from rich.table import Table

    from c128patch.smoke import device as smoke_device
    from c128patch.smoke import upstream_suite as smoke_upstream

    out = _stdout()
    table = Table(title=f"upstream's own tests: {report['tree']} vs {report['upstream_tree']}")
    for col in ("test", "patched", "unpatched", "verdict", "why"):
        table.add_column(col, overflow="fold")
    for r in report["tests"]:
        why = r.get("reason") or ("" if r["verdict"] == "same" else r.get("patched_message") or r.get("upstream_message", ""))
        table.add_row(r["id"], _styled(r["patched"]), _styled(r["upstream"]), _styled(r["verdict"] or ""), why[:160])
    out.print(table)
    s = report["selection"]
    out.print(f"selected {len(s['selected'])} of {s['scanned']} test files under {s['scope']}", markup=False)
    for label, t in report["trees"].items():
        used = [f"{r['module']}: {', '.join(r['used'] + [f'{n} (in functions)' for n in r.get('used_in_functions', [])])}"
                for r in t["standins"] if r["used"] or r.get("used_in_functions")]
        out.print(f"{label}: stand-ins (c128patch) {'; '.join(used) or 'none'}; real packages "
                  f"{', '.join(t['real_packages'])}", markup=False)
    out.print(f"device: {smoke_device.describe(report['device'])}", markup=False)
    out.print("verdicts: " + ", ".join(f"{n} {k}" for k, n in report["counts"].items() if n), markup=False)
    for note in report["notes"]:
        out.print(f"note: {note}", markup=False)
    for problem in report["problems"]:
        out.print(f"[red]problem:[/red] {problem}")
    verdict = "[green]OK[/green]" if report["ok"] else "[red]NOT OK[/red]"
    out.print(f"{verdict}  report: {path} (result: {path.parent / smoke_upstream.RESULT})")


def run_upstream(opts: smoke_kernel.KernelOptions, tests: Path | None, command: str, stage_dir: Path | None,
                 as_json: bool, parallel_trees: bool = False) -> None:
    from c128patch.progress import console
    from c128patch.smoke import device as smoke_device
    from c128patch.smoke import kernel as smoke_kernel
    from c128patch.smoke import passes as smoke_pass
    from c128patch.smoke import trees as smoke_trees
    from c128patch.smoke import upstream_select as smoke_upstream_select
    from c128patch.smoke import upstream_suite as smoke_upstream

    err = console()
    say = (lambda m: None) if as_json else (lambda m: err.print(m, markup=False))
    opts.differential = True  # always side by side
    opts.suite = smoke_kernel.validate(opts)
    if opts.tree is None and tests is None:
        raise C128Error("--upstream-suite with --wheel: pass --upstream-suite PATH (the test/ folder of an sglang checkout)")
    root = smoke_upstream_select.test_root(tests, smoke_trees.resolve_tree(opts.tree) if opts.tree else Path.cwd())
    device: dict[str, Any] = {}
    if stage_dir is None and not opts.collect_only:
        device = smoke_device.probe_device(opts.python)
        problem = smoke_device.prerequisite_problem(device, ())
        if problem:
            raise C128Error(problem)
    prep = smoke_kernel.prepare(dataclasses.replace(opts, collect_only=False), say)  # both trees, even for --list
    try:
        plan = smoke_upstream.make_plan(prep, root, opts.keyword)
        say(f"{len(plan.selection.files)} of {plan.selection.scanned} upstream test files selected under {plan.root}")
        if stage_dir is not None:
            staged = smoke_upstream.stage_all(plan, prep, stage_dir)
            if as_json:
                emit_json({"ok": True, "staged": {k: {**v, "path": str(stage_dir / k)} for k, v in staged.items()},
                           "selection": plan.selection.to_json()})
                return
            for label, info in staged.items():
                say(f"{label}: {info['files']} files, {info['bytes'] / 1e6:.2f} MB -> {stage_dir / label}")
            say("on the GPU machine: " + shlex.join(["python", "-m", "c128patch", "smoke", "--tier", "kernel", "--tree",
                                                     str(stage_dir / "patched"), "--upstream-tree",
                                                     str(stage_dir / "upstream"), "--upstream-suite",
                                                     str(stage_dir / smoke_upstream.STAGED_TESTS)]))
            return
        out = _out_dir(opts.out, "upstream-suite")
        passes: dict[str, dict] = {}
        report: dict[str, Any] = {}
        path = out / smoke_upstream.REPORT
        specs = [smoke_upstream.pass_spec(plan, label, opts.timeout, opts.keyword, opts.collect_only)
                 for label in ("patched", "upstream")]
        verb = "collecting" if opts.collect_only else "running"
        for group in ([specs] if parallel_trees else [[spec] for spec in specs]):
            say(f"{verb} upstream's tests on " + " and, at the same time, ".join(f"{s.label} ({s.tree})" for s in group))
            passes.update(smoke_pass.run_passes(group, plan.root, opts.python, out))
            report = smoke_upstream.build_report(command, plan, prep, device, passes, opts.collect_only, opts.keyword)
            path = smoke_upstream.write(report, out)
    finally:
        prep.cleanup()
    if as_json:
        emit_json(report)
    else:
        print_upstream(report, path)
    if not report["ok"]:
        sys.exit(exitcodes.FAILED)


# --------------------------------------------------------------------------- server tier


def print_server(report: dict[str, Any], path: Path) -> None:
    from rich.table import Table

    out = _stdout()
    table = Table(title=f"server smoke: {report['model_path']} TP{report['tp']}"
                        f"{' compact' if report['compact'] else ''}, {report['load_tool']} load")
    for col in ("mode", "healthy", "capacity (tokens)", "from", "out tok/s", "accept len", "max usage",
                "load", "crashed", "problems"):
        table.add_column(col)
    for mode, m in report["modes"].items():
        cap = m["log_summary"]["capacity"]
        dec = m["log_summary"]["decode"]
        load = m.get("load") or {}
        summ = load.get("summary") or {}
        tput = summ.get("output_throughput") or dec["gen_throughput_mean"]
        table.add_row(
            mode, _styled("passed" if m.get("health", {}).get("ok") else "failed"),
            f"{cap['tokens']:,}" if cap["tokens"] is not None else "-", cap["source"] or "-",
            f"{tput:.1f}" if tput else "-", f"{dec['accept_len_mean']}" if dec["accept_len_mean"] else "-",
            f"{dec['token_usage_max']}" if dec["token_usage_max"] is not None else "-",
            (load.get("stopped") or load.get("exit", "-")) if load else "-",
            _styled("crashed") if m["crashed"] else "no", str(len(m["problems"])))
    out.print(table)
    comp = report.get("comparison")
    if comp:
        gain = comp["capacity_gain_tokens"]
        if gain is not None:
            out.print(f"capacity: {comp['capacity_tokens']['off']:,} off -> {comp['capacity_tokens']['on']:,} on "
                      f"({gain:+,} tokens, {comp['capacity_gain_pct']:+.2f}%)", markup=False)
        if comp["throughput_ratio"] is not None:
            out.print(f"output throughput on/off: {comp['throughput_ratio']:.3f}", markup=False)
    for problem in report["problems"]:
        out.print(f"[red]problem:[/red] {problem}")
    verdict = "[green]OK[/green]" if report["ok"] else "[red]NOT OK[/red]"
    out.print(f"{verdict}  report: {path}")


def run_server(opts: smoke_server.ServerOptions, command: str, as_json: bool) -> None:
    from c128patch.progress import console
    from c128patch.smoke import server as smoke_server

    err = console()
    say = (lambda m: None) if as_json else (lambda m: err.print(m, markup=False))
    report = smoke_server.run_server_tier(opts, command, say)
    path = opts.out / "smoke-server.json"
    if as_json:
        emit_json(report)
    else:
        print_server(report, path)
    if not report["ok"]:
        sys.exit(exitcodes.FAILED)


# --------------------------------------------------------------------------- command


@contextlib.contextmanager
def _stops_on_signals() -> Iterator[None]:
    """SIGTERM/SIGHUP unwind like Ctrl-C (children stopped on the way out), then exit 128+N."""
    from c128patch.progress import console
    from c128patch.smoke.procs import Interrupted, signals_raise

    try:
        with signals_raise():
            yield
    except Interrupted as exc:
        console().print(f"c128patch: {exc}; stopped what smoke started", markup=False)
        sys.exit(exitcodes.SIGNAL + exc.signum)


def _kv(values: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--env")
        out[key] = value
    return out


def _default_tree() -> Path | None:
    """The tree `status` finds (the one `apply` made when run from here), when it holds sglang
    sources; None leaves the choice to --tree/--wheel."""
    try:
        found = locate_tree(None)
    except C128Error:
        return None
    return found if (found / "python" / "sglang").is_dir() else None


@click.command("smoke", cls=_RecordingCommand)
@click.option("--tier", type=click.Choice(["kernel", "server"]), required=True,
              help="kernel: the GPU suite on one GPU; server: a real server on a model under load.")
@click.option("--tree", type=click.Path(file_okay=False, path_type=Path),
              help="[kernel] Patched sources: a checkout (uses python/) or a folder holding sglang/ "
                   "(default, without --wheel: the tree `status` finds).")
@click.option("--wheel", type=click.Path(dir_okay=False, path_type=Path), help="[kernel] A patched sglang wheel.")
@click.option("--upstream-tree", type=click.Path(file_okay=False, path_type=Path),
              help="[kernel] Unpatched sources (for the suite's upstream checks and --differential).")
@click.option("--sanitizer", "sanitizers", type=click.Choice(list(SANITIZER_TOOLS)), multiple=True,
              help="[kernel] Also run the suite under compute-sanitizer with this tool (repeatable).")
@click.option("--sanitizer-only", is_flag=True,
              help="[kernel] Only the --sanitizer passes (the plain pass ran in an earlier call).")
@click.option("--differential", is_flag=True,
              help="[kernel] Also run the suite on the unpatched upstream sources and compare.")
@click.option("--scale", type=float, default=1.0, show_default=True, help="[kernel] C128PATCH_GPU_SCALE.")
@click.option("--sanitizer-scale", type=float, default=0.05, show_default=True,
              help="[kernel] C128PATCH_GPU_SCALE under compute-sanitizer.")
@click.option("--list", "--collect-only", "collect_only", is_flag=True, help="[kernel] List the suite's tests.")
@click.option("-k", "keyword", help="[kernel] Only tests matching this pytest -k expression.")
@click.option("--suite", type=click.Path(file_okay=False, path_type=Path),
              help="[kernel] The GPU suite (default: the one this tool carries).")
@click.option("--timeout", type=float, default=1800.0, show_default=True, help="[kernel] Seconds per pytest pass.")
@click.option("--stage", "stage_dir", type=click.Path(file_okay=False, path_type=Path),
              help="[kernel] Copy what the suite reads from the trees into DIR (to carry to a GPU machine) and stop.")
@click.option("--upstream-suite", "upstream_suite", is_flag=False, flag_value="", default=None, metavar="[PATH]",
              help="[kernel] Upstream's own kernel tests instead of ours, patched vs unpatched: PATH is the test/ "
                   "folder of an sglang checkout, or the checkout (default: the tree's own repository).")
@click.option("--parallel-trees", is_flag=True,
              help="[kernel --upstream-suite] Run the patched and the unpatched pass at the same time (two pytest "
                   "processes, sharing the GPU; each builds its own JIT modules).")
@click.option("--model-path", help="[server] The model (DeepSeek-V4 with a DSPARK draft).")
@click.option("--tp", type=int, default=1, show_default=True, help="[server] Tensor parallel size.")
@click.option("--port", type=int, default=30001, show_default=True, help="[server] Port on 127.0.0.1.")
@click.option("--duration", type=float, default=900.0, show_default=True, help="[server] Load seconds per mode.")
@click.option("--max-requests", type=int, help="[server] At most this many requests per mode (default: the soak's 64 x 30).")
@click.option("--compact", is_flag=True, help="[server] SGLANG_RAGGED_VERIFY_MODE=compact (PR bug 1).")
@click.option("--load", type=click.Choice(list(LOAD_TOOLS)), default="serving", show_default=True,
              help="[server] serving: python -m sglang.bench_serving (multi-turn shared prefix); "
                   "multiturn: benchmark/hicache/bench_multiturn.py (--multiturn-script).")
@click.option("--multiturn-script", type=click.Path(dir_okay=False, path_type=Path),
              help="[server] Path of benchmark/hicache/bench_multiturn.py in an sglang checkout.")
@click.option("--preset", type=click.Choice(list(PRESETS)), default="soak", show_default=True,
              help="[server] The PR's soak-test or precision-test server flags.")
@click.option("--mem-fraction-static", type=float, help="[server] Override the preset's value.")
@click.option("--moe-runner-backend", default="flashinfer_mxfp4", show_default=True,
              help="[server] '' to leave it to sglang.")
@click.option("--server-arg", "server_args", multiple=True, help="[server] Extra server flag (repeatable).")
@click.option("--env", "envs", multiple=True, help="[server] KEY=VALUE for the server, both modes (repeatable).")
@click.option("--modes", default="on,off", show_default=True, help="[server] Which of on,off to run, in order.")
@click.option("--health-timeout", type=float, default=1800.0, show_default=True, help="[server] Seconds to wait for /health.")
@click.option("--launcher", help="[server] Server command (default: PYTHON -m sglang.launch_server).")
@click.option("--load-cmd", help="[server] Load tool command replacing the default prefix.")
@click.option("--allow-unpatched", is_flag=True, help="[server] Run on an sglang without a c128patch provenance record.")
@click.option("--python", default=sys.executable, show_default="the Python running c128patch", help="The Python that runs the suite / server.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), help="Folder for the report and logs.")
@json_option
@click.pass_context
@handles_errors
def command(ctx: click.Context, tier: str, tree: Path | None, wheel: Path | None, upstream_tree: Path | None,
            sanitizers: tuple[str, ...], sanitizer_only: bool, differential: bool, scale: float, sanitizer_scale: float,
            collect_only: bool, keyword: str | None, suite: Path | None, timeout: float, stage_dir: Path | None,
            upstream_suite: str | None, parallel_trees: bool, model_path: str | None, tp: int, port: int, duration: float, max_requests: int | None, compact: bool,
            load: str, multiturn_script: Path | None, preset: str, mem_fraction_static: float | None,
            moe_runner_backend: str, server_args: tuple[str, ...], envs: tuple[str, ...], modes: str,
            health_timeout: float, launcher: str | None, load_cmd: str | None, allow_unpatched: bool,
            python: str, out: Path | None, as_json: bool) -> None:
    """GPU smoke tests of a patched build.

    \b
    kernel: the project's GPU suite (tests/gpu) on the patched sources, on any machine with one
            CUDA GPU, nvcc, torch and tvm_ffi; optionally under compute-sanitizer and against
            the unpatched upstream sources (--differential).
    server: python -m sglang.launch_server with PR #32035's flags on a model, sustained
            multi-turn load with sglang's benchmark tools, crash watch, capacity from the log;
            then the same with the online-C128 envs off.
    """
    from c128patch.smoke import kernel as smoke_kernel
    from c128patch.smoke import server as smoke_server

    command_line = "c128patch smoke " + shlex.join(ctx.meta.get("c128patch.args", []))
    for option, folder in (("--out", out), ("--stage", stage_dir)):
        if folder is not None:
            check_output_dir(folder, option)
    if tier == "kernel":
        if model_path:
            raise C128Error("--model-path belongs to --tier server")
        if scale <= 0 or sanitizer_scale <= 0:
            raise C128Error("--scale and --sanitizer-scale must be positive")
        if sanitizer_only and not sanitizers:
            raise C128Error(f"--sanitizer-only needs --sanitizer {'|'.join(SANITIZER_TOOLS)}")
        if tree is None and wheel is None:
            tree = _default_tree()
        opts = smoke_kernel.KernelOptions(
            tree=tree, wheel=wheel, upstream_tree=upstream_tree, sanitizers=tuple(dict.fromkeys(sanitizers)),
            differential=differential and not sanitizer_only, scale=scale, sanitizer_scale=sanitizer_scale,
            sanitizer_only=sanitizer_only, collect_only=collect_only,
            suite=suite, timeout=timeout, keyword=keyword, python=python, out=out)
        with _stops_on_signals():
            if upstream_suite is not None:
                if sanitizers:
                    raise C128Error("--upstream-suite runs upstream's tests without compute-sanitizer; drop --sanitizer")
                run_upstream(opts, Path(upstream_suite) if upstream_suite else None, command_line, stage_dir, as_json,
                             parallel_trees)
            else:
                if parallel_trees:
                    raise C128Error("--parallel-trees belongs to --upstream-suite")
                run_kernel(opts, command_line, stage_dir, as_json)
        return
    if (tree or wheel or upstream_tree or sanitizers or sanitizer_only or differential or collect_only or stage_dir
            or upstream_suite is not None or parallel_trees):
        raise C128Error("--tree/--wheel/--upstream-tree/--sanitizer/--differential/--list/--stage/--upstream-suite/"
                        "--parallel-trees belong to --tier kernel")
    if not model_path:
        raise C128Error("--tier server needs --model-path")
    sopts = smoke_server.ServerOptions(
        model_path=model_path, tp=tp, port=port, duration=duration, max_requests=max_requests, compact=compact,
        load=load, multiturn_script=multiturn_script, preset=preset, mem_fraction_static=mem_fraction_static,
        moe_runner_backend=moe_runner_backend or None, server_args=server_args, env=_kv(envs),
        modes=tuple(m.strip() for m in modes.split(",") if m.strip()), health_timeout=health_timeout,
        launcher=shlex.split(launcher) if launcher else None, load_cmd=shlex.split(load_cmd) if load_cmd else None,
        python=python, out=_out_dir(out, "server"), allow_unpatched=allow_unpatched)
    try:
        with _stops_on_signals():
            run_server(sopts, command_line, as_json)
    except BaseException:
        if out is None and not (sopts.out / "smoke-server.json").exists():
            shutil.rmtree(sopts.out, ignore_errors=True)  # refused before any report: no temp folder left
        raise
