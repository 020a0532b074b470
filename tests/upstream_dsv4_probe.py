"""Run upstream's own ``DSV4PoolConfigurator`` from an unpacked sglang release wheel.

The release's ``srt/model_executor/pool_configurator.py`` is executed unchanged (its
real source file, so tracebacks point at upstream lines). Its imports are answered by
an import hook local to that module's globals; ``sys.modules`` only holds a private
entry for the module while its dataclasses are created:

* real code, lifted from the same release with ``ast`` and executed as-is: the
  ring/indexer/layout helpers of ``srt/mem_cache/deepseek_v4_memory_pool.py``,
  ``kernels/ops/attention/dsv4/kv_layout.py`` (0.5.21+), ``ceil_div``/``ceil_align``
  of ``srt/utils/common.py`` and ``max_speculative_num_draft_tokens`` of
  ``srt/runtime_context.py``;
* stand-ins for process state: ``envs`` and the ``get_schedule``/``get_spec``/... bags
  (strict: reading a name they do not define raises, so a new dependency shows up as
  an error, not as a silent default), unified-KV gates answering "off", CUDA (not HIP,
  not NPU) platform flags, and a tiny ``torch`` (only ``float32.itemsize`` and
  ``cuda.is_available()`` are reachable on this path);
* opaque placeholders for modules that only other configurators use.

No torch and no GPU are needed. The stand-in speculative algorithm answers
``is_eagle()`` True when online C128 runs with speculation: upstream admits online +
speculation only for EAGLE (``pool_configurator.py:1259-1285``); PR #32035 admits
DSPARK there, which for sizing is the same thing.
"""

from __future__ import annotations
import __future__

import ast
import builtins
import functools
import logging
import os
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

SGL_RELEASES = Path(os.environ.get("C128PATCH_SGL_RELEASES", "/tmp/sgl"))
VERSIONS = ("v0.5.20", "v0.5.21", "v0.5.22", "v0.5.23")

_FUTURE_ANNOTATIONS = __future__.annotations.compiler_flag


def release_root(version: str) -> Path:
    """The unpacked ``sglang/`` package of one release."""
    return SGL_RELEASES / version / "sglang"


def available(version: str) -> bool:
    return (release_root(version) / "srt/model_executor/pool_configurator.py").is_file()


@dataclass(frozen=True)
class ProbeConfig:
    compress_ratios: tuple[int, ...]
    budget_bytes: int
    swa_full_tokens_ratio: float = 0.1
    max_running_requests: Optional[int] = 256
    speculative: bool = True
    num_draft_tokens: int = 8
    online: bool = False
    state_dtype: str = "float32"
    page_size: int = 256
    kv_layout: str = "v4"
    attn_dp_size: int = 1
    context_len: int = 1_048_576


class _Strict(SimpleNamespace):
    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"upstream read {name!r}, which the probe does not model")


class _Env:
    def __init__(self, value: Any) -> None:
        self._value = value

    def get(self) -> Any:
        return self._value


class _Envs:
    def __init__(self, values: dict[str, Any]) -> None:
        self._values = values

    def __getattr__(self, name: str) -> _Env:
        if name.startswith("_") or name not in self._values:
            raise AttributeError(f"upstream read env {name!r}, which the probe does not model")
        return _Env(self._values[name])


