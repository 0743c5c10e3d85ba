"""Typed option values from text (lm-eval model args, study files, environment).

lm-eval hands model args over as strings, as Python values it guessed from them, or
as JSON values; every parser here accepts all three and raises ``ValueError`` naming
the option and the value. Booleans are never read with ``bool()``: ``"no"`` is false.
"""

from __future__ import annotations

import math

from loopeval.common.errors import whole_number

TRUE = frozenset({"true", "1", "yes", "on"})
FALSE = frozenset({"false", "0", "no", "off"})


def as_bool(name: str, value) -> bool:
    """true/false/1/0/yes/no/on/off in any case, or a bool (JSON ``true``)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in TRUE | FALSE:
        return value.strip().lower() in TRUE
    raise ValueError(f"{name}={value!r}: expected a boolean (true/false, 1/0, yes/no, on/off)")


def as_int(name: str, value, *, minimum: int | None = None) -> int:
    """A whole number (``"3"``, ``3``, ``3.0``); fractions are refused, not truncated."""
    number = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        number = int(value)
    elif isinstance(value, str):
        number = whole_number(value)
    if number is None:
        raise ValueError(f"{name}={value!r}: expected a whole number (ASCII digits)")
    if minimum is not None and number < minimum:
        raise ValueError(f"{name}={value!r}: must be >= {minimum}")
    return number


def as_float(name: str, value, *, positive: bool = False) -> float:
    """A finite number; NaN and infinities are refused."""
    number = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            pass
    if number is None or not math.isfinite(number):
        raise ValueError(f"{name}={value!r}: expected a finite number")
    if positive and not number > 0:
        raise ValueError(f"{name}={value!r}: must be > 0")
    return number


def as_choice(name: str, value, choices) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name}={value!r}: choose one of {', '.join(choices)}")
    return value


def as_text(name: str, value) -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name}={value!r}: expected a non-empty string")
    return value


def as_field(f, name: str, value):
    """``value`` typed for the dataclass field ``f``: by its ``metadata["parse"]`` (a
    ``(name, value)`` parser), its ``metadata["choices"]``, or its annotated type
    (``bool``, ``int``, ``float``, ``str``, each optionally ``| None``). ``name`` is the
    option's name in errors (a model arg, a study key, a flag)."""
    if "parse" in f.metadata:
        return f.metadata["parse"](name, value)
    if "choices" in f.metadata:
        return as_choice(name, value, f.metadata["choices"])
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    kind = kind.replace(" | None", "").replace("None | ", "").strip()
    parsers = {"bool": as_bool, "int": as_int, "float": as_float, "str": as_text}
    if kind not in parsers:
        raise TypeError(f"as_field: field {f.name} of type {f.type!r} needs metadata['parse']")
    return parsers[kind](name, value)
