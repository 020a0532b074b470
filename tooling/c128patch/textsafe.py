"""Text taken from git (subjects, names, refs, paths) is data: made inert for a terminal (``plain``) or
for Markdown (``md``) before any report or console shows it."""

from __future__ import annotations

import re
from pathlib import PurePath
from typing import Any

# DEL, C1 controls (ESC, BEL, CR, CSI...), bidi controls (U+202E: Trojan Source), zero-width characters (a name
# spelled with U+200B reads as ours): what ``plain`` takes out, and what no series path may hold (``paths.CONTROL``)
HIDDEN = r"\x7f-\x9f\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff"
_CONTROLS = re.compile(rf"[\x00-\x08\x0b-\x1f{HIDDEN}]")  # (and C0 controls but tab and newline)


_UNDECODED = re.compile("[\udc80-\udcff]")  # a byte git gave that is not UTF-8 (``Git.run``: surrogateescape)
_SURROGATE = re.compile("[\ud800-\udfff]")  # (those and any other: no UTF-8 stream or strict JSON reader takes one)


def plain(text: str) -> str:
    """``text`` without the control characters a terminal acts on, nor bidi controls; a byte that is not UTF-8 is
    U+FFFD (no stream can write it)."""
    return _UNDECODED.sub("\ufffd", _CONTROLS.sub("", text))


def decoded(value: Any) -> Any:
    """A --json report ``value`` (dicts, lists, strings, paths) with each surrogate in its strings (a byte that is not
    UTF-8, as ``surrogateescape`` keeps it: a folder named with 0xff) as U+FFFD, as ``plain`` shows it: json.dumps
    wrote it as "\\udcff", which no strict reader takes."""
    if isinstance(value, dict):
        return {decoded(k): decoded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [decoded(v) for v in value]
    if isinstance(value, PurePath):
        value = str(value)
    return _SURROGATE.sub("\ufffd", value) if isinstance(value, str) else value


def one_line(text: str) -> str:
    """``plain`` ``text`` on one line: a line break shown as ``⏎`` (text from a target or a wheel cannot forge a line
    of ours)."""
    return re.sub(r"\r\n|[\r\n\u2028\u2029]", " ⏎ ", plain(str(text)))


_UNSHOWN = re.compile(_CONTROLS.pattern[:-1] + r"\n\r\u2028\u2029\t'\\\\\udc80-\udcff]")  # what a line of ours changes


def shell_quote(word: object) -> str:
    """``shlex.quote``, but a word holding what a printed line cannot show as it is (a newline, a control, a bidi or
    zero-width character, a byte that is not UTF-8: ``plain`` and ``one_line`` change them) in bash's ``$'...'``, each
    such character as its bytes (``\\xHH``): a command printed for a tree path holding one works as printed."""
    import os
    from shlex import quote

    word = str(word)
    if not _UNSHOWN.search(word.replace("'", "").replace("\\", "")):
        return quote(word)
    return "$'" + _UNSHOWN.sub(lambda m: "".join(f"\\x{b:02x}" for b in os.fsencode(m.group(0))), word) + "'"


def shell_join(words: "list[object] | tuple[object, ...]") -> str:
    """``shlex.join`` of ``words``, each through ``shell_quote``."""
    return " ".join(shell_quote(w) for w in words)


def text(value: str):  # -> rich.text.Text (rich is loaded only where a table prints)
    """``value`` for a rich table cell or title: ``plain``, and literal (``[/x]`` raised, ``[link=...]`` was a link)."""
    from rich.text import Text

    return Text(plain(value))


def cell(text: str) -> str:
    """``text`` for a Markdown table cell: its ``|`` escaped, its line breaks spaces."""
    return text.replace("|", "\\|").replace("\n", " ")


_MD_LIVE = {"&": "&amp;", "<": "&lt;", ">": "&gt;", "@": "&#64;", "#": "&#35;", "`": "&#96;"}


def md_cell(text: str) -> str:
    """``text`` for a Markdown table cell, reading as it is: ``plain``, its ``|`` escaped, and no HTML, code span,
    @mention, #ref, link or URL in it live (character references stand for ``< > & @ # ` `` and ``](``, ``://``)."""
    text = re.sub(r"[&<>@#`]", lambda m: _MD_LIVE[m.group(0)], plain(str(text)))
    return cell(re.sub(r"(?i)www\.", lambda m: m.group(0)[:3] + "&#46;", text).replace("](", "]&#40;")
                .replace("://", ":&#47;&#47;"))


def count(n: int, noun: str) -> str:
    """``1 entry``, ``2 entries``, ``1 upstream commit``: ``noun`` singular, its plural by English's plain rules."""
    if n == 1:
        return f"1 {noun}"
    head, last = noun.rsplit(" ", 1) if " " in noun else ("", noun)
    plural = last[:-1] + "ies" if last.endswith("y") and last[-2:-1] not in "aeiou" else last + "s"
    return f"{n} {head + ' ' if head else ''}{plural}"


def some(items: list[str], n: int) -> str:
    """The first ``n`` of ``items``, then how many more."""
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


def md(text: str, lang: str | None = None) -> str:
    """``text`` as literal Markdown: a code span on one line (``one_line``: it sits inside a line, a list item, a
    table cell), or with a ``lang`` a fenced block; the fence is longer than any backtick run in it, so no HTML,
    link, @mention or #ref in it is live."""
    text = plain(str(text)) if lang is not None else one_line(text)
    runs = max(map(len, re.findall(r"`+", text)), default=0)
    if lang is not None:
        fence = "`" * max(3, runs + 1)
        return f"{fence}{lang or ''}\n{text.rstrip(chr(10))}\n{fence}"
    if not text:
        return ""
    pad = " " if text[0] in "` " or text[-1] in "` " else ""
    return f"{'`' * (runs + 1)}{pad}{text}{pad}{'`' * (runs + 1)}"


_LIVE = re.compile(r"(?<![\w])@(?=\w)|#(?=\d)|(?i:\bgh-(?=\d))|(?i:://)|(?i:\bwww\.)")


def inert(text: str) -> str:
    """Plain ``text`` that GitHub reads as it is (a commit message, no Markdown to quote it in): no ``@mention``,
    ``#12``/``GH-12`` reference (after ``closes``/``fixes``: the pull request's merge closed that issue of ours) nor
    URL in it is live (``www.evil.example`` is one to GitHub, as ``https://`` is): ``＠``, ``＃``, ``GH‐``, ``[:]//``
    and ``www[.]`` stand for them."""
    stand_in = {"@": "\uff20", "#": "\uff03", "://": "[:]//"}
    return _LIVE.sub(lambda m: stand_in.get(m.group(0), m.group(0)[:3] + "[.]" if m.group(0).lower() == "www."
                                            else m.group(0)[:2] + "\u2010"), text)
