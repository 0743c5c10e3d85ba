"""The one error type for a refusal of the user's input.

A :class:`UserError` names the input (a flag, a model arg, a study key, a file) and what is
wrong with it, and says how to fix it; entry points (the ``loopeval`` command, the
``lm_eval`` model) print its message alone, without a traceback, and exit non-zero. It is a
``ValueError`` so that callers catching bad values keep catching it.
"""

from __future__ import annotations


class UserError(ValueError):
    """``UserError(message, fix=...)``: ``message`` names the input and the fault; ``fix``
    (optional, else part of ``message``) is appended after a semicolon."""

    def __init__(self, message: str, *, fix: str | None = None):
        self.fix = fix
        super().__init__(message if not fix else f"{message}; {fix}")


def whole_number(text: str) -> int | None:
    """The whole number ``text`` spells in ASCII digits (an optional sign and surrounding
    spaces allowed), else ``None``: no Unicode digits (``'²'``, ``'٣'``), no underscores."""
    body = text.strip()
    digits = body[1:] if body[:1] in "+-" else body
    if not digits or not all("0" <= c <= "9" for c in digits):
        return None
    return int(body)
