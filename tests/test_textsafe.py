"""Everything taken from git is data (issue 36 item 4): hostile upstream subjects, names and refs reach
watch's and rebase's Markdown reports as inert code spans and a terminal without control characters."""

from __future__ import annotations

import html
import json
import re
import subprocess

import pytest
from markdown_it import MarkdownIt

from c128patch.fit import watch_report
from c128patch.git import Git
from c128patch.ops.rebase_report import render_markdown
from c128patch.textsafe import md, one_line, plain, some
from support import REPO_ROOT, invoke, table_column
from test_upstream_changes import CUH, GUARD_NEW, GUARD_OLD, PLAN, commit_on, put

HOSTILE = ["<!-- the rest is hidden", "<img src=x onerror=alert(1)>", "[click me](javascript:alert(1))",
           "cc @maintainers please merge", "fixes #12", "\x1b[31mred\x1b[0m", "\x1b]8;;https://evil.example\x1b\\"
           "a link\x1b]8;;\x1b\\", "ring\x07", "``` break the fence", "`tick` and ``two``", " ` ",
           "fix \u202egnp.exe\u202c and \u2066@team\u2069"]
CONTROLS = "\x1b\x07\x9b\r\u202e\u2066"


@pytest.mark.parametrize("text", HOSTILE)
def test_md_gives_one_code_span_that_renders_as_its_text(text):
    rendered = MarkdownIt("commonmark").enable("table").render(md(text))
    assert rendered == f"<p><code>{html.escape(plain(text), quote=False)}</code></p>\n"


def test_md_of_several_lines_is_a_fence_no_line_closes():
    text = "a\n```\n<img src=x>\n````"
    want = f'<pre><code class="language-diff">{html.escape(text, quote=False)}\n</code></pre>\n'
    assert MarkdownIt().render(md(text, "diff")) == want


def test_md_of_several_lines_inside_a_line_stays_one_inert_span():
    """Helper 100: a target's exception text with blank lines reached watch's report inside a list item and the
    headline as a fence; a fence that starts mid-line is none, so its <img> and links were live."""
    text = "boom\n\n<img src=x onerror=alert(1)> @admin #1 [click](https://evil.example)\n- item"
    for markdown in (f"- **failed**: {md(text)}", f"**{md(text)}**", f"- {md('name')}: {md(text)}"):
        rendered = MarkdownIt("commonmark").render(markdown)
        assert "<img" not in rendered and "<a " not in rendered and rendered.count("<code>") >= 1, rendered
        assert "\n" not in md(text) and "boom ⏎  ⏎ <img" in md(text)


def test_zero_width_characters_are_stripped_and_line_breaks_shown():
    assert plain("c128patch\u200b \u2060x\ufeff") == "c128patch x"
    assert one_line("treecheck: failed\ntreecheck: passed (FORGED)\r\n") == "treecheck: failed ⏎ treecheck: " \
        "passed (FORGED) ⏎ "  # (a CR alone: plain's)


def test_plain_strips_what_a_terminal_acts_on():
    assert plain("\x1b]8;;https://evil\x1b\\x\x1b]8;;\x1b\\ \x1b[2Jbell\x07\x9b31m\r\ttab\nline") == \
        "]8;;https://evil\\x]8;;\\ [2Jbell31m\ttab\nline"


def _inert(markdown: str) -> None:
    rendered = MarkdownIt("commonmark").enable("table").render(markdown)
    assert not any(c in markdown for c in CONTROLS)
    for live in ("<img", "<a ", "<!--", "javascript:alert(1)\">"):
        assert live not in rendered, rendered


def test_watch_reports_upstream_subjects_as_data():
    commits = [f"{i:07x} {text}" for i, text in enumerate(HOSTILE)]
    lines = watch_report._commits({"upstream_commits": commits, "upstream_commits_between": len(commits)})
    _inert("\n".join(lines))
    assert "- `0000004 fixes #12`" in lines


def test_rebase_reports_upstream_subjects_and_refs_as_data():
    report = {"old_base": {"rev": "<img src=x>", "commit": "a" * 40}, "new_base": {"rev": "@team", "commit": "b" * 40},
              "direction": "sideways", "upstream_commits_between": len(HOSTILE), "upstream_commits": HOSTILE,
              "upstream_commits_removed": HOSTILE, "entries": [], "range_diff": HOSTILE}
    text = render_markdown(report)
    _inert(text)
    assert "`@team`" in text and "- added: `fixes #12`" in text


