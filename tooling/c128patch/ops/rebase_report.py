"""What a rebase reports: the JSON report (every stop and the end write it), its Markdown, and the
classification of each replayed entry against its old commit."""

from __future__ import annotations

import re
from dataclasses import asdict
from pathlib import Path

from unidiff import PatchSet

from c128patch.git import Git
from c128patch.jsonio import write_atomic, write_json_atomic
from c128patch.ops.conflicts import block_markdown
from c128patch.ops.equivalence import Equivalence
from c128patch.ops.merged import commit_diffs
from c128patch.ops.rebase_journal import Journal, Step
from c128patch.textsafe import decoded, md


def report_of(git: Git, journal: Journal, new_head: str | None = None, proof: Equivalence | None = None,
           range_diff: list[str] | None = None) -> dict:
    """The report of ``journal`` (at a stop: without ``new_head``, ``proof`` and the range-diff)."""
    added = git.lines("log", "--format=%h %s", f"{journal.old_commit}..{journal.onto_commit}")
    removed = git.lines("log", "--format=%h %s", f"{journal.onto_commit}..{journal.old_commit}")
    out = {
        "ok": new_head is not None and (proof is None or proof.ok),
        "old_base": {"rev": journal.old_rev, "commit": journal.old_commit},
        "new_base": {"rev": journal.onto_rev, "commit": journal.onto_commit},
        "direction": "forward" if not removed else "backward" if not added else "sideways",
        "upstream_commits_between": len(added),
        "upstream_commits": added[:200],
        "upstream_commits_removed": removed[:200],
        "entries": [asdict(s) for s in journal.steps],
        "paused": journal.paused,
        "recovery_ref": journal.recovery_ref,
        "branch": journal.orig_branch,
        "head": new_head or git.head(),
    }
    if proof is not None:
        out["equivalence"] = proof.to_json()
    if range_diff is not None:
        out["range_diff"] = range_diff
    return out


def range_diff_of(git: Git, journal: Journal, new_head: str) -> list[str]:
    """``git range-diff`` of the old branch and the new one: its commit-pair lines."""
    lines = git.lines("range-diff", "--no-color", f"{journal.old_commit}..{journal.orig_head}",
                      f"{journal.onto_commit}..{new_head}", check=False)  # ("\n" only: a subject's U+2028 kept)
    return [line for line in lines if re.match(r"^\s*(\d+|-):", line)]


def write_reports(state: Path, report: dict) -> dict:
    # a subject's byte that is no UTF-8 (a surrogate): "\udcff" in the file, which no strict reader takes; as --json
    write_json_atomic(state / "rebase-report.json", decoded(report))
    # renamed into place as the JSON is: write_text went through a link there (~/.bashrc overwritten with the report)
    write_atomic(state / "rebase-report.md", render_markdown(report).encode())
    return report


def classify(git: Git, steps: list[Step]) -> None:
    """Each replayed step against its old commit: unchanged (the same diff), context-only (the same added and removed
    lines, whitespace and line numbers aside), content-changed. One git call for all of them."""
    todo = [s for s in steps if s.status == "replayed"]
    full = commit_diffs(git, [sha for s in todo for sha in (s.sha, s.new_sha)], "--full-index")
    drop_index = lambda d: re.sub(r"^index .*$", "", d, flags=re.M)  # noqa: E731
    for s in todo:
        if _changed_lines(full[s.sha]) != _changed_lines(full[s.new_sha]):
            s.status = "content-changed"
        else:
            s.status = "unchanged" if drop_index(full[s.sha]) == drop_index(full[s.new_sha]) else "context-only"


def _changed_lines(diff: str) -> list[tuple[tuple[str, str], tuple[str, ...]]]:
    """Each file of ``diff`` (sorted) with its added and removed lines, whitespace dropped."""
    return sorted(((pf.source_file, pf.target_file),
                   tuple(line.line_type + "".join(line.value.split()) for hunk in pf for line in hunk
                         if line.is_added or line.is_removed)) for pf in PatchSet(diff))


def _resolution(r: dict) -> str:
    return f"{md(r['entry'] + ':' + r['key'])} ({md(r['path'])})"


def render_markdown(report: dict) -> str:
    old, new = report["old_base"], report["new_base"]
    lines = [f"# c128patch rebase: {md(old['rev'])} → {md(new['rev'])} ({report['direction']})", ""]
    added, removed = report["upstream_commits"], report["upstream_commits_removed"]
    lines.append(f"{report['upstream_commits_between']} upstream commit(s) added between `{old['commit'][:12]}` and "
                 f"`{new['commit'][:12]}`" + (f", {len(removed)} left behind (backward)" if removed else "") + ".")
    lines += [""] + [f"- added: {md(c)}" for c in added[:20]] + [f"- left behind: {md(c)}" for c in removed[:20]]
    lines += ["", "| entry | status | file (chosen by) | detail |", "| --- | --- | --- | --- |"]
    for e in report["entries"]:
        detail = md(e["detail"] + (f" (ledger {', '.join(e['ledger'])})" if e["ledger"] else ""))
        if e.get("edit_from"):
            detail += "; **user edit carried**"
        if e["signals"]:
            detail += "; signals: " + "; ".join(f"{s['kind']}: {md(s['detail'])}" for s in e["signals"])
        file = md(f"{e['file']} ({e['chosen_by']})" if e.get("file") else e.get("kind", ""))  # a series' file name
        cells = (md(e["name"]), e["status"], file, detail)  # a carried commit's name is its subject
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    for e in (e for e in report["entries"] if e.get("stop") and e["status"] == "failing"):  # the stop
        stop = e["stop"]
        lines += ["", f"## stopped at {md(e['name'])} ({stop['phase']})", "", f"from {md(stop['file'])}", "",
                  *(block_markdown(b) for b in stop["blocks"])]
        if stop["resolved"]:
            lines.append("- partly resolved by the ledger: " + ", ".join(_resolution(r) for r in stop["resolved"]))
    if proof := report.get("equivalence"):
        lines += ["", "## proof", "", md(proof["summary"])]  # it quotes upstream's hunk headers and subjects
        lines += [f"- ledger resolution {_resolution(r)}, recorded on {md(r['recorded'])}"
                  + (" (reused)" if r["reused"] else "") for e in proof["replay"]["entries"] for r in e["resolutions"]]
        lines += [f"- note: {md(n)}" for n in proof["notes"]]
        for d in proof["differences"]:
            hunks = [f"{h['path']} {h['header']}" + ("\n" + h["text"].rstrip() if h["text"] else "")
                     for h in d["hunks"][:20]]
            lines += ["", f"### {md(d['label'] or 'unattributed')}", "", md("\n".join(hunks), "diff")]
    if report.get("range_diff"):
        lines += ["", "## range-diff", "", md("\n".join(report["range_diff"]), "")]
    return "\n".join(lines) + "\n"
