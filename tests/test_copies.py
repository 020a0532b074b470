"""Copies of what the series patches (fit.copies) and one verdict for watch and bisect (fit.bisect.fit_check):
upstream commits made in the test on the real v0.5.23. A copy of the patched DSPARK worker behind a new env,
without the commit-after-accept hook: watch is broken naming both files and the hook, bisect finds the commit.
A header change the nvcc probe rejects: watch is broken by the probe, and bisect (the same check) names it."""

from __future__ import annotations

import ast
import base64
import textwrap
from pathlib import Path

import pytest

import watch_upstream as wu
from c128patch.fit import bisect as bisect_ops
from c128patch.fit import contract, contract_cxx, copies
from c128patch.fit.watch import EXIT
from c128patch.git import Git
from c128patch.series.manifest import load_series
from c128patch.textsafe import md as inert
from support import REPO_ROOT, invoke, upstream_commit

WORKER = "python/sglang/srt/speculative/dspark_components/dspark_worker_v2.py"
FAST = "python/sglang/srt/speculative/dspark_components/dspark_worker_fast.py"
SUB = "python/sglang/srt/speculative/dspark_components/dspark_worker_sub.py"
CONFIG = "python/sglang/srt/speculative/dspark_components/dspark_config.py"
HEADER = f"{contract_cxx.INCLUDE_ROOT}/sgl_kernel/math.cuh"
ENVIRON = "python/sglang/srt/environ.py"
SERIES = load_series(REPO_ROOT)


def _commit(git: Git, parent: str, subject: str, files: dict[str, str]) -> str:
    def edit(idx: Git) -> None:
        for path, text in files.items():
            blob = idx.out("hash-object", "-w", "--stdin", input=text)
            idx.run("update-index", "--add", "--cacheinfo", f"100644,{blob},{path}")

    return upstream_commit(git, parent, subject, edit)