EVIL = "<img src=x onerror=alert(1)> @maintainers #12 [x](javascript:alert(1)) \u202e"


def test_a_path_upstream_renamed_and_a_proof_quoting_upstream_are_data():
    """An entry's file renamed upstream names upstream's path; the proof's summary and notes quote upstream's hunk
    headers (its code) and commit subjects; a series' file name (a pull request's) holds backticks: all inert in both
    reports."""
    entry = {"name": "c128-a", "on_rev": f"3-way (renamed: python/a.py -> python/{EVIL}.py)", "file": f"p/`{EVIL}`",
             "chosen_by": "", "detail": "", "ledger": [], "renamed": {"python/a.py": f"python/{EVIL}.py"}, "hints": []}
    proof = {"summary": f"differs from a fresh apply: unattributed change in python/x.py (first: python/x.py "
                        f"@@ -1 +1 @@ {EVIL})", "notes": [f"user commit 0123456789ab '{EVIL}': does not replay"],
             "replay": {"entries": []}, "differences": []}
    conflict = {"entry": "c128-a", "file": f"p/`{EVIL}`", "chosen_by": "", "blocks": [], "unresolved": [],
                "after_skipping": [], "resolved_by_ledger": [], "detail": "does not apply", "hints": []}
    watch = watch_report._entries({"entries": [entry], "conflicts": []}) + watch_report._proof(
        {"equivalence": proof, "conflicts": []}) + watch_report._conflicts({"conflicts": [conflict]}) + \
        watch_report._fits({"contract": {"verdict": "v", "cxx_probe": f"failed to compile: {EVIL}", "failing": []},
                            "unchecked": [f"C++: failed to compile: {EVIL}"]})  # a compiler quotes upstream
    rebase = render_markdown({"old_base": {"rev": "v1", "commit": "a" * 40}, "new_base": {"rev": "v2", "commit":
                              "b" * 40}, "direction": "forward", "upstream_commits_between": 0, "upstream_commits": [],
                              "upstream_commits_removed": [], "equivalence": proof, "entries": [
                                  {**entry, "status": "failing", "kind": "patch", "signals": [], "stop": {
                                      "phase": "series", "file": f"p/`{EVIL}`", "blocks": [], "resolved": []}}]})
    head = watch_report._head({"series": {"name": "site", "version": "[x](javascript:alert(1))"}, "outcome": "clean",
                               "base": {"rev": "<img/src=x>", "commit": "a" * 40}, "headline": "h", "exit_code": 0,
                               "onto": {"rev": EVIL, "commit": "b" * 40}, "upstream_commits_between": 0,
                               "direction": "", "seconds": 1, "next": [], "problems": []})
    assert "- series: `site` `[x](javascript:alert(1))`, base `<img/src=x>`" in "\n".join(head), head
    assert head[0].startswith("# c128patch watch: `clean` on `<img"), head[0]  # the tag a hostile upstream names
    for text in ("\n".join(watch + head), rebase):
        _inert(text)
        rendered = MarkdownIt("commonmark").enable("table").render(text)
        assert "@maintainers" in rendered and "@maintainers" not in re.sub("<code>.*?</code>", "", rendered), text
    assert "| c128-a | `3-way (renamed: python/a.py -> python/<img" in watch[4], watch


@pytest.mark.parametrize("outcome", ["refreshed", "merged"])
def test_the_commit_message_watch_writes_carries_upstreams_text_inert(outcome):
    """`commit-message.txt` (the CI workflow commits it; the pull request's merge reads it) carried upstream's renamed
    paths and a "merged" outcome's evidence as they were: `fixes #1.py` or `closes #12` closed an issue of the fork
    when the pull request merged, `@someone` pinged, a newline forged a trailer. Each stays one line, none live."""
    evil = ("x; fixes #1.py closes GH-7, https://github.com/o/r/issues/3 @someone\nSigned-off-by: x <x@y>\x1b[2J "
            "see www.evil.example/x")  # (helper 158: a www. host is a URL GitHub links too)
    report = {"outcome": outcome, "series": {"name": "c128patch", "version": "4"},
              "refreshed": {"version": "5", "mode": "primary", "label": "v0.5.23"},
              "onto": {"rev": "v0.5.23", "commit": "b" * 40}, "headline": f"upstream holds it ({evil})",
              "entries": [{"name": "c128-a", "on_rev": f"3-way (renamed: python/a.py -> python/{evil}.py)"}],
              "equivalence": {"summary": f"identical ({evil})"}}
    message = watch_report.commit_message(report)
    assert message.startswith("patches: ") and "v0.5.23@bbbbbbbbbbbb" in message  # ours as it was
    assert not re.search(r"(?<!\w)@\w|#\d|(?i:gh-\d)|://|\x1b|(?i:\bwww\.)", message), message
    assert not any(line.startswith("Signed-off-by") for line in message.splitlines()), message
    assert "\uff03" "1.py" in message and "\uff20someone" in message


