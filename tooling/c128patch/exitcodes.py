"""Every exit code the commands give, in one place (docs/watch.md and README cite them; tests compare)."""

from __future__ import annotations

OK = 0
FAILED = 1  # a check found problems, an entry does not apply, a tree or wheel is not what it says
USAGE = 2  # bad input or a refused operation (click's usage errors give 2 too)
REFRESHED = 3  # watch: the series carries with merges; a verified refreshed series is offered
MERGED = 4  # watch: upstream holds entries of the series (proposal)
CONFLICT = 5  # watch: entries stop the rebase
WATCH_FAILED = 6  # watch: carried, but not proven or a check has findings
BROKEN = 7  # watch: carried, but the series' API contract or behavioural tier does not hold on REV
UNCHECKED = 8  # watch: it would be clean, but a tier could not run here (no nvcc, no torch)
TIMEOUT = 124  # the time bound passed (as timeout(1) says it)
SIGNAL = 128  # killed by signal N: SIGNAL + N
INTERRUPTED = SIGNAL + 2  # Ctrl-C (SIGINT)

# watch's outcomes, in the order its docs list them
WATCH: dict[str, int] = {"clean": OK, "refreshed": REFRESHED, "merged": MERGED, "conflict": CONFLICT,
                         "failed": WATCH_FAILED, "broken": BROKEN, "unchecked": UNCHECKED,
                         "timeout": TIMEOUT}
