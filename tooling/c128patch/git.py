"""A thin wrapper over the git command line: git does the work."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from c128patch.errors import C128Error

# Fixed identity and environment so that commits we make are reproducible.
BOT_NAME = "c128patch"
BOT_EMAIL = "c128patch@noreply.invalid"


def git_executable() -> str:
    exe = shutil.which("git")
    if exe is None:
        raise C128Error("git not found on PATH; install git (>= 2.30) and retry")
    return exe


_LOCKED = re.compile(r"Unable to create '([^']+\.lock)': File exists")


def stale_lock_message(path: str) -> str:
    """What to say about a git lock file that is in the way (git itself only says "remove the file")."""
    return (f"{path} exists: another git process is running in this repository, or one was killed; "
            f"if none is running, remove it (rm -f {shlex.quote(path)}) and retry")


class GitError(C128Error):
    def __init__(self, args: Sequence[str], returncode: int, stderr: str, stdout: str = "") -> None:
        first = (stderr or stdout).strip().splitlines()
        detail = first[-1] if first else f"exit {returncode}"
        locked = _LOCKED.search(stderr or "")
        if locked:
            detail = stale_lock_message(locked.group(1))
        super().__init__(f"git {' '.join(args[:3])} failed: {detail}")
        self.args_ = list(args)
        self.returncode = returncode
        self.stderr = stderr
        self.stdout = stdout


@dataclass
class Git:
    """Runs git in one repository (``git_dir`` for bare/object-only use, else ``worktree``)."""

    worktree: Path | None = None
    git_dir: Path | None = None
    env: dict[str, str] = field(default_factory=dict)

    def _base_env(self) -> dict[str, str]:
        env = dict(os.environ)
        for key in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY"):
            env.pop(key, None)
        env.update(
            {
                "GIT_AUTHOR_NAME": env.get("GIT_AUTHOR_NAME", BOT_NAME),
                "GIT_AUTHOR_EMAIL": env.get("GIT_AUTHOR_EMAIL", BOT_EMAIL),
                "GIT_COMMITTER_NAME": env.get("GIT_COMMITTER_NAME", BOT_NAME),
                "GIT_COMMITTER_EMAIL": env.get("GIT_COMMITTER_EMAIL", BOT_EMAIL),
                "GIT_TERMINAL_PROMPT": "0",
                "LC_ALL": "C",
            }
        )
        if self.git_dir is not None:
            env["GIT_DIR"] = str(self.git_dir)
        env.update(self.env)
        return env

    def with_env(self, **extra: str) -> "Git":
        return Git(self.worktree, self.git_dir, {**self.env, **extra})

    def run(
        self,
        *args: str,
        check: bool = True,
        input: str | bytes | None = None,
        env: Mapping[str, str] | None = None,
        binary: bool = False,
    ) -> subprocess.CompletedProcess:
        full_env = self._base_env()
        if env:
            full_env.update(env)
        cwd = self.worktree if self.worktree is not None else (self.git_dir or Path.cwd())
        cmd = [git_executable(), *args]
        data = input.encode() if isinstance(input, str) and binary else input
        proc = subprocess.run(
            cmd,
            cwd=cwd,
            env=full_env,
            input=data,
            capture_output=True,
            text=not binary,
        )
        if check and proc.returncode != 0:
            err = proc.stderr if isinstance(proc.stderr, str) else proc.stderr.decode(errors="replace")
            out = proc.stdout if isinstance(proc.stdout, str) else proc.stdout.decode(errors="replace")
            raise GitError(args, proc.returncode, err, out)
        return proc

    def out(self, *args: str, **kw) -> str:
        return self.run(*args, **kw).stdout.strip()

    def ok(self, *args: str, **kw) -> bool:
        return self.run(*args, check=False, **kw).returncode == 0

    # --- queries -------------------------------------------------------------
    def rev_parse(self, rev: str) -> str | None:
        proc = self.run("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False)
        return proc.stdout.strip() or None if proc.returncode == 0 else None

    def current_branch(self) -> str | None:
        proc = self.run("symbolic-ref", "--quiet", "--short", "HEAD", check=False)
        return proc.stdout.strip() if proc.returncode == 0 else None

    def head(self) -> str | None:
        return self.rev_parse("HEAD")

    def status_porcelain(self) -> list[str]:
        """``XY path`` lines (not stripped: X may be a space)."""
        text = self.run("status", "--porcelain=v1", "--untracked-files=normal").stdout
        return [line for line in text.splitlines() if line]

    def is_ancestor(self, a: str, b: str) -> bool:
        return self.ok("merge-base", "--is-ancestor", a, b)

    def count(self, rng: str) -> int:
        return int(self.out("rev-list", "--count", rng))

    def blob(self, rev: str, path: str) -> bytes | None:
        proc = self.run("cat-file", "blob", f"{rev}:{path}", check=False, binary=True)
        return proc.stdout if proc.returncode == 0 else None

    def tree_entry(self, rev: str, path: str) -> tuple[str, str, str] | None:
        """(mode, type, sha) of ``path`` at ``rev``, or None."""
        text = self.out("ls-tree", rev, "--", path)
        if not text:
            return None
        meta, _name = text.split("\t", 1)
        mode, typ, sha = meta.split()
        return mode, typ, sha


def is_work_tree(path: Path) -> bool:
    if not path.is_dir():
        return False
    proc = subprocess.run(
        [git_executable(), "rev-parse", "--is-inside-work-tree"],
        cwd=path,
        capture_output=True,
        text=True,
        env={**os.environ, "LC_ALL": "C"},
    )
    return proc.returncode == 0 and proc.stdout.strip() == "true"


def toplevel(path: Path) -> Path:
    proc = subprocess.run(
        [git_executable(), "rev-parse", "--show-toplevel"], cwd=path, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise C128Error(f"not a git repository: {path}")
    return Path(proc.stdout.strip())
