"""Reading what an sglang server and sglang's benchmark tools print: upstream's own log formats (0.5.20-0.5.23:
scheduler.py's ``max_total_num_tokens=``, pool_configurator.py's ``DSV4 memory calculation``,
metrics_reporter.py's ``Decode batch`` lines, http_server.py's ready line, the ``hit an exception`` and
sigquit lines, sgl_kernel/utils.h's ``Failed at file:line``); tests/test_smoke_server.py renders them
from the release sources and parses them back."""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

READY = "The server is fired up and ready to roll!"
_MAX_TOTAL = re.compile(r"\bmax_total_num_tokens=(\d+)")
_DSV4 = re.compile(r"DSV4 memory calculation: (.*)$")
_KEY_VALUE = re.compile(r"(\w+)=([^,]+)")
_DECODE_FIELDS = {
    "running_req": re.compile(r"#running-req: (\d+)"),
    "full_token_usage": re.compile(r"full token usage: ([\d.]+)"),
    "token_usage": re.compile(r"(?<!full )(?<!swa )token usage: ([\d.]+)"),
    "accept_len": re.compile(r"(?<!block )accept len: ([\d.]+)"),
    "accept_rate": re.compile(r"accept rate: ([\d.]+)"),
    "gen_throughput": re.compile(r"gen throughput \(token/s\): ([\d.]+)"),
    "queue_req": re.compile(r"#queue-req: (\d+)"),
}

# (kind, pattern, fatal). Fatal ones fail the run; tracebacks are reported and fail it too,
# but do not by themselves mean the server died.
SIGNATURES: tuple[tuple[str, re.Pattern[str], bool], ...] = (
    ("illegal_memory_access", re.compile(r"an illegal memory access was encountered"), True),
    ("cuda_error", re.compile(r"CUDA error: |\bcudaError\w+|CUDA_ERROR_\w+|CUBLAS_STATUS_(?!SUCCESS)\w+"
                              r"|device-side assert triggered"), True),
    ("nccl", re.compile(r"NCCL error|NCCL: Cuda failure"
                        r"|\bnccl(?:UnhandledCudaError|SystemError|InternalError|InvalidUsage|RemoteError)\b"
                        r"|NCCL WARN .*(?:Cuda failure|failed)"), True),
    ("out_of_memory", re.compile(r"CUDA out of memory|torch\.OutOfMemoryError|OutOfMemoryError"), True),
    ("runtime_check", re.compile(r"Failed at \S+\.(?:cuh|cu|h|hpp|cpp|cc):\d+"), True),
    ("sglang_fatal", re.compile(r"(?:Scheduler|TokenizerManager|DetokenizerManager|DataParallelController"
                                r"|MultiTokenizerRouter|MultiDetokenizerRouter) hit an exception"
                                r"|Received sigquit from a child process|SIGQUIT received"), True),
    ("traceback", re.compile(r"^\s*Traceback \(most recent call last\):"), False),
)
MAX_KEPT = 20


def _num(text: str) -> int | float | str:
    text = text.strip()
    for cast in (int, float):
        with contextlib.suppress(ValueError):
            return cast(text)
    return text


@dataclass
class ServerLog:
    """Incremental reader of a server log: feed it lines as they arrive."""

    lines: int = 0
    ready: bool = False
    max_total_num_tokens: list[int] = field(default_factory=list)
    dsv4: list[dict[str, Any]] = field(default_factory=list)
    decode: list[dict[str, float]] = field(default_factory=list)
    signatures: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def feed(self, line: str) -> None:
        self.lines += 1
        self.ready = self.ready or READY in line
        m = _MAX_TOTAL.search(line)
        if m and "chunked_prefill_size=" in line:
            self.max_total_num_tokens.append(int(m.group(1)))
        m = _DSV4.search(line)
        if m:
            self.dsv4.append({k: _num(v) for k, v in _KEY_VALUE.findall(m.group(1))})
        if "Decode batch" in line:
            found = {key: pattern.search(line) for key, pattern in _DECODE_FIELDS.items()}
            self.decode.append({key: float(m.group(1)) for key, m in found.items() if m})
        for kind, pattern, _fatal in SIGNATURES:
            if pattern.search(line):
                self.counts[kind] = self.counts.get(kind, 0) + 1
                kept = self.signatures.setdefault(kind, [])
                if len(kept) < MAX_KEPT:
                    kept.append({"line": self.lines, "text": line.strip()[:400]})

    def feed_lines(self, lines: list[str]) -> None:
        for line in lines:
            self.feed(line)

    @property
    def fatal(self) -> list[str]:
        return [kind for kind, _p, fatal in SIGNATURES if fatal and self.counts.get(kind)]

    def capacity(self) -> dict[str, Any]:
        """Token capacity as logged: the DSV4 full-token pool (what PR #32035 compares), else max_total_num_tokens."""
        total = self.max_total_num_tokens[0] if self.max_total_num_tokens else None
        full = self.dsv4[0].get("full_token") if self.dsv4 else None
        source = "DSV4 memory calculation full_token" if full is not None else (
            "max_total_num_tokens" if total is not None else None)
        return {"max_total_num_tokens": total, "dsv4_full_token": full, **({"dsv4": self.dsv4[0]} if self.dsv4 else {}),
                "tokens": full if full is not None else total, "source": source}

    def decode_stats(self) -> dict[str, Any]:
        """Means over the decode log lines that had running requests; max token usage."""
        import statistics  # (here: ~10 ms CPU of imports every verb that reads results, apply's note, paid for none)

        busy = [r for r in self.decode if r.get("running_req", 0) > 0]

        def mean(key: str) -> float | None:
            vals = [r[key] for r in busy if key in r]
            return round(statistics.fmean(vals), 3) if vals else None

        usage = [r.get("full_token_usage", r.get("token_usage")) for r in self.decode]
        usage = [u for u in usage if u is not None]
        return {"decode_lines": len(self.decode), "busy_lines": len(busy),
                "gen_throughput_mean": mean("gen_throughput"),
                "gen_throughput_max": max((r["gen_throughput"] for r in busy if "gen_throughput" in r), default=None),
                "accept_len_mean": mean("accept_len"), "accept_rate_mean": mean("accept_rate"),
                "running_req_max": max((r["running_req"] for r in busy), default=None),
                "token_usage_max": max(usage, default=None)}

    def summary(self) -> dict[str, Any]:
        return {"lines": self.lines, "ready": self.ready, "capacity": self.capacity(),
                "decode": self.decode_stats(), "signature_counts": dict(self.counts),
                "signatures": self.signatures, "fatal": self.fatal}


