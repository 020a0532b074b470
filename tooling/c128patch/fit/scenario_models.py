"""The torch models of the series' CUDA kernels and the fakes around the tree's controller, for the DSPARK scenarios
(``scenarios_runner``, which loads this file by path in the box: stdlib and torch only) and the tests."""

from __future__ import annotations

import types
from collections import namedtuple
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Tuple

try:  # the tests' torch-free helpers import the runtime-context stand-in from here
    import torch
except ImportError:  # pragma: no cover - the box runs the scenarios only where torch imports
    torch = None

HEAD_DIM = 512
CHUNK = 128
STATE_DIM = 3 * HEAD_DIM

# Same fields as upstream's CompressorPrefillPlan (the controller only passes it through).
PrefillPlan = namedtuple("PrefillPlan", "compress_ratio plan_c plan_w pin_buffer")


# -- CompressPlan bytes (sgl_kernel/deepseek_v4/compress_v2.cuh) ------------------------


def encode_plans(rows: List[Tuple[int, int, int, int, int]], n: int, device) -> torch.Tensor:
    """[(seq_len, ragged_id, buffer_len, read_page_0, read_page_1)] -> uint8 [n, 16], the rest invalid."""
    words = torch.zeros((n, 4), dtype=torch.int64)
    words[:, 0] = 0xFFFFFFFF
    words[:, 2:] = -1
    for i, (seq_len, ragged_id, buffer_len, rp0, rp1) in enumerate(rows):
        words[i] = torch.tensor([seq_len, ragged_id | (buffer_len << 16), rp0, rp1])
    as_u32 = words & 0xFFFFFFFF
    as_i32 = torch.where(as_u32 >= 2**31, as_u32 - 2**32, as_u32).to(torch.int32)
    return as_i32.view(torch.uint8).reshape(n, 16).to(device)


def decode_plans(plan_c: torch.Tensor) -> List[Optional[Tuple[int, int, int, int, int]]]:
    """uint8 [n, 16] -> per entry (seq_len, ragged_id, buffer_len, rp0, rp1) or None."""
    words = plan_c.cpu().contiguous().view(torch.int32).reshape(-1, 4).to(torch.int64)
    return [None if w0 & 0xFFFFFFFF == 0xFFFFFFFF else (w0 & 0xFFFFFFFF, w1 & 0xFFFF, (w1 >> 16) & 0xFFFF, rp0, rp1)
            for w0, w1, rp0, rp1 in words.tolist()]


# -- the kernels' host checks (csrc/deepseek_v4/online_c128_dspark.cuh: RuntimeCheck, TensorMatcher) -----------
# The models raise where the kernels do (RuntimeError, the .cuh's words), so an argument a GPU would refuse (more
# banks than the state has rows, a dtype, a shape, a slot bound) fails the scenario, never passes it on the CPU.

MAX_BANKS, MAX_BATCH, MAX_Q_TOKENS, INT32_MAX = 1024, 1 << 24, 1 << 16, 2**31 - 1
STATE_ROW_ELEMS = STATE_DIM


