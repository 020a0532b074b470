"""The behavioural tier's own environment (issue 38 item 1, ``fit/env.py``): the target's requirements
filtered as untrusted input, the committed locks, the cached build, the CUDA-only stand-ins, and the tier
cut off from the network (issue 36 item 3)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import pytest

from c128patch.errors import C128Error
from c128patch.fit import env, sandbox, treecheck
from c128patch.progress import NullReporter
from c128patch.series.manifest import load_series
from c128patch.upstream.releases import wheel_for
from support import RELEASES, REPO_ROOT, invoke, share_environment

SERIES = load_series(REPO_ROOT)
CUDA = env.cuda_only(SERIES)
TRIED = {name for name, row in CUDA.items() if row.get("tried")}  # installed, kept where they import
MODULE = "python/sglang/probe.py"


def lock_requirements(text: str) -> list[str]:
    return [line.removeprefix("# requirement: ") for line in text.splitlines() if line.startswith("# requirement: ")]


def release_requirements(rev: str) -> tuple[list[str], list[str]]:
    return env.filtered(env.wheel_requirements(wheel_for(rev.removeprefix("v"))), CUDA)


def test_the_release_requirements_are_filtered_for_a_cpu_host():
    lines = env.wheel_requirements(wheel_for("0.5.23"))
    assert len(lines) == 139 and any("extra ==" in line for line in lines)
    keep, dropped = release_requirements("v0.5.23")
    assert [r for r in keep if r.startswith("torch")] == ["torch", "torchvision"]  # torch: pinned by constraint
    assert {"flashinfer-python", "sglang-kernel", "cuda-python", "nvidia-cutlass-dsl",
            "torchaudio", "torchcodec", "deepseek-recipe", "tml-renderers", "py-spy"} <= set(dropped)
    assert not set(dropped) - set(CUDA) and TRIED == {"torchvision"}
    names = {r.split("=")[0].split("<")[0].split(">")[0].lower() for r in keep}
    assert names & set(CUDA) == TRIED and "av" not in names and "decord2" not in names  # aarch64 only
    assert {"orjson", "psutil", "msgspec", "numpy", "transformers==5.19.0"} <= {*names, *keep}
    assert all("[" not in r and ";" not in r for r in keep)  # no extras, markers evaluated here


@pytest.mark.parametrize("line", ["evil @ https://example.invalid/evil-1.0-py3-none-any.whl",
                                  "evil @ git+https://example.invalid/evil.git", "--extra-index-url https://x.invalid",
                                  "--index-url=https://x.invalid/simple", "-e .", "./evil", "evil @ file:///tmp/evil"])
def test_a_direct_url_a_vcs_reference_a_path_or_an_option_is_refused(line):
    with pytest.raises(C128Error, match="refused") as caught:
        env.filtered(["numpy", line], CUDA)
    assert line in caught.value.message and "\n" not in caught.value.message


def test_a_tree_with_a_pyproject_gives_its_own_requirements(tmp_path):
    (tmp_path / "python").mkdir()
    (tmp_path / "python" / "pyproject.toml").write_text(
        '[project]\nname = "sglang"\ndependencies = ["numpy", "flashinfer_python==0.7.2", "torch==2.14.1"]\n')
    lines, source = env.declared(tmp_path)
    assert source == "python/pyproject.toml"
    assert env.filtered(lines, CUDA) == (["numpy", "torch"], ["flashinfer-python"])
    (tmp_path / "python" / "pyproject.toml").write_text('[project]\ndependencies = ["x @ git+https://e.invalid/x"]\n')
    with pytest.raises(C128Error, match="direct URL, VCS reference or path: refused"):
        env.filtered(*env.declared(tmp_path)[:1], CUDA)


@pytest.mark.parametrize("kind", ["digits", "deep", "link"])
def test_a_hostile_tree_pyproject_is_one_line_not_a_traceback_nor_read_through_a_link(tmp_path, kind):
    """Helper 173: the target tree's ``python/pyproject.toml`` (the behavioural tier's requirements) was read through
    a link out of the tree (its requirements taken from a file of the link's choosing), and a number past Python's
    digit limit (a ValueError tomllib does not wrap) or a deep array (RecursionError) was a traceback. Now one line
    naming it."""
    tree = tmp_path / "tree"
    (tree / "python").mkdir(parents=True)
    pyproject = tree / "python" / "pyproject.toml"
    if kind == "link":
        (tmp_path / "outside.toml").write_text('[project]\ndependencies = ["evil"]\n')
        pyproject.symlink_to(tmp_path / "outside.toml")
    else:
        pyproject.write_text(f"x = {'9' * 5000}\n" if kind == "digits" else "x = " + "[" * 3000 + "]" * 3000 + "\n")
    with pytest.raises(C128Error) as caught:
        env.declared(tree)
    assert "pyproject.toml" in caught.value.message and "\n" not in caught.value.message, caught.value.message


@pytest.mark.parametrize("rev", RELEASES)
def test_each_committed_lock_is_what_the_script_writes_from_its_release(rev):
    text = (SERIES.patches_dir / "env" / f"{rev}.lock").read_text()
    keep, dropped = release_requirements(rev)
    assert lock_requirements(text) == keep
    assert f"# dropped: {' '.join(dropped)}\n" in text and text.startswith(
        f"# c128patch tier environment lock: {env.host()}; {env.TORCH_PIN}\n")
    rows = [line for line in text.splitlines() if not line.startswith("#")]
    assert len(rows) > 100 and all(" --hash=sha256:" in row and len(row.split(":")[-1]) == 64 for row in rows)
    locked = {row.split("==")[0] for row in rows}
    assert locked & set(CUDA) == TRIED and "torch==2.13.0+cpu" in {row.split(" ")[0] for row in rows}
    assert {"orjson", "psutil", "msgspec", "numpy", "triton", "huggingface-hub"} <= locked


def test_a_lock_round_trips_through_pips_report_and_needs_every_hash():
    head = env.header("a test", ["numpy", "torch", "torchvision"], ["torchaudio"])
    report = {"install": [{"metadata": {"name": n, "version": v},
                           "download_info": {"archive_info": {"hashes": {"sha256": "ab" * 32}}}}
                          for n, v in (("numpy", "2.3.5"), ("torch", "2.13.0+cpu"), ("torchaudio", "2.13.0"),
                                       ("torchvision", "0.28.0"))]}
    text = env.lock_text(report, head, CUDA)
    assert lock_requirements(text) == ["numpy", "torch", "torchvision"]
    assert [line for line in text.splitlines() if not line.startswith("#")] == [  # torchaudio: never installed
        f"numpy==2.3.5 --hash=sha256:{'ab' * 32}", f"torch==2.13.0+cpu --hash=sha256:{'ab' * 32}",
        f"torchvision==0.28.0 --hash=sha256:{'ab' * 32}"]
    del report["install"][0]["download_info"]["archive_info"]
    with pytest.raises(C128Error, match="no sha256 for numpy 2.3.5"):
        env.lock_text(report, head, CUDA)


def test_a_release_tree_takes_its_committed_lock_without_resolving(tmp_path, monkeypatch):
    (tmp_path / "python" / "sglang").mkdir(parents=True)
    (tmp_path / "python" / "sglang" / "_version.py").write_text("__version__ = version = '0.5.23'\n")
    monkeypatch.setattr(env, "resolve", lambda *a, **k: pytest.fail("resolved although a lock is committed"))
    text, source = env.lock_for(SERIES, tmp_path)
    assert source == "patches/env/v0.5.23.lock" and text == (SERIES.patches_dir / "env" / "v0.5.23.lock").read_text()


def test_an_interrupted_build_leaves_nothing_that_looks_ready(tmp_path, monkeypatch):
    monkeypatch.setenv("C128PATCH_CACHE", str(tmp_path / "cache"))
    lock = "# c128patch tier environment lock\nnumpy==2.3.5 --hash=sha256:" + "ab" * 32 + "\n"
    calls = []

    def pip(python, args, timeout, reporter, what, into, reads=()):
        calls.append(args)
        if len(calls) == 1:
            raise C128Error(f"{what}: interrupted")

    monkeypatch.setattr(env, "_pip", pip)
    with pytest.raises(C128Error, match="interrupted"):
        env.build(lock, CUDA)
    envs = tmp_path / "cache" / "envs"
    assert sorted(p.name for p in envs.iterdir()) == [".lock"]  # no half-built venv left, none under its key
    (envs / ".build-leftover").mkdir()  # a build killed outright (no finally): removed by the next one
    python, built = env.build(lock, CUDA)
    assert built and python.parents[3] == envs and (python.parents[2] / "c128patch-ready").is_file()
    assert sorted(p.name for p in envs.iterdir()) == [".lock", python.parents[2].name]
    assert "--require-hashes" in calls[-1] and "--no-deps" in calls[-1] and "--only-binary=:all:" in calls[-1]
    assert env.build(lock, CUDA) == (python, False) and len(calls) == 2  # cached


def test_building_an_environment_removes_those_unused_for_two_weeks(tmp_path, monkeypatch):
    """~3 GB each: a nightly watch of upstream main builds one per change of its requirements. A use keeps one."""
    monkeypatch.setenv("C128PATCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(env, "_pip", lambda *a, **k: None)
    locks = ["# c128patch tier environment lock\nnumpy==2.3.%d --hash=sha256:%s\n" % (i, "ab" * 32) for i in range(4)]
    old, used, recent = (env.build(lock, CUDA)[0].parents[2] for lock in locks[:3])
    stale = time.time() - (env.UNUSED_DAYS + 1) * 86400
    for folder in (old, used):
        os.utime(folder / "c128patch-ready", (stale, stale))
    os.utime(recent / "c128patch-ready", (time.time() - (env.UNUSED_DAYS - 1) * 86400,) * 2)
    assert env.build(locks[1], CUDA)[1] is False  # cached: its use counts
    steps = []
    reporter = type("R", (NullReporter,), {"step": lambda self, text: steps.append(text)})()
    new = env.build(locks[3], CUDA, reporter)[0].parents[2]
    left = sorted(p.name for p in (tmp_path / "cache" / "envs").iterdir())
    assert left == sorted([".lock", used.name, recent.name, new.name]), left
    assert steps[-1] == f"removed 1 tier environment(s) unused for {env.UNUSED_DAYS} days: {old.name}"


def test_an_environment_a_test_built_in_its_own_cache_is_taken_from_the_runs_once_shared(tmp_path, monkeypatch):
    """tests/support.share_environment: the recipe's test builds v0.5.23's environment in a fresh workspace's cache;
    handed to the run's cache, the tests that need that environment there take it (not built again); another lock
    (another key) is not taken for it; a second hand-over copies nothing and leaves no scratch folder."""
    monkeypatch.setattr(env, "_pip", lambda *a, **k: None)
    lock = "# c128patch tier environment lock\nnumpy==2.3.5 --hash=sha256:" + "ab" * 32 + "\n"
    monkeypatch.setenv("C128PATCH_CACHE", str(tmp_path / "workspace"))
    own, built = env.build(lock, CUDA)
    assert built
    monkeypatch.setenv("C128PATCH_CACHE", str(tmp_path / "run"))
    assert share_environment(own.parents[2])
    monkeypatch.setattr(env, "_pip", lambda *a, **k: pytest.fail("built again although the run's cache has it"))
    python, built = env.build(lock, CUDA)
    assert not built and python == tmp_path / "run" / "envs" / own.parents[2].name / "venv" / "bin" / "python"
    assert subprocess.run([str(python), "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True,
                          check=True).stdout.strip() == str(python.parents[1])  # a venv of its own, where it lies
    assert (python.parents[2] / "c128patch-ready").read_text() == lock and not own.exists()  # moved, not copied
    own.parents[2].mkdir(parents=True)
    (own.parents[2] / "c128patch-ready").write_text(lock)
    (own.parents[2] / "venv").mkdir()
    assert not share_environment(own.parents[2])  # the run's cache has one: nothing moved
    assert sorted(p.name for p in (tmp_path / "run" / "envs").iterdir()) == [".lock", own.parents[2].name]
    with pytest.raises(pytest.fail.Exception, match="built again"):  # another requirement set: its own build
        env.build(lock.replace("2.3.5", "2.3.6"), CUDA)


def test_the_environment_is_compiled_when_built_and_one_built_before_on_its_next_use(tmp_path, monkeypatch):
    """The tier reads its environment but cannot write to it: the build writes the bytecode of what it installed
    (``c128patch-compiled``), but for the packages' own ``tests`` folders, and an environment built before that is
    compiled when next used, once."""
    monkeypatch.setenv("C128PATCH_CACHE", str(tmp_path / "cache"))
    lock = "# c128patch tier environment lock\nnumpy==2.3.5 --hash=sha256:" + "ab" * 32 + "\n"

    def pip(python, args, timeout, reporter, what, into, reads=()):  # installs one module
        (site,) = Path(args[1]).parent.parent.glob("lib/python*/site-packages")
        (site / "c128mod.py").write_text("VALUE = 1\n")
        (site / "c128pkg" / "tests").mkdir(parents=True)  # a package's own test suite: never imported by the tier
        (site / "c128pkg" / "__init__.py").write_text(""), (site / "c128pkg" / "tests" / "test_a.py").write_text("")
        (site / "c128hook.pth").write_text(f"import pathlib; pathlib.Path({str(site / 'ran')!r}).touch()\n")

    monkeypatch.setattr(env, "_pip", pip)
    python, built = env.build(lock, CUDA)
    venv, state = python.parents[1], python.parents[2]
    (module,) = venv.glob("lib/python*/site-packages/c128mod.py")
    pyc = module.parent / "__pycache__" / f"c128mod.{sys.implementation.cache_tag}.pyc"  # the box's: no prefix
    assert built and pyc.is_file() and (state / "c128patch-compiled").is_file()
    tag = sys.implementation.cache_tag  # the package compiled, its tests folder not (~17 % of v0.5.23's source)
    assert (module.parent / "c128pkg" / "__pycache__" / f"__init__.{tag}.pyc").is_file()
    assert not (module.parent / "c128pkg" / "tests" / "__pycache__").exists()
    assert not (module.parent / "ran").exists()  # nothing installed runs while the environment is writable
    pyc.unlink(), (state / "c128patch-compiled").unlink()  # as an older build left it
    assert env.build(lock, CUDA) == (python, False) and pyc.is_file() and (state / "c128patch-compiled").is_file()
    pyc.unlink()
    assert env.build(lock, CUDA) == (python, False) and not pyc.exists()  # compiled once, not on every use


@pytest.mark.parametrize("how", ["script", "link", "pyvenv", "fifo"])
def test_a_package_that_replaces_the_environments_interpreter_is_refused_and_nothing_written_through_a_link(
        tmp_path, monkeypatch, how):
    """A wheel's ``.data/scripts/python`` (or ``.data/data/pyvenv.cfg``) lands on the environment's interpreter, which
    the build runs next with the environment writable: refused, nothing kept. And the build's markers live beside
    the environment, where no box writes: a link the box leaves at their old place is never written through."""
    monkeypatch.setenv("C128PATCH_CACHE", str(tmp_path / "cache"))
    lock = "# c128patch tier environment lock\nnumpy==2.3.5 --hash=sha256:" + "ab" * 32 + "\n"
    victim = tmp_path / "victim.txt"
    victim.write_text("the operator's")

    def pip(python, args, timeout, reporter, what, into, reads=()):
        venv = Path(args[1]).parent.parent
        for name in ("c128patch-ready", "c128patch-compiled", "c128patch-untried.json"):
            (venv / name).symlink_to(victim)
        if how == "script":
            (venv / "bin" / "python").unlink()
            (venv / "bin" / "python").write_text("#!/bin/sh\nexec python3 \"$@\"\n")
        elif how == "link":
            (venv / "bin" / "python").unlink()
            (venv / "bin" / "python").symlink_to("/bin/sh")
        elif how == "pyvenv":
            cfg = venv / "pyvenv.cfg"
            cfg.write_text(f"home = {tmp_path}\n" + cfg.read_text())
        else:  # read as a file, it would never end
            (venv / "pyvenv.cfg").unlink()
            os.mkfifo(venv / "pyvenv.cfg")

    monkeypatch.setattr(env, "_pip", pip)
    with pytest.raises(C128Error, match=r"^building the tier's environment: installing the lock changed its "
                                        r"interpreter \((python|pyvenv\.cfg)\b.*: refused, nothing was kept$"):
        env.build(lock, CUDA)
    assert victim.read_text() == "the operator's"
    assert sorted(p.name for p in (tmp_path / "cache" / "envs").iterdir()) == [".lock"]
    monkeypatch.setattr(env, "_pip", lambda *a, **k: None)
    for name in ("c128patch-ready", "c128patch-compiled"):  # a box of a build that passes: links left where they were
        monkeypatch.setattr(env, "_compile", lambda venv, *a: (venv / name).symlink_to(victim) or True)
        python, built = env.build(lock, CUDA)
        assert built and victim.read_text() == "the operator's" and (python.parents[2] / name).is_file()
        assert not (python.parents[2] / name).is_symlink()
        shutil.rmtree(python.parents[2])


def test_a_compile_that_fails_is_said_and_left_for_the_next_use(tmp_path):
    said = []
    (tmp_path / "venv" / "bin").mkdir(parents=True)  # no python in it: the compile cannot run
    assert not env._compile(tmp_path / "venv", type("R", (), {"step": lambda self, m: said.append(m)})(), 60)
    assert said[-1].startswith("the tier's environment was not compiled (") and "compiled on its next use" in said[-1]


def test_a_tried_package_that_does_not_import_is_uninstalled_and_stood_in_for(tmp_path, monkeypatch):
    """torchvision is locked and installed like any requirement; the build imports each tried package in the
    new environment (sealed, offline) and uninstalls the one that fails (PyPI's CUDA build beside CPU torch:
    ``operator torchvision::nms does not exist``), saying why; one that imports (a CPU build) is kept, and so is
    one that imports once the ops of its row's ``defines`` are defined (no kernel), said as kept without its ops."""
    monkeypatch.setenv("C128PATCH_CACHE", str(tmp_path / "cache"))
    lock = "".join(f"{n}==1.0 --hash=sha256:{'ab' * 32}\n" for n in ("good", "bad", "plain", "opsless", "torch"))
    calls = []
    (tmp_path / "victim.txt").write_text("the operator's")
    needs_op = "import torch\nif 'X::nms(Tensor x) -> Tensor' not in torch.library.DEFINED:\n" \
               "    raise RuntimeError('operator X::nms does not exist')\n"
    bodies = {"good": "", "bad": needs_op.replace("X", "bad"), "opsless": needs_op.replace("X", "opsless"),
              "plain": "raise SystemExit('a package not tried is never imported')\n",
              "torch": "from . import library\n"}  # a torch with just torch.library.Library(ns, kind).define

    def pip(python, args, timeout, reporter, what, into, reads=()):  # installs the packages as files, no index
        calls.append(args)
        site = next(Path(args[args.index("--python") + 1]).parent.parent.glob("lib/python*/site-packages"))
        for name, body in bodies.items():
            (site / name).mkdir()
            (site / name / "__init__.py").write_text(body)
            info = site / f"{name}-1.0.dist-info"
            info.mkdir()
            (info / "METADATA").write_text(f"Name: {name}\nVersion: 1.0\n")
            # a RECORD as a hostile wheel may write it: a path outside the environment, one through a link
            (info / "RECORD").write_text(f"{name}/__init__.py,,\n{info.name}/METADATA,,\n{info.name}/RECORD,,\n"
                                         "../../../../../../../victim.txt,,\nlinked/victim.txt,,\n")
        (site / "linked").symlink_to(tmp_path)
        (site / "torch" / "library.py").write_text("DEFINED = set()\nclass Library:\n    def __init__(self, ns, kind):"
                                                   "\n        self.ns = ns\n    def define(self, schema):\n"
                                                   "        DEFINED.add(f'{self.ns}::{schema}')\n")

    monkeypatch.setattr(env, "_pip", pip)
    tried = {"good": {"imports": ["good"], "tried": True, "reason": "x"},
             "bad": {"imports": ["bad"], "tried": True, "reason": "x", "defines": ["bad::other(Tensor x) -> Tensor"]},
             "opsless": {"imports": ["opsless"], "tried": True, "reason": "x",
                         "defines": ["opsless::nms(Tensor x) -> Tensor"]},
             "plain": {"imports": ["plain"], "reason": "never installed by a lock of ours"}}
    python, built = env.build(lock, tried)
    site = next(python.parent.parent.glob("lib/python*/site-packages"))
    assert built and sorted(p.name for p in site.iterdir() if not p.name.startswith("_")) == [
        "good", "good-1.0.dist-info", "linked", "opsless", "opsless-1.0.dist-info", "plain", "plain-1.0.dist-info",
        "torch", "torch-1.0.dist-info"]
    untried = json.loads((python.parents[2] / "c128patch-untried.json").read_text())
    assert untried == {"bad": "RuntimeError: operator bad::nms does not exist"}
    defined = json.loads((python.parents[2] / "c128patch-defined.json").read_text())
    assert defined == {"opsless": "RuntimeError: operator opsless::nms does not exist"}  # its plain import's error
    assert len(calls) == 1 and (tmp_path / "victim.txt").is_file()  # no pip (it would run the environment's
    # interpreter, its .pth files, writable and online): its RECORD's files removed by us, in the environment only
    said = env.describe({"key": "k", "built": True, "lock": "l", "dropped": ["bad", "x"], "untried": untried,
                         "defined": defined, "isolation": "no network"})
    assert said == ("behavioural tier environment k (built now; lock: l); stand-ins for bad, x; bad installed but "
                    "stood in: it does not import here (RuntimeError: operator bad::nms does not exist); opsless "
                    "installed without its ops: its extension does not load here (RuntimeError: operator opsless::nms "
                    "does not exist), the ops it registers at import defined with no kernel (each raises on use); "
                    "no network")
    tried["opsless"]["defines"] = ["opsless::nms(Tensor y) -> Tensor"]  # what the build keeps: a new environment
    other, built = env.build(lock, tried)
    assert built and other != python and json.loads((other.parents[2] / "c128patch-defined.json").read_text()) == {}


def test_which_packages_are_tried_is_part_of_the_environments_key(tmp_path, monkeypatch):
    """A row made ``tried`` (or no longer) changes what the build uninstalls: not the environment built before."""
    monkeypatch.setenv("C128PATCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(env, "_pip", lambda *a, **k: None)
    lock = f"good==1.0 --hash=sha256:{'ab' * 32}\n"
    plain, tried = {"good": {"imports": ["good"], "reason": "x"}}, {"good": {"imports": ["good"], "tried": True,
                                                                           "reason": "x"}}
    monkeypatch.setattr(env, "_untried", lambda venv, rows, reporter: ({n: "does not import" for n in rows}, {}))
    first, second = env.build(lock, plain)[0], env.build(lock, tried)[0]
    assert first != second and env.build(lock, plain) == (first, False)
    assert json.loads((second.parents[2] / "c128patch-untried.json").read_text()) == {"good": "does not import"}


@pytest.mark.parametrize("said", [b"{", b"\xff", b"[]", b'{"bad": 5}'], ids=["bad", "bytes", "list", "int"])
def test_a_damaged_record_of_untried_packages_is_not_a_traceback(tmp_path, monkeypatch, said):
    """The shared cache's ``c128patch-untried.json`` is input: damaged, it was a traceback (ValueError)."""
    state = tmp_path / "env"
    (state / "venv" / "bin").mkdir(parents=True)
    (state / "c128patch-untried.json").write_bytes(said)
    monkeypatch.setattr(env, "lock_for", lambda *a: ("# dropped: x\n", "l"))
    monkeypatch.setattr(env, "build", lambda *a: (state / "venv" / "bin" / "python", False))
    info = env.tier_python(SERIES, tmp_path)[1]
    assert info["untried"] == ({"bad": "5"} if said == b'{"bad": 5}' else {}) and "x" in info["dropped"]


def tree_with(tmp: Path, source: str) -> Path:
    (tmp / "python" / "sglang").mkdir(parents=True)
    (tmp / "python" / "sglang" / "__init__.py").write_text("")
    (tmp / MODULE).write_text(source)
    return tmp


def test_the_tier_preloads_what_a_module_surely_imports_outside_sglang(tmp_path):
    """``treecheck.preloads``: the imports that start a line, of the module, of the sglang modules they reach (a
    relative one, a submodule named in a parenthesized list) and of their packages; none under an ``if``, a ``try``
    or in a function (the runner imports each once for both gate states: nothing a gate state might not import)."""
    tree = tree_with(tmp_path, "import os.path\nfrom sglang import helper\nfrom sglang.pkg import (\n    sub,\n"
                     "    CONST,\n)\nif False:\n    import never_branch\ntry:\n    import never_guarded\n"
                     "except ImportError:\n    pass\n\n\ndef f():\n    import never_function\n")
    files = {"__init__.py": "import json\n", "helper.py": "from numpy import linalg\nfrom . import sibling\n",
             "sibling.py": "import decimal\n", "pkg/__init__.py": "CONST = 1\nimport fractions\n",
             "pkg/sub.py": "import statistics, \\\n    heapq\n"}
    for name, text in files.items():
        (tree / "python/sglang" / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / "python/sglang" / name).write_text(text)
    assert treecheck.preloads(tree, ["sglang.probe", "sglang.sibling"]) == {
        "sglang.probe": ["decimal", "fractions", "heapq", "json", "numpy", "os.path", "statistics"],
        "sglang.sibling": ["decimal", "json"]}


def test_preloads_past_an_arguments_limit_are_left_to_each_gate_state(tmp_path, monkeypatch):
    """The preload list is the tree's (input) and goes to the runner as one argument, which the kernel caps at
    128 KiB: past 64 KiB none is passed (each gate state imports its own), so a hostile tree cannot stop the tier."""
    started = []
    monkeypatch.setattr(treecheck, "Sealed", lambda python, args, *a, **kw: started.append(args))
    for n, taken in ((3, True), (8000, False)):
        tree = tree_with(tmp_path / str(n), "".join(f"import m{i:05d}\n" for i in range(n)))
        treecheck.Pending(SERIES, tree, [MODULE], python=sys.executable)
        preload = started[-1][started[-1].index(str(treecheck.SCENARIOS)) - 1]
        assert preload == (json.dumps({"sglang.probe": [f"m{i:05d}" for i in range(n)]}) if taken else "{}")


# the runner's definitions (not its main), its argv as treecheck gives it, a namespace package ``nsp`` already
# imported from the environment; then its preload of ``nsp.evil`` and of ``evil_top``, which only the tree has
PRELOAD_RUN = """import json, sys
tree, site, runner = sys.argv[1:4]
sys.argv = ["-c", tree, "[]", "[]", "{}", "{}", json.dumps({"sglang.probe": ["evil_top", "nsp.evil"]})]
sys.path[:0] = [site, tree]
import nsp.a
exec(compile(open(runner).read().rsplit("main()", 1)[0], runner, "exec"))
_preload()
print("nsp.evil" in sys.modules, "evil_top" in sys.modules)
"""


def test_the_preload_runs_nothing_of_the_trees_through_a_namespace_package_already_imported(tmp_path):
    """The preload imports, before the fork and with the gates unset, what the tree's modules surely import outside
    sglang: never a module of the tree's own folder (a top-level one, a namespace package's portion there)."""
    site, tree = tmp_path / "site", tmp_path / "tree" / "python"
    (site / "nsp").mkdir(parents=True)
    (site / "nsp" / "a.py").write_text("")
    (tree / "nsp").mkdir(parents=True)
    (tree / "nsp" / "evil.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    (tree / "evil_top.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    runner = Path(treecheck.__file__).with_name("treecheck_runner.py")
    proc = subprocess.run([sys.executable, "-I", "-c", PRELOAD_RUN, str(tree), str(site), str(runner)],
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["False", "False"] and not (tmp_path / "ran").exists(), proc.stderr[-2000:]


def test_the_runner_leaves_none_of_its_files_in_its_temporary_folder(tmp_path):
    """Helper 186 (c): ``tier-on-*``, ``tier-off-*`` and ``tier-compiled-*`` were seen in the host's /tmp. The
    runner made them in its TMPDIR and left them to the box's folder's removal: run anywhere else (a test, a host
    TMPDIR) they stayed. It removes its own now (torch here or not: with none it forks no gate state)."""
    tree, tmp = tree_with(tmp_path / "tree", "X = 1\n"), tmp_path / "tmp"
    tmp.mkdir()
    args = [str(tree / "python"), "[]", "[]", "{}", "{}", "{}", "", "sglang.probe"]
    proc = subprocess.run([sys.executable, "-I", "-c", treecheck.RUNNER.read_text(), *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "TMPDIR": str(tmp)}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.splitlines()[-1])["tiers"] is not None
    assert list(tmp.iterdir()) == []


def test_a_stand_in_imports_but_raises_on_use(tmp_path):
    pytest.importorskip("torch", reason="the tier imports modules only where torch imports")
    ok = tree_with(tmp_path / "ok", "import flashinfer\nfrom cutlass import cute\nfrom sgl_kernel.x import y\n")
    result = treecheck.run(SERIES, ok, [MODULE])
    assert not any(t.count("not checked") for t in result.tiers) and result.modules() == {
        "sglang.probe": "imported with stand-ins (cutlass, flashinfer, sgl_kernel)"}, result.to_json()
    guarded = tree_with(tmp_path / "guarded", "import importlib.util\ntry:\n    from cuda.bindings import driver\n"
                        "except ImportError:\n    driver = None\nassert driver is None\n"
                        "assert importlib.util.find_spec('flashinfer') is None\n")
    assert treecheck.run(SERIES, guarded, [MODULE]).modules() == {"sglang.probe": "imported"}  # absent, as it is
    used = tree_with(tmp_path / "used", "import flashinfer\nflashinfer.sampling.top_k(1)\n")
    result = treecheck.run(SERIES, used, [MODULE])
    assert not result.checked and not result.failed
    said = result.modules()["sglang.probe"]
    assert said.startswith("not checked: needs flashinfer (CUDA-only, a stand-in here, used at import: ") and \
        "flashinfer.sampling: flashinfer is a stand-in (flashinfer-python: CUDA kernels" in said


def test_a_loaded_stand_in_stays_absent_to_an_availability_probe(tmp_path):
    """transformers' ``is_torchvision_available`` (``importlib.util.find_spec``, which reads ``sys.modules``
    first) once sglang loaded the stand-in: absent, so the library takes its no-torchvision path; a library's
    ImportError naming a loaded stand-in is not checked, not failed (v0.5.20, docs/watch.md)."""
    pytest.importorskip("torch", reason="the tier imports modules only where torch imports")
    tree = tree_with(tmp_path, "import importlib.util\nimport flashinfer\n"
                     "assert importlib.util.find_spec('flashinfer') is None\n"
                     "assert importlib.util.find_spec('flashinfer.sampling') is None\n")
    (tree / "python/sglang/lib.py").write_text("import deep_gemm\nraise ImportError('fp8_gemm requires the\\n"
                                               "deep_gemm library but it was not found in your environment.')\n")
    said = treecheck.run(SERIES, tree, [MODULE, "python/sglang/lib.py"]).modules()
    assert said["sglang.probe"] == "imported with stand-ins (flashinfer)", said
    assert said["sglang.lib"].startswith("not checked: needs deep_gemm (CUDA-only, a stand-in here, absent to a "
                                         "library: sglang/lib.py:2: fp8_gemm requires the deep_gemm library but "), said


def test_a_package_whose_extension_does_not_load_imports_without_its_ops(tmp_path, monkeypatch):
    """torchvision's PyPI build beside CPU torch: its ``_C`` does not load, and its Python registers a fake for an
    op only ``_C`` defines (``operator torchvision::nms does not exist``). With the environment's ``defines`` the
    runner defines that op with no kernel first: the real package imports, the op raises on use, and each module
    whose import loaded it says so."""
    pytest.importorskip("torch", reason="the tier imports modules only where torch imports")
    tree = tree_with(tmp_path / "t", "import torch\nimport tvx\ntry:\n    torch.ops.tvx.nms(torch.zeros(1))\n"
                     "except NotImplementedError:\n    pass\nelse:\n    raise SystemExit('an op with a kernel')\n")
    # the package installed (never the tree's: those are the gate states'), its Python as shipped: an interpreter
    # whose site-packages holds it and reaches this one's (torch), both shown to the box
    venv, installed = tmp_path / "venv", tmp_path / "installed"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (installed / "tvx").mkdir(parents=True)
    (installed / "tvx" / "__init__.py").write_text("import torch\n\n\n@torch.library.register_fake('tvx::nms')\n"
                                                   "def meta_nms(x):\n    return x\n")
    purelib = sysconfig.get_paths()["purelib"]
    next(venv.glob("lib/python*/site-packages")).joinpath("c128-test.pth").write_text(f"{purelib}\n{installed}\n")
    sealed = treecheck.Sealed
    monkeypatch.setattr(treecheck, "Sealed", lambda *a, readable=(), **k: sealed(
        *a, readable=(*readable, purelib, str(installed)), **k))
    defines = {"tvx": ["tvx::nms(Tensor x) -> Tensor"]}
    for given, said in (({}, "failed: sglang/probe.py:2: RuntimeError: operator tvx::nms does not exist"),
                        (defines, "imported with stand-ins (tvx (without its ops))")):
        monkeypatch.setattr(env, "defines", lambda series, d=given: d)
        assert treecheck.run(SERIES, tree, [MODULE], python=str(venv / "bin" / "python")).modules() == {
            "sglang.probe": said}


def test_the_tier_has_no_network(tmp_path):
    if "network NOT cut off" in sandbox.isolation():
        pytest.skip(sandbox.isolation())
    pytest.importorskip("torch", reason="the tier imports modules only where torch imports")
    tree = tree_with(tmp_path, "import socket\ns = socket.socket()\ns.settimeout(5)\ns.connect(('192.0.2.1', 80))\n")
    result = treecheck.run(SERIES, tree, [MODULE])
    assert result.env["isolation"].endswith("; no network (loopback only)")
    assert [f.split(": ", 2)[2] for f in result.failed] == ["sglang/probe.py:4: OSError: [Errno 101] Network is "
                                                            "unreachable"] * 2


def test_no_environment_for_the_target_is_one_line_and_unchecked(tmp_path, monkeypatch):
    monkeypatch.delenv("C128PATCH_TIER_PYTHON")
    tree = tree_with(tmp_path, "raise SystemExit('ran')\n")
    result = treecheck.run(SERIES, tree, [MODULE])
    assert not result.ran and not result.checked and not result.to_json()["ok"]
    assert result.verdict() == ("unchecked: the target's code was not run: no environment for it "
                                f"({tree} has neither python/pyproject.toml nor python/sglang/_version.py: no "
                                "requirements to build the tier's environment from (pass --python)); imports: 1 of 1 "
                                "modules' sglang imports resolve on the tree's files")


SCENARIOS = ["backend-verify-metadata", "compressor-callback", "decode", "record-streams", "startup-rules",
             "verify-compact", "verify-static", "worker-commit"]
DEFINED = {"torchvision": "RuntimeError: operator torchvision::nms does not exist"}  # the locked PyPI (CUDA 13) build


def every_module_imports_in_its_own_environment(rev: str) -> None:
    """``treecheck`` on ``rev`` in its own environment: ``passed``, all 11 modules imported and the scenarios
    passed, gates off and on; torchvision (the locked PyPI build) kept without its ops, not stood in for."""
    start = time.monotonic()
    run = invoke("treecheck", "--sglang-rev", rev, "--series", str(REPO_ROOT), env={"C128PATCH_TIER_PYTHON": None})
    out = run.out
    assert out["env"]["lock"] == f"patches/env/{rev}.lock" and out["env"]["key"], json.dumps(out)[:3000]
    assert out["env"]["defined"] == DEFINED and out["env"]["untried"] == {} and "torchvision" not in out["env"][
        "dropped"], out["env"]
    assert run.code == 0 and out["ok"], json.dumps(out)[:3000]
    assert len(out["modules"]) == len(out["tiers"][0]["modules"]) == 11, out["modules"]
    assert all(said.startswith("imported") for said in out["modules"].values()), out["modules"]
    assert out["scenarios_passed"] == SCENARIOS
    for tier in out["tiers"]:  # each scenario, each gate state (test_scenarios.py's per-release check, v0.5.23's here)
        assert {n: s["status"] for n, s in tier["scenarios"].items()} == dict.fromkeys(SCENARIOS, "passed"), tier
    assert [tier["gates"] for tier in out["tiers"]] == ["off", "on"] and not out["failed"], out["tiers"]
    for gates in ("off", "on"):
        said = f"gates {gates}: 12 ok, 0 failed, 0 not checked; scenarios: {len(SCENARIOS)} passed, 0 failed, 0 not run"
        assert said in out["verdict"], out["verdict"]
    print(f"tier on {rev}: {time.monotonic() - start:.0f} s, env built now: {out['env']['built']}")


def test_the_v0_5_23_environment_builds_from_its_lock_and_every_module_imports(tmp_path):
    """heavy: builds (or finds cached) the v0.5.23 environment: ~3 min and ~3 GB the first time."""
    every_module_imports_in_its_own_environment("v0.5.23")


def test_the_v0_5_20_environment_imports_every_module_with_torchvision_without_its_ops(tmp_path):
    """heavy: v0.5.20's transformers 5.12.1 needs a real torchvision at import (``AutoImageProcessor`` is a
    placeholder without it, docs/watch.md); the locked CUDA build's Python imports once its two ops are defined:
    11 of 11 modules, 7 of 7 scenarios (5 and 4 while it was uninstalled and stood in for)."""
    every_module_imports_in_its_own_environment("v0.5.20")


def test_requirements_that_do_not_resolve_are_one_line_and_unchecked(tmp_path, monkeypatch):
    """heavy: asks the package index."""
    monkeypatch.delenv("C128PATCH_TIER_PYTHON")
    monkeypatch.setenv("C128PATCH_CACHE", str(tmp_path / "cache"))
    tree = tree_with(tmp_path / "tree", "raise SystemExit('ran')\n")
    (tree / "python" / "pyproject.toml").write_text('[project]\ndependencies = ["c128patch-no-such-package==1.0"]\n')
    result = treecheck.run(SERIES, tree, [MODULE])
    assert not result.ran and not result.to_json()["ok"] and "\n" not in result.verdict()
    assert result.verdict() == ("unchecked: the target's code was not run: no environment for it (resolving the "
                                "tier's environment (1 requirements): pip failed: ERROR: No matching distribution "
                                "found for c128patch-no-such-package==1.0); imports: 1 of 1 modules' sglang imports "
                                "resolve on the tree's files")
    assert not (tmp_path / "cache" / "envs" / "locks").exists() or not any((tmp_path / "cache" / "envs" / "locks")
                                                                            .iterdir())


@pytest.mark.parametrize("row", [
    'imports = "torchvision", reason = "a string, not a list"',
    'imports = ["tv"], defines = "tv::nms(Tensor a) -> Tensor", reason = "a string: each character an op"',
    'imports = [], defines = ["tv::nms(Tensor a) -> Tensor"], reason = "no import name to key the ops by"',
    'imports = ["tv", "os; import x"], reason = "not an import name"',
    'imports = ["tv"], tried = "yes", reason = "not a bool"',
    'imports = ["tv"], tried = true, defines = ["tv::a() -> () | tv::b() -> ()"], reason = "two ops as one"',
    'imports = ["tv"], tried = true, defines = ["tv::a() -> ()\\n# tried: other x"], reason = "a forged key line"',
    'imports = ["tv"], defines = ["import os; os.system(\'x\')"], reason = "Python, not a schema"',
    'imports = ["tv"], reason = 5',
    None,  # not a table
])
def test_a_hostile_cuda_only_row_is_refused_in_one_line(tmp_path, row):
    """``patches/env/cuda-only.toml`` is input: a row of the wrong shape was a traceback (or a character per op);
    a ``defines`` entry holding ``" | "`` or a newline gave the key of another table (a poisoned build reused)."""
    (tmp_path / "patches" / "env").mkdir(parents=True)
    (tmp_path / "patches" / "series.toml").write_text('[series]\nname = "s"\nversion = "1"\nbase = "v0.5.23"\n')
    (tmp_path / "patches" / "env" / "cuda-only.toml").write_text(f"tv = {{ {row} }}\n" if row else "tv = 'x'\n")
    with pytest.raises(C128Error, match=r"cuda-only\.toml: row 'tv'") as exc:
        env.cuda_only(load_series(tmp_path))
    assert "\n" not in exc.value.message


def test_a_cuda_only_table_with_a_number_past_pythons_digit_limit_is_one_line(tmp_path):
    """Helper 173: tomllib raises a plain ValueError (not TOMLDecodeError) for an integer past Python's 4300-digit
    limit: ``patches/env/cuda-only.toml`` holding one was a traceback. Now one line naming the file."""
    (tmp_path / "patches" / "env").mkdir(parents=True)
    (tmp_path / "patches" / "series.toml").write_text('[series]\nname = "s"\nversion = "1"\nbase = "v0.5.23"\n')
    (tmp_path / "patches" / "env" / "cuda-only.toml").write_text(f"tv = {'9' * 5000}\n")
    with pytest.raises(C128Error, match=r"cuda-only\.toml: not TOML") as exc:
        env.cuda_only(load_series(tmp_path))
    assert "\n" not in exc.value.message


def test_the_committed_cuda_only_table_is_taken():
    assert CUDA["torchvision"]["defines"] and env.defines(SERIES) == {"torchvision": CUDA["torchvision"]["defines"]}


@pytest.mark.parametrize("name", ["cuda-only.toml", "v0.5.23.lock"])
def test_a_symlinked_cuda_only_table_or_lock_in_the_series_is_refused(tmp_path, monkeypatch, name):
    """The series folder is input: its env files go through the confinement rule (a link read any file here)."""
    monkeypatch.setenv("C128PATCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(env, "resolve", lambda *a: pytest.fail("resolved: the link was taken"))
    (tmp_path / "patches" / "env").mkdir(parents=True)
    (tmp_path / "patches" / "series.toml").write_text('[series]\nname = "s"\nversion = "1"\nbase = "v0.5.23"\n')
    (tmp_path / "secret").write_text("# c128patch tier environment lock\n")
    (tmp_path / "patches" / "env" / name).symlink_to(tmp_path / "secret")
    (tmp_path / "tree" / "python").mkdir(parents=True)
    (tmp_path / "tree" / "python" / "pyproject.toml").write_text('[project]\ndependencies = []\n')
    with pytest.raises(C128Error, match=f"unsafe path in .*patches/env/{name} goes through the symlink"):
        env.lock_for(load_series(tmp_path), tmp_path / "tree")


@pytest.mark.parametrize("line", ["--index-url http://evil.invalid/simple", "-e .", "-r /etc/passwd",
                                  f"good==1.0 --hash=sha256:{'ab' * 32} \\", f"x==${{HOME}} --hash=sha256:{'ab' * 32}",
                                  "-f file:///tmp/wheels", "good @ file:///tmp/good.whl"])
def test_a_lock_line_that_is_not_a_pinned_hashed_package_is_refused_before_pip_runs(tmp_path, monkeypatch, line):
    """A committed lock is the series' input, and pip takes options from a requirements file: an index of the
    lock's choosing, another file, an editable (a build running code) were pip's to follow."""
    monkeypatch.setenv("C128PATCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(env, "_pip", lambda *a: pytest.fail("pip ran"))
    monkeypatch.setattr(env, "Sealed", lambda *a, **k: pytest.fail("the box ran"))
    with pytest.raises(C128Error, match="is not 'name==version --hash=sha256:HEX'") as exc:
        env.build(f"# c128patch tier environment lock\ngood==1.0 --hash=sha256:{'ab' * 32}\n{line}\n", {})
    assert "\n" not in exc.value.message


def _tiny_wheel(folder: Path) -> Path:
    """A one-module wheel, c128tiny 1.0, written in ``folder``."""
    import zipfile

    folder.mkdir(parents=True)
    with zipfile.ZipFile(folder / "c128tiny-1.0-py3-none-any.whl", "w") as whl:
        whl.writestr("c128tiny/__init__.py", "")
        whl.writestr("c128tiny-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: c128tiny\nVersion: 1.0\n")
        whl.writestr("c128tiny-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: true\n"
                     "Tag: py3-none-any\n")
        whl.writestr("c128tiny-1.0.dist-info/RECORD", "")
    return folder / "c128tiny-1.0-py3-none-any.whl"


def test_pip_in_the_box_reads_the_local_folders_the_operators_pip_settings_name(tmp_path, monkeypatch):
    """The box hides every folder outside the system's: a find-links folder the operator's ``PIP_FIND_LINKS`` names
    (here under the hidden temporary folder, as ``/opt/wheels`` would be) is bound back for pip to read."""
    import sys

    wheels, into = tmp_path / "wheels", tmp_path / "into"  # (pip writes only to ``into``)
    _tiny_wheel(wheels), into.mkdir()
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    assert str(wheels) in env._pip_folders("")
    env._pip(sys.executable, ["install", "--dry-run", "--no-index", "--no-deps", "c128tiny"], 120, env.NullReporter(),
             "probing", into)


def test_pip_in_the_box_reads_a_local_index_whose_pages_link_to_files_beside_it(tmp_path, monkeypatch):
    """A local mirror lays its wheels beside its ``simple/`` (bandersnatch: web/simple + web/packages; this machine's
    /opt/pypi/simple + /opt/pypi/files), its pages linking ``../../files/x.whl``: the index's parent is bound too (an
    operator's pip.conf naming /opt/pypi/simple failed every tier environment with "No such file or directory")."""
    mirror, into = tmp_path / "mirror", tmp_path / "into"
    whl = _tiny_wheel(mirror / "files")
    (mirror / "simple" / "c128tiny").mkdir(parents=True), into.mkdir()
    (mirror / "simple" / "c128tiny" / "index.html").write_text(f'<a href="../../files/{whl.name}">{whl.name}</a>\n')
    monkeypatch.setenv("PIP_INDEX_URL", (mirror / "simple").as_uri())
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    env._pip(sys.executable, ["install", "--dry-run", "--no-deps", "c128tiny"], 120, env.NullReporter(), "probing",
             into)
    monkeypatch.setenv("PIP_INDEX_URL", Path("/simple").as_uri())  # never / itself, nor HOME or above it
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", (Path.home() / "simple").as_uri())
    assert not {"/", str(Path.home())} & set(env._pip_folders(""))
    tmp = os.path.realpath(tempfile.gettempdir())  # nor the temporary folder: other runs' boxes and clones
    monkeypatch.setenv("PIP_INDEX_URL", Path(tmp, "simple").as_uri())
    assert tmp not in env._pip_folders("")


def test_pip_in_the_box_reads_the_operators_own_pip_config(tmp_path, monkeypatch):
    # HOME is hidden from the box (and replaced): the operator's pip.conf (a private index, say) is handed in
    import sys

    home = tmp_path / "home"
    (home / ".config" / "pip").mkdir(parents=True)
    (home / ".config" / "pip" / "pip.conf").write_text("[global]\ntimeout = notanumber\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv("PIP_CONFIG_FILE", raising=False)
    with pytest.raises(C128Error, match="notanumber"):
        env._pip(sys.executable, ["install", "--dry-run", "--no-index", "nothing-here"], 120, env.NullReporter(),
                 "probing", tmp_path)
    (home / "pip.conf").write_text("[global]\ntimeout = alsonotanumber\n")  # one right in HOME: HOME not bound
    monkeypatch.setenv("PIP_CONFIG_FILE", str(home / "pip.conf"))
    assert str(home) not in env._pip_folders(str(home / "pip.conf"))
    with pytest.raises(C128Error, match="alsonotanumber"):
        env._pip(sys.executable, ["install", "--dry-run", "--no-index", "nothing-here"], 120, env.NullReporter(),
                 "probing", tmp_path)
