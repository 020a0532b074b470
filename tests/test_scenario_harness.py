"""The scenarios' own machinery, in process over a module of a made-up tree. Helper 123: upstream decorating the
worker's `_forward_decode` with `@torch.no_grad()` (harmless) made the tier say `broken`, gates off and on, blaming
our controller: `_with_stand_ins` rebuilt the decorator's wrapper with no closure ("arg 5 (closure) must be
tuple"). A decorated function is rebuilt with its own body over the stand-ins, under the same decorators; an error
of the harness itself is `not run`, naming the harness, never a failure of our code; and an attribute the tree
reads on a scenario's stand-in names the tree's function, never the stand-in, as the upstream definition."""

from __future__ import annotations

import importlib.util
import inspect
import types
from pathlib import Path
from unittest import mock

import pytest

from c128patch.fit import scenarios_runner as runner

TREE = '''import functools

entered = []


def traced(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        entered.append(fn.__name__)
        return fn(*args, **kwargs)
    return wrapper


def helper(x):
    raise AssertionError("the tree's helper ran, not the scenario's stand-in")


class Worker:
    @traced
    def step(self, x, *, scale=2):
        return helper(x), kept(x) * scale


def kept(x):
    return x


def read(stream, batch):
    return batch.seq_lens
'''


def tree_module(tmp_path: Path, text: str = TREE) -> types.ModuleType:
    path = tmp_path / "python" / "sglang" / "worker.py"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("sglang.worker", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_decorated_function_runs_its_own_body_over_the_stand_ins_under_its_decorator(tmp_path):
    tree = tree_module(tmp_path)
    step = runner._with_stand_ins(tree.Worker.step, kept=lambda x: x + 1)
    stood_in, kept = step(None, 3)
    assert isinstance(stood_in, mock.MagicMock) and kept == 8  # the stand-in helper; ``keep``; the default
    assert tree.entered == ["step"]  # the decorator's wrapper ran, over its own globals
    assert inspect.unwrap(step).__code__ is inspect.unwrap(tree.Worker.step).__code__  # upstream's own body
    assert step.__qualname__ == "Worker.step" and tree.Worker.step.__wrapped__.__globals__["helper"] is tree.helper

    def scenario(on: bool) -> None:  # as worker-commit and record-streams drive the tree's decorated step
        assert runner._with_stand_ins(tree.Worker.step, kept=lambda x: x)(None, 3)[1] == 6

    root = str(tmp_path / "python")
    for on in (False, True):  # was: failed, "TypeError: arg 5 (closure) must be tuple", blaming our controller
        assert runner._outcome("worker-commit", scenario, on, root, []) == {"status": "passed", "detail": ""}


def test_torch_no_grad_keeps_its_effect(tmp_path):
    torch = pytest.importorskip("torch")
    tree = tree_module(tmp_path, "import torch\n\nhelper = None\n\n\n@torch.no_grad()\ndef step(x):\n"
                                 "    return torch.is_grad_enabled(), helper(x)\n")  # upstream's own decorator
    with torch.enable_grad():
        grad, stood_in = runner._with_stand_ins(tree.step)(1)
    assert grad is False and isinstance(stood_in, mock.MagicMock)


def test_an_error_of_the_harness_is_not_run_naming_it_never_a_failure_of_ours(tmp_path):
    tree = tree_module(tmp_path)
    root = str(tmp_path / "python")
    # the old `_with_stand_ins` on a decorated function: no frame of the tree (nor ours) ever ran
    raised = lambda on: types.FunctionType(tree.Worker.step.__code__, {}, "step")  # noqa: E731
    for on in (False, True):
        said = runner._outcome("worker-commit", raised, on, root, ["sglang.worker"])
        assert said["status"] == "not run", said
        assert said["detail"].startswith("the scenario harness failed, not the tree's code nor ours (no frame of the "
                                         "tree in its traceback): TypeError: arg 5 (closure) must be tuple (in "), said

    class Wrapping:  # a decorator holding the function it wraps other than in a closure: the harness cannot rebuild
        def __init__(self, fn):
            self.__wrapped__ = fn

        def __call__(self, *args):
            return self.__wrapped__(*args)

    unbuilt = lambda on: runner._with_stand_ins(Wrapping(tree.kept))  # noqa: E731
    said = runner._outcome("worker-commit", unbuilt, True, root, ["sglang.worker"])
    assert said["status"] == "not run" and said["detail"].startswith(
        "the scenario harness (_with_stand_ins) cannot rebuild sglang.worker.kept (sglang/worker.py:"), said


def test_an_attribute_the_tree_reads_on_a_stand_in_names_the_trees_function_not_the_stand_in(tmp_path):
    """Helper 122's b1: upstream's `record_stream_for_v2_verify` took the stream first; our call, in the old order,
    read `seq_lens` on the scenario's stream: the detail named the scenario's SimpleNamespace as upstream's."""
    tree = tree_module(tmp_path)
    root = str(tmp_path / "python")
    for stream in (runner.SimpleNamespace(), mock.MagicMock(spec=[]), type("Stream", (), {})()):
        said = runner._outcome("record-streams", lambda on: tree.read(None, stream), True, root, [])
        assert said["status"] == "failed" and " upstream sglang.worker.read (sglang/worker.py:29): AttributeError: " \
            in said["detail"], said
