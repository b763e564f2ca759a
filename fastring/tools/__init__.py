"""Command-line tools: `fastring-run` (launcher) and `fastring-bench` (bench)."""
