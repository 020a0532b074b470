"""The package's layers point down only: cli -> fit/evidence -> ops/wheel/smoke/capacity -> series/upstream
-> git -> base.

Each module's imports of ``c128patch.*`` are read with ``ast`` (lazy and TYPE_CHECKING imports
included) and checked against ``LAYERS``; a new subpackage must be placed here to pass.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tooling" / "c128patch"

# group -> rank. A module may import its own group or any group of a lower rank.
LAYERS: dict[str, int] = {
    "c128patch": 0, "errors": 0, "exitcodes": 0, "progress": 0, "jsonio": 0, "textsafe": 0, "procs": 0,  # base
    "git": 1,                                                   # our git wrapper
    "series": 2, "upstream": 2,                                 # the data model; where upstream comes from
    "ops": 3, "wheel": 3, "smoke": 3, "capacity": 3,            # what is done with them
    "fit": 4,  # does the series still fit upstream (contract, tree checks, watch, bisect): carries trees with ops
    "evidence": 4,  # what was proven of them: stages trees (ops.check, smoke.trees), reads the results
    "serve": 4,  # the serving host (doctor): reads an install with smoke.device's probes and wheel's label/SBOM
    "cli": 5,                                                   # one module per verb; nothing imports it
    "__main__": 6,
}
# Same-rank imports the layering allows, each with its reason.
ACROSS: dict[tuple[str, str], str] = {
    ("wheel", "ops"): "`build` applies the series to a checkout (ops.apply) before its PEP 517 build; `wheel` says "
                      "what `check` says of a rev older than the series (ops.check.release_support_note)",
    ("upstream", "series"): "a release wheel's member names pass the one confinement rule (series.paths) before "
                            "they reach the release history's git fast-import stream",
    ("smoke", "wheel"): "`smoke --wheel` unpacks a wheel through the one check of its members and sizes "
                        "(wheel.tools.check_archive)",
    ("errors", "exitcodes"): "an error's exit code comes from the one table of exit codes",
    ("jsonio", "errors"): "a lock another run holds past $C128PATCH_LOCK_TIMEOUT is one line (C128Error), never an "
                          "unbounded wait",
    ("jsonio", "textsafe"): "a lock wait's line names a path (input): made plain text before a terminal shows it",
    ("progress", "textsafe"): "a progress line names input (a path, a subject): made plain text by the one function "
                              "that strips what a terminal acts on",
}


def group_of(module: str) -> str:
    """``c128patch.series.plan`` -> ``series``; ``c128patch`` -> ``c128patch``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, imported c128patch module) for every import statement in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "c128patch"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                found.append((node.lineno, f"<relative import: level {node.level}>"))
            elif node.module and node.module.split(".")[0] == "c128patch":
                found.append((node.lineno, node.module))
    return found


def violations(edges: list[tuple[str, int, str]]) -> list[str]:
    """Each (importer, line, imported) edge that points up or across without a reason in ACROSS."""
    bad = []
    for importer, line, imported in edges:
        if imported.startswith("<relative"):
            bad.append(f"{importer}:{line}: {imported} (write imports absolute: from c128patch.<group>...)")
            continue
        src, dst = group_of(importer), group_of(imported)
        if src not in LAYERS or dst not in LAYERS:
            bad.append(f"{importer}:{line}: {src if src not in LAYERS else dst!r} has no layer in LAYERS")
        elif src == dst or LAYERS[dst] < LAYERS[src] or (src, dst) in ACROSS:
            continue
        else:
            how = "across" if LAYERS[dst] == LAYERS[src] else "up"
            bad.append(f"{importer}:{line}: imports {imported} ({how}: {src} -> {dst})")
    return bad


def package_edges() -> list[tuple[str, int, str]]:
    return [(module_name(p), line, mod) for p in sorted(PACKAGE.rglob("*.py")) for line, mod in imports_of(p)]


def test_every_import_in_the_package_points_down_the_layers():
    assert violations(package_edges()) == []


def test_every_module_belongs_to_a_layer():
    groups = {group_of(module_name(p)) for p in PACKAGE.rglob("*.py")}
    assert groups <= set(LAYERS), f"place these in LAYERS: {sorted(groups - set(LAYERS))}"


def test_package_top_level_holds_only_the_base_modules():
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert top == ["__init__", "__main__", "errors", "exitcodes", "git", "jsonio", "procs", "progress", "textsafe"]


@pytest.mark.parametrize("edge, message", [
    (("c128patch.series.plan", 3, "c128patch.ops.apply"), "up: series -> ops"),
    (("c128patch.smoke.kernel", 3, "c128patch.capacity.model"), "across: smoke -> capacity"),
    (("c128patch.ops.apply", 3, "c128patch.cli.common"), "up: ops -> cli"),
    (("c128patch.git", 3, "c128patch.series.manifest"), "up: git -> series"),
    (("c128patch.ops.apply", 3, "<relative import: level 1>"), "write imports absolute"),
    (("c128patch.newthing.x", 3, "c128patch.git"), "has no layer"),
], ids=["up", "across", "into-cli", "git-up", "relative", "unplaced"])
def test_the_check_refuses_a_forbidden_edge(edge, message):
    (bad,) = violations([edge])
    assert message in bad


@pytest.mark.parametrize("edge", [
    ("c128patch.cli.apply", 1, "c128patch.ops.apply"),
    ("c128patch.wheel.srcbuild", 1, "c128patch.ops.apply"),
    ("c128patch.ops.rebase", 1, "c128patch.ops.refresh"),
    ("c128patch.series.provenance", 1, "c128patch"),
], ids=["down", "declared-across", "same-group", "package-face"])
def test_the_check_allows_a_downward_edge(edge):
    assert violations([edge]) == []


def test_nothing_outside_cli_imports_cli():
    users = sorted(f"{src}:{line}" for src, line, dst in package_edges()
                   if group_of(dst) == "cli" and group_of(src) not in ("cli", "__main__"))
    assert users == []


def import_cycles(edges: list[tuple[str, int, str]]) -> list[list[str]]:
    """Every cycle of module imports (lazy and TYPE_CHECKING ones included), each as the path that closes it."""
    graph: dict[str, set[str]] = {}
    for src, _, dst in edges:
        if not dst.startswith("<") and dst != src:
            graph.setdefault(src, set()).add(dst)
    state: dict[str, int] = {}
    path: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def test_no_module_imports_itself_through_others():
    assert import_cycles(package_edges()) == []


def test_the_cycle_check_finds_a_cycle():
    edges = [("c128patch.fit.a", 1, "c128patch.fit.b"), ("c128patch.fit.b", 2, "c128patch.fit.a")]
    assert import_cycles(edges) == [["c128patch.fit.a", "c128patch.fit.b", "c128patch.fit.a"]]
