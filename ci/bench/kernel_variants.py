"""Bench-only builds of the DSPARK c128 header: renamed copies (so several load side by side
next to the tree's ops module) and variants derived from the shipped text, plus the
launch-floor kernel (kernels/launch_floor.cuh). Each derivation names the exact text it
edits and stops with a message when the header no longer has it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CUH = "sglang/kernels/jit/csrc/deepseek_v4/online_c128_dspark.cuh"
WAIT = "  PDLWaitPrimary<kUsePDL>();  // kv_score_input, bank 0 and row_emit may come from the kernels just before\n"
VERIFY_TOP = "  if (row >= params.batch_size) return;\n\n  // Row metadata and ape"
BANK_STORES = "          m.store(dst);\n          s.store(dst + kHeadDim);\n          k.store(dst + kHeadDim * 2);\n"


def _must_replace(text: str, old: str, new: str, what: str) -> str:
    if text.count(old) != 1:
        raise SystemExit(f"variant {what}: expected one match of {old[:60]!r} in the header, found {text.count(old)}")
    return text.replace(old, new)


def derived_variants(tree_cuh: str) -> dict[str, str]:
    post = _must_replace(tree_cuh, WAIT, "", "postwait")
    post = _must_replace(post, VERIFY_TOP, VERIFY_TOP.replace("\n\n", "\n  PDLWaitPrimary<kUsePDL>();\n\n", 1),
                         "postwait")
    nobanks = _must_replace(tree_cuh, BANK_STORES, "          (void)dst;\n", "nobanks")
    return {"postwait": post, "nobanks": nobanks}


VEC2 = "inline constexpr uint32_t kDsparkVerifyVec = 2;\n"
COMMIT_COPY = ("if (i < params.row_vecs) tmp[u] = src[i];", "if (i < params.row_vecs) dst[i] = tmp[u];")


def candidate_variants(tree_cuh: str) -> dict[str, str]:
    """Changes under trial: 4 channels (16-byte accesses) per verify thread; streaming
    (evict-first) loads and stores in the commit copy; both."""
    vec4 = _must_replace(tree_cuh, VEC2, VEC2.replace("= 2", "= 4"), "vec4")

    def streaming(text: str) -> str:
        text = _must_replace(text, COMMIT_COPY[0], "if (i < params.row_vecs) tmp[u] = __ldcs(src + i);", "cs")
        return _must_replace(text, COMMIT_COPY[1], "if (i < params.row_vecs) __stcs(dst + i, tmp[u]);", "cs")

    return {"vec4": vec4, "cs": streaming(tree_cuh), "vec4cs": streaming(vec4)}


def renamed(text: str, tag: str) -> str:
    text = re.sub(r"Dspark", f"Dspark{tag.capitalize()}", text)
    return re.sub(r"dspark_c128", f"dspark_c128_{tag}", text)


def load_variant(tag: str, text: str, work: Path) -> Any:
    import torch
    from sglang.kernels.jit.utils import is_arch_support_pdl, load_jit, make_cpp_args

    path = work / f"online_c128_dspark_{tag}.cuh"
    path.write_text(renamed(text, tag))
    args = make_cpp_args(512, torch.float32, is_arch_support_pdl())
    cls = f"Dspark{tag.capitalize()}C128Kernel<{args}>"
    return load_jit(f"dspark_exp_{tag}", *args, cuda_files=[str(path)], extra_cuda_cflags=["-use_fast_math"],
                    cuda_wrappers=[("plan", f"{cls}::run_plan"), ("verify_compress", f"{cls}::run_verify"),
                                   ("write_prefix", f"{cls}::run_write_prefix"), ("commit", f"{cls}::run_commit")])


def load_floor(pdl: bool) -> Any:
    from sglang.kernels.jit.utils import load_jit

    arg = "true" if pdl else "false"
    return load_jit(f"dspark_launch_floor_{arg}", arg, cuda_files=[str(HERE / "kernels" / "launch_floor.cuh")],
                    cuda_wrappers=[("run", f"LaunchFloorKernel<{arg}>::run")])