def test_a_carried_commits_subject_is_data_in_the_rebase_reports_table_stop_and_resolutions():
    """A commit of the user's (a teammate's, a contributor's cherry-pick) is an entry named by its subject (helper
    107: live HTML, a remote image, a mention in the table and the stop's heading)."""
    resolution = {"entry": EVIL, "key": "k", "path": f"python/{EVIL}.py", "recorded": EVIL, "reused": False}
    entry = {"name": EVIL, "status": "failing", "kind": "commit", "detail": "", "ledger": [], "signals": [],
             "stop": {"phase": "series", "file": "x", "blocks": [], "resolved": [resolution]}}
    text = render_markdown({"old_base": {"rev": "v1", "commit": "a" * 40},
                            "new_base": {"rev": "v2", "commit": "b" * 40}, "direction": "forward",
                            "upstream_commits_between": 0, "upstream_commits": [], "upstream_commits_removed": [],
                            "entries": [entry], "equivalence": {
                                "summary": "s", "notes": [], "differences": [],
                                "replay": {"entries": [{"resolutions": [resolution]}]}}})
    _inert(text)
    rendered = MarkdownIt("commonmark").enable("table").render(text)
    assert rendered.count("@maintainers") == 7 and "@maintainers" not in re.sub("<code>.*?</code>", "", rendered)


def test_some_names_the_first_n_then_counts_the_rest():
    assert some(["a", "b", "c", "d"], 2) == "a, b and 2 more"
    assert some(["a", "b"], 2) == "a, b"
    assert some([], 3) == ""


MARKUP = "deepseek_v4: zero rows, see [link=https://evil.example]docs[/link] [bold]x[/bold] [/x] (#35848)"


def test_check_prints_an_upstream_subject_as_text_not_rich_markup(sglang_release_repo, tmp_path):
    """An upstream commit fixing what an entry fixes, naming its PR, reaches check's table as a hint: its subject's
    ``[/x]`` was a rich MarkupError (a traceback), its ``[link=...]`` a live link. Now literal text."""
    dest = tmp_path / "sglang.git"
    subprocess.run(["git", "clone", "--quiet", "--bare", str(sglang_release_repo), str(dest)], check=True)
    git = Git(git_dir=dest)

    def edit(idx: Git) -> None:
        for path in (CUH, PLAN):
            put(idx, path, git.blob("v0.5.23", path).decode().replace(GUARD_OLD, GUARD_NEW))

    sha = commit_on(git, MARKUP, edit)
    run = invoke("check", "--sglang-rev", sha, "--repo", dest, "--series", REPO_ROOT, as_json=False)
    assert run.code == 1 and f"upstream may now handle this: {sha[:12]} {MARKUP!r}" in table_column(run.text, 1), \
        run.text


def test_a_conflict_blocks_hunk_and_upstream_subjects_are_data():
    """A stop's conflict block quotes upstream's code (its hunk header, a backtick in it) and upstream commit
    subjects: inert in the report both verbs write."""
    from c128patch.ops.conflicts import block_markdown
    block = {"path": f"python/{EVIL}.py", "lines": [3, 4], "hunk": f"def f(): return `x` {EVIL}", "empty": False,
             "moved_to": 0, "upstream": [f"0123456789ab {text}" for text in HOSTILE]}
    line = block_markdown(block)
    _inert(line)
    rendered = MarkdownIt("commonmark").render(line)
    assert "@maintainers" not in re.sub(r"<code>.*?</code>", "", rendered, flags=re.S)  # every mention in code


def test_count_says_one_entry_and_two_entries():
    from c128patch.textsafe import count

    assert [count(1, "entry"), count(2, "entry"), count(0, "upstream commit"), count(1, "upstream commit"),
            count(5, "key")] == ["1 entry", "2 entries", "0 upstream commits", "1 upstream commit", "5 keys"]


