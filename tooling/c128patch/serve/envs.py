"""What the series' env vars will do in this environment, read as the installed sglang reads them.

The installed ``sglang/srt/environ.py`` (stdlib only in every release) is run from its file, and
each gate of the env reference is read through its own ``EnvField``: whether this sglang declares
it, its default, and ``.get()``'s value in the current environment, with the warning sglang gives
for a value it cannot parse (it then uses the default). Loading ``environ.py`` runs its
module-level code; the process environment is restored afterwards, and
``SGLANG_CUDA_COREDUMP`` (which would import sglang's debug utilities) is hidden while it runs.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from c128patch.series.gates import Gate
from c128patch.serve.install import load_by_path

ENVIRON = "sglang/srt/environ.py"
_HIDDEN_WHILE_LOADING = ("SGLANG_CUDA_COREDUMP",)


@dataclass
class EnvReading:
    gate: Gate
    declared: bool  # this sglang's environ.py declares the variable
    raw: str | None  # as set in the environment (None: unset)
    value: Any = None  # what sglang will use (the default when unset or unparsable)
    default: Any = None
    problem: str = ""  # sglang's warning for a value it cannot parse

    @property
    def on(self) -> bool:
        """Set to something other than the default (a bool gate: true)."""
        return self.raw is not None and self.value != self.default and self.value not in (None, False, "")


def load_environ(site: Path) -> ModuleType:
    """The installed sglang's environ.py, run from its file with the environment restored after."""
    saved = dict(os.environ)
    for name in _HIDDEN_WHILE_LOADING:
        os.environ.pop(name, None)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return load_by_path(site / ENVIRON, "c128patch_doctor_sglang_environ")
    finally:
        os.environ.clear()
        os.environ.update(saved)


def read_gates(module: ModuleType, gates: list[Gate]) -> list[EnvReading]:
    """Each gate as this sglang reads it from the process environment (``EnvField.get`` reads it)."""
    envs = getattr(module, "envs", None)
    field_type = getattr(module, "EnvField", None)
    out = []
    for gate in gates:
        field = getattr(envs, gate.name, None) if envs is not None else None
        reading = EnvReading(gate, field_type is not None and isinstance(field, field_type), os.environ.get(gate.name))
        if reading.declared:
            default = field.default
            reading.default = "(computed at run time)" if callable(default) else default
            if not callable(default):
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    reading.value = field.get()
                reading.problem = str(caught[0].message) if caught else ""
        out.append(reading)
    return out
