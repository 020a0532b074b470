"""Where upstream SGLang comes from for ``--sglang-rev`` (a local clone, a URL, or the releases), and the commit a
series goes onto there: ``Target`` (rev, commit, source), and the branch named after it."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from c128patch import procs
from c128patch.errors import C128Error
from c128patch.git import (
    Git,
    GitError,
    damaged_index,
    damaged_repository,
    not_plain,
    refuse_damaged,
    refuse_git_dir,
    work_tree_top,
)
from c128patch.progress import NullReporter, Reporter, echo
from c128patch.textsafe import shell_quote
from c128patch.upstream import DEFAULT_TREE, is_url
from c128patch.upstream.releases import (
    DEFAULT_RELEASES,
    ReleaseHistory,
    cache_dir,
    locked,
    release_version,
)

NET_TIMEOUT_ENV = "C128PATCH_NET_TIMEOUT"  # seconds a clone or fetch of --repo URL may take (default 600)
# seconds an http(s) clone or fetch may receive nothing (under 1 byte/s: git's http.lowSpeedTime) before it is given
# up; a live server sends data or keepalives; the operator's GIT_HTTP_LOW_SPEED_LIMIT/_TIME win
STALL = 120
_LOW_SPEED = ("GIT_HTTP_LOW_SPEED_LIMIT", "GIT_HTTP_LOW_SPEED_TIME")

def shown(rev: str) -> str:
    """``rev`` for a message: an absurdly long one is cut."""
    return rev if len(rev) <= 80 else f"{rev[:40]}... ({len(rev)} characters)"


@dataclass
class Upstream:
    """A repository that holds upstream revisions (objects only; never checked out here)."""

    kind: str  # "release" | "path" | "url"
    git: Git
    location: str

    def resolve(self, rev: str) -> str:
        commit = self.git.rev_parse(rev)
        if commit is None and self.kind == "url":
            self._fetch(check=False)
            commit = self.git.rev_parse(rev)
        if commit is None:
            known = "" if self.kind != "release" else \
                f" (the release source knows {', '.join('v' + v for v in ReleaseHistory().versions())})"
            tag = f"v{rev}"  # a version for its tag (wheel --from-release takes both)
            meant = f"; did you mean '{tag}'?" if rev[:1].isdigit() and self.git.rev_parse(tag) else ""
            raise C128Error(f"unknown rev '{shown(rev)}' in {self.describe()}{known}{meant}")
        return commit

    def update(self) -> None:
        """A URL's mirror fetched now, for a moving branch (``resolve`` fetches only an unknown rev)."""
        if self.kind == "url":
            self._fetch(check=True)

    def _fetch(self, check: bool) -> None:
        with locked(Path(str(self.git.git_dir) + ".lock")):
            # from its URL, not the remote "origin": the operator's `clone.defaultRemoteName` names it otherwise
            _network(self.git, self.location, "fetch", "--quiet", "--prune", "--", self.location, "+refs/*:refs/*",
                     check=check)

    def describe(self) -> str:
        return {"release": "the sglang release wheels", "path": self.location, "url": self.location}[self.kind]


_NOT_IN_A_REF = re.compile(r"\.\.|[\x00-\x20\x7f~^:?*\[\\]|@\{|//|/\.|^\.|\.lock$|/$|\.$|^@$")  # git check-ref-format


def default_branch(rev: str) -> str:
    """The branch ``apply`` makes for ``rev`` (``rebase`` renames it after the new base)."""
    return f"c128/{rev}"


