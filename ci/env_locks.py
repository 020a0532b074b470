#!/usr/bin/env python3
"""Write the behavioural tier's environment locks, patches/env/v<X>.lock, for the supported releases:
each release wheel's Requires-Dist filtered as the tool filters a target's (fit/env.py), resolved by pip
(wheels only, torch pinned CPU) into name==version + sha256. Needs the package index.

    python ci/env_locks.py [VERSION ...]     (default: every supported release)

tests/test_env.py checks each committed lock against what this would write (the requirement names).
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tooling"))

from c128patch.fit import env  # noqa: E402
from c128patch.progress import PlainReporter  # noqa: E402
from c128patch.series.manifest import load_series  # noqa: E402
from c128patch.upstream.releases import DEFAULT_RELEASES, wheel_for  # noqa: E402


def main(versions: list[str]) -> None:
    series = load_series(REPO)
    cuda = env.cuda_only(series)
    for version in versions or DEFAULT_RELEASES:
        requirements, dropped = env.filtered(env.wheel_requirements(wheel_for(version)), cuda)
        head = env.header(f"the sglang {version} release wheel", requirements, dropped)
        reporter = PlainReporter()
        text = env.resolve(head, requirements, cuda, reporter)
        reporter.close()
        path = series.patches_dir / "env" / f"v{version}.lock"
        path.write_text(text)
        print(f"{path.relative_to(REPO)}: {text.count('--hash=')} packages")


if __name__ == "__main__":
    main(sys.argv[1:])
