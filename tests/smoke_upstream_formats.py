"""Upstream's own log and summary formats, read from the release sources at test time (the cached
release history of tests/conftest.py) and rendered with chosen values, so the server-tier parsers
are tested against what sglang really prints, not against retyped copies.

Each renderer finds its format in the release by a fixed needle; if upstream changes the text or
renames an interpolated expression, rendering either fails or yields a value the parser does not
read back, and the test says so.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
from pathlib import Path
from typing import Any

LOG_PREFIX = "[2026-11-29 10:00:00 TP0] "  # sglang's configure_logger: "[%(asctime)s{prefix}] %(message)s"


@functools.lru_cache(maxsize=None)
def source(repo: Path, tag: str, path: str) -> str:
    return subprocess.run(["git", "--git-dir", str(repo), "show", f"{tag}:python/sglang/{path}"],
                          check=True, capture_output=True, text=True).stdout


@functools.lru_cache(maxsize=None)
def parsed(repo: Path, tag: str, path: str) -> ast.Module:
    return ast.parse(source(repo, tag, path))


def _ordered(nodes: list[ast.AST]) -> list[ast.AST]:
    return sorted(nodes, key=lambda n: (n.lineno, n.col_offset))


def _text(node: ast.JoinedStr) -> str:
    return "".join(v.value for v in node.values if isinstance(v, ast.Constant))


def joinedstrs(tree: ast.AST, needle: str) -> list[ast.JoinedStr]:
    return _ordered([n for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) and needle in _text(n)])


def function(tree: ast.AST, name: str) -> ast.FunctionDef:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    raise LookupError(name)


def render(node: ast.JoinedStr, values: dict[str, Any], default: Any = 0) -> str:
    """Evaluate an f-string with each ``{expr}`` looked up by its source text in ``values``."""
    out = []
    for part in node.values:
        if isinstance(part, ast.Constant):
            out.append(part.value)
            continue
        assert isinstance(part, ast.FormattedValue)
        value = values.get(ast.unparse(part.value), default)
        if part.conversion == ord("r"):
            value = repr(value)
        elif part.conversion == ord("s"):
            value = str(value)
        spec = render(part.format_spec, values, default) if part.format_spec else ""
        out.append(format(value, spec))
    return "".join(out)


# --------------------------------------------------------------------------- server log lines


def capacity_line(repo: Path, tag: str, max_total_num_tokens: int) -> str:
    """srt/managers/scheduler.py: the startup line with max_total_num_tokens=..."""
    tree = parsed(repo, tag, "srt/managers/scheduler.py")
    (node,) = [n for n in joinedstrs(tree, "max_total_num_tokens=") if "chunked_prefill_size=" in _text(n)]
    return LOG_PREFIX + render(node, {"self.max_total_num_tokens": max_total_num_tokens,
                                      "get_schedule().chunked_prefill_size": 8192,
                                      "self.max_running_requests": 256})


def dsv4_line(repo: Path, tag: str, full_token: int, bytes_per_full_token: float = 1234.5) -> str:
    """srt/model_executor/pool_configurator.py: the DSV4 memory calculation line."""
    tree = parsed(repo, tag, "srt/model_executor/pool_configurator.py")
    (node,) = joinedstrs(tree, "DSV4 memory calculation: ")
    return LOG_PREFIX + render(node, {"sizes.full_max_total_num_tokens": full_token, "self._unified": False,
                                      "self._unified_fp8": False, "self._dspark_draft_on_bf16": True,
                                      "self.bytes_per_full_token": bytes_per_full_token,
                                      "available_bytes / (1 << 30)": 61.25})


def decode_line(repo: Path, tag: str, *, running: int, accept_len: float, accept_rate: float, throughput: float,
                full_usage: float, hybrid_swa: bool = True, queue: int = 0) -> str:
    """srt/managers/scheduler_components/metrics_reporter.py's decode log line, with the token usage
    parts of pool_stats_observer.get_decode_usage_msg_parts, assembled as upstream assembles it."""
    pool = parsed(repo, tag, "srt/managers/scheduler_components/pool_stats_observer.py")
    parts_fn = function(pool, "get_decode_usage_msg_parts")
    usage_vals = {"self.full_num_used": 123456, "self.full_token_usage": full_usage, "self.swa_num_used": 4567,
                  "self.swa_token_usage": 0.05}
    if hybrid_swa:
        first_list = _ordered([n for n in ast.walk(parts_fn) if isinstance(n, ast.List) and n.elts])[0]
        parts = [render(e, usage_vals) for e in first_list.elts]
    else:
        parts = [render(joinedstrs(parts_fn, "token usage: ")[-1], usage_vals)]
    token_usage_msg = ", ".join(parts) + ", "
    reporter = parsed(repo, tag, "srt/managers/scheduler_components/metrics_reporter.py")
    head = joinedstrs(reporter, "Decode batch")[0]
    accept = [n for n in joinedstrs(reporter, "accept len: ") if _text(n).startswith("accept len: ")][0]
    tail = joinedstrs(reporter, "gen throughput (token/s): ")[-1]
    values = {"iter_msg": "", "num_running_reqs": running, "token_usage_msg": token_usage_msg,
              "spec_accept_length": accept_len, "spec_accept_rate": accept_rate,
              "self._graph_backend_label": "cuda graph", "can_run_cuda_graph": True,
              "self.last_gen_throughput": throughput, "len(self.scheduler.waiting_queue)": queue}
    return LOG_PREFIX + render(head, values) + render(accept, values) + render(tail, values)


def ready_line(repo: Path, tag: str) -> str:
    text = source(repo, tag, "srt/entrypoints/http_server.py")
    m = re.search(r'logger\.info\("(The server is fired up[^"]*)"\)', text)
    assert m, "ready line not found"
    return LOG_PREFIX + m.group(1)


def scheduler_exception_line(repo: Path, tag: str, traceback: str) -> str:
    tree = parsed(repo, tag, "srt/managers/scheduler.py")
    (node,) = joinedstrs(tree, "Scheduler hit an exception: ")
    return LOG_PREFIX + render(node, {"traceback": traceback})


def runtime_check_message(repo: Path, tag: str, file: str, line: int, detail: str) -> str:
    """kernels/jit/include/sgl_kernel/utils.h: what a failed RuntimeCheck throws."""
    text = source(repo, tag, "kernels/jit/include/sgl_kernel/utils.h")
    m = re.search(r'os << "(Failed at )" << location\.file_name\(\) << "(:)" << location\.line\(\);', text)
    assert m, "RuntimeCheck message format not found"
    return f"{m.group(1)}{file}{m.group(2)}{line}: {detail}"


# --------------------------------------------------------------------------- bench_serving


@functools.lru_cache(maxsize=None)
def _serving_tree(repo: Path, tag: str) -> ast.Module:
    return parsed(repo, tag, "benchmark/serving.py")


def bench_serving_summary(repo: Path, tag: str, values: dict[str, Any]) -> str:
    """The summary block benchmark/serving.py prints, rendered in source order from its own
    ``print("...".format(...))`` calls (every branch printed; labels not in ``values`` get 0)."""
    tree = _serving_tree(repo, tag)
    fn = [f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
          and any(isinstance(c, ast.Constant) and c.value == " Serving Benchmark Result " for c in ast.walk(f))][0]
    lines = []
    for call in _ordered([n for n in ast.walk(fn) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "print"]):
        if not call.args:
            continue
        arg = call.args[0]
        if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute) and arg.func.attr == "format" \
                and isinstance(arg.func.value, ast.Constant):
            fmt = arg.func.value.value
            if arg.keywords:
                lines.append(fmt.format(**{k.arg: ast.literal_eval(k.value) for k in arg.keywords}))
            elif arg.args and isinstance(arg.args[0], ast.Constant):
                label = arg.args[0].value
                lines.append(fmt.format(label, values.get(label, 0)))
        elif isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Mult):
            lines.append(ast.literal_eval(arg.left) * ast.literal_eval(arg.right))
    return "\n".join(lines) + "\n"


def bench_serving_result_keys(repo: Path, tag: str) -> set[str]:
    """The keys of the result dict bench_serving appends to --output-file."""
    tree = _serving_tree(repo, tag)
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
            if {"completed", "output_throughput", "accept_length"} <= keys:
                return keys
    raise LookupError("result dict")


def _flags_in(tree: ast.AST) -> set[str]:
    flags = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            flags |= {a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")}
    return flags


def bench_serving_flags(repo: Path, tag: str) -> set[str]:
    return _flags_in(_serving_tree(repo, tag))


def server_flags(repo: Path, tag: str) -> set[str]:
    """Every command-line name ServerArgs takes: one --field-name per dataclass field in
    srt/arg_groups/fields/*.py, their aliases, and server_args.py's explicit add_argument calls."""
    listing = subprocess.run(["git", "--git-dir", str(repo), "ls-tree", "--name-only", tag,
                              "python/sglang/srt/arg_groups/fields/"], check=True, capture_output=True, text=True)
    flags = _flags_in(parsed(repo, tag, "srt/server_args.py"))
    for path in listing.stdout.split():
        if not path.endswith(".py"):
            continue
        tree = parsed(repo, tag, path.removeprefix("python/sglang/"))
        for node in ast.walk(tree):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                flags.add("--" + node.target.id.replace("_", "-"))
            if isinstance(node, ast.keyword) and node.arg == "aliases" and isinstance(node.value, ast.List):
                flags |= {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
    return flags


def environ_names(repo: Path, tag: str) -> set[str]:
    return set(re.findall(r"^\s+(SGLANG_\w+) = Env", source(repo, tag, "srt/environ.py"), re.M))
