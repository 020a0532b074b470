"""Where upstream comes from: the release-wheel history, a local clone or a URL mirror, the cache."""

from __future__ import annotations

import re
from pathlib import Path

DEFAULT_TREE = Path("sglang")  # where `apply` clones upstream when no --tree is given

_URL = re.compile(r"^([a-z][a-z0-9+.-]*://|[\w.-]+@[\w.-]+:)", re.IGNORECASE)


def is_url(repo: str) -> bool:
    return bool(_URL.match(repo))


def local_repo(repo: str | None) -> Path | None:
    """The folder a ``--repo`` names on this machine (a path, a ``file://`` URL), whose files are upstream's: a
    ``--python`` inside it runs upstream's program (``fit.sandbox.interpreter``); None for the release history or a
    remote URL."""
    if not repo or (is_url(repo) and not repo.startswith("file://")):
        return None
    return Path(repo.removeprefix("file://")).expanduser().absolute()