@pytest.fixture(scope="module")
def remote(sglang_release_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Git:
    """v0.5.23, an unrelated commit, then (branch ``copied``) a copy of the worker behind a new env, and on a side
    branch (``header``) a header the fake nvcc probe rejects."""
    git = wu.stand_in(sglang_release_repo, tmp_path_factory.mktemp("copies") / "sglang.git")
    first = wu.unrelated(git)
    worker, environ = git.blob(first, WORKER).decode(), git.blob(first, ENVIRON).decode()
    anchor = "    SGLANG_DSPARK_SIMULATE_FOLD = EnvBool(False)\n"
    assert "class DSparkWorkerV2(" in worker and anchor in environ
    copied = _commit(git, first, "dspark: a fast worker behind SGLANG_DSPARK_FAST_WORKER", {
        FAST: worker.replace("class DSparkWorkerV2(", "class DSparkFastWorker("),
        ENVIRON: environ.replace(anchor, anchor + "    SGLANG_DSPARK_FAST_WORKER = EnvBool(False)\n", 1)})
    wu.set_branch(git, "copied-commit", copied)
    hooked = worker.replace("class DSparkWorkerV2(", "class DSparkHookedWorker(") + (
        "\n\ndef _ours(runner):\n    commit_after_verify(runner)\n    record_decode_inputs(runner)\n")
    wu.set_branch(git, "hooked", _commit(git, first, "dspark: a worker that keeps the hooks", {FAST: hooked}))
    wu.set_branch(git, "copied", wu.unrelated(git, copied))
    header = git.blob(first, HEADER)
    assert header is not None
    wu.set_branch(git, "header-commit", _commit(git, first, "kernels: math.cuh", {
        HEADER: header.decode() + "// PROBE_REJECTS\n"}))
    wu.set_branch(git, "header", wu.unrelated(git, git.rev_parse("header-commit")))
    return git


@pytest.fixture(scope="module")
def ours(remote: Git) -> list[copies.Patched]:
    return copies.patched(SERIES, remote, "v0.5.23", remote.rev_parse("v0.5.23"))


def test_the_hooks_of_the_worker_are_the_calls_our_entries_add(ours):
    worker = next(p for p in ours if p.file == WORKER)
    assert worker.cls == "DSparkWorkerV2" and "_forward_decode" in worker.methods
    assert worker.hooks == {"_forward_decode": frozenset({"commit_after_verify", "record_decode_inputs"})}


def test_a_copy_of_the_patched_worker_lacks_the_commit_hook(remote, ours):
    found = copies.find(remote, remote.rev_parse("v0.5.23"), remote.rev_parse("copied"), ours)
    assert found == [copies.Copy(WORKER, FAST, ("commit_after_verify", "record_decode_inputs"),
                                 ("SGLANG_DSPARK_FAST_WORKER",))]
    assert str(found[0]) == (f"upstream copies {WORKER} as {FAST} (the range adds SGLANG_DSPARK_FAST_WORKER), which "
                             "lacks our hook(s) commit_after_verify, record_decode_inputs")


def test_a_subclass_overriding_the_hooked_method_is_found_and_one_calling_super_keeps_ours(remote, ours):
    base = remote.rev_parse("v0.5.23")
    head = "from sglang.srt.speculative.dspark_components.dspark_worker_v2 import DSparkWorkerV2\n\n\n"
    bare = head + "class Sub(DSparkWorkerV2):\n    def _forward_decode(self, batch):\n        return batch\n"
    calls_super = bare.replace("return batch", "return super()._forward_decode(batch)")
    for text, missing in ((bare, ("commit_after_verify", "record_decode_inputs")), (calls_super, ())):
        commit = _commit(remote, base, "dspark: a subclass", {SUB: text})
        assert copies.find(remote, base, commit, ours) == [copies.Copy(f"{WORKER}:DSparkWorkerV2", f"{SUB}:Sub",
                                                                       missing)]
    assert copies.find(remote, base, remote.rev_parse("header"), ours) == []  # nothing copied there


def test_a_near_copy_of_the_patched_worker_without_the_hooked_method_names_the_method(remote, ours):
    """Issue 38: upstream adds the worker's class, all but the method we patch, beside other code (not a file copy)."""
    base = remote.rev_parse("v0.5.23")
    worker = remote.blob(base, WORKER).decode()
    cls = next(n for n in ast.parse(worker).body if isinstance(n, ast.ClassDef) and n.name == "DSparkWorkerV2")
    fn = next(n for n in cls.body if getattr(n, "name", "") == "_forward_decode")
    lines = worker.splitlines(keepends=True)
    start = min([fn.lineno, *(d.lineno for d in fn.decorator_list)])
    lean = "".join(lines[cls.lineno - 1:start - 1] + lines[fn.end_lineno:cls.end_lineno])
    lean = lean.replace("class DSparkWorkerV2(", "class DSparkLeanWorker(", 1)
    home = remote.blob(base, CONFIG).decode()

    def found(text: str) -> list[copies.Copy]:
        return copies.find(remote, base, _commit(remote, base, "dspark: a lean worker", {CONFIG: f"{home}\n\n{text}"}),
                           ours)

    [near] = found(lean)
    assert near == copies.Copy(f"{WORKER}:DSparkWorkerV2", f"{CONFIG}:DSparkLeanWorker",
                               ("commit_after_verify", "record_decode_inputs"), (), ("_forward_decode",))
    assert str(near) == (f"upstream copies {WORKER}:DSparkWorkerV2 as {CONFIG}:DSparkLeanWorker, which drops our "
                         "patched method(s) _forward_decode and lacks our hook(s) commit_after_verify, "
                         "record_decode_inputs")
    fourth = [n for n in cls.body if isinstance(n, ast.FunctionDef)][3]
    assert found("".join(lines[cls.lineno - 1:fourth.end_lineno])) == []  # four of its methods: not a near-copy


def _utf7(name: str) -> str:
    """``name`` in UTF-7's base64 form: none of its letters is a byte of the file."""
    return "+" + base64.b64encode(name.encode("utf-16-be")).decode().rstrip("=") + "-"


def test_a_near_copy_whose_names_are_no_bytes_of_its_file_is_found(remote, ours):
    """A file in another coding (UTF-7, its names in base64) is read as Python reads it before it is passed over for
    not holding the names of a class we patch."""
    base = remote.rev_parse("v0.5.23")
    (worker,) = [p for p in ours if p.cls == "DSparkWorkerV2"]
    shadow = "# coding: utf-7\nclass DSparkShadowWorker:\n" + "".join(
        f"    def {_utf7(m)}(self):\n        pass\n" for m in sorted(worker.methods))
    assert not [m for m in worker.methods if m in shadow]
    path = "python/sglang/srt/speculative/dspark_components/dspark_shadow.py"
    [copy] = copies.find(remote, base, _commit(remote, base, "dspark: a shadow worker", {path: shadow}), ours)
    assert (copy.copy, copy.missing) == (f"{path}:DSparkShadowWorker", ("commit_after_verify", "record_decode_inputs"))


@pytest.mark.parametrize("tail", ["\ndef (:\n", "\nx = " + "-" * 5000 + "1\n"],
                         ids=["syntax", "too-deep"])  # too deep: ast.parse's RecursionError was a traceback
def test_a_copy_that_does_not_parse_is_named_not_a_crash(remote, ours, tail):
    base = remote.rev_parse("v0.5.23")
    commit = _commit(remote, base, "dspark: half a worker", {FAST: remote.blob(base, WORKER).decode() + tail})
    assert copies.find(remote, base, commit, ours) == [copies.Copy(WORKER, FAST, ("commit_after_verify",
                                                                                  "record_decode_inputs"))]


def test_watch_is_broken_by_the_copy_and_bisect_finds_the_commit(remote, tmp_path):
    run = invoke("watch", "--onto", "copied", "--repo", str(remote.git_dir), "--out", str(tmp_path / "out"),
                 "--series", str(REPO_ROOT), "--no-run")
    report = run.out
    assert run.code == EXIT["broken"] and report["outcome"] == "broken", (run.err, report.get("headline"))
    said = (f"upstream copies {WORKER} as {FAST} (the range adds SGLANG_DSPARK_FAST_WORKER), which lacks our hook(s) "
            "commit_after_verify, record_decode_inputs")
    assert report["contract"]["failing"][0] == said
    assert f"does not fit it: {said}" in report["headline"], report["headline"]  # first; other findings may follow
    found = report["bisect"]
    assert found["found"] and found["commit"] == remote.rev_parse("copied-commit"), found
    assert found["failing"][0] == said


def test_bisect_prints_a_copys_file_name_holding_a_newline_on_its_own_line(remote, tmp_path):
    """Helper 185: upstream names its copy of the worker with a line break in the file name: bisect's "first bad
    commit" block printed each finding through ``say`` as it was, so the name's second part ("## forged...") was a
    line of its own on the terminal (watch's report showed it as ⏎). Each finding is one line."""
    base = remote.rev_parse("v0.5.23")
    evil = FAST.replace("_fast.py", "_x\nforged: the series fits\n.py")
    wu.set_branch(remote, "copied-nl", _commit(remote, base, "dspark: a copy with a newline in its name", {
        evil: remote.blob(base, WORKER).decode().replace("class DSparkWorkerV2(", "class DSparkNlWorker(")}))
    run = invoke("bisect", "--onto", "copied-nl", "--repo", str(remote.git_dir), "--series", str(REPO_ROOT),
                 as_json=False)
    assert run.code == 0, run.err
    assert not any(x.startswith("forged") for x in run.text.splitlines()), run.text
    assert "_x ⏎ forged: the series fits ⏎ .py" in run.text, run.text


def test_watchs_report_files_hold_a_subjects_byte_that_is_not_utf8_as_valid_unicode(remote, tmp_path):
    """Helper 185: an upstream subject holding a byte that is not UTF-8 (0xff): `watch --json` printed it as U+FFFD,
    but watch-report.json and rebase-report.json under --out held the lone surrogate "\\udcff", which no strict
    reader takes. The files say it as --json does."""
    import json
    import os
    import subprocess

    ident = {"GIT_AUTHOR_NAME": "u", "GIT_AUTHOR_EMAIL": "u@x.invalid", "GIT_COMMITTER_NAME": "u",
             "GIT_COMMITTER_EMAIL": "u@x.invalid"}
    made = subprocess.run(["git", "--git-dir", str(remote.git_dir), "-c", "i18n.commitEncoding=binary",  # (git
                           "commit-tree", "v0.5.23^{tree}", "-p", "v0.5.23"],  # converts from none: the byte kept)
                          input=b"bad \xff byte\n", capture_output=True, check=True, env={**os.environ, **ident})
    commit = made.stdout.decode().strip()
    wu.set_branch(remote, "not-utf8", commit)
    out = tmp_path / "out"
    run = invoke("watch", "--onto", "not-utf8", "--repo", str(remote.git_dir), "--out", str(out), "--series",
                 str(REPO_ROOT), "--no-run")
    assert run.code == EXIT["unchecked"], run.err
    for name in ("watch-report.json", "rebase-report.json"):
        text = (out / name).read_text()
        assert "\\udcff" not in text and "bad \\ufffd byte" in text, name
        json.dumps(json.loads(text), ensure_ascii=False).encode()  # (a lone surrogate: UnicodeEncodeError)


def _probe_rejecting_the_marker(root: Path, git: Git, head: str, **kw) -> tuple[bool | None, str]:
    """nvcc as it would answer a header upstream broke: fails where math.cuh holds the marker."""
    broken = b"PROBE_REJECTS" in (git.blob(head, HEADER) or b"")
    return (False, "probe failed to compile: math.cuh") if broken else (True, "probe compiles")


def test_bisect_runs_the_nvcc_probe_watch_judged_by(remote, tmp_path, monkeypatch):
    monkeypatch.setattr(contract_cxx, "probe", _probe_rejecting_the_marker)
    run = invoke("watch", "--onto", "header", "--repo", str(remote.git_dir), "--out", str(tmp_path / "out"),
                 "--series", str(REPO_ROOT), "--no-run")
    assert run.code == EXIT["broken"], (run.err, run.out.get("headline"))
    assert run.out["contract"]["failing"] == ["C++: probe failed to compile: math.cuh"]
    found = run.out["bisect"]
    assert found["found"] and found["commit"] == remote.rev_parse("header-commit"), found
    assert found["failing"] == ["C++: probe failed to compile: math.cuh"]
    again = bisect_ops.bisect(SERIES, str(remote.git_dir), "header")
    assert (again["commit"], again["failing"]) == (found["commit"], found["failing"])


def test_a_copy_that_keeps_our_hooks_is_a_warning_printed_first_never_clean(remote, ours, tmp_path, monkeypatch):
    """And watch reads the hooks from the branch it applied, without replaying the series (copies.patched)."""
    found = copies.find(remote, remote.rev_parse("v0.5.23"), remote.rev_parse("hooked"), ours)
    said = f"upstream copies {WORKER} as {FAST}, which has our hooks: check that the path selecting it runs them"
    assert [str(c) for c in found] == [said] and not found[0].missing
    monkeypatch.setattr(copies, "patched", lambda *a, **k: pytest.fail("watch replayed the series to find our hooks"))
    run = invoke("watch", "--onto", "hooked", "--repo", str(remote.git_dir), "--out", str(tmp_path / "out"),
                 "--series", str(REPO_ROOT), "--no-run")
    assert run.code == EXIT["unchecked"] and run.out["unchecked"][0] == said, (run.err, run.out.get("headline"))
    assert run.out["contract"]["copies"] == [said]
    assert run.out["contract"]["failing"] == [] and run.out["headline"].endswith(f"not checked here: {said}; " +
                                                                                  "; ".join(run.out["unchecked"][1:]))
    head = (tmp_path / "out" / "watch-report.md").read_text().split("\n## ", 1)[0]
    assert head.splitlines()[4] == f"**warning**: {inert(said)}"


def test_the_blob_reader_is_closed_when_the_search_fails(remote, ours, monkeypatch):
    """``find``'s ``git cat-file --batch`` ends with it, also when reading a file raises (it was left running)."""
    closed, close = [], copies.BlobBatch.close
    monkeypatch.setattr(copies.BlobBatch, "close", lambda self: closed.append(self._proc is not None) or close(self))

    def boom(text):
        raise RuntimeError("a file it cannot read")

    monkeypatch.setattr(copies, "_names", boom)
    with pytest.raises(RuntimeError, match="a file it cannot read"):
        copies.find(remote, remote.rev_parse("v0.5.23"), remote.rev_parse("copied"), ours)
    assert closed == [True]


def test_an_env_declared_with_its_type_is_named_as_the_switch(remote, ours):
    """``SGLANG_X: EnvBool = EnvBool(False)`` declares an env as ``SGLANG_X = EnvBool(False)`` does."""
    base = remote.rev_parse("v0.5.23")
    worker, environ = remote.blob(base, WORKER).decode(), remote.blob(base, ENVIRON).decode()
    anchor = "    SGLANG_DSPARK_SIMULATE_FOLD = EnvBool(False)\n"
    commit = _commit(remote, base, "dspark: a fast worker behind a typed env", {
        FAST: worker.replace("class DSparkWorkerV2(", "class DSparkFastWorker("),
        ENVIRON: environ.replace(anchor, anchor + "    SGLANG_DSPARK_FAST_WORKER: EnvBool = EnvBool(False)\n", 1)})
    [copy] = copies.find(remote, base, commit, ours)
    assert copy.switches == ("SGLANG_DSPARK_FAST_WORKER",)


COMPRESSOR = "python/sglang/srt/layers/attention/dsv4/compressor_v2.py"
FUSED = "python/sglang/srt/layers/attention/dsv4/compressor_fused.py"
BACKEND = "python/sglang/srt/layers/attention/deepseek_v4_backend.py"


def _function(source: str, cls: str, name: str) -> ast.FunctionDef:
    """``cls.name`` (``cls`` ``""``: module level) in ``source``."""
    body = ast.parse(source).body
    scope = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == cls).body if cls else body
    return next(n for n in scope if isinstance(n, ast.FunctionDef) and n.name == name)


