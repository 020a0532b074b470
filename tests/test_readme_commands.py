"""README starts with the job and stays short; docs/commands.md is every command's own `--help`, current; every
`c128patch` command line in README and docs parses with the real CLI, and the cheap ones run as written."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import click
import pytest

from c128patch.cli import COMMANDS, main
from support import RELEASES, REPO_ROOT, invoke

DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]
ENV = re.compile(r"[A-Z_][A-Z0-9_]*=\S*")


def command_lines(text: str) -> list[str]:
    """The `c128patch` lines of the shell and untagged blocks (``$ `` lines of any block), continuations joined; a
    synopsis (``[--opt]``, ``(a | b)``) or a table of output (``(median, s)``) is not a command."""
    lines = []
    for lang, body in re.findall(r"```(\w*)\n(.*?)```", text, re.S):
        for line in body.replace("\\\n", " ").splitlines():
            line = line.strip()
            if lang not in ("bash", "sh", "") and not line.startswith("$ "):
                continue
            words = shlex.split(line.removeprefix("$ "), comments=True)
            while words and ENV.fullmatch(words[0]):
                words.pop(0)
            if words[:1] == ["c128patch"] and not re.search(r"\s[\[(]", line):
                lines.append(shlex.join(words))
    return lines


ALL = [(doc.relative_to(REPO_ROOT).as_posix(), line) for doc in DOCS for line in command_lines(doc.read_text())]


def parse(line: str) -> None:
    """Parse ``line`` as the CLI would (verb, subcommand, options, values), running nothing; a path option
    naming a file that exists only on the reader's machine is not an error of the line."""
    words = shlex.split(line)[1:]
    ctx = click.Context(main, info_name="c128patch", **main.context_settings)
    command = main
    while isinstance(command, click.Group) and words:
        name = words.pop(0)
        found = command.get_command(ctx, name)
        assert found is not None, f"{line}: no command {name!r}"
        command, ctx = found, click.Context(found, info_name=name, parent=ctx)
    try:
        command.make_context(ctx.info_name, words, parent=ctx.parent)
    except click.BadParameter as exc:
        assert "does not exist" in exc.format_message(), f"{line}: {exc.format_message()}"
    except click.UsageError as exc:
        pytest.fail(f"{line}: {exc.format_message()}")


def test_the_docs_hold_commands_to_check():
    docs = {doc for doc, _ in ALL}
    assert {"README.md", "docs/capacity.md", "docs/deploy.md", "docs/smoke.md", "docs/wheels.md"} <= docs
    assert "c128patch apply --sglang-rev v0.5.23" in [line for _, line in ALL]


@pytest.mark.parametrize("doc, line", ALL)
def test_every_command_in_readme_and_docs_parses_with_the_real_cli(doc, line):
    parse(line)


def test_the_parse_check_catches_a_wrong_verb_flag_or_value():
    for line in ("c128patch aply --sglang-rev v0.5.23", "c128patch apply --sglang-revv v0.5.23",
                 "c128patch smoke kernl --tree x", "c128patch capacity --preset nope"):
        with pytest.raises((AssertionError, pytest.fail.Exception)):
            parse(line)


@pytest.mark.parametrize("line", sorted({line for _, line in ALL if line.startswith(("c128patch capacity",
                                                                                      "c128patch gates"))}))
def test_the_cheap_commands_run_as_written(line):
    res = invoke(*shlex.split(line)[1:], as_json=False)
    assert res.code == 0, res.err


def test_docs_commands_is_every_commands_own_help_as_of_now():
    # a fresh process: click caches each command's help option on first use, so one rendered in this
    # worker after another test's bare Context would lose "-h"
    res = subprocess.run([sys.executable, str(REPO_ROOT / "ci" / "write_commands_doc.py"), "--check"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    text = (REPO_ROOT / "docs" / "commands.md").read_text()
    for verb in COMMANDS:
        assert f"\n## `c128patch {verb}`\n\n```text\nUsage: c128patch {verb} " in text
    assert "\n## `c128patch smoke kernel`\n" in text and "\n## `c128patch layer add-entry`\n" in text


def test_the_readme_starts_with_the_job_and_gives_one_line_per_verb():
    text = (REPO_ROOT / "README.md").read_text()
    lines = text.splitlines()
    assert len(lines) <= 120
    first_screen = "\n".join(lines[:30])
    assert "pip install ./c128patch" in first_screen and "c128patch apply --sglang-rev" in first_screen
    assert text.index("## The production path") < text.index("## Development")
    rows = [line.split(" | ")[0] for line in lines if line.startswith("| `")]
    for verb in COMMANDS:
        assert sum(f"`{verb}" in row or f"/ `{verb}" in row for row in rows) == 1, verb
    block = text.split("\n## Development\n", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    assert block.splitlines()[-1] == 'python -m pytest -m "not heavy"'  # .ci/run reads it: its last line, the tests


def test_the_development_venv_takes_a_current_pip():
    """CI's venv is the Development block's: Python 3.11's bundled pip 23.2 spent ~44 CPU-s more of each tier
    environment build (the heavy tier builds two) in tag checks of the index's links (pip 26: 59 CPU-s to install
    v0.5.23's lock against 103 on this machine's index). ``--upgrade-deps`` takes the index's pip."""
    text = (REPO_ROOT / "README.md").read_text()
    block = text.split("\n## Development\n", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    assert block.splitlines()[0].startswith("python3 -m venv --upgrade-deps .venv "), block


def test_check_alone_checks_every_release_the_series_supports(sglang_release_repo):
    """docs/layers.md's `c128patch check` as written, in the default run (test_check_predicts, heavy, compares it
    with apply too): no --sglang-rev, the four releases, oldest first."""
    res = invoke("check")
    assert res.code == 0 and [r["rev"] for r in res.out["revs"]] == list(RELEASES), res.err
