"""Patch 0001 without a GPU: the planners' host stage, built by sglang's own load_jit (sm_90a) from
the unpatched and the patched 0.5.23 tree, run on CPU tensors (tests/planner_host_probe.py).

- upstream: a zero-length row raises at c128_online_v2.cuh:685 / c_plan.cuh:577 (the PR's bug 1);
- patched: inputs upstream accepts give byte-identical stage-0 plans;
- patched: a batch with zero rows gives the stage-0 plans of the same batch without them, batch
  ids mapped back to the original rows;
- patched: negative, wrapping or inconsistent lengths are rejected before any cast.

The GPU tier (tests/gpu/test_series1_zero_rows.py) checks stage 1, the kernels and the outputs.
Needs torch, tvm_ffi, msgspec, ninja, nvcc and a CUDA toolkit's libcudart; skips without them.
"""

from __future__ import annotations

import importlib.util
import json
import random
import re
import shutil
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "gpu"))

import harness  # noqa: E402
import tree_subset  # noqa: E402

INVALID = 0xFFFFFFFF
UNWRITTEN = 0xABABABAB  # the probe fills the pinned buffers with 0xAB

ZERO_ROW_CASES = {
    "mixed": [(5, 0), (300, 44), (130, 0), (129, 0), (10, 10), (1000, 700), (256, 128), (77, 0)],
    "verify_uniform": [(131, 4), (1, 0), (255, 4), (128, 4), (1, 0), (1, 0), (700, 4), (4, 4)],
    "verify_ragged": [(200, 1), (1, 0), (129, 3), (384, 8), (64, 2), (2, 0)],
}
BAD_ROWS = {
    "negative_extend": (10, -1),
    "negative_seq": (-5, 0),
    "extend_over_seq": (5, 6),
    "extend_wraps_to_zero": (10, -(2**32)),
    "seq_past_range": (2**32 + 5, 5),
}


def _need_toolchain() -> None:
    for mod in ("torch", "tvm_ffi", "msgspec"):
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"{mod} not installed")
    if not shutil.which("nvcc") or not shutil.which("ninja"):
        pytest.skip("nvcc / ninja not on PATH")


def _probe(tree: Path, cases: dict) -> dict:
    code = (HERE / "planner_host_probe.py").read_text()
    proc = harness.run_with_tree(tree, code, env={"C128PATCH_PROBE_CASES": json.dumps(cases)})
    found = re.search(r"^PROBE (.*)$", proc.stdout, re.M)
    assert found, proc.stderr[-4000:]
    return json.loads(found.group(1))


def _cases() -> dict:
    cases: dict = {}
    for name, rows in ZERO_ROW_CASES.items():
        keep = [r for r in rows if r[1] > 0]
        for cg in (False, True):
            cases[f"online/{name}/cg{cg:d}/full"] = ("online", rows, 128, cg)
            cases[f"online/{name}/cg{cg:d}/reduced"] = ("online", keep, 128, cg)
            for ratio in (128, 4):
                cases[f"cplan{ratio}/{name}/cg{cg:d}/full"] = ("cplan", rows, ratio, cg)
                cases[f"cplan{ratio}/{name}/cg{cg:d}/reduced"] = ("cplan", keep, ratio, cg)
    rng = random.Random(0)
    for k in range(40):  # valid inputs upstream accepts
        rows = []
        for _ in range(rng.randint(1, 64)):
            ext = rng.randint(1, 300)
            rows.append((ext + 128 * rng.randint(0, 3) + rng.randint(0, 127), ext))
        cg = bool(k % 2)
        cases[f"valid{k}/online"] = ("online", rows, 128, cg)
        cases[f"valid{k}/cplan"] = ("cplan", rows, rng.choice([4, 128]), cg)
    for bad, row in BAD_ROWS.items():
        rows = [(10, 4), row, (3, 3)]
        cases[f"bad/{bad}/online"] = ("online", rows, 128, False)
        cplan_row = row if bad != "seq_past_range" else (2**31 + 5, 5)
        cases[f"bad/{bad}/cplan"] = ("cplan", [(10, 4), cplan_row, (3, 3)], 128, False)
    return cases


