"""`c128patch.ops.audit`: synthetic snippets, then the real record_stream patch on a real 0.5.23 tree."""

from __future__ import annotations

import ast
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from c128patch.errors import C128Error
from c128patch.ops.audit import RULES, Rule, _HelperIndex, audit_patch, audit_patched_file
from c128patch.series.manifest import load_series
from support import RELEASES, invoke, unpack_release

REPO = Path(__file__).resolve().parents[1]
GATE = "SGLANG_TEST_GATE"


def audit(src: str, added: set[int] | None = None, gate: str = GATE, rules=RULES):
    src = textwrap.dedent(src)
    lines = added if added is not None else set(range(1, src.count("\n") + 2))
    return audit_patched_file(src, lines, gate, rules)


def rules_hit(findings) -> list[tuple[int, str]]:
    return [(f.line, f.rule) for f in findings]


# ----------------------------------------------------------------------------- synthetic


def test_unguarded_record_stream_is_found():
    src = """
    def f(batch, s):
        batch.seq_lens.record_stream(s)
    """
    assert rules_hit(audit(src)) == [(3, "record_stream")]


def test_guard_forms_accepted():
    src = """
    def f(batch, s, x):
        if envs.SGLANG_TEST_GATE.get():
            batch.a.record_stream(s)
        if envs.SGLANG_TEST_GATE.get() and x is not None:
            batch.b.record_stream(s)
        if x and envs.SGLANG_TEST_GATE.get():
            batch.c.record_stream(s)
        if not envs.SGLANG_TEST_GATE.get():
            pass
        else:
            batch.d.record_stream(s)
        batch.e.record_stream(s) if envs.SGLANG_TEST_GATE.get() else None
        envs.SGLANG_TEST_GATE.get() and batch.f.record_stream(s)
    """
    assert audit(src) == []


def test_wrong_gate_or_or_is_not_a_guard():
    src = """
    def f(batch, s, x):
        if envs.OTHER_GATE.get():
            batch.a.record_stream(s)
        if x or envs.SGLANG_TEST_GATE.get():
            batch.b.record_stream(s)
        if envs.SGLANG_TEST_GATE.get():
            pass
        else:
            batch.c.record_stream(s)
        if not envs.SGLANG_TEST_GATE.get():
            batch.d.record_stream(s)
    """
    assert rules_hit(audit(src)) == [(4, "record_stream"), (6, "record_stream"), (10, "record_stream"),
                                     (12, "record_stream")]


def test_early_exit_guards_rest_of_block_only():
    src = """
    def f(batch, s):
        if not envs.SGLANG_TEST_GATE.get():
            return
        batch.a.record_stream(s)

    def g(batch, s, items):
        for t in items:
            if not envs.SGLANG_TEST_GATE.get() or t is None:
                continue
            t.record_stream(s)
        batch.b.record_stream(s)

    def h(batch, s):
        if not envs.SGLANG_TEST_GATE.get():
            log("off")
        batch.c.record_stream(s)
    """
    # g: the loop body is guarded, the statement after the loop is not; h: no exit, no guard
    assert rules_hit(audit(src)) == [(12, "record_stream"), (17, "record_stream")]


def test_only_added_lines_are_audited():
    src = """
    def f(batch, s):
        batch.seq_lens.record_stream(s)
        batch.a.record_stream(s)
    """
    assert rules_hit(audit(src, added={4})) == [(4, "record_stream")]
    assert audit(src, added={3}, gate=GATE)[0].line == 3
    # a call spanning lines counts when any of its lines is added
    src2 = """
    def f(batch):
        batch.seq_lens.record_stream(
            current_stream()
        )
    """
    assert rules_hit(audit(src2, added={4})) == [(3, "record_stream")]


def test_helper_with_every_call_site_guarded():
    src = """
    def _record(batch, s):
        batch.a.record_stream(s)

    def f(batch, s):
        if envs.SGLANG_TEST_GATE.get():
            _record(batch, s)

    def g(batch, s):
        if envs.SGLANG_TEST_GATE.get():
            self._record(batch, s)
    """
    assert audit(src) == []


