"""docs/capacity.md's tables are the output of the commands written above them, and the command the
docs (and the README) give for PR #32035's numbers reproduces them."""

from __future__ import annotations

import re
import shlex

import pytest

from support import REPO_ROOT, invoke

DOC = REPO_ROOT / "docs" / "capacity.md"
BLOCK = re.compile(r"<!-- capacity:begin (c128patch capacity [^>]*?) -->\n(.*?)<!-- capacity:end -->", re.S)
PR_COMMAND = "c128patch capacity --preset pro --formula 0.5.20 --draft-tokens 6 --budget-gib 39.04"


def blocks() -> list[tuple[str, str]]:
    return BLOCK.findall(DOC.read_text())


def test_the_docs_have_the_generated_tables():
    assert len(blocks()) == 4


@pytest.mark.parametrize("command, table", blocks(), ids=[c.removeprefix("c128patch capacity ") for c, _ in blocks()])
def test_each_docs_table_is_its_commands_output(command: str, table: str):
    res = invoke(*shlex.split(command)[1:], as_json=False)
    assert res.code == 0, res.err
    assert res.text == table


def test_the_pr_command_reproduces_the_prs_full_token_sizes():
    res = invoke(*shlex.split(PR_COMMAND)[1:])
    (row,) = res.out["results"]
    assert (row["off"]["full_tokens"], row["on"]["full_tokens"]) == (2_553_344, 3_167_232)


@pytest.mark.parametrize("doc", ["README.md", "docs/capacity.md"])
def test_the_docs_show_the_command_that_reproduces_the_pr(doc: str):
    assert PR_COMMAND in (REPO_ROOT / doc).read_text()