def test_an_error_stays_one_line_without_controls_whatever_an_argument_holds(tmp_path):
    """A newline in an argument split the error line (``unknown rev 'v9`` then a line ``c128patch: ok forged'``), and
    a usage error quoted a launch argument's ESC, OSC-8 link and newline raw (doctor's `launch arguments go after
    --`): each is one line, its controls gone, the line break shown as ``⏎``."""
    for args, env in ((["check", "--sglang-rev", "v9\nc128patch: ok forged"], {}),
                      (["check", "--layer", tmp_path / "no\nforged"], {}),
                      (["lint"], {"C128PATCH_LAYERS": str(tmp_path / "no\nc128patch: note: all is well")}),
                      (["doctor", "--model-path", "x", "\x1b]8;;http://evil.example\x07a\x9b\u202e\nforged"], {})):
        res = invoke(*args, as_json=False, env=env)
        assert res.code == 2, (res.code, res.err)
        lines = res.err.strip().splitlines()
        shown = "⏎" in lines[0] or r"$'\x1b]8;;http://evil.example\x07a\xc2\x9b\xe2\x80\xae\x0aforged'" in lines[0]
        assert len(lines) == 1 and lines[0].startswith("c128patch: error: ") and shown, res.err  # (a command: $'')
        assert not any(c in res.err for c in CONTROLS), res.err


def test_the_layers_in_effect_are_said_on_one_line_without_controls(tmp_path):
    """The line naming the layers in effect printed their folders raw: a folder the tree's provenance, the
    environment or a config names (``lay\\x1b[31mer\\u202e\\nforged``) wrote its controls and a second line."""
    folder = tmp_path / "lay\x1b[31mer\u202e\nforged"
    assert invoke("layer", "new", folder, "--name", "evil", as_json=False).code == 0
    res = invoke("lint", "--offline", as_json=False, env={"C128PATCH_LAYERS": str(folder)})
    said = [line for line in res.err.splitlines() if "forged" in line]
    assert said == [f"layers from $C128PATCH_LAYERS: {tmp_path}/lay[31mer ⏎ forged"], res.err


def test_matrix_shows_a_repos_revision_as_data_on_a_terminal_and_in_markdown(sglang_release_repo):
    """A --repo revision is any commit-ish (``^{/regex}`` holds what a tag may not): matrix made it a rich column's
    markup (``[/x]``: a MarkupError traceback) and put it raw in its Markdown row (its ``|`` split the row, its
    ``<b>`` and ``@x`` were live)."""
    res = invoke("matrix", "--repo", sglang_release_repo, "--sglang-rev", "v0.5.23^{/[/x]?sglang}", as_json=False)
    assert res.code == 0 and "[/x]" in res.text, (res.code, res.err)
    rev = "v0.5.23^{/sglang|`<b>@x}"
    res = invoke("matrix", "--repo", sglang_release_repo, "--sglang-rev", rev, "--markdown", as_json=False)
    assert res.code == 0, (res.code, res.err)
    row = res.text.splitlines()[2]
    assert row.startswith("| ``v0.5.23^{/sglang\\|`<b>@x}`` | strict |"), row
    _inert(res.text)


def test_matrix_shows_a_test_id_of_a_results_file_as_data_in_markdown(tmp_path):
    """Helper 142: an upstream test's id is any string (a parametrize id) and smoke records it; matrix --markdown (the
    README's table) put it raw in a cell: its ``<img>``, ``@octocat``, ``#12``, code span and link were live."""
    import json
    import shutil

    results = tmp_path / "results"
    shutil.copytree(REPO_ROOT / "ci" / "gpu" / "results", results)
    suite = results / "v0.5.23" / "upstream-suite.json"
    data = json.loads(suite.read_text())
    bad = next(t for t in data["tests"] if t.get("patched") in ("failed", "error"))
    bad["nodeid"] = "test_x.py::t[" + EVIL + " `x` WWW.evil.example [y](https:evil.example)]"
    suite.write_text(json.dumps(data))
    res = invoke("matrix", "--results", results, "--sglang-rev", "v0.5.23", "--markdown", as_json=False)
    assert res.code == 0 and "@maintainers" not in res.text and "#12" not in res.text and "`x`" not in res.text, res
    # (GitHub links a bare www. itself, a link is live in any renderer; matrix shows an id past its last "/")
    assert "](" not in res.text and "www.evil" not in res.text.lower(), res.text
    _inert(res.text)
    rendered = MarkdownIt("commonmark").enable("table").render(res.text)
    assert "<a " not in rendered and "<code>" not in rendered and "&lt;img src=x" in rendered, rendered


