"""Fairness checks: is each comparison of the report a fair one?

A failed check withholds the verdict (or, where it only cannot be confirmed, qualifies it:
:class:`Check`), is listed again in the checks section, warned about, and an error under ``strict``. The checks: both sides decode with
the same shared settings (:data:`loopeval.evaluation.trace.SHARED`) and the same rendered
prompts, a setting's seeds are distinct models, twins share their training manifest apart
from the loop (a training-free loop, the twin's very weights plus a loop, has no training
to compare and needs no manifest), every item is covered (a pilot says how many it
covers), and cached looped decoding was checked.
"""

from __future__ import annotations

from dataclasses import dataclass

from loopeval.training.manifest import twin_mismatches
from loopeval.analysis.report.evaluations import Evaluation, label
from loopeval.analysis.runs import decoding_differences
from loopeval.evaluation.trace import SHARED


@dataclass(frozen=True)
class Check:
    """One fairness check. A failed check that shows the sides differ withholds the report's
    verdict; one that only cannot be confirmed (``withholds=False``: no training manifest at
    all, as for checkpoints trained elsewhere) is listed beneath the verdict it qualifies."""

    name: str
    ok: bool
    detail: str
    withholds: bool = True


def _seed_order(evals: list[Evaluation]) -> list[Evaluation]:
    return sorted(evals, key=lambda e: (e.seed is None, e.seed or 0))


def decoding_checks(groups: dict, intended=()) -> list[Check]:
    """Each looped evaluation against the twin of its variant at the same budget and rules, seed by seed:
    the same shared settings, generation kwargs and rendered prompts, item by item, but for the
    ``intended`` differences (:func:`loopeval.evaluation.identity.differences`)."""
    out = []
    for (lp, cond, variant, scale), members in sorted(groups.items()):
        if not lp:
            continue
        twins = _seed_order(groups.get((False, cond, variant, scale), []))
        for a, b in zip(_seed_order(members), twins):
            diffs = decoding_differences(a.run, b.run, intended=intended)
            seed = f"seed {a.seed}" if a.seed is not None else "one seed"
            out.append(Check(f"same decoding settings: {label(True, cond, variant, scale)} vs twin ({seed})",
                             not diffs, "; ".join(diffs) or f"{', '.join(SHARED)}, generation kwargs and prompts match"))
    return out


def seed_checks(groups: dict) -> list[Check]:
    """The seeds of one setting are distinct models (weights) or distinct draws (torch seed):
    one checkpoint listed twice would count as two seeds agreeing."""
    out = []
    for (lp, cond, variant, scale), members in sorted(groups.items()):
        if len(members) < 2:
            continue
        seen, same = {}, []
        for e in _seed_order(members):
            key = (e.header.weights, e.header.decoding.seed)
            if key[0] is not None and key in seen:
                same.append(f"{seen[key].where.name} and {e.where.name}")
            seen.setdefault(key, e)
        out.append(Check(f"seeds are distinct: {label(lp, cond, variant, scale)}", not same,
                         "; ".join(f"{pair} have one weights fingerprint and one seed" for pair in same)
                         or f"{len(members)} seeds, each with its own weights or seed"))
    return out


def training_free(e: Evaluation, evals: list[Evaluation]) -> bool:
    """Whether looped evaluation ``e`` runs an unlooped evaluation's very weights (same
    weights fingerprint in the traces): a training-free loop (the report's ‡)."""
    return e.looped and e.header.weights is not None and any(
        not t.looped and t.header.weights == e.header.weights for t in evals)


def manifest_checks(evals: list[Evaluation]) -> list[Check]:
    """Looped model and twin of each training variant and seed share their training
    manifest; a training-free loop passes on its weights fingerprint instead."""
    free = [e for e in evals if training_free(e, evals)]
    out = []
    if free:
        out.append(Check("training-free loop: the looped model is the twin's own weights", True,
                         f"{len(free)} looped evaluations carry the twin's weights fingerprint "
                         f"{free[0].header.weights[:12]}…: nothing was trained, so no training manifest is needed"))
        if all(training_free(e, evals) for e in evals if e.looped):
            return out
    looped = {(e.variant, e.seed): e for e in evals if e.looped and e.manifest and not training_free(e, evals)}
    twins = {(e.variant, e.seed): e for e in evals if not e.looped and e.manifest}
    if not looped and not twins:
        return [Check("twins share their training manifest", False,
                      "no training_manifest.json beside the evaluated checkpoints; twin training cannot be confirmed",
                      withholds=False)]
    for key in sorted(set(looped) | set(twins), key=str):
        name = f"twins share their training manifest ({', '.join(str(k) for k in key if k not in ('', None))})"
        if key not in looped or key not in twins:
            out.append(Check(name, False, "only one side of this variant and seed has a training manifest"))
            continue
        diffs = twin_mismatches(looped[key].manifest, twins[key].manifest)
        out.append(Check(name, not diffs,
                         "; ".join(diffs) or "same base weights, data, batches, steps and seeds; only the loop differs"))
    return out


def coverage_checks(evals: list[Evaluation], *, allow_subset: bool = False) -> list[Check]:
    """Every evaluation covers all of its items; a pilot (``allow_subset``) passes and says how many."""
    short = [
        f"{e.where.name}/{t}: {ts.n} of {ts.n_full}"
        for e in evals for t, ts in e.run.tasks.items() if ts.n < ts.n_full
    ]
    n = sum(ts.n for ts in evals[0].run.tasks.values())
    if short and allow_subset:
        return [Check("every item covered", True, "a pilot (--allow-subset): " + "; ".join(short))]
    return [Check("every item covered", not short, "; ".join(short) or f"all {n} items in every evaluation")]


def cache_checks(evals: list[Evaluation]) -> list[Check]:
    bad = []
    for e in evals:
        if not e.looped:
            continue
        result = e.header.cache_check
        if not result or not result.get("ok"):
            bad.append(f"{e.where.name}: {'not run' if not result else 'failed'}")
    return [Check("cached looped decoding equals full recomputation", not bad,
                  "; ".join(bad) or "checked on the first batch of every looped evaluation")]


def fairness_checks(evals: list[Evaluation], groups: dict, intended=(), *, allow_subset: bool = False) -> list[Check]:
    """Every check, in the order the report lists them."""
    return (decoding_checks(groups, intended) + seed_checks(groups) + manifest_checks(evals)
            + coverage_checks(evals, allow_subset=allow_subset) + cache_checks(evals))
