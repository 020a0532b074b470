"""Helpers for tests: the CLI runner, real-upstream test series, tree snapshots, unpacked release sources."""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from c128patch.cli import main
from c128patch.evidence import staging
from c128patch.git import Git
from c128patch.series.manifest import Series, load_series
from c128patch.series.patchfile import read_patch

REPO_ROOT = Path(__file__).resolve().parents[1]
RELEASES = ("v0.5.20", "v0.5.21", "v0.5.22", "v0.5.23")

# For tests whose upstream modules (or child test runs) import torch: skipped without it, with the
# reason (CI's torch tier runs exactly the tests skipped for lack of torch: tests/conftest.py).
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="needs torch (not installed): the upstream modules it runs import it")


# ---------------------------------------------------------------------------- the command line
def refused(args: list[str | Path], tree: Path | None = None, contains: str = "", code: int = 2) -> str:
    """The refusal contract: one line ``c128patch: error: ...`` (holding ``contains``), exit ``code``,
    and ``tree`` (files, refs, HEAD) exactly as before. Returns that line."""
    before = snapshot(tree) if tree else None
    res = invoke(*args, as_json=False)
    assert res.code == code, (res.code, res.err, res.text)
    line = error_line(res.err)
    assert contains in line, line
    if tree:
        assert snapshot(tree) == before
    return line


# A verb run as a process of its own (in-process runs never: tests/conftest.py sets progress.BEAT past any test)
# prints a heartbeat, "<step>: 12 s" (progress.PlainReporter; a transfer's "<what>: 1.2 of 3.4 MB, 5 s"), for a step
# silent over progress.BEAT s: on a busy machine one may come before its error line.
_PROGRESS_LINE = re.compile(r".+(?:: |, )\d+ s")
# A run that finds a lock held (a cold release cache another test is building) says so before it waits
# (jsonio._wait_for); its error, if any, comes after.
_WAIT_LINE = re.compile(r"waiting for .+: another run holds its lock \(at most [\d.]+ s, C128PATCH_LOCK_TIMEOUT\)")


def error_line(stderr: str) -> str:
    """The one-line error contract of a process: stderr's last line is ``c128patch: error: ...``, and every line
    before it a progress line or a lock wait's line (no error, traceback or warning among them). Returns the error
    line."""
    *before, line = stderr.strip().splitlines() or [""]
    assert line.startswith("c128patch: error: "), stderr
    assert all((_PROGRESS_LINE.fullmatch(x) or _WAIT_LINE.fullmatch(x)) and not x.startswith(("c128patch", "Traceback"))
               for x in before), stderr
    return line


def default_signals() -> None:
    """``preexec_fn`` for a child a test signals: SIGINT, SIGHUP and SIGTERM back to their default dispositions, so a
    signal reaches it even when the test run was started in the background (``nohup ... &`` ignores SIGINT and
    SIGHUP, and children inherit that; the tool leaves a signal ignored as the operator set it)."""
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def cli_process(args: list[str | Path], env: dict[str, str] | None = None, timeout: float = 300
                ) -> subprocess.CompletedProcess:
    """``python -m c128patch ARGS`` as a process of its own (its own process group, SIGINT at its
    default), for tests that kill or interrupt it."""
    return subprocess.run([sys.executable, "-m", "c128patch", *map(str, args)], env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=timeout, preexec_fn=default_signals,
                          start_new_session=True)


_SHIM: list[Path] = []


