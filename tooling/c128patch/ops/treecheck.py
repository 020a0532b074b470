"""The behavioural tier on any patched tree: import every module the series adds or changes there,
in a subprocess with the tree's ``python/`` first on ``sys.path``, with the series' env gates off and
on. Each module is ok, failed (an error in sglang's or our code: a name gone, a TypeError at import,
...) or not checked (a third-party package the interpreter lacks); without torch nothing is checked.
Not checked is never counted as passed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath

from c128patch.errors import C128Error
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

    @property
    def failed(self) -> list[str]:
        return [f"gates {t.gates}: {name}: {m['detail']}" for t in self.tiers
                for name, m in [*t.modules.items(), *t.probes.items()] if m["status"] == "failed"]

    @property
    def checked(self) -> bool:
        return all(t.torch for t in self.tiers) and any(t.count("ok") for t in self.tiers)

    def verdict(self) -> str:
        if not all(t.torch for t in self.tiers):
            return "torch is not installed for this interpreter: behavioural tier not checked"
        if not self.failed and not any(t.count("ok") for t in self.tiers):
            needs = sorted({m.get("detail", "").removeprefix("needs ") for t in self.tiers for m in t.modules.values()
                            if m["status"] == "not checked"} - {""})
            return f"nothing could be checked here: every module needs a package this interpreter lacks ({', '.join(needs)})"
        parts = [f"gates {t.gates}: {t.count('ok')} ok, {t.count('failed')} failed, {t.count('not checked')} not checked"
                 for t in self.tiers]
        head = "failed" if self.failed else "passed" if all(t.count("not checked") == 0 for t in self.tiers) else \
            "passed where checked"
        return f"{head} ({'; '.join(parts)})"

    def to_json(self) -> dict:
        return {"ok": not self.failed and self.checked, "verdict": self.verdict(), "failed": self.failed,
                "tiers": [asdict(t) for t in self.tiers]}


def module_name(path: str) -> str | None:
    p = PurePosixPath(path)
    if p.suffix != ".py" or not p.parts or p.parts[0] != PY_ROOT:
        return None
    parts = list(p.with_suffix("").parts[1:])
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def run(series: Series, tree: Path, paths: list[str], *, python: str | None = None, timeout: float = 600) -> TreecheckResult:
    """The tier on ``tree`` (a folder holding ``python/sglang``) for the ``paths`` the series changes."""
    if not (tree / PY_ROOT / "sglang").is_dir():
        raise C128Error(f"{tree} holds no {PY_ROOT}/sglang: pass the top of a patched sglang tree")
    missing = [p for p in paths if not (tree / p).is_file()]
    if missing:
        raise C128Error(f"{tree} lacks {missing[0]}" + (f" and {len(missing) - 1} more" if len(missing) > 1 else "")
                        + ", which the series writes: apply the series there first")
    modules = sorted({m for p in paths if (m := module_name(p))})
    gates = sorted({e.gate for e in series.entries if e.gate} | {r for g in series.gates for r in g.requires})
    result = TreecheckResult()
    for state in ("off", "on"):
        env = {k: v for k, v in os.environ.items() if k not in gates}
        if state == "on":
            env.update({g: "1" for g in gates})
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.pop("PYTHONPATH", None)  # the tree alone (the runner puts it first on sys.path)
        try:
            probes = json.dumps([p for p in PROBES if p[0] in modules])
            proc = subprocess.run([python or sys.executable, "-c", RUNNER.read_text(), str(tree / PY_ROOT), state, probes, *modules],
                                  env=env,
                                  capture_output=True, text=True, timeout=timeout, cwd=str(tree))
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise C128Error(f"the behavioural tier did not run: {exc}") from None
        lines = proc.stdout.strip().splitlines()
        try:
            data = json.loads(lines[-1])
        except (IndexError, ValueError):
            raise C128Error(f"the behavioural tier's interpreter failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}") from None
        result.tiers.append(TierResult(state, data["torch"], data["modules"], data.get("probes", {})))
    return result
