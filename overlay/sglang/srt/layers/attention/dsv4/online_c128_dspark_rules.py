"""What online C128 compression under DSPARK verify refuses at startup (c128patch).

Torch-free and stdlib-only, so that three callers share one set of rules:

* the patched startup (`DSV4PoolConfigurator`, through `check_online_c128_dspark_startup`
  in `online_c128_dspark.py`) and `OnlineC128DsparkController`, with a config derived from
  the live, resolved ServerArgs (`config_from_context`) and the environment;
* `c128patch doctor`, which loads this file by path from an installed sglang (no sglang
  import) and derives the config from launch arguments (`config_from_args`).

`startup_refusals(config)` returns one line per reason the configuration cannot run, in
the order of `RULES`; `[]` when it can, or when the gate
(SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK) is off: then nothing of this path runs and upstream's
own checks apply unchanged.

The line drawn: the controller runs one verify -> accept -> commit flow, on one CUDA target
runner, whose state pools it owns (`_layer_states`), whose verify metadata preps it sees
(`prepare_verify`) and whose accept it follows (`commit_after_verify`). A configuration that
splits, wraps, moves or skips any of these has not been shown to keep bank 0 right and is
refused; so are the settings this path cannot take at all.

Config keys (every key optional: a missing key takes the value an upstream launch without
that flag/env has; an unknown key or a wrong type is a ValueError):

| key | type | from | refused when |
| --- | --- | --- | --- |
| dspark_gate | bool | env SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK | (False: no rule applies) |
| online_compress | bool | env SGLANG_OPT_USE_ONLINE_COMPRESS | False: no online c128 state pools |
| online_c128_mtp | bool | env SGLANG_EXPERIMENTAL_ONLINE_C128_MTP | True |
| speculative_algorithm | str or None | --speculative-algorithm | not DSPARK |
| num_draft_tokens | int or None | --speculative-num-draft-tokens (or --speculative-dspark-block-size + 1); None: resolved later | outside 1..MAX_VERIFY_WIDTH |
| ragged_verify_mode | str | env SGLANG_RAGGED_VERIFY_MODE | not static / compact |
| enable_two_batch_overlap | bool | --enable-two-batch-overlap | True |
| enable_pdmux | bool | --enable-pdmux | True |
| device | str or None | --device; None: auto | not cuda |
| platform | str or None | the torch build (cuda, rocm, ...); None: not known here | not cuda |
| attn_dp_size | int | --attn-dp-size, or --dp-size with --enable-dp-attention | > 1 |
| attn_cp_size | int | --attn-cp-size | > 1 |
| dcp_size | int | --dcp-size | > 1 |
| pp_size | int | --pp-size | > 1 |
| disaggregation_mode | str | --disaggregation-mode | not "null" |
| prefill_attention_backend | str or None | --prefill-attention-backend, else --attention-backend; None: auto | differs from decode_attention_backend |
| decode_attention_backend | str or None | --decode-attention-backend, else --attention-backend; None: auto | differs from prefill_attention_backend |
"""

from __future__ import annotations

import argparse
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence

GATE_ENV = "SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK"
ONLINE_ENV = "SGLANG_OPT_USE_ONLINE_COMPRESS"
MTP_ENV = "SGLANG_EXPERIMENTAL_ONLINE_C128_MTP"
RAGGED_ENV = "SGLANG_RAGGED_VERIFY_MODE"

# Largest bank count the online c128 DSPARK kernels hold (`kMaxBanks` in
# csrc/deepseek_v4/online_c128_dspark.cuh); a test keeps the two equal.
MAX_BANKS = 1024
# DeepSeek-V4's c4 compress state ring under speculative decoding (ring_size 16, window 8)
# keeps at most 16 - 8 + 2 draft tokens resident (upstream's get_compress_state_write_pad;
# its pool check refuses more): the verify width a DSV4 launch can run is the lower cap.
C4_RING_DRAFT_CAP = 10
MAX_VERIFY_WIDTH = min(MAX_BANKS, C4_RING_DRAFT_CAP)

