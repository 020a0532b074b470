"""KV capacity of a DeepSeek-V4 target with online C128 off and on.

Mirrors upstream's ``DSV4PoolConfigurator`` (non-unified CUDA pool, ratio-mode SWA, no encoder
replay, HiSparse or PD decode). Online C128 only changes the fixed c128 state subtracted from the
budget before it is divided by bytes-per-full-token: the gain is ``(F_off - F_on) / b`` tokens,
floored to pages. Citations ``file:line`` are sglang 0.5.23 (under ``sglang/``) unless a version is
named. ``formula`` picks the family: 0.5.21-0.5.23 (page-padded KV bytes; 0.5.21/0.5.22 without
0.5.23's floor of R // attn_dp_size at 1 and its reserved-page re-check) or 0.5.20 (also PR #32035's
July 2026 base: a flat 584-byte cell, c4 state priced per ``window_size`` rows).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Literal, Optional

Formula = Literal["0.5.23", "0.5.22", "0.5.21", "0.5.20"]
StateDtype = Literal["fp32", "bf16"]
KVLayoutName = Literal["v4", "v41"]

FORMULAS: tuple[str, ...] = ("0.5.23", "0.5.22", "0.5.21", "0.5.20")

# srt/configs/deepseek_v4.py:58,79,80,102 (dataclass defaults; V4-Flash and V4-Pro agree).
QK_NOPE_HEAD_DIM = 448
QK_ROPE_HEAD_DIM = 64
INDEX_HEAD_DIM = 128
WINDOW_SIZE = 128
ATTN_HEAD_DIM = QK_NOPE_HEAD_DIM + QK_ROPE_HEAD_DIM  # pool_configurator.py:1082

# arg_groups/model_overrides/deepseek_v4.py:51,61 (CUDA page size for DSV4).
DSV4_PAGE_SIZE = 256
# arg_groups/deepseek_v4_hook.py:138-146: 256 when unset; it runs (pipeline.py:225) before
# handle_speculative_decoding (:306), so DSPARK's default never applies to DSV4 (0.5.20: :178-186, :242 vs :325).
DSV4_DEFAULT_MAX_RUNNING_REQUESTS = 256
# arg_groups/speculative_hook.py:852-860 (_handle_dspark): 48 when still unset.
DSPARK_DEFAULT_MAX_RUNNING_REQUESTS = 48
# dspark_config.py:21, speculative_hook.py:818,825: W = gamma + 1, gamma = 7 unless the draft
# checkpoint sets dspark_block_size (dspark_config.py:220,296).
DSPARK_DEFAULT_GAMMA = 7
DSPARK_DEFAULT_DRAFT_TOKENS = DSPARK_DEFAULT_GAMMA + 1
# pool_configurator.py:1046 (ratio used when the operator gives none).
DEFAULT_SWA_FULL_TOKENS_RATIO = 0.1

_STATE_DTYPE_BYTES = {"fp32": 4, "bf16": 2}  # pool_configurator.py:136-145

# kernels/ops/attention/dsv4/kv_layout.py:50-99: (data + scale bytes, page align).
_KV_LAYOUTS = {"v4": (576 + 8, 576), "v41": (512 + 16, 512)}


@dataclass(frozen=True)
class Layout:
    """Per-layer compress ratios of one model (0 = SWA only)."""

    name: str
    compress_ratios: tuple[int, ...]
    context_len: int
    source: str

    @property
    def num_layers(self) -> int:
        return len(self.compress_ratios)

    @property
    def num_c4(self) -> int:
        return self.compress_ratios.count(4)

    @property
    def num_c128(self) -> int:
        return self.compress_ratios.count(128)


FLASH = Layout("flash", (0, 0) + (4, 128) * 20 + (4,), 1_048_576,
               "DeepSeek-V4-Flash, 43 layers (21 c4 + 20 c128 + 2 SWA-only): the public config.json "
               "compress_ratios [0,0,4,128,4,128,...,4,0], whose last entry is the MTP placeholder and not a layer")
PRO = Layout("pro", (128, 128) + (4, 128) * 29 + (4,), 1_048_576,
             "DeepSeek-V4-Pro, 61 layers (31 c128 + 30 c4): from public model cards and third-party copies of "
             "config.json, unverified against the checkpoint")
PRESETS: dict[str, Layout] = {FLASH.name: FLASH, PRO.name: PRO}


def custom_layout(compress_ratios: list[int]) -> Layout:
    bad = sorted({r for r in compress_ratios if r not in (0, 4, 128)})
    if bad:
        raise ValueError(f"unsupported compress ratios {bad}; this tool models 0, 4 and 128")
    if not compress_ratios:
        raise ValueError("compress_ratios is empty")
    return Layout("custom", tuple(compress_ratios), 1_048_576, "user-given compress_ratios")


def layouts(presets: tuple[str, ...], compress_ratios: Optional[str] = None,
            context_len: Optional[int] = None) -> list[Layout]:
    """The presets (default flash and pro), or one layout of comma-separated ratios."""
    if compress_ratios:
        words = [x for x in compress_ratios.replace(" ", "").split(",") if x]
        bad = [x for x in words if not x.isdigit()]
        if bad:
            raise ValueError(f"{bad[0]!r} is not a ratio: give comma-separated integers, such as 0,4,128")
        chosen = [custom_layout([int(x) for x in words])]
    else:
        chosen = [PRESETS[p] for p in (presets or ("flash", "pro"))]
    return [replace(lt, context_len=context_len) for lt in chosen] if context_len is not None else chosen


# --max-running-requests keywords: DSV4's default, DSPARK's (non-DSV4 targets only), the estimate path
R_KEYWORDS = {"auto": DSV4_DEFAULT_MAX_RUNNING_REQUESTS, "dspark": DSPARK_DEFAULT_MAX_RUNNING_REQUESTS,
              "estimate": None}


def max_running_requests(value: str) -> tuple[Optional[int], str]:
    """INT or a keyword of R_KEYWORDS: (R, how it was given)."""
    key = value.strip().lower()
    if key in R_KEYWORDS:
        return R_KEYWORDS[key], key
    try:
        n = int(key)
    except ValueError:
        raise ValueError(f"expected an integer, auto, dspark or estimate; got {value!r}") from None
    if n < 1:
        raise ValueError("must be >= 1")
    return n, "given"


MAX_BUDGET = 1 << 50  # 1 PiB on one GPU


def kv_budget(budget_gib: Optional[float], budget_bytes: Optional[int], gpu_gib: Optional[float],
              mem_fraction_static: Optional[float], non_kv_gib: Optional[float]) -> int:
    """The KV byte budget the configurator divides (one GPU), given one of three ways."""
    derived = (gpu_gib, mem_fraction_static, non_kv_gib)
    if [budget_gib is not None, budget_bytes is not None, any(v is not None for v in derived)].count(True) != 1:
        raise ValueError("give the KV budget one way: --budget-gib, --budget-bytes, or "
                         "--gpu-gib with --mem-fraction-static and --non-kv-gib")
    named = {"--budget-gib": budget_gib, "--gpu-gib": gpu_gib, "--mem-fraction-static": mem_fraction_static,
             "--non-kv-gib": non_kv_gib}
    if bad := next((f"{k} {v}" for k, v in named.items() if v is not None and not math.isfinite(v)), None):
        raise ValueError(f"{bad}: give a finite number")
    if budget_bytes is not None:
        budget = budget_bytes
    elif budget_gib is not None:
        budget = int(budget_gib * (1 << 30))
    elif gpu_gib is None or mem_fraction_static is None or non_kv_gib is None:
        raise ValueError("--gpu-gib, --mem-fraction-static and --non-kv-gib go together")
    else:
        budget = int((gpu_gib * mem_fraction_static - non_kv_gib) * (1 << 30))
    if budget <= 0:
        raise ValueError(f"the KV budget must be positive, got {budget} bytes")
    if budget > MAX_BUDGET:  # the search is linear in the tokens it fits
        raise ValueError(f"the KV budget {budget} bytes is past {MAX_BUDGET >> 30} GiB on one GPU: not one this models")
    return budget


@dataclass(frozen=True)
class CapacityInputs:
    """One configurator run; ``max_running_requests=None``: the estimate path (pool_configurator.py:1565-1574)."""

    budget_bytes: int
    layout: Layout
    swa_full_tokens_ratio: float = DEFAULT_SWA_FULL_TOKENS_RATIO
    max_running_requests: Optional[int] = DSV4_DEFAULT_MAX_RUNNING_REQUESTS
    attn_dp_size: int = 1
    tp_size: int = 8  # recorded only: the DSV4 latent is replicated per TP rank
    speculative: bool = True
    num_draft_tokens: int = DSPARK_DEFAULT_DRAFT_TOKENS
    state_dtype: StateDtype = "fp32"
    page_size: int = DSV4_PAGE_SIZE
    formula: Formula = "0.5.23"
    kv_layout: KVLayoutName = "v4"

    def __post_init__(self) -> None:
        if self.budget_bytes <= 0:
            raise ValueError("budget_bytes must be positive")
        if self.formula not in FORMULAS:
            raise ValueError(f"formula must be one of {FORMULAS}, got {self.formula!r}")
        if self.state_dtype not in _STATE_DTYPE_BYTES:
            raise ValueError(f"state_dtype must be fp32 or bf16, got {self.state_dtype!r}")
        if self.kv_layout not in _KV_LAYOUTS:
            raise ValueError(f"kv_layout must be v4 or v41, got {self.kv_layout!r}")
        if self.kv_layout != "v4" and self.formula == "0.5.20":
            raise ValueError("the 0.5.20 formula has no KV layout choice (flat 584 B cell)")
        # pool_configurator.py:1641-1643
        if self.page_size <= 0 or self.page_size % 128:
            raise ValueError("page_size must be a multiple of 128 for compressed attention")
        if not 0 < self.swa_full_tokens_ratio <= 1:
            raise ValueError("swa_full_tokens_ratio must be in (0, 1]")
        if self.max_running_requests is not None and self.max_running_requests < 1:
            raise ValueError("max_running_requests must be >= 1")
        if self.attn_dp_size < 1 or self.tp_size < 1:
            raise ValueError("attn_dp_size and tp_size must be >= 1")
        if self.speculative and self.num_draft_tokens < 1:
            raise ValueError("num_draft_tokens must be >= 1 with speculation")

    @property
    def draft_tokens(self) -> int:
        """What max_speculative_num_draft_tokens() returns: 0 without speculation."""
        return self.num_draft_tokens if self.speculative else 0


# ---- per-token terms ----------------------------------------------------------------

INDEXER_BYTES_PER_TOKEN = INDEX_HEAD_DIM + INDEX_HEAD_DIM // 128 * 4  # FP8 row: deepseek_v4_memory_pool.py:53-57


def kv_bytes_per_token(inp: CapacityInputs, compress_ratio: int = 0) -> float:
    """One layer's KV bytes per (compressed) slot: the page-padded layout (pool_configurator.py:1353-1370,
    kv_layout.py:103-105), or 0.5.20's flat cell ``nope + 2*rope + 8`` (0.5.20 pool_configurator.py:1113)."""
    if inp.formula == "0.5.20":
        return float(QK_NOPE_HEAD_DIM + QK_ROPE_HEAD_DIM * 2 + 8)
    bytes_per_token, align = _KV_LAYOUTS[inp.kv_layout]
    page = inp.page_size // compress_ratio if compress_ratio else inp.page_size
    raw = page * bytes_per_token
    return (-(-raw // align) * align) / page


def ring_size(inp: CapacityInputs, compress_ratio: int, online: bool) -> int:
    """deepseek_v4_memory_pool.py:60-79 (0.5.20: :42-55, same values)."""
    if compress_ratio == 128 and online:
        return 1
    if inp.speculative and inp.draft_tokens > 0:
        return 16 if compress_ratio == 4 else 256
    return 8 if compress_ratio == 4 else 128


def bytes_per_swa_token(inp: CapacityInputs) -> float:
    """pool_configurator.py:1372-1388: every layer's SWA KV plus the c4 state, addressed per SWA page."""
    dt = _STATE_DTYPE_BYTES[inp.state_dtype]  # :136-145
    c4_state_bytes = 2 * 2 * ATTN_HEAD_DIM * dt  # :1380
    c4_indexer_state_bytes = 2 * 2 * INDEX_HEAD_DIM * dt  # :1381
    c4_state_ratio = ring_size(inp, 4, False) / inp.page_size  # :1383
    return kv_bytes_per_token(inp) * inp.layout.num_layers + (  # :1384-1388
        c4_state_ratio * (c4_state_bytes + c4_indexer_state_bytes) * inp.layout.num_c4)


def spec_inflation(inp: CapacityInputs) -> float:
    """(target + 1 draft layer) / target: pool_configurator.py:1250-1257 (0.5.20: :1046-1054)."""
    if not inp.speculative:
        return 1.0
    return (inp.layout.num_layers + 1) / inp.layout.num_layers


def bytes_per_full_token(inp: CapacityInputs) -> float:
    """b: the divisor of the budget, inflated for the draft worker when speculative (``spec_inflation``)."""
    if inp.formula != "0.5.20":  # pool_configurator.py:1437-1446 with :1390-1404 per compressed layer
        c4 = 0.25 * kv_bytes_per_token(inp, 4) + 1 / 4 * INDEXER_BYTES_PER_TOKEN  # :1397-1402
        c128 = 1 / 128 * kv_bytes_per_token(inp, 128)  # :1404
        # collect_sources_by_ratio (deepseek_v4_memory_pool.py:94-115) orders 4 before 128.
        compressed = c4 * inp.layout.num_c4 + c128 * inp.layout.num_c128
        return (inp.swa_full_tokens_ratio * bytes_per_swa_token(inp) + compressed) * spec_inflation(inp)
    # 0.5.20 pool_configurator.py:1110-1163 (one sum, in upstream's order)
    kv = kv_bytes_per_token(inp)
    dt = _STATE_DTYPE_BYTES[inp.state_dtype]
    c4_state_bytes = 2 * 2 * ATTN_HEAD_DIM * dt  # :1119
    c4_indexer_state_bytes = 2 * 2 * INDEX_HEAD_DIM * dt  # :1127
    c4_state_ratio = ring_size(inp, 4, False) / WINDOW_SIZE  # :1129 (swa_page_size = window)
    c4_frac = 1 / 4  # :1135
    r, L, L4, L128 = inp.swa_full_tokens_ratio, inp.layout.num_layers, inp.layout.num_c4, inp.layout.num_c128
    return (  # :1137-1163
        r * kv * L
        + c4_frac * kv * L4
        + 1 / 128 * kv * L128
        + 1 / 4 * INDEXER_BYTES_PER_TOKEN * L4
        + r * c4_state_ratio * c4_state_bytes * L4
        + 0 * L128  # c128 state is fixed bytes, not per token (:1133)
        + r * c4_state_ratio * c4_indexer_state_bytes * L4
    ) * spec_inflation(inp)


# ---- fixed (request-scoped) bytes ---------------------------------------------------


def c128_state_rows(inp: CapacityInputs, max_running_requests: int, online: bool) -> int:
    """Rows of one c128 layer's state pool: pool_configurator.py:1516-1525 (0.5.20: :1199-1206), as
    CompressStatePool allocates them (deepseek_v4_compress_state.py:159-179)."""
    slots = max_running_requests + 1  # :1504-1507 (non-PD): one spare slot
    ring = ring_size(inp, 128, online)
    if online:
        rows = slots + ring + 1  # :1519, ring == 1
        return rows * (1 + inp.draft_tokens)  # :1520, MTP banks 0..N
    rows = slots * ring + ring + 1  # :1523-1524
    return -(-rows // 128) * 128  # :1525 (ceil_div)


def c128_state_fixed_bytes(inp: CapacityInputs, max_running_requests: int, online: bool) -> int:
    """pool_configurator.py:1509-1528: rows x (3H online :1521, 2H offline :1526) x dtype x c128 layers."""
    last_dim = (3 if online else 2) * ATTN_HEAD_DIM
    rows = c128_state_rows(inp, max_running_requests, online)
    return rows * last_dim * _STATE_DTYPE_BYTES[inp.state_dtype] * inp.layout.num_c128


def resolve_max_running_requests(inp: CapacityInputs, b: float) -> tuple[int, str]:
    """Per-DP-worker R: requested // attn_dp_size, at least 1 (pool_configurator.py:1141-1145; no floor
    before 0.5.23, e.g. 0.5.20 :963-967), or the estimate (:1565-1574)."""
    if inp.max_running_requests is not None:
        per_worker = inp.max_running_requests // inp.attn_dp_size
        if inp.formula == "0.5.23":
            per_worker = max(1, per_worker)
        return per_worker, "given"
    full_token = int(inp.budget_bytes / b)
    estimated = int(full_token / inp.layout.context_len * 512)
    estimated = max(min(estimated, 4096), 2048)
    return min(estimated, full_token // 2), "estimated (clamp(full/context*512, 2048, 4096), <= full/2)"


def full_tokens(budget_bytes: int, fixed_bytes: int, b: float, page_size: int, recheck: bool = True) -> int:
    """max_total_num_tokens (pool_configurator.py:1667-1677) floored to pages (:1464); ``recheck``: 0.5.23's
    reserved-page loop, 0 bytes for ratios 4/128 (:1406-1435) but kept for its float edge."""
    avail = max(budget_bytes - fixed_bytes, 0)
    tokens = int(avail / b)
    tokens = tokens // page_size * page_size
    while recheck and tokens > 0 and tokens * b > avail:
        tokens -= page_size
    return tokens


# ---- results ------------------------------------------------------------------------


@dataclass(frozen=True)
class ModeResult:
    """One configurator run with online C128 off or on."""

    online: bool
    c128_ring_size: int
    c128_state_rows_per_layer: int
    c128_fixed_bytes: int
    full_tokens: int
    swa_tokens: int
    c4_tokens: int
    c128_tokens: int
    refusal: Optional[str] = None  # why upstream would refuse to start, if it would


@dataclass(frozen=True)
class CapacityResult:
    """Online C128 off vs on for one input set."""

    inputs: CapacityInputs
    bytes_per_full_token: float
    bytes_per_swa_token: float
    max_running_requests_per_worker: int
    max_running_requests_source: str
    draft_banks: int
    off: ModeResult
    on: ModeResult
    notes: tuple[str, ...] = field(default=())

    @property
    def delta_tokens(self) -> int:
        return self.on.full_tokens - self.off.full_tokens

    @property
    def delta_fixed_bytes(self) -> int:
        return self.off.c128_fixed_bytes - self.on.c128_fixed_bytes

    def to_dict(self) -> dict:
        out, lt = asdict(self), self.inputs.layout
        out["inputs"]["layout"] |= {"num_layers": lt.num_layers, "num_c4": lt.num_c4, "num_c128": lt.num_c128,
                                    "compress_ratios": list(lt.compress_ratios)}
        return {**out, "notes": list(self.notes), "delta_tokens": self.delta_tokens,
                "delta_fixed_bytes": self.delta_fixed_bytes,
                "dspark_default_max_running_requests": DSPARK_DEFAULT_MAX_RUNNING_REQUESTS,
                "dsv4_default_max_running_requests": DSV4_DEFAULT_MAX_RUNNING_REQUESTS}


def _mode(inp: CapacityInputs, b: float, r: int, online: bool) -> ModeResult:
    # Can each ring serve the draft tokens? pool_configurator.py:1291-1307, deepseek_v4_memory_pool.py:118-123
    for ratio in (4, 128) if inp.speculative else ():
        if inp.layout.compress_ratios.count(ratio) == 0 or (ratio == 128 and online):
            continue
        ring = ring_size(inp, ratio, online)
        window = ratio * (2 if ratio == 4 else 1)
        pad = ring - window + 2 if ring > window else 0
        if inp.draft_tokens > pad:
            raise ValueError(f"{inp.draft_tokens} draft tokens exceed what the c{ratio} ring of {ring} rows serves "
                             f"({pad}); upstream refuses to start")
    fixed = c128_state_fixed_bytes(inp, r, online)
    # Other fixed terms (c2 state, unified SWA ring, unified c4 state, encoder-replay
    # windows, cap-mode SWA; :1648-1666) are 0 for the modelled pool.
    full = full_tokens(inp.budget_bytes, fixed, b, inp.page_size, recheck=inp.formula == "0.5.23")
    swa = int(full * inp.swa_full_tokens_ratio) // inp.page_size * inp.page_size  # :1457-1461
    rows = c128_state_rows(inp, r, online) if inp.layout.num_c128 else 0
    refusal = None  # where upstream raises: validate_swa_pool_size (:198-216), Not enough memory (:94-100)
    if WINDOW_SIZE + inp.page_size >= swa:
        refusal = (f"SWA pool of {swa} tokens cannot hold one request (needs more than window {WINDOW_SIZE} + page "
                   f"{inp.page_size}); upstream refuses to start")
    elif full <= 0:
        refusal = "no full tokens left; upstream refuses to start (Not enough memory)"
    return ModeResult(online, ring_size(inp, 128, online), rows, fixed, full, swa, full // 4, full // 128,  # :1492-1493
                      refusal)


def compute(inp: CapacityInputs) -> CapacityResult:
    """Full tokens with online C128 off and on for ``inp``."""
    b = bytes_per_full_token(inp)
    r, source = resolve_max_running_requests(inp, b)
    notes = []
    if inp.speculative:
        notes.append("online + speculation sizes 1+W state banks per c128 layer, as upstream's EAGLE MTP path does "
                     "(SGLANG_EXPERIMENTAL_ONLINE_C128_MTP); upstream refuses DSPARK + online at startup "
                     "(pool_configurator.py:1259-1285) until the PR lands")
    if inp.max_running_requests is None:
        notes.append("R came from the configurator's estimate path, which upstream takes only when nothing filled "
                     "--max-running-requests; for a DSV4 target the DSV4 hook fills "
                     f"{DSV4_DEFAULT_MAX_RUNNING_REQUESTS}")
    swa = float("nan") if inp.formula == "0.5.20" else bytes_per_swa_token(inp)
    return CapacityResult(inp, b, swa, r, source, inp.draft_tokens, _mode(inp, b, r, online=False),
                          _mode(inp, b, r, online=True), tuple(notes))


def budget_interval(inp: CapacityInputs, target_full_tokens: int, online: bool) -> tuple[int, int]:
    """Integer budgets [lo, hi) giving ``target_full_tokens`` in the chosen mode (R given: fixed bytes fixed)."""
    if inp.max_running_requests is None:
        raise ValueError("solving for the budget needs an explicit max_running_requests")
    if target_full_tokens % inp.page_size:
        raise ValueError("a full-token count is always a whole number of pages")
    b = bytes_per_full_token(inp)
    r, _ = resolve_max_running_requests(inp, b)
    fixed = c128_state_fixed_bytes(inp, r, online)

    def tokens(a: int) -> int:
        return full_tokens(a, fixed, b, inp.page_size, recheck=inp.formula == "0.5.23")

    # The exact integer edges by bisection (tokens are monotone in the budget), up to a page above the estimate.
    budgets = range(math.ceil(fixed + (target_full_tokens + 2 * inp.page_size) * b) + 2)
    lo = bisect.bisect_left(budgets, target_full_tokens, key=tokens)
    hi = bisect.bisect_right(budgets, target_full_tokens, key=tokens)
    return (lo, hi) if tokens(lo) == target_full_tokens else (lo, lo)


def gib(n: float) -> float:
    return n / (1 << 30)