class Tail:
    """Reads what was appended to a file since the last call, whole lines only."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""

    def read_lines(self) -> list[str]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        return [ln.decode(errors="replace") for ln in lines]

    def flush(self) -> list[str]:
        rest = self.read_lines()
        if self.partial:
            rest.append(self.partial.decode(errors="replace"))
            self.partial = b""
        return rest


_SERVING_HEADER = " Serving Benchmark Result "
_SERVING_ROW = re.compile(r"^(?P<key>\S.*?:)\s+(?P<value>\S.*?)\s*$")


def parse_bench_serving(stdout: str) -> dict[str, Any]:
    """The ``label value`` rows of ``python -m sglang.bench_serving``'s ``Serving Benchmark Result`` block."""
    out: dict[str, Any] = {}
    inside = False
    for line in stdout.splitlines():
        if _SERVING_HEADER in line and line.strip().startswith("="):
            inside, out = True, {}
        elif inside and line.strip() and set(line.strip()) == {"="}:
            inside = False
        elif inside and (m := _SERVING_ROW.match(line)):  # a percentage as its number
            out[m.group("key").rstrip(":").strip()] = _num(m.group("value").rstrip("%"))
    return out


_MULTITURN = {
    "total_requests": re.compile(r"^\s*Total requests: (\d+) at "),
    "output_token_throughput": re.compile(r"^\s*Output token throughput: ([\d.]+) tokens per second"),
    "throughput": re.compile(r"^\s*(?:Request )?Throughput: ([\d.]+) requests per second", re.IGNORECASE),
}


def read_jsonl(path: Path) -> list[Any]:
    """Each JSON line of a file that may not exist, a line cut by a kill left out."""
    rows = []
    for line in path.read_text(errors="replace").splitlines() if path.is_file() else []:
        with contextlib.suppress(ValueError, RecursionError):  # (a number past Python's digit limit, a deep line)
            rows.append(json.loads(line))
    return rows


def load_summary(tool: str, stdout: str, result_file: Path) -> dict[str, Any]:
    """Requests, throughput, acceptance of load tool ``tool`` from its result file, else its printed summary."""
    rows = read_jsonl(result_file)  # bench_serving --output-file, bench_multiturn --log-file: the last object
    record = rows[-1] if rows and isinstance(rows[-1], dict) else None
    if tool == "serving":
        printed = parse_bench_serving(stdout)
        rec = record or {}
        return {"completed": rec.get("completed", printed.get("Successful requests")),
                "duration_s": rec.get("duration", printed.get("Benchmark duration (s)")),
                "output_throughput": rec.get("output_throughput", printed.get("Output token throughput (tok/s)")),
                "request_throughput": rec.get("request_throughput", printed.get("Request throughput (req/s)")),
                "accept_length": rec.get("accept_length", printed.get("Accept length")),
                "source": "result file" if record else ("printed summary" if printed else None)}
    summary = (record or {}).get("summary")
    if not summary:  # bench_multiturn.py's printed "Performance metrics summary:" block; the last one wins
        summary = {}
        for line in stdout.splitlines():
            for key, pattern in _MULTITURN.items():
                if m := pattern.match(line):
                    summary[key] = _num(m.group(1))
    return {"completed": summary.get("total_requests"), "duration_s": None,
            "output_throughput": summary.get("output_token_throughput"),
            "request_throughput": summary.get("throughput"), "accept_length": None,
            "source": ("log file" if record and record.get("summary") else "printed summary") if summary else None}
