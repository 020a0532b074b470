"""Is a working tree safe to change? Dirty files, half-done git operations, our own journals."""

from __future__ import annotations

from pathlib import Path

from c128patch.errors import C128Error
from c128patch.git import Git

_GIT_BUSY = {
    "rebase-merge": "a git rebase",
    "rebase-apply": "a git am or rebase",
    "MERGE_HEAD": "a git merge",
    "CHERRY_PICK_HEAD": "a git cherry-pick",
    "REVERT_HEAD": "a git revert",
}


def git_path(git: Git, name: str) -> Path:
    """A path inside the repository's git dir (worktree-aware)."""
    rel = git.out("rev-parse", "--git-path", name)
    path = Path(rel)
    return path if path.is_absolute() else (git.worktree or Path.cwd()) / path


def c128_state_dir(git: Git) -> Path:
    return git_path(git, "c128patch")


def rebase_journal(git: Git) -> Path:
    return c128_state_dir(git) / "rebase.json"


def ensure_idle(git: Git, action: str) -> None:
    """Refuse to ``action`` while a c128patch rebase or a git operation is half done."""
    if rebase_journal(git).is_file():
        raise C128Error(
            f"cannot {action}: a c128patch rebase is in progress in {git.worktree}; "
            "finish it (c128patch rebase --continue / --skip) or undo it (c128patch rebase --abort)"
        )
    for name, what in _GIT_BUSY.items():
        if git_path(git, name).exists():
            raise C128Error(f"cannot {action}: {what} is in progress in {git.worktree}; finish or abort it first")


def ensure_clean(git: Git, action: str) -> None:
    """Refuse uncommitted or untracked files: nothing of the user's may be lost."""
    changes = git.status_porcelain()
    if changes:
        sample = ", ".join(line[3:] for line in changes[:3])
        more = f" and {len(changes) - 3} more" if len(changes) > 3 else ""
        raise C128Error(
            f"cannot {action}: {git.worktree} has uncommitted changes ({sample}{more}); "
            "commit or stash them (git stash -u) and retry; nothing was changed"
        )
