"""Floor 5, tools built on the floors below: placement search, the study runner, the demo."""
