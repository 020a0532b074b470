"""The behavioural tier on any patched tree: import every module the series adds or changes there,
in a subprocess with the tree's ``python/`` first on ``sys.path``, with the series' env gates off and
on. Each module is ok, failed (an error in sglang's or our code: a name gone, a TypeError at import,
...) or not checked (a third-party package the interpreter lacks); without torch nothing is checked.
Not checked is never counted as passed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath

from c128patch.errors import C128Error
from c128patch.fit import treecheck_imports as imports
from c128patch.git import Git
from c128patch.series.manifest import Series

RUNNER = Path(__file__).with_name("treecheck_runner.py")
# (module, zero-argument function, truthy with the gates on, with them off): behaviour the gates switch
PROBES = (("sglang.srt.layers.attention.dsv4.online_c128_dspark", "online_c128_dspark_env", True, False),)
PY_ROOT = "python"


@dataclass
class TierResult:
    gates: str  # "off" | "on"
    torch: bool = True
    modules: dict[str, dict] = field(default_factory=dict)
    probes: dict[str, dict] = field(default_factory=dict)

    def count(self, status: str) -> int:
        return sum(m["status"] == status for m in [*self.modules.values(), *self.probes.values()])


@dataclass
class TreecheckResult:
    tiers: list[TierResult] = field(default_factory=list)
    imports: dict[str, dict] = field(default_factory=dict)  # ops.treecheck_imports: module -> its static check

    @property
    def failed(self) -> list[str]:
        return [f"gates {t.gates}: {name}: {m['detail']}" for t in self.tiers
                for name, m in [*t.modules.items(), *t.probes.items()] if m["status"] == "failed"] + [
            f"imports: {name}: {m['detail']}" for name, m in self.imports.items() if m["status"] == "failed"]

    @property
    def checked(self) -> bool:
        return all(t.torch for t in self.tiers) and any(t.count("ok") for t in self.tiers)

    def not_checked(self) -> list[str]:
        """One line per module (or probe) the tier could not run, with the reason; never a pass."""
        if not all(t.torch for t in self.tiers):
            return ["behavioural tier: torch is not installed for this interpreter (nothing imported)"]
        seen: dict[str, str] = {}
        for t in self.tiers:
            for name, m in [*t.modules.items(), *t.probes.items()]:
                if m["status"] == "not checked":
                    seen.setdefault(name, m.get("detail", ""))
        return [f"{name}: not checked: {why}" for name, why in sorted(seen.items())]

    def _imports_said(self) -> str:
        if not self.imports:
            return ""
        ok = sum(m["status"] == "ok" for m in self.imports.values())
        return f"; imports: {ok} of {len(self.imports)} modules' sglang imports resolve on the tree's files"

    def verdict(self) -> str:
        said = self._imports_said()
        if not all(t.torch for t in self.tiers):
            return ("failed: " if self.failed else "") + \
                f"torch is not installed for this interpreter: behavioural tier not checked{said}"
        if not self.failed and not any(t.count("ok") for t in self.tiers):
            needs = sorted({m.get("detail", "").removeprefix("needs ").split(";")[0] for t in self.tiers
                            for m in t.modules.values() if m["status"] == "not checked"} - {""})
            return f"nothing could be checked here: every module needs a package this interpreter lacks ({', '.join(needs)}){said}"
        parts = [f"gates {t.gates}: {t.count('ok')} ok, {t.count('failed')} failed, {t.count('not checked')} not checked"
                 for t in self.tiers]
        head = "failed" if self.failed else "passed" if all(t.count("not checked") == 0 for t in self.tiers) else \
            "passed where checked"
        return f"{head} ({'; '.join(parts)}){said}"

    def to_json(self) -> dict:
        return {"ok": not self.failed and self.checked, "verdict": self.verdict(), "failed": self.failed,
                "not_checked": self.not_checked(), "tiers": [asdict(t) for t in self.tiers], "imports": self.imports}


def module_name(path: str) -> str | None:
    p = PurePosixPath(path)
    if p.suffix != ".py" or not p.parts or p.parts[0] != PY_ROOT:
        return None
    parts = list(p.with_suffix("").parts[1:])
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _gates(series: Series) -> list[str]:
    return sorted({e.gate for e in series.entries if e.gate} | {r for g in series.gates for r in g.requires})


@dataclass
class Pending:
    """The tier started (one subprocess; both gate states run at once in it); ``finish`` waits for it."""

    tree: Path
    modules: list[str]
    timeout: float
    proc: subprocess.Popen | None = None

    def finish(self) -> TreecheckResult:
        assert self.proc is not None
        try:
            stdout, stderr = self.proc.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise C128Error(f"the behavioural tier did not finish in {self.timeout:g} s") from None
        try:
            data = json.loads(stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            raise C128Error("the behavioural tier's interpreter failed: "
                            f"{(stderr.strip().splitlines() or ['?'])[-1]}") from None
        result = TreecheckResult(imports=data.get("imports", {}))
        for state in ("off", "on"):
            tier = data["tiers"].get(state, {})
            if "error" in tier:
                raise C128Error(f"the behavioural tier (gates {state}) failed to run: {tier['error']}")
            result.tiers.append(TierResult(state, data["torch"], tier.get("modules", {}), tier.get("probes", {})))
        _annotate(result)
        return result

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # the runner and its forked children
            self.proc.wait()


def start(series: Series, tree: Path, paths: list[str], *, python: str | None = None, timeout: float = 600) -> Pending:
    """The tier on ``tree`` (a folder holding ``python/sglang``) for the ``paths`` the series changes, started."""
    if not (tree / PY_ROOT / "sglang").is_dir():
        raise C128Error(f"{tree} holds no {PY_ROOT}/sglang: pass the top of a patched sglang tree")
    missing = [p for p in paths if not (tree / p).is_file()]
    if missing:
        raise C128Error(f"{tree} lacks {missing[0]}" + (f" and {len(missing) - 1} more" if len(missing) > 1 else "")
                        + ", which the series writes: apply the series there first")
    modules = sorted({m for p in paths if (m := module_name(p))})
    gates = _gates(series)
    env = {k: v for k, v in os.environ.items() if k not in gates}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.pop("PYTHONPATH", None)  # the tree alone (the runner puts it first on sys.path)
    argv = [python or sys.executable, "-c", RUNNER.read_text(), str(tree / PY_ROOT), json.dumps(gates),
            json.dumps([p for p in PROBES if p[0] in modules]), str(Path(imports.__file__)), *modules]
    try:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=str(tree), start_new_session=True)
    except OSError as exc:
        raise C128Error(f"the behavioural tier did not run: {exc}") from None
    return Pending(tree, modules, timeout, proc)


def run(series: Series, tree: Path, paths: list[str], *, python: str | None = None, timeout: float = 600) -> TreecheckResult:
    """The tier on ``tree`` (a folder holding ``python/sglang``) for the ``paths`` the series changes."""
    return start(series, tree, paths, python=python, timeout=timeout).finish()


def run_rev(series: Series, git: Git, rev: str, commit: str, *, python: str | None = None) -> TreecheckResult:
    """The tier on the series replayed at ``commit`` (``fit.contract.patched_tree``), unpacked into a temporary folder."""
    import tempfile

    from c128patch.fit import contract

    head = contract.patched_tree(series, git, rev, commit)
    with tempfile.TemporaryDirectory(prefix="c128treecheck-") as tmp:
        git.extract(head, f"{PY_ROOT}/sglang", Path(tmp))
        return run(series, Path(tmp), git.changed_files(commit, head), python=python)


def _annotate(result: TreecheckResult) -> None:
    """A module that did not import says that its imports resolve (it stays not checked); ``result.imports``
    (``check``, run by the tier's subprocess) says what is missing where they do not."""
    for tier in result.tiers:
        for name, m in tier.modules.items():
            found = result.imports.get(name)
            if m["status"] == "not checked" and found and found["status"] == "ok":
                m["detail"] += f"; its {found['imports']} sglang imports resolve on this tree's files"
