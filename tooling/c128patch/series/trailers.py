"""The trailers c128patch writes into commit messages and patch headers: each name is defined here
only (stdlib only: reading a layer must not pull in the diff parser)."""

from __future__ import annotations

import re

ENTRY_TRAILER = "C128patch-Entry"  # the entry a commit or patch file is ("<layer>/<entry>" for a layer's)
SERIES_TRAILER = "C128patch-Series"  # the series name and version an overlay commit came from
GATE_TRAILER = "C128patch-Gate"  # the env gate that turns the entry on ("none (<why>)": always on)
_NAMES = {name.lower(): name for name in (ENTRY_TRAILER, SERIES_TRAILER, GATE_TRAILER)}
# as git reads a trailer: the name in any case, blanks before the colon, its value continued on each following line
# that starts with a blank (helper 167: a folded "C128patch-Entry: acme/x\n c128-..." read as "acme/x" passed lint;
# git's value was both lines, and apply's read of the branch split its record at the newline: a traceback)
_TRAILER = re.compile(r"^(c128patch-[a-z-]+)[ \t]*:[ \t]*(.*(?:\n[ \t]+\S.*)*)$", re.MULTILINE | re.IGNORECASE)
_YEAR = re.compile(rb"[ \t\n\v\f\r]*([+-]?\d+)")  # strtol's reading: blanks, a sign, digits


def find_trailers(text: str) -> list[tuple[str, str]]:
    """(name, value) of every ``C128patch-*`` trailer line in ``text``, in order, in any spelling git
    takes for one (case, blanks before the colon), named as defined here; a folded value unfolded as git's
    ``%(trailers:unfold)`` does (its lines joined by one space)."""
    return [(_NAMES.get(name.lower(), name), re.sub(r"[ \t]*\n[ \t]*", " ", value))
            for name, value in _TRAILER.findall(text)]


def _splits(line: bytes) -> bool:
    """Does ``git mailsplit`` start a message at ``line``, with its CR or without (``is_from_line``: ``From ``, then the
    last colon but the line's final character, digits at -4, -2, -1, +1 and +2 of it and strtol's year at +3 past 90:
    no blank before the year needed, a sign or a colon after it taken)?"""
    for text in {line, line.removesuffix(b"\r")}:  # (git am strips the CR of a CRLF line unless am.keepcr)
        colon = text.rfind(b":", 5, len(text) - 1)
        digits = [text[colon + i:colon + i + 1] for i in (-4, -2, -1, 1, 2)]
        if (text.startswith(b"From ") and len(text) >= 19 and colon > 4 and all(d.isdigit() for d in digits)
                and (year := _YEAR.match(text, colon + 3)) and int(year.group(1)) > 90):
            return True
    return False


PLAIN_ENCODINGS = ("7bit", "8bit", "binary")  # the transfer encodings git am reads as they are


def _headers(data: bytes) -> list[tuple[str, str]]:
    """(name lowered, value) of each header of a patch file's mail, folded lines joined: every line up to the first
    blank one (git mailinfo stops there or sooner, at a line that is no header: this reads at least its headers)."""
    out: list[tuple[str, str]] = []
    for line in (data.split(b"\n", 1)[-1] if data.startswith(b"From ") else data).split(b"\n"):
        text = line.decode("utf-8", errors="replace")
        if text[:1] in (" ", "\t") and out:  # a folded line: git joins it to the header before, blank or not
            out[-1] = (out[-1][0], f"{out[-1][1]} {text.strip()}")
            continue
        if not text.strip():
            break
        name, _, value = text.partition(":")
        out.append((name.strip().lower(), value.strip()))
    return out


def check_message(data: bytes, *, several: bool = False) -> None:
    """Refuse (ValueError) a patch file ``git am`` would read otherwise than its text says: a message whose body is in
    a transfer encoding (quoted-printable, base64: git am decodes it, so a diff no check reads could be in it), a
    multipart or ``format=flowed`` one (git mailinfo unwraps and unstuffs every line of a flowed one, its diff too);
    and, unless ``several``, a file ``git am`` splits into several messages (``_splits``: a layer's entry is one
    message, its trailers the first's). Every reader of a patch file calls it (``message_trailers``: ``load_layer``;
    ``patchfile._parse``, each message of a series' file: every diff reader)."""
    lines = data.split(b"\n")
    starts = [0, *(i for i, line in enumerate(lines) if i and _splits(line))]
    if len(starts) > 1 and not several:
        raise ValueError("it holds more than one message (a 'From ... HH:MM:SS YEAR' line after the first)")
    for start, end in zip(starts, [*starts[1:], len(lines)]):
        for name, value in _headers(b"\n".join(lines[start:end])):
            if name == "content-transfer-encoding" and value.lower() not in PLAIN_ENCODINGS:
                raise ValueError(f"its body is in transfer encoding {value!r}, which git am decodes and no check "
                                 f"reads (only {', '.join(PLAIN_ENCODINGS)}: make it with git format-patch)")
            if name == "content-type" and "=?" in value:  # git mailinfo decodes it first: a multipart one hid there
                raise ValueError(f"its Content-Type holds an RFC 2047 encoded word ({value}), which git am decodes "
                                 "before it reads it and no check reads")
            if name == "content-type" and any(word in value.lower() for word in ("multipart", "boundary=", "flowed")):
                raise ValueError(f"it is a {'format=flowed' if 'flowed' in value.lower() else 'multipart'} message "
                                 f"(Content-Type: {value}), which git am rewraps or splits and no check reads")


def message_trailers(data: bytes) -> list[tuple[str, str]]:
    """``find_trailers`` of a patch file's message as ``git am`` reads it (its charset decoded); a file
    ``check_message`` refuses is a ValueError (so no transfer encoding is left to decode)."""
    import email  # ~20 ms: only where a layer's patch is read (not status on a tree without layers)
    import email.policy

    check_message(data)
    msg = email.message_from_bytes(data.split(b"\n", 1)[-1] if data.startswith(b"From ") else data,
                                   policy=email.policy.compat32)
    charset = msg.get_content_charset() or "utf-8"  # git am converts the body from it (UTF-7: "+AEM-" is "C")
    if msg.is_multipart():  # (check_message refused it by its header already)
        raise ValueError("it is a multipart message")
    body = msg.get_payload(decode=True)  # its bytes (no transfer encoding is left): not decoded by the parser, which
    # had decoded a non-ASCII character of the diff already and refused the layer over it ('ascii' codec can't encode)
    try:
        return find_trailers(body.decode(charset, errors="replace").split("\n---\n", 1)[0])
    except LookupError:
        raise ValueError(f"its charset {charset!r} is not one this reads") from None
