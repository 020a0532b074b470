"""Running the GPU suite under NVIDIA compute-sanitizer and reading what it found.

compute-sanitizer prefixes its own lines with ``=========`` and ends each process it watched
with ``========= ERROR SUMMARY: N error(s)``; racecheck adds ``========= RACECHECK SUMMARY: H
hazard(s) displayed (E error(s), W warning(s))``. With the default ``--target-processes all``
the children the suite spawns (the unpatched kernels run in one) print their own summaries, so
counts are summed over processes.
"""

from __future__ import annotations

import re
from typing import Any

from c128patch.smoke.presets import SANITIZER_TOOLS

TOOLS = SANITIZER_TOOLS
ERROR_EXIT_CODE = 99
# The caching allocator hides out-of-bounds accesses inside its big blocks; off, each tensor is
# its own cudaMalloc and memcheck sees its real bounds.
SANITIZER_ENV = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}

_PREFIX = re.compile(r"^=+ ?")
_ERROR_SUMMARY = re.compile(r"^=+ ERROR SUMMARY: (\d+) errors?\b")
_RACE_SUMMARY = re.compile(
    r"^=+ RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)"
)
# First line of each report block: "Invalid __global__ read of size 4 bytes", "Error: Race
# reported between ...", "Program hit cudaErrorIllegalAddress ...".
_REPORT = re.compile(r"^=+ (Invalid |Error: |Program hit |Warning: |Uninitialized |Barrier error|Malloc/Free error)")


def command(tool: str, sanitizer: str) -> list[str]:
    """The prefix that runs a command under ``tool`` (errors make it exit 99)."""
    if tool not in TOOLS:
        raise ValueError(f"unknown sanitizer tool {tool!r}")
    return [sanitizer, "--tool", tool, "--error-exitcode", str(ERROR_EXIT_CODE)]


def parse(text: str, tool: str) -> dict[str, Any]:
    """``errors``: the total found (None when no summary was printed: the run did not finish),
    plus per-process summaries and the first line of each report (at most 50)."""
    summaries: list[int] = []
    races: list[dict[str, int]] = []
    reports: list[str] = []
    for line in text.splitlines():
        line = line.rstrip()
        m = _ERROR_SUMMARY.match(line)
        if m:
            summaries.append(int(m.group(1)))
            continue
        m = _RACE_SUMMARY.match(line)
        if m:
            races.append({"hazards": int(m.group(1)), "errors": int(m.group(2)), "warnings": int(m.group(3))})
            continue
        if _REPORT.match(line) and len(reports) < 50:
            reports.append(_PREFIX.sub("", line))
    if tool == "racecheck" and races:
        # racecheck's hazards are in its own summary; an ERROR SUMMARY, where printed too,
        # counts the same hazards again, so take the larger per-process view, not the sum.
        errors: int | None = max(sum(r["errors"] for r in races), sum(summaries))
    else:
        errors = sum(summaries) if summaries else None
    return {
        "tool": tool,
        "errors": errors,
        "processes": len(summaries) or len(races),
        "error_summaries": summaries,
        "racecheck_summaries": races,
        "warnings": sum(r["warnings"] for r in races),
        "reports": reports,
    }
