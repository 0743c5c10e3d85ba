"""Where to put the loop: a calibrated-perplexity search with prefix reuse (paper A.1, D.1).

``place(model, data, out=...)`` scores every window of a grid by PPL_T, plain perplexity
and KL to the unlooped model, and writes ``placements.jsonl`` and ``placement.html``.
"""

from loopeval.tools.placement.grid import Candidate, build_grid, planned_passes
from loopeval.tools.placement.results import Correlation, PlacementRow, correlate, ranked, read_accuracies, read_placements
from loopeval.tools.placement.search import PlacementResult, place

__all__ = [
    "Candidate", "Correlation", "PlacementResult", "PlacementRow", "build_grid", "correlate", "place",
    "planned_passes", "ranked", "read_accuracies", "read_placements",
]
