"""The series' API contract (c128patch contract; ops.contract): on the four real releases it holds
against the committed lock, which refresh keeps a fixed point; on upstream drift built in the test
as commits on top of the real v0.5.23 (a callee's signature changed with upstream's callers
updated, an imported module renamed, two same-kind parameters swapped or a NamedTuple's fields reordered (our
positional call's arguments land elsewhere), an env attribute we read removed, a device helper's parameters
reordered, a header removed, code that does not parse) it is broken, naming our line and upstream's definition;
`watch` says `broken` (exit 7); a parameter added with a default is a note, a renamed one a warning to review."""

from __future__ import annotations

import ast
import contextlib
import gc
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

import watch_upstream as wu
from c128patch.fit import contract, contract_cxx
from c128patch.fit.resolve import Upstream, walk
from c128patch.fit.watch import EXIT
from c128patch.git import Git
from c128patch.ops.lint import update_hashes
from c128patch.series.contract import Lock, LockItem, lock_path, merged, read_lock
from c128patch.series.manifest import load_series
from support import RELEASES, REPO_ROOT, copy_series, invoke, tier_unchecked, upstream_commit

SPEC_UTILS = "python/sglang/srt/speculative/spec_utils.py"
ENVIRON = "python/sglang/srt/environ.py"
DSV4_UTILS = "python/sglang/kernels/ops/attention/dsv4/utils.py"
UTILS_CUH = "python/sglang/kernels/jit/include/sgl_kernel/utils.cuh"
VEC_CUH = "python/sglang/kernels/jit/include/sgl_kernel/vec.cuh"
RECORD_STREAMS = "overlay/sglang/srt/speculative/dspark_components/c128_record_streams.py"
KERNEL_OPS = "overlay/sglang/kernels/ops/attention/dsv4/online_c128_dspark.py"
COMPRESS_OPS = "python/sglang/kernels/ops/attention/dsv4/compress.py"
CUH = "csrc/deepseek_v4/online_c128_dspark.cuh"
C128_ONLINE = "python/sglang/kernels/jit/csrc/deepseek_v4/c128_online_v2.cuh"
C128_MTP = "python/sglang/kernels/jit/csrc/deepseek_v4/online_c128_mtp.cuh"
STATE_ROW = "the online c128 state row [max | sum | kv] our kernel reads and writes"


def _line(path: str, text: str) -> int:
    """The line of ``path`` (in this repository) that holds ``text``: the findings name our lines."""
    return next(i for i, line in enumerate((REPO_ROOT / path).read_text().splitlines(), 1) if text in line)


MAKE_NAME_LINE = _line(KERNEL_OPS, "import make_name")
VEC_INCLUDE_LINE = _line(CUH, "#include <sgl_kernel/vec.cuh>")


def _put(idx: Git, path: str, text: str | None) -> None:
    if text is None:
        idx.run("update-index", "--index-info", input=f"0 {'0' * 40}\t{path}\n")
        return
    blob = idx.out("hash-object", "-w", "--stdin", input=text)
    idx.run("update-index", "--add", "--cacheinfo", f"100644,{blob},{path}")


def _edit(git: Git, subject: str, changes, parent: str = "v0.5.23") -> str:
    """An upstream commit on ``parent``: ``changes(text_of) -> {path: new text or None}``."""
    def text_of(path: str) -> str:
        return git.blob(parent, path).decode()

    def edit(idx: Git) -> None:
        for path, text in changes(text_of).items():
            _put(idx, path, text)

    return upstream_commit(git, parent, subject, edit)


def _callers(git: Git, name: str) -> list[str]:
    out = git.out("grep", "-l", "-w", name, "v0.5.23", "--", "python/sglang")
    return [line.split(":", 1)[1] for line in out.splitlines()]


def signature_changed(git: Git, parent: str = "v0.5.23") -> str:
    """record_stream_for_v2_verify(batch, verify_input, fwd_stream) -> (batch, fwd_stream, *, verify_input=None),
    upstream's own callers updated."""
    def changes(text_of):
        out = {}
        for path in _callers(git, "record_stream_for_v2_verify"):
            text = text_of(path).replace("def record_stream_for_v2_verify(batch, verify_input, fwd_stream):",
                                         "def record_stream_for_v2_verify(batch, fwd_stream, *, verify_input=None):")
            text = re.sub(r"(?<!def )record_stream_for_v2_verify\((\w+), (\w+), (\w+)\)",
                          r"record_stream_for_v2_verify(\1, \3, verify_input=\2)", text)
            out[path] = text
        assert "fwd_stream, *, verify_input=None" in out[SPEC_UTILS]
        return out
    return _edit(git, "spec_utils: verify_input becomes keyword-only", changes, parent)


def chain(git: Git) -> tuple[str, str]:
    """Three upstream commits on v0.5.23: a comment, the signature change, another comment; (the change, the tip)."""
    first = wu.unrelated(git)
    change = signature_changed(git, first)
    tip = wu.unrelated(git, change)
    return change, tip


def module_renamed(git: Git) -> str:
    """kernels/ops/attention/dsv4/utils.py -> naming.py, upstream's importers updated."""
    old, new = "sglang.kernels.ops.attention.dsv4.utils", "sglang.kernels.ops.attention.dsv4.naming"

    def changes(text_of):
        out = {p: text_of(p).replace(old, new) for p in _callers(git, "make_name") if old in text_of(p)}
        out[DSV4_UTILS.replace("utils.py", "naming.py")] = text_of(DSV4_UTILS)
        out[DSV4_UTILS] = None
        return out
    return _edit(git, "dsv4: rename utils to naming", changes)


def params_swapped(git: Git) -> str:
    """record_stream_each(tensors, stream) -> (stream, tensors), upstream's callers updated: same arity."""
    def changes(text_of):
        out = {}
        for path in _callers(git, "record_stream_each"):
            text = text_of(path).replace("def record_stream_each(tensors, stream):",
                                         "def record_stream_each(stream, tensors):")
            text = re.sub(r"(?<!def )record_stream_each\(([^()]*(?:\([^()]*\))?[^()]*?), (\w+)\)",
                          r"record_stream_each(\2, \1)", text)
            out[path] = text
        return out
    return _edit(git, "spec_utils: record_stream_each takes the stream first", changes)


def param_renamed(git: Git) -> str:
    """record_stream_each(tensors, stream) -> (tensors, cuda_stream): our positional call lands as before."""
    return _edit(git, "spec_utils: record_stream_each's stream is cuda_stream", lambda text_of: {
        SPEC_UTILS: text_of(SPEC_UTILS).replace("def record_stream_each(tensors, stream):",
                                                "def record_stream_each(tensors, cuda_stream):").replace(
            "        t.record_stream(stream)", "        t.record_stream(cuda_stream)")})


def param_added(git: Git) -> str:
    """record_stream_for_v2_verify gains a trailing ``extra_tensors=()`` (helper 130's H1): harmless to our call."""
    return _edit(git, "spec_utils: record_stream_for_v2_verify takes extra tensors", lambda text_of: {
        SPEC_UTILS: text_of(SPEC_UTILS).replace("def record_stream_for_v2_verify(batch, verify_input, fwd_stream):",
                                                "def record_stream_for_v2_verify(batch, verify_input, fwd_stream, "
                                                "extra_tensors=()):")})


def fields_reordered(git: Git) -> str:
    """CompressorPrefillPlan's plan_c and plan_w fields swap (helper 130's B3): our op builds it by position."""
    lines = ("    plan_c: torch.Tensor  # [num_q_tokens, 16] uint8 --- CompressPlan\n",
             "    plan_w: torch.Tensor  # [num_q_tokens,  8] uint8 --- WritePlan\n")
    return _edit(git, "compress: plan_w before plan_c", lambda text_of: {
        COMPRESS_OPS: text_of(COMPRESS_OPS).replace(lines[0] + lines[1], lines[1] + lines[0])})


def keyword_swallowed(git: Git) -> str:
    """load_jit's cuda_wrappers= renamed cuda_exports=, beside a new **options (helper 131's C5): our call binds, its
    cuda_wrappers= dropped into **options (a JIT module with no exports)."""
    loader = "python/sglang/kernels/jit/utils/compile/loader.py"
    return _edit(git, "jit loader: cuda_exports, **options", lambda text_of: {
        loader: text_of(loader).replace("    cuda_wrappers: List[Tuple[str, str]] | None = None,\n",
                                        "    cuda_exports: List[Tuple[str, str]] | None = None,\n", 1).replace(
            "    header_only: bool = True,\n) -> Module:",
            "    header_only: bool = True,\n    **options,\n) -> Module:", 1)})


