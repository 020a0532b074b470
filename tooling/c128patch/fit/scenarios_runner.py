"""The series' DSPARK scenarios (issue 38): run by ``treecheck_runner`` in each per-gate child, after the imports
(stdlib, torch and the target tree only: no c128patch imports). Each drives the target tree's own classes and
functions on the CPU, torch models standing in for the CUDA kernels: ``run(gates, ours)`` -> scenario ->
{"status": "passed" | "failed" | "not run", "detail"}; a failure names our module, the upstream definition
involved (module.qualname, file:line) and the scenario. The tests drive the releases with the same models."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import sys
import traceback
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
    """[(seq_len, ragged_id, buffer_len, read_page_0, read_page_1)] -> uint8 [n, 16];
    the rest invalid (seq_len = -1u, read pages -1)."""
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
    """Torch model of `sglang.kernels.ops.attention.dsv4.online_c128_dspark` (the clamps and
    skips of csrc/deepseek_v4/online_c128_dspark.cuh included). Records every call."""

    def __init__(self) -> None:
        self.calls: List[Tuple[str, Dict[str, Any]]] = []

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
        assert 0 <= max_num_reqs <= state_slot_offset
        assert seq_lens.dtype == torch.int64 and req_pool_indices.dtype == torch.int64
        assert verify_lens.dtype == torch.int32 and extend_start_loc.dtype == torch.int32
        bs = seq_lens.shape[0]
        assert verify_lens.shape == extend_start_loc.shape == req_pool_indices.shape == (bs,)
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
        plan = PrefillPlan(128, encode_plans(rows, num_q_tokens, device), encode_plans([], num_q_tokens, device), None)
        as_i32 = lambda x: torch.tensor(x, dtype=torch.int32, device=device)  # noqa: E731
        return RefVerifyPlan(plan, as_i32(row_emit), as_i32(row_len), seq_lens, extend_start_loc, req_pool_indices,
                             num_banks, state_slot_offset, max_num_reqs)

    def dspark_verify_compress(self, state, kv_score_input, ape, plan: RefVerifyPlan, out=None):
        self.calls.append(("verify", dict(state=state, kv_score_input=kv_score_input, ape=ape, plan=plan)))
        assert state.dim() == 2 and state.shape[1] == STATE_DIM
        assert ape.shape == (CHUNK, HEAD_DIM) and kv_score_input.shape[1] == 2 * HEAD_DIM
        n = plan.prefill_plan.plan_c.shape[0]
        if out is None:
            out = kv_score_input.new_empty((n, HEAD_DIM))
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
        self.calls.append(("ptrs", dict(states=list(states))))
        return list(states)

    def dspark_commit(self, state_ptrs, seq_lens, new_seq_lens, verify_lens, req_pool_indices, *, extend_start_loc,
                      num_q_tokens, num_banks, state_slot_stride, max_num_reqs, state_dtype) -> None:
        self.calls.append(("commit", _recorded(locals())))
        assert seq_lens.dtype == new_seq_lens.dtype == req_pool_indices.dtype == torch.int64
        assert verify_lens.dtype == extend_start_loc.dtype == torch.int32
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
                 mtp_enabled: bool = False) -> SimpleNamespace:
    """What the controller reads of a DSV4 backend and its model runner, over ``pool``."""
    backend = SimpleNamespace(
        token_to_kv_pool=pool,
        speculative_num_draft_tokens=width,
        # Verify buckets never exceed the request rows (max_bs <= max running requests).
        req_to_token=torch.zeros((pool.num_slots + 8, 4), dtype=torch.int32, device=device),
        device=torch.device(device),
        online_c128_mtp=SimpleNamespace(enabled=lambda: mtp_enabled),
    )
    backend.model_runner = SimpleNamespace(is_draft_worker=draft, spec_algorithm=Spec(dspark), attn_backend=backend)
    return backend



# -- the live config the controller and the rules read (sglang.srt.runtime_context) ---------

RUNTIME_CONTEXT = "sglang.srt.runtime_context"


def launch_namespaces(**overrides: Any) -> Dict[str, Any]:
    """Resolved config namespaces of a default single-GPU DSPARK launch (upstream's field
    defaults; `device` resolved to cuda), as `get_exec()` / `get_disagg()` / `get_device()`
    / `get_parallel()` serve them. `overrides`: field name -> value."""
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
    """A stand-in for `sglang.srt.runtime_context` (its heavy imports cannot load here)
    serving `namespaces` through the getters the controller calls."""
    mod = types.ModuleType(RUNTIME_CONTEXT, "c128patch stand-in (fit/scenarios_runner.py)")
    mod.get_exec = lambda: namespaces["exec_"]
    mod.get_disagg = lambda: namespaces["disagg"]
    mod.get_device = lambda: namespaces["device"]
    mod.get_parallel = lambda: namespaces["parallel"]
    return mod


# -- the scenarios -----------------------------------------------------------------------

CONTROLLER = "sglang.srt.layers.attention.dsv4.online_c128_dspark"
RAGGED = "sglang.srt.speculative.ragged_verify"
GATE_ENV, ONLINE_ENV = "SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK", "SGLANG_OPT_USE_ONLINE_COMPRESS"
MTP_ENV, RAGGED_ENV = "SGLANG_EXPERIMENTAL_ONLINE_C128_MTP", "SGLANG_RAGGED_VERIFY_MODE"
W, SLOTS = 8, 6


class NotRun(Exception):
    """A module the scenario needs did not import."""


def _module(name: str) -> types.ModuleType:
    before = set(sys.modules)
    try:
        return importlib.import_module(name)
    except BaseException as exc:  # noqa: BLE001
        for stale in {m for m in set(sys.modules) - before if m.split(".")[0] == "sglang"}:
            del sys.modules[stale]  # the next scenario's import starts clean, not from half-run modules
        raise NotRun(f"{name} did not import ({type(exc).__name__}: {exc})") from None


def _set_env(values: Dict[str, Optional[str]]) -> None:
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@contextlib.contextmanager
def _launch(env: Dict[str, Optional[str]], **flags: Any):
    """A launch on a CUDA build of torch: ``env`` over the process's, the runtime context serving ``flags``."""
    saved = {name: os.environ.get(name) for name in env}
    context, build = sys.modules.get(RUNTIME_CONTEXT), (torch.version.cuda, torch.version.hip)
    _set_env(env)
    sys.modules[RUNTIME_CONTEXT] = runtime_context_standin(launch_namespaces(**flags))
    torch.version.cuda, torch.version.hip = build[0] or "12.8", None
    try:
        yield
    finally:
        _set_env(saved)
        torch.version.cuda, torch.version.hip = build
        if context is None:
            sys.modules.pop(RUNTIME_CONTEXT, None)
        else:
            sys.modules[RUNTIME_CONTEXT] = context


