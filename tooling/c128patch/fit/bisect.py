"""``bisect``: the first upstream commit between the series' base and REV at which the series stops applying
or fitting (``fit.contract``; with ``behaviour`` also ``fit.treecheck``): ``git bisect run`` in a scratch bare
clone with ``c128patch contract`` (and ``treecheck``) as the step (0: fits, 1: broken, 2: does not apply),
bounded by ``timeout``; the first bad commit is checked once more to name what fails there.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from c128patch.errors import C128Error
from c128patch.fit import contract, treecheck
from c128patch.fit.sandbox import interpreter
from c128patch.git import Git
from c128patch.progress import NullReporter, Reporter
from c128patch.series.layers import layer_args
from c128patch.series.manifest import Series
from c128patch.upstream.source import open_upstream


def _what_fails(series: Series, git: Git, commit: str, behaviour: bool = False, python: str | None = None) -> list[str]:
    try:
        result = contract.check(series, git, commit, contract.patched_tree(series, git, commit[:12], commit))
        failing = [f.message for f in result.errors + result.warnings]
        if behaviour and not failing:
            failing = [f"behavioural tier: {f}" for f in
                       treecheck.run_rev(series, git, commit[:12], commit, python=python).failed]
    except C128Error as exc:
        return [exc.message]
    return failing


def bisect(series: Series, repo: str | None, onto: str, *, timeout: float = 600, behaviour: bool = False,
           python: str | None = None, reporter: Reporter = NullReporter()) -> dict:
    """The first commit in ``base..onto`` where the series no longer applies or fits (module docstring)."""
    if not series.base:
        raise C128Error(f"{series.manifest_path} names no base: bisect starts there")
    python = interpreter(python) if python else None  # the step runs elsewhere: a path from here, made absolute
    upstream = open_upstream(repo, [series.base, onto] if repo is None else [], reporter)
    base, target = upstream.resolve(series.base), upstream.resolve(onto)
    git = upstream.git
    if not git.is_ancestor(base, target):
        raise C128Error(f"the series base {series.base} is not an ancestor of {onto}: nothing to bisect between them")
    report = {"onto": {"rev": onto, "commit": target}, "base": {"rev": series.base, "commit": base},
              "commits_between": git.count(f"{base}..{target}"), "found": False, "commit": "", "subject": "",
              "failing": []}
    reporter.step(f"checking {onto}")
    failing = _what_fails(series, git, target, behaviour, python)
    if not failing:
        report["summary"] = f"the series applies and fits {onto}: nothing to bisect"
        return report
    if _what_fails(series, git, base, behaviour, python):
        raise C128Error(f"the series does not fit its own base {series.base}: fix that first (c128patch contract "
                        f"--sglang-rev {series.base})")
    with tempfile.TemporaryDirectory(prefix="c128bisect-") as tmp:
        scratch = Path(tmp) / "upstream.git"
        source = git.git_dir or Path(git.out("rev-parse", "--absolute-git-dir"))
        Git().run("clone", "--quiet", "--bare", "--shared", str(source), str(scratch))
        sgit = Git(git_dir=scratch)
        where = ["--sglang-rev", "BISECT_HEAD", "--repo", str(scratch), "--series", str(series.root),
                 *layer_args(series), "--json"]
        step = [sys.executable, "-m", "c128patch", "contract", *where, "--no-nvcc"]  # 0 fits, 1 broken, 2 no apply
        if behaviour:
            runs = [sys.executable, "-m", "c128patch", "treecheck", *where] + (["--python", python] if python else [])
            # treecheck's 8 (a module not importable here) is not a break: good, as _what_fails reads it
            tier = f"{{ {shlex.join(runs)}; rc=$?; [ $rc = 8 ] || exit $rc; }}"
            step = ["sh", "-c", f"{shlex.join(step)} >/dev/null && {tier}"]
        reporter.step(f"git bisect over {report['commits_between']} upstream commit(s)")
        sgit.run("bisect", "start", "--no-checkout", target, base)
        try:
            proc = sgit.run("bisect", "run", *step, check=False, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise C128Error(f"bisect timed out after {timeout:g} s ({report['commits_between']} commits); "
                            "give it more time with --timeout SECONDS") from None
        found = re.search(r"^([0-9a-f]{40}) is the first bad commit", proc.stdout, re.M)
        if not found:
            raise C128Error("git bisect did not name a commit: "
                            f"{(proc.stdout + proc.stderr).strip().splitlines()[-1:]}")
    commit = found.group(1)
    report.update(found=True, commit=commit, subject=git.out("log", "-1", "--format=%s", commit),
                  failing=_what_fails(series, git, commit, behaviour, python))
    report["summary"] = (f"first upstream commit where the series stops fitting: {commit[:12]} {report['subject']!r}: "
                         f"{report['failing'][0] if report['failing'] else '?'}")
    return report
