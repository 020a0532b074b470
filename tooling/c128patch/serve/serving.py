"""Can the serving Python start sglang's server? ``import sglang`` there, and the launch arguments
parsed by that sglang's own parser (``ServerArgs.add_cli_args`` on an ``argparse`` parser, as its
``prepare_server_args`` builds it; ``--config`` merged by its own merger), in one subprocess of that
Python, time-bounded. Unknown flags are what the server would refuse; options the parser requires
(``--model-path``) are not needed to check the others and are listed."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass, field
from typing import Sequence

# What the probe imports (a test points them at a stand-in where a real install cannot import).
MODULES = {"package": "sglang", "server_args": "sglang.srt.server_args",
           "config": "sglang.srt.utils.server_args_config_parser"}
TIMEOUT = 300.0  # seconds: importing sglang (torch, CUDA) on a cold disk
_MARK = "C128PATCH-SERVING "

_PROBE = r'''
import argparse, importlib, json, sys
modules, argv = json.loads(sys.argv[1])
out = {"import_error": "", "args_error": "", "args_checked": False, "parser_built": False, "required_missing": []}
real_stdout, sys.stdout = sys.stdout, sys.stderr  # what sglang prints at import is not the answer
def why(e):
    return "%s: %s" % (type(e).__name__, e)
try:
    importlib.import_module(modules["package"])
except BaseException as e:
    out["import_error"] = why(e)
if argv is not None and out["import_error"]:
    out["args_error"] = "it needs `import %s`, which fails" % modules["package"]
elif argv is not None:
    try:
        mod = importlib.import_module(modules["server_args"])
        parser = argparse.ArgumentParser(prog="sglang serve")
        mod.ServerArgs.add_cli_args(parser)
    except BaseException as e:
        out["args_error"] = "%s does not import or build its parser (%s)" % (modules["server_args"], why(e))
    else:
        out["parser_built"] = True
        def refuse(message):
            raise ValueError(message)
        parser.error = refuse
        for action in parser._actions:
            if action.required:
                given = any(t == o or t.startswith(o + "=") for o in action.option_strings for t in argv)
                if not given:
                    out["required_missing"].append(action.option_strings[0])
                action.required = False
        try:
            if "--config" in argv:
                merger = importlib.import_module(modules["config"]).ConfigArgumentMerger(parser)
                argv = merger.merge_config_with_args(argv)
            parser.parse_args(argv)
            out["args_checked"] = True
        except SystemExit as e:
            out["args_error"] = "the parser exited (%s)" % e.code
        except BaseException as e:
            out["args_error"] = str(e) if isinstance(e, ValueError) else why(e)
real_stdout.write("%s%s\n" % (MARK, json.dumps(out)))
'''.replace("MARK", repr(_MARK))


@dataclass
class Serving:
    import_error: str = ""  # `import sglang` failed (or did not finish): the server cannot start
    args_error: str = ""  # the launch arguments were refused, or could not be checked
    args_checked: bool = False
    parser_built: bool = False  # sglang's parser was built: an args_error is its refusal
    required_missing: list[str] = field(default_factory=list)
    seconds: float = 0.0


def probe_serving(python: str, launch_args: Sequence[str] | None, timeout: float | None = None) -> Serving:
    """``import sglang`` in ``python``, and (``launch_args`` not None) those arguments through its parser."""
    limit = TIMEOUT if timeout is None else timeout
    started = time.monotonic()
    payload = json.dumps([MODULES, None if launch_args is None else list(launch_args)])
    try:
        proc = subprocess.run([python, "-c", _PROBE, payload], capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return Serving(import_error=f"it did not finish in {limit:g} s",
                       args_error="not checked (the import did not finish)" if launch_args is not None else "",
                       seconds=round(time.monotonic() - started, 1))
    except OSError as exc:
        return Serving(import_error=f"cannot run {python}: {exc}")
    seconds = round(time.monotonic() - started, 1)
    found = [line[len(_MARK):] for line in proc.stdout.splitlines() if line.startswith(_MARK)]
    if not found:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        return Serving(import_error=f"the interpreter died ({tail[0]})", seconds=seconds,
                       args_error="not checked" if launch_args is not None else "")
    raw = json.loads(found[-1])
    return Serving(raw["import_error"], raw["args_error"], raw["args_checked"], raw["parser_built"],
                   raw["required_missing"], seconds)
