"""Series I on the GPU: the C128 prefill planners with zero-length rows (patch 0001).

Uses upstream's real JIT modules from the patched tree (compress.py's
``_jit_compress_128_online_module`` / ``_jit_compress_plan_module`` / ``_jit_compress_module``)
built by sglang's own ``load_jit``. The unpatched kernels run in a subprocess.
"""

from __future__ import annotations

import json
import random
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (.ci/run installs torch==2.13.0)")

import harness
from reference_c128 import OnlineC128Reference

HEAD = 512
NAN = float("nan")

# c_plan contexts: identity req_to_token / full_to_swa; rid 0 is the padding slot.
NUM_REQS = 80
TOKENS_PER_REQ = 2048
SWA_PAGE = 256
RING = {4: 8, 128: 128}


# --------------------------------------------------------------------------- setup


@pytest.fixture(scope="module")
def C(patched_tree):
    """compress.py of the patched tree, its four modules built in parallel."""
    from sglang.kernels.ops.attention.dsv4 import compress

    f32 = torch.float32
    builds = [
        lambda: compress._jit_compress_128_online_module(HEAD, f32),
        compress._jit_compress_plan_module,
        lambda: compress._jit_compress_module(HEAD, f32, f32, f32, 128),
        lambda: compress._jit_compress_module(HEAD, f32, f32, f32, 4),
    ]
    start = time.monotonic()
    with ThreadPoolExecutor(len(builds)) as pool:
        for fut in [pool.submit(b) for b in builds]:
            fut.result()
    harness.write_result("series1_build", {"modules": 4, "seconds": time.monotonic() - start})
    return compress