def run_printed(command: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Paste a command the tool printed into a shell (``bash -c``), with ``c128patch`` on PATH
    (this checkout's), as a user would run it."""
    if not _SHIM:
        folder = Path(tempfile.mkdtemp(prefix="c128patch-shim-"))
        atexit.register(shutil.rmtree, folder, True)  # (outside the run's temporary folder where tempfile chose first)
        (folder / "c128patch").write_text(f'#!/bin/sh\nexec {sys.executable} -m c128patch "$@"\n')
        (folder / "c128patch").chmod(0o755)
        _SHIM.append(folder)
    env = {**os.environ, "PATH": f"{_SHIM[0]}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(["bash", "-c", command], cwd=cwd or _SHIM[0], env=env, capture_output=True, text=True)


OUT_OF_DISK = "fatal: sha1 file '.git/index.lock' write error. Out of diskspace"  # git's, on a full disk


def failing_git(folder: Path, pattern: str, said: str) -> Path:
    """A ``git`` in ``folder`` (put ``folder`` first on PATH) that says ``said`` and exits 128 where its arguments
    match the shell ``case`` pattern ``pattern`` (``*" am "*``), else runs the real git (never itself: ``folder`` may
    be on PATH already when it is rewritten)."""
    folder.mkdir(exist_ok=True)
    fake = folder / "git"
    real = shutil.which("git", path=os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                                                    if p and Path(p).resolve() != folder.resolve()))
    fake.write_text(f'#!/bin/sh\ncase " $* " in {pattern}) echo "{said}" >&2; exit 128;; esac\nexec {real} "$@"\n')
    fake.chmod(0o755)
    return fake


def table_column(text: str, index: int) -> str:
    """Column ``index`` of the rich table(s) in ``text`` as one string: its cells' lines joined by spaces (a table
    fits 100 columns, its cells wrapped: issue 37)."""
    rows = [line.split("│")[1:-1] for line in text.splitlines() if line.startswith("│")]
    return " ".join(cell.strip() for row in rows if len(row) > index for cell in [row[index]] if cell.strip())


def printed_command(text: str, start: str) -> str:
    """The shell command in ``text`` that begins with ``start``: up to the first ``)``, ``,``, ``;``,
    backtick or line end outside single quotes (how the tool embeds commands in its messages)."""
    i = text.index(start)
    quoted, out = False, []
    for ch in text[i:]:
        if ch == "'":
            quoted = not quoted
        elif not quoted and ch in ")`,;\n":
            break
        out.append(ch)
    return "".join(out).strip()


def unpack_release(repo: Path, tag: str, dest: Path, paths: list[str]) -> Path:
    """Extract ``paths`` of release ``tag`` as an unpacked wheel would hold them (``dest/sglang/...``)."""
    dest.mkdir(parents=True, exist_ok=True)
    present = subprocess.run(["git", "--git-dir", str(repo), "ls-tree", "--name-only", tag, "--", *paths],
                             check=True, capture_output=True, text=True).stdout.split()
    archive = subprocess.run(["git", "--git-dir", str(repo), "archive", "--format=tar", tag, *present],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "--strip-components=1", "-C", str(dest)], input=archive, check=True)
    return dest


def small_clone(repo: Path, dest: Path, folder: str = "python/sglang/kernels/jit/csrc/deepseek_v4") -> Git:
    """A clone of ``repo`` at v0.5.23 on branch 'main', checked out sparsely (cone: ``folder`` and the
    files of the folders above it, python/sglang's own files among them): cheap, and enough to apply a
    series that writes there (``make_test_series``)."""
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(repo), str(dest)], check=True)
    subprocess.run(["git", "-C", str(dest), "sparse-checkout", "set", "--cone", folder], check=True)
    subprocess.run(["git", "-C", str(dest), "checkout", "--quiet", "-b", "main", "v0.5.23"], check=True)
    return Git(worktree=dest)


def snapshot(tree: Path) -> dict:
    """Everything a refused command must leave untouched: refs, HEAD, index and worktree state."""
    git = Git(worktree=tree)
    return {
        "refs": git.out("for-each-ref", "--format=%(refname) %(objectname)"),
        "head": git.out("symbolic-ref", "-q", "HEAD", check=False) or git.out("rev-parse", "HEAD"),
        "status": git.out("status", "--porcelain=v1", "--untracked-files=all"),
        "diff": git.out("diff", "HEAD"),
    }