@dataclass(frozen=True)
class Target:
    rev: str  # as the user named it: a release tag, a branch, a commit
    commit: str  # the commit it names
    source: str = ""  # where upstream came from: "release" | "path" | "url" ("": not said)
    url: str = ""  # source "url": the URL

    @classmethod
    def of(cls, upstream: Upstream, rev: str) -> Target:
        """``rev`` resolved in ``upstream``."""
        return cls(rev, upstream.resolve(rev), upstream.kind, upstream.location if upstream.kind == "url" else "")

    @classmethod
    def from_json(cls, data: dict) -> Target:
        return cls(**{k: str(data.get(k) or "") for k in ("rev", "commit", "source", "url")})

    def to_json(self) -> dict[str, str]:
        """The provenance record's ``upstream``: rev and commit, then source and url where known."""
        return {k: v for k, v in asdict(self).items() if v or k in ("rev", "commit")}

    @property
    def branch(self) -> str:
        """``c128/<rev>``; for a rev no branch name can hold (``main~1``, ``HEAD^``, ``main@{0}``) its commit's."""
        return default_branch(self.rev if not _NOT_IN_A_REF.search(self.rev) else self.commit[:12])


def own_work_tree(path: Path, option: str) -> bool:
    """Is ``path`` the top of a work tree? A folder inside one is refused: git works from the top (the series' paths),
    the tool wrote an overlay under the folder given (``--repo R/python``: ``R/python/python/sglang/...``)."""
    top = work_tree_top(path)
    if top is not None and top.resolve() != path.resolve():
        raise C128Error(f"{option} {path} is a folder inside the work tree {top}, not its top; pass {option} {top}")
    return top is not None


def open_upstream(repo: str | None, revs: list[str], reporter: Reporter = NullReporter()) -> Upstream:
    """Open the upstream named by ``--repo`` (path or URL), or the release history by default."""
    if repo is None:
        bad = next((rev for rev in revs if release_version(rev) is None), None)
        if bad is not None:
            raise C128Error(f"unknown rev '{shown(bad)}': without --repo only release tags (e.g. "
                            f"v{DEFAULT_RELEASES[-1]}) can be used; pass --repo PATH|URL for other revisions")
        root = ReleaseHistory().ensure([v for rev in revs if (v := release_version(rev))], reporter)
        return Upstream("release", Git(git_dir=root), str(root))
    if is_url(repo):
        return _open_url(repo, reporter)
    path = Path(repo).expanduser().absolute()  # git runs in the repo: a relative bare path would not resolve there
    if not path.exists():
        raise C128Error(f"missing repo: {path} does not exist")
    git = Git(worktree=path) if own_work_tree(path, "--repo") else Git(git_dir=path)
    refuse_damaged(git, path)
    return Upstream("path", git, str(path.resolve()))



MIRROR_DONE = "c128patch-mirror-complete"  # written into a mirror once its clone finished


def _open_url(url: str, reporter: Reporter) -> Upstream:
    """The URL's mirror in the cache, cloned once under a temporary name, renamed when complete (with a
    marker inside): a half-made one (a killed clone, an old layout's) is removed, said, and cloned again."""
    mirror = cache_dir() / "remotes" / (hashlib.sha256(url.encode()).hexdigest()[:16] + ".git")
    with locked(Path(str(mirror) + ".lock")):
        for stale in mirror.parent.glob(mirror.name + ".part-*"):  # we hold the lock: no clone is running
            echo(f"c128patch: note: removing {stale}, a half-made mirror of {url} (an interrupted clone)")
            shutil.rmtree(stale, ignore_errors=True)
        if mirror.is_symlink() or mirror.exists() and not mirror.is_dir():  # (rmtree below: OSError's traceback)
            raise C128Error(f"the mirror {mirror} of {url} in the cache is not a folder (a link or a file): not used; "
                            f"remove it (rm {shell_quote(str(mirror))}) and run again: it is cloned again")
        if mirror.exists() and not (mirror / MIRROR_DONE).is_file():
            echo(f"c128patch: note: removing {mirror}, a half-made mirror of {url} (an interrupted clone): cloning it "
                 "again")
            shutil.rmtree(mirror)
        if not mirror.exists():
            limit, stall = net_limits()
            bounds = f"{limit:g} s in all" if stall is None else f"{stall} s with nothing received, {limit:g} s in all"
            reporter.step(f"cloning {url} (once, into {mirror}; waiting for the server up to {bounds})")
            mirror.parent.mkdir(parents=True, exist_ok=True)
            part = mirror.with_name(f"{mirror.name}.part-{os.getpid()}")
            try:
                _network(Git(), url, "clone", "--quiet", "--mirror", "--", url, str(part))
                (part / MIRROR_DONE).write_text(url + "\n")
                os.replace(part, mirror)
            finally:
                shutil.rmtree(part, ignore_errors=True)
        if why := not_plain(mirror):  # (as the release cache: a FIFO at its HEAD made git wait forever)
            raise C128Error(f"the mirror {mirror} of {url} in the cache: {why} as git writes it (git would wait on a "
                            f"FIFO there, or follow a link out of the cache); rebuild it: rm -rf "
                            f"{shell_quote(str(mirror))} (the next run clones it again)")
        if bad := damaged_index(mirror / "objects"):  # (~1 ms; as the release cache: git's "Could not read" named
            raise C128Error(f"the mirror {mirror} of {url} in the cache is corrupt ({bad} fails its "  # no
                            f"checksum); rebuild it: rm -rf {shell_quote(str(mirror))} (the next run clones it again)")
    return Upstream("url", Git(git_dir=mirror), url)


