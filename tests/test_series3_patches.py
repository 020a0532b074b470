"""Series III patch files, as the product's manifest carries them: each release's selected files
apply strictly on top of the earlier entries, no variant is redundant, the patched files
compile, the headers are ours, and every hook they add into upstream code is gated."""

from __future__ import annotations

import ast
import builtins
import dataclasses
import py_compile
import re
import subprocess
from pathlib import Path
from typing import Dict, List, Set

import pytest

from c128patch.git import Git
from c128patch.ops.check import RevCheck, index_git, replay_in_index
from c128patch.ops.refresh import _fallback_gives_same_tree
from c128patch.series.manifest import load_series
from c128patch.series.plan import validate_files
from series3_tree import CONTROLLER, ENV, function_node, selected_patches, series3_entries
from support import RELEASES, REPO_ROOT

SERIES = load_series(REPO_ROOT)
ENTRIES = series3_entries(SERIES)
PATCH_ENTRIES = [e for e in ENTRIES if e.is_patch]
SERIES3 = ["c128-dspark-online-env", "c128-dspark-online-rules", "c128-dspark-online-controller",
           "c128-dspark-online-startup", "c128-dspark-online-backend", "c128-dspark-online-commit"]


def test_manifest_carries_series3() -> None:
    validate_files(SERIES)  # every file of every entry exists, matches its sha256 and parses
    listed = {v.file for e in SERIES.entries for v in e.patch_files()}
    assert {p.name for p in SERIES.patches_dir.glob("*.patch")} == listed
    assert [e.name for e in ENTRIES] == SERIES3
    for entry in ENTRIES:
        if not entry.is_patch:
            assert entry.target == "python/" + entry.source.removeprefix("overlay/")


# -- each release: the selected files apply strictly; no variant is redundant -----------


@pytest.fixture(scope="module")
def scratch_git(sglang_release_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Git:
    """A shared clone of the release history, nothing checked out: the objects the replays write
    go here, and `git apply --cached` has the work tree it wants."""
    dest = tmp_path_factory.mktemp("scratch") / "releases"
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", "--shared", str(sglang_release_repo), str(dest)],
                   check=True)
    return Git(worktree=dest)


@pytest.fixture(scope="module")
def replays(scratch_git: Git, tmp_path_factory: pytest.TempPathFactory) -> Dict[str, RevCheck]:
    """tag -> the product's replay of the whole series on that release (c128patch check)."""
    root = tmp_path_factory.mktemp("replays")
    return {tag: replay_in_index(SERIES, scratch_git, tag, scratch_git.rev_parse(tag), root / f"{tag}.index")[0]
            for tag in RELEASES}


def _nearest_older(entry, tag: str):
    older = [v for v in entry.patch_files() if RELEASES.index(v.base) <= RELEASES.index(tag)]
    return max(older, key=lambda v: RELEASES.index(v.base)) if older else entry.patch_files()[0]


@pytest.mark.parametrize("tag", RELEASES)
@pytest.mark.parametrize("name", [e.name for e in SERIES.entries])
def test_selected_file_applies_strictly(tag: str, name: str, replays: Dict[str, RevCheck]) -> None:
    """On each release, each entry's selected file (the nearest older base's, as `apply` picks
    it) applies with a plain `git apply` on top of the earlier entries: no 3-way merge."""
    entry = SERIES.entry(name)
    row = next(r for r in replays[tag].entries if r.name == name)
    if entry.is_patch:
        assert row.file == f"patches/{_nearest_older(entry, tag).file}"
    assert row.status == "clean", row


def _commit_after_variant(git: Git, entry_index: int, base: str, variant_file: Path, index_file: Path) -> str:
    """A commit whose parent holds the earlier entries replayed on ``base`` and whose tree adds
    ``variant_file`` (applied strictly): the shape refresh exports a variant from."""
    before = dataclasses.replace(SERIES, entries=SERIES.entries[:entry_index])
    result, _ = replay_in_index(before, git, base, git.rev_parse(base), index_file)
    assert result.ok, result.to_json()
    idx = index_git(git, index_file)
    parent = git.out("commit-tree", idx.out("write-tree"), "-p", base, "-m", "earlier entries")
    idx.run("apply", "--cached", str(variant_file))
    return git.out("commit-tree", idx.out("write-tree"), "-p", parent, "-m", "variant")