def _text(source: str, fn: ast.FunctionDef) -> str:
    return "".join(source.splitlines(keepends=True)[fn.lineno - 1:fn.end_lineno])


def test_a_method_copy_in_the_patched_class_behind_a_new_env_is_broken_and_bisect_finds_it(remote, ours, tmp_path):
    """Upstream adds ``_forward_decode_pipelined``, a copy of the hooked ``_forward_decode`` in its own class, which
    hands off to it when a new (typed) env is on: no new file or class, yet its path runs without our hooks."""
    base = remote.rev_parse("v0.5.23")
    worker, environ = remote.blob(base, WORKER).decode(), remote.blob(base, ENVIRON).decode()
    fn = _function(worker, "DSparkWorkerV2", "_forward_decode")
    original = _text(worker, fn)
    copy = original.replace("def _forward_decode(", "def _forward_decode_pipelined(", 1)
    first = ast.unparse(fn.body[0]).splitlines()[0]
    hand_off = original.replace(f"        {first}\n", "        if envs.SGLANG_PIPELINED_SPEC_DECODE.get():\n"
                                "            return self._forward_decode_pipelined(batch)\n"
                                f"        {first}\n", 1)
    assert hand_off != original
    text = worker.replace(original, hand_off + "\n" + copy, 1)
    anchor = "    SGLANG_DSPARK_SIMULATE_FOLD = EnvBool(False)\n"
    commit = _commit(remote, base, "dspark worker: pipelined decode step behind SGLANG_PIPELINED_SPEC_DECODE", {
        WORKER: text, ENVIRON: environ.replace(anchor, anchor + "    SGLANG_PIPELINED_SPEC_DECODE: EnvBool = "
                                                               "EnvBool(False)\n", 1)})
    at = _function(text, "DSparkWorkerV2", "_forward_decode_pipelined").lineno
    hooks = ("commit_after_verify", "record_decode_inputs")
    said = (f"upstream copies {WORKER}:{fn.lineno}:DSparkWorkerV2._forward_decode as "
            f"{WORKER}:{at}:DSparkWorkerV2._forward_decode_pipelined (the range adds SGLANG_PIPELINED_SPEC_DECODE), "
            f"which lacks our hook(s) {', '.join(hooks)}")
    assert [str(c) for c in copies.find(remote, base, commit, ours)] == [said]
    wu.set_branch(remote, "pipelined", wu.unrelated(remote, commit))
    run = invoke("watch", "--onto", "pipelined", "--repo", str(remote.git_dir), "--out", str(tmp_path / "out"),
                 "--series", str(REPO_ROOT), "--no-run")
    assert run.code == EXIT["broken"] and run.out["contract"]["failing"][0] == said, (run.err, run.out["headline"])
    assert (run.out["bisect"]["commit"], run.out["bisect"]["failing"][0]) == (commit, said), run.out["bisect"]