def net_limits(url: str = "") -> tuple[float, int | None]:
    """(seconds a clone or fetch may take, seconds an http(s) one may receive nothing, None where that is not
    bounded: another protocol, or the operator's GIT_HTTP_LOW_SPEED_* say)."""
    try:
        limit = float(os.environ.get(NET_TIMEOUT_ENV) or 600)
    except ValueError:
        limit = float("nan")
    if not 0 < limit <= 86_400:  # (nan, inf and 1e400 too: subprocess would raise on them)
        raise C128Error(f"{NET_TIMEOUT_ENV}={os.environ[NET_TIMEOUT_ENV]!r} is not a number of seconds more than 0 "
                        "and at most 86400 (a day)") from None
    web = not url or url.lower().startswith(("http://", "https://"))
    stall = min(STALL, max(1, int(limit)))
    return limit, stall if web and stall < limit and not any(os.environ.get(v) for v in _LOW_SPEED) else None


def _network(git: Git, url: str, *args: str, check: bool = True) -> None:
    """A clone or fetch of ``url``, bounded in time (``$C128PATCH_NET_TIMEOUT``, default 600 s; an http(s) one that
    receives nothing for ``STALL`` s ends sooner); says what failed."""
    limit, stall = net_limits(url)
    env = {"GIT_HTTP_LOW_SPEED_LIMIT": "1", "GIT_HTTP_LOW_SPEED_TIME": str(stall)} if stall is not None else None
    try:
        git.run(*args, check=check, transport=True, timeout=limit, env=env)
    except GitError as exc:
        if stall is not None and "Operation too slow" in exc.message:
            raise C128Error(f"cannot {args[0]} {url}: the server sent nothing for {stall} s (a stalled transfer; "
                            f"GIT_HTTP_LOW_SPEED_TIME=SECONDS waits longer)") from None
        raise C128Error(f"cannot {args[0]} {url}: {exc.message}") from exc
    except subprocess.TimeoutExpired:
        raise C128Error(f"cannot {args[0]} {url}: no answer within {limit:g} s (a server that does not answer; "
                        f"set {NET_TIMEOUT_ENV} to wait longer)") from None


def discard_fresh_tree(tree: Path, existed: bool) -> bool:
    """Undo a fresh clone of ``prepare_tree``: ``tree`` removed, or emptied where it ``existed`` (empty); whether it
    is (a removal can fail: too few open files, a read-only disk)."""
    try:
        for child in list(tree.iterdir()) if existed else [tree]:
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)
        return not any(tree.iterdir()) if existed else not os.path.lexists(tree)
    except OSError:
        return False


