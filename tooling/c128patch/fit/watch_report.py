"""What ``watch`` tells a maintainer: the one-line headline, the Markdown report (the body CI posts
as a pull request or an issue), and the commit message of a refreshed series. Reads the report
dict ``fit.watch`` builds; decides nothing."""

from __future__ import annotations

from c128patch.fit.env import describe
from c128patch.fit.sandbox import NOTICE
from c128patch.ops.conflicts import block_markdown
from c128patch.textsafe import cell, count, inert, md, one_line, plain, some

WORK_TREE = "sglang-watch"  # where the printed reproduce commands put their tree (a bare verb finds ./sglang)

WHAT = {
    "clean": "Nothing to do: every entry applies strictly.",
    "refreshed": "Review the refreshed series and adopt it: in CI the pull request carries it; by hand, the commands "
                 "below.",
    "merged": "Upstream holds entries of the series. Check the evidence; if it is right, adopt the proposed series "
              "(the entries stay with `merged_in`, skipped where that commit is an ancestor). If not, nothing changes.",
    "conflict": "A human has to resolve: reproduce the stop with the commands below, resolve once (the resolution is "
                "recorded in the ledger and replays from then on), refresh, commit.",
    "failed": "The series moved but the result is not proven or a check failed: nothing is offered as ready. "
              "Read the problems below.",
    "broken": "The series applies but does not fit this upstream: code of ours uses an upstream definition that is "
              "gone, or whose signature no longer binds or changed since patches/contract.lock, or upstream copied a "
              "file or class we patch without our hooks, or a module fails to import or behave on it (the behavioural "
              "tier, gates off and on). Fix each item below "
              "(our file:line, upstream's file:line, both signatures) in the series, or, for a changed signature "
              "that still fits, record it as accepted with the commands below.",
    "unchecked": "It applies strictly and every check that ran passed, but part of the series could not be checked "
                 "on this machine, or upstream copied what we patch (listed under \"Not checked here\"; a copy that "
                 "keeps our hooks: check the path that selects it runs them): not clean. Run watch where nvcc and "
                 "torch (with sglang's dependencies, `--python`) are installed to have it checked.",
    "timeout": "The run did not finish in time: nothing is offered. Run it again with a larger --timeout.",
}


def where(report: dict) -> str:
    onto = report["onto"]
    return f"{onto['rev']}@{onto['commit'][:12]}" if onto["commit"] else onto["rev"]


def _conflict_line(c: dict) -> str:
    files = sorted({b["path"] for b in c["blocks"]}) or c["unresolved"] or c.get("paths") or [c["file"]]
    text = f"entry {c['entry']} conflicts in {some(files, 2)}"
    upstream = next((u for b in c["blocks"] for u in b["upstream"]), "")
    moved = next((b for b in c["blocks"] if b["moved_to"]), None)
    return text + (f" since upstream commit {upstream}" if upstream else "") + (
        f"; the code its hunk edits now lives at {moved['path']}:{moved['moved_to']}" if moved else "")


def headline(report: dict) -> str:
    s = report["series"]
    series, at = f"series {s['name']} {s['version']}", where(report)
    outcome = report["outcome"]
    entries = report["entries"]
    if outcome == "clean":
        return f"{series} applies strictly on {at} ({count(len(entries), 'entry')}, proven); nothing to do"
    if outcome == "unchecked":
        return (f"{series} applies strictly on {at} ({count(len(entries), 'entry')}, proven) but is not checked here: "
                + "; ".join(report["unchecked"]))
    if outcome == "refreshed":
        how = [f"{e['name']} ({e['on_rev']})" for e in entries
               if e["on_rev"].split(" (")[0] in ("3-way", "ledger", "whitespace-merged") or "(renamed: " in e["on_rev"]]
        new = report["refreshed"]
        parts = new.get("parts") or [f"series {s['name']} {new['version']}"]  # (what changed: ours, a layer or both)
        return (f"{series} still applies on {at}: {len(how)} of {len(entries)} entries needed a 3-way merge or a "
                f"recorded resolution ({some(how, 4)}); the refreshed {' and '.join(parts)} "
                f"appl{'ies' if len(parts) == 1 else 'y'} strictly there")
    if outcome == "merged":
        first = report["merged"][0]
        content = [s for s in first["signals"] if s["kind"] != "pr-hint"]  # evidence, not a hint
        evidence = f"{content[0]['kind']}: {content[0]['detail']}" if content else ""
        return (f"upstream {at} holds {len(report['merged'])} entries of {series} on content evidence "
                f"({some([m['entry'] for m in report['merged']], 4)}; {first['entry']}: {evidence}); "
                "review before dropping")
    if outcome == "conflict":
        first, rest = report["conflicts"][0], report["conflicts"][1:]
        text = _conflict_line(first).replace(" conflicts in ", f" conflicts on {at} in ", 1)
        return text + (f"; {len(rest)} more: {some([c['entry'] for c in rest], 4)}" if rest else "")
    if outcome == "failed":
        return f"{series} on {at}: {report['problems'][0]}"
    if outcome == "broken":
        failing = [*(report.get("contract") or {}).get("failing", []),  # the contract's items, then the tier's
                   *(f"behavioural tier, {f}" for f in (report.get("behaviour") or {}).get("failed", []))]
        return f"{series} applies on {at} but does not fit it: {failing[0]}" + (
            f"; {len(failing) - 1} more" if len(failing) > 1 else "")
    return report["problems"][0] if report["problems"] else f"{series} on {at}: {outcome}"


