"""Floor 5, analysis: runs (load, join, pair), paired statistics, the two tests, the report."""