@pytest.mark.parametrize(
    "name,base",
    [(e.name, v.base) for e in SERIES.entries for v in e.variants],
)
def test_no_variant_is_redundant(name: str, base: str, scratch_git: Git, tmp_path: Path) -> None:
    """A variant is kept only where the file `apply` would choose without it (the nearest older
    variant, else the primary) does not give its tree strictly on its base (on top of the earlier
    entries): refresh's own test for dropping one."""
    index = [e.name for e in SERIES.entries].index(name)
    entry = SERIES.entries[index]
    variant = next(v for v in entry.variants if v.base == base)
    sha = _commit_after_variant(scratch_git, index, base, SERIES.file_of(entry, variant), tmp_path / "index")
    assert not _fallback_gives_same_tree(SERIES, entry, scratch_git, sha, base), f"{variant.file} is redundant"


@pytest.mark.parametrize("tag", RELEASES)
def test_patched_files_compile(tag: str, series_trees, tmp_path: Path) -> None:
    patched, _ = series_trees[tag]
    modules = sorted((patched / "sglang").rglob("*.py"))
    assert len(modules) >= 8
    for i, path in enumerate(modules):
        py_compile.compile(str(path), cfile=str(tmp_path / f"{i}.pyc"), doraise=True)
    controller = patched / "sglang/srt/layers/attention/dsv4/online_c128_dspark.py"
    assert controller.read_bytes() == CONTROLLER.read_bytes()


@pytest.mark.parametrize("name", sorted({v.file for e in PATCH_ENTRIES for v in e.patch_files()}))
def test_patch_header(name: str) -> None:
    entry = next(e for e in PATCH_ENTRIES if name in {v.file for v in e.patch_files()})
    text = (SERIES.patches_dir / name).read_text()
    assert text.startswith("From 0000000000000000000000000000000000000000 ")
    assert "\nFrom: c128patch <c128patch@noreply.invalid>\n" in text
    assert re.search(r"^Subject: \[PATCH\] c128: ", text, re.M)
    assert f"\nC128patch-Gate: {ENV} (default off)\n" in text
    assert "\nC128patch-Upstream: sgl-project/sglang#32035\n" in text
    assert "\nC128patch-Upstream-Status: open\n" in text
    assert f"\nC128patch-Entry: {entry.name}\n" in text


# -- every hook is gated --------------------------------------------------------------

# Controller entry points the upstream hooks call; each must return before doing
# anything when the controller is disabled.
GUARDED = ("prepare_verify", "build_verify_plan", "owned_plan", "commit")


def _first_statement_guard(node: ast.FunctionDef) -> str:
    body = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    return ast.unparse(body[0]) if body else ""


def test_controller_entries_return_when_disabled() -> None:
    for name in GUARDED:
        node = function_node(CONTROLLER, f"OnlineC128DsparkController.{name}")
        first = _first_statement_guard(node)
        assert first.startswith("if not self._enabled"), (name, first)
        assert "return" in first, (name, first)
    compress_fn = ast.unparse(function_node(CONTROLLER, "OnlineC128DsparkController.compress_fn"))
    assert "self.owned_plan(plan)" in compress_fn
    enabled = ast.unparse(function_node(CONTROLLER, "OnlineC128DsparkController.__init__"))
    assert "online_c128_dspark_env() and" in enabled


KERNEL_OPS_MODULE = REPO_ROOT / "overlay/sglang/kernels/ops/attention/dsv4/online_c128_dspark.py"

# Every int()/float()/bool() conversion in the controller and the kernel ops module, as
# source text: each is of a host value (a shape, a host parameter, a pool or runner getter).
# A new conversion fails the test until it is reviewed here: int(tensor) would be a host sync.
HOST_CONVERSIONS = {
    "bool(getattr(backend.model_runner, 'is_draft_worker', False))",
    "bool(backend.model_runner.spec_algorithm.is_dspark())",
    "int(backend.token_to_kv_pool.get_online_c128_mtp_max_draft_tokens())",
    "int(pool.get_online_c128_mtp_max_draft_tokens())",
    "int(pool.get_online_c128_mtp_state_slot_offset())",
    "int(pool.get_online_c128_state_num_req_slots())",
    "int(self.backend.speculative_num_draft_tokens)",
    "int(verify_bs)",  # the batch's host row count
    "int(live.bs)",  # RaggedVerifyLayout.bs: a host int
    "int(num_q_tokens)",  # the verify's host token bucket
    "int(num_banks)", "int(state_slot_offset)", "int(state_slot_stride)", "int(max_num_reqs)",
    "int(num_state_rows)", "int(row_elems)",  # typed int parameters of the wrappers
}
_SHAPE = re.compile(r"^int\([\w.]+\.shape\[\d\]\)$")