def attr_removed(git: Git) -> str:
    """SGLANG_RAGGED_VERIFY_MODE is no longer declared on envs."""
    return _edit(git, "environ: drop SGLANG_RAGGED_VERIFY_MODE", lambda text_of: {
        ENVIRON: re.sub(r"^\s+SGLANG_RAGGED_VERIFY_MODE = .*\n", "", text_of(ENVIRON), count=1, flags=re.M)})


def helper_reordered(git: Git) -> str:
    """host::LaunchKernel(dim3 grid_dim, dim3 block_dim, ...) -> (dim3 block_dim, dim3 grid_dim, ...):
    the same types, so it still compiles: only the text shows it."""
    def changes(text_of):
        text = text_of(UTILS_CUH)
        new = text.replace("      dim3 grid_dim,\n      dim3 block_dim,",
                           "      dim3 block_dim,\n      dim3 grid_dim,", 1)
        assert new != text
        return {UTILS_CUH: new}
    return _edit(git, "LaunchKernel: block before grid", changes)


def get_renamed(git: Git) -> str:
    """The env fields' ``get()`` becomes ``value()``: every ``envs.X.get()`` of ours stops working."""
    def changes(text_of):
        text = text_of(ENVIRON)
        assert text.count("    def get(self) -> Any:") >= 2
        return {ENVIRON: text.replace("    def get(self) -> Any:", "    def value(self) -> Any:")}
    return _edit(git, "environ: get() is value() now", changes)


def header_removed(git: Git) -> str:
    return _edit(git, "drop vec.cuh", lambda text_of: {VEC_CUH: None})


def unparsable(git: Git) -> str:
    return _edit(git, "spec_utils: a syntax error",
                 lambda text_of: {SPEC_UTILS: text_of(SPEC_UTILS) + "def broken(:\n"})


def pathological(git: Git) -> str:
    """A default of a function we call nested past what ``ast.unparse`` recurses through (it parses)."""
    deep = " | ".join(["int"] * 900)
    was = "def record_stream_for_v2_verify(batch, verify_input, fwd_stream"
    return _edit(git, "spec_utils: a pathological default",
                 lambda text_of: {SPEC_UTILS: text_of(SPEC_UTILS).replace(f"{was}):", f"{was}={deep}):")})


def row_reordered(git: Git) -> str:
    """Upstream's online c128 state row becomes ``[kv | max | sum]``: only the literal slot offsets of its kernel
    body say so (helper 106's case 5): nothing the contract resolves changes."""
    def changes(text_of):
        text = text_of(C128_ONLINE)
        for old, new in (("max_score_vec = gmem.load(kv_load_buf, 0)", "max_score_vec = gmem.load(kv_load_buf, 1)"),
                         ("sum_score_vec = gmem.load(kv_load_buf, 1)", "sum_score_vec = gmem.load(kv_load_buf, 2)"),
                         ("old_kv_vec = gmem.load(kv_load_buf, 2)", "old_kv_vec = gmem.load(kv_load_buf, 0)"),
                         ("gmem.store(kv_store_buf, out_max_vec, 0)", "gmem.store(kv_store_buf, out_max_vec, 1)"),
                         ("gmem.store(kv_store_buf, out_sum_vec, 1)", "gmem.store(kv_store_buf, out_sum_vec, 2)"),
                         ("gmem.store(kv_store_buf, out_kv_vec, 2)", "gmem.store(kv_store_buf, out_kv_vec, 0)")):
            assert text.count(old) == 1, old
            text = text.replace(old, new)
        return {C128_ONLINE: text}
    return _edit(git, "c128 online: the state row as [kv | max | sum]", changes)


def mtp_removed(git: Git) -> str:
    return _edit(git, "drop online_c128_mtp.cuh", lambda text_of: {C128_MTP: None})


DRIFT = {"signature": signature_changed, "renamed": module_renamed, "swapped": params_swapped,
         "attr-removed": attr_removed, "get-renamed": get_renamed, "helper-reordered": helper_reordered,
         "header-removed": header_removed,
         "unparsable": unparsable, "pathological": pathological, "row-reordered": row_reordered,
         "mtp-removed": mtp_removed, "param-renamed": param_renamed, "param-added": param_added,
         "fields-reordered": fields_reordered, "keyword-swallowed": keyword_swallowed}


