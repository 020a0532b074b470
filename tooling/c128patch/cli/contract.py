"""c128patch contract [--sglang-rev X ... | --tree DIR] [--repo R] [--accept] [--nvcc/--no-nvcc] [--json]"""

from __future__ import annotations

from pathlib import Path

import click

from c128patch.cli.common import (
    Run,
    applied_tree_here,
    exit_unless,
    load_stack,
    locate_tree,
    repo_option,
    say,
    verb_options,
)
from c128patch.errors import C128Error

LEVELS = {"unchecked": "not checked"}  # a finding's level as the text output says it


@click.command("contract")
@click.option("--sglang-rev", "revs", multiple=True,
              help="Upstream revision(s): the series is replayed there in a temporary index (nothing checked out).")
@click.option("--tree", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="A tree c128patch applied the series in (its HEAD against the upstream commit it records); "
                   "default, without --sglang-rev: the one here (else ./sglang).")
@repo_option
@click.option("--accept", is_flag=True,
              help="Record the changed signatures and values, and new namespace members, found as accepted in "
                   "patches/contract.lock (after review); a call that does not bind, or binds an argument "
                   "elsewhere, is never accepted.")
@click.option("--nvcc/--no-nvcc", "use_nvcc", default=None,
              help="Compile the nvcc signature probe against the tree's headers (default: where nvcc is on PATH).")
@click.option("--verbose", is_flag=True,
              help="List the notes too (uses not resolved statically, uses not in the lock).")
@verb_options
def command(revs: tuple[str, ...], tree: Path | None, repo: str | None, accept: bool, use_nvcc: bool | None,  # noqa: C901  one verb's flags
            verbose: bool, series_dir: Path | None, layer_dirs: tuple[Path, ...], as_json: bool, run: Run) -> None:
    """Does the series still fit each upstream? Resolve every upstream module, name, attribute (on typed and
    untyped receivers) and call our code uses, bind each call to its definition and each upstream call of ours to
    ours, and compare signatures, mirrored values and namespace members with patches/contract.lock; an upstream
    file our code mirrors with nothing to check (the online c128 state row) that changed since the lock is not
    checked until reviewed and accepted. A positional argument of ours that lands on another parameter than at the
    base (a reorder), or a keyword only **kwargs takes now, is an error; parameters only added with defaults, a
    note. Exit 1 on an error, a changed signature or a file not checked."""
    from c128patch.fit import contract as core
    from c128patch.fit import contract_cxx as cxx
    from c128patch.git import Git
    from c128patch.progress import reporter
    from c128patch.series.contract import read_lock
    from c128patch.series.plan import validate_files
    from c128patch.textsafe import shell_quote
    from c128patch.upstream.source import open_upstream

    if not revs and tree is None:
        tree = applied_tree_here("contract")
    series = load_stack(run, series_dir, layer_dirs, tree, repo)
    validate_files(series)
    if bool(revs) == (tree is not None):
        raise C128Error("pass --sglang-rev X (one or more) or --tree DIR (default: the patched tree here), not both "
                        "and not neither")
    lock = read_lock(series.patches_dir)
    if accept and lock is None:
        raise C128Error(f"{series.patches_dir}/contract.lock does not exist: write it with `c128patch refresh` "
                        "on a tree at the series base first")
    runs: list[tuple[str, object, str, str, core.Review]] = []
    flags = (f" --series {shell_quote(str(series_dir))}" if series_dir else "") + "".join(
        f" --layer {shell_quote(str(x))}" for x in layer_dirs)  # the series as this command was given it
    if tree is not None:
        git = Git(worktree=locate_tree(tree))
        base = core.tree_base(git)
        runs.append((str(tree), git, base, "HEAD", core.Review(
            str(git.cwd), base[:12], f"c128patch contract --tree {shell_quote(str(tree))}{flags} --accept")))
    else:
        with reporter(not as_json, total=len(revs), title="contract") as rep:
            upstream = open_upstream(repo, list(revs), rep)
            for rev in revs:
                commit = upstream.resolve(rev)
                rep.step(f"replaying the series on {rev}")
                accepting = (f"c128patch contract --sglang-rev {shell_quote(rev)}"
                             + (f" --repo {shell_quote(repo)}" if repo else "") + f"{flags} --accept")
                runs.append((rev, upstream.git, commit, core.patched_tree(series, upstream.git, rev, commit),
                             core.Review(str(upstream.git.cwd), commit[:12], accepting)))
    results = [(label, core.check(series, git, base, head, lock=lock, review=review),
                None if use_nvcc is False else cxx.probe(series.root, git, head))
               for label, git, base, head, review in runs]
    for _, _, probe in results:
        if use_nvcc and probe[0] is None:  # --nvcc asked for it: not checked is an error
            raise C128Error(probe[1])
    accepted = sum(core.accept(lock, result) for _, result, _ in results) if accept else 0
    # after --accept the accepted changes hold; an error it cannot accept (a call that no longer binds) never does
    ok = all(not [e for e in r.errors if not (accept and e.acceptable)] and (accept or not r.warnings)
             and (accept or not r.unchecked) and (p is None or p[0] is not False) for _, r, p in results)
    if as_json:
        run.emit({"ok": ok, "accepted": accepted, "series": {"name": series.name, "version": series.version},
                   "revs": [{"rev": label, **r.to_json(), "cxx_probe": p[1] if p else "not run",
                             "cxx_probe_ok": p[0] if p else None} for label, r, p in results]}, series)
    else:
        for label, result, probe in results:
            notes = 0 if verbose else sum(f.level == "note" for f in result.findings)
            say(*(f"  {LEVELS.get(f.level, f.level)}: {f.message}" for f in result.findings
                  if f.level != "note" or verbose),
                *([f"  {notes} note(s) (--verbose lists them)"] if notes else []),
                *([f"  C++: {probe[1]}"] if probe is not None else []),
                f"{label}: contract {result.verdict()} ({result.seconds:.2f} s)")
        if accept:
            say(f"accepted {accepted} changed signature(s) in {lock.path}")
    exit_unless(ok)
