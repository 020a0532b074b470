"""Run the C128 planners' host stage on a machine without a GPU (used by test_planner_host_cpu.py).

Run through ``harness.run_with_tree(tree, code)``. Builds compress.py's online and plan modules
with sglang's own ``load_jit`` for sm_90a, then calls the planners with CPU tensors: the host
stage 0 fills the pinned buffer, then the first CUDA call fails (no driver). Prints one JSON line
``PROBE {case: {"error": str, "pin_c": hex, "pin_w": hex}}`` read back by the test.
"""

import ctypes
import glob
import json
import os

for lib in sorted(glob.glob(os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "lib64", "libcudart.so*"))):
    ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)  # the built .so has no rpath; torch (CPU) did not load it
    break

import torch  # noqa: E402
from sglang.kernels.jit.utils import arch  # noqa: E402

with arch.override_jit_cuda_arch(9, 0):
    from sglang.kernels.ops.attention.dsv4 import compress

    online_mod = compress._jit_compress_128_online_module(512)
    plan_mod = compress._jit_compress_plan_module()


def call(fn):
    try:
        fn()
        return ""
    except Exception as e:  # the planners raise RuntimeError through tvm-ffi
        return f"{type(e).__name__}: {e}"


def online(rows, use_cuda_graph):
    seq = torch.tensor([s for s, _ in rows], dtype=torch.int64)
    ext = torch.tensor([e for _, e in rows], dtype=torch.int64)
    n = int(ext.clamp(min=0).sum())
    pin = torch.full((2, n, 16), 0xAB, dtype=torch.uint8)
    dev = torch.zeros((2, n, 16), dtype=torch.uint8)
    rid = torch.arange(len(rows), dtype=torch.int64)
    r2t = torch.zeros((len(rows), 1), dtype=torch.int32)
    err = call(lambda: online_mod.plan_prefill(seq, ext, rid, r2t, pin[0], pin[1], dev[0], dev[1], 0, use_cuda_graph))
    return {"error": err, "pin_c": pin[0].numpy().tobytes().hex(), "pin_w": pin[1].numpy().tobytes().hex()}


def cplan(rows, ratio, use_cuda_graph):
    seq = torch.tensor([s for s, _ in rows], dtype=torch.int64)
    ext = torch.tensor([e for _, e in rows], dtype=torch.int64)
    n = int(ext.clamp(min=0).sum())
    rid = torch.arange(len(rows), dtype=torch.int64)
    r2t = torch.zeros((len(rows), 4096), dtype=torch.int32)
    f2s = torch.zeros(16, dtype=torch.int64)
    pin = torch.full((n * 24,), 0xAB, dtype=torch.uint8)
    ring = 128 if ratio == 128 else 8
    err = call(lambda: plan_mod.plan_prefill(rid, r2t, f2s, seq, ext, pin, n, ratio, 256, ring, False, use_cuda_graph))
    return {"error": err, "pin_c": pin[: n * 16].numpy().tobytes().hex(),
            "pin_w": pin[n * 16 :].numpy().tobytes().hex()}


cases = json.loads(os.environ["C128PATCH_PROBE_CASES"])
result = {}
for name, (kind, rows, ratio, use_cuda_graph) in cases.items():
    result[name] = online(rows, use_cuda_graph) if kind == "online" else cplan(rows, ratio, use_cuda_graph)
print("PROBE " + json.dumps(result))
