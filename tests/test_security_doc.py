"""docs/security.md names, per rule, the function that enforces it and the test that proves it: each one exists."""

from __future__ import annotations

import importlib
import re

from support import REPO_ROOT

DOC = (REPO_ROOT / "docs" / "security.md").read_text()


def rows() -> list[tuple[str, list[str], list[str]]]:
    """The rule table: (rule, dotted names, tests/FILE::NAME)."""
    table = DOC.split("## Each rule, what enforces it, what proves it", 1)[1].split("\n## ", 1)[0]
    cells = [line.strip("|").split("|") for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    return [(rule.strip(), re.findall(r"`([\w.]+)`", by), re.findall(r"`(tests/[\w.]+::\w+)`", proof))
            for rule, by, proof in cells[1:]]


def test_every_rule_names_a_function_and_a_test_that_exist():
    table = rows()
    assert len(table) >= 20, table
    for rule, names, tests in table:
        assert names and tests, rule
        for name in names:
            parts = name.split(".")
            for cut in range(len(parts), 0, -1):  # the longest importable prefix, then attributes
                try:
                    obj = importlib.import_module(".".join(parts[:cut]))
                except ImportError:
                    continue
                for attr in parts[cut:]:
                    assert hasattr(obj, attr), (rule, name)
                    obj = getattr(obj, attr)
                break
            else:
                raise AssertionError((rule, name))
        for test in tests:
            path, name = test.split("::")
            assert re.search(rf"^def {name}\(", (REPO_ROOT / path).read_text(), re.M), (rule, test)


def test_every_test_the_doc_names_anywhere_exists():
    sources = "".join(p.read_text() for p in (REPO_ROOT / "tests").glob("test_*.py"))
    for name in set(re.findall(r"`(test_\w+)`", DOC)) | {t.split("::")[1] for _, _, ts in rows() for t in ts}:
        assert re.search(rf"^def {name}\(", sources, re.M), name
