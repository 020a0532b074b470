"""A scenario whose model of upstream went stale (upstream renamed a field the scenario's stand-in, made as the
series' base has it, still carries) is `not run` with the gates off, naming the field and the tree's reader, not a
failure of the series with upstream's own function as the culprit (helper 99's c08 and c11: noise under a right
`broken`); with the gates on it stays a failure (our code runs there). The runner in process, over a module of a
made-up tree (the tier's own runs of such upstream changes: helper 105, in the session's closing note)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from c128patch.fit import scenarios_runner as runner


def tree_module(tmp_path: Path):
    path = tmp_path / "python" / "sglang" / "reader.py"
    path.parent.mkdir(parents=True)
    path.write_text("def read(pool):\n    return pool.state_pools\n")  # upstream's, after renaming the field
    spec = importlib.util.spec_from_file_location("sglang.reader", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_stand_in_lacking_a_field_upstream_renamed_is_not_run_gates_off_and_failed_gates_on(tmp_path):
    reader = tree_module(tmp_path)
    scenario = lambda on: reader.read(runner.SimpleNamespace(compress_state_pools=[]))  # noqa: E731 (the base's)
    tree = str(tmp_path / "python")
    off = runner._outcome("compressor-callback", scenario, False, tree, [])
    assert off == {"status": "not run", "detail": "the scenario's stand-in SimpleNamespace has no 'state_pools', "
                   "which sglang.reader.read (sglang/reader.py:2) reads (upstream changed it; the scenario models the "
                   "series' base)"}, off
    on = runner._outcome("compressor-callback", scenario, True, tree, [])
    assert on["status"] == "failed" and "AttributeError: 'SimpleNamespace' object has no attribute 'state_pools'" \
        in on["detail"], on


def test_an_object_of_the_tree_lacking_a_field_is_a_failure_gates_off_too(tmp_path):
    """Not a stand-in of the scenario's: the tree's own object lacking what the tree reads is upstream's or ours."""
    reader = tree_module(tmp_path)
    scenario = lambda on: reader.read(type("Pool", (), {})())  # noqa: E731
    assert runner._outcome("compressor-callback", scenario, False, str(tmp_path / "python"), [])["status"] == "failed"