# key -> (accepted types, value of an upstream launch without the flag / env)
KEYS: Dict[str, tuple] = {
    "dspark_gate": ((bool,), False),
    "online_compress": ((bool,), False),
    "online_c128_mtp": ((bool,), False),
    "speculative_algorithm": ((str, type(None)), None),
    "num_draft_tokens": ((int, type(None)), None),
    "ragged_verify_mode": ((str,), "static"),
    "enable_two_batch_overlap": ((bool,), False),
    "enable_pdmux": ((bool,), False),
    "device": ((str, type(None)), None),
    "platform": ((str, type(None)), None),
    "attn_dp_size": ((int,), 1),
    "attn_cp_size": ((int,), 1),
    "dcp_size": ((int,), 1),
    "pp_size": ((int,), 1),
    "disaggregation_mode": ((str,), "null"),
    "prefill_attention_backend": ((str, type(None)), None),
    "decode_attention_backend": ((str, type(None)), None),
}

_SHOWN_RAGGED_MODES = ("static", "compact")


class Rule(NamedTuple):
    """One reason to refuse: `check(config)` gives the line, or None."""

    name: str
    check: Callable[[Mapping[str, Any]], Optional[str]]


def _when(name: str, refused: Callable[[Mapping[str, Any]], bool], line: str) -> Rule:
    return Rule(name, lambda c: line.format(**c) if refused(c) else None)


def _banks(c: Mapping[str, Any]) -> Optional[str]:
    n = c["num_draft_tokens"]
    if n is None or 0 < n <= MAX_VERIFY_WIDTH:
        return None
    return (
        f"the DSPARK verify width is {n} (speculative_num_draft_tokens = gamma + 1) but it "
        f"must be 1..{MAX_VERIFY_WIDTH}: DeepSeek-V4's c4 compress state ring keeps at most "
        f"{C4_RING_DRAFT_CAP} draft tokens resident (the online c128 DSPARK kernels alone "
        f"hold up to {MAX_BANKS} state banks, one per verify token); change "
        "--speculative-dspark-block-size"
    )


def _algorithm(c: Mapping[str, Any]) -> Optional[str]:
    algorithm = c["speculative_algorithm"]
    if algorithm is not None and algorithm.upper() == "DSPARK":
        return None
    got = "not set" if algorithm is None else algorithm
    return (
        f"--speculative-algorithm is {got}: {GATE_ENV}=1 runs online c128 through DSPARK "
        f"target verify only; use --speculative-algorithm DSPARK, or unset {GATE_ENV}"
    )


# One line per reason, in the order they are reported. Extend here.
RULES: tuple = (
    _when(
        "online-compress",
        lambda c: not c["online_compress"],
        f"{ONLINE_ENV} is not set: {GATE_ENV}=1 banks the online c128 state pools, which "
        f"exist only with {ONLINE_ENV}=1; set it, or unset {GATE_ENV}",
    ),
    Rule("speculative-algorithm", _algorithm),
    _when(
        "online-c128-mtp",
        lambda c: c["online_c128_mtp"],
        f"{MTP_ENV}=1 is the EAGLE/MTP online-c128 path and would write the same c128 state "
        f"banks; with DSPARK set {GATE_ENV}=1 alone",
    ),
    Rule("state-banks", _banks),
    _when(
        "ragged-verify-mode",
        lambda c: c["ragged_verify_mode"] not in _SHOWN_RAGGED_MODES,
        f"{RAGGED_ENV}={{ragged_verify_mode}}: the controller is shown on static and compact "
        f"verify only; set {RAGGED_ENV}=static or compact",
    ),
    _when(
        "two-batch-overlap",
        lambda c: c["enable_two_batch_overlap"],
        "--enable-two-batch-overlap: the target's attention backend becomes a TboAttnBackend "
        "whose micro-batch backends each keep their own verify state, and the commit after "
        "accept cannot reach them (bank 0 would never be committed); drop the flag",
    ),
    _when(
        "pdmux",
        lambda c: c["enable_pdmux"],
        "--enable-pdmux: PD-multiplexing runs prefill and decode on separate green-context "
        "streams and backends; the controller's verify/commit ordering is not shown there; "
        "drop the flag",
    ),
    _when(
        "device",
        lambda c: c["device"] is not None and not c["device"].startswith("cuda"),
        "--device {device}: the online c128 DSPARK kernels are CUDA-only",
    ),
    _when(
        "platform",
        lambda c: c["platform"] is not None and c["platform"] != "cuda",
        "this is a {platform} build: the online c128 DSPARK kernels are CUDA-only "
        "(upstream's online c128 path is too)",
    ),
    _when(
        "dp-attention",
        lambda c: c["attn_dp_size"] > 1,
        "DP attention (attention DP size {attn_dp_size}): idle DP ranks run dummy target "
        "verifies and DP coordination reshapes the verify batch; not shown with the "
        "controller; run without DP attention",
    ),
    _when(
        "context-parallel",
        lambda c: c["attn_cp_size"] > 1,
        "--attn-cp-size {attn_cp_size}: context parallelism splits the verify rows across "
        "ranks; not shown with the controller",
    ),
    _when(
        "decode-context-parallel",
        lambda c: c["dcp_size"] > 1,
        "--dcp-size {dcp_size}: decode context parallelism shards the KV cache across ranks; "
        "not shown with the controller",
    ),
    _when(
        "pipeline-parallel",
        lambda c: c["pp_size"] > 1,
        "--pp-size {pp_size}: each stage would hold part of the c128 layers and the commit "
        "after accept runs on the last stage only; not shown with the controller",
    ),
    _when(
        "disaggregation",
        lambda c: c["disaggregation_mode"] != "null",
        "--disaggregation-mode {disaggregation_mode}: moving the online c128 state banks "
        "between prefill and decode servers is not shown with the controller",
    ),
    _when(
        "hybrid-attention-backend",
        lambda c: c["prefill_attention_backend"] != c["decode_attention_backend"],
        "prefill attention backend {prefill_attention_backend} and decode attention backend "
        "{decode_attention_backend} differ: the target's backend becomes a HybridAttnBackend "
        "whose two backends would each keep their own verify state, and the commit after "
        "accept finds no controller on the wrapper; use one --attention-backend",
    ),
)


