"""The release's real DSV4 backend verify-metadata path on a stand-in backend, for the series III
tests (CPU, with a torch model of the kernels) and the GPU tier (real kernels, CUDA graphs).

`VerifyBackend(tree, controller_cls, mtp_cls, ...)` builds an object whose methods are the
patched release's own `DeepseekV4AttnBackend` methods (`METHODS`, compiled out of
`deepseek_v4_backend.py`), reading module-level helpers that are also the release's own
(`_GraphBucket`, `_get_target_verify_bs`, `DSV4RawVerifyMetadata`, ...; `ForwardMode` from
`forward_batch_info.py`; the ragged layout functions from `speculative/ragged_verify.py`).
Only what the verify path reaches outside the c128 work is a stand-in: the core-attention /
indexer builders, `DSV4Metadata` (a recorder of its fields), `get_parallel()`, the paged
compressor planner for c4. A global the release starts reading that this file does not
provide fails loudly (`series3_tree.load_with_globals`).

Drives: `replay_prep(fb, in_capture=...)` (graph replay prep: `init_forward_metadata_out_graph`)
and `eager_prep(fb)` (`_build_forward_metadata`), both of which hand the step to the
controller (`prepare_verify`), then `upgrade()` (the raw -> full verify upgrade that the
verify graph records: `make_forward_metadata_from_raw_verify`).
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import functools
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Tuple, Union

import torch

from upstream_source import load_class, load_function, load_with_globals, parsed

BACKEND = "sglang/srt/layers/attention/deepseek_v4_backend.py"
FORWARD_BATCH_INFO = "sglang/srt/model_executor/forward_batch_info.py"
CLASS = "DeepseekV4AttnBackend"

# The backend methods the verify metadata path runs (those a release lacks are skipped).
METHODS = (
    "init_forward_metadata_out_graph",
    "_resolve_verify_layout",
    "_target_verify_graph_key",
    "init_forward_metadata_target_verify",
    "_make_target_verify_c128_metadata",
    "replay_cuda_graph_metadata_from",
    "make_forward_metadata_from_raw_verify",
    "_build_forward_metadata",
    "_uses_early_verify_metadata",
)
# Module-level names of the backend file the methods read, compiled from the file itself.
MODULE_NAMES = (
    "SWA_WINDOW",
    "_GraphBucket",
    "_get_target_verify_bs",
    "_get_logical_forward_mode",
    "_copy_or_replace",
    "DSV4RawVerifyMetadata",
    "DSV4RawDecodeMetadata",
)


class Metadata:
    """Stand-in for DSV4Metadata: records what the upgrade builds it with."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs

    @property
    def c128_compress_metadata(self) -> Any:
        return self.kwargs["c128_compress_metadata"]


def _has_method(path: Path, name: str) -> bool:
    cls = next(n for n in parsed(path)[1].body if isinstance(n, ast.ClassDef) and n.name == CLASS)
    return any(isinstance(n, ast.FunctionDef) and n.name == name for n in cls.body)


def _top_level(path: Path, names: Tuple[str, ...], namespace: dict) -> None:
    """Compile the module-level assignments, functions and classes `names` of `path`."""
    tree = parsed(path)[1]
    for name in names:
        node = next(
            n for n in tree.body
            if (isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name)
            or (isinstance(n, ast.Assign) and [ast.unparse(t) for t in n.targets] == [name])
        )
        if isinstance(node, ast.ClassDef):
            load_class(path, name, namespace)
        elif isinstance(node, ast.FunctionDef):
            load_function(path, name, namespace)
        else:
            exec(compile(ast.Module([node], []), str(path), "exec"), namespace)


def forward_mode_class(tree: Path) -> type:
    """The release's own ForwardMode (an IntEnum whose predicates read only itself)."""
    return load_class(tree / FORWARD_BATCH_INFO, "ForwardMode", {"IntEnum": enum.IntEnum, "auto": enum.auto})