def test_helper_with_one_unguarded_call_site():
    src = """
    def _record(batch, s):
        batch.a.record_stream(s)

    def f(batch, s):
        if envs.SGLANG_TEST_GATE.get():
            _record(batch, s)

    def g(batch, s):
        _record(batch, s)
    """
    # both the helper body (its guard does not hold everywhere) and the unguarded call are reported
    assert rules_hit(audit(src)) == [(3, "record_stream"), (10, "record_stream")]


def test_helper_never_called_is_reported():
    src = """
    def _record(batch, s):
        batch.a.record_stream(s)
    """
    assert rules_hit(audit(src)) == [(3, "record_stream")]


def test_guard_outside_def_or_lambda_does_not_cover_body():
    src = """
    def f(batch, s):
        if envs.SGLANG_TEST_GATE.get():
            cb = lambda: batch.a.record_stream(s)
            def inner():
                batch.b.record_stream(s)
            register(cb, inner)
    """
    assert rules_hit(audit(src)) == [(4, "record_stream"), (6, "record_stream")]


def test_other_rules_and_extension():
    src = """
    def f(a, b, stream):
        a.copy_(b)
        torch.cuda.synchronize()
        stream.wait_stream(other)
        torch.get_device_module(dev).current_stream().synchronize()
        launch_kernel(a)
    """
    assert rules_hit(audit(src)) == [
        (3, "tensor_copy_"),
        (4, "synchronize"),
        (5, "stream_wait"),
        (6, "synchronize"),
    ]
    extended = (*RULES, Rule("kernel_launch", functions=frozenset({"launch_kernel"})))
    assert (7, "kernel_launch") in rules_hit(audit(src, rules=extended))


def test_plain_calls_are_not_findings():
    src = """
    def f(batch):
        x = torch.empty(3)
        batch.seq_lens.to("cpu")
        record(batch)
    """
    assert audit(src) == []


def _index(files: dict[str, str]) -> _HelperIndex:
    """Helper modules of a made-up tree (``python/<path>``), read as the audit reads the patched tree."""
    texts = {f"python/{path}": textwrap.dedent(text) for path, text in files.items()}
    return _HelperIndex(texts.get, GATE, RULES)


def test_a_helper_module_is_followed_as_far_as_our_added_lines_reach():
    index = _index({
        "pkg/streams.py": """
            from pkg.deep import deeper_copy
            from pkg.unrelated import nothing

            def record_all(t, s):
                t.record_stream(s)

            def copy_all(dst, src):
                deeper_copy(dst, src)

            def unused():
                nothing()
            """,
        "pkg/deep.py": "def deeper_copy(dst, src):\n    dst.copy_(src)\n",
        "pkg/unrelated.py": "def nothing():\n    pass\n",
        "pkg/other.py": "from pkg.unrelated import nothing\n\ndef g():\n    nothing()\n"})
    src = textwrap.dedent("""
        from pkg.streams import record_all, copy_all
        from pkg.other import g

        def _local(t, s):
            copy_all(t, s)

        def f(t, s):
            record_all(t, s)
            _local(t, s)
            g()
        """)
    findings = audit_patched_file(src, {9, 10}, GATE, RULES, index=index)
    # a local helper of the patched file that calls an imported one counts too (``_reached``)
    assert rules_hit(findings) == [(9, "record_stream"), (10, "tensor_copy_")]
    # g is not called on the added lines, nor ``unused`` by what they call: their modules are never read
    assert set(index.parsed) == {"python/pkg/streams.py", "python/pkg/deep.py"}


def test_a_helper_reached_first_at_the_last_depth_is_followed_deeper_when_reached_sooner():
    chain = {f"pkg/m{i}.py": f"from pkg.m{i + 1} import h{i + 1}\n\ndef h{i}(t):\n    h{i + 1}(t)\n" for i in range(3)}
    index = _index({**chain, "pkg/m3.py": "def h3(t):\n    t.copy_(t)\n"})
    # m2.h2 first asked three modules down: h3 lies past the depth there
    assert index.imported_effects([ast.parse("from pkg.m2 import h2").body[0]], {"h2"}, 0) == {}
    # asked at the top: m0 -> m1 -> m2 -> m3 is within the depth, whatever was asked before
    top = index.imported_effects([ast.parse("from pkg.m0 import h0").body[0]], {"h0"}, index.depth)
    assert top == {"h0": "tensor_copy_"}


