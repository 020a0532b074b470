"""The smoke reports as a person reads them: a rich table per tier, then the notes and problems."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from c128patch.progress import console
from c128patch.smoke.device import describe
from c128patch.smoke.passes import BAD
from c128patch.textsafe import count, one_line, some, text

STYLE = {"passed": "green", "failed": "red", "error": "red", "crashed": "bold red", "skipped": "yellow",
         "xfailed": "yellow", "xpassed": "red", "not run": "dim", "absent": "dim",
         "fixed": "green", "regressed": "bold red", "same": "", "differs": "yellow",
         "both fail": "yellow", "both skipped": "dim", "not applicable": "dim"}


def _styled(text: str) -> str:
    style = STYLE.get(text, "")
    return f"[{style}]{text}[/{style}]" if style else text


def _table(title: "str | Text", columns: tuple[str, ...], rows: "list[list[str | Text]]") -> Table:
    table = Table(title=title)
    for col in columns:
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(*row)
    return table


def _end(report: dict[str, Any], where: str, plain: list[str], table: Table | None = None) -> None:
    """The table, plain lines, problems and verdict on the report console (a pipe gets whole rows, not folded ones)."""
    out = console(stderr=False)
    if table is not None:
        out.print(table)
    for line in plain:  # a test's id, its log's tail, a sanitizer's report, a tree's provenance: the target's text
        out.print(one_line(line), markup=False)
    for problem in report["problems"]:
        out.print("[red]problem:[/red]", text(problem))
    verdict = "[green]OK[/green]" if report["ok"] else "[red]NOT OK[/red]"
    out.print(verdict, end="")
    out.print(f"  report: {where}", markup=False)  # (a folder's name: [/x] is no markup)


def print_failing(tests: list[tuple[str, str]]) -> None:
    """The headline of a run with failures (``tests``: id, patched outcome): a tree's verdict is its failures."""
    failing = [nodeid for nodeid, outcome in tests if outcome in BAD]
    if failing:
        console(stderr=False).print(one_line(f"FAILING: {len(failing)} of {len(tests)} test(s) fail on the patched "
                                             f"tree: {some(failing, 5)}"), markup=False, style="bold red")


def _kernel_lines(report: dict[str, Any]) -> list[str]:
    lines = [f"device: {describe(report['device'])}"]
    prov = report.get("provenance")
    if prov:
        s, u = prov["series"], prov["upstream"]
        lines.append(f"series {s.get('name')} {s.get('version')} ({count(len(prov['entries']), 'entry')}) on upstream "
                     f"{u.get('rev')} {str(u.get('commit', ''))[:12]}")
    lines += [f"note: {note}" for note in report.get("notes", [])]
    for label, p in report["passes"].items():
        counts = ", ".join(f"{n} {k}" for k, n in p["counts"].items() if n) or "nothing collected"
        lines.append(f"{label}: {counts} ({p['exit']}, {p['seconds']:.0f}s, scale {p['scale']})")
        lines += [f"  | {line}" for line in p.get("log_tail", [])[-8:]]
    if "differential" in report:  # the counts after the patched tree's failures; one failing on both trees
        tests = report.get("tests", [])  # counts as "same", and is said to (the unpatched side is no reference)
        failing = [t for t in tests if t["outcome"] in BAD]
        both = sum(1 for t in failing if t.get("verdict") == "same")
        head = f"{len(failing)} of {len(tests)} fail on the patched tree ({both} on both: same); " if failing else ""
        lines.append("differential: " + head
                     + ", ".join(f"{n} {k}" for k, n in report["differential"]["summary"].items()))
    for run in (report.get("sanitizer") or {}).get("runs", []):
        found = "no summary" if run["errors"] is None else f"{run['errors']} error(s)"
        lines.append(f"compute-sanitizer {run['tool']}: {found} in {run['processes']} process(es)")
        lines += [f"  {line}" for line in run["reports"][:5]]
    return lines


