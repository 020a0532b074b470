"""What is done to a tree: apply, check, rebase, refresh, status, lint and the gate audit."""
