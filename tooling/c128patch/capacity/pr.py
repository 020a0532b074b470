"""PR #32035's capacity claim (2,553,344 -> 3,167,232 full tokens), reconstructed.

The author ran DeepSeek-V4-Pro-DSpark, TP8, ``--swa-full-tokens-ratio 0.1 --mem-fraction-static 0.85
--speculative-algorithm DSPARK`` with no ``--max-running-requests`` on a July 2026 upstream. Both numbers
follow from the 0.5.20 formula family (the page-padded one arrived in 0.5.21), R = 256 (the DSV4 hook's
default, never overridden by DSPARK's 48), W = 6 (gamma 5 from ``dspark_block_size``, as public DSV4 DSpark
configs carry; the Pro-DSpark one is unverified), 31 c128 + 30 c4 layers, fp32 state, page 256. The budget
is unknown: :func:`fit` solves it from one number and predicts the other; :func:`alternatives` miss.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Optional

from c128patch.capacity.model import (
    DSPARK_DEFAULT_DRAFT_TOKENS,
    DSPARK_DEFAULT_MAX_RUNNING_REQUESTS,
    DSV4_DEFAULT_MAX_RUNNING_REQUESTS,
    PRO,
    CapacityInputs,
    budget_interval,
    bytes_per_full_token,
    c128_state_fixed_bytes,
    compute,
    resolve_max_running_requests,
)

PR_NUMBER = 32035
PR_FULL_TOKENS_OFF = 2_553_344
PR_FULL_TOKENS_ON = 3_167_232
PR_DRAFT_TOKENS = 6  # gamma 5 + 1


@dataclass(frozen=True)
class Hypothesis:
    label: str
    inputs: CapacityInputs  # budget_bytes is a placeholder; fit() solves for it
    why: str


def pr_inputs(budget_bytes: int = 1) -> CapacityInputs:
    """The PR run as reconstructed (budget aside)."""
    return CapacityInputs(budget_bytes, PRO, swa_full_tokens_ratio=0.1,
                          max_running_requests=DSV4_DEFAULT_MAX_RUNNING_REQUESTS, tp_size=8, speculative=True,
                          num_draft_tokens=PR_DRAFT_TOKENS, state_dtype="fp32", page_size=256, formula="0.5.20")


PR_HYPOTHESIS = Hypothesis("0.5.20 formula, R=256, W=6", pr_inputs(),
                           "what upstream resolves for the PR's command line: the July base's formula (0.5.20 "
                           "family), the DSV4 hook's R=256, W = dspark_block_size 5 + 1")


@dataclass(frozen=True)
class Fit:
    hypothesis: Hypothesis
    bytes_per_full_token: float
    max_running_requests: int
    c128_fixed_off: int
    c128_fixed_on: int
    unfloored_delta: float  # (F_off - F_on) / b, before page flooring
    off_interval: tuple[int, int]  # budgets giving PR_FULL_TOKENS_OFF
    on_interval: tuple[int, int]  # budgets giving PR_FULL_TOKENS_ON
    both_interval: Optional[tuple[int, int]]  # budgets giving both
    predicted_on_from_off: tuple[int, int]  # on-tokens at the two ends of off_interval
    predicted_off_from_on: tuple[int, int]
    off_share_predicting_on: float  # share of off_interval whose prediction is exact

    @property
    def exact(self) -> bool:
        return self.both_interval is not None

    def example_budget(self) -> Optional[int]:
        """The middle of the budgets giving both numbers."""
        return None if self.both_interval is None else sum(self.both_interval) // 2

    def to_dict(self) -> dict:
        h = self.hypothesis
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "hypothesis"}
        out = {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}
        out["unfloored_delta_tokens"] = out.pop("unfloored_delta")
        return {**out, "label": h.label, "why": h.why, "formula": h.inputs.formula,
                "draft_tokens": h.inputs.num_draft_tokens, "num_c128": h.inputs.layout.num_c128,
                "example_budget_bytes": self.example_budget(), "exact": self.exact}


def _tokens(inp: CapacityInputs, budget: int, online: bool) -> int:
    res = compute(replace(inp, budget_bytes=budget))
    return res.on.full_tokens if online else res.off.full_tokens


def fit(h: Hypothesis, off: int = PR_FULL_TOKENS_OFF, on: int = PR_FULL_TOKENS_ON) -> Fit:
    """Solve the budget from each number and predict the other one."""
    inp = h.inputs
    b = bytes_per_full_token(inp)
    r, _ = resolve_max_running_requests(inp, b)
    f_off = c128_state_fixed_bytes(inp, r, online=False)
    f_on = c128_state_fixed_bytes(inp, r, online=True)
    off_iv = budget_interval(inp, off, online=False)
    on_iv = budget_interval(inp, on, online=True)
    lo, hi = max(off_iv[0], on_iv[0]), min(off_iv[1], on_iv[1])
    both = (lo, hi) if lo < hi else None
    pred_on = (_tokens(inp, off_iv[0], True), _tokens(inp, off_iv[1] - 1, True))
    pred_off = (_tokens(inp, on_iv[0], False), _tokens(inp, on_iv[1] - 1, False))
    share = (hi - lo) / (off_iv[1] - off_iv[0]) if both else 0.0
    return Fit(h, b, r, f_off, f_on, (f_off - f_on) / b, off_iv, on_iv, both, pred_on, pred_off, share)


def alternatives() -> list[Hypothesis]:
    """Neighbouring hypotheses, each changing what the study or the brief assumed."""
    base = pr_inputs()
    alt = [
        ("0.5.23 formula, R=48 (DSPARK default), W=8", "the study's reading (§5.3-5.4)",
         replace(base, formula="0.5.23", max_running_requests=DSPARK_DEFAULT_MAX_RUNNING_REQUESTS,
                 num_draft_tokens=DSPARK_DEFAULT_DRAFT_TOKENS)),
        ("0.5.23 formula, R=256, W=8", "current formula, DSV4 default R, DSPARK default gamma",
         replace(base, formula="0.5.23", num_draft_tokens=DSPARK_DEFAULT_DRAFT_TOKENS)),
        ("0.5.23 formula, R=256, W=6", "current formula with the reconstructed R and W",
         replace(base, formula="0.5.23")),
        ("0.5.20 formula, R=256, W=8", "July formula, DSPARK default gamma 7",
         replace(base, num_draft_tokens=DSPARK_DEFAULT_DRAFT_TOKENS)),
        ("0.5.20 formula, R=48, W=6", "July formula with DSPARK's 48",
         replace(base, max_running_requests=DSPARK_DEFAULT_MAX_RUNNING_REQUESTS)),
        ("0.5.20 formula, R=2048, W=6", "estimate path: clamp(full/context*512, 2048, 4096) "
         "is 2048 at ~2.5M tokens and a 1M context", replace(base, max_running_requests=2048)),
        ("0.5.23 formula, R=222, W=8", "the study's R≈220 fit: exact, but no code path yields 222",
         replace(base, formula="0.5.23", max_running_requests=222,
                 num_draft_tokens=DSPARK_DEFAULT_DRAFT_TOKENS)),
    ]
    return [Hypothesis(label, inp, why) for label, why, inp in alt]


def explain() -> dict:
    """The reconstruction and the alternatives, as plain data."""
    reported = {"off": PR_FULL_TOKENS_OFF, "on": PR_FULL_TOKENS_ON, "delta": PR_FULL_TOKENS_ON - PR_FULL_TOKENS_OFF}
    return {"pr": PR_NUMBER, "reported": reported, "explanation": fit(PR_HYPOTHESIS).to_dict(),
            "alternatives": [fit(h).to_dict() for h in alternatives()]}