# ----------------------------------------------------------------------------- real patch

RS_ENTRY = load_series(REPO).entry("c128-dspark-record-streams")
RS_PATCHES = {v.base: v.file for v in RS_ENTRY.patch_files()}  # release -> the patch file made for it
RS_PATCH = REPO / "patches" / RS_PATCHES["v0.5.23"]
RS_GATE = RS_ENTRY.gate
OVERLAY = REPO / "overlay"
# The helper module imports record_stream_each / record_stream_for_v2_verify from here; the
# audit follows that import to learn the helper's side effects.
EXTRA_UPSTREAM = ["srt/speculative/spec_utils.py"]


def _git(cwd: Path, *args: str, input: str | None = None) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=cwd, check=True, capture_output=True, text=True, input=input,
    ).stdout


def _patch_paths(patch_text: str) -> list[str]:
    from unidiff import PatchSet

    return [pf.path for pf in PatchSet(patch_text)]


def tiny_release_repo(tmp: Path, patch_text: str, releases: Path, version: str = "v0.5.23") -> Path:
    """A git repo holding only the files the patch touches (+ EXTRA_UPSTREAM), taken from the
    real release history and laid out as `python/sglang/...`, committed and tagged."""
    repo = tmp / "sglang"
    rels = [p.removeprefix("python/sglang/") for p in _patch_paths(patch_text)] + EXTRA_UPSTREAM
    unpack_release(releases, version, repo / "python", [f"python/sglang/{rel}" for rel in rels])
    _git(repo.parent, "init", "-q", str(repo))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", f"upstream {version}")
    _git(repo, "tag", version)
    return repo


def apply_entry(repo: Path, patch_text: str) -> None:
    """Apply the patch and install the overlay modules (overlay/X -> python/X)."""
    _git(repo, "apply", "-", input=patch_text)
    for src in OVERLAY.rglob("*.py"):
        dst = repo / "python" / src.relative_to(OVERLAY)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)


@pytest.mark.parametrize("version", sorted(RS_PATCHES))
def test_real_record_stream_patch_passes(tmp_path: Path, version: str, sglang_release_repo: Path):
    patch_text = (REPO / "patches" / RS_PATCHES[version]).read_text()
    repo = tiny_release_repo(tmp_path, patch_text, sglang_release_repo, version)
    apply_entry(repo, patch_text)
    assert audit_patch(patch_text, repo, RS_GATE) == []
    # the gate is declared default-off in Envs, among the DSPARK flags
    environ = (repo / "python/sglang/srt/environ.py").read_text().splitlines()
    at = environ.index(f"    {RS_GATE} = EnvBool(False)")
    assert "SGLANG_DSPARK_CONFIDENCE_RELAY_LAG_STEPS" in environ[at - 4]
    # the only record_stream upstream had stays unconditional
    worker = (repo / "python/sglang/srt/speculative/dspark_components/dspark_worker_v2.py").read_text()
    assert "        batch.seq_lens.record_stream(\n" in worker


def test_real_record_stream_patch_without_guard_fails(tmp_path: Path, sglang_release_repo: Path):
    patch_text = RS_PATCH.read_text()
    repo = tiny_release_repo(tmp_path, patch_text, sglang_release_repo)
    apply_entry(repo, patch_text)
    # Drop the guard in dspark_verify.py: dedent its block so the helper call runs always.
    rel = "python/sglang/srt/speculative/dspark_components/dspark_verify.py"
    path = repo / rel
    lines = path.read_text().splitlines(keepends=True)
    guard = f"        if envs.{RS_GATE}.get():\n"
    at = lines.index(guard)
    body_end = at + 1
    while lines[body_end].startswith("            ") or lines[body_end].strip() == "":
        lines[body_end] = lines[body_end][4:] if lines[body_end].strip() else lines[body_end]
        body_end += 1
    del lines[at]
    path.write_text("".join(lines))
    _git(repo, "add", "-A")
    # only the files the patch touches: the overlay module is installed whole, not patched
    mutated = _git(repo, "diff", "--cached", "v0.5.23", "--", *_patch_paths(patch_text))
    call_line = next(
        i for i, ln in enumerate(lines, 1) if "c128_record_streams.record_verify_inputs(" in ln
    )

    findings = audit_patch(mutated, repo, RS_GATE)

    assert [(f.file, f.line, f.rule) for f in findings] == [(rel, call_line, "record_stream")]
    assert "record_verify_inputs" in findings[0].message
    # the helper is followed through the overlay module into upstream's spec_utils
    assert RS_GATE in findings[0].message


