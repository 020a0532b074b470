"""One table of exit codes (c128patch/exitcodes.py): no command or core module exits with a literal,
the error classes carry the table's codes, and docs/watch.md, the README and `watch --help` give
watch's outcomes the codes the table does; a mistyped verb is a usage error naming the verb meant."""

from __future__ import annotations

import ast
import re

import pytest

from c128patch import exitcodes
from c128patch.errors import C128Error, ConflictError, Interrupted
from c128patch.fit.watch import EXIT, WatchTimeout
from support import REPO_ROOT, invoke, refused

PACKAGE = REPO_ROOT / "tooling" / "c128patch"


def literal_exits(path) -> list[str]:
    """`sys.exit(<int>)`, `ctx.exit(<int>)` and `exit_code = <int>` (other than 0) in a module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "exit" and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, int) and arg.value:
                found.append(f"{path.name}:{node.lineno}: exit({arg.value})")
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        for target in targets:
            value = getattr(node, "value", None)
            if getattr(target, "id", None) == "exit_code" and isinstance(value, ast.Constant):
                found.append(f"{path.name}:{node.lineno}: exit_code = {value.value}")
    return found


def test_no_literal_exit_codes():
    paths = [p for p in PACKAGE.rglob("*.py") if p.name != "exitcodes.py"]
    assert [hit for p in paths for hit in literal_exits(p)] == []


def test_the_errors_carry_the_tables_codes():
    assert (C128Error.exit_code, ConflictError.exit_code, Interrupted.exit_code, WatchTimeout.exit_code) == (
        exitcodes.USAGE, exitcodes.FAILED, exitcodes.INTERRUPTED, exitcodes.TIMEOUT)
    assert EXIT is exitcodes.WATCH


def test_watch_docs_readme_and_help_give_the_tables_codes():
    doc = (REPO_ROOT / "docs" / "watch.md").read_text()
    table = dict(re.findall(r"^\| `(\w+)` \| (\d+) \|", doc, re.MULTILINE))
    assert {k: int(v) for k, v in table.items()} == exitcodes.WATCH
    assert f"one line on stderr, exit {exitcodes.USAGE}," in " ".join(doc.split())
    readme = " ".join((REPO_ROOT / "README.md").read_text().split())
    for outcome, code in exitcodes.WATCH.items():
        assert re.search(rf"timed out \({code}\)" if outcome == "timeout" else rf"`{outcome}` \((exit )?{code}\b",
                         readme), outcome
    help_text = " ".join(invoke("watch", "--help", as_json=False).text.split())
    assert ", ".join(f"{k} {v}" for k, v in exitcodes.WATCH.items()) + f"; bad input {exitcodes.USAGE}." in help_text


def test_a_verb_mistyped_is_a_usage_error_naming_the_verb_meant():
    line = refused(["aply"], code=exitcodes.USAGE)
    assert line == "c128patch: error: No such command 'aply'; did you mean 'apply'? (see `c128patch --help`)"


def test_a_verb_like_no_other_gets_no_suggestion():
    line = refused(["zzzz"], code=exitcodes.USAGE)
    assert line == "c128patch: error: No such command 'zzzz'. (see `c128patch --help`)"


def test_an_option_of_another_verb_names_the_verb_that_has_it_not_help():
    """click's nearest option was `--help` (`rebase --check`; helper 101): never advice, the verb that has it is."""
    line = refused(["rebase", "--check"], code=exitcodes.USAGE)
    assert line == "c128patch: error: No such option: --check; refresh has it (see `c128patch rebase --help`)"
    line = refused(["status", "--chekc"], code=exitcodes.USAGE)
    assert line == "c128patch: error: No such option: --chekc (see `c128patch status --help`)"


@pytest.mark.parametrize("argv, verb", [(["apply", "--sglang-rev"], "apply"),
                                        (["layer", "add-entry", "--layer"], "layer add-entry")])
def test_an_option_missing_its_value_points_at_the_verbs_own_help(argv, verb):
    """click's parser says it without naming the command: the verb is taken from the words before the option."""
    line = refused(argv, code=exitcodes.USAGE)
    assert line == f"c128patch: error: Option '{argv[-1]}' requires an argument. (see `c128patch {verb} --help`)"