@pytest.fixture(scope="session")
def drift(sglang_release_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Git:
    git = wu.stand_in(sglang_release_repo, tmp_path_factory.mktemp("contract-remote") / "sglang.git")
    for branch, make in DRIFT.items():
        wu.set_branch(git, branch, make(git))
    wu.set_branch(git, "moved", wu.method_moved(git))
    change, tip = chain(git)
    wu.set_branch(git, "chain-change", change)
    wu.set_branch(git, "chain", tip)
    return git


def run_contract(rev: str, *args: str, repo: Git | None = None, series: Path = REPO_ROOT):
    extra = ["--repo", str(repo.git_dir)] if repo is not None else []
    return invoke("contract", "--sglang-rev", rev, *extra, "--series", str(series), "--no-nvcc", *args)


def findings(run, level: str) -> list[str]:
    [rev] = run.out["revs"]
    return [f["message"] for f in rev["findings"] if f["level"] == level]


# -- the real releases ------------------------------------------------------------------------


@pytest.mark.parametrize("rev", RELEASES)
def test_the_contract_holds_on_every_supported_release(rev):
    run = run_contract(rev)
    assert run.code == 0, (run.err, findings(run, "error"), findings(run, "warning"))
    [result] = run.out["revs"]
    assert result["verdict"].startswith("holds: ")
    assert result["errors"] == result["warnings"] == result["unchecked"] == 0
    kinds = {i["kind"] for i in result["items"]}
    assert {"function", "class", "method", "env", "value", "header", "cxx", "callback", "member", "typed", "mirror",
            "declared", "installed", "file"} <= kinds
    assert {i["target"] for i in result["items"] if i["kind"] == "file"} == {C128_ONLINE, C128_MTP}


def test_the_committed_lock_is_what_refresh_records_at_the_base(sglang_release_repo):
    series = load_series(REPO_ROOT)
    git = Git(git_dir=sglang_release_repo)
    commit = git.rev_parse(series.base)
    items = contract.lock_items(series, git, commit, contract.patched_tree(series, git, series.base, commit))
    old = read_lock(series.patches_dir)
    assert old is not None and old.base == series.base
    assert Lock(old.path, merged(items, old), series.base).text() == old.path.read_text()
    line = next(i for i in old.items if i.target.endswith("record_stream_for_v2_verify") and i.shape)
    assert (line.site, line.where, line.shape) == (f"{RECORD_STREAMS}:39", f"{SPEC_UTILS}:369", "3")
    assert line.signature == "def record_stream_for_v2_verify(batch, verify_input, fwd_stream)"


def test_the_derivation_leaves_the_collector_as_it_was_and_walks_in_ast_walks_order(sglang_release_repo):
    """The derivation holds Python's cyclic collector off and freezes what it built (a third of its time went to the
    collector's passes): on or off before, it is the same after; ``walk`` lists ``ast.walk``'s nodes in its order."""
    series = load_series(REPO_ROOT)
    git = Git(git_dir=sglang_release_repo)
    commit = git.rev_parse(series.base)
    head = contract.patched_tree(series, git, series.base, commit)
    for before in (False, True):
        (gc.enable if before else gc.disable)()
        try:
            contract.derive(series, git, commit, head)
            assert gc.isenabled() is before
        finally:
            gc.enable()
    tree = ast.parse(git.blob(commit, SPEC_UTILS).decode())
    assert all(a is b for a, b in zip(walk(tree), ast.walk(tree), strict=True))


def test_refresh_check_keeps_the_lock_a_fixed_point_and_rewrites_a_stale_one(sglang_release_repo, tmp_path):
    series = copy_series(tmp_path / "series")
    tree = tmp_path / "tree"
    assert invoke("apply", "--sglang-rev", "v0.5.23", "--repo", str(sglang_release_repo), "--tree", str(tree),
                  "--series", str(series)).code == 0
    assert invoke("refresh", "--check", "--tree", str(tree), "--series", str(series)).code == 0
    lock = lock_path(series / "patches")
    committed = lock.read_text()
    lock.write_text("\n".join(l for l in committed.splitlines() if "record_stream_each" not in l) + "\n")
    run = invoke("refresh", "--check", "--tree", str(tree), "--series", str(series))
    assert run.code == 1 and run.out["changed"] == ["patches/contract.lock"]
    assert invoke("refresh", "--tree", str(tree), "--series", str(series)).code == 0
    assert lock.read_text() == committed


# -- drift built on v0.5.23 ---------------------------------------------------------------------


def test_a_callee_whose_signature_changed_does_not_bind(drift):
    run = run_contract("signature", repo=drift)
    assert run.code == 1
    [error] = findings(run, "error")
    assert error.startswith(f"{RECORD_STREAMS}:39: call sglang.srt.speculative.spec_utils.record_stream_for_v2_verify"
                            f"(arg1, arg2, arg3) does not bind to {SPEC_UTILS}:369 "
                            "`def record_stream_for_v2_verify(batch, fwd_stream, *, verify_input=None)`: ")
    assert "too many positional arguments" in error
    [warning] = findings(run, "warning")
    assert "`def record_stream_for_v2_verify(batch, verify_input, fwd_stream)` at v0.5.23, now" in warning


def test_a_renamed_imported_module_is_missing(drift):
    run = run_contract("renamed", repo=drift)
    assert run.code == 1
    errors = findings(run, "error")
    said = (f"{KERNEL_OPS}:{MAKE_NAME_LINE}: sglang.kernels.ops.attention.dsv4.utils.make_name: no module "
            "sglang.kernels.ops.attention.dsv4.utils on this tree "
            "(python/sglang/kernels/ops/attention/dsv4/__init__.py "
            "defines no utils)")
    assert said in errors


def test_two_swapped_parameters_of_the_same_arity_are_an_error_at_our_call(drift):
    """Our positional call still binds, each argument to the other parameter: an error at the call (not the import),
    which --accept never records (test_accept_never_records_a_call_whose_arguments_land_elsewhere)."""
    run = run_contract("swapped", repo=drift)
    assert run.code == 1 and findings(run, "warning") == []
    [error] = findings(run, "error")
    call = _line(RECORD_STREAMS, "    record_stream_each(")  # the call, not the import
    assert error.startswith(f"{RECORD_STREAMS}:{call}: our call of sglang.srt.speculative.spec_utils."
                            "record_stream_each binds differently now (arg1 went to tensors, now to stream; "
                            "change our call): "
                            f"sglang.srt.speculative.spec_utils.record_stream_each changed since the lock: "
                            f"{SPEC_UTILS}:358 `def record_stream_each(tensors, stream)` at v0.5.23, "
                            f"now {SPEC_UTILS}:358 `def record_stream_each(stream, tensors)`"), error


@pytest.mark.parametrize("branch, said", [
    # helper 130's B3: a NamedTuple's fields reordered, our op building it by position
    ("fields-reordered", f"{KERNEL_OPS}:207: our call of sglang.kernels.ops.attention.dsv4.compress."
                         "CompressorPrefillPlan binds differently now (arg2 went to plan_c, now to plan_w; "),
    # helper 131's C5: a keyword of ours only **kwargs takes now (dropped there)
    ("keyword-swallowed", f"{KERNEL_OPS}:69: our call of sglang.kernels.jit.utils.compile.loader.load_jit binds "
                          "differently now (cuda_wrappers= went to cuda_wrappers, now to **options; "),
], ids=["fields-reordered", "keyword-swallowed"])
def test_a_call_of_ours_whose_argument_lands_elsewhere_is_an_error_at_it(drift, branch: str, said: str):
    run = run_contract(branch, repo=drift)
    assert run.code == 1
    [error] = findings(run, "error")
    assert error.startswith(said + "change our call): "), error


def test_a_parameter_added_with_a_default_is_a_note_and_the_contract_holds(drift):
    """Helper 130's H1 was `broken`: a trailing parameter with a default changes nothing our calls bind."""
    run = run_contract("param-added", repo=drift)
    assert run.code == 0 and run.out["ok"], run.out
    assert findings(run, "error") == findings(run, "warning") == []
    [note] = [n for n in findings(run, "note") if "record_stream_for_v2_verify changed since the lock" in n]
    assert note.endswith("`def record_stream_for_v2_verify(batch, verify_input, fwd_stream, extra_tensors=())`: "
                         "parameters only added, with defaults (each call binds as at the base)"), note


def test_a_renamed_parameter_our_call_passes_by_position_is_a_warning_to_review(drift):
    run = run_contract("param-renamed", repo=drift)
    assert run.code == 1 and findings(run, "error") == []
    [warning] = findings(run, "warning")
    assert "`def record_stream_each(tensors, stream)` at v0.5.23, now" in warning, warning
    assert "`def record_stream_each(tensors, cuda_stream)`" in warning, warning


def test_an_env_attribute_we_read_that_upstream_removed_is_an_error(drift):
    run = run_contract("attr-removed", repo=drift)
    assert run.code == 1
    [error] = findings(run, "error")
    assert re.match(r"overlay/sglang/srt/layers/attention/dsv4/online_c128_dspark_rules.py:\d+: "
                    r"sglang.srt.environ.envs.SGLANG_RAGGED_VERIFY_MODE: class Envs "
                    r"\(python/sglang/srt/environ.py:\d+\) "
                    r"has no SGLANG_RAGGED_VERIFY_MODE$", error), error


def test_a_device_helper_with_reordered_parameters_is_flagged(drift):
    run = run_contract("helper-reordered", repo=drift)
    assert run.code == 1 and findings(run, "error") == []
    [warning] = findings(run, "warning")
    assert warning.startswith(f"{CUH}:") and " LaunchKernel changed since the lock: " in warning
    assert ("LaunchKernel( dim3 grid_dim, dim3 block_dim," in warning
            and "LaunchKernel( dim3 block_dim, dim3 grid_dim," in warning)


def test_a_removed_header_is_one_line_error(drift):
    run = run_contract("header-removed", repo=drift)
    assert run.code == 1
    assert (f"{CUH}:{VEC_INCLUDE_LINE}: #include <sgl_kernel/vec.cuh>: no {VEC_CUH} on this tree"
            in findings(run, "error"))


def test_upstream_code_that_does_not_parse_is_an_error_not_a_pass(drift):
    run = run_contract("unparsable", repo=drift)
    assert run.code == 1
    errors = findings(run, "error")
    assert any(e.endswith(f"{SPEC_UTILS}: does not parse: invalid syntax") or "does not parse" in e for e in errors)
    assert not run.out["revs"][0]["verdict"].startswith("holds")


def test_a_pathological_upstream_expression_is_one_line_never_a_traceback(drift):
    """Upstream text is read, never evaluated: nested past the recursion limit it was a RecursionError traceback."""
    run = run_contract("pathological", repo=drift)
    assert run.code in (1, 2) and "Traceback" not in run.err, run.err
    said = run.err.strip() if run.code == 2 else " ".join(findings(run, "error"))
    assert "nest" in said and "\n" not in said, said


def test_an_upstream_file_too_deep_to_build_does_not_parse_in_one_line():
    class Reader:
        files = {"python/sglang/deep.py"}

        def text(self, path):
            return "class A:\n    x: '" + " | ".join(["int"] * 20_000) + "'\n    y: " + " | ".join(["int"] * 20_000)

    up = Upstream(Reader(), {})
    assert up.parse("python/sglang/deep.py") is None
    assert "nests too deeply" in up.errors["python/sglang/deep.py"]


def test_the_inclusive_sum_swap_between_releases_is_flagged(sglang_release_repo, tmp_path):
    """The real 0.5.20 class: warp::inclusive_sum takes (lane_id, val) there and (val, lane_id) on v0.5.23,
    the same arity. A kernel of ours that used it is flagged on v0.5.20 against a lock made on v0.5.23."""
    series_root = copy_series(tmp_path / "series")
    cuh = series_root / CUH
    text = cuh.read_text().replace("#include <sgl_kernel/vec.cuh>\n",
                                   "#include <sgl_kernel/vec.cuh>\n#include <sgl_kernel/warp.cuh>\n", 1)
    cuh.write_text(text.replace("namespace device::dspark_c128 {\n",
                                "namespace device::dspark_c128 {\n\nSGL_DEVICE uint32_t scan(uint32_t v, "
                                "uint32_t lane) { return warp::inclusive_sum(v, lane); }\n", 1))
    series = load_series(series_root)
    update_hashes(series)
    series = load_series(series_root)
    git = Git(git_dir=sglang_release_repo)
    commit = git.rev_parse("v0.5.23")
    items = contract.lock_items(series, git, commit, contract.patched_tree(series, git, "v0.5.23", commit))
    old = read_lock(series.patches_dir)
    lock_path(series.patches_dir).write_text(Lock(old.path, merged(items, old), "v0.5.23").text())
    assert run_contract("v0.5.23", series=series_root).code == 0
    run = run_contract("v0.5.20", series=series_root)
    assert run.code == 1
    warnings = [w for w in findings(run, "warning") if "kWarpThreads" not in w]
    [warning] = [w for w in warnings if "inclusive_sum" in w] or [warnings]
    assert warning.startswith(f"{CUH}:") and " inclusive_sum changed since the lock: " in warning
    assert "inclusive_sum(uint32_t lane_id, uint32_t val)" in warning


def test_accept_records_a_reviewed_change_and_the_contract_holds_again(drift, tmp_path):
    series = copy_series(tmp_path / "series")
    assert run_contract("param-renamed", repo=drift, series=series).code == 1
    run = run_contract("param-renamed", "--accept", repo=drift, series=series)
    assert run.code == 0 and run.out["accepted"] >= 1
    assert run_contract("param-renamed", repo=drift, series=series).code == 0


@pytest.mark.parametrize("branch", ["swapped", "fields-reordered", "keyword-swallowed"])
def test_accept_never_records_a_call_whose_arguments_land_elsewhere(drift, tmp_path, branch):
    """Helper 130's B3: accepted, the reordered plan fields were `refreshed`, our op building the plan wrong."""
    series = copy_series(tmp_path / "series")
    before = (series / "patches" / "contract.lock").read_text()
    run = run_contract(branch, "--accept", repo=drift, series=series)
    assert run.code == 1 and not run.out["ok"] and run.out["accepted"] == 0
    assert "binds differently now" in findings(run, "error")[0]
    assert (series / "patches" / "contract.lock").read_text() == before


def test_accept_never_turns_a_call_that_no_longer_binds_into_holds(drift, tmp_path):
    series = copy_series(tmp_path / "series")
    before = (series / "patches" / "contract.lock").read_text()
    run = run_contract("signature", "--accept", repo=drift, series=series)
    assert run.code == 1 and not run.out["ok"] and run.out["accepted"] == 0
    [error] = findings(run, "error")
    assert error.startswith(f"{RECORD_STREAMS}:39: call ") and "does not bind" in error
    assert (series / "patches" / "contract.lock").read_text() == before


def test_accept_refuses_a_symlinked_lock_and_writes_nothing(drift, tmp_path):
    series = copy_series(tmp_path / "series")
    lock = series / "patches" / "contract.lock"
    victim = tmp_path / "victim.txt"
    victim.write_text(lock.read_text())
    lock.unlink()
    lock.symlink_to(victim)
    run = run_contract("param-renamed", "--accept", repo=drift, series=series)
    assert run.code == 2 and run.err.count("\n") <= 3 and "goes through the symlink patches/contract.lock" in run.err
    assert victim.read_text() == (REPO_ROOT / "patches" / "contract.lock").read_text() and lock.is_symlink()


def test_accept_waits_for_the_series_lock_and_keeps_the_change_another_writer_made(drift, tmp_path):
    """``contract --accept`` read the lock, checked, and wrote it back without the series folder's lock: another
    ``--accept`` or a ``refresh`` writing it meanwhile lost its change. It waits for the lock (``series.txn``'s) and
    adds its change to the lock as it is then."""
    series = copy_series(tmp_path / "series")
    lock = series / "patches" / "contract.lock"
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); "
                               "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.readline()",
                               str(series)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        accept = subprocess.Popen([sys.executable, "-m", "c128patch", "contract", "--sglang-rev", "param-renamed",
                                   "--repo", str(drift.git_dir), "--series", str(series), "--no-nvcc", "--accept"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        said = []  # its wait for the lock, said on stderr (jsonio._wait_for polls: no blocked flock in /proc/locks)
        while not said or "waiting for" not in said[-1] and said[-1]:
            said.append(accept.stderr.readline())
        assert accept.poll() is None and "another run holds its lock" in said[-1], \
            f"--accept wrote the lock while another writer held the series: {said}"
        text = lock.read_text()  # another writer's change, made while --accept waits
        lock.write_text(re.sub(r"(?m)^(config  device\.device  .*  sig=-)", r"\1,0123456789ab", text, count=1))
    finally:
        holder.communicate("\n", timeout=30)
    out, err = accept.communicate(timeout=240)
    assert accept.returncode == 0, "".join(said) + err
    after = lock.read_text()
    assert re.search(r"(?m)^config  device\.device  .*  sig=-,0123456789ab", after), after[:2000]
    assert after != text  # its own change too
    assert run_contract("param-renamed", repo=drift, series=series).code == 0


@contextlib.contextmanager
def unwritable(path: Path) -> Iterator[None]:
    """``path`` (a file of a series) not writable in place nor replaceable: the immutable flag for root, else the
    file and its folder read-only (skipped where neither can be had)."""
    if os.geteuid() == 0:
        if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
            pytest.skip("root, and chattr +i is not available here")
        undo = [["chattr", "-i", str(path)]]
    else:
        path.chmod(0o444)
        path.parent.chmod(0o555)
        undo = [["chmod", "755", str(path.parent)], ["chmod", "644", str(path)]]
    try:
        yield
    finally:
        for argv in undo:
            subprocess.run(argv, check=True)


def test_accept_into_a_lock_that_cannot_be_written_is_one_line_and_leaves_it_whole(drift, tmp_path):
    """A read-only (or full) series folder: ``--accept`` wrote the lock in place (``write_text``: a traceback, and on a
    full disk a cut lock); it is written whole or not at all, the failure one line."""
    series = copy_series(tmp_path / "series")
    lock = series / "patches" / "contract.lock"
    before = lock.read_bytes()
    with unwritable(lock):
        run = run_contract("param-renamed", "--accept", repo=drift, series=series)
    assert run.code == 2 and run.out["error"].startswith(f"cannot write {lock} ("), run.out
    assert lock.read_bytes() == before and sorted(p.name for p in lock.parent.iterdir()) == \
        sorted(p.name for p in (REPO_ROOT / "patches").iterdir())


def test_update_hashes_into_a_manifest_that_cannot_be_written_is_one_line(tmp_path):
    series = copy_series(tmp_path / "series")
    manifest = series / "patches" / "series.toml"
    before = manifest.read_bytes()
    with unwritable(manifest):
        run = invoke("lint", "--offline", "--update-hashes", "--series", series)
    assert run.code == 2 and run.out["error"].startswith(f"cannot write {manifest} ("), run.out
    assert manifest.read_bytes() == before


# -- bad input ----------------------------------------------------------------------------------


def test_no_nvcc_is_said_in_one_line(sglang_release_repo, monkeypatch, tmp_path):
    monkeypatch.setattr(contract_cxx, "nvcc", lambda: None)
    run = invoke("contract", "--sglang-rev", "v0.5.23", "--series", str(REPO_ROOT), as_json=False)
    assert run.code == 0
    assert "  C++: nvcc not found: C++ contract not checked (only the header text was compared)\n" in run.text
    forced = invoke("contract", "--sglang-rev", "v0.5.23", "--nvcc", "--series", str(REPO_ROOT), as_json=False)
    assert forced.code == 2 and forced.err.startswith("c128patch: error: nvcc not found: C++ contract not checked")


def test_no_tvm_ffi_names_the_install_at_the_version_the_tree_pins(sglang_release_repo, monkeypatch):
    """The fix printed installs the tvm-ffi sglang pins (v0.5.23's lock: its wheel's Requires-Dist), not the newest."""
    monkeypatch.setattr(contract_cxx, "nvcc", lambda: "/bin/echo")  # a compiler that is never reached
    monkeypatch.setitem(sys.modules, "tvm_ffi", None)  # not installed
    pin = next(line.split(" ", 1)[0] for line in (REPO_ROOT / "patches/env/v0.5.23.lock").read_text().splitlines()
               if line.startswith("apache-tvm-ffi=="))
    ok, line = contract_cxx.probe(REPO_ROOT, Git(sglang_release_repo), "v0.5.23", cached=False)
    assert ok is None and line == ("tvm-ffi not installed: C++ contract not compiled "
                                   f"({sys.executable} -m pip install {pin})")


def test_a_tree_without_provenance_is_refused_in_one_line(upstream_clone):
    run = invoke("contract", "--tree", str(upstream_clone), "--series", str(REPO_ROOT), "--no-nvcc")
    assert run.code == 2
    assert run.out["error"].startswith(f"no c128patch series is applied in {upstream_clone}")


def test_a_rev_the_series_does_not_apply_to_is_refused_in_one_line(drift):
    run = run_contract("moved", repo=drift)
    assert run.code == 2
    assert run.out["error"].startswith("the series does not apply on moved: c128-dspark-record-streams: conflict")


# -- watch --------------------------------------------------------------------------------------


@pytest.mark.parametrize("branch, says", [
    ("signature", f"{RECORD_STREAMS}:39: call sglang.srt.speculative.spec_utils.record_stream_for_v2_verify"),
    ("renamed", f"{KERNEL_OPS}:{MAKE_NAME_LINE}: sglang.kernels.ops.attention.dsv4.utils.make_name: no module"),
], ids=["signature", "renamed"])
def test_watch_says_broken_naming_our_line_and_the_upstream_definition(drift, tmp_path, branch, says):
    # --no-run: the contract is the subject (the behavioural tier is test_watch_behaviour's); broken outranks the
    # unchecked a tier not run leaves
    run = invoke("watch", "--onto", branch, "--repo", str(drift.git_dir), "--out", str(tmp_path / "out"),
                 "--series", str(REPO_ROOT), "--no-run")
    assert run.code == EXIT["broken"] == 7, run.err
    report = run.out
    assert report["outcome"] == "broken" and not report["ok"]
    assert any(f.startswith(says) for f in report["contract"]["failing"]), report["contract"]["failing"]
    assert report["headline"].startswith(f"series c128patch {load_series(REPO_ROOT).version} applies on {branch}@")
    assert report["next"][0].startswith(f"c128patch contract --sglang-rev {branch} --repo ")
    assert report["bisect"]["found"] and report["bisect"]["commit"] == drift.rev_parse(branch)
    md = (tmp_path / "out" / "watch-report.md").read_text()
    assert "## API contract" in md and says in md


# -- an upstream file our kernel mirrors with nothing to check (lock kind file) -------------------------------


def test_a_reordered_state_row_is_not_checked_until_its_diff_is_reviewed_and_accepted(drift, tmp_path):
    series = copy_series(tmp_path / "series")
    run = run_contract("row-reordered", repo=drift, series=series)
    assert run.code == 1 and not run.out["ok"], run.err
    [rev] = run.out["revs"]
    assert rev["verdict"].startswith("not checked: 1 upstream file(s) our code mirrors changed since the lock")
    assert rev["errors"] == rev["warnings"] == 0 and rev["unchecked"] == 1
    [line] = findings(run, "unchecked")
    assert line.startswith(f"{C128_ONLINE}: changed upstream since the lock (") and STATE_ROW in line
    assert f"our {CUH}:{_line(CUH, '[max | sum | kv]')} mirrors" in line
    diff, accept = re.search(r"review `(git [^`]+)`, then `(c128patch contract [^`]+)`$", line).groups()
    shown = subprocess.run(shlex.split(diff), capture_output=True, text=True, check=True).stdout  # as printed
    assert "-      max_score_vec = gmem.load(kv_load_buf, 0);" in shown
    assert "+      max_score_vec = gmem.load(kv_load_buf, 1);" in shown
    assert shlex.split(accept) == ["c128patch", "contract", "--sglang-rev", "row-reordered", "--repo",
                                   str(drift.git_dir), "--series", str(series), "--accept"]
    text = invoke("contract", "--sglang-rev", "row-reordered", "--repo", str(drift.git_dir), "--series", str(series),
                  "--no-nvcc", as_json=False)
    assert text.code == 1 and f"  not checked: {line}\n" in text.text
    run = invoke(*shlex.split(accept)[1:])  # as printed
    assert run.code == 0 and run.out["accepted"] == 1, run.out
    row = next(i for i in read_lock(series / "patches").items if i.kind == "file" and i.target == C128_ONLINE)
    assert row.sigs[1:] == (*row.sigs[1:-1], drift.out("rev-parse", f"row-reordered:{C128_ONLINE}"))
    run = run_contract("row-reordered", repo=drift, series=series)
    assert run.code == 0 and run.out["revs"][0]["verdict"].startswith("holds: ")


def test_a_mirrored_upstream_file_gone_is_broken(drift):
    run = run_contract("mtp-removed", repo=drift)
    assert run.code == 1
    assert any(e.startswith(f"{CUH}:") and f"{C128_MTP} is gone from this tree" in e and STATE_ROW in e
               for e in findings(run, "error")), findings(run, "error")


def test_refresh_keeps_a_mirrored_files_reviewed_blobs_and_adds_none():
    """Only ``contract --accept``, after the diff is shown, records a mirrored file's new blob: never refresh."""
    row = LockItem("file", C128_ONLINE, f"{CUH}:19", C128_ONLINE, ("a" * 40, "c" * 40), signature=STATE_ROW)
    at_new_base = LockItem("file", C128_ONLINE, f"{CUH}:19", C128_ONLINE, ("b" * 40,), signature=STATE_ROW)
    assert merged([at_new_base], Lock(Path("contract.lock"), [row], "v0.5.23")) == [row]
    assert merged([at_new_base], None) == [at_new_base]  # a new row: the base's blob


def test_watch_says_unchecked_naming_the_reordered_state_row(drift, tmp_path):
    run = invoke("watch", "--onto", "row-reordered", "--repo", str(drift.git_dir), "--out", str(tmp_path / "out"),
                 "--series", str(REPO_ROOT), "--no-run")
    assert run.code == EXIT["unchecked"] == 8, run.err
    [line] = [u for u in run.out["unchecked"] if u.startswith(f"{C128_ONLINE}: changed upstream since the lock")]
    assert STATE_ROW in line and line.endswith(f"--repo {drift.git_dir} --series {REPO_ROOT} --accept`")
    assert run.out["contract"]["unchecked"] == [line] and not run.out["contract"]["broken"]
    diff = re.search(r"review `(git [^`]+)`", line)[1]
    assert "gmem.load(kv_load_buf, 1)" in subprocess.run(shlex.split(diff), capture_output=True, text=True,
                                                         check=True).stdout
    assert line in (tmp_path / "out" / "watch-report.md").read_text()


# -- bisect -------------------------------------------------------------------------------------


def test_bisect_names_the_upstream_commit_that_broke_the_contract(drift):
    run = invoke("bisect", "--onto", "chain", "--repo", str(drift.git_dir), "--series", str(REPO_ROOT))
    assert run.code == 0, run.err
    report = run.out
    assert report["found"] and report["commits_between"] == 3
    assert report["commit"] == drift.rev_parse("chain-change")
    assert report["subject"] == "spec_utils: verify_input becomes keyword-only"
    assert report["failing"][0].startswith(f"{RECORD_STREAMS}:39: call sglang.srt.speculative.spec_utils."
                                           "record_stream_for_v2_verify(arg1, arg2, arg3) does not bind")


def test_bisect_prints_the_first_bad_commits_subject_without_line_separators_or_controls(drift):
    """Helper 164: the "first bad commit" line printed upstream's subject through ``plain`` alone: its ESC, C1 and
    bidi were removed, its U+2028/U+2029 (a line break to some terminals and log viewers) reached the terminal."""
    moved = drift.rev_parse("moved")
    hostile = "moved\u2028forged: the series fits\u2029x \x1b[31mred \u202e \x85end"
    commit = drift.with_env(GIT_AUTHOR_NAME="u", GIT_AUTHOR_EMAIL="u@x.invalid", GIT_COMMITTER_NAME="u",
                            GIT_COMMITTER_EMAIL="u@x.invalid").out("commit-tree", f"{moved}^{{tree}}", "-p",
                                                                   f"{moved}^", input=hostile)
    wu.set_branch(drift, "moved-hostile", commit)
    run = invoke("bisect", "--onto", "moved-hostile", "--repo", str(drift.git_dir), "--series", str(REPO_ROOT),
                 as_json=False)
    assert run.code == 0, run.err
    [line] = [x for x in run.text.splitlines() if x.startswith("first bad commit: ")]
    assert line.endswith("forged: the series fits ⏎ x [31mred  end"), line
    assert not any(c in run.text for c in "\u2028\u2029\x1b\u202e\x85"), run.text


def test_bisect_keeps_a_subjects_carriage_return_inside_its_line(drift):
    """Helper 169: the first bad commit's subject was read in text mode (universal newlines): its CR became "\n",
    and the "first bad commit" line printed a second line of the subject's choosing ("fake: clean"). Read as bytes,
    the CR is data: dropped from the one line (``textsafe.plain``), kept in --json."""
    moved = drift.rev_parse("moved")
    commit = drift.with_env(GIT_AUTHOR_NAME="u", GIT_AUTHOR_EMAIL="u@x.invalid", GIT_COMMITTER_NAME="u",
                            GIT_COMMITTER_EMAIL="u@x.invalid").out("commit-tree", f"{moved}^{{tree}}", "-p",
                                                                   f"{moved}^", input="moved\rfake: clean")
    wu.set_branch(drift, "moved-cr", commit)
    args = ["bisect", "--onto", "moved-cr", "--repo", str(drift.git_dir), "--series", str(REPO_ROOT)]
    run = invoke(*args, as_json=False)
    assert run.code == 0, run.err
    assert not any(x.startswith("fake") for x in run.text.splitlines()), run.text
    assert f"first bad commit: {commit} movedfake: clean" in run.text.splitlines(), run.text  # (plain: CR dropped)
    assert invoke(*args).out["subject"] == "moved\rfake: clean"


def test_bisect_names_the_commit_where_the_series_stops_applying(drift):
    run = invoke("bisect", "--onto", "moved", "--repo", str(drift.git_dir), "--series", str(REPO_ROOT))
    assert run.code == 0, run.err
    assert run.out["commit"] == drift.rev_parse("moved")
    assert run.out["failing"][0].startswith("the series does not apply on ")


def test_bisect_checks_each_commit_once(drift, monkeypatch):
    """The found commit was checked by a step already (over one commit: the target, checked first); checked again, a
    watch's bisect with the behavioural tier ran it twice (73 s over one commit)."""
    from c128patch.fit import bisect as bisect_ops

    checked, real = [], bisect_ops._what_fails
    monkeypatch.setattr(bisect_ops, "_what_fails", lambda s, g, b, commit, *a: (checked.append(commit), real(
        s, g, b, commit, *a))[1])
    run = invoke("bisect", "--onto", "moved", "--repo", str(drift.git_dir), "--series", str(REPO_ROOT))
    assert run.code == 0 and run.out["commit"] == drift.rev_parse("moved"), run.err
    assert sorted(checked) == sorted([drift.rev_parse("moved"), drift.rev_parse("v0.5.23")])  # target, base


def test_bisect_on_an_upstream_the_series_fits_says_so(drift):
    run = invoke("bisect", "--onto", "v0.5.23", "--repo", str(drift.git_dir), "--series", str(REPO_ROOT),
                 as_json=False)
    assert run.code == 0 and "the series applies and fits v0.5.23: nothing to bisect" in run.text


def test_bisect_behaviour_never_says_fits_where_the_tier_did_not_check(drift, monkeypatch):
    """h152: with an interpreter the tier cannot import the tree with (no torch: `--python /usr/bin/python3`), each
    step's tier checked nothing and failed nothing, and `bisect --behaviour` said "the series applies and fits trap:
    nothing to bisect" (exit 0) over an upstream whose environ.py raised at import. A step it cannot judge: one line."""
    from c128patch.fit import treecheck

    unchecked = treecheck.TreecheckResult([treecheck.TierResult("off", torch=False),
                                           treecheck.TierResult("on", torch=False)])
    monkeypatch.setattr(treecheck, "run_rev", lambda *a, **k: unchecked)
    run = invoke("bisect", "--onto", "v0.5.23", "--repo", str(drift.git_dir), "--series", str(REPO_ROOT),
                 "--behaviour", as_json=False)
    assert run.code == 2 and "fits" not in run.text, (run.code, run.text, run.err)
    line = run.err.strip().splitlines()[-1]
    assert line.startswith(f"c128patch: error: bisect --behaviour cannot judge {drift.rev_parse('v0.5.23')[:12]}: "
                           "the behavioural tier did not check it (behavioural tier: torch is not installed"), line


# -- the behavioural tier -----------------------------------------------------------------------

CONTROLLER = "sglang.srt.layers.attention.dsv4.online_c128_dspark"
PROBE = f"{CONTROLLER}.online_c128_dspark_env()"


def test_a_removed_method_we_call_is_caught_by_the_contract(drift):
    run = run_contract("get-renamed", repo=drift)
    assert run.code == 1
    assert any(e.startswith("overlay/sglang/srt/layers/attention/dsv4/online_c128_dspark.py:68: "
                            "sglang.srt.environ.envs.SGLANG_OPT_USE_ONLINE_COMPRESS.get: ")
               for e in findings(run, "error"))


# the modules the series adds or changes that need a package of sglang's the test interpreter (torch and the [test]
# extras) lacks, each with the first such package its import reaches: every other module must import
NEEDS = {"sglang.kernels.ops.attention.dsv4.online_c128_dspark": "orjson",
         "sglang.srt.layers.attention.deepseek_v4_backend": "orjson",
         "sglang.srt.layers.attention.dsv4.compressor_v2": "orjson",
         "sglang.srt.mem_cache.deepseek_v4_memory_pool": "orjson",
         "sglang.srt.model_executor.pool_configurator": "psutil",
         "sglang.srt.speculative.dspark_components.c128_record_streams": "huggingface_hub",
         "sglang.srt.speculative.dspark_components.dspark_verify": "triton",
         "sglang.srt.speculative.dspark_components.dspark_worker_v2": "triton"}


@pytest.mark.parametrize("rev", RELEASES)
def test_the_behavioural_tier_passes_only_where_every_module_imported_on_every_release(rev):
    pytest.importorskip("torch")
    run = invoke("treecheck", "--sglang-rev", rev, "--series", str(REPO_ROOT))
    off, on = run.out["tiers"]
    assert (off["gates"], on["gates"]) == ("off", "on") and run.out["failed"] == []
    for tier in (off, on):
        assert tier["torch"] and set(tier["modules"]) >= {CONTROLLER, "sglang.srt.environ"}
        assert all(m["status"] in ("ok", "not checked") for m in [*tier["modules"].values(), *tier["probes"].values()])
    missed = {n for t in (off, on) for n, m in [*t["modules"].items(), *t["probes"].items()]
              if m["status"] == "not checked"}
    said = [line for line in run.out["not_checked"] if not line.startswith("scenario ")]  # the scenarios: below
    assert [line.split(":", 1)[0] for line in said] == sorted(missed)
    not_run = {s for t in (off, on) for s, r in t["scenarios"].items() if r["status"] == "not run"}
    scenario_lines = run.out["not_checked"][len(said):]
    assert all(line.startswith("scenario ") for line in scenario_lines)
    assert {line.split(":")[0].removeprefix("scenario ") for line in scenario_lines} == not_run
    # v0.5.20's environ itself imports orjson: there nothing imports without it
    needs = {n: "orjson" for t in (off, on) for n in [*t["modules"], *t["probes"]]} if rev == "v0.5.20" else NEEDS
    assert missed == {m for m, package in needs.items() if importlib.util.find_spec(package) is None}
    tier_unchecked(run.out)  # each names a package this interpreter really lacks
    if missed:  # sglang's own dependencies are not installed here: said, never a pass
        assert run.code == EXIT["unchecked"] and not run.out["ok"]
        assert run.out["verdict"].startswith("unchecked: not every module imported here (needs ")
    else:
        assert run.code == 0 and run.out["ok"] and run.out["verdict"].startswith("passed")
    if off["modules"][CONTROLLER]["status"] == "ok":
        assert off["probes"][PROBE]["status"] == on["probes"][PROBE]["status"] == "ok"


def test_the_behavioural_tier_catches_a_removed_method_with_the_gates_on_and_off(drift):
    pytest.importorskip("torch")
    run = invoke("treecheck", "--sglang-rev", "get-renamed", "--repo", str(drift.git_dir), "--series", str(REPO_ROOT))
    assert run.code == 1
    failed = run.out["failed"]
    assert {f.split(":", 1)[0] for f in failed} == {"gates off", "gates on"}
    assert all(f.endswith("AttributeError: 'EnvBool' object has no attribute 'get'") for f in failed), failed
    assert any(f.startswith("gates off: sglang.srt.environ: sglang/srt/environ.py:") for f in failed)


def test_without_torch_the_behavioural_tier_says_not_checked_in_one_line(tmp_path):
    from test_watch_behaviour import no_torch_python

    run = invoke("treecheck", "--sglang-rev", "v0.5.23", "--python", no_torch_python(tmp_path), "--series",
                 str(REPO_ROOT), as_json=False)
    assert run.code == EXIT["unchecked"]
    from c128patch.fit.sandbox import isolation

    assert run.text == (f"behavioural tier: the interpreter given (--python); {isolation()}\n"
                        "  behavioural tier: torch is not installed for this interpreter (nothing imported)\n"
                        "treecheck: torch is not installed for this interpreter: behavioural tier not checked; "
                        "imports: 11 of 11 modules' sglang imports resolve on the tree's files\n")


def test_a_renamed_imported_module_is_caught_by_the_tier_without_importing(drift, tmp_path):
    """The import check needs no torch and no sglang dependency: the module our kernel ops import is gone."""
    from test_watch_behaviour import no_torch_python

    run = invoke("treecheck", "--sglang-rev", "renamed", "--repo", str(drift.git_dir), "--python",
                 no_torch_python(tmp_path), "--series", str(REPO_ROOT))
    assert run.code == 1
    assert (f"imports: sglang.kernels.ops.attention.dsv4.online_c128_dspark: python/sglang/kernels/ops/attention/dsv4/"
            f"online_c128_dspark.py:{MAKE_NAME_LINE}: from sglang.kernels.ops.attention.dsv4.utils import make_name: "
            "no module sglang.kernels.ops.attention.dsv4.utils on this tree") in run.out["failed"], run.out["failed"]


def test_run_bare_in_a_patched_tree_contract_and_treecheck_take_that_tree(upstream_clone, monkeypatch, tmp_path):
    """README lists both bare, as status: from inside the tree `apply` made they check it (and say so); elsewhere
    the one-line refusal names the flags."""
    assert invoke("apply", "--sglang-rev", "v0.5.23", "--repo", upstream_clone, "--series", REPO_ROOT).code == 0
    monkeypatch.chdir(upstream_clone / "python")
    run = invoke("contract", "--series", REPO_ROOT, "--no-nvcc", as_json=False)
    assert run.code == 0 and f"contract: on the patched tree here, {upstream_clone}" in run.err, run.err
    assert "contract holds" in run.text
    checked = invoke("treecheck", "--series", REPO_ROOT, "--no-run")
    assert checked.code == 8 and f"treecheck: on the patched tree here, {upstream_clone}" in checked.err
    assert "11 of 11 modules' sglang imports resolve" in checked.out["verdict"], checked.out
    monkeypatch.chdir(tmp_path)  # where ``apply`` made ./sglang: that one
    assert f"on the patched tree here, {upstream_clone}" in invoke("contract", "--series", REPO_ROOT, "--no-nvcc").err
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    refused = invoke("contract", "--series", REPO_ROOT, "--no-nvcc", as_json=False)
    assert refused.code == 2 and "--tree DIR (default: the patched tree here)" in refused.err


def test_a_header_that_never_ends_stops_the_nvcc_probe_in_its_time_limit(sglang_release_repo, monkeypatch, tmp_path):
    """Helper 134: a header of the tree's that `#include "/dev/zero"` has the host compiler read for ever: the probe
    (no time limit) hung `contract` and `watch`; past ``PROBE_TIMEOUT`` nvcc and its children are ended, a failure."""
    import types

    nvcc = tmp_path / "nvcc"  # one that reads for ever, as the host compiler does there, its child too
    nvcc.write_text("#!/bin/sh\ncat /dev/zero > /dev/null &\nexec cat /dev/zero > /dev/null\n")
    nvcc.chmod(0o755)
    info = types.ModuleType("tvm_ffi.libinfo")
    info.find_include_path = info.find_dlpack_include_path = lambda: str(tmp_path)
    monkeypatch.setitem(sys.modules, "tvm_ffi", types.ModuleType("tvm_ffi"))
    monkeypatch.setitem(sys.modules, "tvm_ffi.libinfo", info)
    monkeypatch.setattr(contract_cxx, "nvcc", lambda: str(nvcc))
    monkeypatch.setattr(contract_cxx, "PROBE_TIMEOUT", 2)
    started = time.monotonic()
    ok, line = contract_cxx.probe(REPO_ROOT, Git(sglang_release_repo), "v0.5.23", cached=False)
    assert ok is False and line.endswith("nvcc did not finish in 2 s (a header it reads that never ends?)"), line
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("kind", ["symlink", "fifo", "folder"])
def test_a_series_probe_or_cuda_only_table_that_is_no_regular_file_is_refused(sglang_release_repo, tmp_path, kind):
    """Helper 163: the signature probe a series carries (``ci/kernel_probe/upstream_signatures.cu``) was taken as
    ``series_root / PROBE``, past the confinement rule: a link out of the series was read whole (its target's words
    into nvcc's error lines), a FIFO or a folder was "no probe"; a FIFO or a folder at ``patches/env/cuda-only.toml``
    was an empty table. Each is one line naming it now, before nvcc is looked for."""
    from c128patch.errors import C128Error
    from c128patch.fit.env import cuda_only

    root = tmp_path / "s"
    for rel in (contract_cxx.PROBE, "patches/env/cuda-only.toml"):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "symlink":
            (tmp_path / "secret").write_text("ghp_SECRET\n")
            path.symlink_to(tmp_path / "secret")
        else:
            os.mkfifo(path) if kind == "fifo" else path.mkdir()
    with pytest.raises(C128Error, match="the series' signature probe"):
        contract_cxx.probe(root, Git(sglang_release_repo), "v0.5.23", cached=False)
    (root / "patches" / "series.toml").write_text('[series]\nname = "s"\nversion = "1"\nbase = "v0.5.23"\n')
    with pytest.raises(C128Error, match="the series' CUDA-only table"):
        cuda_only(load_series(root))


def test_the_nvcc_probe_runs_sealed_and_shows_no_line_of_a_file_a_header_includes(sglang_release_repo, monkeypatch,
                                                                                   tmp_path):
    """Helper 137: nvcc ran with the operator's environment and files, and the probe's line kept its first three raw
    error lines: a header of the tree's that includes ``~/.netrc`` (or /proc/self/environ) put the secret's words
    into contract's line, --json and watch's report. Now nvcc runs in the sealed box (the secret unseen, the env
    scrubbed) and an error in a file outside the tree's headers and the probe is said as that, never its text."""

    secret = tmp_path / "home" / ".netrc"
    secret.parent.mkdir()
    secret.write_text("ghp_FILESECRET\n")
    nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text(f'#!/bin/sh\necho "{secret}(1): error: identifier \\"$(cat {secret} 2>/dev/null)$TOKEN\\" is '
                    'undefined" >&2\necho "$(cat ' + str(secret) + ' 2>/dev/null)$TOKEN" >&2\n'
                    'echo "$2(73): error: static assertion failed with '
                    '\\"upstream signature changed: helper_x\\"" >&2\n'
                    'echo "$2(74): error: static assertion failed with '
                    '\\"upstream signature changed: helper_y\\"" >&2\n'
                    'exit 1\n')
    nvcc.chmod(0o755)
    _fake_toolchain(monkeypatch, tmp_path, nvcc)
    monkeypatch.setenv("TOKEN", "ghp_ENVSECRET")
    ok, line = contract_cxx.probe(REPO_ROOT, Git(sglang_release_repo), "v0.5.23", cached=False)
    assert ok is False and line == "nvcc signature probe fails: helper_x; helper_y", line
    nvcc.write_text(nvcc.read_text().replace("upstream signature changed", "something else"))
    ok, line = contract_cxx.probe(REPO_ROOT, Git(sglang_release_repo), "v0.5.23", cached=False)
    assert ok is False and "ghp_" not in line, line
    assert line.startswith("nvcc signature probe fails: an error in a file outside the tree's headers"), line
    assert f"{contract_cxx.PROBE}:73: static assertion failed with \"something else: helper_x\"" in line, line
    from c128patch.fit import sandbox

    if not any(sandbox._cuts()[:2]):  # where the host allows the seal, the file is not even seen
        nvcc.write_text(f'#!/bin/sh\n[ -e {secret} ] && echo "$2(1): error: seen $TOKEN" >&2; exit 1\n')
        assert contract_cxx.probe(REPO_ROOT, Git(sglang_release_repo), "v0.5.23", cached=False) == (
            False, "nvcc signature probe fails: nvcc failed")


def test_an_nvcc_the_box_cannot_run_is_not_checked_never_a_failure(sglang_release_repo, monkeypatch, tmp_path):
    """Helper 139: nvcc at ``$HOME/bin/nvcc`` (its prefix HOME, which the box hides) or found through a relative PATH
    entry (``bin``, resolved in the box's folder), at ``$HOME/nvcc``, or whose interpreter the box hides never ran, yet
    the probe said "fails": contract broken, watch 7. Those are not checked (nothing ran); the relative one runs the
    nvcc of the current folder."""
    nvcc = _program(tmp_path / "home" / "bin" / "nvcc", "#!/bin/sh\nexit 0\n")
    _fake_toolchain(monkeypatch, tmp_path, nvcc)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    ok, line = contract_cxx.probe(REPO_ROOT, Git(sglang_release_repo), "v0.5.23", cached=False)
    from c128patch.fit import sandbox

    if any(sandbox._cuts()[:2]):  # no seal here: nothing hidden, it runs
        assert ok is True, line
    else:
        assert ok is None and line.startswith("nvcc signature probe not run (the sealed box would have to show all "
                                              f"of {tmp_path / 'home'}") and line.endswith("contract not checked"), line
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path / "home")
    monkeypatch.setattr(contract_cxx, "nvcc", lambda: "bin/nvcc")  # as shutil.which finds it through PATH=bin:...
    assert contract_cxx.probe(REPO_ROOT, Git(sglang_release_repo), "v0.5.23", cached=False) == (
        True, "nvcc signature probe compiles against the tree's headers (sm_90a)")
    shell = tmp_path / "elsewhere" / "sh"  # nvcc's interpreter in a place the box hides: it cannot start there
    shell.parent.mkdir()
    shutil.copy("/bin/sh", shell)
    nvcc.write_text(f"#!{shell}\nexit 0\n")
    ok, line = contract_cxx.probe(REPO_ROOT, Git(sglang_release_repo), "v0.5.23", cached=False)
    if not any(sandbox._cuts()[:2]):
        assert ok is None and line.startswith(f"nvcc signature probe not run ({tmp_path / 'home' / 'bin' / 'nvcc'} "
                                              "cannot be run in the sealed box: "), line
    nvcc = tmp_path / "home2" / "nvcc"  # in HOME itself: its bin's parent holds HOME
    nvcc.parent.mkdir()
    nvcc.write_text("#!/bin/sh\nexit 0\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("HOME", str(nvcc.parent))
    monkeypatch.setattr(contract_cxx, "nvcc", lambda: str(nvcc))
    ok, line = contract_cxx.probe(REPO_ROOT, Git(sglang_release_repo), "v0.5.23", cached=False)
    assert ok is (True if any(sandbox._cuts()[:2]) else None), line


def test_an_nvcc_whose_version_never_comes_is_not_checked_in_its_time_limit(sglang_release_repo, monkeypatch,
                                                                           tmp_path):
    """Helper 139: the probe's cache key asks ``nvcc --version`` with no time limit: a wrapper nvcc that never
    answers (a license or network wait) hung contract and watch for ever. Past its limit: not checked."""
    nvcc = _program(tmp_path / "cuda" / "bin" / "nvcc", '#!/bin/sh\n[ "$1" = --version ] && exec sleep 60\nexit 0\n')
    _fake_toolchain(monkeypatch, tmp_path, nvcc)
    monkeypatch.setenv("C128PATCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(contract_cxx, "VERSION_TIMEOUT", 1)
    started = time.monotonic()
    ok, line = contract_cxx.probe(REPO_ROOT, Git(sglang_release_repo), "v0.5.23")
    assert ok is None and line.startswith("nvcc --version did not answer (") and line.endswith("not checked"), line
    assert time.monotonic() - started < 20


def _program(path: Path, text: str) -> Path:
    """``path``, an executable script holding ``text`` (its folders made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def _fake_toolchain(monkeypatch, tmp_path: Path, nvcc: Path) -> None:
    """``nvcc`` as the probe's compiler, a tvm_ffi whose include folders are an empty one."""
    import types

    (tmp_path / "tvm").mkdir()
    info = types.ModuleType("tvm_ffi.libinfo")
    info.find_include_path = info.find_dlpack_include_path = lambda: str(tmp_path / "tvm")
    monkeypatch.setitem(sys.modules, "tvm_ffi", types.ModuleType("tvm_ffi"))
    monkeypatch.setitem(sys.modules, "tvm_ffi.libinfo", info)
    monkeypatch.setattr(contract_cxx, "nvcc", lambda: str(nvcc))


def test_a_probe_verdict_cached_before_the_probe_ran_sealed_is_compiled_again(sglang_release_repo, monkeypatch,
                                                                              tmp_path):
    """Helper 137: a failure's line cached before the probe ran sealed may hold a secret's words (its raw error
    lines); it was served again "(cached)" under the same key. The key now says how the probe runs."""
    import hashlib
    import json

    monkeypatch.setenv("C128PATCH_CACHE", str(tmp_path / "cache"))
    nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text('#!/bin/sh\n[ "$1" = --version ] && echo fake 1.0\nexit 0\n')
    nvcc.chmod(0o755)
    _fake_toolchain(monkeypatch, tmp_path, nvcc)
    git = Git(sglang_release_repo)
    headers = git.out("rev-parse", f"v0.5.23:{contract_cxx.INCLUDE_ROOT}").strip()
    old = hashlib.sha256("\0".join([headers, (REPO_ROOT / contract_cxx.PROBE).read_text(), str(nvcc),
                                    "fake 1.0\n"]).encode()).hexdigest()[:24]
    entry = tmp_path / "cache" / "contract-probe" / f"{old}.json"
    entry.parent.mkdir(parents=True)
    entry.write_text(json.dumps({"key": old, "ok": False, "line": "nvcc signature probe fails: /root/.netrc(1): "
                                 'error: identifier "ghp_CACHED" is undefined'}))
    ok, line = contract_cxx.probe(REPO_ROOT, git, "v0.5.23")
    assert ok is True and "ghp_" not in line, line


def test_tvm_ffi_pin_refuses_an_upstream_version_that_leaves_the_series(tmp_path):
    """helper 172: the pin of the probe's install hint read ``patches/env/v<__version__>.lock`` with upstream's
    ``__version__`` joined unchecked: ``x/../../../../outside`` read a lock outside the series wherever
    ``patches/env/vx/`` is a folder (its pin printed as the command to run). Now confined: refused, naming it."""
    from c128patch.errors import C128Error

    series = tmp_path / "a" / "s"
    (series / "patches" / "env" / "vx").mkdir(parents=True)
    (tmp_path / "a" / "outside.lock").write_text("apache-tvm-ffi==6.6.6\n")
    version = "x/../../../../outside"

    class Blobs:
        def blob(self, head: str, path: str) -> bytes | None:
            return f'__version__ = "{version}"\n'.encode() if path.endswith("_version.py") else None

    with pytest.raises(C128Error, match="the lock of upstream's __version__"):
        contract_cxx.tvm_ffi_pin(series, Blobs(), "HEAD")


@pytest.mark.parametrize("pyproject", [f"x = {'9' * 5000}\n", "project = 1\n", "[project]\ndependencies = 5\n",
                                       "[project]\ndependencies = {'apache-tvm-ffi==6.6.6' = 1}\n",
                                       "a = " + "[" * 5000 + "]" * 5000 + "\n"])
def test_tvm_ffi_pin_reads_a_hostile_upstream_pyproject_as_unpinned(tmp_path, pyproject: str):
    """Helper 173: upstream's ``python/pyproject.toml`` (the pin `contract`'s install hint prints where tvm-ffi is
    not installed) was read trusting its shape: an integer past Python's digit limit (a ValueError tomllib does not
    wrap), ``project = 1`` or ``dependencies = 5`` ended `contract` in a traceback; a table's keys were read as its
    pins. Now it names no pin: unpinned."""

    class Blobs:
        def blob(self, head: str, path: str) -> bytes | None:
            return pyproject.encode() if path.endswith("pyproject.toml") else None

    assert contract_cxx.tvm_ffi_pin(tmp_path, Blobs(), "HEAD") == contract_cxx.TVM_FFI
