"""GPU tests of the online C128 DSPARK verify kernels on random ragged layouts.

For >= 1000 random layouts (scaled by C128PATCH_GPU_SCALE): 1-256 rows, verify lens
0..W with padding rows, rows longer than the banks, positions straddling 128
boundaries, W in {4, 8, 16}, fp32 and bf16 state, and ~15% of layouts with corrupted
device values (bad start / len / slot / seq len). Fresh inputs each; `out` and every
bank >= 1 are NaN before each run. Checked against `reference_c128` (float64, CPU):

* the plan: plan_c bytes vs an independent planner, plan_w all invalid, row_emit,
  row_len; and, on clean layouts, byte-equal to upstream's own online prefill planner;
* the fused verify: every emitted row, every written bank, and every other state row
  and `out` row bitwise unchanged (bank 0 is never written);
* the standalone write prefix: the same banks, nothing else touched;
* the one-launch commit over 3 layers: bank[accept] -> bank 0 bitwise, all else
  unchanged.

Tolerances: fp32 state 2e-4 (atol = rtol, as upstream's MTP test), for the fast-math
fold vs float64. bf16 state: banks are fp32 results rounded once to bf16 (8-bit
mantissa: half-ulp 2^-9 ~ 1.95e-3 relative), so banks use rtol 4e-3 (2x the rounding
bound) + atol 1e-4; emitted rows stay fp32 (computed from the exact stored bf16
bank-0 values) and keep 2e-4.
"""

from __future__ import annotations

import math
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dspark_util as util  # noqa: E402
import reference_c128 as ref  # noqa: E402

pytestmark = pytest.mark.gpu

RTOL_FP32 = 2e-4
ATOL_FP32 = 2e-4
RTOL_BF16_BANK = 4e-3
ATOL_BF16_BANK = 1e-4
SCORE_SCALE = 2.0
WIDTHS = (4, 8, 16)
DTYPES = (torch.float32, torch.bfloat16)
EXTRA_ROWS = 3  # state rows past the last bank, must stay poisoned


@dataclass
class Layout:
    W: int
    num_banks: int
    dtype: torch.dtype
    stride: int  # state_slot_stride = state_slot_offset = L
    seq_lens: np.ndarray  # int64
    verify_lens: np.ndarray  # int32
    extend_start_loc: np.ndarray  # int32
    req_pool_indices: np.ndarray  # int64
    num_q_tokens: int
    corrupted: list = field(default_factory=list)
    clean: bool = True  # every row 1 <= len <= num_banks, packed exactly, no corruption

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens)

    @property
    def state_rows(self) -> int:
        return (self.num_banks + 1) * self.stride + EXTRA_ROWS


def _seq_near_boundary(rng: random.Random, W: int) -> int:
    if rng.random() < 0.55:
        return max(0, 128 * rng.randint(0, 60) + rng.randint(-W - 2, W + 2))
    return rng.randint(0, 9000)


