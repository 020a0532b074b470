"""The provenance record written into a patched tree (and into patched wheels)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from c128patch import __version__
from c128patch.errors import C128Error
from c128patch.series.manifest import Series, sha256_file

if TYPE_CHECKING:  # series.plan pulls unidiff; reading a provenance record must not need it
    from c128patch.series.plan import Planned

PROVENANCE_PATH = "python/sglang/c128patch_provenance.json"
SCHEMA = 1


def build(series: Series, planned: list[Planned], upstream: dict[str, Any], results: list[dict[str, Any]]) -> dict:
    by_name = {r["name"]: r for r in results}
    entries = []
    for item in planned:
        e = item.entry
        row: dict[str, Any] = {
            "name": e.name,
            "kind": e.kind,
            "gate": e.gate,
            "upstream": e.upstream,
            "upstream_status": e.upstream_status,
            "sha256": sha256_file(item.path),
            "files": item.touched,
        }
        if item.variant:
            row["file"] = item.variant.file
            row["variant_base"] = item.variant.base
            row["variant_commit"] = item.variant.commit
            row["chosen_by"] = item.chosen_by
        else:
            row["source"] = e.source
            row["target"] = e.target
        row.update({k: v for k, v in by_name.get(e.name, {}).items() if k in ("applied", "commit")})
        entries.append(row)
    return {
        "schema": SCHEMA,
        "tool": {"name": "c128patch", "version": __version__},
        "series": {"name": series.name, "version": series.version, "digest": series.digest()},
        "upstream": upstream,
        "entries": entries,
    }


def dumps(record: dict) -> str:
    return json.dumps(record, indent=2, sort_keys=True) + "\n"


def read_provenance(tree: Path) -> dict:
    path = tree / PROVENANCE_PATH
    if not path.is_file():
        raise C128Error(f"no c128patch series is applied in {tree} (no {PROVENANCE_PATH})")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise C128Error(f"{path}: provenance file is not valid JSON ({exc.msg})") from exc