class KernelCheck(RuntimeError):
    """A kernel's RuntimeCheck failed; ``values``: the arguments it refused (name -> value), so the scenarios can
    name where our code got them."""

    def __init__(self, message: str, values: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(message)
        self.values = values or {}


def _check(ok: bool, *what: Any, values: Optional[Dict[str, Any]] = None) -> None:
    if not ok:
        raise KernelCheck("".join(str(w) for w in what), values)


def _matches(t: Any, shape: Tuple[Optional[int], ...], dtypes: Any, name: str, devices: List[Any]) -> None:
    """`TensorMatcher(shape).with_dtype<...>().with_device(device_).verify(t)`: the shape (None: any size), the
    dtype, contiguous rows, one device for all (``devices`` collects it)."""
    _check(isinstance(t, torch.Tensor), "dspark c128: ", name, " is not a tensor (", type(t).__name__, ")")
    _check(t.dim() == len(shape) and all(w is None or w == int(n) for w, n in zip(shape, t.shape)),
           "dspark c128: ", name, " has shape ", tuple(t.shape), ", expected ", tuple(shape))
    dtypes = dtypes if isinstance(dtypes, tuple) else (dtypes,)
    _check(t.dtype in dtypes, "dspark c128: ", name, " has dtype ", t.dtype, ", expected ",
           " or ".join(map(str, dtypes)))
    _check(t.is_contiguous(), "dspark c128: ", name, ": Tensor is not contiguous as expected")
    devices.append(t.device)
    _check(len(set(devices)) == 1, "dspark c128: ", name, " is on ", t.device, ", the others on ", devices[0])


def _aligned(t: Any, name: str) -> None:
    _check(t.data_ptr() % 16 == 0, "dspark c128: ", name, " must be 16-byte aligned")


def _row_tensors(seq_lens: Any, lens: Any, extend_start_loc: Any, req_pool_indices: Any, devices: List[Any]) -> int:
    """`verify_row_tensors`: four [B] tensors (int64, int32, int32, int64), B <= kMaxBatch."""
    bs = int(seq_lens.shape[0]) if isinstance(seq_lens, torch.Tensor) and seq_lens.dim() == 1 else -1
    for t, dtype, name in ((seq_lens, torch.int64, "seq_lens"), (lens, torch.int32, "verify_lens"),
                           (extend_start_loc, torch.int32, "extend_start_loc"),
                           (req_pool_indices, torch.int64, "req_pool_indices")):
        _matches(t, (bs,), dtype, name, devices)
    _check(bs <= MAX_BATCH, "dspark c128: batch size ", bs, " exceeds the limit ", MAX_BATCH)
    return bs


def _check_num_banks(num_banks: int) -> None:
    _check(1 <= num_banks <= MAX_BANKS, "dspark c128: num_banks must be in [1, ", MAX_BANKS, "], got ", num_banks,
           values={"num_banks": num_banks})


def _check_banks(num_banks: int, state_slot_stride: int, state_rows: int) -> None:
    """`check_banks`: banks 0..num_banks of stride ``state_slot_stride`` fit the state's rows."""
    _check_num_banks(num_banks)
    values = {"num_banks": num_banks, "state_slot_stride": state_slot_stride}
    _check(state_slot_stride >= 1, "dspark c128: state_slot_stride must be positive, got ", state_slot_stride,
           values=values)
    _check(state_slot_stride <= INT32_MAX // (num_banks + 1), "dspark c128: state_slot_stride ", state_slot_stride,
           " too large for ", num_banks, " banks (int32 slot ids)", values=values)
    _check((num_banks + 1) * state_slot_stride <= state_rows, "dspark c128: state has ", state_rows, " rows but ",
           num_banks + 1, " banks of stride ", state_slot_stride, " need ", (num_banks + 1) * state_slot_stride,
           values=values)


def _check_max_num_reqs(max_num_reqs: int, state_slot_stride: int, what: str) -> None:
    _check(0 <= max_num_reqs <= state_slot_stride, "dspark c128 ", what, ": max_num_reqs ", max_num_reqs,
           " must be in [0, state_slot_stride=", state_slot_stride, "]",
           values={"max_num_reqs": max_num_reqs, "state_slot_stride": state_slot_stride})


def _check_num_q_tokens(num_q_tokens: int, what: str) -> None:
    _check(0 <= num_q_tokens <= MAX_Q_TOKENS, "dspark c128 ", what, ": num_q_tokens must be in [0, ", MAX_Q_TOKENS,
           "], got ", num_q_tokens, values={"num_q_tokens": num_q_tokens})


def _state_2d(state: Any) -> Any:
    """The op's `_state_2d`: the pool's [rows, 1536] buffer or the compressor's [rows, 1, 1536] view."""
    return state.view(state.shape[0], state.shape[2]) if state.dim() == 3 and state.shape[1] == 1 else state


def _ape_2d(ape: Any) -> Any:
    if ape.dtype != torch.float32:
        raise TypeError(f"ape must be float32, got {ape.dtype}")
    return ape.reshape(CHUNK, HEAD_DIM)


def _state_dtype(dtype: Any) -> None:
    """The op's `_module(state_dtype)`: a module is built for float32 and bfloat16 states only."""
    if dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"online c128 state dtype must be float32 or bfloat16, got {dtype}")


