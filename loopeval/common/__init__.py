"""Floor 0, shared by every floor above: typed option parsing, JSON lines, package paths, terminal tables."""