def startup_rules(on: bool) -> None:
    """The startup rules over launch flags and envs: gate off = upstream; DSPARK admitted; refused otherwise."""
    ctl, on_env = _module(CONTROLLER), {GATE_ENV: "1", ONLINE_ENV: "1", MTP_ENV: None, RAGGED_ENV: None}
    off_env = {GATE_ENV: None, ONLINE_ENV: None, MTP_ENV: None, RAGGED_ENV: None}
    cases = [  # (env, launch flags, algorithm, banks, a word of the refusal; None: not refused)
        (off_env, {}, Spec(False), 4, None), (off_env, {"enable_two_batch_overlap": True}, Spec(), 64, None),
        (on_env, {}, Spec(), W, None), ({**on_env, RAGGED_ENV: "compact"}, {}, Spec(), W, None),
        (on_env, {}, Spec(False), W, "EAGLE"), ({**on_env, RAGGED_ENV: "bogus"}, {}, Spec(), W, "bogus"),
        (on_env, {}, Spec(), 11, "11"), (on_env, {"enable_two_batch_overlap": True}, Spec(), W, "overlap"),
    ]
    for env, flags, spec, banks, refusal in cases:
        case = f"{spec.name}, {banks} banks, {flags or 'default launch'}, env {env}"
        with _launch(env, **flags):
            try:
                if env[GATE_ENV] is None:  # the pool configurator asks only with the gate set
                    ctl.refuse_unsupported(spec_algorithm=spec, num_draft_tokens=banks)
                elif ctl.check_online_c128_dspark_startup(spec, banks) is not True:
                    raise AssertionError(f"{case}: the startup check did not admit DSPARK")
            except ValueError as exc:
                if refusal is None or refusal not in str(exc):
                    raise AssertionError(f"{case}: refused: {exc}") from exc
                continue
        if refusal is not None:
            raise AssertionError(f"{case}: admitted, expected a refusal naming {refusal!r}")