def test_a_series_version_and_a_repos_revision_are_no_markup_in_a_table_title_or_column(tmp_path, sglang_release_repo):
    """A version may hold ``[/x]`` (one word): check's and gates' table titles were rich markup (a MarkupError
    traceback), as was check's column of a --repo revision (``^{/[/x]...}``)."""
    from small_series import EDIT
    from support import make_test_series

    series = make_test_series(tmp_path / "series", sglang_release_repo, EDIT)
    manifest = series / "patches" / "series.toml"
    manifest.write_text(manifest.read_text().replace('version = "1"', 'version = "1[/x]"', 1))
    assert 'version = "1[/x]"' in manifest.read_text()
    res = invoke("gates", "--series", series, as_json=False)
    assert res.code == 0 and "1[/x]" in res.text, (res.code, res.err)
    res = invoke("check", "--series", series, "--repo", sglang_release_repo, "--sglang-rev", "v0.5.23^{/[/x]?sglang}",
                 as_json=False)
    assert res.code in (0, 1) and "series" in res.text and "1[/x]" in res.text and "[/x]?sglang" in res.text, res


def test_gates_markdown_shows_a_series_gates_text_as_data(tmp_path):
    """Helper 147: a series' (or layer's) ``[[gates]]`` text (``enables``, ``notes``, ``default``) reached
    ``gates --markdown`` (docs/gates.md's table) through ``cell`` alone: its ESC/OSC-8, ``<!--``, ``<img>``,
    ``@mention``, ``#ref`` and link were live, and a backtick in its default closed the code span."""
    import shutil

    from c128patch.series.gates import Gate, render_markdown

    series = tmp_path / "s"
    shutil.copytree(REPO_ROOT / "patches", series / "patches")
    for part in ("overlay", "csrc"):
        if (REPO_ROOT / part).exists():
            shutil.copytree(REPO_ROOT / part, series / part)
    manifest = series / "patches" / "series.toml"
    evil = " ".join(HOSTILE).replace("\\", "\\\\").replace('"', '\\"')
    text = manifest.read_text()
    manifest.write_text(text.replace('notes = "acts with', 'notes = "' + "".join(
        f"\\u{ord(c):04x}" if ord(c) < 32 or 0x7f <= ord(c) < 0xa0 else c for c in evil) + ' acts with', 1))
    assert manifest.read_text() != text
    res = invoke("gates", "--series", series, "--markdown", as_json=False)
    assert res.code == 0 and "@maintainers" not in res.text and "fixes #12" not in res.text, res
    _inert(res.text)
    gate = Gate("SGLANG_X", "series", "str", '"`x` <img src=x onerror=alert(1)>"', "<!-- @a #1", notes="x | y")
    _inert(rendered := render_markdown([gate], {}))
    assert rendered.count(" | ") == render_markdown([Gate("SGLANG_X", "series", "str", '"a"', "b", notes="c")],
                                                     {}).count(" | "), rendered


def test_smoke_upstreams_table_shows_a_tests_id_and_exception_text_as_data(capsys):
    """Helper 147: ``smoke upstream``'s table put an upstream test's id and its exception text (the target's) in rich
    cells as markup: ``[link=...]`` was a live link, ``[bold]`` styled, ESC/OSC-8 and U+202E reached the terminal."""
    from pathlib import Path

    from c128patch.smoke.render import print_upstream

    evil = "t[\x1b]8;;http://evil\x1b\\x\x1b]8;;\x1b\\ [link=http://evil.example]click[/link] [bold]B[/bold] \u202e]"
    report = {"tree": "T[/x]", "upstream_tree": "U", "selection": {"selected": [1], "scanned": 1, "scope": "x"},
              "tests": [{"id": "test_a.py::" + evil, "patched": "failed", "upstream": "passed", "verdict": "regressed",
                         "reason": None, "patched_message": "AssertionError: " + evil}],
              "trees": {}, "device": {}, "counts": {"regressed": 1}, "notes": [], "problems": [], "ok": False}
    print_upstream(report, Path("out[/x]") / "r.json", "r.txt")
    out = capsys.readouterr().out
    assert not any(c in out for c in CONTROLS), out
    assert out.count("[link=http://evil.example]click[/link] [bold]B[/bold]") == 3 and "T[/x] vs U" in out, out
    assert "NOT OK  report: out[/x]/r.json (result: out[/x]/r.txt)" in out, out


