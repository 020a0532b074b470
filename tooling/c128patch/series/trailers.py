"""The trailers c128patch writes into commit messages and patch headers: each name is defined here
only (stdlib only: reading a layer must not pull in the diff parser)."""

from __future__ import annotations

import re

ENTRY_TRAILER = "C128patch-Entry"  # the entry a commit or patch file is ("<layer>/<entry>" for a layer's)
SERIES_TRAILER = "C128patch-Series"  # the series name and version an overlay commit came from
GATE_TRAILER = "C128patch-Gate"  # the env gate that turns the entry on ("none (<why>)": always on)
_NAMES = {name.lower(): name for name in (ENTRY_TRAILER, SERIES_TRAILER, GATE_TRAILER)}
# as git reads a trailer: the name in any case, blanks before the colon
_TRAILER = re.compile(r"^(c128patch-[a-z-]+)[ \t]*:[ \t]*(.*)$", re.MULTILINE | re.IGNORECASE)
_FROM = re.compile(rb"From .*\d.\d\d:\d\d\s*(\d+)[^:]*", re.DOTALL)  # the last colon's digits, then a year


def find_trailers(text: str) -> list[tuple[str, str]]:
    """(name, value) of every ``C128patch-*`` trailer line in ``text``, in order, in any spelling git
    takes for one (case, blanks before the colon), named as defined here."""
    return [(_NAMES.get(name.lower(), name), value) for name, value in _TRAILER.findall(text)]


def _splits(line: bytes) -> bool:
    """Does ``git mailsplit`` start a message at ``line`` (its ``is_from_line``: ``From `` ... ``D:DD:DD YEAR``)?"""
    return bool((m := _FROM.fullmatch(line)) and len(line) >= 19 and int(m.group(1)) > 90)


def message_trailers(data: bytes) -> list[tuple[str, str]]:
    """``find_trailers`` of a patch file's message as ``git am`` reads it (its transfer encoding, quoted-printable
    or base64, and its charset decoded); a file ``git am`` would split into several messages (``_splits``) or a
    multipart one refused (ValueError)."""
    import email  # ~20 ms: only where a layer's patch is read (not status on a tree without layers)
    import email.policy

    if any(_splits(line) for line in data.split(b"\n")[1:]):
        raise ValueError("it holds more than one message (a 'From ... HH:MM:SS YEAR' line after the first)")
    msg = email.message_from_bytes(data.split(b"\n", 1)[-1] if data.startswith(b"From ") else data,
                                   policy=email.policy.compat32)
    charset = msg.get_content_charset() or "utf-8"  # git am converts the body from it (UTF-7: "+AEM-" is "C")
    if msg.is_multipart():
        raise ValueError("it is a multipart message")
    coded = (msg.get("Content-Transfer-Encoding") or "").strip().lower() in ("base64", "quoted-printable")
    body = msg.get_payload(decode=coded)  # as git am: those two decoded, any other (x-uuencode: its text kept) not
    body = body if isinstance(body, bytes) else body.encode("ascii", "surrogateescape")
    try:
        return find_trailers(body.decode(charset, errors="replace").split("\n---\n", 1)[0])
    except LookupError:
        raise ValueError(f"its charset {charset!r} is not one this reads") from None
