"""Where upstream comes from: the release-wheel history, a local clone or a URL mirror, the cache."""

from pathlib import Path

DEFAULT_TREE = Path("sglang")  # where `apply` clones upstream when no --tree is given
