"""``bisect``: the first upstream commit between the series' base and REV at which the series stops applying
or fitting: ``git bisect`` in a scratch bare clone, each step judged by :func:`fit_check` (the checks ``watch``
judges by: the contract, the nvcc probe where nvcc is, copies of what we patch; with ``behaviour`` also
``fit.treecheck``), bounded by ``timeout``; the first bad commit is checked once more to name what fails there.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from c128patch import procs
from c128patch.errors import C128Error
from c128patch.fit import contract, copies, treecheck
from c128patch.fit import contract_cxx as cxx
from c128patch.fit.sandbox import interpreter
from c128patch.git import Git
from c128patch.progress import NullReporter, Reporter
from c128patch.series.manifest import Series
from c128patch.upstream import local_repo
from c128patch.upstream.source import open_upstream


def fit_check(series: Series, git: Git, base: str, commit: str, head: str, ours: list[copies.Patched],
              review: contract.Review | None = None) -> dict:
    """Does the series, carried to ``commit`` as ``head``, fit it: the contract against the lock, the nvcc signature
    probe (where nvcc is) and the copies ``base..commit`` adds of what we patch; ``failing`` says what breaks it,
    ``unchecked`` what the contract could not check (an upstream file we mirror changed since the lock: not a
    break, never clean); ``review``: how those lines name the repository and the rev."""
    result = contract.check(series, git, commit, head, review=review)
    probe_ok, probe = cxx.probe(series.root, git, head)
    found = copies.landed(git, head, copies.find(git, base, commit, ours))
    failing = [str(c) for c in found if c.missing] + [f.message for f in result.errors + result.warnings]
    failing += [f"C++: {probe}"] if probe_ok is False else []
    return {"broken": bool(failing), "verdict": result.verdict(), "failing": failing,
            "unchecked": [f.message for f in result.unchecked], "cxx_probe": probe,
            "cxx_probe_ok": probe_ok, "copies": [str(c) for c in found if not c.missing], "json": result.to_json()}


def _what_fails(series: Series, git: Git, base: str, commit: str, ours: list[copies.Patched], behaviour: bool,
                python: str | None) -> list[str]:
    try:
        failing = fit_check(series, git, base, commit, contract.patched_tree(series, git, commit[:12], commit),
                            ours)["failing"]
        tier = treecheck.run_rev(series, git, commit[:12], commit, python=python) if behaviour and not failing else None
    except C128Error as exc:
        return [exc.message]
    if tier is not None and not tier.failed and (not tier.ran or not all(t.torch for t in tier.tiers)):  # nothing
        # imported: neither good nor bad, never "fits" (h152); a step that ran some (no triton: a scenario not run) is
        # judged by what ran, as watch's bisect needs
        raise C128Error(f"bisect --behaviour cannot judge {commit[:12]}: the behavioural tier did not check it "
                        f"({(tier.not_checked() or [tier.verdict()])[0]}); give --python an interpreter it can import "
                        "the tree with (torch installed), or leave out --behaviour")
    return [f"behavioural tier: {f}" for f in tier.failed] if tier is not None else failing


def bisect(series: Series, repo: str | None, onto: str, *, timeout: float = 600, behaviour: bool = False,
           python: str | None = None, reporter: Reporter = NullReporter()) -> dict:
    """The first commit in ``base..onto`` where the series no longer applies or fits (module docstring)."""
    if not series.base:
        raise C128Error(f"{series.manifest_path} names no base: bisect starts there")
    # the step runs elsewhere: a path from here, made absolute; never a program of the local --repo
    python = interpreter(python, local_repo(repo)) if python else None
    upstream = open_upstream(repo, [series.base, onto] if repo is None else [], reporter)
    base, target = upstream.resolve(series.base), upstream.resolve(onto)
    git = upstream.git
    if not git.is_ancestor(base, target):
        raise C128Error(f"the series base {series.base} is not an ancestor of {onto}: nothing to bisect between them")
    report = {"onto": {"rev": onto, "commit": target}, "base": {"rev": series.base, "commit": base},
              "commits_between": git.count(f"{base}..{target}"), "found": False, "commit": "", "subject": "",
              "failing": []}
    reporter.step(f"checking {onto}")
    ours = copies.patched(series, git, series.base, base)

    seen: dict[str, list[str]] = {}  # the found commit is one checked already (the target, for one commit)

    def fails(commit: str) -> list[str]:
        if commit not in seen:
            seen[commit] = _what_fails(series, git, base, commit, ours, behaviour, python)
        return seen[commit]

    if not fails(target):
        report["summary"] = f"the series applies and fits {onto}: nothing to bisect"
        return report
    if fails(base):
        raise C128Error(f"the series does not fit its own base {series.base}: fix that first (c128patch contract "
                        f"--sglang-rev {series.base})")
    reporter.step(f"git bisect over {report['commits_between']} upstream commit(s)")
    end = time.monotonic() + timeout
    with procs.scratch("c128bisect-") as tmp:
        scratch = Path(tmp) / "upstream.git"  # git bisect keeps its state there, not in the user's repository
        source = git.git_dir or Path(git.out("rev-parse", "--absolute-git-dir"))
        Git().run("clone", "--quiet", "--bare", "--shared", str(source), str(scratch))
        sgit = Git(git_dir=scratch)
        said = sgit.out("bisect", "start", "--no-checkout", target, base)
        while not (found := re.search(r"^([0-9a-f]{40}) is the first bad commit", said, re.M)):
            if time.monotonic() > end:
                raise C128Error(f"bisect timed out after {timeout:g} s ({report['commits_between']} commits); "
                                "give it more time with --timeout SECONDS")
            step = sgit.out("rev-parse", "BISECT_HEAD")
            reporter.step(f"git bisect: checking {step[:12]}")
            said = sgit.out("bisect", "bad" if fails(step) else "good", step)
    commit = found.group(1)
    report.update(found=True, commit=commit, subject=git.named("log", "-1", "--format=%s", commit),
                  failing=fails(commit))
    report["summary"] = (f"first upstream commit where the series stops fitting: {commit[:12]} {report['subject']!r}: "
                         f"{report['failing'][0] if report['failing'] else '?'}")
    return report