def normalized(config: Mapping[str, object]) -> Dict[str, Any]:
    """`config` with every key of KEYS (defaults filled in); ValueError on an unknown key
    or a value of the wrong type."""
    unknown = sorted(set(config) - set(KEYS))
    if unknown:
        raise ValueError(f"unknown online c128 DSPARK config keys: {', '.join(unknown)}")
    out: Dict[str, Any] = {}
    for key, (types, default) in KEYS.items():
        value = config.get(key, default)
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            expected = " or ".join("None" if t is type(None) else t.__name__ for t in types)
            raise ValueError(f"online c128 DSPARK config {key}={value!r}: expected {expected}")
        out[key] = value
    return out


def startup_refusals(config: Mapping[str, object]) -> List[str]:
    """One line per reason `config` (keys: the module docstring) cannot run online c128
    under DSPARK; [] when it can or when the gate is off."""
    c = normalized(config)
    if not c["dspark_gate"]:
        return []
    return [line for line in (rule.check(c) for rule in RULES) if line is not None]


# -- deriving the config -----------------------------------------------------------


def env_bool(environ: Mapping[str, str], name: str) -> bool:
    """An sglang EnvBool (default False) read from `environ`, as `environ.EnvBool` parses it."""
    value = environ.get(name)
    if value is None:
        return False
    value = value.lower()
    if value in ("true", "1", "yes", "y"):
        return True
    if value in ("false", "0", "no", "n"):
        return False
    raise ValueError(f'{name}="{value}" is not a valid boolean value')


def env_config(environ: Mapping[str, str]) -> Dict[str, Any]:
    """The config keys that come from the environment."""
    return {
        "dspark_gate": env_bool(environ, GATE_ENV),
        "online_compress": env_bool(environ, ONLINE_ENV),
        "online_c128_mtp": env_bool(environ, MTP_ENV),
        "ragged_verify_mode": environ.get(RAGGED_ENV, KEYS["ragged_verify_mode"][1]),
    }


def _algorithm_name(value: object) -> Optional[str]:
    """None, a string, or upstream's SpeculativeAlgorithm enum -> its upper-case name."""
    if value is None:
        return None
    name = str(getattr(value, "name", value)).upper()
    return None if name == "NONE" else name


def config_from_context(
    *,
    exec_: Any,
    disagg: Any,
    device: Any,
    parallel: Any,
    spec_algorithm: object,
    num_draft_tokens: Optional[int],
    environ: Mapping[str, str],
    platform: Optional[str],
) -> Dict[str, Any]:
    """The config of a live sglang process: its resolved config namespaces
    (`sglang.srt.runtime_context`: `get_exec()`, `get_disagg()`, `get_device()`,
    `get_parallel()`), the speculative algorithm and verify width the caller resolved,
    the environment and the torch build."""
    return {
        **env_config(environ),
        "speculative_algorithm": _algorithm_name(spec_algorithm),
        "num_draft_tokens": None if num_draft_tokens is None else int(num_draft_tokens),
        "enable_two_batch_overlap": bool(exec_.overlap.enable_two_batch_overlap),
        "enable_pdmux": bool(disagg.enable_pdmux),
        "device": None if device.device is None else str(device.device),
        "platform": platform,
        "attn_dp_size": int(parallel.attn_dp_size),
        "attn_cp_size": int(parallel.attn_cp_size),
        "dcp_size": int(parallel.dcp_size),
        "pp_size": int(parallel.pp_size),
        "disaggregation_mode": str(disagg.disaggregation_mode),
        **_backend_pair(
            exec_.kernel.attention_backend,
            exec_.kernel.prefill_attention_backend,
            exec_.kernel.decode_attention_backend,
        ),
    }


