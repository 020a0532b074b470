"""The env reference: every environment variable the series adds or reads.

Kept in the manifest as ``[[gates]]`` tables (patches/series.toml), one per variable:

| field | meaning |
| --- | --- |
| name | the variable (``SGLANG_...``) |
| declared_by | ``series`` (an entry declares it in ``srt/environ.py``) or ``upstream`` (sglang's own: the series reads it, or acts only with it) |
| type | ``bool``, ``str``, ``int`` or ``float`` (sglang's ``EnvBool``/``EnvStr``/``EnvInt``/``EnvFloat``) |
| default | the declared default as ``environ.py`` writes it (``False``, ``"static"``) |
| enables | what setting it does |
| requires | gates that must be set for it to do anything |
| conflicts | gates that must not be set with it |
| notes | the launch flags it acts with, limits, what else it does not go with |
| choices | a ``str`` gate's only values sglang takes (it refuses any other at launch) |

The reference is documentation: it is not part of the series digest (changing a sentence does not
change a wheel). ``gate_problems`` is what ``lint`` checks against the series' own files: every
entry's gate is a gate here; every ``SGLANG_*`` name on a line a patch adds, or in an overlay
source, is a gate here; a ``series`` gate is declared by a line a patch adds (``NAME = EnvBool(False)``)
with the type and default the table says; ``requires``/``conflicts`` name gates of the table.
``declaration_problems`` checks an ``upstream`` gate against upstream's ``environ.py`` the same
way. ``render_markdown`` is the table docs/gates.md carries (a test keeps the two equal).
"""  # noqa: E501  a markdown table row cannot wrap

from __future__ import annotations

import ast
import json
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from c128patch.errors import C128Error
from c128patch.series.paths import duplicates
from c128patch.textsafe import cell, md, md_cell

DECLARERS = ("series", "upstream")
TYPES = {"bool": "EnvBool", "str": "EnvStr", "int": "EnvInt", "float": "EnvFloat"}
_NAME = re.compile(r"^SGLANG_[A-Z0-9_]+$")
_MENTION = re.compile(r"\bSGLANG_[A-Z0-9_]+\b")
_DECLARATION = re.compile(r"^\s*(SGLANG_[A-Z0-9_]+)\s*=\s*(Env[A-Za-z]+)\((.*)\)\s*(#.*)?$")
_REQUIRED = ("name", "declared_by", "type", "default", "enables")
ENVIRON_PATH = "python/sglang/srt/environ.py"


@dataclass(frozen=True)
class Gate:
    name: str
    declared_by: str
    type: str
    default: str
    enables: str
    requires: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    notes: str = ""
    choices: tuple[str, ...] = ()

    def to_toml(self) -> dict[str, Any]:
        """Its table: the optional fields only when set."""
        return {key: list(value) if isinstance(value, tuple) else value for key, value in asdict(self).items()
                if value or key in _REQUIRED}


def _text(raw: dict, key: str, where: str, required: bool = True) -> str:
    value = raw.get(key, "")
    if not isinstance(value, str) or (required and not value):
        raise C128Error(f"{where}: '{key}' must be a non-empty string")
    return value


def _names(raw: dict, key: str, where: str) -> tuple[str, ...]:
    value = raw.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and _NAME.match(v) for v in value):
        raise C128Error(f"{where}: '{key}' must be a list of SGLANG_* names")
    return tuple(value)


