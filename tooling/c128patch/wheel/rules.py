"""Which entries can patch a built wheel in place, and which need a source build.

Editing a wheel's file equals building from the edited tree exactly when the build copies that file
unchanged. So every path an entry touches must (1) lie under ``python/sglang/`` (build inputs outside
the package never reach the wheel), (2) be a type the wheel carries as source and uses as is: Python,
the C++/CUDA sources the JIT compiles at run time, data read at run time (``.so``, ``.rs``, ``.toml``...
are binaries or build inputs), and (3) have no folder on its way that directly holds a compiled
extension of *this* wheel (the Python face of a binary built from sources the wheel lacks). (3) is what
makes (2)'s C++/CUDA safe: an sglang wheel's only binaries live there, so any other such source is
JIT-compiled on the user's machine from the patched file. Else: refused by name; ``c128patch build``.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from c128patch.errors import C128Error
from c128patch.series.plan import Planned

PACKAGE_PREFIX = "python/sglang/"
TREE_PREFIX = "python/"
SOURCE_SUFFIXES = (".py", ".pyi")
JIT_SUFFIXES = (".cu", ".cuh", ".h", ".hpp", ".c", ".cc", ".cpp", ".inc")
DATA_SUFFIXES = (".json", ".yaml", ".yml", ".txt", ".md", ".jinja2")
ALLOWED_SUFFIXES = SOURCE_SUFFIXES + JIT_SUFFIXES + DATA_SUFFIXES


def wheel_path(tree_path: str) -> str:
    """``python/sglang/x.py`` -> ``sglang/x.py`` (the wheel has no ``python/`` prefix)."""
    return tree_path.removeprefix(TREE_PREFIX)


def refusal(tree_path: str, binary_dirs: set[str]) -> str | None:
    """Why a path cannot be patched inside the built wheel, or None when it can."""
    if not tree_path.startswith(PACKAGE_PREFIX):
        return "it is not part of the sglang package, so the wheel does not carry it (a build input)"
    name = PurePosixPath(tree_path).name
    if not name.endswith(ALLOWED_SUFFIXES):
        return f"'{PurePosixPath(name).suffix or name}' files are not shipped as source in the wheel"
    folder = PurePosixPath(wheel_path(tree_path)).parent
    for parent in [folder, *folder.parents]:
        if str(parent) in binary_dirs:
            return f"{parent}/ holds a compiled extension of this wheel, built from sources the wheel lacks"
    return None


def check_wheel_patchable(planned: list[Planned], binary_dirs: set[str]) -> None:
    """Refuse the first entry that touches something a wheel cannot carry patched."""
    for item in planned:
        for path in item.touched:
            why = refusal(path, binary_dirs)
            if why:
                raise C128Error(f"entry '{item.entry.name}' cannot be applied to a built wheel: {path}: {why}; "
                                "build from source instead (c128patch build)")


def refuse_folded_collisions(planned: list[Planned], members: list[str]) -> None:
    """Refuse an entry that writes a path which is one file with another of the wheel's (or another entry's) where
    names fold (case, Unicode normalisation, trailing dots and spaces: ``git.folded_name``): an overlay target
    ``python/sglang/srt/ENVIRON.py`` passed `lint` and `wheel`, and `verify-wheel` refused the wheel it made (installed
    on macOS or Windows, it replaces upstream's ``environ.py``, no patch of it reviewed), helper 175."""
    from c128patch.git import folded_name

    def key(name: str) -> str:
        return "/".join(folded_name(p) for p in name.split("/"))

    folds: dict[str, set[str]] = {}
    for name in sorted({wheel_path(p) for item in planned for p in item.touched}):
        folds.setdefault(key(name), set()).add(name)
    firsts = {PurePosixPath(k).name for k in folds}  # (a member is folded whole only where its last part may clash)
    for name in members:
        last = name.rsplit("/", 1)[-1]  # (ASCII folds as lower(): 6,400 members in 4 ms, not 40)
        if (last.lower().split(":", 1)[0].rstrip(" .") if last.isascii() else folded_name(last)) in firsts:
            folds.get(key(name), set()).add(name)
    for names in folds.values():
        if len(names) > 1:
            ours = sorted(n for n in names if n not in members) or sorted(names)[1:]
            other = next(n for n in sorted(names) if n != ours[0])
            entry = next(i.entry.name for i in planned if ours[0] in map(wheel_path, i.touched))
            raise C128Error(f"entry '{entry}' writes {ours[0]}, one file with {other} where names fold (case, Unicode "
                            "normalisation, trailing dots and spaces: installed on macOS or Windows, one overwrites "
                            "the other); nothing was written")