@pytest.mark.parametrize("path", [CONTROLLER, KERNEL_OPS_MODULE], ids=["controller", "kernel-ops"])
def test_controller_and_ops_have_no_host_sync(path: Path) -> None:
    """No device->host read in the controller or the kernel ops module (DSPARK runs host-free
    verify preps): no .item/.tolist/.cpu/.numpy/.synchronize, no .to("cpu"), and every
    int/float/bool conversion is of a reviewed host value or a shape."""
    tree = ast.parse(path.read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    attrs = {n.func.attr for n in calls if isinstance(n.func, ast.Attribute)}
    assert not attrs & {"item", "tolist", "cpu", "numpy", "synchronize"}
    to_cpu = [ast.unparse(n) for n in calls if isinstance(n.func, ast.Attribute) and n.func.attr == "to"
              and any(isinstance(a, ast.Constant) and str(a.value).startswith("cpu") for a in n.args)]
    assert not to_cpu
    conversions = {ast.unparse(n) for n in calls
                   if isinstance(n.func, ast.Name) and n.func.id in ("int", "float", "bool")}
    unreviewed = {c for c in conversions if not _SHAPE.match(c)} - HOST_CONVERSIONS
    assert not unreviewed, f"conversions of possibly device values (a host sync): {sorted(unreviewed)}"


def test_host_sync_check_catches_int_of_a_tensor() -> None:
    """The check above fails on what it exists for (int(tensor), .item())."""
    bad = ast.parse("n = int(self._verify_lens[0])\nm = lens.sum().item()")
    conv = {ast.unparse(c) for c in ast.walk(bad) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
    assert conv - HOST_CONVERSIONS == {"int(self._verify_lens[0])"} and not _SHAPE.match("int(self._verify_lens[0])")


@pytest.mark.parametrize("path", [CONTROLLER, KERNEL_OPS_MODULE], ids=["controller", "kernel-ops"])
def test_contract_checks_are_not_asserts(path: Path) -> None:
    """python -O drops asserts: contract checks raise (RuntimeError, ValueError, TypeError)."""
    asserts = [n.lineno for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Assert)]
    assert not asserts, f"{path.name}: assert at lines {asserts}"


def _hook_calls(tree: ast.AST) -> List[ast.Call]:
    """Calls into the controller or the overlay module inside upstream code."""
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            text = ast.unparse(node.func)
            if "online_c128_dspark" in text or text in (
                "commit_after_verify",
                "check_online_c128_dspark_startup",
                "OnlineC128DsparkController",
            ):
                calls.append(node)
    return calls


def _bound_names(func: ast.FunctionDef) -> Set[str]:
    names = {a.arg for a in func.args.args + func.args.kwonlyargs}
    for node in ast.walk(func):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _module_names(tree: ast.Module) -> Set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


@pytest.mark.parametrize("release", RELEASES)
def test_hooks_are_gated_and_bound(release: str, series_trees, sglang_release_repo: Path) -> None:
    """In every patched upstream function, each call into the series' code is either on
    the controller (whose entries return when disabled) or under an `if` on the env;
    and every name it reads is bound in that function (or module), so paths the CPU
    tests cannot run still cannot NameError."""
    patched, _ = series_trees[release]
    seen = 0
    for rel in sorted({f for p in selected_patches(SERIES, sglang_release_repo, release) for f in p.patch.files}):
        path = patched / rel.removeprefix("python/")
        module = ast.parse(path.read_text())
        module_names = _module_names(module) | set(dir(builtins))
        parents = {c: p for p in ast.walk(module) for c in ast.iter_child_nodes(p)}
        for call in _hook_calls(module):
            seen += 1
            func, node = None, call
            while node in parents:
                node = parents[node]
                if isinstance(node, ast.FunctionDef) and func is None:
                    func = node
            assert func is not None, ast.unparse(call)
            text = ast.unparse(call.func)
            if not text.startswith("self.online_c128_dspark.") and text not in (
                "OnlineC128DsparkController",
                "online_c128_dspark.compress_fn",
            ):
                # A module function of the overlay: must sit under `if envs.<ENV>.get()`.
                node, gated = call, False
                while node in parents:
                    node = parents[node]
                    if isinstance(node, ast.If) and f"envs.{ENV}.get()" in ast.unparse(node.test):
                        gated = True
                        break
                assert gated, f"{rel}: {ast.unparse(call)} is not under the env gate"
            bound = _bound_names(func) | module_names
            for name in ast.walk(call):
                if isinstance(name, ast.Name) and isinstance(name.ctx, ast.Load):
                    assert name.id in bound, f"{rel}:{func.name}: {name.id} unbound"
    # Constructor, plan (enabled + build), two preps, compressor, startup, commit; and
    # the metadata-glue refusal in 0.5.23 (older runners keep glue off for DSPARK).
    assert seen == (9 if release == "v0.5.23" else 8)


@pytest.mark.parametrize("release", RELEASES)
def test_patches_only_add_to_upstream(release: str, sglang_release_repo: Path) -> None:
    """The series removes no upstream line but the four it rewrites in place (the memory
    pool's MTP-only condition, the compressor's compress_forward call, and the pool
    configurator's MTP log branch, which the DSPARK path skips: its `if` and `else`)."""
    removed = []
    for planned in selected_patches(SERIES, sglang_release_repo, release):
        text = planned.path.read_text()
        for line in text[text.index("\ndiff --git") :].splitlines():
            if line.startswith("-") and not line.startswith("---"):
                removed.append(line[1:].strip())
    assert sorted(removed) == sorted(
        [
            "if is_speculative and not envs.SGLANG_EXPERIMENTAL_ONLINE_C128_MTP.get():",
            "kv_compressed = compress_forward(",
            "if allow_experimental_online_c128_mtp:",
            "else:",
        ]
    )


KERNEL_OPS = REPO_ROOT / "overlay/sglang/kernels/ops/attention/dsv4/online_c128_dspark.py"


def test_controller_calls_match_the_kernel_api() -> None:
    """Every `_ops().<fn>(...)` call of the controller fits the series II ops module's
    signature, and the plan attribute it reads is a field of DsparkVerifyPlan."""
    assert KERNEL_OPS.is_file(), f"{KERNEL_OPS.relative_to(REPO_ROOT)} is gone: the controller calls it"
    api = {
        n.name: n for n in ast.parse(KERNEL_OPS.read_text()).body if isinstance(n, ast.FunctionDef)
    }
    calls = [
        n
        for n in ast.walk(ast.parse(CONTROLLER.read_text()))
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and ast.unparse(n.func.value) == "_ops()"
    ]
    assert {c.func.attr for c in calls} == {
        "dspark_verify_plan",
        "dspark_verify_compress",
        "dspark_commit",
        "make_state_ptr_table",
    }
    for call in calls:
        fn = api[call.func.attr]
        positional = [a.arg for a in fn.args.posonlyargs + fn.args.args]
        keywords = set(positional[len(call.args) :]) | {a.arg for a in fn.args.kwonlyargs}
        assert len(call.args) <= len(positional), ast.unparse(call)
        for kw in call.keywords:
            assert kw.arg in keywords, f"{fn.name} takes no {kw.arg!r}"
        required_kwonly = {
            a.arg for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults) if d is None
        }
        assert required_kwonly <= {kw.arg for kw in call.keywords}, ast.unparse(call)
    plan_cls = next(
        n for n in ast.parse(KERNEL_OPS.read_text()).body
        if isinstance(n, ast.ClassDef) and n.name == "DsparkVerifyPlan"
    )
    fields = {n.target.id for n in plan_cls.body if isinstance(n, ast.AnnAssign)}
    assert "prefill_plan" in fields
    assert "verify_plan.prefill_plan" in CONTROLLER.read_text()
