#!/usr/bin/env python3
"""Side-by-side latency of DSPARK c128 kernel variants in CUDA graphs (one GPU run).

Variants are built from header texts with every `Dspark`/`dspark_c128` symbol renamed, so each
loads as its own module next to the tree's ops module:
  tree       the patched tree's csrc header (what ships), through the real ops module;
  <tag>=FILE another header (e.g. the previous commit's), same host entries;
  postwait   the tree header with the PDL wait moved ahead of every load;
  nobanks    the tree header with the bank stores cut out: the verify compress alone, which
             any verify step needs, so fused - nobanks is what the bank writes add;
  --candidates adds the changes under trial (kernel_variants.candidate_variants).
(Run 2, ci/bench/results/explore-2-geometry.json, also built fixed block geometries of the
header as of commit 4a10d85: no gain, so the shipped header keeps one geometry.)
Commit is timed alone (one graph node: graph launch included) and as a chain of 8 launches
over 8 distinct state sets (per launch; every launch reads cold memory).
Also the launch floor: 1 and 31 chained graph nodes of a kernel doing nothing / one round trip.
Prints a table and writes JSON (--out).

usage: python ci/bench/explore_dspark_latency.py --tree T --out x.json [--variant old=FILE] [--sass DIR]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import random
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from bench_online_c128_dspark import (  # noqa: E402
    LAYERS,
    Timer,
    commit_bytes,
    copy_ceiling_gbps,
    util,
    verify_bytes,
)
from kernel_variants import CUH, candidate_variants, derived_variants, load_floor, load_variant  # noqa: E402


def dump_sass(mods: dict, sass_dir: Path) -> None:
    sass_dir.mkdir(parents=True, exist_ok=True)
    root = Path(os.environ.get("SGLANG_JIT_CACHE_DIR", "/tmp"))
    for so in root.rglob("*.so"):
        if "dspark" in str(so):
            out = subprocess.run(["cuobjdump", "-sass", "-res-usage", str(so)], capture_output=True, text=True)
            (sass_dir / (so.parent.name + "_" + so.stem + ".sass")).write_text(out.stdout + out.stderr)


def bench(  # noqa: C901 (one config's graph-captured closures share its tensors)
    B: int, W: int, mods: dict, floors: dict, timer: Timer, ceiling: float, rng: random.Random,
) -> list[dict]:
    ops = util.dspark_ops()
    dev = torch.device("cuda")
    D = 512
    slots = B + 8
    states = [torch.randn(((W + 1) * slots, 3 * D), device=dev) for _ in range(LAYERS)]
    for st in states:
        st[:, D: 2 * D].abs_().add_(1.0)
    ape = [torch.randn((128, D), device=dev) for _ in range(LAYERS)]
    seq = [rng.randint(0, 8000) for _ in range(B)]
    lens = [W] * B
    accept = [rng.randint(1, W) for _ in range(B)]
    N = B * W
    kv = [torch.randn((N, 2 * D), device=dev) for _ in range(LAYERS)]
    seq_d = torch.tensor(seq, dtype=torch.int64, device=dev)
    len_d = torch.tensor(lens, dtype=torch.int32, device=dev)
    esl_d = torch.tensor([i * W for i in range(B)], dtype=torch.int32, device=dev)
    rid_d = torch.arange(1, B + 1, dtype=torch.int64, device=dev)
    new_d = seq_d + torch.tensor(accept, dtype=torch.int64, device=dev)
    table = ops.make_state_ptr_table(states)
    out = torch.empty((N, D), device=dev)
    chain_sets = [[torch.randn(((W + 1) * slots, 3 * D), device=dev) for _ in range(LAYERS)] for _ in range(8)]
    chain_tables = [ops.make_state_ptr_table(c) for c in chain_sets]
    plan = ops.dspark_verify_plan(seq_d, len_d, esl_d, rid_d, num_q_tokens=N, num_banks=W,
                                  state_slot_offset=slots, max_num_reqs=slots)
    torch.cuda.synchronize()
    fb = verify_bytes(seq, lens, W, emit=True) * LAYERS
    vb = verify_bytes(seq, lens, W, emit=False) * LAYERS
    cb = commit_bytes(seq, accept)
    rows: list[dict] = []

    def add(variant: str, what: str, fn, nbytes: int = 0) -> None:
        us = timer.graph_us(fn)
        gbps = nbytes / (us * 1e-6) / 1e9 if nbytes else 0.0
        rows.append({"B": B, "W": W, "variant": variant, "what": what, "us": us, "gbps": gbps,
                     "pct_ceiling": 100.0 * gbps / ceiling if nbytes else 0.0})

    for tag, mod in mods.items():
        def fused(mod=mod):
            for st, a, k in zip(states, ape, kv):
                mod.verify_compress(st, k, a, out, plan.plan_c, seq_d, esl_d, rid_d, len_d, plan.row_emit,
                                    W, slots, slots)

        def write_prefix(mod=mod):
            for st, a, k in zip(states, ape, kv):
                mod.write_prefix(st, k, a, seq_d, len_d, esl_d, rid_d, W, slots, N, slots)

        def commit(mod=mod):
            mod.commit(table, seq_d, new_d, len_d, esl_d, rid_d, N, W, slots, slots, (W + 1) * slots, 3 * D)

        def commit_chain(mod=mod):
            for t in chain_tables:
                mod.commit(t, seq_d, new_d, len_d, esl_d, rid_d, N, W, slots, slots, (W + 1) * slots, 3 * D)

        def step(mod=mod):
            mod.plan(seq_d, len_d, esl_d, rid_d, plan.plan_c, plan.plan_w, plan.row_emit, plan.row_len, W, slots, slots)
            fused(mod)
            commit(mod)

        add(tag, "fused x31", fused, fb)
        if tag != "nobanks":
            add(tag, "write_prefix x31", write_prefix, vb)
            add(tag, "commit 1 launch", commit, cb)
            add(tag, "commit chain x8, per launch", commit_chain, cb * len(chain_tables))
            rows[-1]["us"] /= len(chain_tables)
            add(tag, "fused step", step, fb + cb)
    dst = [torch.empty_like(k) for k in kv]
    for name, mod in floors.items():
        for nodes in (1, LAYERS):
            for touch in (False, True):
                def chain(mod=mod, touch=touch, nodes=nodes):
                    for k, d in list(zip(kv, dst))[:nodes]:
                        mod.run(k, d, B * 8, 64, touch)

                add(name, f"{nodes} nodes, " + ("1 round trip each" if touch else "empty"), chain)
    del states, kv, table, dst, chain_sets, chain_tables
    torch.cuda.empty_cache()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--variant", action="append", default=[], help="TAG=FILE: another header to compare")
    ap.add_argument("--configs", default="48x8,48x4,128x4,128x8,256x4,256x8")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--sass", type=Path, default=None)
    ap.add_argument("--skip", action="append", default=[], help="a derived variant not to build")
    ap.add_argument("--candidates", action="store_true", help="also build kernel_variants.candidate_variants")
    args = ap.parse_args()
    util.install(args.tree)
    torch.cuda.init()
    tree_cuh = (args.tree / CUH).read_text()
    texts = {"tree": tree_cuh, **derived_variants(tree_cuh)}
    if args.candidates:
        texts.update(candidate_variants(tree_cuh))
    for tag in args.skip:
        texts.pop(tag)
    for item in args.variant:
        tag, _, path = item.partition("=")
        texts[tag] = Path(path).read_text()
    work = Path(os.environ.get("SGLANG_JIT_CACHE_DIR", "/tmp")) / "variants"
    work.mkdir(parents=True, exist_ok=True)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futs = {tag: pool.submit(load_variant, tag, text, work) for tag, text in texts.items()}
        ffuts = {f"floor-{'pdl' if p else 'nopdl'}": pool.submit(load_floor, p) for p in (True, False)}
        mods = {tag: f.result() for tag, f in futs.items()}
        floors = {tag: f.result() for tag, f in ffuts.items()}
    if args.sass:
        dump_sass(mods, args.sass)
    ceiling = copy_ceiling_gbps()
    timer = Timer(args.reps)
    rng = random.Random(1)
    rows: list[dict] = []
    for cfg in args.configs.split(","):
        B, W = (int(x) for x in cfg.split("x"))
        rows += bench(B, W, mods, floors, timer, ceiling, rng)
    print(f"copy ceiling {ceiling:.0f} GB/s")
    print(f"{'B':>4} {'W':>2} {'variant':<12} {'what':<28} {'us':>8} {'%ceil':>6}")
    for r in rows:
        print(f"{r['B']:>4} {r['W']:>2} {r['variant']:<12} {r['what']:<28} {r['us']:>8.1f} {r['pct_ceiling']:>6.1f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "copy_ceiling_gbps": ceiling,
                                    "command": " ".join(sys.argv), "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