def make_layout(
    rng: random.Random, W: int, dtype: torch.dtype, corrupt: bool, force_clean: bool = False
) -> Layout:
    """A DSPARK-like padded ragged layout; `force_clean` = no padding, no slack, no
    inflated row (what upstream's online planner can also plan)."""
    B = min(256, max(1, int(round(math.exp(rng.uniform(0.0, math.log(256.0)))))))
    n_pad = rng.randint(0, B // 3) if B > 1 and rng.random() < 0.6 and not force_clean else 0
    n_real = B - n_pad
    stride = n_real + rng.randint(2, 24)
    rids = rng.sample(range(1, stride), n_real) + [0] * n_pad
    lens = [rng.randint(1, W) for _ in range(n_real)]
    lens += [rng.choice([0, 0, 0, 1, 2, W]) for _ in range(n_pad)]
    inflated = False
    if n_pad == 0 and rng.random() < 0.4 and not force_clean:  # leftover goes to the last row
        lens[-1] += rng.randint(1, 12)
        inflated = True
    seqs = [_seq_near_boundary(rng, W) for _ in range(n_real)]
    seqs += [rng.randint(0, 3) for _ in range(n_pad)]
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64).tolist()
    total = int(sum(lens))
    slack = rng.randint(1, 24) if rng.random() < 0.4 and not force_clean else 0
    N = total + slack
    lay = Layout(
        W=W,
        num_banks=W,
        dtype=dtype,
        stride=stride,
        seq_lens=np.array(seqs, dtype=np.int64),
        verify_lens=np.array(lens, dtype=np.int32),
        extend_start_loc=np.array(starts, dtype=np.int32),
        req_pool_indices=np.array(rids, dtype=np.int64),
        num_q_tokens=N,
        clean=(n_pad == 0 and not inflated and slack == 0),
    )
    if corrupt:
        lay.clean = False
        for _ in range(rng.randint(1, 3)):
            b = rng.randrange(B)
            kind = rng.choice(
                ["start_neg", "start_big", "start_tail", "len_neg", "len_huge",
                 "rid_neg", "rid_big", "rid_huge", "seq_neg", "seq_huge"]
            )
            lay.corrupted.append((b, kind))
            if kind == "start_neg":
                lay.extend_start_loc[b] = -rng.randint(1, 100)
            elif kind == "start_big":
                lay.extend_start_loc[b] = N + rng.randint(0, 50)
            elif kind == "start_tail":  # window runs past the packed input
                lay.extend_start_loc[b] = max(0, N - rng.randint(1, 3))
                lay.verify_lens[b] = W
            elif kind == "len_neg":
                lay.verify_lens[b] = -rng.randint(1, 50)
            elif kind == "len_huge":
                lay.verify_lens[b] = rng.choice([2**31 - 1, 100000, W + 1000])
            elif kind == "rid_neg":
                lay.req_pool_indices[b] = -rng.randint(1, 5)
            elif kind == "rid_big":
                lay.req_pool_indices[b] = stride + rng.randint(0, 5)
            elif kind == "rid_huge":
                lay.req_pool_indices[b] = 2**40
            elif kind == "seq_neg":
                lay.seq_lens[b] = -rng.randint(1, 1000)
            elif kind == "seq_huge":
                lay.seq_lens[b] = rng.choice([2**40, 2**31 - 5])
    return lay


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


