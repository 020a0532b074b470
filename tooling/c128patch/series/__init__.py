"""The series' data model: the manifest, patch files and variants, the resolution ledger, provenance,
and the plan (which file each entry takes on a given upstream rev)."""