def _upstream_compress(**kwargs: Any) -> None:
    raise AssertionError("upstream's compress_forward ran for a DSPARK verify plan")


class Decode:
    """Requests with float64 histories; a step: prepare -> plan -> each layer's compress (the compressor's
    call) -> accept -> the worker's commit hook, through the tree's controller, checked against the truth."""

    def __init__(self, ctl: types.ModuleType, ragged: Optional[types.ModuleType], layers: int = 2) -> None:
        self.ctl, self.ragged, self.ops = ctl, ragged, ReferenceOps()
        self.gen = torch.Generator().manual_seed(0)
        self.stride = SLOTS + 2
        self.states = [torch.full(((1 + W) * self.stride, STATE_DIM), float("nan")) for _ in range(layers)]
        self.apes = [self._randn(CHUNK, HEAD_DIM) for _ in range(layers)]
        self.backend = fake_backend(FakeKVPool(self.states, SLOTS, W), width=W, device="cpu")
        self.controller = ctl.OnlineC128DsparkController(self.backend)
        self.backend.online_c128_dspark = self.controller
        self.seq: Dict[int, int] = {}
        self.hist: Dict[Tuple[int, int], Tuple[int, Any, Any]] = {}  # (layer, slot) -> (base, kv, score)

    def _randn(self, *shape: int, scale: float = 1.0) -> Any:
        return (torch.randn(*shape, generator=self.gen, dtype=torch.float64) * scale).float().double()

    def _randint(self, lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (1,), generator=self.gen))

    def _state(self, layer: int, slot: int, end: int) -> Any:
        base, kv, score = self.hist[layer, slot]
        first = ((end - 1) // CHUNK) * CHUNK
        return chunk_state(kv[first - base:end - base], score[first - base:end - base], self.apes[layer], first)

    def prefill(self, slot: int, seq_len: int) -> None:
        """A prefill between verify steps: upstream's compress for its plan, bank 0 the state of its open chunk."""
        plan = PrefillPlan(128, torch.zeros(1, 16, dtype=torch.uint8), None, None)
        if self.controller.compress_fn(plan, _upstream_compress) is not _upstream_compress:
            raise AssertionError("a prefill plan was not left to upstream's compress")
        self.seq[slot], base = seq_len, ((seq_len - 1) // CHUNK) * CHUNK
        for layer, state in enumerate(self.states):
            kv, score = self._randn(seq_len - base, HEAD_DIM), self._randn(seq_len - base, HEAD_DIM, scale=2.0)
            self.hist[layer, slot] = (base, kv, score)
            state[slot] = torch.cat(self._state(layer, slot, seq_len)).float() if seq_len % CHUNK else float("nan")

    def step(self, slots: List[int], padded_bs: int, compact: bool, extra: int = 0) -> None:
        real = [self._randint(1, W) if compact else W for _ in slots]
        live = padded = None
        tokens = min(sum(real) + extra, padded_bs * W) if compact else padded_bs * W
        if compact:  # upstream's layouts: the batch's, and the bucket's (padding rows of length 0)
            live = self.ragged.RaggedVerifyLayout.from_verify_lens_device(
                verify_lens=torch.tensor(real, dtype=torch.int32), graph_num_tokens=tokens)
            padded = live.padded_to_bucket(padded_bs=padded_bs)
        starts = padded.extend_start_loc.tolist() if compact else [b * W for b in range(padded_bs)]
        seq = [self.seq[s] for s in slots] + [1] * (padded_bs - len(slots))
        as64 = lambda v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
        fb = SimpleNamespace(spec_info=SimpleNamespace(ragged_verify_layout=live))
        self.controller.prepare_verify(fb, bs=padded_bs, verify_bs=len(slots), ragged_layout=padded)
        raw = SimpleNamespace(seq_lens=as64(seq), req_pool_indices=as64(slots + [0] * (padded_bs - len(slots))),
                              verify_lens=None, extend_start_loc=None)
        if compact:
            raw.verify_lens, raw.extend_start_loc = padded.verify_lens, padded.extend_start_loc
        plan = self.controller.build_verify_plan(raw, num_q_tokens=tokens)
        emits = decode_plans(plan.plan_c)
        for layer, state in enumerate(self.states):
            x = torch.full((tokens, 2 * HEAD_DIM), float("nan"), dtype=torch.float64)
            for b, slot in enumerate(slots):
                base, kv, score = self.hist[layer, slot]
                new_kv, new_score = self._randn(real[b], HEAD_DIM), self._randn(real[b], HEAD_DIM, scale=2.0)
                self.hist[layer, slot] = (base, torch.cat([kv, new_kv]), torch.cat([score, new_score]))
                x[starts[b]:starts[b] + real[b]] = torch.cat([new_kv, new_score], dim=1)
            out = self.controller.compress_fn(plan, _upstream_compress)(
                kv_score_buffer=state.view(-1, 1, STATE_DIM), kv_score_input=x.float(), ape=self.apes[layer].float(),
                plan=plan, compress_ratio=128, head_dim=HEAD_DIM, out=None, is_online=True)
            self._check_emits(layer, slots, starts, seq, emits, out)
        self._accept_and_commit(slots, real, seq, live)

    def _check_emits(self, layer: int, slots: List[int], starts: List[int], seq: List[int], emits, out) -> None:
        for index, entry in enumerate(emits):
            if entry is not None:
                b = max(i for i in range(len(slots)) if starts[i] <= entry[1])
                base, kv, score = self.hist[layer, slots[b]]
                last, first = entry[0] - 1, entry[0] - CHUNK
                want = chunk_state(kv[first - base:last + 1 - base], score[first - base:last + 1 - base],
                                   self.apes[layer], first)[2]
                _close(out[index], want, f"layer {layer}: the chunk closed at {last} of slot {slots[b]}")

    def _accept_and_commit(self, slots: List[int], real: List[int], seq: List[int], live: Any) -> None:
        accepted = [self._randint(1, n) for n in real]
        new = [seq[b] + accepted[b] for b in range(len(slots))]
        self.ctl.commit_after_verify(
            self.backend.model_runner, seq_lens=torch.tensor(seq[:len(slots)]), new_seq_lens=torch.tensor(new),
            req_pool_indices=torch.tensor(slots), layout=live)
        for b, slot in enumerate(slots):
            for layer, state in enumerate(self.states):
                base, kv, score = self.hist[layer, slot]
                self.hist[layer, slot] = (base, kv[:new[b] - base], score[:new[b] - base])  # the accepted drafts
                if new[b] % CHUNK:
                    got = state[slot].double()
                    for i, want in enumerate(self._state(layer, slot, new[b])):
                        _close(got[i * HEAD_DIM:(i + 1) * HEAD_DIM], want, f"layer {layer}: bank 0 of slot {slot}")
                cut = (new[b] // CHUNK) * CHUNK
                self.hist[layer, slot] = (cut, kv[cut - base:new[b] - base], score[cut - base:new[b] - base])
            self.seq[slot] = new[b]


def _close(got: Any, want: Any, what: str) -> None:
    err = float((got.double() - want).abs().max())
    if not err <= 1e-4 * (1 + float(want.abs().max())):
        raise AssertionError(f"{what}: off the float64 reference by {err:.3g}")


@contextlib.contextmanager
def _decode(on: bool, compact: bool):
    """The tree's controller over a DSPARK backend, its kernels the torch models; with the gates off it must
    stay upstream's (inert)."""
    ctl, ragged = _module(CONTROLLER), _module(RAGGED) if compact else None
    with _launch({}):
        sim = Decode(ctl, ragged)
    if sim.controller.enabled() != on or not on and sim.controller.compress_fn(None, _close) is not _close:
        raise AssertionError(f"the controller is {'dis' if on else 'en'}abled with the gates {'on' if on else 'off'}")
    kernels, ctl._ops = ctl._ops, lambda: sim.ops
    try:
        yield sim
    finally:
        ctl._ops = kernels


def _steps(on: bool, compact: bool, plan: List[Tuple[List[int], int, int]]) -> None:
    """``plan``: (slots, padded rows, extra tokens) per verify step, requests admitted around chunk edges."""
    with _decode(on, compact) as sim:
        for slot, seq_len in zip(range(1, SLOTS), (1, 127, 128, 129, 255)) if on else ():
            sim.prefill(slot, seq_len)
        for slots, padded_bs, extra in plan if on else ():
            sim.step(slots, padded_bs, compact, extra)


def decode(on: bool) -> None:
    """Several steps, compact and static, with prefills between them, checked against float64."""
    with _decode(on, True) as sim:
        for slot, seq_len in zip(range(1, SLOTS), (1, 120, 128, 250, 381)) if on else ():
            sim.prefill(slot, seq_len)
        for step in range(6) if on else ():
            slots = sorted({1 + (step + k) % (SLOTS - 1) for k in range(1 + step % 4)})
            sim.step(slots, len(slots) + step % 3, step % 2 == 0, extra=step)
            if step == 3:
                sim.prefill(slots[0], CHUNK * 2 - 3)  # a finished request's slot serves a new one


SCENARIOS = {  # name -> function(gates on)
    "startup-rules": startup_rules,
    # static verify (a uniform batch padded to its bucket) -> accept -> commit after accept
    "verify-static": lambda on: _steps(on, False, [([1, 2, 3, 4, 5], 6, 0)]),
    # compact/ragged verify (a token bucket; padding rows of length 0) -> accept -> commit after accept
    "verify-compact": lambda on: _steps(on, True, [([1, 2, 3, 4, 5], 8, 3), ([2, 4], 2, 5)]),
    "decode": decode,
}


def _where(frame: Any, line: int, tree: str) -> str:
    name = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
    return f"{frame.f_globals.get('__name__', '?')}.{name} ({frame.f_code.co_filename[len(tree) + 1:]}:{line})"


def culprit(scenario: str, exc: BaseException, tree: str, ours: List[str]) -> str:
    """What failed: our module's frame, the upstream definition involved, the scenario."""
    frames = [(f, n) for f, n in traceback.walk_tb(exc.__traceback__) if f.f_code.co_filename.startswith(tree + os.sep)]
    mine = [_where(f, n, tree) for f, n in frames if f.f_globals.get("__name__") in ours]
    theirs = [_where(f, n, tree) for f, n in frames if f.f_globals.get("__name__") not in ours]
    obj = getattr(exc, "obj", None) if isinstance(exc, AttributeError) else None
    if obj is not None:  # an attribute our code reads on an upstream object
        cls = type(obj)
        try:
            where = f"{inspect.getsourcefile(cls)[len(tree) + 1:]}:{inspect.getsourcelines(cls)[1]}"
        except (OSError, TypeError):  # a class without Python source
            where = "no source"
        theirs.append(f"{cls.__module__}.{cls.__qualname__} ({where})")
    said = traceback.format_exception_only(type(exc), exc)[-1].strip()
    return (f"scenario {scenario}: in {mine[-1] if mine else CONTROLLER + ' (its result)'}; upstream "
            f"{theirs[-1] if theirs else 'definition: none in the traceback'}: {said}")


def _outcome(name: str, scenario: Any, on: bool, tree: str, ours: List[str]) -> Dict[str, str]:
    try:
        scenario(on)
        return {"status": "passed", "detail": ""}
    except NotRun as exc:
        return {"status": "not run", "detail": str(exc)}
    except Exception as exc:  # noqa: BLE001
        missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
        if missing and missing.split(".")[0] != "sglang":  # a package the tree imports lazily, missing here
            where = [f.f_globals.get("__name__") for f, _ in traceback.walk_tb(exc.__traceback__)]
            return {"status": "not run", "detail": f"{where[-1]} did not import (needs {missing})"}
        return {"status": "failed", "detail": culprit(name, exc, tree, ours)}


def run(gates: str, tree: str, ours: List[str]) -> Dict[str, Dict[str, str]]:
    """Each scenario with the gates ``gates`` ("on" / "off"), on the tree at ``tree`` (its ``python`` folder)."""
    return {name: _outcome(name, scenario, gates == "on", tree, ours) for name, scenario in SCENARIOS.items()}