@pytest.fixture(scope="module")
def probes(tmp_path_factory, release_trees, patched_tree_023) -> dict[str, dict]:
    _need_toolchain()
    root = tmp_path_factory.mktemp("planner_host")
    upstream, patched = root / "upstream", root / "patched"
    tree_subset.copy_subset(release_trees["v0.5.23"], upstream)
    tree_subset.copy_subset(patched_tree_023, patched)
    cases = _cases()
    return {"upstream": _probe(upstream, cases), "patched": _probe(patched, cases)}


def _entries(hex_bytes: str, size: int) -> list[bytearray]:
    raw = bytes.fromhex(hex_bytes)
    return [bytearray(raw[i : i + size]) for i in range(0, len(raw), size)]


def _u32(e: bytearray, off: int) -> int:
    return int.from_bytes(e[off : off + 4], "little")


def _remap(entries: list[bytearray], off: int, keep: list[int], packed: bool) -> list[bytearray]:
    """Map stage-0 batch ids (reduced batch) back to full-batch rows."""
    out = []
    for e in entries:
        e = bytearray(e)
        if _u32(e, 0) not in (INVALID, UNWRITTEN):
            v = _u32(e, off)
            v = (v & 0xFFFF) | (keep[v >> 16] << 16) if packed else keep[v]
            e[off : off + 4] = v.to_bytes(4, "little")
        out.append(e)
    return out


def test_upstream_raises_on_zero_rows(probes):
    for name in ZERO_ROW_CASES:
        for cg in (0, 1):
            assert "c128_online_v2.cuh:685" in probes["upstream"][f"online/{name}/cg{cg}/full"]["error"]
            for ratio in (128, 4):
                assert "c_plan.cuh:577" in probes["upstream"][f"cplan{ratio}/{name}/cg{cg}/full"]["error"]


def test_valid_inputs_plan_byte_for_byte_as_upstream(probes):
    valid = [k for k in probes["upstream"] if k.startswith("valid")]
    assert len(valid) == 80
    for k in valid:
        up, pt = probes["upstream"][k], probes["patched"][k]
        assert "CUDA error" in up["error"] and "CUDA error" in pt["error"], (k, up["error"], pt["error"])
        assert up["pin_c"] == pt["pin_c"] and up["pin_w"] == pt["pin_w"], k


def test_zero_rows_plan_like_the_batch_without_them(probes):
    res = probes["patched"]
    for name, rows in ZERO_ROW_CASES.items():
        keep = [i for i, (_, e) in enumerate(rows) if e > 0]
        for cg in (0, 1):
            for kind, size_c, off_c, size_w, off_w, packed_w in (
                ("online", 16, 8, 16, 8, False),  # CompressPlan.read_page_0 holds the batch id
                ("cplan128", 16, 12, 8, 0, True),  # read_page_1; WritePlan packs it in ragged_id
                ("cplan4", 16, 12, 8, 0, True),
            ):
                full, red = res[f"{kind}/{name}/cg{cg}/full"], res[f"{kind}/{name}/cg{cg}/reduced"]
                assert "CUDA error" in full["error"], (kind, name, full["error"])  # got past stage 0
                assert _entries(full["pin_c"], size_c) == _remap(_entries(red["pin_c"], size_c), off_c, keep, False)
                assert _entries(full["pin_w"], size_w) == _remap(_entries(red["pin_w"], size_w), off_w, keep, packed_w)
                written = [e for e in _entries(full["pin_c"], size_c) if _u32(e, 0) not in (INVALID, UNWRITTEN)]
                assert written, (kind, name)  # the case does emit plans


def test_bad_lengths_rejected(probes):
    for bad in BAD_ROWS:
        for kind in ("online", "cplan"):
            err = probes["patched"][f"bad/{bad}/{kind}"]["error"]
            assert "row 1: bad seq_len" in err, (bad, kind, err)
    # upstream truncated these two silently instead of rejecting them
    assert "CUDA error" in probes["upstream"]["bad/seq_past_range/online"]["error"]
