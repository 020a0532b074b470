"""A conflict block's upstream commits are read from `git blame --porcelain` (helper 176, issue 36 rule 4).

Its output holds the code's lines (a tab, then the line) and each commit's summary and author, upstream's text:
a blank line in the block made a line with no first word (IndexError: a traceback out of `watch` and `rebase`
on any upstream whose conflicting lines hold one), and a subject holding U+2028 (which `str.splitlines` splits at)
put a word of the subject's choosing at the start of a line, read as a commit id."""

from __future__ import annotations

import subprocess

from c128patch.git import Git
from c128patch.ops.conflicts import analyze

BASE = "".join(f"line {i}\n" for i in range(1, 13))


def _commit(repo, text: str, subject: str) -> str:
    (repo / "f.py").write_text(text)
    env = {"GIT_AUTHOR_NAME": "u", "GIT_AUTHOR_EMAIL": "u@x", "GIT_COMMITTER_NAME": "u",
           "GIT_COMMITTER_EMAIL": "u@x", "PATH": "/usr/bin:/bin", "HOME": str(repo)}
    subprocess.run(["git", "-C", str(repo), "add", "f.py"], check=True, env=env)
    subprocess.run(["git", "-C", str(repo), "commit", "-qm", subject], check=True, env=env)
    return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, env=env,
                          capture_output=True, text=True).stdout.strip()


def test_a_blank_line_and_a_forged_id_in_a_subject_give_the_commits_that_touched_the_block(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    base = _commit(tmp_path, BASE, "base")
    lines = BASE.splitlines(keepends=True)
    decoy = _commit(tmp_path, "".join(lines[:10] + ["decoy 11\n"] + lines[11:]), "decoy touches line 11")
    forged = f"upstream \u2028{decoy} forged id"  # the subject puts the decoy's id at the start of a "line"
    new = lines[:3] + ["changed 4\n", "\n", "changed 6\n"] + lines[6:10] + ["decoy 11\n"] + lines[11:]
    onto = _commit(tmp_path, "".join(new), forged)
    ours = "changed 4\n\nchanged 6\n"
    text = "".join(lines[:3]) + "<<<<<<<\n" + ours + "=======\nmine 4\nline 5\nline 6\n>>>>>>>\n" + "".join(
        new[6:])
    blocks = analyze(Git(tmp_path), "f.py", text, "", head=onto, old=base, onto=onto)
    assert len(blocks) == 1 and blocks[0].lines == (4, 6)
    assert [u.split(" ", 1)[0] for u in blocks[0].upstream] == [onto[:len(blocks[0].upstream[0].split(" ")[0])]]
