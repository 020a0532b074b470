"""Which wheel of an sglang release fits an interpreter and platform, and where it comes from.

sglang ships one wheel per CPython version and platform, with the same sources and other compiled
extensions. ``wheel --from-release`` patches one pip would install here (``packaging.tags.sys_tags()``)
or the one ``--python-tag`` / ``--platform`` names (a platform left out: this machine's), from the
wheelhouses ($C128PATCH_WHEELHOUSE, the cache), else ``pip download``ed into the cache. When none fits,
the error lists the release's wheels there and on the index (PEP 691 listing, $PIP_INDEX_URL or PyPI).
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from packaging.tags import Tag, sys_tags
from packaging.version import Version

from c128patch.errors import C128Error
from c128patch.progress import NullReporter, Reporter, transfer
from c128patch.upstream.releases import PACKAGE, local_wheels, parsed_name, pip_download

_PYTHON_TAG = re.compile(r"^(cp|pp)(\d)(\d*)$")
_PLATFORM_TAG = re.compile(r"^[a-z0-9_]+$")
DEFAULT_INDEX = "https://pypi.org/simple"


@dataclass(frozen=True)
class WheelTarget:
    """The interpreter and platform a wheel must fit (``python_tag``/``platform`` None: this machine's)."""

    python_tag: str | None = None
    platform: str | None = None

    def __post_init__(self) -> None:
        if self.python_tag is not None and not _PYTHON_TAG.match(self.python_tag):
            raise C128Error(f"--python-tag {self.python_tag!r}: expected an interpreter tag such as cp312")
        if self.platform is not None and not _PLATFORM_TAG.match(self.platform):
            raise C128Error(f"--platform {self.platform!r}: expected a platform tag such as manylinux_2_34_x86_64")

    @property
    def is_here(self) -> bool:
        return self.python_tag is None and self.platform is None

    def describe(self) -> str:
        if self.is_here:
            here = next(iter(sys_tags()))
            return f"this interpreter ({here.interpreter}, {here.platform})"
        return f"{self.python_tag or 'this interpreter'} / {self.platform or 'this platform'}"

    def rank(self, tag: Tag) -> int | None:
        """How well ``tag`` fits (lower is better); None when it does not."""
        here = list(sys_tags())
        if self.is_here:
            return here.index(tag) if tag in here else None
        platforms = [self.platform] if self.platform else list(dict.fromkeys(t.platform for t in here))
        if tag.platform not in platforms and tag.platform != "any":
            return None
        generic = tag.abi == "none" and tag.interpreter in ("py3", f"py{(self.python_tag or 'cp3')[2]}")
        if self.python_tag and tag.interpreter != self.python_tag and not generic:
            return None
        if not self.python_tag and tag.interpreter not in {t.interpreter for t in here}:
            return None
        return platforms.index(tag.platform) if tag.platform in platforms else len(platforms)

    def pip_args(self) -> tuple[str, ...]:
        """``pip download`` options that select this target (none: pip's own, this interpreter)."""
        if self.is_here:
            return ()
        here = list(sys_tags())
        args: list[str] = []
        if self.python_tag:
            impl, major, minor = _PYTHON_TAG.match(self.python_tag).groups()  # type: ignore[union-attr]
            args += ["--implementation", impl, "--python-version", f"{major}.{minor}" if minor else major]
        else:
            args += ["--implementation", here[0].interpreter[:2],
                     "--python-version", f"{here[0].interpreter[2]}.{here[0].interpreter[3:]}"]
        for platform in [self.platform] if self.platform else dict.fromkeys(t.platform for t in here):
            args += ["--platform", platform]
        return tuple(args)


def fit(wheel: Path, target: WheelTarget) -> int | None:
    """The best rank of any of the wheel's tags for ``target`` (None: it does not fit)."""
    parsed = parsed_name(wheel)
    ranks = [r for r in (target.rank(t) for t in (parsed[3] if parsed else ())) if r is not None]
    return min(ranks) if ranks else None


def best_local(version: str, target: WheelTarget) -> Path | None:
    ranked = sorted((r, w.name, w) for w in local_wheels(version) if (r := fit(w, target)) is not None)
    return ranked[0][2] if ranked else None


def index_url() -> str:
    return (os.environ.get("PIP_INDEX_URL") or DEFAULT_INDEX).rstrip("/")


def index_wheels(version: str, timeout: float = 30) -> list[str]:
    """The file names of the release's wheels on the package index (PEP 691 JSON listing)."""
    request = urllib.request.Request(f"{index_url()}/{PACKAGE}/",
                                     headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        doc = json.load(response)
    names = (str(item.get("filename", "")) for item in doc.get("files", []))
    return sorted(n for n in names if n.endswith(".whl") and (p := parsed_name(Path(n))) and p[1] == Version(version))


def available(version: str) -> tuple[list[str], str]:
    """(the release's wheel file names, a note on where they were looked for)."""
    names = {w.name for w in local_wheels(version)}
    try:
        names.update(index_wheels(version))
        note = f"the wheelhouses and {index_url()}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        note = f"the wheelhouses only ({index_url()} could not be read: {getattr(exc, 'reason', exc)})"
    return sorted(names), note


def release_wheel_for(version: str, target: WheelTarget, reporter: Reporter = NullReporter()) -> Path:
    """The release's wheel that fits ``target``: from a wheelhouse, else downloaded into the cache."""
    found = best_local(version, target)
    if found is not None:
        return found
    what = f"downloading sglang {version} wheel"
    ok, last = pip_download(version, target.pip_args(), lambda done, total: transfer(reporter, what, done, total))
    found = best_local(version, target) if ok else None
    if found is not None:
        return found
    names, note = available(version)
    if not names:
        raise C128Error(f"unknown release 'v{version}': no sglang {version} wheel in {note} ({last})")
    raise C128Error(
        f"sglang {version} has no wheel for {target.describe()}: {len(names)} wheel(s) in {note}",
        hint="\n".join([*(f"  {n}" for n in names),
                        "pick one with --python-tag TAG [--platform PLATFORM] (e.g. --python-tag cp312), "
                        "or pass it with --from-wheel FILE"]),
    )
