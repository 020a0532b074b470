"""The git command the tool prints for the user to run: it must work as printed, also where the
user's git has no identity (a fresh machine, a CI box): there it names the tool's own identity."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

from c128patch.git import BOT_EMAIL, BOT_NAME


def has_identity(tree: Path) -> bool:
    """Whether git, as the user runs it in ``tree`` (their config and environment), can commit."""
    try:
        proc = subprocess.run(["git", "-C", str(tree), "var", "GIT_COMMITTER_IDENT"], capture_output=True,
                              env={**os.environ, "GIT_TERMINAL_PROMPT": "0"}, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def git_command(tree: Path) -> str:
    """``git -C TREE``, plus ``-c user.name=c128patch -c user.email=...`` where the user's git has no
    identity (a commit made by the printed command then names the tool; set user.name/user.email to
    record it under yours)."""
    words = ["git", "-C", str(tree)]
    if not has_identity(tree):
        words += ["-c", f"user.name={BOT_NAME}", "-c", f"user.email={BOT_EMAIL}"]
    return shlex.join(words)
