"""A pytest plugin (``-p c128patch.smoke.plugin``) that appends one JSON line per event to the
file named by $C128PATCH_SMOKE_ROWS, flushed at once: what was collected, when each test started,
each phase's report, the end. A test that started and never reported is one that took the process
down (an illegal memory access, a timeout kill), and the file still says which one it was.
Stdlib only: it runs inside the GPU suite's Python."""

from __future__ import annotations

import json
import os
import time
from typing import Any

ROWS_ENV = "C128PATCH_SMOKE_ROWS"


def _write(row: dict[str, Any]) -> None:
    path = os.environ.get(ROWS_ENV)
    if not path:
        return
    row["t"] = time.time()
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(row, default=str) + "\n")
        out.flush()


def _message(report: Any) -> str:
    """One short line saying why a phase failed or skipped."""
    longrepr = getattr(report, "longrepr", None)
    if longrepr is None:
        return ""
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # skip: (file, line, reason)
        return str(longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(getattr(longrepr, "reprcrash", None), "message", None)
    if crash:
        return str(crash).strip().splitlines()[0][:500]
    text = str(longrepr).strip().splitlines()
    return text[-1][:500] if text else ""


def pytest_collection_finish(session: Any) -> None:
    for item in session.items:
        _write({"event": "collected", "nodeid": item.nodeid,
                "markers": sorted({m.name for m in item.iter_markers()})})


def pytest_collectreport(report: Any) -> None:
    if report.failed:
        _write({"event": "report", "nodeid": report.nodeid or "<collection>", "when": "collect",
                "outcome": "failed", "duration": 0.0, "message": _message(report)})


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    _write({"event": "start", "nodeid": nodeid})


def pytest_runtest_logreport(report: Any) -> None:
    row = {"event": "report", "nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
           "duration": float(getattr(report, "duration", 0.0) or 0.0)}
    if report.outcome != "passed" or hasattr(report, "wasxfail"):
        row["message"] = _message(report)
    if hasattr(report, "wasxfail"):
        row["xfail"] = str(report.wasxfail)
    _write(row)


def pytest_sessionfinish(session: Any, exitstatus: Any) -> None:
    _write({"event": "finish", "exitstatus": int(exitstatus)})