def render(report: dict) -> str:
    """The Markdown report: the head and what to do, then one section per part of the run that has something."""
    lines = _head(report)
    for section in (_fits, _bisect, _entries, _conflicts, _merged, _proof, _checks, _refreshed, _commits):
        lines += section(report)
    if report["rebase_report"]:
        lines.append(f"The rebase's own report: `{report['rebase_report']}` next to this file.")
    return "\n".join(lines) + "\n"


def _head(report: dict) -> list[str]:
    s, outcome, base = report["series"], report["outcome"], report["base"]
    warn = [f"**warning**: {md(w)}" for w in (report.get("contract") or {}).get("copies", [])]
    lines = [f"# c128patch watch: `{outcome}` on {md(where(report))}", "", f"**{md(report['headline'])}**", "",
             *(warn and [*warn, ""]),
             f"- series: {md(s['name'])} {md(s['version'])}, base {md(base['rev'])} (`{base['commit'][:12]}`)",
             f"- upstream: {md(report['onto']['rev'])} = `{report['onto']['commit']}` "
             f"({report.get('upstream', {}).get('source', '?')}), {report['upstream_commits_between']} upstream "
             f"commit(s) since the base" + (f", {report['direction']}" if report["direction"] else ""),
             f"- outcome: `{outcome}` (exit {report['exit_code']}), {report['seconds']} s", "",
             "## What to do", "", WHAT[outcome], ""]
    if report["next"]:
        lines += [md("\n".join(report["next"]), "sh"), ""]
    if report["problems"]:
        lines += ["## Problems", ""] + [f"- {md(p)}" for p in report["problems"]] + [""]
    return lines


def _fits(report: dict) -> list[str]:
    """The API contract, the behavioural tier and what could not be checked here."""
    lines = []
    contract = report.get("contract")
    if contract:
        probe = md(contract.get("cxx_probe", "not run"))  # a compiler's line: it quotes upstream's headers
        lines += ["## API contract", "", md(contract["verdict"]), "", f"C++: {probe}", ""]  # an error's text: data
        lines += [f"- {md(f)}" for f in contract["failing"]] + ([""] if contract["failing"] else [])
    tier = report.get("behaviour")
    if tier:
        said = [f"watch {NOTICE}.", ""] if tier.get("ran") else []
        env = [md(describe(tier["env"])), ""] if tier.get("env") else []
        lines += ["## Behavioural tier (gates off and on)", "", *said, *env, md(tier["verdict"]), ""]
        lines += [f"- {md(name)}: {md(said)}" for name, said in tier.get("modules", {}).items()]
        lines += [f"- **failed**: {md(f)}" for f in tier["failed"]] + [f"- {md(n)}" for n in tier["not_checked"]]
        lines += [""] if tier["failed"] or tier["not_checked"] else []
    if report.get("unchecked"):
        lines += ["## Not checked here", ""] + [f"- {md(u)}" for u in report["unchecked"]] + [""]  # compiler lines
    return lines


def _bisect(report: dict) -> list[str]:
    found = report.get("bisect")
    if not found:
        return []
    lines = [f"## Bisect (bounded at {found['bound_s']:g} s)", "", md(found["summary"]), ""]
    if found.get("found"):
        lines += [f"- first bad upstream commit: `{found['commit']}` {md(found['subject'])}"]
        lines += [f"- {md(f)}" for f in found["failing"][:10]] + [""]
    return lines


def _entries(report: dict) -> list[str]:
    if not report["entries"]:
        return []
    lines = ["## Entries", "", "| entry | on the new base | file (chosen by) | detail |", "| --- | --- | --- | --- |"]
    for e in report["entries"]:
        chosen = e["chosen_by"].split(":", 1)[0]
        file = f"{e['file']} ({chosen})" if e["file"] and chosen else e["file"]
        detail = e["detail"] + (f" (ledger {', '.join(e['ledger'])})" if e["ledger"] else "")
        how = md(e["on_rev"]) if e.get("renamed") else e["on_rev"]  # a rename names upstream's path: data
        lines.append(f"| {e['name']} | {cell(how)} | {cell(md(file))} | {cell(md(detail))} |")
    lines.append("")
    hinted = [(e["name"], h) for e in report["entries"] if e["name"] not in {c["entry"] for c in report["conflicts"]}
              for h in e.get("hints", [])]
    if hinted:
        lines += ["## Hints", ""] + [f"- {name}: {md(h['line'])}" for name, h in hinted] + [""]
    return lines


