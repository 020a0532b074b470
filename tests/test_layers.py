"""Local layers (docs/layers.md): a team's folder in the series format, replayed after the series.

The example layer (docs/examples/acme-layer, 3 entries) goes the whole way on the real release
history: apply at its base, rebase across every release, refresh (each layer into its own folder
only), wheel and verify-wheel on all four releases. A layer entry that conflicts with one of ours
stops naming both; a layer with an unsafe path or an unknown base is refused in one line before
anything is written.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from c128patch.errors import C128Error
from c128patch.fit.contract import lock_items
from c128patch.git import Git
from c128patch.ops.refresh import format_patch, refresh_command
from c128patch.series import txn
from c128patch.series.layers import CONFIG, ENV, lookup_layers, stack
from c128patch.series.manifest import load_series
from c128patch.wheel.sbom import LAYER_PREFIX, indexed_properties
from c128patch.wheel.tools import InWheel
from support import (
    RELEASES,
    REPO_ROOT,
    copy_series,
    invoke,
    printed_command,
    refused,
    run_printed,
    small_clone,
    snapshot,
    table_column,
)

EXAMPLE = REPO_ROOT / "docs" / "examples" / "acme-layer"
ID = ["-c", "user.name=acme-dev", "-c", "user.email=dev@acme.invalid"]


def write_layer(dest: Path, name: str = "site", base: str = "v0.5.23", entries: str = "", gates: str = "",
                files: dict[str, bytes] | None = None) -> Path:
    """A layer folder: its manifest (the [series] table, then ``entries`` and ``gates`` as TOML) and files."""
    (dest / "patches").mkdir(parents=True)
    (dest / "patches" / "series.toml").write_text(
        f'[series]\nname = "{name}"\nversion = "1"\nbase = "{base}"\n{entries}{gates}')
    for rel, data in (files or {}).items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes(data)
    return dest


def patch_entry(name: str, file: str, data: bytes, gate: str = "") -> str:
    return (f'\n[[entries]]\nname = "{name}"\nkind = "patch"\nfile = "{file}"\nwhy = "test"\ngate = "{gate}"\n'
            f'base = "v0.5.23"\nsha256 = "{hashlib.sha256(data).hexdigest()}"\n')


def commit_on(tree: Path, path: str, old: str, new: str, subject: str) -> str:
    git = Git(worktree=tree)
    file = tree / path
    text = file.read_text()
    assert text.count(old) == 1
    file.write_text(text.replace(old, new))
    git.run("add", "--", path)
    subprocess.run(["git", *ID, "-C", str(tree), "commit", "-q", "-m", subject], check=True)
    return git.head() or ""


# ---------------------------------------------------------------------------- refused before anything is written
ENV_PY = "python/sglang/srt/environ.py"
SPOOF = b"Subject: [PATCH] x\n\nC128patch-Entry: c128-dspark-online-env\n---\n"


@pytest.fixture(scope="module")
def applied_023(sglang_release_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clone of the releases (as ``upstream_clone``) with the product series applied at v0.5.23 by `apply` (no
    layer): made once, copied for each test that starts there (``applied_clone``)."""
    dest = tmp_path_factory.mktemp("applied-023") / "sglang"
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(sglang_release_repo), str(dest)], check=True)
    subprocess.run(["git", "-C", str(dest), "checkout", "--quiet", "-b", "main", "v0.5.23"], check=True)
    assert invoke("apply", "--sglang-rev", "v0.5.23", "--repo", dest).code == 0
    return dest


@pytest.fixture
def applied_clone(applied_023: Path, tmp_path: Path) -> Path:
    """``upstream_clone`` (tmp_path/sglang) after ``apply --sglang-rev v0.5.23 --repo`` it: a copy of ``applied_023``
    (cp -a: its .git state with it; the tree records no absolute path of its own), for one test to change."""
    subprocess.run(["cp", "-a", str(applied_023), str(tmp_path / "sglang")], check=True)
    return tmp_path / "sglang"


@pytest.mark.parametrize("manifest, files, says", [
    ('\n[[entries]]\nname = "x"\nkind = "patch"\nfile = "../x.patch"\nwhy = "w"\n', {}, "unsafe path"),
    ('\n[[entries]]\nname = "x"\nkind = "overlay"\nsource = "overlay/x.py"\ntarget = "python/.git/hooks/post-checkout"'
     '\nwhy = "w"\n', {"overlay/x.py": b"x\n"}, "git's own folder"),
    ('\n[[entries]]\nname = "../x"\nkind = "patch"\nfile = "x.patch"\nwhy = "w"\n', {}, "unsafe entry name"),
    ('\n[[entries]]\nname = "x"\nkind = "patch"\nfile = "0001-x.patch"\nwhy = "w"\n', {"patches/0001-x.patch": SPOOF},
     "names its own entry only"),
], ids=["dotdot", "dot-git", "entry-name", "trailer-of-ours"])
def test_a_layer_with_an_unsafe_path_is_refused_in_one_line_before_anything_is_written(
        tmp_path, sparse_clone, manifest, files, says):
    layer = write_layer(tmp_path / "layer", entries=manifest, files=files)
    refused(["apply", "--sglang-rev", "v0.5.23", "--repo", sparse_clone, "--layer", layer], tree=sparse_clone,
            contains=says)


@pytest.mark.parametrize("name, base, says", [
    ("site", "v0.6.0", "base 'v0.6.0' is not one the series c128patch was made on"),
    ("site", "", "the layer names no base"),
    ("site-1", "v0.5.23", "unsafe layer name"),
    ("c128patch", "v0.5.23", "are named c128patch"),
], ids=["unknown-base", "no-base", "name-not-a-label-word", "name-of-the-series"])
def test_a_layer_with_an_unknown_base_or_a_bad_name_is_refused(tmp_path, sparse_clone, name, base, says):
    layer = write_layer(tmp_path / "layer", name=name, base=base)
    refused(["apply", "--sglang-rev", "v0.5.23", "--repo", sparse_clone, "--layer", layer], tree=sparse_clone,
            contains=says)


def test_two_layers_of_one_name_are_refused(tmp_path, sparse_clone):
    a, b = write_layer(tmp_path / "a"), write_layer(tmp_path / "b")
    refused(["check", "--sglang-rev", "v0.5.23", "--repo", sparse_clone, "--layer", a, "--layer", b],
            contains="named site")


def test_layer_new_refuses_an_unknown_base_an_existing_layer_and_a_folder_it_cannot_make(tmp_path):
    refused(["layer", "new", tmp_path / "x", "--name", "site", "--base", "v0.4.0"], contains="nothing was written")
    assert not (tmp_path / "x").exists()
    refused(["layer", "new", tmp_path / "x", "--name", "c128patch"], contains="that is the series' own name")
    assert not (tmp_path / "x").exists()  # (helper 96: made, then every verb refused the stack)
    (tmp_path / "file").write_text("")  # a file on the way (a traceback before), as /proc/x or a read-only disk
    refused(["layer", "new", tmp_path / "file" / "x", "--name", "site"],
            contains="Not a directory; nothing was written")
    assert invoke("layer", "new", tmp_path / "y", "--name", "site").code == 0
    before = (tmp_path / "y" / "patches" / "series.toml").read_bytes()
    refused(["layer", "new", tmp_path / "y", "--name", "other"], contains="exists already")
    assert (tmp_path / "y" / "patches" / "series.toml").read_bytes() == before
    assert load_series(tmp_path / "y").base == load_series(REPO_ROOT).base


@pytest.mark.parametrize("folder", [".git/x", ".GIT/x", "a/.g\u0131t/x"])
def test_layer_new_inside_gits_own_folder_is_refused_before_anything_is_written(tmp_path, folder):
    """Helper 175: `layer new .git/x` (in a repository) wrote its manifest into git's own folder, then `load_layer`
    refused it ("unsafe layer folder"), the files left there; any spelling git's folder folds from, refused first."""
    Git(worktree=tmp_path).run("init", "-q")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    refused(["layer", "new", tmp_path / folder, "--name", "site"],
            contains="it is inside git's own folder; nothing was written")
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("link", ["patches", "patches/series.toml"])
def test_layer_new_never_writes_through_a_link_in_its_folder(tmp_path, link):
    """Helper 185: `layer new X` where X/patches is a link to a folder elsewhere wrote the manifest there, then
    load_layer refused the link, saying "nothing was written". Refused first, naming the link; its target untouched."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    folder = tmp_path / "L"
    (folder / "patches").mkdir(parents=True) if link != "patches" else folder.mkdir()
    (folder / link).symlink_to(elsewhere if link == "patches" else elsewhere / "series.toml")
    refused(["layer", "new", folder, "--name", "site"],
            contains=f"{link} (-> {elsewhere if link == 'patches' else elsewhere / 'series.toml'}) in {folder}; "
                     "nothing was written")
    assert not any(elsewhere.iterdir())


def test_layer_new_on_a_full_disk_leaves_no_folder_behind(tmp_path, monkeypatch):
    """"nothing was written" over the empty folders it had made (``x/y/patches``) before the manifest failed."""
    from c128patch.series.manifest import Series

    def full(self: Series) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Series, "save", full)
    (tmp_path / "here").mkdir()
    refused(["layer", "new", tmp_path / "here" / "x" / "y", "--name", "site"],
            contains="No space left on device; nothing was written")
    assert list((tmp_path / "here").iterdir()) == []


def test_status_refuses_a_layer_folder_it_is_named_that_is_not_one(tmp_path, sparse_clone):
    """Helper 96: ``status --layer /nonexistent`` dropped the folder, the proof line with it, and exited 1 saying
    nothing; check refuses it in one line, and so does status now."""
    refused(["status", "--tree", sparse_clone, "--layer", tmp_path / "nothere"], contains="nothere")
    refused(["status", "--tree", sparse_clone, "--series", tmp_path / "nothere"], contains="nothere")


# ---------------------------------------------------------------------------- which layers
def test_layer_flags_then_the_env_then_the_config_file_name_the_layers(tmp_path, monkeypatch):
    (tmp_path / "repo" / "sub").mkdir(parents=True)
    (tmp_path / "repo" / CONFIG).write_text('[layers]\npaths = ["layers/acme", "layers/lab"]\n')
    monkeypatch.delenv(ENV, raising=False)
    found = lookup_layers((), cwd=tmp_path / "repo" / "sub")[0]  # the nearest config above
    assert found == ((tmp_path / "repo/layers/acme").resolve(), (tmp_path / "repo/layers/lab").resolve())
    monkeypatch.setenv(ENV, "")  # the env, even empty, wins over the file
    assert lookup_layers((), cwd=tmp_path / "repo")[0] == ()
    assert lookup_layers((Path("x"),), cwd=tmp_path / "repo")[0] == (Path("x"),)


def test_a_config_file_naming_a_folder_outside_it_is_refused(tmp_path, monkeypatch):
    (tmp_path / CONFIG).write_text('[layers]\npaths = ["../elsewhere"]\n')
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    refused(["check", "--sglang-rev", "v0.5.23"], contains="unsafe path in")


def test_a_config_that_is_a_fifo_a_dangling_link_or_a_folder_is_refused_not_passed_over(tmp_path, monkeypatch):
    """Helper 161: a c128patch.toml in the current folder that was a FIFO, a dangling link or a folder was passed over
    in silence and the parent's config used instead (a symlink to a file was refused): the nearest one there decides,
    and one that is no regular file is one line saying what it is."""
    (tmp_path / "repo" / "sub").mkdir(parents=True)
    (tmp_path / "repo" / CONFIG).write_text('[layers]\npaths = ["layers/acme"]\n')
    monkeypatch.delenv(ENV, raising=False)
    here = tmp_path / "repo" / "sub"
    for make, said in ((os.mkfifo, "is a FIFO"), (lambda p: p.symlink_to(tmp_path / "none"), "is a symlink"),
                       (os.mkdir, "is a folder")):
        make(here / CONFIG)
        with pytest.raises(C128Error, match=said) as exc:
            lookup_layers((), cwd=here)
        assert str(here / CONFIG) in exc.value.message and "\n" not in exc.value.message
        monkeypatch.setenv(ENV, "")  # the fix it prints: the env (or --layer) wins over any file
        assert lookup_layers((), cwd=here)[0] == ()
        monkeypatch.delenv(ENV)
        (here / CONFIG).rmdir() if (here / CONFIG).is_dir() and not (here / CONFIG).is_symlink() \
            else (here / CONFIG).unlink()


STACK_SCRIPT = """
import json, sys
from pathlib import Path
from c128patch.series.layers import get_series, layer_rows
stack = get_series(None, [Path(sys.argv[1])])
print(json.dumps({"name": stack.name, "version": stack.version, "digest": stack.digest(), "layers": layer_rows(stack),
                  "entries": [e.name for e in stack.entries], "click": "click" in sys.modules}))
