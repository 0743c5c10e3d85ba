"""Field types of the records we read back (traces, response stores), checked from the
dataclass that defines the record, so a hand-edited file fails on one line naming the field."""

from __future__ import annotations

import math
from dataclasses import fields

_TYPES = {
    "str": lambda v: isinstance(v, str),
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
    "bool": lambda v: isinstance(v, bool),
    "dict": lambda v: isinstance(v, dict),
    "None": lambda v: v is None,
}


def check_fields(cls, record: dict) -> dict:
    """``record`` if every field of the dataclass ``cls`` it holds has its declared type
    (``int | None`` ...); else ``ValueError`` naming the field, its type and the value.
    Fields with other annotations are not checked."""
    for f in fields(cls):
        if f.name not in record:
            continue
        options = [t.strip() for t in str(f.type).split("|")]
        if not all(t in _TYPES for t in options):
            continue
        value = record[f.name]
        if not any(_TYPES[t](value) for t in options):
            raise ValueError(f"field {f.name!r} is {value!r}, expected {f.type}")
    return record
