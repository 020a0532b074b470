"""What the benchmark scripts share: the machine line and the JSON they write."""

from __future__ import annotations

import json
import platform
import subprocess
from pathlib import Path


def machine() -> str:
    return f"{platform.machine()} {platform.python_version()}, {subprocess.getoutput('nproc')} cores"


def write_json(path: Path | None, row: dict) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(row, indent=2) + "\n")
