"""A layer entry's 3-way merge reads its preimage (the file as the stack before it leaves it on the entry's base):
the verdict of ``check`` and ``apply`` must not depend on whether the release cache (or the tree) holds that blob
already. Before, it got there only once something had replayed the stack on the entry's base, so a cold cache said
"conflict" where a warm one said "applies (3-way)" (docs/layers.md; ops.replay.write_preimages)."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

from c128patch.git import Git
from c128patch.ops.refresh import format_patch
from support import invoke
from test_layers import ENV_PY, commit_on, patch_entry, write_layer


def _cat(git_dir: Path, blob: str) -> bool:
    return subprocess.run(["git", "--git-dir", str(git_dir), "cat-file", "-e", f"{blob}^{{blob}}"],
                          stderr=subprocess.DEVNULL).returncode == 0


def _preimage(patch: bytes, path: str) -> str:
    lines = patch.decode().splitlines()
    at = lines.index(f"diff --git a/{path} b/{path}")
    return next(line for line in lines[at:] if line.startswith("index ")).split()[1].split("..")[0]


def test_a_layer_entry_needing_a_3way_merge_gets_the_same_verdict_whatever_the_cache_holds(
        tmp_path, upstream_clone, sglang_release_repo):
    """Two entries made on v0.5.23: a marker no cache holds (so the second's preimage is new to every object store),
    then the acme change beside our c128-dspark-online-env, which needs a 3-way merge on v0.5.21. Applied on
    v0.5.21 in a tree cloned from the cache before anything replayed the layer there, then checked on v0.5.21 first
    (cold), on v0.5.23, and on v0.5.21 again: every verdict is the same, the entry merged 3-way (before: apply stopped
    and the cold check said it conflicts with c128-dspark-online-env; only after the v0.5.23 check did v0.5.21
    apply)."""
    assert invoke("apply", "--sglang-rev", "v0.5.23", "--repo", upstream_clone).code == 0
    git = Git(worktree=upstream_clone)
    marker = f"# site marker {uuid.uuid4().hex}\n"
    (upstream_clone / ENV_PY).write_text((upstream_clone / ENV_PY).read_text() + marker)
    git.run("add", "--", ENV_PY)
    git.run("commit", "-q", "-m", "site: marker")
    first = format_patch(git, git.head() or "", "site/marker")
    anchor = '    SGLANG_SPEC_TP_SYNC = EnvStr("all")\n'
    sha = commit_on(upstream_clone, ENV_PY, anchor, anchor + "    SGLANG_ACME_SPS_FLOOR = EnvBool(False)\n", "acme")
    second = format_patch(git, sha, "site/acme")
    layer = write_layer(tmp_path / "site", entries=patch_entry("marker", "0001-marker.patch", first)
                        + patch_entry("acme", "0002-acme.patch", second),
                        files={"patches/0001-marker.patch": first, "patches/0002-acme.patch": second})
    pre = _preimage(second, ENV_PY)
    assert not _cat(sglang_release_repo, pre)  # the cold state: nothing replayed the layer there yet

    res = invoke("apply", "--sglang-rev", "v0.5.21", "--tree", tmp_path / "sglang-21", "--layer", layer)
    assert res.code == 0, (res.err, res.out)
    assert [e for e in res.out["entries"] if e["name"] == "site/acme"][0]["applied"] == "3way", res.out["entries"]

    verdicts = []
    for rev in ("v0.5.21", "v0.5.23", "v0.5.21"):
        res = invoke("check", "--sglang-rev", rev, "--layer", layer)
        row = next(e for e in res.out["revs"][0]["entries"] if e["name"] == "site/acme")
        verdicts.append((rev, res.code, row["status"], res.out["revs"][0]["apply"]))
    assert verdicts[0] == verdicts[2], verdicts
    assert verdicts[0][1:3] == (0, "3way"), verdicts
    assert verdicts[1][1:3] == (0, "clean"), verdicts
