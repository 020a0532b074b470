"""CPU checks of a patched branch ``head`` against its upstream ``base``, over the files it changes (nothing
checked out, no GPU): ``no-conflict-markers`` (``<<<<<<<``/``>>>>>>>`` opening a line; a bare ``=======`` is
reST), ``python-compiles`` (each changed ``.py``, unless it did not compile on ``base`` either: a note), and
``gates-declared`` (each env gate declared in ``srt/environ.py`` as ``NAME = Env...(``). ``watch`` runs them.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from c128patch.git import Git

ENVIRON = "python/sglang/srt/environ.py"
_MARKER = re.compile(r"^(<{7}|>{7})( |$)")


@dataclass
class TreeCheck:
    name: str
    ok: bool = True
    findings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def fail(self, finding: str) -> None:
        self.ok = False
        self.findings.append(finding)

    def to_json(self) -> dict:
        return asdict(self)


def _text(git: Git, rev: str, path: str) -> str | None:
    data = git.blob(rev, path)
    return None if data is None or b"\0" in data else data.decode(errors="replace")


def _compile_error(text: str, path: str) -> str:
    try:
        compile(text, path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return f"{path}:{exc.lineno}: {exc.msg}"
    except ValueError as exc:  # e.g. a null byte
        return f"{path}: {exc}"
    return ""


def check_tree(git: Git, base: str, head: str, gates: list[str]) -> list[TreeCheck]:
    """The checks of the module docstring on ``head``; ``gates``: the env gates to look for."""
    files = git.changed_files(base, head)
    texts = {p: t for p in files if (t := _text(git, head, p)) is not None}
    markers, compiles = TreeCheck("no-conflict-markers"), TreeCheck("python-compiles")
    declared = TreeCheck("gates-declared")
    for path, text in texts.items():
        for number, line in enumerate(text.splitlines(), 1):
            if _MARKER.match(line):
                markers.fail(f"{path}:{number}: conflict marker {line[:7]!r}")
                break
        if path.endswith(".py"):
            error = _compile_error(text, path)
            if error:
                before = _text(git, base, path)
                if before is not None and _compile_error(before, path):
                    compiles.notes.append(f"{error} (does not compile upstream either)")
                else:
                    compiles.fail(error)
    compiles.notes.append(f"{sum(p.endswith('.py') for p in texts)} changed Python file(s) compiled")
    environ = _text(git, head, ENVIRON) or ""
    for gate in sorted(set(gates)):
        if not re.search(rf"^\s+{re.escape(gate)}\s*(:[^=\n]*)?=\s*Env\w*\(", environ, re.M):
            declared.fail(f"{gate} is not declared in {ENVIRON}")
    return [markers, compiles, declared]