# ----------------------------------------------------------------------------- series level

@pytest.mark.parametrize("rev", RELEASES)  # the older releases' cases: the heavy tier (tests/conftest.py)
def test_series_audit_clean_on_every_release(sglang_release_repo: Path, rev: str):
    from c128patch.git import Git
    from c128patch.ops.audit import audit_series

    git = Git(git_dir=sglang_release_repo)
    assert audit_series(load_series(REPO), git, rev, git.rev_parse(rev)) == []


def test_lint_fails_when_a_gated_patch_loses_its_guard(tmp_path: Path, sglang_release_repo: Path):
    """The real series with the 0.5.23 record_stream patch's guard removed: lint names the line."""
    series_dir = tmp_path / "series"
    shutil.copytree(REPO / "patches", series_dir / "patches")
    shutil.copytree(REPO / "overlay", series_dir / "overlay")
    shutil.copytree(REPO / "csrc", series_dir / "csrc")
    patch = series_dir / "patches" / RS_PATCHES["v0.5.23"]
    text = patch.read_text()
    guard = f"+        if envs.{RS_GATE}.get():\n"
    assert guard in text
    # the first guarded block (dspark_verify.py) now runs whatever the env says
    mutated = text.replace(guard, "+        if True:  # guard removed\n", 1)
    patch.write_text(mutated)
    res = invoke("lint", "--update-hashes", "--series", str(series_dir))
    assert res.code == 1, res.err
    findings = res.out["findings"]
    assert findings and all("[record_stream]" in f["message"] for f in findings)
    assert any("dspark_verify.py" in f["message"] for f in findings)


# ----------------------------------------------------------------------------- where a patch landed

VERIFY = "python/sglang/srt/speculative/dspark_components/dspark_verify.py"
UPSTREAM = {"GIT_AUTHOR_NAME": "upstream", "GIT_AUTHOR_EMAIL": "upstream@sglang.invalid",
            "GIT_COMMITTER_NAME": "upstream", "GIT_COMMITTER_EMAIL": "upstream@sglang.invalid",
            "GIT_AUTHOR_DATE": "2026-06-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-06-01T00:00:00Z"}
# 16 lines upstream adds just above the method the record-streams patch edits in dspark_verify.py:
# git applies the hunk 16 lines down, and the patch file's own numbers (354-357) fall inside them.
ABOVE = {"sync-above": "    def _drain(self, stream):\n" + "        stream.synchronize()\n" * 14 + "\n",
         "comments-above": "    # upstream: notes on the verify path\n" * 16}


@pytest.fixture(scope="module")
def offset_upstream(sglang_release_repo: Path, tmp_path_factory: pytest.TempPathFactory):
    """A bare clone of the release history with one branch per ``ABOVE`` block, each one upstream commit on v0.5.23."""
    from c128patch.git import Git
    from support import upstream_commit

    dest = tmp_path_factory.mktemp("offset") / "sglang.git"
    subprocess.run(["git", "clone", "--quiet", "--bare", str(sglang_release_repo), str(dest)], check=True)
    git = Git(git_dir=dest).with_env(**UPSTREAM)
    lines = git.blob("v0.5.23", VERIFY).decode().splitlines(keepends=True)
    at = lines.index("    def _forward_prepared_verify(\n")
    assert at < 351 - 1 < 354 - 1 < at + 16  # the hunk's recorded lines land inside the block
    for branch, block in ABOVE.items():
        def edit(idx, block=block):
            blob = idx.out("hash-object", "-w", "--stdin", input="".join([*lines[:at], block, *lines[at:]]))
            idx.run("update-index", "--cacheinfo", f"100644,{blob},{VERIFY}")

        git.run("update-ref", f"refs/heads/{branch}", upstream_commit(git, "v0.5.23", f"dspark verify: {branch}", edit))
    return Git(git_dir=dest)


