"""The CycloneDX 1.6 SBOM a patched wheel carries (PEP 770: ``.dist-info/sboms/``).

One component, ``sglang@<patched version>``: its pedigree's ancestor is upstream ``sglang@X.Y.Z`` (purl,
the upstream wheel's sha256), its patches every entry in series order (``unofficial``, the diff text,
the PR it resolves); per-entry facts CycloneDX has no field for are properties
``c128patch:entry:<n>:<field>``. A small builder rather than cyclonedx-python-lib, which keeps patches
in a SortedSet (losing the apply order) and adds five dependencies; sorted keys and a serial number
from the contents give the same bytes for the same inputs (tests validate against the 1.6 schema).
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from c128patch import __version__

SPEC_VERSION = "1.6"
SBOM_NAME = "c128patch.cdx.json"
PROPERTY_PREFIX = "c128patch:entry"
LAYER_PREFIX = "c128patch:layer"  # c128patch:layer:<i>:<field>, one set per layer of the stack
LAYER_FIELDS = ("name", "version", "base", "digest")
_NAMESPACE = uuid.UUID("6a2c1f9e-3f0b-4c4e-9d3a-c128c128c128")


def purl_pypi(name: str, version: str) -> str:
    """``pkg:pypi/<name>@<version>``, the version percent-encoded ('+' -> '%2B') as purl requires."""
    return f"pkg:pypi/{quote(name.lower(), safe='')}@{quote(version, safe='')}"


@dataclass
class PatchEntry:
    name: str
    kind: str
    gate: str
    upstream: str
    upstream_status: str
    file: str  # patch file name, or overlay source
    sha256: str  # of the patch file / overlay source
    diff: bytes  # the patch file (overlay: a new-file diff)
    why: str = ""

    def patch(self) -> dict[str, Any]:
        try:
            text = {"contentType": "text/x-diff", "content": self.diff.decode("utf-8")}
        except UnicodeDecodeError:
            text = {"contentType": "text/x-diff", "encoding": "base64",
                    "content": base64.b64encode(self.diff).decode()}
        out: dict[str, Any] = {"type": "unofficial", "diff": {"text": text}}
        repo, sep, num = self.upstream.partition("#")  # 'owner/repo#123': a GitHub pull request
        url = f"https://github.com/{repo}/pull/{num}" if sep and num.isdigit() and repo.count("/") == 1 else None
        if self.upstream:
            issue: dict[str, Any] = {"type": "enhancement", "id": self.upstream, "name": f"upstream {self.upstream}"}
            if self.why:
                issue["description"] = self.why
            if url:
                issue["source"] = {"name": "GitHub", "url": url.split("/pull/")[0]}
                issue["references"] = [url]
            out["resolves"] = [issue]
        return out

    def properties(self, index: int) -> list[dict[str, str]]:
        values = {"name": self.name, "kind": self.kind, "gate": self.gate or "none", "upstream": self.upstream,
                  "upstream_status": self.upstream_status, "file": self.file, "sha256": self.sha256}
        return [{"name": f"{PROPERTY_PREFIX}:{index}:{k}", "value": v} for k, v in values.items()]


@dataclass
class Ancestor:
    name: str
    version: str
    sha256: str = ""  # of the upstream wheel
    wheel: str = ""  # its file name
    commit: str = ""  # upstream commit (source builds)
    tree: str = ""  # git tree id of upstream's python/ (release wheels: the source by content)

    def component(self) -> dict[str, Any]:
        purl = purl_pypi(self.name, self.version)
        out: dict[str, Any] = {"type": "library", "bom-ref": purl, "name": self.name,
                               "version": self.version, "purl": purl}
        if self.sha256:
            out["hashes"] = [{"alg": "SHA-256", "content": self.sha256}]
        known = {"wheel": self.wheel, "commit": self.commit, "tree": self.tree}
        props = [{"name": f"c128patch:upstream:{k}", "value": v} for k, v in known.items() if v]
        if props:
            out["properties"] = props
        return out


def sbom_text(name: str, version: str, ancestor: Ancestor, entries: list[PatchEntry], series: dict[str, str],
              epoch: int, build: str, layers: list[dict]) -> str:
    """The SBOM of ``name`` at its patched ``version``: ``series`` (name, version, digest), ``build`` "wheel"
    (a patched release wheel) or "source" (a source build), ``layers`` the provenance's (in order)."""
    purl = purl_pypi(name, version)
    props = [{"name": f"c128patch:series:{k}", "value": series[k]} for k in ("name", "version", "digest")]
    props.append({"name": "c128patch:build", "value": build})
    for i, layer in enumerate(layers, 1):
        props += [{"name": f"{LAYER_PREFIX}:{i}:{k}", "value": str(layer[k])} for k in LAYER_FIELDS]
    for i, entry in enumerate(entries, 1):
        props += entry.properties(i)
    component = {
        "type": "library", "bom-ref": purl, "name": name, "version": version, "purl": purl,
        "description": f"{name} {ancestor.version} with the c128patch series {series['name']} {series['version']}"
                       + "".join(f" + layer {r['name']} {r['version']}" for r in layers) + " applied",
        "pedigree": {"ancestors": [ancestor.component()], "patches": [e.patch() for e in entries],
                     "notes": "Every behaviour change is behind an environment gate, default off; with the gates "
                              "unset the patched package behaves as its ancestor."},
        "properties": props,
    }
    serial = uuid.uuid5(_NAMESPACE, json.dumps([purl, ancestor.component(), props], sort_keys=True))
    tool = {"type": "application", "bom-ref": f"c128patch@{__version__}", "name": "c128patch", "version": __version__}
    doc = {"$schema": "http://cyclonedx.org/schema/bom-1.6.schema.json", "bomFormat": "CycloneDX",
           "specVersion": SPEC_VERSION, "serialNumber": serial.urn, "version": 1,
           "metadata": {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch)),
                        "tools": {"components": [tool]}, "component": component}}
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def indexed_properties(doc: dict[str, Any], prefix: str) -> list[dict[str, str]]:
    """Properties named ``<prefix>:<i>:<field>`` (PROPERTY_PREFIX, LAYER_PREFIX) of an SBOM read back:
    [{field: value}], by ``i``."""
    props = doc.get("metadata", {}).get("component", {}).get("properties", [])
    rows: dict[int, dict[str, str]] = {}
    for p in props:
        parts = str(p.get("name", "")).split(":")
        if len(parts) == 4 and ":".join(parts[:2]) == prefix and parts[2].isdigit():
            rows.setdefault(int(parts[2]), {})[parts[3]] = str(p.get("value", ""))
    return [rows[i] for i in sorted(rows)]


def diff_bytes(patch: dict[str, Any]) -> bytes:
    """The diff a pedigree patch carries, as bytes."""
    text = patch.get("diff", {}).get("text", {})
    content = str(text.get("content", ""))
    return base64.b64decode(content) if text.get("encoding") == "base64" else content.encode("utf-8")
