"""Series III patch files: they apply where the manifest says, carry the headers, compile,
and every hook they add into upstream code is gated."""

from __future__ import annotations

import ast
import builtins
import py_compile
import re
from pathlib import Path
from typing import List, Set

import pytest

from series3_tree import (
    ENV,
    PATCHES,
    RELEASES,
    REPO,
    build_tree,
    function_node,
    git_apply,
    load_series,
    series_files,
)

ENTRIES = load_series()
PATCH_ENTRIES = [e for e in ENTRIES if e.kind == "patch"]
CONTROLLER = REPO / "overlay/sglang/srt/layers/attention/dsv4/online_c128_dspark.py"


def test_manifest_lists_every_series_file() -> None:
    listed = {f for e in PATCH_ENTRIES for f in e.patch_files()}
    on_disk = {p.name for p in PATCHES.glob("03*.patch")}
    assert listed == on_disk
    for entry in PATCH_ENTRIES:
        for name in entry.patch_files():
            assert entry.applies[name], f"{name}: no '# applies:' comment"
    for entry in ENTRIES:
        if entry.kind == "overlay":
            assert (REPO / entry.source).is_file()
            assert entry.target == "python/" + entry.source.removeprefix("overlay/")


@pytest.mark.parametrize("release", RELEASES)
def test_each_file_applies_exactly_where_declared(release: str, tmp_path: Path, sglang_release_repo: Path) -> None:
    """Each entry's files, checked on top of the earlier entries: `git apply --check`
    succeeds on the releases its comment names and fails on the others."""
    for index, entry in enumerate(PATCH_ENTRIES):
        tree = tmp_path / entry.name
        build_tree(sglang_release_repo, release, tree, upto=entry.name, overlays=False)
        for name in entry.patch_files():
            result = git_apply(tree, PATCHES / name, check=True)
            declared = release in entry.applies[name]
            assert (result.returncode == 0) == declared, (name, release, result.stderr)


@pytest.mark.parametrize("release", RELEASES)
def test_series_applies_and_compiles(release: str, tmp_path: Path, sglang_release_repo: Path) -> None:
    tree = build_tree(sglang_release_repo, release, tmp_path)
    patched = [tmp_path / f for f in series_files(ENTRIES)]
    overlays = [tmp_path / e.target for e in ENTRIES if e.kind == "overlay"]
    for path in patched + overlays:
        py_compile.compile(str(path), doraise=True)
    assert (tree / "sglang/srt/layers/attention/dsv4/online_c128_dspark.py").is_file()


@pytest.mark.parametrize("name", sorted({f for e in PATCH_ENTRIES for f in e.patch_files()}))
def test_patch_header(name: str) -> None:
    text = (PATCHES / name).read_text()
    assert text.startswith("From 0000000000000000000000000000000000000000 ")
    assert "\nFrom: c128patch <c128patch@noreply.invalid>\n" in text
    assert re.search(r"^Subject: \[PATCH\] c128: ", text, re.M)
    assert f"\nC128patch-Gate: {ENV} (default off)\n" in text
    assert "\nC128patch-Upstream: sgl-project/sglang#32035\n" in text
    assert "\nC128patch-Upstream-Status: open\n" in text


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


def test_controller_has_no_host_sync() -> None:
    """No device->host reads in the controller (DSPARK runs host-free verify preps)."""
    tree = ast.parse(CONTROLLER.read_text())
    calls = {
        n.func.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
    }
    assert not calls & {"item", "tolist", "cpu", "numpy", "synchronize"}


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
def test_hooks_are_gated_and_bound(release: str, tmp_path: Path, sglang_release_repo: Path) -> None:
    """In every patched upstream function, each call into the series' code is either on
    the controller (whose entries return when disabled) or under an `if` on the env;
    and every name it reads is bound in that function (or module), so paths the CPU
    tests cannot run still cannot NameError."""
    build_tree(sglang_release_repo, release, tmp_path)
    seen = 0
    for rel in series_files(ENTRIES):
        path = tmp_path / rel
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
def test_patches_only_add_to_upstream(release: str) -> None:
    """The series removes no upstream line but the two it rewrites in place (the memory
    pool's MTP-only condition and the compressor's compress_forward call)."""
    removed = []
    for entry in PATCH_ENTRIES:
        text = entry.patch_for(release).read_text()
        for line in text[text.index("\ndiff --git") :].splitlines():
            if line.startswith("-") and not line.startswith("---"):
                removed.append(line[1:].strip())
    assert sorted(removed) == sorted(
        [
            "if is_speculative and not envs.SGLANG_EXPERIMENTAL_ONLINE_C128_MTP.get():",
            "kv_compressed = compress_forward(",
        ]
    )


KERNEL_OPS = REPO / "overlay/sglang/kernels/ops/attention/dsv4/online_c128_dspark.py"


def test_controller_calls_match_the_kernel_api() -> None:
    """Every `_ops().<fn>(...)` call of the controller fits the series II ops module's
    signature, and the plan attribute it reads is a field of DsparkVerifyPlan."""
    if not KERNEL_OPS.is_file():
        pytest.skip(f"{KERNEL_OPS.relative_to(REPO)} not in this checkout (series II)")
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
