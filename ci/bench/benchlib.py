"""What the benchmark scripts share: the machine line and the JSON they write, stamped with
what it was measured on (command, machine, date, series, and the evidence key of each release
it ran: a result under another key renders as stale in README)."""

from __future__ import annotations

import datetime
import json
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Sequence


def machine() -> str:
    return f"{platform.machine()} {platform.python_version()}, {subprocess.getoutput('nproc')} cores"


def stamp(row: dict, revs: Sequence[str], series_root: Path | None = None) -> dict:
    """``row`` with command, device, date, series and ``keys`` (rev -> evidence key)."""
    from c128patch.evidence.keys import key_for
    from c128patch.series.manifest import default_series_root, load_series
    from c128patch.upstream.releases import ReleaseHistory

    series = load_series(series_root or default_series_root())
    git = ReleaseHistory().git
    keys = {rev: key_for(series, git, git.rev_parse(rev)).to_json() for rev in revs}
    return {**row, "command": "python " + shlex.join(sys.argv), "device": machine(),
            "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
            "series": {"name": series.name, "version": series.version, "digest": series.digest()}, "keys": keys}


def write_json(path: Path | None, row: dict, *, revs: Sequence[str] = (), series_root: Path | None = None) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(stamp(row, revs, series_root), indent=2) + "\n")
