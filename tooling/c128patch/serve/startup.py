"""What the installed build's startup would refuse for given launch arguments.

The series carries its startup rules as a torch-free, stdlib-only module
(``ONLINE_C128_DSPARK_RULES``); the patched startup calls it, and doctor runs the installed copy
from its file: ``config_from_args(argv, environ)`` then ``startup_refusals(config)``, one line per
refusal. Doctor has no rules of its own. A build without the module says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from c128patch.errors import C128Error
from c128patch.serve.install import load_by_path

ONLINE_C128_DSPARK_RULES = "sglang/srt/layers/attention/dsv4/online_c128_dspark_rules.py"


@dataclass
class Startup:
    path: str
    available: bool = False
    config: dict[str, Any] = field(default_factory=dict)
    refusals: list[str] = field(default_factory=list)
    error: str = ""  # the launch arguments (or the module) could not be read


def startup_refusals(site: Path, argv: Sequence[str], environ: Mapping[str, str]) -> Startup:
    path = site / ONLINE_C128_DSPARK_RULES
    result = Startup(str(path))
    if not path.is_file():
        return result
    result.available = True
    try:
        module = load_by_path(path, "c128patch_doctor_online_c128_dspark_rules")
        result.config = dict(module.config_from_args(list(argv), dict(environ)))
        result.refusals = [str(line) for line in module.startup_refusals(result.config)]
    except C128Error as exc:
        result.error = exc.message
    except (ValueError, AttributeError, TypeError) as exc:  # the contract: ValueError for what it cannot read
        result.error = f"{type(exc).__name__}: {exc}"
    return result