def make_test_series(dest: Path, upstream: Path, edits: dict[str, tuple[str, str]], overlay: bool = True,
                     links: dict[str, str] | None = None) -> Path:
    """A series with one real patch made against real upstream v0.5.23 (``edits``: path -> (old, new);
    ``links``: path -> target of a symlink the patch creates) and, optionally, one overlay file. For
    mechanics tests; the product series lives in patches/. Made with git plumbing in a shared bare
    clone: nothing is checked out."""
    work = dest / "work.git"
    subprocess.run(["git", "clone", "--quiet", "--bare", "--shared", str(upstream), str(work)], check=True)
    git = Git(git_dir=work).with_env(GIT_INDEX_FILE=str(dest / "index"))
    git.run("read-tree", "v0.5.23")
    for path, (old, new) in edits.items():
        text = git.blob("v0.5.23", path).decode()
        assert old in text, f"{old!r} not in {path}"
        sha = git.out("hash-object", "-w", "--stdin", input=text.replace(old, new, 1))
        git.run("update-index", "--cacheinfo", f"100644,{sha},{path}")
    for path, target in (links or {}).items():
        sha = git.out("hash-object", "-w", "--stdin", input=target)
        git.run("update-index", "--add", "--cacheinfo", f"120000,{sha},{path}")
    tree = git.out("write-tree")
    commit = git.out("commit-tree", tree, "-p", "v0.5.23", "-m",
                     "c128: test change\n\nWhy: mechanics test.\n\nC128patch-Gate: none (test)")
    (dest / "patches").mkdir(parents=True)
    patch = git.run("format-patch", "-1", "--full-index", "--zero-commit", "--no-signature", "--stdout", commit).stdout
    (dest / "patches" / "0001-test.patch").write_text(patch)
    entries = [
        '[[entries]]\nname = "test-patch"\nkind = "patch"\nfile = "0001-test.patch"\n'
        'why = "test"\nbase = "v0.5.23"\n'
    ]
    if overlay:
        (dest / "overlay" / "sglang").mkdir(parents=True)
        (dest / "overlay" / "sglang" / "c128_test_overlay.py").write_text("VALUE = 1\n")
        entries.append(
            '[[entries]]\nname = "test-overlay"\nkind = "overlay"\nsource = "overlay/sglang/c128_test_overlay.py"\n'
            'target = "python/sglang/c128_test_overlay.py"\nwhy = "test"\nbase = "v0.5.23"\n'
        )
    (dest / "patches" / "series.toml").write_text(
        '[series]\nname = "test"\nversion = "1"\nbase = "v0.5.23"\n\n' + "\n".join(entries)
    )
    from c128patch.ops.lint import update_hashes

    update_hashes(load_series(dest))
    shutil.rmtree(work)
    (dest / "index").unlink()
    return dest


# What the kernel tier needs of a tree (tests/gpu/tree_subset.py picks its files from these).
KERNEL_TIER_PATHS = list(staging.KERNEL_TIER_PATHS)


def series_paths(series: Series) -> list[str]:
    """Every upstream path the series writes: the files of each patch (all variants) and the overlay targets."""
    paths: set[str] = set()
    for entry in series.entries:
        if entry.is_patch:
            for variant in entry.patch_files():
                paths.update(read_patch(series.file_of(entry, variant)).files)
        else:
            paths.add(entry.target)
    return sorted(paths)


class Lazy(dict):
    """key -> ``make(key)``, made when first asked for: a session fixture of every release costs only the ones
    the selected tests read."""

    def __init__(self, make) -> None:
        super().__init__()
        self.make = make

    def __missing__(self, key):
        self[key] = value = self.make(key)
        return value


def release_tree(repo: Path, tag: str, dest: Path, paths: list[str] = KERNEL_TIER_PATHS) -> Path:
    """``paths`` (default: the kernel tier) of upstream release ``tag``; ``dest`` holds ``sglang/``."""
    return unpack_release(repo, tag, dest, paths)


def patched_tree(series_root: Path, repo: Path, tag: str, dest: Path, paths: list[str] = KERNEL_TIER_PATHS) -> Path:
    """``paths`` (default: the kernel tier) of release ``tag`` with the whole series applied, as
    ``c128patch check`` replays it (each entry's selected file, in manifest order); ``dest`` holds ``sglang/``."""
    from c128patch.ops.check import index_git, replay_in_index

    git = Git(git_dir=repo)
    dest.mkdir(parents=True, exist_ok=True)
    index_file = dest / ".index"
    result, _ = replay_in_index(load_series(series_root), git, tag, git.rev_parse(tag), index_file)
    assert result.ok, result.to_json()
    idx = index_git(git, index_file)
    files = idx.out("ls-files", "--", *paths)
    out = dest / ".out"
    idx.run("checkout-index", f"--prefix={out}/", "--stdin", input=files + "\n")
    shutil.move(str(out / "python" / "sglang"), str(dest / "sglang"))
    shutil.rmtree(out)
    index_file.unlink()
    return dest