def test_watchs_contract_verdict_and_ledger_paths_are_data():
    """Helper 147: watch's report put the contract's verdict (an error's text where the check could not run: it
    quotes a replay's detail) and a partly resolved conflict's ledger rows and still conflicted paths (the ledger's and
    upstream's file names: ``check_relpath`` takes ``<img ...>.py``) raw in its Markdown (rebase's quoted them)."""
    conflict = {"entry": "c128-a", "file": "p/x.patch", "chosen_by": "", "blocks": [], "after_skipping": [],
                "resolved_by_ledger": [{"entry": "c128-a", "key": "k1", "path": f"python/{EVIL}.py"}],
                "unresolved": [f"python/{EVIL}.py", "python/`x`.py"], "detail": "does not apply", "hints": []}
    lines = watch_report._conflicts({"conflicts": [conflict]}) + watch_report._fits(
        {"contract": {"verdict": f"the series does not apply on v: c128-a: {EVIL}", "cxx_probe": "ok", "failing": []}})
    text = "\n".join(lines)
    _inert(text)
    rendered = MarkdownIt("commonmark").enable("table").render(text)
    assert "@maintainers" in rendered and "@maintainers" not in re.sub("<code>.*?</code>", "", rendered), text
    assert "<code>python/`x`.py</code>" in rendered, rendered


def test_matrix_shows_a_refusal_quoting_upstreams_attributes_as_data(sparse_clone):
    """Helper 147: matrix's terminal table put a release's "applies" refusal in a rich cell as markup: upstream's
    ``.gitattributes`` value it quotes (``working-tree-encoding=[/x]...``) was a MarkupError traceback, a
    ``[link=...]`` a live link. It is literal now (its Markdown was md_cell's already)."""
    from support import upstream_commit

    value = "[/x][link=http://evil.example/]UTF-16[/link]"

    def edit(idx: Git) -> None:
        blob = idx.out("hash-object", "-w", "--stdin", input=f"python/sglang/srt/environ.py working-tree-encoding="
                                                              f"{value}\n")
        idx.run("update-index", "--add", "--cacheinfo", f"100644,{blob},.gitattributes")

    rev = upstream_commit(Git(worktree=sparse_clone), "v0.5.23", "upstream re-encodes", edit)
    res = invoke("matrix", "--repo", sparse_clone, "--sglang-rev", rev, as_json=False)
    assert res.code == 0 and "Traceback" not in res.err, (res.code, res.err)
    assert "refused:" in res.text and "[/x][link=http://evil.example/]UTF-16[/link]" in res.text.replace("│", "") \
        .replace("\n", "").replace(" ", ""), res.text


TAGS = ["<!--", "@maintainers/x", "`x`<img/src=x/onerror=alert(1)>", "0\u202ex", "0\u00a0v9", "0" + "a" * 200]


def test_a_tag_upstream_puts_on_the_watched_commit_is_no_base_of_the_refreshed_series(sglang_release_repo, tmp_path):
    """Helper 158: watch's refreshed series took ``sorted(tags)[0]`` of the commit it moved onto as its base: a tag
    upstream put on main's head (``<!--``, sorting before ``v0.5.23``) became series.toml's base and reached the
    report raw (``primary files for <!--; base <!--``: the rest of the page hidden); a tag holding U+202E or a byte
    that is not UTF-8 failed the whole watch (exit 2, ``unsafe base``), so any upstream tag stopped the nightly run.
    Only a plain word is a base now (``refresh.base_label``), and the report quotes the label and base as data."""
    import watch_upstream as wu

    git = wu.stand_in(sglang_release_repo, tmp_path / "sglang.git")
    sha = git.out("rev-parse", "v0.5.23^{commit}")
    for tag in TAGS:
        git.run("update-ref", f"refs/tags/{tag}", sha)
    subprocess.run([b"git", b"-C", bytes(tmp_path / "sglang.git"), b"update-ref", b"refs/tags/0\xff", sha.encode()],
                   check=True)
    series = wu.series_made_at(tmp_path / "s022", sglang_release_repo, "v0.5.22")
    run = invoke("watch", "--onto", sha, "--repo", tmp_path / "sglang.git", "--out", tmp_path / "out", "--series",
                 series, "--no-run")
    assert run.code == 3 and run.out["outcome"] == "refreshed", (run.code, run.err)
    assert run.out["refreshed"]["label"] == run.out["refreshed"]["base"] == "v0.5.23", run.out["refreshed"]
    report = (tmp_path / "out" / "watch-report.md").read_text()
    assert "(primary files for `v0.5.23`; base `v0.5.23`)" in report
    _inert(report)


