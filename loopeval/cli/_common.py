"""What several subcommands share: list options, the loop options, two runs to compare."""

from __future__ import annotations

import argparse


def int_list(text: str) -> list[int]:
    """``"2-8"``, ``"2,3,4"`` or a mix (``"0-3,6"``)."""
    from loopeval.common.errors import whole_number

    values = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        bounds = [whole_number(lo), whole_number(hi) if hi else whole_number(lo)]
        if None in bounds:
            raise argparse.ArgumentTypeError(f"{text!r}: expected whole numbers such as 2-8 or 2,3,4")
        values += list(range(bounds[0], bounds[1] + 1))
    return values


def float_list(text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected numbers such as 0,0.25,0.5") from None


def add_loop_options(parser, *, what: str = "the loop") -> None:
    """``--operator``, ``--beta``, ``--mix``, ``--mix-source``: one flag per loop option
    (:func:`loopeval.core.spec.option_fields`), unset unless given (the defaults are LoopConfig's)."""
    from loopeval.core.spec import option_fields

    group = parser.add_argument_group(f"{what}'s options (LoopConfig)")
    for f in option_fields():
        kwargs = {"choices": f.metadata["choices"]} if "choices" in f.metadata else {"type": f.metadata.get("type", str)}
        group.add_argument("--" + f.name.replace("_", "-"), default=None, help=f.metadata["help"], **kwargs)


def loop_options(args) -> dict:
    """The loop options given on the command line (``None``: not given)."""
    from loopeval.core.spec import LOOP_OPTIONS

    return {name: getattr(args, name) for name in LOOP_OPTIONS}


def add_stat_options(parser, *names: str, flags: dict[str, str] | None = None) -> None:
    """One flag per named statistics option (:class:`loopeval.analysis.stats.options.StatOptions`),
    its default the paper's; ``flags`` renames a flag (its ``dest`` stays the option's name)."""
    from dataclasses import fields

    from loopeval.analysis.stats.options import DEFAULTS, StatOptions

    chosen = {f.name: f for f in fields(StatOptions)}
    for name in names:
        f = chosen[name]
        default = getattr(DEFAULTS, name)
        kwargs = {"choices": f.metadata["choices"]} if "choices" in f.metadata else {"type": type(default)}
        flag = (flags or {}).get(name, "--" + name.replace("_", "-"))
        parser.add_argument(flag, dest=name, default=default,
                            help=f"{f.metadata['help']} (default {default})".replace("%", "%%"), **kwargs)


def stat_options(args):
    """The :class:`StatOptions` of the flags given by :func:`add_stat_options`, defaults elsewhere."""
    from dataclasses import fields

    from loopeval.analysis.stats.options import StatOptions

    return StatOptions(**{f.name: getattr(args, f.name) for f in fields(StatOptions) if hasattr(args, f.name)})


def metric_value(text: str) -> tuple[str | None, float]:
    """``"0.02"`` or ``"nll_per_byte=0.005"``: an optional lm-eval metric name and a number."""
    name, sep, number = text.rpartition("=")
    try:
        return (name.strip() if sep else None), float(number)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number or METRIC=NUMBER, e.g. nll_per_byte=0.005") from None


MARGIN_HELP = ("equivalence margin: a bare VALUE is the accuracies' margin, a fraction (default 0.02, A.5's ±2 points); "
               "METRIC=VALUE a metric's own, in its unit (e.g. nll_per_byte=0.005). A continuous metric without one "
               "gets no equivalence verdict. Repeatable, once per metric")
DELTA_HELP = ("difference to detect: a bare VALUE on accuracies, a fraction (0.02 = 2 points); METRIC=VALUE on a metric "
              "in its own unit (e.g. nll_per_byte=0.005). Repeatable, once per metric")


def add_metric_option(parser, flag: str, help: str) -> None:
    """``FLAG [METRIC=]VALUE`` (repeatable): an amount per metric, read by :func:`metric_option`
    and checked against the runs by :func:`loopeval.analysis.protocol.check_amounts`; ``--margin``
    of ``compare`` and ``report`` and ``--delta`` of ``power``."""
    parser.add_argument(flag, action="append", type=metric_value, default=[], metavar="[METRIC=]VALUE", help=help)


def keyed_values(pairs, flag: str, what=lambda key: str(key)) -> dict:
    """``{key: value}`` of a repeatable ``flag``'s ``(key, value)`` pairs; a key given twice is
    refused (the last would win silently), naming ``what(key)`` and both values."""
    from loopeval.common.errors import UserError

    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise UserError(f"{flag} given twice for {what(key)} ({out[key]:g} and {value:g}); give it once"
                            if isinstance(value, float) else
                            f"{flag} given twice for {what(key)} ({out[key]!r} and {value!r}); give it once")
        out[key] = value
    return out


def metric_option(args, flag: str) -> tuple[float | None, dict[str, float]]:
    """The bare value (``None``: not given) and the named metrics' values of ``flag``
    (:func:`keyed_values`: one value per metric, and one bare value)."""
    given = keyed_values(getattr(args, flag.lstrip("-").replace("-", "_")), flag,
                         lambda name: "the accuracies' value" if name is None else f"metric {name}")
    return given.pop(None, None), given


def add_reading_options(p) -> None:
    """How runs are read: a pilot's subset, and verdicts from cut responses (compare, report, score-audit)."""
    p.add_argument("--allow-subset", action="store_true",
                   help="a pilot: accept runs cut by lm_eval --limit; every table and the verdict say 'pilot: n of "
                   "N items' and no final verdict is stated")
    p.add_argument("--unfinished-fallback", choices=["credit", "wrong"], default="credit",
                   help="a right GSM8K number-fallback verdict from a response that did not finish (cut at its "
                   "budget, from the trace): credit it (the paper's rule, default) or score it wrong")
