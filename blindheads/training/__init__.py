"""Training plumbing: the CLI entry and checkpoint writing."""
