"""Which entries can patch a built wheel in place, and which need a source build.

A release wheel is upstream's ``python/`` folder after the build: Python and JIT sources copied
as they are, plus compiled extensions (the Rust modules in ``srt/rust_extensions/`` and
``srt/mem_cache/rust_tree_core/``) whose sources (``rust/...``, Cargo files) are not in the wheel.
Editing a file of the wheel has the same effect as building from the edited tree exactly when
the build copies that file unchanged. The rule, for every path an entry touches (each file of a
patch, the target of an overlay):

1. it lies under ``python/sglang/``: the build inputs outside the package (``pyproject.toml``,
   ``setup.py``, ``python/tools/``, ``rust/``, ``sgl-kernel/``...) never reach the wheel as files;
2. its type is one the wheel carries as source and uses as is: Python (``.py``, ``.pyi``), the
   C++/CUDA sources that the JIT compiles at run time (``.cu``, ``.cuh``, ``.h``, ``.hpp``, ``.c``,
   ``.cc``, ``.cpp``, ``.inc``), and data read at run time (``.json``, ``.yaml``, ``.yml``,
   ``.txt``, ``.md``, ``.jinja2``). Anything else (a ``.so``, ``.rs``, ``.pyx``, ``.toml``...) is
   either a binary or a build input;
3. no folder on its way, from ``sglang/`` down, directly holds a compiled extension of *this*
   wheel: such a folder is the Python face of a binary (loader, bindings, stubs) built from
   sources the wheel lacks, and a change there must be built together with the binary.

The C++/CUDA files allowed by (2) are safe because of (3): the only binaries of an sglang wheel
live in the folders (3) fences off, so any other C++/CUDA source in the wheel is compiled by the
JIT (``load_jit``, ``torch.utils.cpp_extension``) on the user's machine, from the patched file.
An entry that breaks the rule is refused with its name, the path and the reason; ``c128patch
build`` (a real source build) is the way to ship it.
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
                raise C128Error(
                    f"entry '{item.entry.name}' cannot be applied to a built wheel: {path}: {why}; "
                    "build from source instead (c128patch build)"
                )
