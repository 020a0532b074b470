"""`python -m c128patch` whose device probe answers as the H200 (smoke_helpers.H200), for the CPU
dry run of ci/gpu/upstream_suite_run.sh (SMOKE="python3 tests/smoke_standins/h200_probe_c128patch.py"):
everything else is the real tool, and the real pytest passes run here (and fail without CUDA)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from c128patch.cli import main  # noqa: E402
from c128patch.smoke import device  # noqa: E402
from smoke_helpers import H200  # noqa: E402

device.probe_device = lambda python: dict(H200)
sys.exit(main())
