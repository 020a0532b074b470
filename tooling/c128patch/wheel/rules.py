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
