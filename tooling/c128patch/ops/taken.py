"""An overlay's target path taken upstream: who made the file, who imports it, and the way through.

Keeping ours would replace upstream's module under every upstream importer (gates off too). ``taken``
names the upstream commit that created the file, the upstream files importing it (``git grep`` of the
new base for the dotted module, or a header's name), the entries of ours importing ours, and so the
way through: ``rename`` (entries import ours: another ``target`` in series.toml, then ``rebase
--continue``) or ``drop`` (nothing does: ``rebase --skip`` drops it as superseded, recording ``merged_in``).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import PurePosixPath

from c128patch.git import Git
from c128patch.series.manifest import Entry, Series
from c128patch.series.patchfile import read_patch

TREE_ROOT = "python"


@dataclass
class Taken:
    target: str
    created: str  # "abc123456789 subject" of the upstream commit that added the file ("" when not found)
    importers: list[str] = field(default_factory=list)  # upstream files importing it, on the new base
    ours: list[str] = field(default_factory=list)  # entries of the series importing our module
    way: str = "drop"  # "rename" or "drop"
    commit: str = ""  # the full id of ``created``

    def lines(self, rename: str, skip: str) -> list[str]:
        out = [f"upstream created {self.target}" + (f" in {self.created}" if self.created else "")
               + (f"; imported upstream by {', '.join(self.importers[:5])}" if self.importers else
                  "; nothing upstream imports it")]
        if self.way == "rename":
            out.append(f"way through: rename our target (entries {', '.join(self.ours)} import ours): set another "
                       f"target in series.toml, point them at it, then {rename}")
        else:
            out.append(f"way through: drop ours as superseded by upstream's file (nothing of ours imports it): {skip}")
        return out

    def to_json(self) -> dict:
        return asdict(self)


def _patterns(target: str) -> list[str]:
    """Extended regexes that find an import of ``target`` (a header: its file name in an include)."""
    path = PurePosixPath(target)
    parts = list(path.with_suffix("").parts[1:]) if path.suffix == ".py" and path.parts[0] == TREE_ROOT else []
    module = ".".join(parts[:-1] if parts[-1:] == ["__init__"] else parts)  # imported as, ``python/`` left out
    if not module:
        return [re.escape(path.name)]
    parent, _, name = module.rpartition(".")
    return [rf"(from|import)[[:space:]]+{re.escape(module)}([^A-Za-z0-9_]|$)",
            rf"from[[:space:]]+{re.escape(parent)}[[:space:]]+import.*[^A-Za-z0-9_]{re.escape(name)}([^A-Za-z0-9_]|$)"]


def taken(git: Git, series: Series, entry: Entry, old: str, onto: str) -> Taken:
    """Who made ``entry``'s overlay target upstream in ``old..onto``, who imports it there and here, the way through."""
    target = entry.target
    made = git.out("log", "-1", "--diff-filter=A", "--format=%H %h %s", f"{old}..{onto}", "--", target) or \
        git.out("log", "-1", "--diff-filter=A", "--format=%H %h %s", onto, "--", target)
    commit, _, created = made.partition(" ")
    args = [a for p in _patterns(target) for a in ("-e", p)]
    hits = git.run("grep", "-l", "-E", *args, onto, "--", TREE_ROOT, check=False).stdout.splitlines()
    importers = sorted({h.split(":", 1)[1] for h in hits if ":" in h} - {target})
    found = re.compile("|".join(p.replace("[[:space:]]", r"\s") for p in _patterns(target)))
    ours = []
    for other in (e for e in series.entries if e.name != entry.name):
        paths = [(v, series.file_of(other, v)) for v in other.patch_files() or [None]]
        texts = ["\n".join(read_patch(p).added) if v else p.read_text(errors="replace")  # what it adds
                 for v, p in paths if p.is_file()]
        if any(found.search(text) for text in texts):
            ours.append(other.name)
    return Taken(target, created, importers, ours, "rename" if ours else "drop", commit)