# -- the CLI and the series as a user runs them ---------------------------------------


@dataclass
class Run:
    """One CLI run: its exit code, stdout as JSON ({} when it is not JSON), stderr, and stdout as text."""

    code: int
    out: dict
    err: str
    text: str = ""


def invoke(*args: str | Path, as_json: bool = True, env: dict[str, str | None] | None = None) -> Run:
    """``c128patch ARGS`` (with ``--json`` unless ``as_json=False``), in process (click's runner); the
    one CLI runner of the tests. An exception that escapes the CLI's error handling (a traceback a
    user would see) is raised here, so the test fails on it."""
    argv = [str(a) for a in args] + (["--json"] if as_json and "--json" not in args else [])
    res = CliRunner().invoke(main, argv, env=env, catch_exceptions=False)
    try:
        out = json.loads(res.stdout)
    except ValueError:
        out = {}
    return Run(res.exit_code, out if isinstance(out, dict) else {}, res.stderr, res.stdout)


def copy_series(dest: Path) -> Path:
    """A private copy of the product series (commands may write its ledger and manifest), with its nvcc
    signature probe (ci/kernel_probe: without it the C++ contract is not compiled and watch is unchecked)."""
    for sub in ("patches", "csrc", "overlay", "ci/kernel_probe"):
        shutil.copytree(REPO_ROOT / sub, dest / sub)
    return dest


def series_made_before(dest: Path, entry: str, base: str) -> Path:
    """A copy of the product series as it stood before ``base`` was supported for ``entry``: its
    file for ``base`` gone, its newest older variant its primary. A rebase onto ``base`` then meets
    the real conflicts that file was made to resolve."""
    series = load_series(copy_series(dest))
    e = series.entry(entry)
    assert e.base == base, f"{entry}'s primary is for {e.base}"
    newest = max(e.variants, key=lambda v: RELEASES.index(v.base))
    (series.patches_dir / e.file).unlink()
    e.file, e.base, e.base_commit, e.sha256 = newest.file, newest.base, newest.commit, newest.sha256
    e.base_sources = newest.sources
    e.variants = [v for v in e.variants if v != newest]
    series.save()
    return dest


def forget_resolutions(series: Path, entry: str, path: str | None = None) -> None:
    """Drop the ledger's resolutions of ``entry`` (of its file ``path`` only, when given): that
    conflict then needs a human again."""
    ledger = series / "patches/resolutions/ledger.toml"
    rows = ledger.read_text().split("[[resolutions]]")
    gone = [r for r in rows if f'entry = "{entry}"' in r and (path is None or f'file = "{path}"' in r)]
    ledger.write_text("[[resolutions]]".join(r for r in rows if r not in gone))
    for row in gone:
        key = re.search(r'^key = "(\w+)"', row, re.M).group(1)
        (series / "patches/resolutions" / entry / f"{key}.diff").unlink()


def tree_of(git: Git, rev: str = "HEAD") -> str:
    """The tree id of ``rev`` with the provenance file left out (what "equal to a fresh apply" compares)."""
    from c128patch.series.provenance import PROVENANCE_PATH

    idx = git.with_env(GIT_INDEX_FILE=str(Path(git.out("rev-parse", "--absolute-git-dir")) / "tree-of.index"))
    idx.run("read-tree", rev)
    idx.run("update-index", "--force-remove", "--", PROVENANCE_PATH)
    return idx.out("write-tree")


def upstream_commit(git: Git, parent: str, subject: str, edit) -> str:
    """A commit on top of upstream ``parent`` (as upstream would land one), made with plumbing:
    ``edit(index_git)`` changes a scratch index holding ``parent``'s tree."""
    idx = git.with_env(GIT_INDEX_FILE=str(Path(git.out("rev-parse", "--absolute-git-dir")) / "upstream.index"))
    idx.run("read-tree", parent)
    edit(idx)
    return git.out("commit-tree", idx.out("write-tree"), "-p", parent, "-m", subject)


