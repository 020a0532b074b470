"""ci/bench/upstream_mtp.py on the real releases (CPU): 0.5.23 goes through upstream's own
functions, 0.5.20-0.5.22 through the JIT module their controller calls, and every release hands
the kernel module the same arguments 0.5.23's functions do. The JIT loader is replaced by a
recorder (no build); the modules imported are the releases' own. Needs torch, tvm_ffi and
msgspec (skips without them, as test_gpu_harness_imports does)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "gpu"))

import harness  # noqa: E402
import tree_subset  # noqa: E402

RELEASES = ["v0.5.20", "v0.5.21", "v0.5.22", "v0.5.23"]

PROBE = """
import json, sys
import torch
sys.path.insert(0, {bench!r})
import sglang.kernels.ops.attention.dsv4.online_c128_mtp as m
from upstream_mtp import resolve

calls = []
class Kernels:
    def __init__(self, ctor):
        self.ctor = ctor
    def __getattr__(self, kernel):
        return lambda *a: calls.append([self.ctor, kernel, [names.get(id(x), x) for x in a]])

def jit(*ctor):
    return Kernels([str(c) for c in ctor])

m._jit_online_c128_mtp_module = jit  # the functions (0.5.23) look it up at call time too
t = {{n: torch.zeros(2, dtype=d) for n, d in
     [("kv", torch.float32), ("seq", torch.int64), ("rid", torch.int32), ("r2t", torch.int32),
      ("ape", torch.float32), ("pending", torch.int64)]}}
t["state"] = torch.zeros(2, dtype=torch.bfloat16)
names = {{id(v): k for k, v in t.items()}}
mtp = resolve(m)
mtp.write_prefix_states(t["kv"], t["seq"], t["rid"], t["r2t"], t["ape"], t["state"], 3, 4, 5, head_dim=512)
mtp.mark_pending(t["seq"], t["rid"], t["pending"], 3, 6, head_dim=512, state_dtype=torch.float16)
mtp.commit_pending(t["seq"], t["rid"], t["r2t"], t["pending"], t["state"], 3, 4, 5, 6, head_dim=512)
print("PROBE " + json.dumps({{"path": mtp.path, "calls": calls}}))
"""


def test_adapter_picks_the_release_path(release_trees, tmp_path: Path):
    for mod in ("torch", "tvm_ffi", "msgspec"):
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"{mod} not installed")
    seen = {}
    for rev in RELEASES:
        tree = tmp_path / rev
        tree_subset.copy_subset(release_trees[rev], tree)
        proc = harness.run_with_tree(tree, PROBE.format(bench=str(REPO / "ci" / "bench")))
        line = next((x for x in proc.stdout.splitlines() if x.startswith("PROBE ")), None)
        assert line, proc.stderr[-3000:]
        seen[rev] = json.loads(line.removeprefix("PROBE "))
    assert {rev: s["path"] for rev, s in seen.items()} == {
        "v0.5.20": "jit module", "v0.5.21": "jit module", "v0.5.22": "jit module", "v0.5.23": "functions"}
    reference = seen["v0.5.23"]["calls"]
    assert [c[1] for c in reference] == ["write_prefix_states", "mark_pending", "commit_pending"]
    assert reference[1][0] == ["512", "torch.int64", "torch.int32", "torch.float16"]  # mark: the state dtype given
    assert reference[2][2] == ["seq", "rid", "r2t", "pending", "state", 3, 4, 5, 6]
    for rev in RELEASES[:-1]:
        assert seen[rev]["calls"] == reference, rev


def test_a_module_without_either_is_refused():
    sys.path.insert(0, str(REPO / "ci" / "bench"))
    import types

    import upstream_mtp

    with pytest.raises(RuntimeError, match="neither"):
        upstream_mtp.resolve(types.ModuleType("sglang.kernels.ops.attention.dsv4.online_c128_mtp"))
