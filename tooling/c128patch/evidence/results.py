"""The committed evidence: one JSON file per (release, kind) under ``ci/gpu/results/<rev>/<kind>.json``
(``<rev>/before/`` for a "before" record): ``compile`` (ci/compile_kernels.py), ``suite``,
``differential`` and the sanitizers (``smoke kernel``), ``upstream-suite`` (``smoke upstream``),
``simulation`` (what tests/gpu/test_dspark_simulation.py writes), ``kernel-bench``. Each carries
``key`` (evidence.keys), ``command``, ``device``, ``date``, counts and ``ok``, paths relative to the
repository; ci/gpu/collect_results.py writes them from a GPU run, never a hand.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from c128patch.errors import C128Error
from c128patch.evidence.keys import EvidenceKey
from c128patch.jsonio import write_json_atomic
from c128patch.series.manifest import Series
from c128patch.series.paths import confine
from c128patch.smoke.passes import BAD
from c128patch.smoke.trees import read_json
from c128patch.textsafe import one_line, some

Kind = Literal["compile", "suite", "differential", "memcheck", "racecheck", "initcheck", "synccheck",
               "upstream-suite", "simulation", "kernel-bench"]
SANITIZER_KINDS: tuple[Kind, ...] = ("memcheck", "racecheck", "initcheck", "synccheck")
KINDS: tuple[Kind, ...] = ("compile", "suite", "differential", *SANITIZER_KINDS, "upstream-suite", "simulation",
                           "kernel-bench")
BENCH_REFERENCE = "v0.5.23"  # the release every kernel-bench row is compared with
BENCH_TOLERANCE = 0.05
RESULTS_UNDER = Path("ci") / "gpu" / "results"
SCHEMA = 1


def results_root(series: Series) -> Path:
    """Where the series' committed evidence lives (beside patches/)."""
    return series.root / RESULTS_UNDER


def result_path(root: Path, rev: str, kind: str, label: str = "patched") -> Path:
    """``root/<rev>[/<label>]/<kind>.json``: ``rev`` and ``label`` come from a GPU run's bundle (its jobs), so
    confined (a job naming rev ``../../x`` wrote outside the results)."""
    rel = f"{rev}/{kind}.json" if label == "patched" else f"{rev}/{label}/{kind}.json"
    return confine(root, rel, f"a result of rev {rev!r}, label {label!r}")


@dataclass(frozen=True)
class Result:
    """One committed result file, as the matrix reads it."""

    rev: str
    kind: str
    label: str
    key: EvidenceKey | None
    ok: bool
    summary: str
    path: Path
    data: dict[str, Any]


def _failing(data: dict[str, Any], counted: int) -> str:
    """The patched tree's failures, leading a differential's cell (issue 38): a test failing on both trees reads "same"
    where the unpatched side lacks our module. ``counted``: the counts' failures, for a record without its rows."""
    rows = [t for t in data.get("tests") or [] if t.get("patched") in BAD]
    names = [(t.get("nodeid") or t.get("id", "?")).rsplit("/", 1)[-1] for t in rows]
    hidden = sum(t.get("verdict") == "same" for t in rows)
    if not (names or counted):
        return ""
    shown = f" ({some(names, 3)})" if names else ""
    both = f", {hidden} of them on both: same" if hidden else ""
    return f"{len(names) or counted} FAIL on the patched tree{shown}{both}: "


def summarize(kind: str, data: dict[str, Any]) -> str:
    """A few words for a matrix cell."""
    if kind == "compile":
        kernels = data.get("kernels", [])
        built = sum(1 for k in kernels if k.get("ok"))
        return f"{built}/{len(kernels)} + probe {'ok' if data.get('probe_ok') else 'FAILED'}"
    counts = f"{data.get('passed', 0)} pass, {data.get('failed', 0)} fail, {data.get('skipped', 0)} skip"
    if kind in SANITIZER_KINDS:
        errors = (data.get("sanitizer") or {}).get("errors")
        return f"{'no summary' if errors is None else f'{errors} err'}; {counts}"
    if kind == "differential":
        s = data.get("summary") or {}
        return _failing(data, s.get("regressed", 0)) + (f"{s.get('regressed', 0)} regressed, {s.get('fixed', 0)} "
                                                         f"fixed, {s.get('n/a', 0)} n/a, {s.get('same', 0)} same")
    if kind == "simulation":
        ours, up = data.get("ours") or {}, data.get("upstream_mtp_lazy") or {}
        line = f"ours {ours.get('chunk_mismatches', '?')}/{ours.get('chunks_checked', '?')} chunks wrong"
        if up:
            line += f"; upstream's controller {up.get('chunk_mismatches', '?')}/{up.get('chunks_checked', '?')}"
        return line
    if kind == "kernel-bench":
        vs = data.get("vs_reference") or {}
        line = f"{len(data.get('rows', []))} rows"
        if vs.get("is_reference"):
            line += ", the reference run"
        elif vs:
            line += (f", {vs.get('within', 0)}/{vs.get('rows', 0)} within {BENCH_TOLERANCE:.0%} of "
                     f"{vs.get('reference', BENCH_REFERENCE)}")
            ours = (vs.get("by_path") or {}).get("ours")
            if ours:
                line += f" (ours {ours['within']}/{ours['rows']})"
        return line
    if kind == "upstream-suite":
        c = data.get("counts") or {}
        shown = ("regressed", "same", "fixed", "both fail", "not applicable")
        return _failing(data, c.get("regressed", 0) + c.get("both fail", 0)) + ", ".join(
            f"{c.get(k, 0)} {k}" for k in shown if c.get(k) or k in ("regressed", "same"))
    return counts


def load_results(root: Path) -> list[Result]:
    """Every result file under ``root`` (``<rev>/<kind>.json`` and ``<rev>/<label>/<kind>.json``)."""
    out: list[Result] = []
    if not root.is_dir():
        return out
    for rev_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for folder, label in [(rev_dir, "patched"), *((d, d.name) for d in sorted(rev_dir.iterdir()) if d.is_dir())]:
            for path in (p for p in sorted(folder.glob("*.json")) if p.stem in KINDS):
                data = read_json(path) or {}
                try:  # a field of another type (a list of numbers as `kernels`) was a traceback
                    summary = summarize(path.stem, data)
                except (TypeError, AttributeError, KeyError, ValueError) as exc:
                    raise C128Error(f"{path}: not a valid {path.stem}.json result (a field of the wrong type: "
                                    f"{one_line(str(exc))[:120]})") from None
                # `ok` only as JSON's true: "false" or [0] read as verified
                out.append(Result(rev_dir.name, path.stem, label, EvidenceKey.from_json(data.get("key")),
                                  data.get("ok") is True, summary, path, data))
    return out


def write_result(root: Path, rev: str, kind: Kind, data: dict[str, Any], label: str = "patched") -> Path:
    return write_json_atomic(result_path(root, rev, kind, label), data)  # (its folders made)