class Paged:
    """req_to_token / full_to_swa with identity mapping, as upstream's kernel tests build them."""

    def __init__(self) -> None:
        r2t = torch.arange(NUM_REQS * TOKENS_PER_REQ, dtype=torch.int32).view(NUM_REQS, TOKENS_PER_REQ)
        self.req_to_token = r2t.cuda()
        self.full_to_swa = torch.arange(NUM_REQS * TOKENS_PER_REQ, dtype=torch.int64).cuda()

    @staticmethod
    def state_pool(ratio: int, gen: torch.Generator) -> torch.Tensor:
        if ratio == 128:  # request ring: rid * ring + pos % ring, pages of 128
            rows, last = NUM_REQS * RING[128], HEAD * 2
        else:  # swa pages: one ring of RING[4] per swa page
            rows, last = NUM_REQS * TOKENS_PER_REQ // SWA_PAGE * RING[4], HEAD * 4
        return torch.randn((rows // ratio, ratio, last), generator=gen).cuda()


def lens(rows: list[tuple[int, int]], device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    seq = torch.tensor([s for s, _ in rows], dtype=torch.int64, device=device)
    ext = torch.tensor([e for _, e in rows], dtype=torch.int64, device=device)
    return seq, ext


def online_plan(C, rows, rids: torch.Tensor, use_cuda_graph: bool, num_q: int | None = None):
    seq, ext = lens(rows)
    r2t = torch.zeros((NUM_REQS, 1), dtype=torch.int32, device="cuda")  # only its stride is read
    n = sum(e for _, e in rows) if num_q is None else num_q
    return C.CompressorPrefillPlan.generate_online(seq, ext, rids, r2t, n, use_cuda_graph)


def c_plan(C, ratio: int, rows, rids, paged: Paged, gpu_lens: bool, use_cuda_graph: bool, num_q=None):
    seq, ext = lens(rows, "cuda" if gpu_lens else "cpu")
    n = sum(e for _, e in rows) if num_q is None else num_q
    return C.CompressorPrefillPlan.generate(
        ratio, rids, seq, ext, paged.req_to_token, paged.full_to_swa, SWA_PAGE, RING[ratio], n,
        use_cuda_graph=use_cuda_graph,
    )  # fmt: skip


def bits(t: torch.Tensor) -> torch.Tensor:
    """Bytes view, so NaN payloads compare exactly."""
    return t.contiguous().view(torch.uint8)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(bits(a), bits(b))


def canonical_c(plan_c: torch.Tensor, batch_ids: list[int], sort: bool):
    """c_plan CompressPlans [n, 16] -> int32 [n, 4] with stage-0 batch ids mapped to full-batch
    rows, optionally sorted by ragged id (kernel0 emits in atomic order); and the permutation."""
    p = plan_c.view(torch.int32).view(-1, 4).clone()
    valid = p[:, 0] != -1
    buffer_len = (p[:, 1] >> 16) & 0xFFFF
    keep_id = valid & (buffer_len == 0)  # kernel_1 leaves the batch id in read_page_1 here
    if keep_id.any():
        idmap = torch.tensor(batch_ids, dtype=torch.int32, device=p.device)
        p[keep_id, 3] = idmap[p[keep_id, 3].long()]
    order = torch.arange(p.shape[0], device=p.device)
    if sort:
        key = torch.where(valid, p[:, 1] & 0xFFFF, torch.full_like(p[:, 1], 1 << 20))
        order = torch.sort(key.long() * p.shape[0] + order, stable=True).indices
    return p[order], order


def canonical_w(plan_w: torch.Tensor, sort: bool) -> torch.Tensor:
    p = plan_w.view(torch.int32).view(-1, 2)
    if not sort:
        return p
    valid = p[:, 0] != -1
    key = torch.where(valid, p[:, 0], torch.full_like(p[:, 0], 1 << 20)).long()
    return p[torch.sort(key * p.shape[0] + torch.arange(p.shape[0], device=p.device)).indices]


# --------------------------------------------------------------------------- (a) the bug upstream

UPSTREAM_CODE = r"""
import json, torch
from sglang.kernels.ops.attention.dsv4 import compress as C
rows = [(300, 44), (130, 0), (10, 10)]
seq = torch.tensor([s for s, _ in rows]); ext = torch.tensor([e for _, e in rows])
n = int(ext.sum())
rids = torch.tensor([3, 0, 5], device="cuda")
out = {}
try:
    C.CompressorPrefillPlan.generate_online(seq, ext, rids, torch.zeros((8, 1), dtype=torch.int32, device="cuda"), n)
    out["online"] = "no error"
except Exception as e:
    out["online"] = f"{type(e).__name__}: {e}"
r2t = torch.arange(8 * 512, dtype=torch.int32, device="cuda").view(8, 512)
f2s = torch.arange(8 * 512, dtype=torch.int64, device="cuda")
for ratio, ring in ((128, 128), (4, 8)):
    try:
        C.CompressorPrefillPlan.generate(ratio, rids, seq, ext, r2t, f2s, 256, ring, n)
        out[f"c_plan_{ratio}"] = "no error"
    except Exception as e:
        out[f"c_plan_{ratio}"] = f"{type(e).__name__}: {e}"
torch.cuda.synchronize()
print("RESULT " + json.dumps(out))
"""


def check_line(path: Path, after: str) -> int:
    """Line of upstream's `RuntimeCheck(0 < extend_len && ...)` after the line containing ``after``."""
    lines = path.read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if after in ln)
    return 1 + next(
        i for i in range(start, len(lines)) if "RuntimeCheck(0 < extend_len && extend_len <= seq_len);" in lines[i]
    )


def test_a_zero_row_raises_upstream(upstream_tree: Path):
    csrc = upstream_tree / "sglang/kernels/jit/csrc/deepseek_v4"
    online_line = check_line(csrc / "c128_online_v2.cuh", "_plan_prefill_partial(")
    plan_line = check_line(csrc / "c_plan.cuh", "inline PrefillPlan plan_compress_prefill(")
    proc = harness.run_with_tree(upstream_tree, UPSTREAM_CODE)
    found = re.search(r"^RESULT (.*)$", proc.stdout, re.M)
    assert found, proc.stderr[-3000:]
    res = json.loads(found.group(1))
    harness.write_result("series1_upstream_bug", {**res, "online_line": online_line, "c_plan_line": plan_line})
    assert f"c128_online_v2.cuh:{online_line}" in res["online"], res
    for ratio in (128, 4):
        assert f"c_plan.cuh:{plan_line}" in res[f"c_plan_{ratio}"], res


# --------------------------------------------------------------------------- (b) patched: succeeds


def test_b_zero_row_plans_succeed_patched(C):
    rows = [(300, 44), (130, 0), (10, 10)]
    rids = torch.tensor([3, 0, 5], device="cuda")
    plan = online_plan(C, rows, rids, use_cuda_graph=False)
    reduced = online_plan(C, [rows[0], rows[2]], rids[[0, 2]], use_cuda_graph=False)
    assert plan.plan_c.shape == reduced.plan_c.shape and plan.plan_w.shape == reduced.plan_w.shape
    paged = Paged()
    for ratio in (128, 4):
        c_plan(C, ratio, rows, rids, paged, gpu_lens=False, use_cuda_graph=False)
    torch.cuda.synchronize()


# --------------------------------------------------------------------------- (c) differential

# Zero rows at the start, in the middle (two in a row) and at the end; real rows start mid-chunk,
# on a boundary, close chunks, span several chunks. Real rows use rids 1..; zero rows the
# padding slot 0, as compact verify pads.
DIFF_CASES = {
    "mixed": [(5, 0), (300, 44), (130, 0), (129, 0), (10, 10), (1000, 700), (256, 128), (77, 0)],
    "verify_uniform": [(131, 4), (1, 0), (255, 4), (128, 4), (1, 0), (1, 0), (700, 4), (4, 4)],
    "verify_ragged": [(200, 1), (1, 0), (129, 3), (384, 8), (64, 2), (2, 0)],
}


def split(rows):
    keep = [i for i, (_, e) in enumerate(rows) if e > 0]
    rids_full = [0 if e == 0 else 1 + i for i, (_, e) in enumerate(rows)]
    return keep, rids_full


def inputs(n: int, ratio: int, gen: torch.Generator):
    width = HEAD * (4 if ratio == 4 else 2)
    kv = torch.randn((n, width), generator=gen).cuda()
    ape = (0.5 * torch.randn((8 if ratio == 4 else 128, HEAD), generator=gen)).cuda()
    return kv, ape


@pytest.mark.parametrize("case", sorted(DIFF_CASES))
@pytest.mark.parametrize("use_cuda_graph", [False, True])
def test_c_online_same_bytes_as_without_zero_rows(C, case, use_cuda_graph, torch_gen):
    rows = DIFF_CASES[case]
    keep, rids_full = split(rows)
    rids = torch.tensor(rids_full, device="cuda")
    n = sum(e for _, e in rows)
    kv, ape = inputs(n, 128, torch_gen)
    # a finite prior state everywhere (rows that start mid-chunk fold it in)
    state0 = torch.randn((NUM_REQS, 1, 3 * HEAD), generator=torch_gen).cuda()
    state0[:, :, HEAD : 2 * HEAD] = state0[:, :, HEAD : 2 * HEAD].abs() * 10 + 1

    runs = []
    for sub_rows, sub_rids in ((rows, rids), ([rows[i] for i in keep], rids[keep])):
        plan = online_plan(C, sub_rows, sub_rids, use_cuda_graph)
        state = state0.clone()
        out = torch.full((plan.plan_c.shape[0], HEAD), NAN, device="cuda")
        C.compress_forward(state, kv, ape, plan, head_dim=HEAD, compress_ratio=128, out=out, is_online=True)
        torch.cuda.synchronize()
        runs.append((plan, out, state))
    (pf, of, sf), (pr, orr, sr) = runs
    assert same_bytes(pf.plan_c, pr.plan_c) and same_bytes(pf.plan_w, pr.plan_w)
    assert same_bytes(of, orr) and same_bytes(sf, sr)
    assert not torch.equal(sf, state0)  # the run did write state
    if use_cuda_graph:
        assert pf.plan_c.shape[0] == n  # padded to num_q_tokens with invalid plans


@pytest.mark.parametrize("case", sorted(DIFF_CASES))
@pytest.mark.parametrize("ratio", [128, 4])
@pytest.mark.parametrize("gpu_lens,use_cuda_graph", [(False, False), (False, True), (True, False), (True, True)])
def test_c_cplan_same_bytes_as_without_zero_rows(C, case, ratio, gpu_lens, use_cuda_graph, torch_gen):
    rows = DIFF_CASES[case]
    keep, rids_full = split(rows)
    rids = torch.tensor(rids_full, device="cuda")
    n = sum(e for _, e in rows)
    assert len(rows) <= n  # c_plan's batch_size <= num_q_tokens check (unchanged)
    paged = Paged()
    kv, ape = inputs(n, ratio, torch_gen)
    pool0 = Paged.state_pool(ratio, torch_gen)

    runs = []
    for sub_rows, sub_rids, ids in ((rows, rids, list(range(len(rows)))), ([rows[i] for i in keep], rids[keep], keep)):
        plan = c_plan(C, ratio, sub_rows, sub_rids, paged, gpu_lens, use_cuda_graph)
        pool = pool0.clone()
        out = torch.full((plan.plan_c.shape[0], HEAD), NAN, device="cuda")
        C.compress_forward(pool, kv, ape, plan, head_dim=HEAD, compress_ratio=ratio, out=out)
        torch.cuda.synchronize()
        pc, order = canonical_c(plan.plan_c, ids, sort=gpu_lens)
        runs.append((pc, canonical_w(plan.plan_w, sort=gpu_lens), out[order], pool))
    (cf, wf, of, sf), (cr, wr, orr, sr) = runs
    assert torch.equal(cf, cr) and torch.equal(wf, wr)
    assert same_bytes(of, orr) and same_bytes(sf, sr)
    assert not torch.equal(sf, pool0)


@pytest.mark.parametrize("case", sorted(DIFF_CASES))
def test_c_legacy_plan_same_bytes_as_without_zero_rows(C, case):
    rows = DIFF_CASES[case]
    keep, rids_full = split(rows)
    rids = torch.tensor(rids_full, device="cuda")
    for ratio in (128, 4):
        plans = []
        for sub_rows, sub_rids in ((rows, rids), ([rows[i] for i in keep], rids[keep])):
            seq, ext = lens(sub_rows)
            n = int(ext.sum())
            plans.append(C.CompressorPrefillPlan.generate_legacy(ratio, sub_rids, seq, ext, n, torch.device("cuda")))
        torch.cuda.synchronize()
        assert same_bytes(plans[0].plan_c, plans[1].plan_c) and same_bytes(plans[0].plan_w, plans[1].plan_w)


# --------------------------------------------------------------------------- (d) random vs float64


def test_d_random_batches_vs_float64_reference(C, rng: random.Random, seed: int):
    n_batches = harness.scaled(200)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    paged = Paged()
    stats = {"batches": 0, "rounds": 0, "zero_rows": 0, "chunks": 0, "state_rows": 0,
             "max_err_out": 0.0, "max_err_state": 0.0, "cplan_checks": 0}  # fmt: skip
    start_time = time.monotonic()
    for _ in range(n_batches):
        bs = rng.randint(1, 64)
        rids = torch.tensor(rng.sample(range(1, NUM_REQS), bs), device="cuda")
        ref = OnlineC128Reference(0.5 * torch.randn((128, HEAD), generator=gen, device="cuda", dtype=torch.float64))
        ape = ref.ape.float()
        state = torch.full((NUM_REQS, 1, 3 * HEAD), NAN, device="cuda")  # poisoned
        seq = [128 * rng.randint(0, 3) for _ in range(bs)]
        for _round in range(rng.randint(1, 3)):
            ext = [0 if rng.random() < 0.3 else rng.randint(1, 300) for _ in range(bs)]
            prefix, seq = seq, [s + e for s, e in zip(seq, ext)]
            rows = list(zip(seq, ext))
            n = sum(ext)
            kv_in = torch.randn((n, 2 * HEAD), generator=gen, device="cuda")
            kv_in[:, HEAD:] *= 2.0  # scores
            cg = rng.random() < 0.5
            plan = online_plan(C, rows, rids, cg)
            before = state.clone()
            out = torch.full((plan.plan_c.shape[0], HEAD), NAN, device="cuda")
            C.compress_forward(state, kv_in, ape, plan, head_dim=HEAD, compress_ratio=128, out=out, is_online=True)

            expected, start = [], 0
            for i in range(bs):
                tok = kv_in[start : start + ext[i]]
                expected += ref.extend(i, prefix[i], tok[:, :HEAD], tok[:, HEAD:])
                start += ext[i]
            num_c = len(expected)
            assert plan.plan_c.shape[0] == (n if cg else num_c)
            if num_c:
                got, exp = out[:num_c].double(), torch.stack(expected)
                torch.testing.assert_close(got, exp, rtol=5e-4, atol=5e-4)
                stats["max_err_out"] = max(stats["max_err_out"], (got - exp).abs().max().item())
            assert torch.isnan(out[num_c:]).all()  # padding plans write nothing

            # state: rows with an open chunk after a non-empty extend hold the reference state;
            # every other slot (zero rows, rows that ended on a chunk boundary, other slots) is
            # byte-for-byte what it was before
            ref_states = {i: ref.state(i) for i in range(bs) if ext[i]}
            written = [i for i, st in ref_states.items() if st is not None]
            if written:
                slots = rids[written]
                got = state[slots, 0].double()
                exp = torch.stack([ref_states[i] for i in written])
                torch.testing.assert_close(got[:, :HEAD], exp[:, :HEAD], rtol=1e-5, atol=1e-5)  # max
                torch.testing.assert_close(got[:, HEAD:], exp[:, HEAD:], rtol=5e-4, atol=5e-4)  # sum, kv
                stats["max_err_state"] = max(stats["max_err_state"], (got - exp)[:, HEAD:].abs().max().item())
                stats["state_rows"] += len(written)
            untouched = torch.ones(NUM_REQS, dtype=torch.bool, device="cuda")
            untouched[rids[written]] = False
            assert same_bytes(state[untouched], before[untouched])

            # c_plan on the same batch: CPU-lens and GPU-lens (kernel0) planners agree
            if bs <= n:
                ratio = rng.choice([4, 128])
                cpu = c_plan(C, ratio, rows, rids, paged, gpu_lens=False, use_cuda_graph=True)
                gpu = c_plan(C, ratio, rows, rids, paged, gpu_lens=True, use_cuda_graph=True)
                ids = list(range(bs))
                assert torch.equal(canonical_c(cpu.plan_c, ids, True)[0], canonical_c(gpu.plan_c, ids, True)[0])
                assert torch.equal(canonical_w(cpu.plan_w, True), canonical_w(gpu.plan_w, True))
                stats["cplan_checks"] += 1
            stats["rounds"] += 1
            stats["zero_rows"] += ext.count(0)
            stats["chunks"] += num_c
        stats["batches"] += 1
    stats["seconds"] = time.monotonic() - start_time
    harness.write_result("series1_random", stats)
    assert stats["zero_rows"] > 0 and stats["chunks"] > 0


# --------------------------------------------------------------------------- (e) bad lengths


BAD_ROWS = {
    "negative_extend": (10, -1),
    "negative_seq": (-5, 0),
    "extend_over_seq": (5, 6),
    "extend_wraps_to_zero": (10, -(2**32)),  # int64 that casts to uint32 0
    "seq_past_range": (2**32 + 5, 5),  # upstream would have truncated it to 5
}


@pytest.mark.parametrize("bad", sorted(BAD_ROWS))
def test_e_bad_lengths_still_raise(C, bad):
    rows = [(10, 4), BAD_ROWS[bad], (3, 3)]
    n = 4 + 3 + max(BAD_ROWS[bad][1], 0)
    rids = torch.tensor([1, 2, 3], device="cuda")
    with pytest.raises(RuntimeError, match="bad seq_len"):
        online_plan(C, rows, rids, use_cuda_graph=False, num_q=n)
    paged = Paged()
    cplan_rows = rows if bad != "seq_past_range" else [(10, 4), (2**31 + 5, 5), (3, 3)]
    for ratio in (128, 4):
        with pytest.raises(RuntimeError, match="bad seq_len"):
            c_plan(C, ratio, cplan_rows, rids, paged, gpu_lens=False, use_cuda_graph=False, num_q=n)
        with pytest.raises(RuntimeError, match="bad seq_len"):
            seq, ext = lens(cplan_rows)
            C.CompressorPrefillPlan.generate_legacy(ratio, rids, seq, ext, n, torch.device("cuda"))
    torch.cuda.synchronize()