def print_kernel(report: dict[str, Any], path: Path) -> None:
    tests = report.get("tests", [])
    if report["mode"] == "collect-only":
        listed = [t["nodeid"] for t in tests] + [f"{len(tests)} test(s) in {report['suite']}"]
        _end(report, str(path), listed + _kernel_lines(report))
    else:
        print_failing([(t["nodeid"], t["outcome"]) for t in tests])
        passes = report["passes"]
        san_labels = [k for k in passes if k.startswith("patched-")]
        diff = "differential" in report
        columns = ("test", "patched", "s", *(("upstream", "s", "verdict") if diff else ()),
                   *(label.removeprefix("patched-") for label in san_labels))
        table = Table(title=text(f"GPU suite: {report['tree']}"))
        for col in columns:  # the times right-aligned, the test ids folded
            table.add_column(col, justify="right" if col == "s" else "left",
                             overflow="fold" if col == "test" else "ellipsis")
        san_rows = {label: {t["nodeid"]: t["outcome"] for t in passes[label].get("tests_brief", [])}
                    for label in san_labels}
        for t in report.get("tests", []):
            cells = [text(t["nodeid"]), _styled(t["outcome"]), f"{t['seconds']:.1f}"]
            if diff:
                cells += [_styled(t.get("upstream", "absent")), f"{t.get('upstream_seconds', 0.0):.1f}",
                          _styled(t.get("verdict", ""))]
            cells += [_styled(san_rows[label].get(t["nodeid"], "absent")) for label in san_labels]
            table.add_row(*cells)
        _end(report, str(path), _kernel_lines(report), table)


def print_upstream(report: dict[str, Any], path: Path, result: str) -> None:
    print_failing([(r["id"], r["patched"]) for r in report["tests"]])
    # a test's id and its exception text are the target's: literal, no control (``[link=...]`` was a live link)
    rows = [[text(r["id"]), _styled(r["patched"]), _styled(r["upstream"]), _styled(r["verdict"] or ""),
             text((r.get("reason") or ("" if r["verdict"] == "same" else r.get("patched_message")
                                       or r.get("upstream_message", "")))[:160])] for r in report["tests"]]
    table = _table(text(f"upstream's own tests: {report['tree']} vs {report['upstream_tree']}"),
                   ("test", "patched", "unpatched", "verdict", "why"), rows)
    s = report["selection"]
    lines = [f"selected {len(s['selected'])} of {s['scanned']} test files under {s['scope']}"]
    for label, t in report["trees"].items():
        used = [f"{r['module']}: "
                f"{', '.join(r['used'] + [f'{n} (in functions)' for n in r.get('used_in_functions', [])])}"
                for r in t["standins"] if r["used"] or r.get("used_in_functions")]
        lines.append(f"{label}: stand-ins (c128patch) {'; '.join(used) or 'none'}; real packages "
                     f"{', '.join(t['real_packages'])}")
    lines.append(f"device: {describe(report['device'])}")
    lines.append("verdicts: " + ", ".join(f"{n} {k}" for k, n in report["counts"].items() if n))
    lines += [f"note: {note}" for note in report["notes"]]
    _end(report, f"{path} (result: {path.parent / result})", lines, table)


def _server_row(mode: str, m: dict[str, Any]) -> list[str]:
    cap, dec = m["log_summary"]["capacity"], m["log_summary"]["decode"]
    load = m.get("load") or {}
    tput = (load.get("summary") or {}).get("output_throughput") or dec["gen_throughput_mean"]
    return [mode, _styled("passed" if m.get("health", {}).get("ok") else "failed"),
            f"{cap['tokens']:,}" if cap["tokens"] is not None else "-", cap["source"] or "-",
            f"{tput:.1f}" if tput else "-", f"{dec['accept_len_mean']}" if dec["accept_len_mean"] else "-",
            f"{dec['token_usage_max']}" if dec["token_usage_max"] is not None else "-",
            (load.get("stopped") or load.get("exit", "-")) if load else "-",
            _styled("crashed") if m["crashed"] else "no", str(len(m["problems"]))]


def print_server(report: dict[str, Any], path: Path) -> None:
    table = _table(f"server smoke: {report['model_path']} TP{report['tp']}"
                   f"{' compact' if report['compact'] else ''}, {report['load_tool']} load",
                   ("mode", "healthy", "capacity (tokens)", "from", "out tok/s", "accept len", "max usage", "load",
                    "crashed", "problems"), [_server_row(mode, m) for mode, m in report["modes"].items()])
    comp, lines = report.get("comparison"), []
    if comp and comp["capacity_gain_tokens"] is not None:
        lines.append(f"capacity: {comp['capacity_tokens']['off']:,} off -> {comp['capacity_tokens']['on']:,} on "
                     f"({comp['capacity_gain_tokens']:+,} tokens, {comp['capacity_gain_pct']:+.2f}%)")
    if comp and comp["throughput_ratio"] is not None:
        lines.append(f"output throughput on/off: {comp['throughput_ratio']:.3f}")
    _end(report, str(path), lines, table)
