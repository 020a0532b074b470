"""Does a changed upstream signature still mean the same to our code? Read from the lock's signature texts
(``fit.resolve``'s ``def f(a, b=1)``, ``class C(B): __init__(self, a)``, ``class C(B): (a, b)``): parameters only
added with defaults mean the same to every call; one of our positional arguments landing on another parameter than at
the base (a reorder, a parameter inserted before it), or a keyword of ours that only ``**kwargs`` takes now (a
renamed parameter beside a new ``**kwargs``: silently dropped there), does not, though the call still binds."""

from __future__ import annotations

import ast
import inspect

from c128patch.fit.resolve import signature_of

P = inspect.Parameter
_POSITIONAL = (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)


def parse(text: str) -> tuple[str, inspect.Signature] | None:
    """(what precedes the parameters, the Signature) of a lock signature text; None: it holds no parameter list."""
    for at in (i for i, c in enumerate(text) if c == "("):
        try:
            tree = ast.parse(f"def _{text[at:]}:\n pass")
        except SyntaxError:
            continue
        fn = tree.body[0]
        if isinstance(fn, ast.FunctionDef) and not fn.returns:
            return text[:at], signature_of(fn.args)
    return None


def _same(a: inspect.Parameter, b: inspect.Parameter) -> bool:
    return (a.name, a.kind, str(a.default)) == (b.name, b.kind, str(b.default))


def compatible(old: str, new: str) -> bool:
    """``new`` only adds parameters with defaults to ``old`` (after its positional ones, or keyword-only), the rest
    and what precedes them (a class's bases) unchanged: every call binds each argument as it did at the base."""
    a, b = parse(old), parse(new)
    if a is None or b is None or a[0] != b[0]:
        return False
    was, now = list(a[1].parameters.values()), list(b[1].parameters.values())
    kinds = {p.kind for p in was}
    if P.VAR_POSITIONAL in kinds or P.VAR_KEYWORD in kinds:  # what went there may bind to an added one
        return False
    pos_was, pos_now = [p for p in was if p.kind in _POSITIONAL], [p for p in now if p.kind in _POSITIONAL]
    kw_was = {p.name: p for p in was if p.kind == P.KEYWORD_ONLY}
    kw_now = {p.name: p for p in now if p.kind == P.KEYWORD_ONLY}
    added = pos_now[len(pos_was):] + [p for name, p in kw_now.items() if name not in kw_was]
    return (len(pos_now) >= len(pos_was) and all(map(_same, pos_was, pos_now))
            and all(name in kw_now and _same(p, kw_now[name]) for name, p in kw_was.items())
            and all(p.default is not P.empty for p in added))


def moved(old: str, new: str, shape: str, offset: int) -> str:
    """Where an argument of a call of ``shape`` (``fit.contract``'s ``N,kw=,...``, ``,*``: what a star passes unknown)
    now lands elsewhere: a positional one on another parameter that ``old`` has (a reorder, not a rename): "arg2 went
    to b, now to c"; a keyword that bound a named parameter now only into ``**kwargs``, which may drop it: "k= went
    to k, now to **options"; "" where none does. ``offset``: the parameters binding takes (``self`` of ``__init__``)."""
    a, b = parse(old), parse(new)
    if a is None or b is None or not shape.split(",")[0].isdigit():
        return ""
    parts = shape.split(",")
    was = [p.name for p in a[1].parameters.values() if p.kind in _POSITIONAL][offset:]
    now = [p.name for p in b[1].parameters.values() if p.kind in _POSITIONAL][offset:]
    for i in range(0 if parts[-1] == "*" else min(int(parts[0]), len(was), len(now))):
        if was[i] != now[i] and now[i] in was:
            return f"arg{i + 1} went to {was[i]}, now to {now[i]}"
    named = {p.name for p in b[1].parameters.values() if p.kind not in (P.VAR_POSITIONAL, P.VAR_KEYWORD)}
    rest = next((p.name for p in b[1].parameters.values() if p.kind == P.VAR_KEYWORD), None)
    for key in (k[:-1] for k in parts[1:] if k.endswith("=")):
        if key in a[1].parameters and a[1].parameters[key].kind != P.VAR_KEYWORD and key not in named and rest:
            return f"{key}= went to {key}, now to **{rest}"
    return ""