def _backend_pair(base: Optional[str], prefill: Optional[str], decode: Optional[str]) -> Dict[str, Any]:
    """The (prefill, decode) attention backends, split flags falling back to the base one
    (upstream's `attention_backends_of`)."""
    return {
        "prefill_attention_backend": prefill or base,
        "decode_attention_backend": decode or base,
    }


# (flags, dest, kind) of every launch flag `config_from_args` reads, aliases included;
# kind "flag" is store_true, else the value's type.
LAUNCH_FLAGS: tuple = (
    (("--speculative-algorithm",), "speculative_algorithm", str),
    (("--speculative-num-draft-tokens",), "speculative_num_draft_tokens", int),
    (("--speculative-dspark-block-size",), "speculative_dspark_block_size", int),
    (("--enable-two-batch-overlap",), "enable_two_batch_overlap", "flag"),
    (("--enable-pdmux",), "enable_pdmux", "flag"),
    (("--device",), "device", str),
    (("--dp-size", "--data-parallel-size"), "dp_size", int),
    (("--enable-dp-attention",), "enable_dp_attention", "flag"),
    (("--attn-dp-size", "--attention-data-parallel-size"), "attn_dp_size", int),
    (("--attn-cp-size", "--attention-context-parallel-size"), "attn_cp_size", int),
    (("--dcp-size", "--decode-context-parallel-size"), "dcp_size", int),
    (("--pp-size", "--pipeline-parallel-size"), "pp_size", int),
    (("--disaggregation-mode",), "disaggregation_mode", str),
    (("--attention-backend",), "attention_backend", str),
    (("--prefill-attention-backend",), "prefill_attention_backend", str),
    (("--decode-attention-backend",), "decode_attention_backend", str),
    (("--config",), "config", str),
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would exit the caller's process
        raise ValueError(f"cannot read the launch arguments: {message}")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(add_help=False, allow_abbrev=False)
    for flags, dest, kind in LAUNCH_FLAGS:
        if kind == "flag":
            parser.add_argument(*flags, dest=dest, action="store_true")
        else:
            parser.add_argument(*flags, dest=dest, type=kind, default=None)
    return parser


def config_from_args(argv: Sequence[str], environ: Mapping[str, str]) -> Dict[str, Any]:
    """The config of `python -m sglang.launch_server <argv>` run with `environ`.

    Reads only the flags in LAUNCH_FLAGS (others are ignored). Raises ValueError for
    `--config FILE` (options in a file are not read here, and a refusal they would cause
    must not pass unseen) and for a flag value that does not parse.
    """
    args, _ = _parser().parse_known_args(list(argv))
    if args.config is not None:
        raise ValueError(
            f"--config {args.config}: options in a config file are not read here; "
            "pass them on the command line"
        )
    width = args.speculative_num_draft_tokens
    if width is None and args.speculative_dspark_block_size is not None:
        width = args.speculative_dspark_block_size + 1
    attn_dp = args.attn_dp_size
    if attn_dp is None:
        attn_dp = args.dp_size if args.enable_dp_attention and args.dp_size else 1
    return {
        **env_config(environ),
        "speculative_algorithm": _algorithm_name(args.speculative_algorithm),
        "num_draft_tokens": width,
        "enable_two_batch_overlap": args.enable_two_batch_overlap,
        "enable_pdmux": args.enable_pdmux,
        "device": args.device,
        "platform": None,
        "attn_dp_size": attn_dp,
        "attn_cp_size": 1 if args.attn_cp_size is None else args.attn_cp_size,
        "dcp_size": 1 if args.dcp_size is None else args.dcp_size,
        "pp_size": 1 if args.pp_size is None else args.pp_size,
        "disaggregation_mode": args.disaggregation_mode or "null",
        **_backend_pair(args.attention_backend, args.prefill_attention_backend, args.decode_attention_backend),
    }