class LayoutRunner:
    def __init__(self, ops, dev: torch.device, stats: dict):
        self.ops = ops
        self.dev = dev
        self.stats = stats

    def run(self, lay: Layout, gen: torch.Generator, rng: random.Random) -> None:
        ops, dev = self.ops, self.dev
        B, N, nb, L = lay.batch_size, lay.num_q_tokens, lay.num_banks, lay.stride
        tag = f"layout W={lay.W} dtype={lay.dtype} B={B} N={N} corrupted={lay.corrupted}"

        # ---- inputs (fresh each layout)
        kv_score = torch.randn((N, 2 * ref.HEAD_DIM), generator=gen)
        kv_score[:, ref.HEAD_DIM :] *= SCORE_SCALE
        ape = torch.randn((128, ref.HEAD_DIM), generator=gen)
        state0 = torch.full((lay.state_rows, ref.STATE_DIM), float("nan"), dtype=lay.dtype)
        bank0 = ref.random_state(L, gen).reshape(L, ref.STATE_DIM)
        state0[:L] = bank0.to(lay.dtype)
        seq_d = torch.from_numpy(lay.seq_lens).to(dev)
        len_d = torch.from_numpy(lay.verify_lens).to(dev)
        esl_d = torch.from_numpy(lay.extend_start_loc).to(dev)
        rid_d = torch.from_numpy(lay.req_pool_indices).to(dev)
        kv_d = kv_score.to(dev)
        ape_d = ape.to(dev)

        # ---- plan
        expect = ref.plan_rows(
            lay.seq_lens, lay.verify_lens, lay.extend_start_loc, lay.req_pool_indices,
            num_q_tokens=N, num_banks=nb, state_slot_offset=L,
        )
        plan = ops.dspark_verify_plan(
            seq_d, len_d, esl_d, rid_d,
            num_q_tokens=N, num_banks=nb, state_slot_offset=L, state_dtype=lay.dtype,
        )
        got_c = ref.decode_plan(plan.plan_c.cpu().numpy())
        got_w = ref.decode_plan(plan.plan_w.cpu().numpy())
        bad = np.nonzero(got_c != expect.plan_c)[0]
        assert bad.size == 0, (
            f"{tag}: plan_c differs at {bad[:8].tolist()}: got {got_c[bad[:3]]}, "
            f"expected {expect.plan_c[bad[:3]]}"
        )
        invalid = np.empty(N, dtype=ref.PLAN_DTYPE)
        invalid[:] = ref.INVALID_PLAN
        assert (got_w == invalid).all(), f"{tag}: plan_w is not all invalid"
        # an empty batch runs as one zero-length row
        assert plan.row_len.shape[0] == max(B, 1) and (B or int(plan.row_len[0]) == 0), tag
        np.testing.assert_array_equal(plan.row_emit.cpu().numpy()[:B], expect.row_emit, err_msg=tag)
        np.testing.assert_array_equal(plan.row_len.cpu().numpy()[:B], expect.row_len, err_msg=tag)
        assert plan.prefill_plan.compress_ratio == 128
        self.stats["plan_entries"] += min(expect.total, N)

        if lay.clean and B <= N:
            self._check_against_upstream_planner(lay, seq_d, len_d, rid_d, got_c, expect, tag)

        # ---- float64 reference of the fold
        S = max(1, int(expect.row_len.max(initial=0)))
        x = torch.zeros((B, S, ref.HEAD_DIM), dtype=torch.float64)
        v = torch.zeros((B, S, ref.HEAD_DIM), dtype=torch.float64)
        init = torch.zeros((B, 3, ref.HEAD_DIM), dtype=torch.float64)
        seq_ok = torch.zeros(B, dtype=torch.int64)
        state0_f64 = state0[:L].double()
        for b, w in enumerate(expect.windows):
            if w.len == 0:
                continue
            seq_ok[b] = w.seq_before
            rows = torch.arange(w.start, w.start + w.len)
            pos = (w.seq_before + torch.arange(w.len)) % ref.CHUNK
            x[b, : w.len] = kv_score[rows, ref.HEAD_DIM :].double() + ape[pos].double()
            v[b, : w.len] = kv_score[rows, : ref.HEAD_DIM].double()
            init[b] = state0_f64[w.rid].reshape(3, ref.HEAD_DIM)
        fold = ref.fold_rows(init, seq_ok, torch.from_numpy(expect.row_len).long(), x, v)

        exp_out: dict[int, torch.Tensor] = {}
        writers: dict[int, list] = {}
        closes = fold.closes.numpy()
        for b, w in enumerate(expect.windows):
            j = 0
            for k in range(w.len):
                if closes[b, k]:
                    idx = int(expect.row_emit[b]) + j
                    j += 1
                    if idx < N:
                        exp_out[idx] = fold.states[b, k, 2]
                else:
                    writers.setdefault(w.rid + (k + 1) * L, []).append(fold.states[b, k].reshape(-1))

        # ---- fused verify
        state_a = state0.to(dev)
        out = torch.full((N, ref.HEAD_DIM), float("nan"), device=dev)
        ret = ops.dspark_verify_compress(state_a, kv_d, ape_d, plan, out=out)
        assert ret is out
        self._check_out(out.cpu(), exp_out, N, tag)
        self._check_state(state_a.cpu(), state0, writers, lay, tag + " [fused verify]")

        # ---- standalone write prefix (kv rows == N, so the clamps agree with the plan)
        state_b = state0.to(dev)
        ops.dspark_write_prefix(
            state_b, kv_d, ape_d, seq_d, len_d, esl_d, rid_d, num_banks=nb, state_slot_stride=L
        )
        self._check_state(state_b.cpu(), state0, writers, lay, tag + " [write prefix]")

        # ---- one-launch commit over 3 layers
        self._check_commit(lay, rng, [state_a, state_b, state_a.clone()], seq_d, len_d, rid_d, tag)
        self.stats["layouts"] += 1

    def _check_against_upstream_planner(self, lay, seq_d, len_d, rid_d, got_c, expect, tag):
        from sglang.kernels.ops.attention.dsv4.compress import CompressorPrefillPlan

        r2t = torch.zeros((lay.stride, 1), dtype=torch.int32, device=seq_d.device)
        up = CompressorPrefillPlan.generate_online(
            seq_d + len_d.to(torch.int64),
            len_d.to(torch.int64),
            rid_d,
            r2t,
            lay.num_q_tokens,
            use_cuda_graph=False,
            state_slot_offset=lay.stride,
        )
        up_c = ref.decode_plan(up.plan_c.cpu().numpy())
        num_c = up_c.shape[0]
        assert num_c == expect.total, f"{tag}: upstream planner made {num_c} plan_c, we {expect.total}"
        assert (got_c[:num_c] == up_c).all(), f"{tag}: plan_c differs from upstream's online planner"
        self.stats["upstream_plan_equal"] += 1

    def _check_out(self, out: torch.Tensor, exp_out: dict, N: int, tag: str) -> None:
        idx = sorted(exp_out)
        if idx:
            got = out[idx].double().numpy()
            want = torch.stack([exp_out[i] for i in idx]).numpy()
            ok, err, excess, where = util.close_report(got, want, RTOL_FP32, ATOL_FP32)
            assert ok, f"{tag}: emitted row {idx[where[0]]} off by {err:.3g} (excess {excess:.3g})"
            self.stats["emits"] += len(idx)
            self.stats["max_emit_err"] = max(self.stats["max_emit_err"], err)
        untouched = torch.ones(N, dtype=torch.bool)
        untouched[idx] = False
        assert torch.isnan(out[untouched]).all(), f"{tag}: out rows outside the plan were written"

    def _check_state(self, got: torch.Tensor, state0: torch.Tensor, writers: dict, lay: Layout, tag: str) -> None:
        fp32 = lay.dtype == torch.float32
        rtol, atol = (RTOL_FP32, ATOL_FP32) if fp32 else (RTOL_BF16_BANK, ATOL_BF16_BANK)
        single = sorted(r for r, ws in writers.items() if len(ws) == 1)
        racy = sorted(r for r, ws in writers.items() if len(ws) > 1)
        if single:
            want = torch.stack([writers[r][0] for r in single]).numpy()
            ok, err, excess, where = util.close_report(got[single].double().numpy(), want, rtol, atol)
            assert ok, (
                f"{tag}: bank row {single[where[0]]} channel {where[1]} off by {err:.3g} "
                f"(excess {excess:.3g})"
            )
            key = "max_bank_err_fp32" if fp32 else "max_bank_err_bf16"
            self.stats[key] = max(self.stats[key], err)
            self.stats["banks"] += len(single)
        # rows that several batch rows write (padding rows sharing slot 0) hold one of
        # the candidates: check they were written (no NaN left), not which one won
        if racy:
            assert not torch.isnan(got[racy].float()).any(), f"{tag}: shared bank rows not written"
            self.stats["racy_rows"] += len(racy)
        keep = torch.ones(got.shape[0], dtype=torch.bool)
        keep[single + racy] = False
        same = (_bits(got[keep]) == _bits(state0[keep])).all(dim=1)
        assert bool(same.all()), (
            f"{tag}: state rows {torch.nonzero(keep).flatten()[~same][:8].tolist()} changed "
            f"(bank 0 / unplanned rows must stay bitwise unchanged)"
        )

    def _check_commit(self, lay, rng, layers, seq_d, len_d, rid_d, tag) -> None:
        ops = self.ops
        B, nb, L = lay.batch_size, lay.num_banks, lay.stride
        max_num_reqs = max(1, L - rng.randint(0, 2))
        deltas = []
        for b in range(B):
            r = rng.random()
            if r < 0.1:
                deltas.append(-rng.randint(1, 5))
            elif r < 0.2:
                deltas.append(nb + rng.randint(0, 5))
            else:
                deltas.append(rng.randint(0, max(0, int(lay.verify_lens[b]))) if lay.verify_lens[b] > 0 else 0)
        new_seq = lay.seq_lens + np.array(deltas, dtype=np.int64)
        pre = [s.cpu() for s in layers]
        table = ops.make_state_ptr_table(layers)
        ops.dspark_commit(
            table, seq_d, torch.from_numpy(new_seq).to(seq_d.device), len_d, rid_d,
            num_banks=nb, state_slot_stride=L, max_num_reqs=max_num_reqs, state_dtype=lay.dtype,
        )
        # reference: which bank each slot's bank 0 copies from
        src: dict[int, set] = {}
        for b in range(B):
            rid, sb = int(lay.req_pool_indices[b]), int(lay.seq_lens[b])
            if not (0 <= rid < max_num_reqs) or not (0 <= sb <= ref.INT32_MAX - ref.MAX_BANKS):
                continue
            cap = min(max(int(lay.verify_lens[b]), 0), nb)
            accept = min(max(int(new_seq[b]) - sb, 0), cap)
            if accept == 0 or (sb + accept) % ref.CHUNK == 0:
                continue
            src.setdefault(rid, set()).add(rid + accept * L)
        for li, (after, before) in enumerate(zip(layers, pre)):
            after = after.cpu()
            expect = before.clone()
            skip = []
            for rid, rows in src.items():
                if len(rows) == 1:
                    expect[rid] = before[next(iter(rows))]
                else:
                    # several rows commit into one slot (padding rows on slot 0): the copies race, so
                    # each 16-byte vector comes from one of the sources (torn across vectors, never within)
                    skip.append(rid)
                    got = _bits(after[rid]).view(-1, 16 // after.element_size())
                    cands = torch.stack([_bits(before[r]).view(-1, 16 // after.element_size()) for r in rows])
                    assert bool((cands == got).all(dim=2).any(dim=0).all()), (
                        f"{tag}: commit layer {li} slot {rid}: a 16-byte vector matches none of its sources"
                    )
            keep = torch.ones(after.shape[0], dtype=torch.bool)
            keep[skip] = False
            same = (_bits(after[keep]) == _bits(expect[keep])).all(dim=1)
            assert bool(same.all()), (
                f"{tag}: commit layer {li} rows {torch.nonzero(keep).flatten()[~same][:8].tolist()} wrong"
            )
        self.stats["commits"] += sum(1 for rows in src.values() if len(rows) == 1)


def _new_stats() -> dict:
    return {
        "layouts": 0, "plan_entries": 0, "emits": 0, "banks": 0, "racy_rows": 0, "commits": 0,
        "upstream_plan_equal": 0, "corrupted_layouts": 0,
        "max_emit_err": 0.0, "max_bank_err_fp32": 0.0, "max_bank_err_bf16": 0.0,
    }


def test_random_ragged_layouts(patched_tree):
    util.install(patched_tree)
    ops = util.dspark_ops()
    dev = torch.device("cuda")
    count = util.scaled(1008, minimum=len(WIDTHS) * len(DTYPES) * 4)
    rng = random.Random(util.base_seed())
    gen = torch.Generator().manual_seed(util.base_seed())
    stats = _new_stats()
    runner = LayoutRunner(ops, dev, stats)
    for i in range(count):
        W = WIDTHS[i % len(WIDTHS)]
        dtype = DTYPES[(i // len(WIDTHS)) % len(DTYPES)]
        corrupt = (i % 7) == 3
        lay = make_layout(rng, W, dtype, corrupt, force_clean=(i % 5) == 0)
        stats["corrupted_layouts"] += int(corrupt)
        runner.run(lay, gen, rng)
    torch.cuda.synchronize()
    stats["scale"] = util.scale()
    util.write_results("dspark_kernels", stats)
    assert stats["layouts"] == count
    assert stats["emits"] > 0 and stats["banks"] > 0 and stats["commits"] > 0
    assert stats["upstream_plan_equal"] > 0


def test_edge_layouts(patched_tree):
    """Hand-picked rows: empty batch, all-padding batch, exact boundaries, bank clamp."""
    util.install(patched_tree)
    ops = util.dspark_ops()
    dev = torch.device("cuda")
    rng = random.Random(util.base_seed() + 1)
    gen = torch.Generator().manual_seed(util.base_seed() + 1)
    stats = _new_stats()
    runner = LayoutRunner(ops, dev, stats)

    def lay(seqs, lens, rids, W, dtype, N=None, stride=None):
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]]) if lens else np.zeros(0)
        return Layout(
            W=W, num_banks=W, dtype=dtype, stride=stride or (max(rids, default=0) + 2),
            seq_lens=np.array(seqs, dtype=np.int64), verify_lens=np.array(lens, dtype=np.int32),
            extend_start_loc=np.array(starts, dtype=np.int32),
            req_pool_indices=np.array(rids, dtype=np.int64),
            num_q_tokens=int(sum(lens)) if N is None else N, clean=False,
        )

    for dtype in DTYPES:
        cases = [
            lay([], [], [], 8, dtype, N=0, stride=4),  # empty batch
            lay([], [], [], 8, dtype, N=16, stride=4),  # no rows, padded plan
            lay([5, 7], [0, 0], [0, 0], 8, dtype, N=0),  # only zero-length padding rows
            lay([5, 7], [0, 0], [0, 0], 8, dtype, N=8),
            lay([120, 127, 128, 0, 255], [8, 1, 8, 8, 1], [1, 2, 3, 4, 5], 8, dtype),
            lay([121, 250], [8, 16], [1, 2], 8, dtype),  # row 2 longer than the banks
            lay([0, 127, 128 * 50 - 1], [4, 4, 4], [3, 1, 2], 4, dtype),
            lay([100, 1000, 2000], [16, 16, 16], [1, 2, 3], 16, dtype),
        ]
        for case in cases:
            runner.run(case, gen, rng)
    assert stats["layouts"] == 16


@pytest.mark.cuda_graph
def test_plan_and_kernels_capture_in_cuda_graph(patched_tree):
    """plan -> fused verify -> write prefix -> commit captured once, replayed with new
    device inputs: same results as eager calls."""
    util.install(patched_tree)
    ops = util.dspark_ops()
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(util.base_seed() + 2)
    B, W, L, N = 12, 8, 20, 96
    rows = L * (W + 1)

    def inputs(seed: int):
        g = torch.Generator().manual_seed(seed)
        lens = torch.randint(0, W + 1, (B,), generator=g, dtype=torch.int32)
        lens[-1] = 0
        starts = torch.cumsum(lens, 0, dtype=torch.int32) - lens
        seqs = torch.randint(0, 2000, (B,), generator=g, dtype=torch.int64)
        rids = torch.randperm(L - 1, generator=g)[:B].to(torch.int64) + 1
        new = seqs + torch.randint(0, W + 1, (B,), generator=g, dtype=torch.int64)
        kv = torch.randn((N, 1024), generator=g)
        return [t.to(dev) for t in (seqs, lens, starts, rids, new, kv)]

    ape = torch.randn((128, 512), generator=gen).to(dev)
    base_state = ref.random_state(rows, gen).reshape(rows, ref.STATE_DIM).float().to(dev)
    static = inputs(1)
    states = [base_state.clone(), base_state.clone()]
    table = ops.make_state_ptr_table(states)
    out = torch.zeros((N, 512), device=dev)

    def step(seqs, lens, starts, rids, new, kv):
        plan = ops.dspark_verify_plan(seqs, lens, starts, rids, num_q_tokens=N, num_banks=W, state_slot_offset=L)
        ops.dspark_verify_compress(states[0], kv, ape, plan, out=out)
        ops.dspark_write_prefix(states[1], kv, ape, seqs, lens, starts, rids, num_banks=W, state_slot_stride=L)
        ops.dspark_commit(table, seqs, new, lens, rids, num_banks=W, state_slot_stride=L,
                          max_num_reqs=L, state_dtype=torch.float32)
        return plan

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step(*static)  # warm up (JIT load) outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gplan = step(*static)

    for seed in (2, 3, 4):
        fresh = inputs(seed)
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        for st in states:
            st.copy_(base_state)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        g_out, g_states = out.clone(), [st.clone() for st in states]
        g_plan_c, g_emit = gplan.plan_c.clone(), gplan.row_emit.clone()

        for st in states:
            st.copy_(base_state)
        out.fill_(float("nan"))
        eplan = step(*fresh)
        torch.cuda.synchronize()
        assert torch.equal(g_plan_c, eplan.plan_c)
        assert torch.equal(g_emit, eplan.row_emit)
        assert torch.equal(_bits(g_out), _bits(out))
        for a, b in zip(g_states, states):
            assert torch.equal(_bits(a), _bits(b))


def test_host_checks_reject_bad_arguments(patched_tree):
    util.install(patched_tree)
    ops = util.dspark_ops()
    dev = torch.device("cuda")
    B, W, L, N = 4, 8, 6, 32
    seqs = torch.zeros(B, dtype=torch.int64, device=dev)
    lens = torch.full((B,), 2, dtype=torch.int32, device=dev)
    starts = torch.arange(0, 2 * B, 2, dtype=torch.int32, device=dev)
    rids = torch.arange(1, B + 1, dtype=torch.int64, device=dev)
    state = torch.zeros(((W + 1) * L, 1536), device=dev)
    kv = torch.zeros((N, 1024), device=dev)
    ape = torch.zeros((128, 512), device=dev)

    def raises(fn, *needles):
        with pytest.raises(Exception) as info:
            fn()
        msg = str(info.value)
        for needle in needles:
            assert needle in msg, f"expected {needle!r} in error: {msg}"

    plan_kw = dict(num_q_tokens=N, num_banks=W, state_slot_offset=L)
    raises(lambda: ops.dspark_verify_plan(seqs, lens, starts, rids, num_q_tokens=N, num_banks=0, state_slot_offset=L), "num_banks")
    raises(lambda: ops.dspark_verify_plan(seqs, lens, starts, rids, num_q_tokens=65537, num_banks=W, state_slot_offset=L), "uint16")
    raises(lambda: ops.dspark_verify_plan(seqs.int(), lens, starts, rids, **plan_kw), "not in the allowed options")
    raises(lambda: ops.dspark_verify_plan(seqs, lens.long(), starts, rids, **plan_kw), "not in the allowed options")
    raises(lambda: ops.dspark_verify_plan(seqs.cpu(), lens, starts, rids, **plan_kw), "cuda")
    raises(lambda: ops.dspark_verify_plan(seqs[:2], lens, starts, rids, **plan_kw), "Size mismatch")
    plan = ops.dspark_verify_plan(seqs, lens, starts, rids, **plan_kw)
    raises(lambda: ops.dspark_verify_compress(state[: W * L], kv, ape, plan), "banks")
    raises(lambda: ops.dspark_verify_compress(state, kv[: N - 1], ape, plan), "fewer than")
    raises(lambda: ops.dspark_verify_compress(state.bfloat16().float()[:, :1024], kv, ape, plan), "1536")
    raises(lambda: ops.dspark_verify_compress(state.half(), kv, ape, plan), "float32 or bfloat16")
    raises(lambda: ops.dspark_verify_compress(state, kv, ape.double(), plan), "float32")
    raises(lambda: ops.dspark_write_prefix(state, kv, ape, seqs, lens, starts, rids, num_banks=W + 1, state_slot_stride=L), "banks")
    raises(lambda: ops.dspark_write_prefix(state, kv, ape, seqs, lens, starts, rids, num_banks=W, state_slot_stride=0), "state_slot_stride")
    raises(lambda: ops.dspark_write_prefix(state, kv.t().contiguous().t(), ape, seqs, lens, starts, rids, num_banks=W, state_slot_stride=L), "contiguous")
    buf = torch.zeros(state.numel() + 4, device=dev)
    misaligned = buf[2 : 2 + state.numel()].view(state.shape)  # contiguous, 8-byte offset
    raises(lambda: ops.dspark_write_prefix(misaligned, kv, ape, seqs, lens, starts, rids, num_banks=W, state_slot_stride=L), "16-byte aligned")
    raises(lambda: ops.make_state_ptr_table([misaligned]), "16-byte aligned")
    raises(lambda: ops.make_state_ptr_table([]), "at least one")
    raises(lambda: ops.make_state_ptr_table([state, state[:-1]]), "differs")
    raises(lambda: ops.make_state_ptr_table([state, state.bfloat16()]), "differs")
    table = ops.make_state_ptr_table([state, state.clone()])
    commit_kw = dict(num_banks=W, state_slot_stride=L, max_num_reqs=L, state_dtype=torch.float32)
    raises(lambda: ops.dspark_commit(table, seqs, seqs, lens, rids, **{**commit_kw, "state_dtype": torch.bfloat16}), "state table")
    raises(lambda: ops.dspark_commit(table, seqs, seqs, lens, rids, **{**commit_kw, "num_banks": W + 1}), "banks")
    raises(lambda: ops.dspark_commit(table, seqs, seqs, lens, rids, **{**commit_kw, "max_num_reqs": L + 1}), "max_num_reqs")
    raises(lambda: ops.dspark_commit(table.clone(), seqs, seqs, lens, rids, **commit_kw), "num_state_rows")
    raises(lambda: ops.dspark_commit(table, seqs, seqs[:2], lens, rids, **commit_kw), "Size mismatch")
    # and the happy paths of the same objects still run
    ops.dspark_verify_compress(state, kv, ape, plan)
    ops.dspark_commit(table, seqs, seqs + 1, lens, rids, **commit_kw)
    ops.dspark_commit(table.clone(), seqs, seqs + 1, lens, rids, **commit_kw, num_state_rows=state.shape[0])
    torch.cuda.synchronize()
