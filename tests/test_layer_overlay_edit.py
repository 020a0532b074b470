"""A layer entry that edits a file one of our overlays creates (docs/layers.md): the user's path as the tool prints
it, from the commit on the stacked tree to a verified wheel. Before, lint, apply and wheel passed, but the wheel's
SBOM described the overlay as the wheel holds it (the layer's edit included), so ``verify-wheel`` rejected it
("overlay ...: ... differs from the recorded sha256") and its authenticity could not hold; ``status`` of the fresh
apply said the overlay was "changed by the commit(s) on top" (exit 1, no commit on top). The overlay is now checked
at its place in the chain (``wheel.verify._check_effects``: the later entries' diffs taken back), described as it
writes its file (``wheel.patch._overlay_diff``), and ``status`` takes its bytes only where no later entry edits it."""

from __future__ import annotations

import shutil
from pathlib import Path

from c128patch.git import Git
from support import invoke, printed_command, run_printed
from test_layers import EXAMPLE, ID
from test_wheel import members, tampered

OURS = "python/sglang/srt/speculative/dspark_components/c128_record_streams.py"  # c128-dspark-record-streams-helper


def test_a_layer_entry_editing_our_overlays_file_goes_from_commit_to_a_verified_wheel_as_printed(
        tmp_path, sglang_release_repo, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(EXAMPLE, tmp_path / "layers" / "acme")
    res = invoke("apply", "--sglang-rev", "v0.5.23", "--layer", "layers/acme", "--tree", "sglang-acme",
                 as_json=False)
    assert res.code == 0, res.err
    tree = tmp_path / "sglang-acme"
    (tree / OURS).write_text((tree / OURS).read_text() + "# acme: note on the record streams\n")
    Git(worktree=tree).run(*ID, "commit", "-qam", "acme: note on record streams")

    refresh = invoke("refresh", "--tree", "sglang-acme", as_json=False)
    add = printed_command(refresh.err, "c128patch layer add-entry")
    ran = run_printed(add, cwd=tmp_path)
    assert ran.returncode == 0, (add, ran.stderr)
    edited = (tree / OURS).read_text()
    rebase = printed_command(ran.stdout + ran.stderr, "c128patch rebase ")  # the tree carries the layer: in place
    ran = run_printed(rebase, cwd=tmp_path)
    assert ran.returncode == 0, (rebase, ran.stderr)
    stacked = Path(rebase.split("--tree ", 1)[1].split()[0])
    assert stacked == tree and (stacked / OURS).read_text() == edited

    status = run_printed("c128patch status --json", cwd=stacked)
    assert status.returncode == 0, status.stdout
    wheel = run_printed(f"c128patch wheel --from-release 0.5.23 -o {tmp_path / 'dist'}", cwd=stacked)
    assert wheel.returncode == 0, wheel.stderr
    made = next((tmp_path / "dist").glob("*.whl"))
    verify = invoke("verify-wheel", made, "--layer", "layers/acme")
    assert verify.code == 0, verify.err
    present = {e["name"]: e["status"] for e in verify.out["entries"]}
    assert present["c128-dspark-record-streams-helper"] == present["acme/acme-note-on-record-streams"] == "present"
    assert verify.out["authenticity"]["identical"] > 0, verify.out["authenticity"]

    # still checked: our overlay's own bytes changed where the layer's diff does not reach
    name = "sglang/" + OURS.removeprefix("python/sglang/")
    forged = tampered(made, tmp_path / "forged", {name: members(made)[name].replace(b"import", b"import ", 1)})
    res = invoke("verify-wheel", forged, as_json=False)
    assert res.code == 1 and f"overlay 'c128-dspark-record-streams-helper': {name} (as the wheel has it before the " \
        "entries from 'acme/acme-note-on-record-streams' on) differs from the recorded sha256" in res.err, res.err
