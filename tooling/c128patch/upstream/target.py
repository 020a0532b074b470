"""The upstream commit a series goes onto: ``Target`` (rev, commit, source), and the branch named after it."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from c128patch.upstream.source import Upstream


def default_branch(rev: str) -> str:
    """The branch ``apply`` makes for ``rev`` (``rebase`` renames it after the new base)."""
    return f"c128/{rev}"


@dataclass(frozen=True)
class Target:
    rev: str  # as the user named it: a release tag, a branch, a commit
    commit: str  # the commit it names
    source: str = ""  # where upstream came from: "release" | "path" | "url" ("": not said)
    url: str = ""  # source "url": the URL

    @classmethod
    def of(cls, upstream: Upstream, rev: str) -> Target:
        """``rev`` resolved in ``upstream``."""
        return cls(rev, upstream.resolve(rev), upstream.kind, upstream.location if upstream.kind == "url" else "")

    @classmethod
    def from_json(cls, data: dict) -> Target:
        return cls(**{k: str(data.get(k) or "") for k in ("rev", "commit", "source", "url")})

    def to_json(self) -> dict[str, str]:
        """The provenance record's ``upstream``: rev and commit, then source and url where known."""
        return {k: v for k, v in asdict(self).items() if v or k in ("rev", "commit")}

    @property
    def branch(self) -> str:
        return default_branch(self.rev)
