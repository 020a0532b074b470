"""The server tier's choices, kept apart from its machinery so that `smoke --help` lists them cheaply."""

from __future__ import annotations

# Server flags from docs/pr-32035.md (model, TP, host and port are added separately).
PRESETS: dict[str, list[str]] = {
    # The author's soak test (no crash in ~70 min on B200).
    "soak": ["--trust-remote-code", "--tool-call-parser", "deepseekv4", "--reasoning-parser", "deepseek-v4",
             "--enable-cache-report", "--speculative-algorithm", "DSPARK", "--disable-flashinfer-autotune",
             "--mem-fraction-static", "0.55", "--enable-metrics"],
    # The author's precision-test server (the PR's capacity numbers).
    "precision": ["--trust-remote-code", "--chunked-prefill-size", "8192", "--swa-full-tokens-ratio", "0.1",
                  "--mem-fraction-static", "0.85", "--tool-call-parser", "deepseekv4", "--reasoning-parser",
                  "deepseek-v4", "--enable-cache-report", "--speculative-algorithm", "DSPARK",
                  "--disable-flashinfer-autotune", "--enable-metrics"],
}
LOAD_TOOLS = ("serving", "multiturn")
# compute-sanitizer tools the kernel tier runs (smoke.passes parses each one's summary)
SANITIZER_TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