def test_the_refreshed_series_label_and_a_conflicts_chosen_file_are_data_in_watchs_report():
    """Helper 158: ``_refreshed`` put the label and base raw, ``_conflicts`` the rule that chose the file (it names a
    variant's base, a series' text: ``nearest ancestor base <!--``)."""
    new = {"version": "6", "mode": "primary", "label": "<!--", "base": "@maintainers/x", "applies_strictly": True,
           "same_tree": True, "fixed_point": True, "changed": [], "notes": []}
    conflict = {"entry": "c128-a", "file": "p/x.patch", "chosen_by": f"ancestor: nearest ancestor base {EVIL}",
                "blocks": [], "after_skipping": [], "resolved_by_ledger": [], "unresolved": [], "detail": "d",
                "hints": []}
    text = "\n".join(watch_report._refreshed({"refreshed": new, "series": {"name": "s"}, "outcome": "refreshed",
                                              "out": "o", "onto": {"rev": "v", "commit": "b" * 40}})
                     + watch_report._conflicts({"conflicts": [conflict]}))
    _inert(text)
    rendered = MarkdownIt("commonmark").render(text)
    assert "@maintainers" in rendered and "@maintainers" not in re.sub("<code>.*?</code>", "", rendered), text


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85"], ids=["LS", "PS", "NEL"])
def test_a_tag_holding_a_unicode_line_separator_names_no_base(tmp_path, separator: str):
    """A tag ``zz<U+2028>aa`` (git takes it): ``base_label`` split ``tag --points-at`` with ``str.splitlines``, which
    cut it into ``zz`` and ``aa``, two plain words that are no tag: ``aa`` became the refreshed series' base (and
    watch called the commit tagged). Read as git's records, split at "\\n" only: no plain word, the commit names it."""
    from c128patch.git import Git
    from c128patch.ops.refresh import base_label

    git = Git(tmp_path)
    git.run("init", "-q")
    git.run("-c", "user.name=u", "-c", "user.email=u@x.invalid", "commit", "-q", "--allow-empty", "-m", "x")
    sha = git.out("rev-parse", "HEAD")
    git.run("update-ref", f"refs/tags/zz{separator}aa", sha)
    assert base_label(git, sha, "main") == sha[:12]
    git.run("tag", "v1", sha)
    assert base_label(git, sha, "main") == "v1"


def test_json_output_and_reports_are_ascii_so_upstreams_text_is_inert_on_a_terminal(tmp_path, capsys):
    """``--json`` objects and the JSON reports carry upstream's text as git gave it (helper 164: bisect's ``subject``,
    watch-report.json's ``upstream_commits``), escaped by JSON: ESC, C1 (CSI ``\\x9b``), bidi and line separators as
    ``\\uXXXX``, so ``cat`` of the report or of ``--json`` prints none of them raw."""
    from c128patch.cli.common import emit_json
    from c128patch.jsonio import write_json_atomic

    hostile = "a\x1b]8;;http://evil.example/\x07b\x9b31mc\u202ed\u2028e\x85f\udcff"
    emit_json({"subject": hostile})
    printed = capsys.readouterr().out
    written = write_json_atomic(tmp_path / "report.json", {"upstream_commits": [hostile]}).read_bytes()
    for raw in (printed.encode("utf-8", "surrogateescape"), written):
        assert all(b == 0x0A or 0x20 <= b < 0x7F for b in raw), raw
    # the data kept; a byte that is not UTF-8 (U+DCFF kept by surrogateescape) is U+FFFD on --json, which strict
    # readers take (helper 172: ``textsafe.decoded``), and kept in files the tool reads back (a journal's paths)
    assert json.loads(printed)["subject"] == hostile.replace("\udcff", "\ufffd")
    assert json.loads(written)["upstream_commits"][0] == hostile