def _conflicts(report: dict) -> list[str]:
    lines = []
    for c in report["conflicts"]:
        lines += [f"## Conflict: {c['entry']}", "", md(_conflict_line(c) + "."), "", f"from {md(c['file'])}"
                  + (f" ({md(c['chosen_by'])})" if c["chosen_by"] else ""), ""]  # it names a variant's base: data
        if c["after_skipping"]:
            lines += [f"Reached after skipping {', '.join(c['after_skipping'])}: "
                      "it may conflict only because of that.", ""]
        lines += [block_markdown(b, " (upstream removed or moved this code)") for b in c["blocks"]]
        if c["resolved_by_ledger"]:
            lines.append("- partly resolved by the ledger: " + ", ".join(  # the ledger's and upstream's paths: data
                f"{md(r['entry'] + ':' + r['key'])} ({md(r['path'])})" for r in c["resolved_by_ledger"])
                + f"; still conflicted: {', '.join(map(md, c['unresolved']))}")
        if not c["blocks"]:
            lines.append(f"- {md(c['detail'])}")
        lines += [f"- {md(h['line'])}" for h in c.get("hints", [])]
        t = c.get("taken")  # an overlay's path taken upstream (``ops.conflicts``): who made and imports it, the way on
        if t:
            lines += [f"- upstream created {md(t['target'])}" + (f" in {md(t['created'])}" if t["created"] else "")
                      + (f"; imported upstream by {', '.join(md(i) for i in t['importers'][:5])}"
                         if t["importers"] else ""),
                      f"- way through: **rename our target** (entries {', '.join(t['ours'])} import ours): another "
                      "`target` in series.toml, those entries pointed at it, then "
                      f"`c128patch rebase --continue --tree {WORK_TREE}`"
                      if t["way"] == "rename" else "- way through: **drop ours as superseded** (nothing of ours "
                      f"imports it): `c128patch rebase --drop {c['entry']} --tree {WORK_TREE}`"]  # (the reproduce tree)
        lines.append("")
    return lines


def _merged(report: dict) -> list[str]:
    hint = " (a hint, not evidence)"
    return [line for m in report["merged"] for line in [
        f"## Merged upstream (proposed): {m['entry']}", "",
        *(f"- {sig['kind']}: {md(sig['detail'])}" + (hint if sig["kind"] == "pr-hint" else "") for sig in m["signals"]),
        ""]]


def _proof(report: dict) -> list[str]:
    proof = report["equivalence"]
    if not proof:
        return []
    carried = " (of the entries that carry; the conflicting ones left out)" if report["conflicts"] else ""
    return [f"## Proof{carried}", "", md(proof["summary"]), ""]  # it quotes upstream's hunk headers and subjects


def _checks(report: dict) -> list[str]:
    if not report["checks"]:
        return []
    lines = ["## Checks", "", "| check | result | findings / notes |", "| --- | --- | --- |"]
    for c in report["checks"]:
        result = "not run" if c.get("skipped") else "ok" if c["ok"] else "**FAILED**"
        said = c["findings"][:5] + c["notes"][:3]
        lines.append(f"| {c['name']} | {result} | {cell(md('; '.join(said)))} |")
    return lines + [""]


def _refreshed(report: dict) -> list[str]:
    new, s = report["refreshed"], report["series"]
    if not new:
        return []
    lines = [f"## The {'refreshed' if report['outcome'] != 'merged' else 'proposed'} series", "",
             f"- {md(s['name'])} {md(new['version'])} in {md(report['out'] + '/series/')} ({new['mode']} files for "
             f"{md(new['label'])}; base {md(new['base'])})",  # a tag's name, the series' base: data
             f"- applied fresh on {md(where(report))}: "
             + ("every entry strictly" if new["applies_strictly"] else "**not strictly**")
             + (", the same tree as the proven rebase" if new["same_tree"] else ", **a different tree**")
             + ("; `refresh --check` there changes nothing" if new["fixed_point"] else "; **refresh --check fails**")]
    lines += [f"- changed: {md(p)}" for p in new["changed"]]
    lines += [f"- note: {md(n)}" for n in new["notes"]]
    return lines + [""]


def _commits(report: dict) -> list[str]:
    if not report["upstream_commits"]:
        return []
    lines = ["## Upstream commits since the base", ""] + [f"- {md(c)}" for c in report["upstream_commits"][:20]]
    more = report["upstream_commits_between"] - min(20, len(report["upstream_commits"]))
    return lines + ([f"- ... and {more} more"] if more > 0 else []) + [""]


def commit_message(report: dict) -> str:
    s, new = report["series"], report["refreshed"]
    verb = "refresh" if report["outcome"] == "refreshed" else "propose entries merged upstream in"
    lines = [f"patches: {verb} the series for upstream {where(report)}", "", one_line(report["headline"]) + ".", ""]
    lines += [one_line(f"{e['name']}: {e['on_rev']}") for e in report["entries"] if e["on_rev"] != "strict"]
    lines += ["", f"Series {s['name']} {s['version']} -> {new['version']} ({new['mode']} files for {new['label']}).",
              one_line(f"Proof: {report['equivalence'].get('summary', '')}."), "", "Made by c128patch watch."]
    return inert(plain("\n".join(lines))) + "\n"  # upstream's paths and evidence: no mention, no issue it closes