def _replayed(series, git, rev: str):
    """A reader of the files of the series replayed on ``rev``."""
    import tempfile

    from c128patch.ops.replay import replay_in_index
    from c128patch.series.plan import index_git

    with tempfile.TemporaryDirectory() as tmp:
        result, _ = replay_in_index(series, git, rev, git.rev_parse(rev), Path(tmp) / "index")
        assert result.ok
        tree = index_git(git, Path(tmp) / "index").out("write-tree")
    return lambda rel: (git.blob(tree, rel) or b"").decode() or None


def _as_patch_file_says(series, git, rev: str, patch_text: str) -> list:
    """The audit as it read before: the patch file's hunk numbers, on the series' replayed tree."""
    return audit_patch(patch_text, _replayed(series, git, rev), RS_GATE)


def test_the_audit_reads_the_added_lines_where_the_patch_landed(offset_upstream, tmp_path: Path):
    from c128patch.git import Git
    from c128patch.ops.audit import audit_branch, audit_series
    from support import copy_series

    git, series, rev = offset_upstream, load_series(REPO), "sync-above"
    # read from the patch file's hunk numbers, upstream's own synchronize() calls look like ours
    assert {(f.file, f.rule) for f in _as_patch_file_says(series, git, rev, RS_PATCH.read_text())} == \
        {(VERIFY, "synchronize")}
    assert audit_series(series, git, rev, git.rev_parse(rev)) == []
    run = invoke("apply", "--sglang-rev", rev, "--repo", str(git.git_dir), "--tree", str(tmp_path / "tree"),
                 "--series", str(copy_series(tmp_path / "series")))
    assert run.code == 0, run.err
    assert audit_branch(series, Git(worktree=tmp_path / "tree"), git.rev_parse(rev)) == []


def test_an_ungated_call_of_ours_at_an_offset_is_still_caught(offset_upstream, tmp_path: Path):
    from c128patch.ops.audit import audit_series
    from c128patch.ops.lint import update_hashes
    from support import copy_series

    series_dir = copy_series(tmp_path / "series")
    patch = series_dir / "patches" / RS_PATCHES["v0.5.23"]
    guard = f"+        if envs.{RS_GATE}.get():\n"
    assert guard in patch.read_text()
    mutated = patch.read_text().replace(guard, "+        if True:  # guard removed\n", 1)  # dspark_verify.py's
    patch.write_text(mutated)
    update_hashes(load_series(series_dir))
    git, series, rev = offset_upstream, load_series(series_dir), "comments-above"
    findings = audit_series(series, git, rev, git.rev_parse(rev))
    patched = _replayed(series, git, rev)(VERIFY).splitlines()
    call = next(i for i, line in enumerate(patched, 1) if "c128_record_streams.record_verify_inputs(" in line)
    assert call == 357 + 16
    assert [(f.file, f.line, f.rule, f.entry) for f in findings] == \
        [(VERIFY, call, "record_stream", "c128-dspark-record-streams")]
    assert "record_verify_inputs" in findings[0].message
    # read from the patch file's hunk numbers, the same lines are upstream's comments: nothing found
    assert _as_patch_file_says(series, git, rev, mutated) == []


@pytest.mark.parametrize("source", ["def f(:\n", "x = " + "(" * 1000 + ")" * 1000 + "\n", "x = 1\0\n"])
def test_a_patched_file_that_does_not_parse_is_one_line_naming_it(source):
    """Helper 169: `watch --onto` an upstream commit leaving a file the series patches unparseable (its hunks still
    apply) ended with a SyntaxError traceback from the gate audit, exit 1. One line naming the file, which watch
    reports as the audit's finding."""
    with pytest.raises(C128Error, match=r"^gate audit: python/x\.py: (does not parse|nested too deeply to parse)"):
        audit_patched_file(source, {1}, GATE, RULES, file="python/x.py")