def _choices(raw: dict, where: str) -> tuple[str, ...]:
    value = raw.get("choices", [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v.isprintable() and v for v in value):
        raise C128Error(f"{where}: 'choices' must be a list of non-empty strings")
    return tuple(value)


def default_value(gate: Gate) -> Any:
    """The default as a value (``"static"`` for the text ``\"static\"``); None where it is no literal."""
    try:
        return ast.literal_eval(gate.default)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None


def parse_gates(raw: Any, path: Path) -> list[Gate]:
    """The ``[[gates]]`` tables of a manifest, validated (one line naming the gate and the field)."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise C128Error(f"{path}: 'gates' must be an array of tables ([[gates]])")
    gates = []
    for i, item in enumerate(raw):
        where = f"{path}: gate #{i + 1}"
        if not isinstance(item, dict):
            raise C128Error(f"{where}: must be a table")
        name = _text(item, "name", where)
        where = f"{path}: gate {name}"
        if not _NAME.match(name):
            raise C128Error(f"{where}: the name must be SGLANG_ followed by capitals, digits and _")
        unknown = set(item) - {f.name for f in fields(Gate)}
        if unknown:
            raise C128Error(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
        gate = Gate(*(_text(item, key, where) for key in _REQUIRED), _names(item, "requires", where),
                    _names(item, "conflicts", where), _text(item, "notes", where, required=False),
                    _choices(item, where))
        for key, allowed in (("declared_by", DECLARERS), ("type", TYPES)):
            if getattr(gate, key) not in allowed:
                raise C128Error(f"{where}: {key} must be one of {', '.join(allowed)}, not {getattr(gate, key)!r}")
        if gate.choices and gate.type != "str":
            raise C128Error(f"{where}: 'choices' is for a str gate, not a {gate.type} one")
        gates.append(gate)
    dupes = duplicates(g.name for g in gates)
    if dupes:
        raise C128Error(f"{path}: duplicate gate(s) {', '.join(dupes)}")
    return gates


def declarations(text: str) -> dict[str, tuple[str, str]]:
    """name -> (EnvField class, default as written) for each ``NAME = EnvX(default)`` line."""
    return {m.group(1): (m.group(2), m.group(3).strip()) for m in map(_DECLARATION.match, text.splitlines()) if m}


def declaration_problems(gate: Gate, declared: dict[str, tuple[str, str]], where: str) -> list[str]:
    """What is wrong with ``gate`` against the declarations found in ``where`` (empty: it agrees)."""
    if gate.name not in declared:
        return [f"gate {gate.name} ({gate.declared_by}) is not declared in {where}"]
    cls, default = declared[gate.name]
    problems = []
    if cls != TYPES[gate.type]:
        problems.append(f"gate {gate.name}: {where} declares it as {cls}, the reference says {gate.type}")
    if default != gate.default:
        problems.append(f"gate {gate.name}: {where} declares the default {default}, the reference says {gate.default}"
                        + _quoting_hint(default, gate.default))
    return problems


def _quoting_hint(declared: str, reference: str) -> str:
    """What to write when ``reference`` is ``declared``'s string without its quotes (``INFO`` for ``"INFO"``): the
    reference holds the default as ``environ.py`` writes it, a Python literal (``None`` is not ``"None"``)."""
    try:
        value = ast.literal_eval(declared)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return ""
    if not isinstance(value, str) or value != reference:
        return ""
    toml = f"'{declared}'" if "'" not in declared else json.dumps(declared)  # a TOML literal string, else basic
    return (f"; the reference holds the default as environ.py writes it, a Python literal with its quotes: write "
            f"default = {toml} in its [[gates]] row")


@dataclass
class SeriesText:
    """What the series itself writes: the lines its patches add and its overlay sources."""

    added: dict[str, list[str]] = field(default_factory=dict)  # entry -> added lines (every patch file)
    overlays: dict[str, str] = field(default_factory=dict)  # entry -> source text


def gate_problems(gates: list[Gate], entry_gates: dict[str, str], text: SeriesText) -> list[tuple[str, str]]:
    """(entry or gate, message) for each way the reference and the series disagree."""
    known = {g.name: g for g in gates}
    found = [(entry, f"gate {gate} is not in the env reference ([[gates]] in the manifest)")
             for entry, gate in entry_gates.items() if gate and gate not in known]
    mentioned: dict[str, str] = {}
    for entry, source in [*((e, "\n".join(lines)) for e, lines in text.added.items()), *text.overlays.items()]:
        for name in _MENTION.findall(source):
            mentioned.setdefault(name, entry)
    found += [(entry, f"{name} is read or written by the series but is not in the env reference")
              for name, entry in sorted(mentioned.items()) if name not in known]
    added = declarations("\n".join(line for lines in text.added.values() for line in lines))
    for gate in gates:
        for other in (*gate.requires, *gate.conflicts):
            if other not in known:
                found.append((gate.name, f"gate {gate.name} names {other}, which is not in the env reference"))
        if gate.choices and default_value(gate) not in (None, *gate.choices):  # None: the default's own line says
            found.append((gate.name, f"gate {gate.name}: its default {gate.default} is not one of its choices "
                                     f"({', '.join(gate.choices)})"))
        if gate.declared_by == "series":
            found += [(gate.name, p) for p in declaration_problems(gate, added, "a patch of the series")]
        elif gate.name in added:
            found.append((gate.name, f"gate {gate.name} is declared_by upstream but a patch of the series declares it: "
                                     f'write declared_by = "series" in its [[gates]] row of the manifest'))
    return found


def render_markdown(gates: list[Gate], entry_gates: dict[str, str], layer_of: dict[int, str] | None = None) -> str:
    """The env reference as a Markdown table (docs/gates.md carries it; `c128patch gates --markdown`); a layer's gate
    (``layer_of``: by ``id``) is marked with its layer."""
    layer_of = layer_of or {}
    lines = ["| variable | declared by | default | what setting it does | needs | conflicts with | entries | notes |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for g in gates:
        entries = ", ".join(f"`{e}`" for e, gate in entry_gates.items() if gate == g.name) or "-"
        lines.append("| " + " | ".join([
            f"`{g.name}`", f"{g.declared_by} (layer `{layer_of[id(g)]}`)" if id(g) in layer_of else g.declared_by,
            f"{cell(md(g.default))} ({_kind(g)})", md_cell(g.enables),
            ", ".join(f"`{n}`" for n in g.requires) or "-", ", ".join(f"`{n}`" for n in g.conflicts) or "-",
            entries, md_cell(g.notes) or "-"]) + " |")  # a series' or layer's text is data (docs/security.md)
    return "\n".join(lines) + "\n"


def _kind(gate: Gate) -> str:
    """``str``, or ``str: static, compact`` for a gate with choices."""
    return f"{gate.type}: one of " + ", ".join(cell(md(c)) for c in gate.choices) if gate.choices else gate.type
