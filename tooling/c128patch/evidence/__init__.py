"""Evidence: what has been proven about the series on each upstream release (GPU runs, kernel
compiles), stored as JSON under ci/gpu/results, keyed so that a stale result shows as stale."""