def mtp_controller_class(tree: Path) -> type:
    """The release's own OnlineC128MTPController, compiled against stand-in kernel wrappers
    (the verify path only asks it whether it is enabled: the DSPARK env refuses the MTP env)."""
    from sglang.srt.environ import envs

    for rel in ("sglang/srt/layers/attention/dsv4/online_c128_mtp.py",
                "sglang/kernels/ops/attention/dsv4/online_c128_mtp.py"):
        path = tree / rel
        if path.is_file() and "class OnlineC128MTPController" in path.read_text():
            break

    def no_kernel(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("upstream's MTP kernels ran on the DSPARK verify path")

    namespace = {
        "envs": envs, "torch": torch, "dataclass": dataclasses.dataclass, "Any": Any, "List": List,
        "Optional": Optional, "_jit_online_c128_mtp_module": no_kernel,
        "online_c128_mtp_mark_pending": no_kernel, "online_c128_mtp_commit_pending": no_kernel,
        "online_c128_mtp_write_prefix_states": no_kernel,
    }
    for name in ("_OnlineC128LayerRuntime", "_OnlineC128VerifyContext", "OnlineC128MTPController"):
        load_class(path, name, namespace)
    return namespace["OnlineC128MTPController"]


class VerifyBackend:
    """A DSPARK target backend: the release's verify-metadata methods, a real controller."""

    def __init__(self, tree: Path, *, controller_cls, pool, width: int, max_bs: int, device,
                 req_to_token: torch.Tensor, spec_algorithm: Any, launch: Optional[dict] = None) -> None:
        from sglang.srt.speculative import ragged_verify

        from series3_standins import launch_namespaces

        path = tree / BACKEND
        forward_mode = forward_mode_class(tree)
        self.ForwardMode = forward_mode
        parallel = launch_namespaces(**(launch or {}))["parallel"]
        ns: Dict[str, Any] = {
            "torch": torch, "enum": enum, "functools": functools, "dataclass": dataclasses.dataclass,
            "field": dataclasses.field, "Optional": Optional, "List": List, "Dict": Dict, "Union": Union,
            "Tuple": Tuple, "Any": Any, "logger": logging.getLogger("c128patch.series3_backend"),
            "ForwardMode": forward_mode, "DSV4Metadata": Metadata,
            "get_parallel": lambda: parallel,
            "resolve_ragged_verify_layout": ragged_verify.resolve_ragged_verify_layout,
            "read_ragged_verify_mode": ragged_verify.read_ragged_verify_mode,
            "RaggedVerifyMode": ragged_verify.RaggedVerifyMode,
            "compute_target_verify_graph_key": ragged_verify.compute_target_verify_graph_key,
            "create_paged_compressor_data": self._paged_compressor_data,
            "per_step_draft_out_cache_loc": _not_on_the_verify_path,
            "DSV41_EARLY_VERIFY_VARIANTS": frozenset(),
        }
        _top_level(path, MODULE_NAMES, ns)
        self.GraphBucket = ns["_GraphBucket"]
        self.RawVerifyMetadata = ns["DSV4RawVerifyMetadata"]
        self.methods = [m for m in METHODS if _has_method(path, m)]
        for name in self.methods:
            fn = load_with_globals(path, f"{CLASS}.{name}", ns)
            setattr(self, name, fn.__get__(self))
        self.created: List[int] = []  # compress ratios upstream's paged planner was asked for

        # What DeepseekV4AttnBackend.__init__ / init_cuda_graph_state set up for a DSPARK
        # target with online c128 (see the release's constructor).
        self.device = torch.device(device)
        self.model_runner = SimpleNamespace(is_draft_worker=False, spec_algorithm=spec_algorithm, attn_backend=self)
        self.token_to_kv_pool = pool
        self.req_to_token = req_to_token
        self.req_to_token_pool = SimpleNamespace(req_to_token=req_to_token)
        self.speculative_num_draft_tokens = width
        self.speculative_num_steps, self.topk, self.speculative_step_id = 1, 1, 0
        self.mtp_enabled = True  # topk > 0: DSPARK forces topk = 1
        self.needs_cpu_seq_lens = False  # DSPARK keeps host seq lens off
        self.is_dspark_draft = False
        self.builds_verify_metadata_early = False
        self.has_c4, self.has_c128 = False, True
        self.page_size, self.swa_page_size = 256, 256
        self.MAX_SEQ_LEN_FOR_CAPTURE = int(req_to_token.shape[1])
        self.cuda_int32_kwargs = {"device": self.device, "dtype": torch.int32}
        self.extend_seq_lens_buffer = torch.zeros(max_bs, dtype=torch.int32, device=self.device)
        self.extend_start_loc_buffer = torch.zeros(max_bs, dtype=torch.int32, device=self.device)
        self.cuda_graph_metadata_of_bucket_and_bs = {bucket: {} for bucket in self.GraphBucket}
        self.forward_metadata = None
        self._current_capture_raw = None
        self.online_c128_mtp = mtp_controller_class(tree)(self)
        self.online_c128_dspark = controller_cls(self)

    # -- what make_forward_metadata_from_raw_verify reaches besides the c128 plan ----------

    def _paged_compressor_data(self, *args: Any, compress_ratio: int, **kwargs: Any) -> Tuple[str, int]:
        self.created.append(compress_ratio)
        return ("paged-compressor-plan", compress_ratio)

    def _expand_prefill_casually_vectorized(self, **kwargs: Any):
        return torch.zeros(4), torch.zeros(4)

    expand_extend_with_same_length = _expand_prefill_casually_vectorized

    def make_core_attn_metadata(self, **kwargs: Any) -> SimpleNamespace:
        return SimpleNamespace(low_ratios=())

    def init_forward_metadata_indexer(self, *args: Any, **kwargs: Any) -> str:
        return "indexer"

    # -- drives ---------------------------------------------------------------------

    def forward_batch(self, *, seq_lens, req_pool_indices, out_cache_loc, draft_tokens: int,
                      live_layout=None) -> SimpleNamespace:
        """A TARGET_VERIFY ForwardBatch as the DSPARK verify hands it to the backend: padded
        rows (request slot 0), `draft_tokens` verify ids, the live compact layout or None."""
        return SimpleNamespace(
            forward_mode=self.ForwardMode.TARGET_VERIFY,
            batch_size=int(seq_lens.shape[0]),
            seq_lens=seq_lens,
            req_pool_indices=req_pool_indices,
            out_cache_loc=out_cache_loc,
            positions=torch.zeros(out_cache_loc.shape[0], dtype=torch.int64, device=self.device),
            seq_lens_sum=None,
            seq_lens_cpu=None,
            max_seq_len_override=None,
            encoder_swa_replay=None,
            encoder_swa_row_floor=None,
            spec_info=SimpleNamespace(
                draft_token=torch.zeros(draft_tokens, dtype=torch.int64, device=self.device),
                draft_token_num=self.speculative_num_draft_tokens,
                ragged_verify_layout=live_layout,
            ),
        )

    def replay_prep(self, fb, *, in_capture: bool = False):
        """The graph replay (or capture) prep: leaves the bucket's raw verify metadata as
        `forward_metadata` (the captured object, refreshed in place on replay)."""
        self.init_forward_metadata_out_graph(fb, in_capture=in_capture)
        return self.forward_metadata

    def eager_prep(self, fb):
        return self._build_forward_metadata(fb)

    def upgrade(self, raw) -> Metadata:
        """The raw -> full verify upgrade (recorded inside the verify graph)."""
        return self.make_forward_metadata_from_raw_verify(
            raw_metadata=raw, online_c128_state_slot_offset=self.online_c128_mtp.state_slot_offset()
        )


def _not_on_the_verify_path(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("a decode-only helper ran on the verify path")
