"""GPU smoke tests: the kernel tier (trees, passes, sanitizer, pytest plugin) and the server tier
(processes, logs)."""
