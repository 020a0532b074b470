"""c128patch: carry DeepSeek-V4 online C128 under DSPARK onto a pinned SGLang."""

from __future__ import annotations

__version__ = "0.1.0"
# The layout version of every report the tool prints (--json) or writes: its "schema" (docs/schemas/README.md).
SCHEMA_VERSION = 1

TYPE_CHECKING = False  # not typing's: importing typing is a third of `c128patch --help`'s start-up
if TYPE_CHECKING:
    from pathlib import Path


def __getattr__(name: str) -> Path:
    # PACKAGE_DIR: the package folder (the series in PACKAGE_DIR / "_series", or two folders up in a checkout),
    # computed on first use: `c128patch --help` imports no pathlib.
    if name == "PACKAGE_DIR":
        from pathlib import Path

        return Path(__file__).resolve().parent
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