def prepare_tree(upstream: Upstream, tree: Path | None, commit: str, reporter: Reporter = NullReporter(),
                 template: Path | None = None, refused: bool = False) -> tuple[Path, bool]:
    """The tree ``apply`` patches and whether it is a fresh clone (its git dir from ``template``, if given);
    ``refused``: the caller ran ``refuse_git_dir`` on ``tree`` already (two git calls each)."""
    if tree is not None and not refused:
        refuse_git_dir(tree)
    if upstream.kind == "path" and upstream.git.worktree is not None:
        if tree is not None and tree.resolve() != upstream.git.worktree.resolve():
            raise C128Error("--tree cannot be used with a local clone as --repo: the clone is the tree")
        return upstream.git.worktree, False
    tree = tree or DEFAULT_TREE
    source = str(upstream.git.git_dir)  # a bare repo: the release cache, a URL's mirror, or the user's
    if not tree.exists() or (tree.is_dir() and not any(tree.iterdir())):
        reporter.step(f"cloning upstream into {tree}")
        extra = [f"--template={template}"] if template is not None else []
        Git().run("clone", "--quiet", "--no-checkout", *extra, "--", source, str(tree))
        return tree, True
    if not own_work_tree(tree, "--tree"):
        raise C128Error(f"not a git repository: {tree} (pass --tree to a git work tree, or to a new or empty folder)")
    git = Git(worktree=tree)
    if git.rev_parse(commit) is None:
        reporter.step(f"fetching {commit[:12]} into {tree}")
        fetch_into(git, source, commit, tags=True)
    return tree, False


def fetch_into(git: Git, source: str, commit: str, tags: bool = False) -> None:
    """``commit`` (and ``source``'s tags) into the repository of ``git``, by a fetch that reads none of its config (a
    url rewrite, a transport's program, an alternate-refs command would run a program there): run in an empty
    repository whose object store is the tree's, the tags then written by ``update-ref``."""
    objects = git.cwd / git.out("rev-parse", "--git-path", "objects")
    with procs.scratch("c128patch-fetch-") as empty:
        Git().run("init", "--quiet", "--bare", empty)
        shim = Git(git_dir=Path(empty), env={"GIT_OBJECT_DIRECTORY": str(objects.resolve())})
        shim.run("fetch", "--quiet", "--no-write-fetch-head", "--", source, commit,
                 *(["+refs/tags/*:refs/tags/*"] if tags else []))
        updates = shim.out("for-each-ref", "--format=update %(refname) %(objectname)", "refs/tags")
    if updates:
        git.run("update-ref", "--stdin", input=updates + "\n")


# git's words for objects it could not read ("bad file": cat-file's for a missing one)
_DAMAGED = re.compile(r"inflate|corrupt|bad object|bad file|unable to read|invalid object|packed object|loose object")


def damage_note(upstream: Upstream, source: str, message: str) -> str:
    """"; the release cache ... is damaged ..." where git's failure in a fresh clone of it says so, or a pack index of
    ``source`` fails its checksum; else ""."""
    if upstream.kind == "release" and _DAMAGED.search(message):  # (its objects are the cache's)
        return (f"; the release cache {upstream.location} is damaged: rebuild it: rm -rf "
                f"{shell_quote(upstream.location)} (the next run imports the releases again)")
    why = damaged_source(upstream, source)
    return f"; {why}" if why else ""


def damaged_source(upstream: Upstream, source: str) -> str:
    """Why an apply in a fresh clone of ``source`` failed, where a pack index of it fails its checksum (git found
    some objects where they are not: a "conflict", a tree it could not read): checked only after a failure."""
    bad = damaged_index(Path(source) / "objects")
    if bad is None:
        return ""
    if upstream.kind == "path":
        return damaged_repository(source, bad)
    what, again = {"release": ("the release cache", f"rebuild it: rm -rf {shell_quote(source)} (the next run imports "
                                                    "the releases again)"),
                   "url": (f"the mirror of {upstream.location}:", f"rebuild it: rm -rf {shell_quote(source)} (the "
                                                                  "next run mirrors it again)")}[upstream.kind]
    return f"{what} {source} is damaged ({bad} fails its checksum), not the series: {again}"
