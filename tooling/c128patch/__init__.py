"""c128patch: carry DeepSeek-V4 online C128 under DSPARK onto a pinned SGLang."""

__version__ = "0.1.0"