class _Opaque:
    """Placeholder for names only other configurators use; never reached here."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *a: Any, **k: Any) -> "_Opaque":
        return _Opaque(self._name + "()")

    def __getattr__(self, name: str) -> "_Opaque":
        return _Opaque(f"{self._name}.{name}")


class _OpaqueModule(types.ModuleType):
    def __getattr__(self, name: str) -> _Opaque:
        return _Opaque(f"{self.__name__}.{name}")


class _SpecAlgorithm:
    def __init__(self, name: Optional[str], online: bool) -> None:
        self._name = name
        self._online = online

    def is_none(self) -> bool:
        return self._name is None

    def is_eagle(self) -> bool:
        # The PR's gate: DSPARK is admitted where upstream admits EAGLE.
        return self._name is not None and self._online

    def is_dspark(self) -> bool:
        return self._name == "DSPARK"

    def is_dflash_family(self) -> bool:
        return self._name == "DSPARK"


# Modules only the other configurators (MHA/MLA/Mamba/SWA cap) import.
_OPAQUE_MODULES = {
    "sglang.srt.arg_groups.overrides",
    "sglang.srt.configs.hybrid_arch",
    "sglang.srt.configs.model_config",
    "sglang.srt.mem_cache.allocation_sizing",
    "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.mem_cache.page_interleave",
}

_POOL_HELPERS = (
    "ONLINE_C128",
    "get_dsv4_indexer_bytes_per_token",
    "get_compress_state_ring_size",
    "resolve_compress_state_ring_size",
    "collect_sources_by_ratio",
    "get_compress_state_write_pad",
    "is_dspark_spec",
    "uses_draft_swa_ring",
    "get_draft_swa_ring_size",
    "get_swa_ring_size",
    "_num_dsv4_physical_kv_pages",
    "resolve_compressed_kv_layout",
    "select_dsv4_kv_layout",
    "dsv4_unified_row_bytes",
)


@functools.lru_cache(maxsize=None)
def _compiled(path: Path):
    return compile(path.read_text(), str(path), "exec")


@functools.lru_cache(maxsize=None)
def _lifted(path: Path, names: tuple[str, ...]):
    tree = ast.parse(path.read_text(), filename=str(path))
    picked = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names:
            picked.append(node)
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id in names for t in node.targets
        ):
            picked.append(node)
    module = ast.Module(body=picked, type_ignores=[])
    code = compile(module, str(path), "exec", flags=_FUTURE_ANNOTATIONS, dont_inherit=True)
    return code, [getattr(n, "name", None) or n.targets[0].id for n in picked]


def _lift(path: Path, names: tuple[str, ...], into: dict[str, Any]) -> list[str]:
    """Execute the top-level defs/assignments of ``path`` named in ``names``."""
    code, picked = _lifted(path, names)
    exec(code, into)
    return picked


def _module(name: str, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    return mod


def _import_hook(modules: dict[str, types.ModuleType]):
    real_import = builtins.__import__

    def hook(name, globals=None, locals=None, fromlist=(), level=0):  # noqa: A002
        if name == "torch" or name.startswith("torch."):
            return modules["torch"]
        if name == "sglang" or name.startswith("sglang."):
            if name in modules:
                return modules[name]
            if name in _OPAQUE_MODULES:
                return _OpaqueModule(name)
            raise ImportError(f"upstream imported {name!r}, which the probe does not model")
        return real_import(name, globals, locals, fromlist, level)

    return hook


def _builtins_with(hook) -> dict[str, Any]:
    b = dict(builtins.__dict__)
    b["__import__"] = hook
    return b


def build_configurator(version: str, cfg: ProbeConfig):
    """A real ``DSV4PoolConfigurator`` of ``version`` for ``cfg`` (CUDA, non-unified)."""
    root = release_root(version)
    spec_name = "DSPARK" if cfg.speculative else None
    draft = cfg.num_draft_tokens if cfg.speculative else None

    envs = _Envs(
        {
            "SGLANG_OPT_USE_ONLINE_COMPRESS": cfg.online,
            "SGLANG_EXPERIMENTAL_ONLINE_C128_MTP": cfg.online and cfg.speculative,
            "SGLANG_DSV4_COMPRESS_STATE_DTYPE": cfg.state_dtype,
            "SGLANG_DSV4_KV_LAYOUT": cfg.kv_layout,
            "SGLANG_DSV4_COMPRESSED_KV_LAYOUT": "auto",
        }
    )
    schedule = _Strict(
        swa_full_tokens_ratio=cfg.swa_full_tokens_ratio,
        _swa_full_tokens_ratio_explicitly_set=True,
        max_running_requests=cfg.max_running_requests,
        chunked_prefill_size=8192,
        swa_prefix_tails=None,
        disable_overlap_schedule=False,
    )
    spec = _Strict(
        speculative_algorithm=spec_name,
        speculative_num_draft_tokens=draft,
        max_speculative_num_draft_tokens=None,
    )
    exec_bag = _Strict(
        kernel=_Strict(dsv4_attn_backend="flashmla", enable_deepseek_v4_fp4_indexer=False),
        features=_Strict(enable_encoder_swa_bounded_replay=False),
    )
    memory = _Strict(enable_hisparse=False, disable_radix_cache=False)
    disagg = _Strict(disaggregation_mode="null", disaggregation_decode_extra_slots=0)
    parallel = _Strict(attn_dcp_size=1, pp_size=1)

    torch_stub = _module(
        "torch",
        float32=SimpleNamespace(itemsize=4),
        cuda=SimpleNamespace(is_available=lambda: False),
        version=SimpleNamespace(cuda=None),
    )
    utils_common = _module(
        "sglang.srt.utils.common",
        is_hip=lambda: False,
        is_npu=lambda: False,
        is_float4_e2m1fn_x2=_Opaque("is_float4_e2m1fn_x2"),
        spec_decode_alloc_len_per_request=_Opaque("spec_decode_alloc_len_per_request"),
        get_cuda_graph_max_batch_size=_Opaque("get_cuda_graph_max_batch_size"),
    )
    _lift(root / "srt/utils/common.py", ("ceil_div", "ceil_align"), utils_common.__dict__)
    runtime = _module(
        "sglang.srt.runtime_context",
        get_schedule=lambda: schedule,
        get_spec=lambda: spec,
        get_exec=lambda: exec_bag,
        get_memory=lambda: memory,
        get_disagg=lambda: disagg,
        get_parallel=lambda: parallel,
        get_model=lambda: _Strict(),
        get_platform=lambda: _Strict(is_hip=False),
    )
    _lift(root / "srt/runtime_context.py", ("max_speculative_num_draft_tokens",), runtime.__dict__)
    gate = _module(
        "unified_kv_gate", is_unified_kv_fp8=lambda: False, is_unified_kv_triton=lambda: False
    )
    modules: dict[str, types.ModuleType] = {
        "torch": torch_stub,
        "sglang.srt.environ": _module("sglang.srt.environ", envs=envs),
        "sglang.srt.runtime_context": runtime,
        "sglang.srt.utils.common": utils_common,
        "sglang.srt.utils": utils_common,
        "sglang.srt.layers.attention.dsv4.unified_kv_gate": gate,
        "sglang.kernels.ops.attention.dsv4.unified_kv_kernels.env_gate": gate,
    }
    hook_builtins = _builtins_with(_import_hook(modules))

    kv_layout_path = root / "kernels/ops/attention/dsv4/kv_layout.py"
    kv_layout_mod = None
    if kv_layout_path.is_file():
        kv_layout_mod = _module("sglang.kernels.ops.attention.dsv4.kv_layout", __builtins__=hook_builtins)
        exec(_compiled(kv_layout_path), kv_layout_mod.__dict__)
        modules[kv_layout_mod.__name__] = kv_layout_mod

    import typing

    pool = _module(
        "sglang.srt.mem_cache.deepseek_v4_memory_pool",
        __builtins__=hook_builtins,
        envs=envs,
        get_spec=runtime.get_spec,
        get_exec=runtime.get_exec,
        get_platform=runtime.get_platform,
        _is_hip=False,
        ceil_div=utils_common.ceil_div,
        torch=torch_stub,
        logger=logging.getLogger("upstream_dsv4_probe"),
        KVLayout=getattr(kv_layout_mod, "KVLayout", None),
        DSV41_INDEX_PAGE_SIZE=64,  # only ratio-1/2 pools read it
        **{n: getattr(typing, n) for n in ("List", "Optional", "Sequence", "Tuple", "Union")},
    )
    lifted = _lift(root / "srt/mem_cache/deepseek_v4_memory_pool.py", _POOL_HELPERS, pool.__dict__)
    assert "ONLINE_C128" in lifted and "get_compress_state_ring_size" in lifted, lifted
    modules[pool.__name__] = pool

    pc_path = root / "srt/model_executor/pool_configurator.py"
    pc_name = "_c128patch_upstream_pool_configurator_" + version.replace(".", "_")
    pc = _module(pc_name, __builtins__=hook_builtins)
    # dataclasses resolves string annotations through sys.modules[cls.__module__]
    # while the classes are created; the entry is private and dropped right after.
    sys.modules[pc_name] = pc
    try:
        exec(_compiled(pc_path), pc.__dict__)
    finally:
        sys.modules.pop(pc_name, None)

    layers = len(cfg.compress_ratios)
    kvc = _Strict(
        kv_cache_dtype_str="fp8_e4m3",
        model_config=_Strict(
            qk_nope_head_dim=448,
            qk_rope_head_dim=64,
            index_head_dim=128,
            context_len=cfg.context_len,
            compress_ratios=list(cfg.compress_ratios),
            window_size=128,
            hf_config=_Strict(kv_source_layer_ids=[]),
        ),
        layer_info=_Strict(start_layer=0, end_layer=layers),
        pp_size=1,
        ps=_Strict(pp_size=1, attn_dp_size=cfg.attn_dp_size),
        attn_dp_size=cfg.attn_dp_size,
        sliding_window_size=128,
        page_size=cfg.page_size,
        spec_algorithm=_SpecAlgorithm(spec_name, cfg.online),
        spec_aux_config=_Strict(),
        is_draft_worker=False,
    )
    return pc.DSV4PoolConfigurator(kvc)


def run_upstream(version: str, cfg: ProbeConfig) -> dict[str, Any]:
    """Upstream's numbers for one configuration: full tokens, c128 fixed bytes, b, R."""
    conf = build_configurator(version, cfg)
    r = conf._resolve_max_running_requests_per_worker(cfg.budget_bytes)
    out = {
        "c128_fixed_bytes": conf._get_c128_state_fixed_bytes(r),
        "bytes_per_full_token": conf.bytes_per_full_token,
        "max_running_requests_per_worker": r,
        "full_tokens": None,
        "swa_tokens": None,
        "refused": None,
    }
    try:
        pool_cfg = conf.calculate_pool_sizes(cfg.budget_bytes, cfg.page_size)
    except (ValueError, RuntimeError) as e:  # upstream refuses to start
        out["refused"] = str(e)
        return out
    out["full_tokens"] = pool_cfg.max_total_num_tokens
    out["swa_tokens"] = pool_cfg.swa_max_total_num_tokens
    return out