def test_a_module_level_function_copy_of_a_patched_method_is_broken(remote, ours):
    """Upstream adds ``compressor_fused.forward_compress_fused``, the hooked ``_forward_compress_all_in_one`` as a
    free function (``self`` its first argument) behind a new env; fit_check (each bisect step) is broken by it."""
    base = remote.rev_parse("v0.5.23")
    compressor, environ = remote.blob(base, COMPRESSOR).decode(), remote.blob(base, ENVIRON).decode()
    fn = _function(compressor, "CompressorBackendMixin", "_forward_compress_all_in_one")
    free = textwrap.dedent(_text(compressor, fn)).replace("def _forward_compress_all_in_one(",
                                                           "def forward_compress_fused(", 1)
    module = '"""The compressor\'s all-in-one step as one free function."""\n\nfrom __future__ import annotations\n\n\n'
    anchor = "    SGLANG_DSPARK_SIMULATE_FOLD = EnvBool(False)\n"
    commit = _commit(remote, base, "dsv4 compressor: fused free-function path", {
        FUSED: module + free,
        ENVIRON: environ.replace(anchor, anchor + "    SGLANG_OPT_FUSED_COMPRESS_PATH = EnvBool(False)\n", 1)})
    at = _function(module + free, "", "forward_compress_fused").lineno
    said = (f"upstream copies {COMPRESSOR}:{fn.lineno}:CompressorBackendMixin._forward_compress_all_in_one as "
            f"{FUSED}:{at}:forward_compress_fused (the range adds SGLANG_OPT_FUSED_COMPRESS_PATH), which lacks our "
            "hook(s) compress_fn")
    assert [str(c) for c in copies.find(remote, base, commit, ours)] == [said]
    fit = bisect_ops.fit_check(SERIES, remote, base, commit, contract.patched_tree(SERIES, remote, "fused", commit),
                               ours)
    assert fit["broken"] and fit["failing"][0] == said, fit["failing"]


