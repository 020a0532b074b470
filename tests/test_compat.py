"""fit.compat: a changed upstream signature read from the lock's texts: parameters only added with defaults mean the
same to every call; a positional argument of ours landing on another parameter the base had does not (a reorder, not
a rename), nor a keyword of ours only ``**kwargs`` takes now; anything else (``*args``/``**kwargs`` at the base, a new
required parameter, a changed default or bases) is left to review."""

from __future__ import annotations

import pytest

from c128patch.fit.compat import compatible, moved, parse


def test_parse_reads_the_three_forms_the_lock_writes() -> None:
    assert str(parse("def f(a, b=1)")[1]) == "(a, b=1)"
    head, sig = parse("class C(NamedTuple): (a, b, c=None)")
    assert head == "class C(NamedTuple): " and list(sig.parameters) == ["a", "b", "c"]
    head, sig = parse("class C(A, B): __init__(self, x, *, y='(z)')")
    assert head == "class C(A, B): __init__" and list(sig.parameters) == ["self", "x", "y"]
    assert parse("= torch.Tensor") is None and parse("@property f") is None


@pytest.mark.parametrize("old, new, same", [
    ("def f(a, b)", "def f(a, b, c=())", True),
    ("def f(a, *, k=1)", "def f(a, *, k=1, j=2)", True),
    ("def f(a, b)", "def f(a, b, c)", False),  # a new required one: calls no longer bind
    ("def f(a, *, k=1)", "def f(a, *, k=2)", False),  # a default we may rely on changed
    ("def f(a, b)", "def f(a, c=0, b=1)", False),  # inserted before one of ours
    ("def f(a, *args)", "def f(a, *args, b=1)", False),  # what went to *args may bind to b
    ("def f(a, **kw)", "def f(a, b=1, **kw)", False),  # a keyword that went to **kw now binds to b
    ("class C(A): (a, b)", "class C(A, B): (a, b, c=0)", False),  # the bases changed too
    ("def f(a, b)", "def g(a, b, c=0)", False),
])
def test_compatible_only_where_parameters_were_added_with_defaults(old: str, new: str, same: bool) -> None:
    assert compatible(old, new) is same


@pytest.mark.parametrize("old, new, shape, offset, said", [
    ("def f(batch, verify_input, fwd_stream)", "def f(batch, fwd_stream, verify_input=None)", "3", 0,
     "arg2 went to verify_input, now to fwd_stream"),
    ("class P(NamedTuple): (r, c, w, pin=None)", "class P(NamedTuple): (r, w, c, pin=None)", "4", 0,
     "arg2 went to c, now to w"),
    ("class P(A): __init__(self, c, w)", "class P(A): __init__(self, w, c)", "1", 1, "arg1 went to c, now to w"),
    ("def f(tensors, stream)", "def f(tensors, cuda_stream)", "2", 0, ""),  # a rename: a warning, not this
    ("def f(a, b, c)", "def f(a, c, b)", "1", 0, ""),  # only arg1 passed: it lands where it did
    ("def f(a, b)", "def f(b, a)", "0,a=,b=", 0, ""),  # keywords bind by name
    ("def f(a, b)", "def f(b, a)", "2,*", 0, ""),  # a starred call's positions: unknown, left to the warning
    # helper 131's C5: load_jit's cuda_wrappers= renamed cuda_exports= beside a new **options, our call starred
    ("def load_jit(*names, cuda_files=(), cuda_wrappers=())", "def load_jit(*names, cuda_files=(), cuda_exports=(), "
     "**options)", "2,cuda_files=,cuda_wrappers=,*", 0, "cuda_wrappers= went to cuda_wrappers, now to **options"),
    ("def f(a, **kw)", "def f(a, b=0, **kw)", "1,k=", 0, ""),  # k= went to **kw at the base too
    ("def f(a, k=0)", "def f(a, j=0)", "1,k=", 0, ""),  # k= does not bind now: an error of its own (not this)
])
def test_moved_names_a_positional_argument_landing_on_another_parameter(old, new, shape, offset, said) -> None:
    assert moved(old, new, shape, offset) == said
