"""Series III at startup: the env declaration, the pool configurator's online-c128 gate and
the memory pool's ring-size check, run from the patched and the unpatched release files."""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Optional

import pytest

from series3_tree import CONTROLLER, ENV, load_function, sglang_imports
from support import RELEASES, REPO_ROOT

CONFIGURATOR = "sglang/srt/model_executor/pool_configurator.py"
MEMORY_POOL = "sglang/srt/mem_cache/deepseek_v4_memory_pool.py"
MTP_ENV = "SGLANG_EXPERIMENTAL_ONLINE_C128_MTP"
ONLINE_ENV = "SGLANG_OPT_USE_ONLINE_COMPRESS"
KERNEL = REPO_ROOT / "csrc/deepseek_v4/online_c128_dspark.cuh"


@pytest.fixture(params=RELEASES)
def trees(request, series_trees):
    """(release, patched, upstream) of one release (the session's shared trees)."""
    return (request.param, *series_trees[request.param])


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (ENV, MTP_ENV, ONLINE_ENV):
        monkeypatch.delenv(name, raising=False)


class Spec:
    def __init__(self, name: str):
        self.name = name

    def is_none(self) -> bool:
        return self.name == "NONE"

    def is_eagle(self) -> bool:
        return self.name in ("EAGLE", "EAGLE3")

    def is_dspark(self) -> bool:
        return self.name == "DSPARK"


class Log:
    def __init__(self):
        self.records = []

    def warning(self, *args) -> None:
        self.records.append(("warning", args))

    def info(self, *args) -> None:
        self.records.append(("info", args))


def test_env_declared_default_off(trees, monkeypatch: pytest.MonkeyPatch) -> None:
    _, patched, upstream = trees
    with sglang_imports(upstream):
        from sglang.srt.environ import Envs

        assert not hasattr(Envs, ENV)
    with sglang_imports(patched):
        from sglang.srt.environ import envs

        assert envs.SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK.get() is False
        monkeypatch.setenv(ENV, "1")
        assert envs.SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK.get() is True
        monkeypatch.setenv(ENV, "false")
        assert envs.SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK.get() is False


# -- the pool configurator's gate ------------------------------------------------------


def _online_gate(tree: Path) -> Callable:
    """The configurator's `if envs.SGLANG_OPT_USE_ONLINE_COMPRESS.get(): ...` block, as a
    function of (self, kvc) with the tree's real envs."""
    path = tree / CONFIGURATOR
    text = path.read_text()
    block = next(
        n
        for n in ast.walk(ast.parse(text))
        if isinstance(n, ast.If)
        and ast.unparse(n.test) == "envs.SGLANG_OPT_USE_ONLINE_COMPRESS.get()"
        and "allow_experimental_online_c128_mtp" in ast.unparse(n)
    )
    lines = text.splitlines()[block.lineno - 1 : block.end_lineno]
    source = "def _gate(self, kvc):\n" + textwrap.indent(textwrap.dedent("\n".join(lines)), "    ")
    from sglang.srt.environ import envs

    namespace = {"envs": envs, "logger": Log()}
    exec(compile(source, str(path), "exec"), namespace)
    return namespace["_gate"], namespace["logger"]


def _run_gate(tree: Path, spec: str, banks: int) -> Optional[str]:
    """None when the gate accepts, else 'Type: message'."""
    with sglang_imports(tree):
        gate, _ = _online_gate(tree)
        try:
            gate(SimpleNamespace(online_c128_mtp_max_draft_tokens=banks), SimpleNamespace(spec_algorithm=Spec(spec)))
        except (AssertionError, ValueError) as e:
            return f"{type(e).__name__}: {e}"
    return None


@pytest.mark.parametrize(
    "spec,mtp_env", [("NONE", False), ("EAGLE", False), ("EAGLE", True), ("DSPARK", False), ("DSPARK", True)]
)
def test_gate_env_unset_is_upstream(trees, monkeypatch, spec: str, mtp_env: bool) -> None:
    _, patched, upstream = trees
    monkeypatch.setenv(ONLINE_ENV, "1")
    if mtp_env:
        monkeypatch.setenv(MTP_ENV, "1")
    ours, theirs = _run_gate(patched, spec, 8), _run_gate(upstream, spec, 8)
    assert ours == theirs
    if spec == "DSPARK":
        assert theirs is not None and theirs.startswith("AssertionError")