def test_a_copy_put_above_the_patched_method_takes_our_hunk_and_the_original_is_named(remote, ours):
    """Helper 94's c2: upstream copies ``_build_forward_metadata`` as ``_build_forward_metadata_legacy`` right above
    it; git applies our hunk at an offset, into the copy. The copy was said to lack our hook (the wrong fix): it is
    the original, the one that runs, that lacks it."""
    base = remote.rev_parse("v0.5.23")
    backend = remote.blob(base, BACKEND).decode()
    fn = _function(backend, "DeepseekV4AttnBackend", "_build_forward_metadata")
    original = _text(backend, fn)
    legacy = original.replace("def _build_forward_metadata(", "def _build_forward_metadata_legacy(", 1)
    commit = _commit(remote, base, "dsv4 backend: keep the legacy metadata builder",
                     {BACKEND: backend.replace(original, legacy + "\n" + original, 1)})
    head = contract.patched_tree(SERIES, remote, "legacy", commit)
    fit = bisect_ops.fit_check(SERIES, remote, base, commit, head, ours)
    assert fit["broken"], fit
    said = [f for f in fit["failing"] if "_build_forward_metadata_legacy" in f]
    assert len(said) == 1 and said[0].startswith("our hook(s) prepare_verify landed in upstream's copy "
                                                 f"{BACKEND}:{fn.lineno}:DeepseekV4AttnBackend._build_forward_metadata"
                                                 "_legacy (the patch applied at an offset into it), not in "
                                                 f"{BACKEND}:{fn.lineno}:DeepseekV4AttnBackend._build_forward_metadata,"
                                                 ), said
