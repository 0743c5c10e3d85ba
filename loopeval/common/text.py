"""Plain-text tables for the terminal (results' text forms use them)."""

from __future__ import annotations

from collections.abc import Sequence


def table(header: Sequence[str], rows: Sequence[Sequence[str]], *, text_columns: int = 1) -> str:
    """Aligned columns: the first ``text_columns`` left-aligned, the rest right-aligned."""
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    return "\n".join(
        "  ".join(v.ljust(w) if i < text_columns else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths))).rstrip()
        for row in (header, *rows)
    )
