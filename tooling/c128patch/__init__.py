"""c128patch: carry DeepSeek-V4 online C128 under DSPARK onto a pinned SGLang."""

from pathlib import Path

__version__ = "0.1.0"

# The installed package folder: the packaged series lives in PACKAGE_DIR / "_series"; in a source
# checkout the series is two folders up (tooling/c128patch -> the repository root).
PACKAGE_DIR = Path(__file__).resolve().parent