def test_gate_env_set(trees, monkeypatch) -> None:
    pytest.importorskip("torch")  # the overlay module the gate imports
    _, patched, upstream = trees
    monkeypatch.setenv(ONLINE_ENV, "1")
    monkeypatch.setenv(ENV, "1")
    with sglang_imports(patched):
        from sglang.srt.layers.attention.dsv4.online_c128_dspark import DSPARK_MAX_BANKS
    assert _run_gate(patched, "DSPARK", 8) is None
    assert _run_gate(patched, "DSPARK", DSPARK_MAX_BANKS) is None
    assert _run_gate(upstream, "DSPARK", 8).startswith("AssertionError")
    for banks in (0, DSPARK_MAX_BANKS + 1):
        err = _run_gate(patched, "DSPARK", banks)
        assert err.startswith("ValueError") and f"verify width is {banks}" in err
    # The other algorithms keep upstream's answer with the DSPARK env set.
    for spec in ("NONE", "EAGLE"):
        assert _run_gate(patched, spec, 8) == _run_gate(upstream, spec, 8)
    monkeypatch.setenv(MTP_ENV, "1")
    err = _run_gate(patched, "DSPARK", 8)
    assert err.startswith("ValueError") and MTP_ENV in err
    assert _run_gate(patched, "EAGLE", 8) is None


def test_gate_logs_dspark(trees, monkeypatch) -> None:
    pytest.importorskip("torch")
    _, patched, _ = trees
    monkeypatch.setenv(ONLINE_ENV, "1")
    monkeypatch.setenv(ENV, "1")
    with sglang_imports(patched):
        import logging

        from sglang.srt.layers.attention.dsv4 import online_c128_dspark

        seen = []
        handler = logging.Handler()
        handler.emit = seen.append
        online_c128_dspark.logger.addHandler(handler)
        gate, _ = _online_gate(patched)
        gate(SimpleNamespace(online_c128_mtp_max_draft_tokens=8), SimpleNamespace(spec_algorithm=Spec("DSPARK")))
    assert any("DSPARK verify enabled" in r.getMessage() and "banks=8" in r.getMessage() for r in seen)


# -- the memory pool's ring size -------------------------------------------------------


def _ring_size(tree: Path, online: bool) -> Callable:
    with sglang_imports(tree):
        from sglang.srt.environ import envs

        namespace = {"envs": envs, "ONLINE_C128": online}
        return load_function(tree / MEMORY_POOL, "get_compress_state_ring_size", namespace)


def _ring(fn: Callable, release: str, ratio: int, drafts: int):
    arg = drafts > 0 if release == "v0.5.20" else drafts  # 0.5.20 takes is_speculative
    try:
        return fn(ratio, arg)
    except AssertionError as e:
        return f"AssertionError: {e}"


@pytest.mark.parametrize("online", [True, False])
@pytest.mark.parametrize("envs_set", [(), (MTP_ENV,), (ENV,), (MTP_ENV, ENV)])
def test_ring_size(trees, monkeypatch, online: bool, envs_set) -> None:
    release, patched, upstream = trees
    for name in envs_set:
        monkeypatch.setenv(name, "1")
    ours, theirs = _ring_size(patched, online), _ring_size(upstream, online)
    for ratio in (4, 128):
        for drafts in (0, 8):
            got, want = _ring(ours, release, ratio, drafts), _ring(theirs, release, ratio, drafts)
            if online and ratio == 128 and drafts and envs_set == (ENV,):
                # The one changed answer: DSPARK's env admits speculative online c128.
                assert want == "AssertionError: online c128 does not support MTP"
                assert got == 1
            else:
                assert got == want


def test_bank_limit_matches_kernel() -> None:
    if not KERNEL.is_file():
        pytest.skip(f"{KERNEL.relative_to(REPO_ROOT)} not in this checkout (series II kernels)")
    m = re.search(r"kMaxBanks\s*=\s*(\d+)", KERNEL.read_text())
    assert m, "kMaxBanks not found in the kernel"
    source = CONTROLLER.read_text()
    assert f"DSPARK_MAX_BANKS = {m.group(1)}\n" in source