def workflow_commands(script: str, sample: dict[str, str] | None = None) -> list[list[str]]:
    """The ``-m c128patch ...`` invocations in a CI run script, continuation lines joined, ``${{ }}``
    replaced by X and ``$VARS`` by ``sample`` values (else ``/sample/VAR``)."""
    import shlex

    sample = sample or {}
    joined = re.sub(r"\\\n\s*", " ", script)
    out = []
    for line in joined.splitlines():
        line = re.sub(r"\$\{\{[^}]*\}\}", "X", line.strip())
        line = re.sub(r"\$\{?(\w+)\}?", lambda m: sample.get(m.group(1), f"/sample/{m.group(1)}"), line)
        m = re.search(r"-m c128patch (.*?)(\s*\|\|.*)?$", line)
        if m:
            out.append(shlex.split(m.group(1)))
    return out


# The files that take longest start first, longest first (CI's durations, any pass: pass 2 runs only
# the tests pass 1 skipped for lack of torch; test_scenarios is all heavy): with --dist loadfile a long file
# handed out last is the run's tail (the heavy tier's was test_scenarios, ~80 s of one worker alone), and xdist
# alone would order the files by their number of tests (pyproject's addopts: --no-loadscope-reorder keeps the
# order given here). The tier's scenario tests are two files (~10 and ~7 tier runs) so both workers share them.
# test_watch_ci.py first: in the heavy tier its recipe test builds the v0.5.23 environment on a fresh workspace and
# hands it to the run's cache (share_environment), where test_scenarios.py, handed out third (the same worker, two
# workers taking files in turn), then finds it instead of building it a second time; test_compile_kernels.py second.
SLOW_FIRST = ("test_watch_ci.py", "test_compile_kernels.py", "test_scenarios.py", "test_scenarios_upstream.py",
              "test_smoke_upstream_suite.py",
              "test_rebase.py", "test_watch.py", "test_layers.py", "test_planner_host_cpu.py",
              "test_watch_behaviour.py", "test_env.py", "test_reproducible.py", "test_deploy.py",
              "test_bench_variants.py")


def tier_unchecked(behaviour: dict) -> list[str]:
    """What watch must list for the tier here: every module not imported names a package this interpreter really
    lacks (never a pass), and any such module makes the tier unchecked, never clean."""
    for line in behaviour["not_checked"]:  # a probe: its module did not import (listed itself)
        needs = re.search(r": not checked: needs ([\w.]+)", line)
        assert needs and importlib.util.find_spec(needs[1].split(".")[0]) is None or " did not import" in line, line
    return [f"behavioural tier: {behaviour['verdict']}"] if behaviour["not_checked"] else []


def share_environment(built: Path) -> bool:
    """Hands the behavioural tier's environment a test built in a cache of its own (``built``: that cache's
    ``envs/<key>``, ready) to this run's cache (``$C128PATCH_CACHE``, where ``fit.env.build`` looks) when that has none
    of its key, so the tests that need the same environment there find it instead of building it again. The key is
    the hash of the lock's packages (and the rows tried), so one key is one requirement set installed from the same
    hashed wheels: the v0.5.23 environment the recipe's test builds on a fresh workspace (tests/test_watch_ci.py) is
    the one test_scenarios.py, test_scenarios_upstream.py and test_env.py take from the run's cache (~120 CPU-s and
    ~2 min to build). Moved (``built``'s cache loses it: a rename where both lie on one file system, as CI's do on
    tmpfs, where a copy took 3.2 GB more; else a copy, ~9 s) into a folder of its own, renamed into place under the
    cache's lock, as ``build`` does. Whether it was."""
    from c128patch import procs
    from c128patch.upstream.releases import cache_dir, locked

    if not ((built / "c128patch-ready").is_file() and (built / "venv").is_dir() and not built.is_symlink()):
        raise AssertionError(f"{built}: not a ready environment")
    root = cache_dir() / "envs"
    with locked(root / ".lock"):
        final = root / built.name
        if final.exists():
            return False
        tmp = Path(procs.scratch_dir(f".build-{built.name}-", root))
        try:
            shutil.move(built, tmp / "copy")
            os.rename(tmp / "copy", final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return True