# -- the series II kernel API, in torch ------------------------------------------------


@dataclass
class RefVerifyPlan:
    prefill_plan: PrefillPlan
    row_emit: torch.Tensor
    row_len: torch.Tensor
    seq_lens: torch.Tensor
    extend_start_loc: torch.Tensor
    req_pool_indices: torch.Tensor
    num_banks: int
    state_slot_offset: int
    max_num_reqs: int
    verify_lens: Any = None  # as given (the op keeps them for the verify's checks)


def _recorded(args: Dict[str, Any]) -> Dict[str, Any]:
    """A call's arguments, its tensors cloned (a later step may overwrite them)."""
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items() if k != "self"}


def _fold(run: Optional[Tuple], score: torch.Tensor, value: torch.Tensor):
    if run is None:
        return score.clone(), torch.ones_like(score), value.clone()
    m, s, kv = run
    new_m = torch.maximum(m, score)
    old = s * torch.exp(m - new_m)
    new = torch.exp(score - new_m)
    new_s = old + new
    return new_m, new_s, (kv * old + value * new) / new_s


class ReferenceOps:
    """Torch model of `sglang.kernels.ops.attention.dsv4.online_c128_dspark` (the .cuh's clamps); records calls.
    ``plan_type``: the plan type it returns, as the real op does (the tier: the target's `CompressorPrefillPlan`, so
    upstream code that inspects the plan's type sees what it sees on a GPU)."""

    def __init__(self, plan_type: Any = PrefillPlan) -> None:
        self.calls: List[Tuple[str, Dict[str, Any]]] = []
        self.plan_type = plan_type

    @staticmethod
    def _window(seq, lens, start, rid, b, num_banks, num_tokens, num_slots):
        seq_b, rid_b, start_b = int(seq[b]), int(rid[b]), int(start[b])
        n = max(0, min(int(lens[b]), num_banks))
        if not (0 <= seq_b and 0 <= rid_b < num_slots and 0 <= start_b < num_tokens):
            n = 0
        return seq_b, rid_b, start_b, min(n, num_tokens - start_b)

    def dspark_verify_plan(self, seq_lens, verify_lens, extend_start_loc, req_pool_indices, *, num_q_tokens,
                           num_banks, state_slot_offset, max_num_reqs, state_dtype=None) -> RefVerifyPlan:
        self.calls.append(("plan", _recorded(locals())))
        if state_dtype is not None:
            _state_dtype(state_dtype)
        if isinstance(req_pool_indices, torch.Tensor) and req_pool_indices.dim() == 1 and not req_pool_indices.shape[0]:
            seq_lens, verify_lens, extend_start_loc, req_pool_indices = (  # `_one_empty_row`
                torch.zeros((1,), dtype=t.dtype, device=t.device)
                for t in (seq_lens, verify_lens, extend_start_loc, req_pool_indices))
        bs = _row_tensors(seq_lens, verify_lens, extend_start_loc, req_pool_indices, [])  # `run_plan`'s checks
        _check(int(num_q_tokens) <= MAX_Q_TOKENS, "dspark c128 plan: num_q_tokens ", num_q_tokens, " exceeds ",
               MAX_Q_TOKENS, " (CompressPlan.ragged_id is uint16)")
        _check_num_banks(int(num_banks))
        _check(1 <= state_slot_offset <= INT32_MAX // 2,
               "dspark c128 plan: state_slot_offset must be in [1, INT32_MAX / 2], got ", state_slot_offset,
               values={"state_slot_offset": state_slot_offset})
        _check_max_num_reqs(int(max_num_reqs), int(state_slot_offset), "plan")
        seq, lens = seq_lens.tolist(), verify_lens.tolist()
        start, rid = extend_start_loc.tolist(), req_pool_indices.tolist()
        rows, row_emit, row_len = [], [], []
        for b in range(bs):
            s, r, st, n = self._window(seq, lens, start, rid, b, num_banks, num_q_tokens, max_num_reqs)
            row_emit.append(len(rows))
            row_len.append(n)
            for j in range((s + n) // CHUNK - s // CHUNK):
                last = (s // CHUNK + 1) * CHUNK - 1 + j * CHUNK
                seg_begin = max(last - (CHUNK - 1), s)
                rows.append((last + 1, st + last - s, last - seg_begin + 1, r + state_slot_offset, r))
        device = seq_lens.device
        plan = self.plan_type(128, encode_plans(rows, num_q_tokens, device), encode_plans([], num_q_tokens, device),
                              None)
        as_i32 = lambda x: torch.tensor(x, dtype=torch.int32, device=device)  # noqa: E731
        return RefVerifyPlan(plan, as_i32(row_emit), as_i32(row_len), seq_lens, extend_start_loc, req_pool_indices,
                             int(num_banks), int(state_slot_offset), int(max_num_reqs), verify_lens)

    def dspark_verify_compress(self, state, kv_score_input, ape, plan: RefVerifyPlan, out=None):
        self.calls.append(("verify", dict(state=state, kv_score_input=kv_score_input, ape=ape, plan=plan)))
        state = _state_2d(state)
        _state_dtype(state.dtype)
        n = plan.prefill_plan.plan_c.shape[0]
        if out is None:
            out = kv_score_input.new_empty((n, HEAD_DIM))
        ape, devices = _ape_2d(ape), []  # `run_verify`'s checks, in its order
        _matches(state, (None, STATE_DIM), state.dtype, "state", devices)
        _matches(kv_score_input, (None, 2 * HEAD_DIM), torch.float32, "kv_score_input", devices)
        _matches(ape, (CHUNK, HEAD_DIM), torch.float32, "ape", devices)
        for t, name in ((state, "state"), (kv_score_input, "kv_score_input"), (ape, "ape")):
            _aligned(t, name)
        bs = _row_tensors(plan.seq_lens, plan.verify_lens, plan.extend_start_loc, plan.req_pool_indices, devices)
        _matches(plan.row_emit, (bs,), torch.int32, "row_emit", devices)
        _matches(plan.prefill_plan.plan_c, (n, 16), torch.uint8, "plan_c", devices)
        _matches(out, (n, HEAD_DIM), torch.float32, "out", devices)
        _aligned(out, "out")
        _check_banks(plan.num_banks, plan.state_slot_offset, int(state.shape[0]))
        _check_max_num_reqs(plan.max_num_reqs, plan.state_slot_offset, "verify")
        _check(kv_score_input.shape[0] >= n, "dspark c128 verify: kv_score_input has ", kv_score_input.shape[0],
               " rows, fewer than the plan's num_q_tokens ", n)
        stride = plan.state_slot_offset
        for b in range(plan.seq_lens.shape[0]):
            length = int(plan.row_len[b])
            if length == 0:
                continue
            seq, rid = int(plan.seq_lens[b]), int(plan.req_pool_indices[b])
            start, emit = int(plan.extend_start_loc[b]), int(plan.row_emit[b])
            run = None
            if seq % CHUNK:
                row = state[rid].float()
                run = (row[:HEAD_DIM], row[HEAD_DIM : 2 * HEAD_DIM], row[2 * HEAD_DIM :])
            for step in range(length):
                pos = (seq + step) % CHUNK
                token = kv_score_input[start + step].float()
                score = token[HEAD_DIM:] + ape[pos].float()
                run = _fold(None if pos == 0 else run, score, token[:HEAD_DIM])
                if pos != CHUNK - 1:
                    state[rid + (step + 1) * stride] = torch.cat(run).to(state.dtype)
                    continue
                if 0 <= emit < n:
                    out[emit] = run[2]
                emit += 1
        return out

    def make_state_ptr_table(self, states: List[torch.Tensor]) -> List[torch.Tensor]:
        """The layers' states themselves (the op: their base pointers), checked as the op checks them."""
        self.calls.append(("ptrs", dict(states=list(states))))
        states = [_state_2d(s) for s in states]
        if not states:
            raise ValueError("make_state_ptr_table needs at least one state tensor")
        if states[0].dim() != 2:
            raise ValueError(f"state must be a 2-D tensor [rows, row_elems], got {tuple(states[0].shape)}")
        for i, s in enumerate(states):
            if (s.shape, s.dtype, s.device, s.stride()) != (states[0].shape, states[0].dtype, states[0].device,
                                                            states[0].stride()):
                raise ValueError(f"state {i} differs from state 0: shape {tuple(s.shape)} vs "
                                 f"{tuple(states[0].shape)}, dtype {s.dtype} vs {states[0].dtype}")
            if not s.is_contiguous():
                raise ValueError(f"state {i} is not contiguous")
            if s.data_ptr() % 16:
                raise ValueError(f"state {i} is not 16-byte aligned")
        return list(states)

    def dspark_commit(self, state_ptrs, seq_lens, new_seq_lens, verify_lens, req_pool_indices, *, extend_start_loc,
                      num_q_tokens, num_banks, state_slot_stride, max_num_reqs, state_dtype,
                      row_elems=STATE_ROW_ELEMS, num_state_rows=None) -> None:
        self.calls.append(("commit", _recorded(locals())))
        table = state_ptrs[0]  # what `make_state_ptr_table` recorded of the layers
        if table.dtype != state_dtype or table.shape[1] != row_elems:
            raise ValueError(f"state table holds {table.dtype} rows of {table.shape[1]} elements, "
                             f"commit asked for {state_dtype} rows of {row_elems}")
        if num_state_rows is None:
            num_state_rows = int(table.shape[0])
        elif num_state_rows > table.shape[0]:
            raise ValueError(f"num_state_rows={num_state_rows} exceeds the table's {table.shape[0]} rows")
        if not req_pool_indices.shape[0]:
            return
        _state_dtype(state_dtype)
        devices = [table.device]  # `run_commit`'s checks
        bs = _row_tensors(seq_lens, verify_lens, extend_start_loc, req_pool_indices, devices)
        _matches(new_seq_lens, (bs,), torch.int64, "new_seq_lens", devices)
        _check_banks(int(num_banks), int(state_slot_stride), int(num_state_rows))
        _check_num_q_tokens(int(num_q_tokens), "commit")
        _check_max_num_reqs(int(max_num_reqs), int(state_slot_stride), "commit")
        _check(row_elems > 0 and row_elems * table.element_size() % 16 == 0, "dspark c128 commit: a state row of ",
               row_elems, " elements is not a whole number of 16-byte vectors")
        _check(len(state_ptrs) <= 65535, "dspark c128 commit: at most 65535 layers per launch, got ", len(state_ptrs))
        seq_l, lens_l = seq_lens.tolist(), verify_lens.tolist()
        start_l, rid_l = extend_start_loc.tolist(), req_pool_indices.tolist()
        for b in range(seq_lens.shape[0]):
            # the verify's own window of the row: it accepts at most the banks it wrote
            seq, rid, _, cap = self._window(seq_l, lens_l, start_l, rid_l, b, num_banks, num_q_tokens, max_num_reqs)
            accept = max(0, min(int(new_seq_lens[b]) - seq, cap))
            if accept == 0 or (seq + accept) % CHUNK == 0:
                continue
            for state in state_ptrs:
                state[rid] = state[rid + accept * state_slot_stride]


# -- the float64 truth ------------------------------------------------------------------


def chunk_state(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor, first_pos: int):
    """(max, sum, mean) of consecutive positions first_pos.. inside one chunk, float64."""
    pos = (torch.arange(kv.shape[0]) + first_pos) % CHUNK
    x = score + ape[pos]
    m = x.max(0).values
    w = torch.exp(x - m)
    s = w.sum(0)
    return m, s, (w * kv).sum(0) / s


# -- the backend the controller sees ---------------------------------------------------


class FakeStatePool:
    def __init__(self, kv_score: torch.Tensor, ratio: int = 128, online: bool = True):
        self.ratio, self.online = ratio, online
        self.kv_score_buffer = SimpleNamespace(kv_score=kv_score)


class FakeKVPool:
    def __init__(self, states: List[torch.Tensor], num_slots: int, num_banks: int, extra=()):
        self.compress_state_pools = [None, *extra]
        for state in states:
            self.compress_state_pools += [FakeStatePool(state), None]
        self.num_slots, self.num_banks = num_slots, num_banks

    def get_online_c128_mtp_max_draft_tokens(self) -> int:
        return self.num_banks

    def get_online_c128_mtp_state_slot_offset(self) -> int:
        return self.num_slots + 2

    def get_online_c128_state_num_req_slots(self) -> int:
        return self.num_slots


class Spec:
    """upstream's SpeculativeAlgorithm as the controller reads it (`name`, `is_dspark()`)."""

    def __init__(self, dspark: bool = True):
        self.dspark = dspark
        self.name = "DSPARK" if dspark else "EAGLE"

    def is_dspark(self) -> bool:
        return self.dspark


def fake_backend(pool: FakeKVPool, *, width: int, device: Any, draft: bool = False, dspark: bool = True,
                 mtp_enabled: bool = False, rows: Optional[int] = None) -> SimpleNamespace:
    """What the controller reads of a DSV4 backend and its model runner, over ``pool`` (``rows``: the request rows
    of its `req_to_token`, by default the fake pool's slots and 8)."""
    backend = SimpleNamespace(
        token_to_kv_pool=pool,
        speculative_num_draft_tokens=width,
        # Verify buckets never exceed the request rows (max_bs <= max running requests).
        req_to_token=torch.zeros((pool.num_slots + 8 if rows is None else rows, 4), dtype=torch.int32, device=device),
        device=torch.device(device),
        online_c128_mtp=SimpleNamespace(enabled=lambda: mtp_enabled),
    )
    backend.model_runner = SimpleNamespace(is_draft_worker=draft, spec_algorithm=Spec(dspark), attn_backend=backend)
    return backend


# -- the live config the controller and the rules read (sglang.srt.runtime_context) ---------

RUNTIME_CONTEXT = "sglang.srt.runtime_context"


def launch_namespaces(**overrides: Any) -> Dict[str, Any]:
    """The config namespaces (`get_exec()` ...) of a default single-GPU DSPARK launch, ``overrides`` applied."""
    fields = dict(
        enable_two_batch_overlap=False, enable_pdmux=False, disaggregation_mode="null",
        device="cuda", attn_dp_size=1, attn_cp_size=1, dcp_size=1, pp_size=1,
        attention_backend="dsv4", prefill_attention_backend=None, decode_attention_backend=None,
    )
    unknown = set(overrides) - set(fields)
    assert not unknown, unknown
    fields.update(overrides)
    return dict(
        exec_=SimpleNamespace(
            overlap=SimpleNamespace(enable_two_batch_overlap=fields["enable_two_batch_overlap"]),
            kernel=SimpleNamespace(**{k: fields[k] for k in (
                "attention_backend", "prefill_attention_backend", "decode_attention_backend")}),
        ),
        disagg=SimpleNamespace(enable_pdmux=fields["enable_pdmux"], disaggregation_mode=fields["disaggregation_mode"]),
        device=SimpleNamespace(device=fields["device"]),
        parallel=SimpleNamespace(**{k: fields[k] for k in ("attn_dp_size", "attn_cp_size", "dcp_size", "pp_size")}),
    )


def runtime_context_standin(namespaces: Dict[str, Any]) -> types.ModuleType:
    """A stand-in for `sglang.srt.runtime_context` serving `namespaces` through the getters the controller calls."""
    mod = types.ModuleType(RUNTIME_CONTEXT, "c128patch stand-in (fit/scenarios_runner.py)")
    mod.get_exec = lambda: namespaces["exec_"]
    mod.get_disagg = lambda: namespaces["disagg"]
    mod.get_device = lambda: namespaces["device"]
    mod.get_parallel = lambda: namespaces["parallel"]
    return mod
