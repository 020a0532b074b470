"""Wheels: unpack/edit/repack, patching a release wheel, the rules for what may change, verification,
the SBOM, and the PEP 517 source build."""