"""


def test_a_script_gets_the_same_stack_from_get_series_as_the_cli_with_layer(tmp_path, sparse_clone):
    env = {k: v for k, v in os.environ.items() if k not in (ENV, "C128PATCH_SERIES")}
    proc = subprocess.run([sys.executable, "-c", STACK_SCRIPT, str(EXAMPLE)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, check=True)
    script = json.loads(proc.stdout)
    cli = invoke("check", "--sglang-rev", "v0.5.23", "--repo", sparse_clone, "--layer", EXAMPLE,
                 env={ENV: None, "C128PATCH_SERIES": None})
    assert cli.code == 0, cli.stderr
    assert not script["click"]  # the script's stack came through no click option
    assert [row["name"] for row in script["layers"]] == ["acme"]
    assert script["layers"] == cli.out["layers"]  # each layer's name, version, base, digest and entries
    assert {"name": script["name"], "version": script["version"]} == cli.out["series"]
    assert script["entries"] == [e["name"] for e in cli.out["revs"][0]["entries"]]
    assert script["digest"] == stack(load_series(REPO_ROOT), (EXAMPLE,)).digest() != load_series(REPO_ROOT).digest()


# ---------------------------------------------------------------------------- a conflict names both entries
@pytest.fixture
def clashing_layer(tmp_path: Path, sglang_release_repo: Path) -> Path:
    """A layer whose entry was made on plain v0.5.23: it adds a line where our c128-dspark-online-env does."""
    scratch = small_clone(sglang_release_repo, tmp_path / "scratch", "python/sglang/srt/speculative").worktree
    anchor = "    SGLANG_OPT_USE_JIT_INDEXER_METADATA = EnvBool(True)\n"
    sha = commit_on(scratch, ENV_PY, anchor, anchor + "    SGLANG_SITE_OTHER = EnvBool(False)\n", "site: env")
    data = format_patch(Git(worktree=scratch), sha, "site/site-env")
    gate = ('\n[[gates]]\nname = "SGLANG_SITE_OTHER"\ndeclared_by = "series"\ntype = "bool"\ndefault = "False"\n'
            'enables = "x"\n')
    return write_layer(tmp_path / "site", entries=patch_entry("site-env", "0001-site-env.patch", data,
                                                              "SGLANG_SITE_OTHER"),
                       gates=gate, files={"patches/0001-site-env.patch": data})


BOTH = ("it conflicts with entry 'c128-dspark-online-env' of series c128patch, "
        "which changes lines it edits in python/sglang/srt/environ.py")


def test_check_names_both_entries_of_a_conflict(clashing_layer, sglang_release_repo):
    res = invoke("check", "--sglang-rev", "v0.5.23", "--layer", clashing_layer)
    assert res.code == 1
    row = next(e for e in res.out["revs"][0]["entries"] if e["name"] == "site/site-env")
    assert row["status"] == "conflict" and BOTH in row["detail"], row
    assert res.out["revs"][0]["apply"]["entry"] == "site/site-env"


def test_apply_stops_at_a_conflicting_layer_entry_naming_both(clashing_layer, upstream_clone):
    res = invoke("apply", "--sglang-rev", "v0.5.23", "--repo", upstream_clone, "--layer", clashing_layer,
                 as_json=False)
    assert res.code == 1, res.err
    first = res.err.splitlines()[0]
    assert "entry 'site/site-env'" in first and BOTH in first, first
    subjects = Git(worktree=upstream_clone).out("log", "--format=%s", "-1")
    assert subjects.startswith("c128: commit DSPARK")  # stopped at our last entry, the layer's not applied


def test_wheel_refuses_a_conflicting_layer_entry_naming_both(clashing_layer, tmp_path):
    res = invoke("wheel", "--from-release", "0.5.23", "-o", tmp_path / "dist", "--layer", clashing_layer, as_json=False)
    assert res.code == 1 and "entry 'site/site-env'" in res.err and BOTH in res.err, res.err
    assert not (tmp_path / "dist").exists() or not list((tmp_path / "dist").iterdir())


@pytest.fixture
def newer_line_layer(tmp_path: Path, sglang_release_repo: Path) -> Path:
    """A layer entry made on v0.5.23 editing SGLANG_ZMQ_SOURCE_IP, a line v0.5.20-22 lack (helper 108's case 02); our
    c128-dspark-online-env changes the same file ~1460 lines away."""
    scratch = small_clone(sglang_release_repo, tmp_path / "scratch", "python/sglang/srt/speculative").worktree
    sha = commit_on(scratch, ENV_PY, "SGLANG_ZMQ_SOURCE_IP = EnvStr(None)", 'SGLANG_ZMQ_SOURCE_IP = EnvStr("10.0.0.1")',
                    "zmq source ip")
    data = format_patch(Git(worktree=scratch), sha, "conf/zmq-source-ip")
    return write_layer(tmp_path / "conf", name="conf", entries=patch_entry("zmq-source-ip", "0001-zmq.patch", data),
                       files={"patches/0001-zmq.patch": data})


LACKS = ("v0.5.22 has no line `SGLANG_ZMQ_SOURCE_IP = EnvStr(None)` that its hunk in python/sglang/srt/environ.py "
         "edits (nor does an entry before it add it)")


def test_a_layer_entry_on_a_line_the_rev_lacks_blames_upstream_not_an_entry_of_ours(newer_line_layer, tmp_path):
    """Helper 108's case 02: check, apply and wheel said "it conflicts with entry 'c128-dspark-online-env'", whose
    only hunk is far from the layer's; they share the file only. They now say what the rev lacks."""
    res = invoke("check", "--sglang-rev", "v0.5.22", "--sglang-rev", "v0.5.23", "--layer", newer_line_layer)
    old, new = res.out["revs"]
    row = next(e for e in old["entries"] if e["name"] == "conf/zmq-source-ip")
    assert row["status"] == "conflict" and LACKS in row["detail"] and "conflicts with entry" not in row["detail"], row
    assert new["apply"]["exit"] == 0, new["apply"]
    wheel = invoke("wheel", "--from-release", "0.5.22", "-o", tmp_path / "dist", "--layer", newer_line_layer,
                   as_json=False)
    assert wheel.code == 1 and "conflicts with entry" not in wheel.err, wheel.err
    assert "sglang 0.5.22 has no line `SGLANG_ZMQ_SOURCE_IP = EnvStr(None)`" in wheel.err, wheel.err


def test_a_backward_rebase_stopping_on_code_the_older_rev_lacks_says_so(newer_line_layer, tmp_path, monkeypatch):
    """Helper 108's case 08a: rebased back onto v0.5.22, the stop said "the upstream side is empty (upstream removed
    the code this hunk edits)"; v0.5.22 never had SGLANG_ZMQ_SOURCE_IP. It says the older rev lacks it yet."""
    monkeypatch.delenv(ENV, raising=False)
    tree = tmp_path / "sglang"
    assert invoke("apply", "--sglang-rev", "v0.5.23", "--tree", tree, "--layer", newer_line_layer).code == 0
    stop = invoke("rebase", "--onto", "v0.5.22", "--tree", tree, as_json=False)
    assert stop.code == 1, stop.err
    [hint] = [line for line in stop.err.splitlines() if line.startswith(f"  {ENV_PY}")]
    assert "the upstream side is empty (v0.5.22 does not have the code this hunk edits yet)" in hint, hint
    assert "upstream removed" not in stop.err


# ---------------------------------------------------------------------------- layer add-entry
def full_disk(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data[:1])
    raise OSError(errno.ENOSPC, "No space left on device", str(path))


def test_add_entry_to_a_folder_that_is_not_there_is_one_line_naming_layer_new(tmp_path, applied_clone):
    """A mistyped --layer (or a layer not made yet): a FileNotFoundError traceback from the layer's lock; it is one
    line naming `layer new`, nothing written."""
    res = invoke("layer", "add-entry", "--layer", tmp_path / "nowhere", "--from-commit", "HEAD", "--tree",
                 applied_clone, "--why", "w", as_json=False)
    assert res.code == 2 and "Traceback" not in res.err and len(res.err.strip().splitlines()) == 1, res.err
    assert f"no layer at {tmp_path / 'nowhere'}" in res.err and "c128patch layer new " in res.err, res.err
    assert not (tmp_path / "nowhere").exists()


def test_a_layer_entry_adding_non_ascii_text_is_taken_and_loads(tmp_path, applied_clone):
    """A commit adding "# café → naïve" (UTF-8) to a file: add-entry said it made the entry, then every verb refused the
    layer ("patch ... is refused: 'ascii' codec can't encode characters"): the email parser had decoded the diff's
    bytes before the trailers were read from them."""
    anchor = '    SGLANG_SPEC_TP_SYNC = EnvStr("all")\n'
    sha = commit_on(applied_clone, ENV_PY, anchor, anchor + "    # acme: café → naïve\n", "acme: a comment")
    layer = tmp_path / "acme"
    assert invoke("layer", "new", layer, "--name", "acme").code == 0
    add = invoke("layer", "add-entry", "--layer", layer, "--from-commit", sha, "--tree", applied_clone, "--why", "w")
    assert add.code == 0, add.out
    lint = invoke("lint", "--offline", "--layer", layer)
    assert lint.code == 0 and lint.out["ok"] is True, lint.out
    # a byte that is no UTF-8 (a Latin-1 "é") in the diff: git am takes it, so does the layer (helper 179)
    env = applied_clone / ENV_PY
    env.write_bytes(env.read_bytes() + b"# caf\xe9\n")
    subprocess.run(["git", *ID, "-C", str(applied_clone), "commit", "-q", "-am", "acme: latin-1"], check=True)
    add = invoke("layer", "add-entry", "--layer", layer, "--from-commit", "HEAD", "--tree", applied_clone, "--why", "w")
    assert add.code == 0, add.out
    lint = invoke("lint", "--offline", "--layer", layer)
    assert lint.code == 0 and lint.out["ok"] is True, lint.out


def test_a_layer_folder_named_with_a_byte_that_is_not_utf8_is_valid_unicode_in_json(tmp_path):
    """helper 172: a layer folder whose name holds the byte 0xff was "lay\\udcff" in --json's layers_in_effect (a lone
    surrogate: no strict reader takes it). Every field of a --json report shows such a byte as U+FFFD, as every line of
    ours does (``textsafe.decoded``, ``plain``)."""
    layer = Path(os.fsdecode(bytes(tmp_path) + b"/lay\xff"))
    assert invoke("layer", "new", layer, "--name", "acme").code == 0
    res = invoke("lint", "--offline", "--layer", layer)
    assert res.code == 0, res.text
    data = json.loads(res.text)
    json.dumps(data, ensure_ascii=False).encode("utf-8")  # (raised: surrogates not allowed)
    assert data["layers_in_effect"]["layers"][0]["folder"] == str(tmp_path / "lay\ufffd")


def test_add_entry_makes_the_example_layers_first_entry_from_a_commit(tmp_path, applied_clone, monkeypatch):
    """The example's first entry was made by `layer add-entry`; the same commit gives the same file."""
    anchor = '    SGLANG_SPEC_TP_SYNC = EnvStr("all")\n'
    sha = commit_on(applied_clone, ENV_PY, anchor, anchor + "    # acme site layer: floor the DSPARK steps-per-second "
                    "cost table (default off).\n    SGLANG_ACME_SPS_FLOOR = EnvBool(False)\n",
                    "acme: declare SGLANG_ACME_SPS_FLOOR (default off)\n\nThe acme site's switch for the "
                    "steps-per-second floor; this only declares it.")
    layer = tmp_path / "acme"
    assert invoke("layer", "new", layer, "--name", "acme").code == 0
    manifest = layer / "patches" / "series.toml"
    gates = (EXAMPLE / "patches" / "series.toml").read_text().split("[[gates]]", 1)[1]
    manifest.write_text(manifest.read_text() + "\n[[gates]]" + gates)
    before = snapshot(applied_clone)
    add = ["layer", "add-entry", "--layer", layer, "--from-commit", sha[:10], "--tree", applied_clone, "--why", "w"]
    files = {p: p.read_bytes() for p in layer.rglob("*") if p.is_file()}
    with monkeypatch.context() as m:  # a full disk while staging: one line, the layer as it was, no leftovers
        m.setattr(txn, "write_atomic", full_disk)
        line = refused(add, applied_clone, "No space left on device")
    assert "nothing was changed in" in line and {p: p.read_bytes() for p in layer.rglob("*") if p.is_file()} == files
    res = invoke("layer", "add-entry", "--layer", layer, "--from-commit", sha[:10], "--tree", applied_clone,
                 "--gate", "SGLANG_ACME_SPS_FLOOR", "--name", "acme-sps-env",
                 "--why", "declare the acme site's SGLANG_ACME_SPS_FLOOR beside the other speculative-decoding envs")
    assert res.code == 0 and res.out["entry"] == "acme/acme-sps-env" and res.out["findings"] == [], res.out
    assert snapshot(applied_clone) == before  # the branch is not changed
    made = (layer / "patches" / "0001-acme-sps-env.patch").read_bytes()
    assert made == (EXAMPLE / "patches" / "0001-acme-sps-env.patch").read_bytes()
    assert load_series(layer).entries[0].sha256 == hashlib.sha256(made).hexdigest()
    other = commit_on(applied_clone, ENV_PY, anchor, anchor + "    SGLANG_ACME_OTHER = EnvBool(False)\n", "other")
    again = invoke("layer", "add-entry", "--layer", layer, "--from-commit", other, "--tree", applied_clone,
                   "--name", "acme-sps-env", "--why", "again", as_json=False)
    assert again.code == 2 and "has an entry 'acme-sps-env' already" in again.err


def test_add_entry_run_again_on_the_same_commit_names_the_entry_it_is_and_adds_no_second_one(tmp_path, applied_clone):
    """A user re-runs the add-entry they ran (issue 37's walk): refused, naming the entry the commit is already, and
    no `pass --name`, which made a second entry of the same change that no apply can replay."""
    anchor = '    SGLANG_SPEC_TP_SYNC = EnvStr("all")\n'
    sha = commit_on(applied_clone, ENV_PY, anchor, anchor + "    # acme: the site's note\n", "acme: the site's note")
    layer = tmp_path / "acme"
    assert invoke("layer", "new", layer, "--name", "acme").code == 0
    add = ["layer", "add-entry", "--layer", layer, "--from-commit", "HEAD", "--tree", applied_clone, "--why", "w"]
    first = invoke(*add, as_json=False)
    assert first.code == 0, first.err
    # the next step it prints, run as printed: the stack applied beside the branch, which keeps the commit
    nxt = printed_command(first.text, "c128patch apply ")
    assert nxt == shlex.join(["c128patch", "apply", "--sglang-rev", "v0.5.23", "--layer", str(layer), "--tree",
                              f"{applied_clone}-acme"]) and f"  next: {nxt}" in first.text
    ran = run_printed(nxt, cwd=tmp_path)
    assert ran.returncode == 0 and "acme/acme-the-site-s-note" in ran.stdout, ran.stderr[-2000:]
    files = {p: p.read_bytes() for p in layer.rglob("*") if p.is_file()}
    for extra in ([], ["--name", "second"]):
        line = refused([*add, *extra], applied_clone,
                       f"commit {sha[:12]} is entry 'acme/acme-the-site-s-note' of layer acme already")
        assert "--name" not in line and "nothing was written" in line, line
    assert {p: p.read_bytes() for p in layer.rglob("*") if p.is_file()} == files


def test_a_commit_carried_by_a_rebase_becomes_a_layer_entry_by_the_commands_printed(tmp_path, applied_clone):
    """Helper 108's case 04: (a) the rebase's note named `c128patch layer add-entry` with no arguments, and add-entry
    on the rebased tree printed an apply that made a new tree without the commit; (b) back on the layer's base,
    `--from-commit HEAD` named the rebase's provenance record ("is entry 'provenance' already"). Each printed
    sequence now carries the commit and works as printed; HEAD takes the user's commit below the record."""
    anchor = '    SGLANG_SPEC_TP_SYNC = EnvStr("all")\n'
    commit_on(applied_clone, ENV_PY, anchor, anchor + "    # site: the note\n", "site fix")
    back = invoke("rebase", "--onto", "v0.5.22", "--tree", applied_clone, as_json=False)
    assert back.code == 0, back.err
    made = run_printed(printed_command(back.text, "c128patch layer new "))  # a layer on the tree's base, the entry
    assert made.returncode == 0, made.stdout + made.stderr
    local = load_series(tmp_path / "layers" / "local")
    assert local.base == "v0.5.22" and [e.name for e in local.entries] == ["site-fix"], made.stdout

    site = tmp_path / "site"
    assert invoke("layer", "new", site, "--name", "site").code == 0  # on the series base, v0.5.23
    mine = Git(worktree=applied_clone).rev_parse("HEAD~1")  # below the rebase's provenance record
    line = refused(["layer", "add-entry", "--layer", site, "--from-commit", mine[:12], "--tree", applied_clone,
                    "--why", "site fix"], applied_clone, "the tree is on v0.5.22, the layer site on v0.5.23")
    ran = run_printed(printed_command(line, "c128patch rebase "), cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    [entry] = load_series(site).entries
    assert entry.name == "site-fix" and "+    # site: the note" in (site / "patches" / entry.file).read_text()

    other = tmp_path / "other"
    assert invoke("layer", "new", other, "--name", "other").code == 0
    head = invoke("layer", "add-entry", "--layer", other, "--from-commit", "HEAD", "--tree", applied_clone,
                  "--why", "w", as_json=False)
    git = Git(worktree=applied_clone)
    assert head.code == 0, head.err
    assert (f"HEAD ({git.rev_parse('HEAD')[:12]}) is c128patch's provenance record, not a change of yours: took your "
            f"commit {git.rev_parse('HEAD~1')[:12]} (site fix) below it") in head.text, head.text
    assert [e.name for e in load_series(other).entries] == ["site-fix"]


def test_add_entry_on_a_tree_of_another_base_prints_a_rebase_and_add_entry_that_work_as_printed(
        tmp_path, upstream_clone):
    """Helper 96: the refusal's apply had no --tree; from the folder above it took ./sglang, this very tree, and
    refused. Helper 108 (case 04): a tree beside this one had no commit of the user's to add. It now rebases this
    tree (named) onto the layer's base and adds the commit there, as printed."""
    assert invoke("apply", "--sglang-rev", "v0.5.22", "--repo", upstream_clone).code == 0
    anchor = '    SGLANG_SPEC_TP_SYNC = EnvStr("all")\n'
    commit_on(upstream_clone, ENV_PY, anchor, anchor + "    # acme: the site's note\n", "acme: the site's note")
    layer = tmp_path / "acme"
    assert invoke("layer", "new", layer, "--name", "acme").code == 0  # on the series base, v0.5.23
    line = refused(["layer", "add-entry", "--layer", layer, "--from-commit", "HEAD", "--tree", upstream_clone,
                    "--why", "w"], upstream_clone, "the tree is on v0.5.22, the layer acme on v0.5.23")
    ran = run_printed(printed_command(line, "c128patch rebase "), cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert [e.name for e in load_series(layer).entries] == ["acme-the-site-s-note"], ran.stdout


# ---------------------------------------------------------------------------- the example, the whole way
@pytest.fixture(scope="module")
def example_path(tmp_path_factory: pytest.TempPathFactory, sglang_release_repo: Path) -> dict:
    """The example layer (a copy) with a copy of our series: apply at v0.5.23, then rebase onto each
    release, backwards, skipping one, and forwards again (v0.5.21, v0.5.20, v0.5.22, v0.5.23), each
    followed by the refresh the rebase prints (--variant; none after the last); then a wheel of
    every release with the refreshed stack, and verify-wheel of each. Every step's run, by step."""
    root = tmp_path_factory.mktemp("layers")
    series, layer = copy_series(root / "series"), root / "acme"
    shutil.copytree(EXAMPLE, layer)
    tree = root / "sglang"
    ours = ["--series", series, "--layer", layer]
    steps: dict = {"root": root, "series": series, "layer": layer, "tree": tree}
    steps["apply"] = invoke("apply", "--sglang-rev", "v0.5.23", "--tree", tree, *ours)
    for rev in ("v0.5.21", "v0.5.20", "v0.5.22", "v0.5.23"):
        steps[f"rebase {rev}"] = res = invoke("rebase", "--onto", rev, "--tree", tree, *ours)
        assert res.code == 0, res.err
        nxt, _ = refresh_command(Git(worktree=tree), stack(load_series(series), [layer]), res.out,
                                 lock_items)  # what it prints
        steps[f"next {rev}"] = nxt
        steps[f"check before {rev}"] = invoke("refresh", "--check", "--tree", tree, *ours)  # what CI runs
        steps[f"check before {rev} text"] = invoke("refresh", "--check", "--tree", tree, *ours, as_json=False)
        if nxt:
            steps[f"refresh {rev}"] = run_printed(nxt)
        steps[f"check after {rev}"] = invoke("refresh", "--check", "--tree", tree, *ours)
    for rev in RELEASES:
        version = rev.removeprefix("v")
        steps[f"wheel {rev}"] = invoke("wheel", "--from-release", version, "-o", root / "dist", *ours)
        steps[f"verify {rev}"] = invoke("verify-wheel", steps[f"wheel {rev}"].out.get("wheel", "?"), *ours)
    return steps


def test_the_example_applies_with_its_entries_namespaced_in_commits_and_provenance(example_path):
    res = example_path["apply"]
    assert res.code == 0, res.err
    names = [e["name"] for e in res.out["entries"]]
    assert names[-3:] == ["acme/acme-sps-env", "acme/acme-sps-floor-helper", "acme/acme-sps-floor"]
    assert res.out["layers"][0]["name"] == "acme" and res.out["equivalence"]["identical"]


@pytest.mark.parametrize("rev", ["v0.5.22", "v0.5.21", "v0.5.20"])
def test_the_example_rebases_across_every_release_proven_equal_to_a_fresh_apply(example_path, rev):
    res = example_path[f"rebase {rev}"]
    assert res.code == 0, res.err
    assert res.out["equivalence"]["identical"], res.out["equivalence"]
    assert [e["name"] for e in res.out["entries"]][-3:] == ["acme/acme-sps-env", "acme/acme-sps-floor-helper",
                                                            "acme/acme-sps-floor"]


def test_refresh_writes_each_layer_into_its_own_folder_only(example_path):
    series, layer = example_path["series"], example_path["layer"]
    assert [rev for rev in RELEASES if example_path[f"next {rev}"]] == ["v0.5.21", "v0.5.22"]  # v0.5.20: v0.5.21's fits
    for rev in ("v0.5.21", "v0.5.22"):
        assert ("--variant" in example_path[f"next {rev}"]
                and f"--layer {layer.resolve()}" in example_path[f"next {rev}"])
        done = example_path[f"refresh {rev}"]
        assert done.returncode == 0, done.stderr
        assert f"changed {layer.resolve()}/patches/0001-acme-sps-env.{rev}.patch" in done.stdout
        assert f"changed {layer.resolve()}/patches/series.toml" in done.stdout
    for sub in ("patches", "csrc", "overlay"):  # our series is untouched
        ours = {p.relative_to(series): p.read_bytes() for p in (series / sub).rglob("*") if p.is_file()}
        assert ours == {p.relative_to(REPO_ROOT): p.read_bytes() for p in (REPO_ROOT / sub).rglob("*") if p.is_file()}
    refreshed = load_series(layer)
    assert refreshed.version == "3"  # bumped once per refresh that changed it
    assert [v.base for v in refreshed.entry("acme-sps-env").variants] == ["v0.5.21", "v0.5.22"]
    assert [e.variants for e in refreshed.entries[1:]] == [[], []]  # the other two fit every release as made


@pytest.mark.parametrize("rev", ["v0.5.21", "v0.5.20", "v0.5.22", "v0.5.23"])
def test_refresh_check_after_each_rebase_says_what_the_printed_refresh_would_change(example_path, rev):
    """A layer that needs a new variant after the rebase: `refresh --check` lists it (exit 1, no traceback, the
    layer as it stands), and after the printed refresh nothing is left to change."""
    before, text = example_path[f"check before {rev}"], example_path[f"check before {rev} text"]
    if example_path[f"next {rev}"]:
        assert before.code == 1 and text.code == 1, before.err
        assert f"{example_path['layer'].resolve()}/patches/0001-acme-sps-env.{rev}.patch" in before.out["changed"]
        assert before.out["layers"][0]["name"] == "acme" and "would change" in text.text
    else:
        assert before.code == 0 and before.out["changed"] == [], before.out
    after = example_path[f"check after {rev}"]
    assert after.code == 0 and after.out["changed"] == [], after.out


def test_the_stack_is_a_fixed_point_after_the_whole_way(example_path):
    ours = ["--series", example_path["series"], "--layer", example_path["layer"]]
    res = invoke("refresh", "--check", "--tree", example_path["tree"], *ours)
    assert res.code == 0 and res.out["changed"] == [], res.out
    checked = invoke("check", *[a for rev in RELEASES for a in ("--sglang-rev", rev)], *ours)
    assert checked.code == 0 and all(r["wheel"]["exit"] == 0 for r in checked.out["revs"]), checked.out


@pytest.mark.parametrize("rev", RELEASES)
def test_the_wheel_label_provenance_and_sbom_carry_the_layer(example_path, rev):
    res = example_path[f"wheel {rev}"]
    assert res.code == 0, res.err
    layer = stack(load_series(example_path["series"]), [example_path["layer"]]).layers[0]
    ours = load_series(example_path["series"]).digest()
    assert res.out["version"] == f"{rev[1:]}+c128.4.{ours[:8]}.acme.{layer.digest()[:8]}"
    with InWheel(Path(res.out["wheel"])) as iw:
        record = json.loads(iw.read("sglang/c128patch_provenance.json"))
        sbom = json.loads(iw.read(f"{iw.dist_info}/sboms/c128patch.cdx.json"))
    assert record["layers"] == [{"name": "acme", "version": "3", "base": "v0.5.23", "digest": layer.digest(),
                                 "entries": ["acme/acme-sps-env", "acme/acme-sps-floor-helper", "acme/acme-sps-floor"]}]
    assert record["series"]["digest"] == ours
    assert indexed_properties(sbom, LAYER_PREFIX) == [{"name": "acme", "version": "3", "base": "v0.5.23",
                                                       "digest": layer.digest()}]
    assert "+ layer acme 3" in sbom["metadata"]["component"]["description"]


@pytest.mark.parametrize("rev", RELEASES)
def test_verify_wheel_checks_every_layer_entry(example_path, rev):
    res = example_path[f"verify {rev}"]
    assert res.code == 0, res.err
    present = {e["name"] for e in res.out["entries"] if e["status"] == "present"}
    assert {"acme/acme-sps-env", "acme/acme-sps-floor-helper", "acme/acme-sps-floor"} <= present
    assert res.out["authenticity"]["identical"] > 0


def test_verify_wheel_refuses_a_wheel_made_with_another_version_of_the_layer(example_path):
    wheel = example_path["wheel v0.5.23"].out["wheel"]
    res = invoke("verify-wheel", wheel, "--no-authenticity", "--series", example_path["series"], "--layer", EXAMPLE,
                 as_json=False)
    assert res.code == 1 and "made with the layers" in res.err, res.err
    plain = invoke("verify-wheel", wheel, "--no-authenticity", "--series", example_path["series"], as_json=False)
    assert plain.code == 1 and "made with the layers acme 3 " in plain.err, plain.err  # words, not a Python repr
    assert "[(" not in plain.err and plain.err.rstrip().endswith("(name, version, digest), not no layers"), plain.err


# ---------------------------------------------------------------------------- lint, audit and watch per layer
def test_lint_names_a_layer_s_findings_by_layer_and_entry(clashing_layer):
    res = invoke("lint", "--offline", "--layer", clashing_layer)  # its patch was made without layer add-entry
    assert res.code == 1
    assert res.out["findings"] == [{"entry": "site/site-env", "level": "error", "message":
                                    "patches/0001-site-env.patch: header must say 'C128patch-Gate: SGLANG_SITE_OTHER'"}]


def test_audit_runs_on_the_stack_and_counts_each_layer_s_gated_entries(sglang_release_repo):
    res = invoke("audit", "--layer", EXAMPLE, as_json=False)
    assert res.code == 0, res.err
    assert "of 11 gated entries, 3 of layer acme on v0.5.23: clean" in res.text


def test_watch_carries_the_stack_and_refreshes_the_layer_into_its_own_folder(tmp_path, sglang_release_repo):
    """--no-run: the stack carried and its layer refreshed are the subject (the behavioural tier, watch's costliest
    step, is test_watch_behaviour's); refreshed outranks the unchecked it leaves."""
    layer = tmp_path / "acme"
    shutil.copytree(EXAMPLE, layer)
    res = invoke("watch", "--onto", "v0.5.21", "--out", tmp_path / "out", "--layer", layer, "--no-run")
    assert res.code == 3 and res.out["outcome"] == "refreshed", res.err
    assert res.out["needed_merge"] == ["acme/acme-sps-env"] and res.out["layers"][0]["name"] == "acme"
    new = load_series(tmp_path / "out" / "series" / "layers" / "acme").version
    assert res.out["headline"].endswith(f"the refreshed layer acme {new} applies strictly there"), res.out["headline"]
    refreshed = tmp_path / "out" / "series"
    assert (refreshed / "layers/acme/patches/0001-acme-sps-env.v0.5.21.patch").is_file()
    assert sorted(p.name for p in (refreshed / "patches").glob("*.patch")) == \
        sorted(p.name for p in (REPO_ROOT / "patches").glob("*.patch"))  # ours: as it is
    adopt = f"cp -R {tmp_path / 'out' / 'series' / 'layers' / 'acme' / 'patches'} {layer.resolve() / 'patches'}"
    assert any(adopt in step for step in res.out["next"]), res.out["next"]


@pytest.mark.parametrize("installed", [False, True], ids=["checkout", "installed"])
def test_watch_s_adopt_commands_write_our_series_only_in_a_checkout(tmp_path, monkeypatch, installed):
    """Installed (pip), the tool's series is in site-packages: the commands that adopt a refreshed stack copy the
    layer's folder only, no `rm -rf` of the package's patches nor a commit there."""
    from c128patch.fit.watch import Watch

    series, layer = copy_series(tmp_path / "series"), tmp_path / "acme"
    shutil.copytree(EXAMPLE, layer)
    if installed:
        package = tmp_path / "site-packages" / "c128patch"
        package.mkdir(parents=True)
        (package / "_series").symlink_to(series)
        monkeypatch.setattr("c128patch.series.manifest.PACKAGE_DIR", package)
        series = package / "_series"
    steps = Watch(stack(load_series(series), [layer]), None, "v0.5.21", tmp_path / "out")._next(
        {"outcome": "refreshed", "refreshed": {"changed": []}})
    expected = [["rm", "-rf", str(layer.resolve() / "patches")], ["c128patch", "lint", "--series"]]
    if installed:  # the lint names no --series: the tool's own (issue 37's walk: it named site-packages)
        expected = [expected[0], ["c128patch", "lint", "--layer"]]
        assert "site-packages" not in " ".join(steps[1:]), steps
    else:
        expected = [["rm", "-rf", str(series / "patches")], *expected, ["git", "-C", str(series)]]
    assert [s.split()[:3] for s in steps] == expected, steps


def test_doctor_shows_the_layers_of_the_installed_build(example_path):
    """The layered 0.5.23 wheel installed into a fresh venv (no dependencies): its label checks, and
    the layer and its entries are listed."""
    venv = example_path["root"] / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-deps", "--no-compile", example_path["wheel v0.5.23"].out["wheel"]], check=True)
    res = invoke("doctor", "--python", venv / "bin" / "python", "--series", example_path["series"],
                 "--layer", example_path["layer"])
    topics: dict[str, list[tuple[str, str]]] = {}
    for f in res.out["findings"]:
        topics.setdefault(f["topic"], []).append((f["level"], f["message"]))
    assert topics["build"][0][0] == "ok", topics["build"]  # the label with the layer agrees with the provenance
    layer = load_series(example_path["layer"])
    assert topics["layer"] == [("info", f"layer acme 3 (digest {layer.digest()[:8]}, base v0.5.23): 3 entries, "
                                        "after the series")]
    assert [m.split(" ", 1)[0] for _, m in topics["entry"]][-3:] == ["acme/acme-sps-env", "acme/acme-sps-floor-helper",
                                                                     "acme/acme-sps-floor"]
    assert topics["series"] == [("ok", "the build carries this tool's series c128patch 4")]


def test_a_committed_config_names_the_layers_so_nobody_types_them(tmp_path, monkeypatch, sglang_release_repo):
    shutil.copytree(EXAMPLE, tmp_path / "layers" / "acme")
    (tmp_path / CONFIG).write_text('[layers]\npaths = ["layers/acme"]\n')
    (tmp_path / "deep").mkdir()
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.chdir(tmp_path / "deep")
    res = invoke("check", "--sglang-rev", "v0.5.23")
    assert res.code == 0, res.err
    assert [r["name"] for r in res.out["layers"]] == ["acme"]
    assert [e["name"] for e in res.out["revs"][0]["entries"]][-3:] == ["acme/acme-sps-env",
                                                                       "acme/acme-sps-floor-helper",
                                                                     "acme/acme-sps-floor"]


def test_the_docs_give_the_label_of_the_committed_example():
    from packaging.version import Version

    from c128patch.wheel.patch import patched_version

    series = load_series(REPO_ROOT)
    layer = stack(series, [EXAMPLE]).layers[0]
    label = patched_version(Version("0.5.23"), series.version, series.digest(), [(layer.name, layer.digest())])
    assert f"`{label}`" in (REPO_ROOT / "docs" / "layers.md").read_text()


def test_a_layer_entry_s_resolutions_live_in_the_layer_s_own_ledger(tmp_path):
    from c128patch.series.ledger import Ledger

    data = (EXAMPLE / "patches" / "0001-acme-sps-env.patch").read_bytes()
    layer = write_layer(tmp_path / "site", entries=patch_entry("x", "0001-x.patch", data), files={
        "patches/0001-x.patch": data.replace(b"acme/acme-sps-env", b"site/x"),
        "patches/resolutions/ledger.toml": b'[[resolutions]]\nentry = "x"\nkey = "ab"\nfile = "f"\n'})
    stacked = stack(load_series(REPO_ROOT), [layer])
    assert Ledger(stacked).has("site/x") and not Ledger(stacked).has("x")
    ours = Ledger(load_series(REPO_ROOT))
    assert ([Ledger(stacked).has(e.name) for e in stacked.head.entries]
            == [ours.has(e.name) for e in stacked.head.entries])
    less = stacked.without({"site/x", "c128-plan-zero-rows"})
    assert ([e.name for e in less.layers[0].entries] == []
            and "c128-plan-zero-rows" not in [e.name for e in less.entries])
    assert less.part("c128-dspark-online-env")[0].root == REPO_ROOT


def test_a_conflict_resolved_in_a_rebase_goes_into_the_layer_s_own_ledger_and_replays(tmp_path, sglang_release_repo):
    """A layer entry made on v0.5.23 that edits a line v0.5.20 has otherwise: the rebase onto v0.5.20
    stops at it; resolved, `rebase --continue` (no --layer: its journal has them) records the
    resolution in the layer's ledger, never in ours, and the next rebase replays it from there."""
    tree, series = tmp_path / "sglang", copy_series(tmp_path / "series")
    assert invoke("apply", "--sglang-rev", "v0.5.23", "--repo", sglang_release_repo, "--tree", tree,
                  "--series", series).code == 0
    new, old = '"all,-dspark-plan,-dspark-draft".\n', '"all,-dspark-plan,-6".\n'
    sha = commit_on(tree, ENV_PY, new, new.replace(".\n", " (site: keep all).\n"), "site: say what the site keeps")
    layer = tmp_path / "site"
    assert invoke("layer", "new", layer, "--name", "site", "--series", series).code == 0
    added = invoke("layer", "add-entry", "--layer", layer, "--from-commit", sha, "--tree", tree, "--series", series,
                   "--name", "tp-doc", "--why", "the site's note on TP sync")
    assert added.code == 0, added.out
    git = Git(worktree=tree)
    git.run("reset", "--quiet", "--hard", "HEAD~1")
    ours = ["--series", series, "--layer", layer]
    assert invoke("apply", "--sglang-rev", "v0.5.23", "--repo", tree, "--branch", "stack", *ours).code == 0
    stop = invoke("rebase", "--onto", "v0.5.20", "--tree", tree, *ours, as_json=False)
    assert stop.code == 1 and "site/tp-doc" in stop.err, stop.err
    text = git.out("show", f"HEAD:{ENV_PY}") + "\n"
    assert text.count(old) == 1
    (tree / ENV_PY).write_text(text.replace(old, old.replace(".\n", " (site: keep all).\n")))
    git.run("add", "--", ENV_PY)
    done = invoke("rebase", "--continue", "--tree", tree, "--series", series)
    assert done.code == 0 and done.out["equivalence"]["identical"], done.err
    rows = (layer / "patches" / "resolutions" / "ledger.toml").read_text()
    assert 'entry = "tp-doc"' in rows and 'from = "v0.5.23"' in rows and 'onto = "v0.5.20"' in rows
    assert len(list((layer / "patches" / "resolutions" / "tp-doc").glob("*.diff"))) == 1
    assert sorted((series / "patches" / "resolutions").rglob("*")) == sorted(  # ours: as it was
        series / p.relative_to(REPO_ROOT) for p in (REPO_ROOT / "patches" / "resolutions").rglob("*"))
    assert invoke("apply", "--sglang-rev", "v0.5.23", "--repo", tree, "--branch", "again", *ours).code == 0
    again = invoke("rebase", "--onto", "v0.5.20", "--tree", tree, *ours)  # no human this time
    assert again.code == 0, again.err
    row = next(e for e in again.out["entries"] if e["name"] == "site/tp-doc")
    assert row["status"] == "resolved" and [r.split(":")[0] for r in row["ledger"]] == ["site/tp-doc"], row


# ---------------------------------------------------------------------------- a stack refresh is one transaction
SPS = "python/sglang/srt/speculative/dspark_components/dspark_sps.py"


def amend_commit_of(tree: Path, entry: str, path: str) -> None:
    """Amend the branch's commit of ``entry`` (a line added to ``path``) and replay the commits after it."""
    git = Git(worktree=tree)
    branch = git.out("rev-parse", "--abbrev-ref", "HEAD")
    sha = git.out("log", "--format=%H", f"--grep=^C128patch-Entry: {entry}$", "HEAD").split()[0]
    after = git.out("rev-list", "--reverse", f"{sha}..HEAD").split()
    git.run("checkout", "-q", sha)
    (tree / path).write_text((tree / path).read_text() + "# acme: amended\n")
    subprocess.run(["git", *ID, "-C", str(tree), "commit", "-q", "-a", "--amend", "--no-edit"], check=True)
    subprocess.run(["git", *ID, "-C", str(tree), "cherry-pick", *after], check=True, capture_output=True)
    git.run("branch", "-f", branch, "HEAD")
    git.run("checkout", "-q", branch)


def folder_files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_a_stack_refresh_writes_every_part_or_none(tmp_path, sglang_release_repo):
    """A refresh that changes our series (its version) and the layer (an amended entry) is one
    transaction: a write failure while the layer (the second part) is staged leaves our folder
    and the layer's as they were, with no staging left; killed before the commit point, the old
    stack; killed after it, reading either part finishes both."""
    from support import cli_process

    series, layer, tree = copy_series(tmp_path / "series"), tmp_path / "acme", tmp_path / "sglang"
    shutil.copytree(EXAMPLE, layer)
    ours = ["--series", series, "--layer", layer]
    assert invoke("apply", "--sglang-rev", "v0.5.23", "--repo", sglang_release_repo, "--tree", tree, *ours).code == 0
    amend_commit_of(tree, "acme/acme-sps-floor", SPS)
    before = {series: folder_files(series), layer: folder_files(layer)}
    argv = ["refresh", "--tree", tree, "--version", "99", *ours]

    failed = cli_process(argv, env={"C128PATCH_FAULT": "fail-at:refresh-part1-staged:0"})
    assert failed.returncode == 2, failed.stderr
    (line,) = failed.stderr.strip().splitlines()
    assert line.startswith("c128patch: error: cannot stage the refresh (") and "nothing was changed in" in line
    assert {series: folder_files(series), layer: folder_files(layer)} == before  # no part changed, nothing staged

    saved = tmp_path / "saved"
    for folder in (series, layer):
        shutil.copytree(folder, saved / folder.name)
    # killed while the layer is staged: the old stack; after the commit point (our plan names the
    # layer), before or after the layer is swapped in: the new one, whichever part is read first
    for point, first, new in [("refresh-part1-staged:0", layer, False), ("refresh-committed", layer, True),
                              ("refresh-committed", series, True), ("refresh-swapped:1", layer, True)]:
        for folder in (series, layer):
            shutil.rmtree(folder)
            shutil.copytree(saved / folder.name, folder)
        killed = cli_process(argv, env={"C128PATCH_FAULT": f"kill-at:{point}"})
        assert killed.returncode == -9, (point, killed.stderr)
        load_series(first)  # what every command does first: finish (or drop) the interrupted write
        if not new:  # each folder's own staging is dropped by its reader
            load_series(series)
            assert {series: folder_files(series), layer: folder_files(layer)} == before, point
            continue
        assert not [*series.glob(".c128patch-txn*"), *layer.glob(".c128patch-txn*")], point
        assert (load_series(series).version, load_series(layer).version) == ("99", "2"), point
        assert "# acme: amended" in (layer / "patches" / "0003-acme-sps-floor.patch").read_text(), point
    check = invoke("refresh", "--check", "--tree", tree, *ours)
    assert check.code == 0 and check.out["changed"] == [], check.out


def test_rebase_without_layer_takes_the_layers_from_the_tree_and_writes_nothing_of_theirs_into_ours(
        tmp_path, sglang_release_repo, monkeypatch):
    """Layer trap 2: applied with --layer, rebased without it (no config, no env): the tree's provenance names the
    layer, the rebase says so and replays it as the layer's; the printed refresh writes only the layer."""
    series, layer, tree = copy_series(tmp_path / "series"), tmp_path / "acme", tmp_path / "sglang"
    shutil.copytree(EXAMPLE, layer)
    monkeypatch.setenv("C128PATCH_SERIES", str(series))  # the tool's own series, as installed
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert invoke("apply", "--sglang-rev", "v0.5.23", "--tree", tree, "--layer", layer).code == 0
    before = {p: p.read_bytes() for p in (series / "patches").rglob("*") if p.is_file()}
    res = invoke("rebase", "--onto", "v0.5.21", "--tree", tree, as_json=False)
    assert res.code == 0, res.err
    assert f"layers from the tree's provenance: {layer.resolve()}" in res.err
    (line,) = [x for x in res.text.splitlines() if x.startswith("report: ")]
    nxt = line.split("; next: ", 1)[1]
    assert f"--layer {layer.resolve()}" in nxt and "--series" not in nxt and str(series) not in nxt, line
    check = invoke("refresh", "--check", "--tree", tree)  # trap 1: the layer's new variant file not there yet
    assert check.code == 1 and check.out["changed"] == [str(layer.resolve() / "patches" / name) for name in (
        "0001-acme-sps-env.v0.5.21.patch", "series.toml")], check.out
    done = run_printed(nxt)
    assert done.returncode == 0, done.stderr
    assert {p: p.read_bytes() for p in (series / "patches").rglob("*") if p.is_file()} == before
    assert [v.base for v in load_series(layer).entry("acme-sps-env").variants] == ["v0.5.21"]


def test_verbs_run_from_the_folder_apply_ran_in_take_the_layers_of_the_sglang_tree_there(
        tmp_path, sglang_release_repo, monkeypatch):
    """README: `status`, `rebase`, `refresh` find ./sglang from the folder `apply` ran in. With no config and no env
    there, each takes the layers that tree was applied with, as `rebase` does, and says so: no "the series has
    changed" from status, no refusal from refresh (issue 37's walk); `check` and `lint` check the stack that tree
    carries, not our series alone."""
    series, layer = copy_series(tmp_path / "series"), tmp_path / "acme"
    shutil.copytree(EXAMPLE, layer)
    monkeypatch.setenv("C128PATCH_SERIES", str(series))
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert invoke("apply", "--sglang-rev", "v0.5.23", "--layer", layer).code == 0
    said = f"layers from the tree's provenance: {layer.resolve()}"
    for verb in (["status"], ["refresh", "--check"], ["check", "--sglang-rev", "v0.5.23"], ["lint", "--offline"]):
        res = invoke(*verb, as_json=False)
        assert res.code == 0 and said in res.err, (verb, res.text, res.err)
        assert invoke(*verb).out["layers_in_effect"]["from"] == "the tree's provenance", verb
    lines = invoke("status", as_json=False).text.splitlines()  # ours counted as ours, the layer's beside them
    assert lines[1:3] == ["  series c128patch 4 (11 entries) on upstream v0.5.23 (1310711270cf)",
                          "  + layer acme 1 (3 entries)"], lines


def test_rebase_json_carries_the_layers_in_effect(tmp_path, sglang_release_repo, monkeypatch):
    """`rebase --onto --json` on a tree applied with a layer, none named: its report says where the layers came
    from (docs/schemas: every verb that reads a series)."""
    series, layer, tree = copy_series(tmp_path / "series"), tmp_path / "acme", tmp_path / "sglang"
    shutil.copytree(EXAMPLE, layer)
    monkeypatch.setenv("C128PATCH_SERIES", str(series))
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert invoke("apply", "--sglang-rev", "v0.5.23", "--layer", layer).code == 0
    res = invoke("rebase", "--onto", "v0.5.21")
    assert res.code == 0, res.err
    assert res.out["layers_in_effect"]["from"] == "the tree's provenance", sorted(res.out)
    assert [r["name"] for r in res.out["layers_in_effect"]["layers"]] == ["acme"]


def test_refresh_never_writes_a_layer_s_entry_into_our_series(tmp_path, sglang_release_repo):
    """Named without its layer, a tree carrying a layer's commits is refused: nothing is written."""
    series, layer, tree = copy_series(tmp_path / "series"), tmp_path / "acme", tmp_path / "sglang"
    shutil.copytree(EXAMPLE, layer)
    assert invoke("apply", "--sglang-rev", "v0.5.23", "--tree", tree, "--series", series, "--layer", layer).code == 0
    before = {p: p.read_bytes() for p in series.rglob("*") if p.is_file()}
    res = invoke("refresh", "--tree", tree, "--series", series, env={ENV: ""})
    assert res.code == 2 and "is entry 'acme/acme-sps-env' of layer acme" in res.err and "nothing was written" in \
        res.err, res.err
    assert {p: p.read_bytes() for p in series.rglob("*") if p.is_file()} == before


def _applied_with_a_users_commit(tmp_path: Path) -> tuple[Path, Path, Path]:
    """Our series applied to v0.5.23 (no layer), then a commit of the user's on the branch; the example layer beside."""
    series, layer, tree = copy_series(tmp_path / "series"), tmp_path / "acme", tmp_path / "sglang"
    shutil.copytree(EXAMPLE, layer)
    assert invoke("apply", "--sglang-rev", "v0.5.23", "--tree", tree, "--series", series).code == 0
    (tree / "USER.txt").write_text("mine\n")
    subprocess.run(["git", *ID, "-C", str(tree), "add", "USER.txt"], check=True)
    subprocess.run(["git", *ID, "-C", str(tree), "commit", "-qm", "mine"], check=True)
    return series, layer, tree


def test_apply_beside_a_branch_with_the_users_commit_prints_the_stack_it_was_asked_for(tmp_path, sglang_release_repo):
    """Applied without the layer, a commit of the user's on top, then asked for the stack: refused, nothing changed,
    no `branch -D`; the printed apply beside it names the layer (and the series), so it applies the stack asked."""
    series, layer, tree = _applied_with_a_users_commit(tmp_path)
    res = invoke("apply", "--sglang-rev", "v0.5.23", "--tree", tree, "--series", series, "--layer", layer,
                 as_json=False)
    assert res.code == 2 and "branch -D" not in res.err, res.err
    (line,) = [x for x in res.err.splitlines() if "keep it and apply beside it: " in x]
    done = run_printed(line.split("keep it and apply beside it: ", 1)[1])
    assert done.returncode == 0, done.stderr
    git = Git(worktree=tree)
    assert git.current_branch() == "c128/v0.5.23-acme" and "+ layer acme 1" in done.stdout, done.stdout
    assert git.rev_parse("c128/v0.5.23") and "USER.txt" in git.out("ls-tree", "--name-only", "c128/v0.5.23")


def test_a_users_commit_carried_by_a_rebase_is_still_theirs_when_apply_is_run_again(tmp_path, sglang_release_repo):
    """Issue 37's walk: apply, a commit of the user's, rebase (which carries it below the new provenance commit),
    then apply on the rebased branch again. Without the layer: it holds the series and the user's commit, said;
    with the layer: refused naming the commit, no `branch -D` (it was advised), and the printed apply beside it
    runs, leaving the user's commit where it is."""
    series, layer, tree = _applied_with_a_users_commit(tmp_path)
    assert invoke("rebase", "--onto", "v0.5.22", "--tree", tree, "--series", series).code == 0
    res = invoke("apply", "--sglang-rev", "v0.5.22", "--tree", tree, "--series", series, as_json=False)
    assert res.code == 0 and "1 commit(s) of yours on top): nothing to do" in res.text, res.text
    res = invoke("apply", "--sglang-rev", "v0.5.22", "--tree", tree, "--series", series, "--layer", layer,
                 as_json=False)
    assert res.code == 2 and "branch -D" not in res.err and "with 1 commit(s) of yours on top" in res.err, res.err
    (line,) = [x for x in res.err.splitlines() if "keep it and apply beside it: " in x]
    done = run_printed(line.split("keep it and apply beside it: ", 1)[1])
    assert done.returncode == 0, done.stderr
    assert "USER.txt" in Git(worktree=tree).out("ls-tree", "--name-only", "c128/v0.5.22")


def test_add_entry_with_a_lint_error_says_the_entry_is_written_and_prints_the_lint_to_run_after_the_fix(
        tmp_path, applied_clone):
    """docs/layers.md's add-entry before the layer's [[gates]] describe the env: exit 1 on lint's finding. The user
    is told the entry is written (running add-entry again would only be refused) and which lint to run once the
    gate is described; that lint then passes."""
    anchor = '    SGLANG_SPEC_TP_SYNC = EnvStr("all")\n'
    commit_on(applied_clone, ENV_PY, anchor, anchor + "    SGLANG_ACME_SPS_FLOOR = EnvBool(False)\n", "acme: env")
    layer = tmp_path / "acme"
    assert invoke("layer", "new", layer, "--name", "acme").code == 0
    res = invoke("layer", "add-entry", "--layer", layer, "--from-commit", "HEAD", "--tree", applied_clone,
                 "--gate", "SGLANG_ACME_SPS_FLOOR", "--why", "w", as_json=False)
    assert res.code == 1 and "lint error: acme-env: SGLANG_ACME_SPS_FLOOR" in res.text, res.text
    (line,) = [x for x in res.text.splitlines() if "the entry is written" in x]
    manifest = layer / "patches" / "series.toml"
    gates = (EXAMPLE / "patches" / "series.toml").read_text().split("[[gates]]", 1)[1]
    manifest.write_text(f"{manifest.read_text()}\n[[gates]]{gates}")
    done = run_printed(line.split("then: ", 1)[1])
    assert done.returncode == 0, (done.stdout, done.stderr)


def test_status_of_the_tree_whose_commit_became_the_layer_says_what_is_so(tmp_path, sglang_release_repo, monkeypatch):
    """docs/layers.md's path, then its table with c128patch.toml, from the same folder: ./sglang holds the series and
    the commit add-entry took. status said "the series has changed since (now 4)" (it is 4) and "the working tree
    does not (uncommitted changes)" with nothing uncommitted; it names the stack now asked and the commits."""
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    tree, layer = tmp_path / "sglang", tmp_path / "layers" / "acme"
    assert invoke("apply", "--sglang-rev", "v0.5.23").code == 0
    assert invoke("layer", "new", layer, "--name", "acme").code == 0
    gates = (EXAMPLE / "patches" / "series.toml").read_text().split("[[gates]]", 1)[1]
    (layer / "patches" / "series.toml").write_text((layer / "patches" / "series.toml").read_text() + "\n[[gates]]" +
                                                   gates)
    Git(worktree=tree).run("apply", str(EXAMPLE / "patches" / "0001-acme-sps-env.patch"))
    subprocess.run(["git", *ID, "-C", str(tree), "commit", "-qam", "acme: the sps floor env"], check=True)
    assert invoke("layer", "add-entry", "--layer", layer, "--from-commit", "HEAD", "--tree", tree, "--gate",
                  "SGLANG_ACME_SPS_FLOOR", "--why", "w").code == 0
    (tmp_path / CONFIG).write_text('[layers]\npaths = ["layers/acme"]\n')
    res = invoke("status", as_json=False)
    assert res.code == 1 and "uncommitted" not in res.text, res.text
    nxt = shlex.join(["c128patch", "rebase", "--onto", "v0.5.23", "--tree", str(tree)])
    assert ("  the series has changed since (now series c128patch 4 + layer acme 1): to take it here, next: "
            f"{nxt}") in res.text, res.text
    assert "  HEAD equals the series by its files, through commit(s) made since the apply: identical to a fresh " \
        "apply of series c128patch 4 + layer acme 1 on v0.5.23" in res.text, res.text
    ran = run_printed(printed_command(res.text, "c128patch rebase "), cwd=tmp_path)  # as printed, from there
    assert ran.returncode == 0, ran.stdout + ran.stderr
    res = invoke("status", as_json=False)
    assert res.code == 0 and "has changed since" not in res.text, res.text


def test_rebase_with_the_layer_the_users_commit_became_replays_that_commit_as_the_entry(tmp_path,
                                                                                       sglang_release_repo):
    """docs/layers.md's path, then its table's rebase on ./sglang (the series and the commit add-entry took) with
    the layer named: the commit is that entry, replayed as it (issue 37's walk: carried first, the entry then
    "looks merged upstream", a stop with a false reason). The result is the stack, proven."""
    series, tree, layer = copy_series(tmp_path / "series"), tmp_path / "sglang", tmp_path / "acme"
    assert invoke("apply", "--sglang-rev", "v0.5.23", "--tree", tree, "--series", series).code == 0
    assert invoke("layer", "new", layer, "--name", "acme", "--series", series).code == 0
    gates = (EXAMPLE / "patches" / "series.toml").read_text().split("[[gates]]", 1)[1]
    (layer / "patches" / "series.toml").write_text((layer / "patches" / "series.toml").read_text() + "\n[[gates]]" +
                                                   gates)
    Git(worktree=tree).run("apply", str(EXAMPLE / "patches" / "0001-acme-sps-env.patch"))
    subprocess.run(["git", *ID, "-C", str(tree), "commit", "-qam", "acme: the sps floor env"], check=True)
    assert invoke("layer", "add-entry", "--layer", layer, "--from-commit", "HEAD", "--tree", tree, "--series", series,
                  "--gate", "SGLANG_ACME_SPS_FLOOR", "--why", "w").code == 0
    res = invoke("rebase", "--onto", "v0.5.22", "--tree", tree, "--series", series, "--layer", layer)
    assert res.code == 0, res.out.get("error") or res.err
    assert res.out["equivalence"]["summary"] == \
        "identical to a fresh apply of series c128patch 4 + layer acme 1 on v0.5.22", res.out["equivalence"]
    assert [e["name"] for e in res.out["entries"]][-1] == "acme/acme-the-sps-floor-env", res.out["entries"]


def doc_commands() -> list[str]:
    """docs/layers.md's workflow block: its commands as printed, continuation lines joined, comments left out."""
    block = (REPO_ROOT / "docs" / "layers.md").read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    lines = block.replace("\\\n", " ").splitlines()
    return [" ".join(line.split("#", 1)[0].split()) for line in lines if line.strip() and not line.startswith("#")]


def test_docs_layers_md_walked_as_printed_across_the_releases_with_check_at_each_step(
        tmp_path, sglang_release_repo, monkeypatch):
    """docs/layers.md's commands, run as a user pastes them (a copy of our series as the tool's own), then its
    table, first with no layer named (the tree's provenance names it), then with c128patch.toml: each rebase,
    `refresh --check` (exit 1 exactly when a refresh is printed), the printed refresh, `refresh --check` again;
    at the end `c128patch check` takes every release strictly."""
    monkeypatch.setenv("C128PATCH_SERIES", str(copy_series(tmp_path / "series")))
    monkeypatch.delenv(ENV, raising=False)

    def sh(command: str, cwd: Path = tmp_path, code: int = 0) -> str:
        done = run_printed(command, cwd)
        assert done.returncode == code, (command, done.stdout, done.stderr)
        return done.stdout

    apply, new, add, stacked = doc_commands()
    sh(apply)
    sh(new)
    manifest = tmp_path / "layers" / "acme" / "patches" / "series.toml"  # the gates it describes, as the doc says
    gates = (EXAMPLE / "patches" / "series.toml").read_text().split("[[gates]]", 1)[1]
    manifest.write_text(f"{manifest.read_text()}\n[[gates]]{gates}")
    git = Git(worktree=tmp_path / "sglang")
    git.run("apply", str(EXAMPLE / "patches" / "0001-acme-sps-env.patch"))
    subprocess.run(["git", *ID, "-C", str(git.worktree), "commit", "-qam", "acme: the sps floor env"], check=True)
    sh(add)
    sh(stacked)
    tree = tmp_path / "sglang-acme"
    for rev in ("v0.5.21", "v0.5.20", "v0.5.22", "v0.5.23"):
        if rev == "v0.5.22":
            (tmp_path / CONFIG).write_text('[layers]\npaths = ["layers/acme"]\n')
        out = " ".join(sh(f"c128patch rebase --onto {rev}", tree).split())
        nxt = out.split("; next: ", 1)[1] if "; next: " in out else ""
        sh("c128patch refresh --check", tree, 1 if nxt else 0)
        if nxt:
            sh(nxt, tree)
            sh("c128patch refresh --check", tree)
    checked = json.loads(sh("c128patch check --json", tree))
    assert [r["rev"] for r in checked["revs"]] == list(RELEASES)
    assert checked["ok"] and all(r["wheel"]["exit"] == 0 for r in checked["revs"]), checked


def test_apply_with_a_local_repo_and_contract_take_the_layers_that_tree_was_applied_with(
        tmp_path, upstream_clone, monkeypatch):
    """Applied with --layer into a local --repo, then run from elsewhere with no layer named: apply looks in that
    repository (not the current folder) and finds the branch already holds the stack; contract --tree says the
    tree's layers and checks them."""
    series, layer, elsewhere = copy_series(tmp_path / "series"), tmp_path / "acme", tmp_path / "elsewhere"
    shutil.copytree(EXAMPLE, layer)
    elsewhere.mkdir()
    monkeypatch.setenv("C128PATCH_SERIES", str(series))
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.chdir(elsewhere)
    assert invoke("apply", "--sglang-rev", "v0.5.23", "--repo", upstream_clone, "--layer", layer).code == 0
    said = f"layers from the tree's provenance: {layer.resolve()}"
    res = invoke("apply", "--sglang-rev", "v0.5.23", "--repo", upstream_clone, as_json=False)
    assert res.code == 0 and said in res.err and "+ layer acme 1" in res.text and "nothing to do" in res.text, \
        (res.err, res.text)
    res = invoke("contract", "--tree", upstream_clone, "--no-nvcc")
    assert res.out["layers_in_effect"]["from"] == "the tree's provenance", res.out
    assert [r["name"] for r in res.out["layers_in_effect"]["layers"]] == ["acme"], res.out
    assert said in invoke("contract", "--tree", upstream_clone, "--no-nvcc", as_json=False).err


def _git_calls(monkeypatch) -> list[str]:
    """The git subcommands run from now on (``Git._raw``), in order; the list is the caller's to clear."""
    calls: list[str] = []
    raw = Git._raw
    monkeypatch.setattr(Git, "_raw", lambda self, args, *a, **k: calls.append(args[0]) or raw(self, args, *a, **k))
    return calls


def _four_plain_entries(tmp_path: Path):
    """The shipped series and a layer of four plain patches e0..e3 (e0 adds site_a.py, e1 site_b.py, e2 changes
    site_a.py again, e3 adds site_c.py)."""
    def blob(text: str) -> str:
        return hashlib.sha1(b"blob %d\0" % len(text) + text.encode()).hexdigest()

    changes = [("site_a.py", "", "A = 1\n"), ("site_b.py", "", "B = 1\n"), ("site_a.py", "A = 1\n", "A = 2\n"),
               ("site_c.py", "", "C = 1\n")]
    entries, files = "", {}
    for i, (name, old, new) in enumerate(changes):
        path = f"python/sglang/{name}"
        head = (f"new file mode 100644\nindex {'0' * 40}..{blob(new)}\n--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n"
                if not old else f"index {blob(old)}..{blob(new)} 100644\n--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n"
                f"-{old}")
        data = (f"From {'0' * 40} Mon Sep 17 00:00:00 2001\nFrom: t <t@t>\nSubject: [PATCH] e{i}\n\n---\n"
                f"diff --git a/{path} b/{path}\n{head}+{new}").encode()
        entries += patch_entry(f"e{i}", f"{i + 1:04d}-e{i}.patch", data)
        files[f"patches/{i + 1:04d}-e{i}.patch"] = data
    return stack(load_series(REPO_ROOT), [write_layer(tmp_path / "site", entries=entries, files=files)])


def test_the_fresh_replay_takes_a_branch_s_trees_only_where_each_is_its_entry_s_own_change(
        tmp_path, sglang_release_repo, monkeypatch):
    """apply's proof replays a run of plain patches in one git apply and takes each entry's trees from the branch it
    made (``known``) only where the pairs chain from the replay's tree and each one's diff is its entry's change: the
    trees are those of one write-tree per entry, whatever the branch says (an entry whose file another one changes
    starts a new run)."""
    from c128patch.ops.replay import replay_in_index

    series = _four_plain_entries(tmp_path)
    git = Git(git_dir=sglang_release_repo)
    commit = git.rev_parse("v0.5.23")
    calls = _git_calls(monkeypatch)

    def replayed(name: str, known: dict | None = None) -> tuple[dict, list, int]:
        (tmp_path / name).mkdir()
        trees: dict = {}
        calls.clear()
        result, _ = replay_in_index(series, git, "v0.5.23", commit, tmp_path / name / "index", trees=trees,
                                    known=known)
        assert result.ok
        return trees, [(e.name, e.status) for e in result.entries], calls.count("apply") + calls.count("write-tree")

    each, rows, calls_each = replayed("each")
    taken, taken_rows, calls_taken = replayed("taken", each)
    assert taken == each and taken_rows == rows and calls_taken < calls_each
    idx = Git(git_dir=sglang_release_repo, env={"GIT_INDEX_FILE": str(tmp_path / "forge.index"),
                                                "GIT_WORK_TREE": str(tmp_path)})
    extra = git.out("hash-object", "-w", "--stdin", input="x\n")
    with_extra = {}
    for name in ("site/e0", "site/e1"):  # each tree with a user's file more
        idx.run("read-tree", each[name][1])
        idx.run("update-index", "--add", "--cacheinfo", f"100644,{extra},python/sglang/site_x.py")
        with_extra[name] = idx.out("write-tree")
    amended = {**each, "site/e0": (each["site/e0"][0], with_extra["site/e0"]),  # the file amended into e0
               "site/e1": (with_extra["site/e0"], with_extra["site/e1"])}
    on_another = {**each, "site/e1": (with_extra["site/e0"], with_extra["site/e1"])}  # e1's change, on another tree
    shifted = {**each, "site/e0": (each["site/e0"][0], each["site/e1"][1])}  # another entry's tree
    for name, known in (("amended", amended), ("on-another", on_another), ("shifted", shifted)):
        assert replayed(name, known)[:2] == (each, rows), name


def test_the_second_add_entry_prints_a_next_that_works_where_the_first_ones_tree_is(tmp_path, applied_clone):
    """The first entry's next: `apply ... --tree <tree>-acme` makes the stacked tree; the second's was the same
    apply, which then refused (the branch there exists) advising `git branch -D`. It takes the tree that exists:
    a rebase onto the same base, which replays the grown layer; each as printed."""
    layer = tmp_path / "acme"
    assert invoke("layer", "new", layer, "--name", "acme").code == 0
    anchor = '    SGLANG_SPEC_TP_SYNC = EnvStr("all")\n'
    nexts = []
    for name in ("one", "two"):
        sha = commit_on(applied_clone, ENV_PY, anchor, f"{anchor}    # acme: {name}\n", f"acme: {name}")
        anchor += f"    # acme: {name}\n"
        res = invoke("layer", "add-entry", "--layer", layer, "--from-commit", sha, "--tree", applied_clone,
                     "--name", name, "--why", "w", as_json=False)
        assert res.code == 0, res.text
        nexts.append(res.text.split("  next: ", 1)[1].strip())
        ran = run_printed(nexts[-1])
        assert ran.returncode == 0, (nexts[-1], ran.stderr)
    assert nexts[0].startswith("c128patch apply ") and nexts[1].startswith("c128patch rebase --onto v0.5.23 ")
    assert load_series(layer).version == "2"  # two stacks, two names: the second entry bumped it (both read "1")
    stacked = Git(worktree=Path(f"{applied_clone}-acme"))
    assert [c for c in stacked.out("log", "--format=%s", "-3").splitlines()][1:] == ["acme: two", "acme: one"]


def test_a_commit_made_on_one_the_layer_lacks_is_refused_naming_it_then_both_in_order_apply(tmp_path, applied_clone):
    """Helper 169: `add-entry HEAD` of a commit that edits the line its parent adds (the parent in no layer) wrote the
    entry, exit 0, and printed a `next: c128patch apply ... --layer` that stopped ("patch failed"). Now refused before
    anything is written, naming the parent; added oldest first, both are taken and the printed apply is proven."""
    layer = tmp_path / "acme"
    assert invoke("layer", "new", layer, "--name", "acme").code == 0
    anchor = '    SGLANG_SPEC_TP_SYNC = EnvStr("all")\n'
    one = commit_on(applied_clone, ENV_PY, anchor, f"{anchor}    # acme: one\n", "acme: one")
    commit_on(applied_clone, ENV_PY, "    # acme: one\n", "    # acme: one, changed\n    # acme: two\n", "acme: two")
    before = folder_files(layer)
    res = invoke("layer", "add-entry", "--layer", layer, "--from-commit", "HEAD", "--tree", applied_clone, "--name",
                 "two", "--why", "w", as_json=False)
    assert res.code != 0 and "does not apply" in res.err and one[:12] in res.err, res.err
    assert len(res.err.strip().splitlines()) == 1 and "nothing was written" in res.err
    assert folder_files(layer) == before
    for rev, name in (("HEAD~1", "one"), ("HEAD", "two")):
        res = invoke("layer", "add-entry", "--layer", layer, "--from-commit", rev, "--tree", applied_clone, "--name",
                     name, "--why", "w", as_json=False)
        assert res.code == 0, res.err
    assert [e.name for e in load_series(layer).entries] == ["one", "two"]
    ran = run_printed(res.text.split("  next: ", 1)[1].strip())
    assert ran.returncode == 0 and "identical to a fresh apply" in ran.stdout + ran.stderr, ran.stderr


def test_two_commits_added_child_first_are_placed_in_the_branch_s_order_and_apply(tmp_path, applied_clone):
    """Helper 170: two commits of the branch added child first (`add-entry HEAD`, then `HEAD~1`) were written as
    [two, one], out of the branch's order; the second is placed before the entry its commit is below, and says so."""
    layer = tmp_path / "acme"
    assert invoke("layer", "new", layer, "--name", "acme").code == 0
    anchor, other = '    SGLANG_SPEC_TP_SYNC = EnvStr("all")\n', "    SGLANG_USE_MODELSCOPE = EnvBool(False)\n"
    commit_on(applied_clone, ENV_PY, anchor, f"{anchor}    # acme: one\n", "acme: one")
    commit_on(applied_clone, ENV_PY, other, f"{other}    # acme: two\n", "acme: two")
    for rev, name in (("HEAD", "two"), ("HEAD~1", "one")):
        res = invoke("layer", "add-entry", "--layer", layer, "--from-commit", rev, "--tree", applied_clone, "--name",
                     name, "--why", "w", as_json=False)
        assert res.code == 0, res.err
    assert "placed before acme/two" in res.text, res.text
    assert [e.name for e in load_series(layer).entries] == ["one", "two"]
    ran = run_printed(res.text.split("  next: ", 1)[1].strip())
    assert ran.returncode == 0 and "identical to a fresh apply" in ran.stdout + ran.stderr, ran.stderr


def test_add_entry_into_another_folder_of_the_trees_layer_prints_a_next_naming_that_folder(tmp_path, applied_clone):
    """Helper 153: a tree applied with layer acme from one folder, its commit added to another folder of acme (a copy
    of the workspace, a second clone of the layer's repository): the printed rebase named the tree's recorded folder,
    whose layer lacks the new entry, not the folder just written."""
    layer = tmp_path / "acme"
    assert invoke("layer", "new", layer, "--name", "acme").code == 0
    anchor = '    SGLANG_SPEC_TP_SYNC = EnvStr("all")\n'
    sha = commit_on(applied_clone, ENV_PY, anchor, f"{anchor}    # acme: one\n", "acme: one")
    res = invoke("layer", "add-entry", "--layer", layer, "--from-commit", sha, "--tree", applied_clone, "--name", "one",
                 "--why", "w", as_json=False)
    assert res.code == 0 and run_printed(res.text.split("  next: ", 1)[1].strip()).returncode == 0
    stacked, other = Path(f"{applied_clone}-acme"), tmp_path / "elsewhere" / "acme"
    shutil.copytree(layer, other, symlinks=True)
    anchor += "    # acme: one\n"
    sha = commit_on(stacked, ENV_PY, anchor, f"{anchor}    # acme: two\n", "acme: two")
    res = invoke("layer", "add-entry", "--layer", other, "--from-commit", sha, "--tree", stacked, "--name", "two",
                 "--why", "w", as_json=False)
    assert res.code == 0, res.text
    printed = res.text.split("  next: ", 1)[1].strip()
    assert shlex.split(printed)[-2:] == ["--layer", str(other.resolve())], printed
    ran = run_printed(printed)
    assert ran.returncode == 0, (printed, ran.stderr)
    assert "layer acme 2" in ran.stdout + ran.stderr


def test_a_layered_trees_commit_without_an_entry_gets_refreshs_own_refusal_with_the_add_entry_that_works(
        sglang_release_repo, tmp_path):
    """After a rebase of a layered tree holding a commit of the user's, the note said our series "would need files
    for v0.5.23" (refresh itself refuses, for another reason); it now says refresh's reason, and the add-entry it
    names (the tree's layer, the commit's subject) runs as printed."""
    series, layer, tree = copy_series(tmp_path / "series"), tmp_path / "acme", tmp_path / "t"
    shutil.copytree(EXAMPLE, layer)
    assert invoke("apply", "--sglang-rev", "v0.5.22", "--repo", str(sglang_release_repo), "--tree", str(tree),
                  "--series", str(series), "--layer", str(layer)).code == 0
    git = Git(worktree=tree)
    path = tree / "python/sglang/srt/mem_cache/deepseek_v4_memory_pool.py"
    path.write_text(path.read_text() + "# ours\n")
    git.run(*ID, "commit", "-qam", "acme: a pool note")
    moved = invoke("rebase", "--onto", "v0.5.23", "--tree", str(tree), "--series", str(series), "--layer", str(layer),
                   as_json=False)
    assert moved.code == 0, moved.err
    assert "note: refresh would refuse: commit " in moved.text and "would need files" not in moved.text, moved.text
    add = printed_command(moved.text, "c128patch layer add-entry")
    assert shlex.split(add)[:5] == ["c128patch", "layer", "add-entry", "--layer", str(layer)], add
    ran = run_printed(add)
    assert ran.returncode == 0, ran.stderr
    assert [e.name for e in load_series(layer).entries][-1] == "acme-a-pool-note"


# ------------------------------------------------- left out on an older release than its own base: never "merged"
ZMQ = ('    SGLANG_ZMQ_SOURCE_IP = EnvStr(None)\n', '    SGLANG_ZMQ_SOURCE_IP = EnvStr("10.0.0.1")\n')


ZMQ_STACK = ("series", "conf", "sglang-conf")  # zmq_stack's folders: (series, layer, tree)


@pytest.fixture(scope="module")
def zmq_stack_built(tmp_path_factory: pytest.TempPathFactory, sglang_release_repo: Path) -> Path:
    """Finding 07's layer: one entry made on v0.5.23 (a line upstream added after v0.5.21), applied with our series
    (a copy) in a tree on v0.5.23: ZMQ_STACK's folders in ``work``, made once, and a copy of them as made in
    ``pristine`` (``zmq_stack`` puts them back for each test)."""
    root = tmp_path_factory.mktemp("zmq")
    scratch = small_clone(sglang_release_repo, root / "scratch", "python/sglang/srt/speculative").worktree
    sha = commit_on(scratch, ENV_PY, *ZMQ, "zmq source ip")
    data = format_patch(Git(worktree=scratch), sha, "conf/zmq-source-ip", "SGLANG_ZMQ_SOURCE_IP")
    gate = ('\n[[gates]]\nname = "SGLANG_ZMQ_SOURCE_IP"\ndeclared_by = "series"\ntype = "str"\n'
            'default = "\\"10.0.0.1\\""\nenables = "site: zmq source ip"\n')
    work = root / "work"
    series, layer, tree = (work / name for name in ZMQ_STACK)
    write_layer(layer, name="conf", gates=gate, files={"patches/0001-zmq-source-ip.patch": data},
                entries=patch_entry("zmq-source-ip", "0001-zmq-source-ip.patch", data, "SGLANG_ZMQ_SOURCE_IP"))
    copy_series(series)
    assert invoke("apply", "--sglang-rev", "v0.5.23", "--repo", sglang_release_repo, "--tree", tree,
                  "--series", series, "--layer", layer).code == 0
    subprocess.run(["cp", "-a", str(work), str(root / "pristine")], check=True)
    return root


@pytest.fixture
def zmq_stack(zmq_stack_built: Path) -> tuple[Path, Path, Path]:
    """(series, layer, tree) of ``zmq_stack_built``, put back as made for each test to change: at the same paths (cp -a
    of the copy made then), since the tree's git dir names its layer's folder by its absolute path."""
    work = zmq_stack_built / "work"
    shutil.rmtree(work)
    subprocess.run(["cp", "-a", str(zmq_stack_built / "pristine"), str(work)], check=True)
    series, layer, tree = (work / name for name in ZMQ_STACK)
    return series, layer, tree


def zmq_row(series: Path, layer: Path, rev: str) -> dict:
    res = invoke("check", "--sglang-rev", rev, "--series", series, "--layer", layer)
    return next(e for e in res.out["revs"][0]["entries"] if e["name"] == "conf/zmq-source-ip")


def test_a_skip_on_a_backward_rebase_never_records_the_entry_merged_upstream(zmq_stack):
    """Finding 07: the stop of `rebase --onto v0.5.21` (an ancestor of the entry's base v0.5.23) offers to leave it
    out there (no "merged upstream" way); the printed skip, then what the rebase prints next, run as printed, record
    no merged_in: the entry still applies on its own base (it was "skipped: merged upstream" there, and the wheel
    for 0.5.23 lost it)."""
    series, layer, tree = zmq_stack
    stopped = invoke("rebase", "--onto", "v0.5.21", "--tree", tree, as_json=False)
    assert stopped.code == 1 and "  merged upstream: " not in stopped.err and "rebase --drop" not in stopped.err
    assert "  leave it out on v0.5.21 (older than its base v0.5.23; not merged upstream" in stopped.err, stopped.err
    skipped = run_printed(printed_command(stopped.err, "c128patch rebase --skip"))
    assert skipped.returncode == 0, skipped.stderr
    (line,) = [x for x in skipped.stdout.splitlines() if x.startswith("report: ")]
    assert "older than its base v0.5.23" in table_column(skipped.stdout, 3), skipped.stdout  # the entry's detail
    assert "merged_in = " not in skipped.stdout, skipped.stdout
    if "; next: " in line:  # whatever comes next, as printed, does not make it merged
        assert run_printed(line.split("; next: ", 1)[1]).returncode == 0
    assert "not recorded as merged upstream" in line or "; next: " in line, line
    if "where it applies: " in line:
        shown = run_printed(printed_command(line, "c128patch check"))
        assert "conf/zmq-source-ip" in shown.stdout and "Usage:" not in shown.stderr, shown.stderr
    refreshed = run_printed(shlex.join(["c128patch", "refresh", "--variant", "--tree", str(tree), "--series",
                                        str(series), "--layer", str(layer)]))
    assert refreshed.returncode == 0 and "not recorded as merged upstream" in refreshed.stdout, refreshed.stdout
    assert "merged_in" not in (layer / "patches" / "series.toml").read_text()
    assert zmq_row(series, layer, "v0.5.23")["status"] == "clean"


def test_status_after_a_skip_on_a_backward_rebase_proves_the_tree_less_the_entry_left_out(zmq_stack):
    """The rebase and refresh --check say the tree is a fresh apply without the skipped entry; status replayed the
    whole stack, said "differs: cannot prove: the series does not replay" and exited 1 (it reads the provenance's
    left-out entries as refresh does)."""
    series, layer, tree = zmq_stack
    assert invoke("rebase", "--onto", "v0.5.21", "--tree", tree).code == 1
    assert invoke("rebase", "--skip", "--tree", tree).code == 0
    res = invoke("status", "--prove", "--tree", tree, "--series", series, "--layer", layer, as_json=False)
    assert res.code == 0 and "equals the series: identical to a fresh apply of " in res.text, res.text
    assert "without conf/zmq-source-ip on v0.5.21" in res.text and "cannot prove" not in res.text, res.text


def test_a_rebase_stop_s_error_object_and_the_skip_s_report_say_where_their_layers_came_from(zmq_stack):
    """docs/schemas: every report and error object of a verb that reads a series carries layers_in_effect. A stop's
    error object had none (the layers from the tree's provenance); `--skip`, whose stack is the journal's, said
    "from": "--layer", an option nobody passed."""
    _, _, tree = zmq_stack
    stopped = invoke("rebase", "--onto", "v0.5.21", "--tree", tree)
    assert stopped.code == 1 and "error" in stopped.out, stopped.out
    assert stopped.out["layers_in_effect"]["from"] == "the tree's provenance", sorted(stopped.out)
    assert [r["name"] for r in stopped.out["layers_in_effect"]["layers"]] == ["conf"]
    skipped = invoke("rebase", "--skip", "--tree", tree)
    assert skipped.code == 0 and skipped.out["layers_in_effect"]["from"] == "the rebase journal", skipped.out


def test_an_entry_skipped_on_an_older_release_comes_back_below_the_users_commit(zmq_stack):
    """A commit of the user's on the branch, a rebase onto v0.5.21 that skips the layer's entry, then back onto
    v0.5.23: the entry was replayed above the user's commit (after the branch's last entry, where the commit sat), so
    the printed `layer add-entry --from-commit HEAD~1` named the layer's entry ("is entry ... already"). The user's
    commits stay on top of the stack."""
    _, layer, tree = zmq_stack
    git = Git(worktree=tree)
    cuh = tree / "python/sglang/kernels/jit/csrc/deepseek_v4/c128_online_v2.cuh"
    cuh.write_text(cuh.read_text() + "// site\n")
    git.run(*ID, "commit", "-qam", "site: a note")
    assert invoke("rebase", "--onto", "v0.5.21", "--tree", tree).code == 1
    assert invoke("rebase", "--skip", "--tree", tree).code == 0
    back = invoke("rebase", "--onto", "v0.5.23", "--tree", tree)
    assert back.code == 0, back.err
    assert git.out("log", "-1", "--format=%s", "HEAD~1") == "site: a note", git.out("log", "--oneline", "-4")
    assert git.out("log", "-1", "--format=%(trailers:key=C128patch-Entry,valueonly)", "HEAD~2").strip() == \
        "conf/zmq-source-ip"
    add = invoke("layer", "add-entry", "--layer", layer, "--from-commit", "HEAD~1", "--tree", tree, "--why", "w",
                 as_json=False)
    assert "is entry 'conf/zmq-source-ip' already" not in add.err, add.err


def test_resolved_to_upstream_s_side_on_an_older_release_is_left_out_there_not_merged(zmq_stack):
    """Finding 07 by the other way: the conflict resolved wholly to upstream's side on v0.5.21, `--continue`: the
    entry is left out there ("skipped"), not "dropped-as-merged"; refresh records no merged_in; `--drop` at such a
    stop is refused in one line naming the skip."""
    series, layer, tree = zmq_stack
    assert invoke("rebase", "--onto", "v0.5.21", "--tree", tree).code == 1
    drop = invoke("rebase", "--drop", "conf/zmq-source-ip", "--tree", tree, as_json=False)
    assert drop.code == 2 and "older than its base v0.5.23" in drop.err, drop.err
    said = [line for line in drop.err.strip().splitlines() if not line.startswith("layers from the rebase journal: ")]
    assert len(said) == 1 and "c128patch rebase --skip" in said[0], drop.err  # (the layers in effect said first)
    git = Git(worktree=tree)
    git.run("checkout", "HEAD", "--", ENV_PY)
    git.run("add", "--", ENV_PY)
    done = invoke("rebase", "--continue", "--tree", tree)
    assert done.code == 0, done.err
    row = next(e for e in done.out["entries"] if e["name"] == "conf/zmq-source-ip")
    assert row["status"] == "skipped" and "older than its base v0.5.23" in row["detail"], row
    refreshed = invoke("refresh", "--variant", "--tree", tree, "--series", series, "--layer", layer)
    assert refreshed.code == 0, refreshed.err
    assert "merged_in" not in (layer / "patches" / "series.toml").read_text()
    assert zmq_row(series, layer, "v0.5.23")["status"] == "clean"


def test_a_hand_written_merged_in_that_the_entry_s_own_base_contains_is_ignored_and_a_lint_error(
        zmq_stack, sglang_release_repo):
    """Defence in depth: merged_in naming v0.5.21 (an ancestor of the entry's base v0.5.23) cannot be true; check
    (as apply and wheel, which plan the same way) still applies the entry on v0.5.23, and lint fails naming it."""
    series, layer, _ = zmq_stack
    old = Git(git_dir=sglang_release_repo).rev_parse("v0.5.21")
    manifest = layer / "patches" / "series.toml"
    manifest.write_text(manifest.read_text().replace('kind = "patch"\n', f'kind = "patch"\nmerged_in = "{old}"\n'))
    assert zmq_row(series, layer, "v0.5.23")["status"] == "clean"
    lint = invoke("lint", "--series", series, "--layer", layer, "--repo", sglang_release_repo, as_json=False)
    assert lint.code == 1 and f"merged_in = {old[:12]} is in v0.5.23" in lint.text + lint.err, lint.text


def test_a_commit_whose_subject_holds_controls_becomes_a_layer_entry_by_the_command_printed(tmp_path, applied_clone):
    """Helper 147: the rebase's note printed ``layer add-entry ... --why $'site fix \\x1b]8;;...'``, the commit's
    subject as it is; add-entry refuses a --why that is not one printable line, so the command printed failed as
    printed. The --why printed is the subject as add-entry takes it."""
    anchor = '    SGLANG_SPEC_TP_SYNC = EnvStr("all")\n'
    commit_on(applied_clone, ENV_PY, anchor, anchor + "    # site: the note\n",
              "site fix \x1b]8;;http://evil.example\x07link\x1b]8;;\x07\u2028tail")
    back = invoke("rebase", "--onto", "v0.5.22", "--tree", applied_clone, as_json=False)
    assert back.code == 0, back.err
    made = run_printed(printed_command(back.text, "c128patch layer new "))
    assert made.returncode == 0, made.stdout + made.stderr
    [entry] = load_series(tmp_path / "layers" / "local").entries
    assert entry.why == "site fix ]8;;http://evil.examplelink]8;; tail", entry.why


def test_apply_s_proof_takes_a_branch_s_trees_without_a_write_tree_per_entry_only_where_each_is_the_replay_s(
        tmp_path, sglang_release_repo, monkeypatch):
    """apply's fresh replay (``fresh_replay(known=...)``) writes no tree per entry: it takes the branch's pairs where
    they chain from the commit's tree to the replay's, each changes only its entry's paths, and an entry a later one
    touches again (e0: site_a.py, e2 changes it) ends at the tree the replay wrote after it (``ops.replay.own_pairs``).
    A branch amended, shifted, or holding another content for site_a.py between e0 and e2 (the final tree the same)
    is never taken: its trees are those of one write-tree per entry."""
    from c128patch.ops.equivalence import fresh_replay
    from c128patch.ops.replay import shared_later
    from c128patch.series.plan import plan

    series = _four_plain_entries(tmp_path)
    git = Git(git_dir=sglang_release_repo)
    commit = git.rev_parse("v0.5.23")
    calls = _git_calls(monkeypatch)

    def replayed(known: dict | None = None) -> tuple[dict, str, int]:
        calls.clear()
        result, tree, trees = fresh_replay(series, git, "v0.5.23", commit, known=known)
        assert result.ok
        return trees, tree, calls.count("write-tree")

    each, final, writes_each = replayed()
    taken, taken_final, writes_taken = replayed(each)
    anchored = shared_later(plan(series, git, commit))  # (e0, and ours whose file a later one changes again)
    assert "site/e0" in anchored and "site/e2" not in anchored, anchored
    # the final tree and one per anchor (a tree per entry took 10 write-trees here)
    assert (taken, taken_final) == (each, final) and writes_taken == 1 + len(anchored), (writes_taken, writes_each)
    idx = Git(git_dir=sglang_release_repo, env={"GIT_INDEX_FILE": str(tmp_path / "forge.index"),
                                                "GIT_WORK_TREE": str(tmp_path)})

    def forged(tree: str, path: str, text: str) -> str:
        idx.run("read-tree", tree)
        idx.run("update-index", "--add", "--cacheinfo",
                f"100644,{git.out('hash-object', '-w', '--stdin', input=text)},python/sglang/{path}")
        return idx.out("write-tree")

    e0, e1, e2 = each["site/e0"], each["site/e1"], each["site/e2"]
    nine = forged(e0[1], "site_a.py", "A = 9\n")  # site_a.py as no replay leaves it after e0
    nine_b = forged(e1[1], "site_a.py", "A = 9\n")
    other = {**each, "site/e0": (e0[0], nine), "site/e1": (nine, nine_b), "site/e2": (nine_b, e2[1])}
    extra = forged(e0[1], "site_x.py", "x\n")
    amended = {**each, "site/e0": (e0[0], extra), "site/e1": (extra, forged(e1[1], "site_x.py", "x\n"))}
    shifted = {**each, "site/e0": (e0[0], e1[1])}
    c_early, c_early_2 = forged(e1[1], "site_c.py", "C = 1\n"), forged(e2[1], "site_c.py", "C = 1\n")
    moved = {**each, "site/e1": (e1[0], c_early), "site/e2": (c_early, c_early_2),  # e3's file made by e1
             "site/e3": (c_early_2, each["site/e3"][1])}
    assert c_early_2 == each["site/e3"][1]
    for name, known in (("another content between", other), ("amended", amended), ("shifted", shifted),
                        ("another entry's change", moved)):
        assert replayed(known)[:2] == (each, final), name


def test_a_replay_writes_its_overlays_blobs_in_one_git_call(tmp_path, sglang_release_repo, monkeypatch):
    """The series' overlays (5) are written by one ``hash-object -w`` (``series.plan.write_blobs``), not one each; the
    replay's tree is the same."""
    from c128patch.ops.replay import replay_in_index
    from c128patch.series import plan as plan_module
    from c128patch.series.plan import index_git

    series = load_series(REPO_ROOT)
    git = Git(git_dir=sglang_release_repo)
    commit = git.rev_parse("v0.5.23")
    assert sum(e.kind == "overlay" for e in series.entries) > 1
    calls: list[list[str]] = []
    raw = Git._raw
    monkeypatch.setattr(Git, "_raw", lambda self, args, *a, **k: calls.append(args) or raw(self, args, *a, **k))
    trees = []
    for name, written in (("batched", {}), ("each", None)):
        monkeypatch.setattr(plan_module, "_WRITTEN", {})
        if written is None:  # one call each, as before
            monkeypatch.setattr("c128patch.ops.replay.write_blobs", lambda git, paths: None)
        calls.clear()
        result, _ = replay_in_index(series, git, "v0.5.23", commit, tmp_path / f"{name}.index")
        assert result.ok
        trees.append(index_git(git, tmp_path / f"{name}.index").out("write-tree"))
        hashed = [a for a in calls if a[0] == "hash-object"]
        if written is not None:
            assert len(hashed) == 1, hashed
    assert trees[0] == trees[1]


def test_a_layer_manifest_that_is_a_fifo_or_a_dangling_link_is_said_as_such_not_missing(tmp_path):
    """Helper 161: a layer whose patches/series.toml was a FIFO or a link to nothing was "no layer at L: no
    patches/series.toml (make one with c128patch layer new L --name NAME)", and that printed fix failed ("exists
    already"). What is there is said in one line, as for --series; only a folder without one is "no layer"."""
    for name, make in (("fifo", os.mkfifo), ("dangling", lambda p: p.symlink_to(tmp_path / "nothing"))):
        (tmp_path / name / "patches").mkdir(parents=True)
        make(tmp_path / name / "patches" / "series.toml")
        res = invoke("lint", "--offline", "--layer", tmp_path / name, as_json=False)
        assert res.code == 2 and len(res.err.strip().splitlines()) == 1, res.err
        assert "no layer at" not in res.err and "patches/series.toml" in res.err, res.err
        assert ("not a regular file" if name == "fifo" else "symlink") in res.err, res.err


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_add_entry_where_the_new_patchs_name_holds_no_regular_file_is_one_line(tmp_path, applied_clone, kind):
    """Helper 163: a layer holding a folder (or a FIFO) at the name the new entry's patch takes
    (`patches/0001-<subject>.patch`) gave `layer add-entry` IsADirectoryError's traceback from its trial copy (and
    past the trial, the transaction would have failed onto it). One line naming it now, nothing written."""
    anchor = '    SGLANG_SPEC_TP_SYNC = EnvStr("all")\n'
    commit_on(applied_clone, ENV_PY, anchor, anchor + "    # acme: the site's note\n", "acme: the site's note")
    layer = tmp_path / "acme"
    assert invoke("layer", "new", layer, "--name", "acme").code == 0
    there = layer / "patches" / "0001-acme-the-site-s-note.patch"
    there.mkdir() if kind == "folder" else os.mkfifo(there)
    files = {p: p.read_bytes() for p in layer.rglob("*") if p.is_file()}
    line = refused(["layer", "add-entry", "--layer", layer, "--from-commit", "HEAD", "--tree", applied_clone, "--why",
                    "w"], applied_clone, "patches/0001-acme-the-site-s-note.patch is a")
    assert "not a regular file" in line and "nothing was written" in line, line
    assert {p: p.read_bytes() for p in layer.rglob("*") if p.is_file()} == files


def test_add_entry_whose_trial_copy_cannot_be_written_is_one_line_naming_it(tmp_path, applied_clone):
    """Helper 183: a full TMPDIR or ``ulimit -f`` while add-entry writes the layer's trial copy (its lint and replay):
    "cannot write in a folder (File too large) ... (c128patch status says what is left in a tree)", naming no folder.
    Now one line naming the trial copy and the layer, which is left as it was."""
    import resource

    anchor = '    SGLANG_SPEC_TP_SYNC = EnvStr("all")\n'
    sha = commit_on(applied_clone, ENV_PY, anchor, anchor + "    # acme: padding\n" * 2000, "acme: a big comment")
    layer = tmp_path / "acme"
    assert invoke("layer", "new", layer, "--name", "acme").code == 0
    before = {p: p.read_bytes() for p in layer.rglob("*") if p.is_file()}

    def small() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))

    proc = subprocess.run([sys.executable, "-m", "c128patch", "layer", "add-entry", "--layer", str(layer),
                           "--from-commit", sha, "--tree", str(applied_clone), "--why", "w"],
                          capture_output=True, text=True, timeout=300, preexec_fn=small,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})  # (no .pyc cut short by the limit)
    (line,) = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "its trial copy in " in line and "(File too large)" in line, proc.stderr
    assert f"nothing was written in {layer};" in line, line
    assert {p: p.read_bytes() for p in layer.rglob("*") if p.is_file()} == before
