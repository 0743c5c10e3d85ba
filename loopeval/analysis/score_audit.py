"""Which verdicts of an lm-eval run rest on a scoring rule a reader might dispute.

:func:`score_audit` grades every response of a run's boxed-answer tasks again with
:func:`loopeval.evaluation.scoring.grade` and lists those whose grade carries a flag of
:data:`loopeval.evaluation.scoring.FLAGS` (number fallback, hedged letter, several boxes, math-verify
failure, relation against interval), with counts per task. The scoring options of each task
(``number_fallback``, ``thinking``) are read from the ``process_results`` source that
lm-eval records in the run's configuration; tasks not scored by :mod:`loopeval.evaluation.scoring`
(letter log-likelihood tasks, lm-eval's own tasks) are listed as skipped, with the reason.

Where the looped model's trace joins the run, each number-fallback response says whether it
finished (ended by end-of-sequence or a stop string): a right verdict from the last number
of a response cut at its budget rests on chance, and each task counts them
(``unfinished_fallback``, ``unfinished_fallback_right``; :mod:`loopeval.evaluation.fallback`). With
``unfinished_fallback="wrong"`` the rescored accuracy counts them wrong.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from loopeval.evaluation import scoring
from loopeval.evaluation.fallback import check_option, response_finished, scoring_options
from loopeval.common.jsonl import read_jsonl
from loopeval.analysis.runs import Run, load_run, pilot_label


@dataclass(frozen=True)
class AuditItem:
    """One flagged response: ``response`` is its index among the item's sampled answers (0 unless
    repeated); ``finished``: whether it ended by end-of-sequence or a stop (``None``: no trace)."""

    task: str
    doc_id: int
    response: int
    gold: str
    answer: str | None
    correct: bool
    flags: tuple[str, ...]
    finished: bool | None = None


@dataclass(frozen=True)
class TaskAudit:
    """One task: its items and responses, accuracy as rescored now and as the run recorded it
    (mean over items of the fraction of correct responses), responses per flag, and the
    flagged responses (``flagged_correct`` of them scored correct). ``unfinished_fallback``
    counts number-fallback responses that did not finish (``unfinished_fallback_right`` of
    them scored right by the run's rule), ``untraced`` responses without a trace record."""

    task: str
    n_items: int
    n_responses: int
    accuracy: float
    recorded_accuracy: float
    changed_items: int
    counts: Mapping[str, int]
    flagged: int
    flagged_correct: int
    items: tuple[AuditItem, ...]
    unfinished_fallback: int = 0
    unfinished_fallback_right: int = 0
    untraced: int = 0


@dataclass(frozen=True)
class ScoreAudit:
    """The audit of one run: ``tasks`` audited, and ``skipped`` tasks with the reason."""

    path: Path
    tasks: Mapping[str, TaskAudit]
    skipped: Mapping[str, str]
    unfinished_fallback: str = "credit"
    pilot: str | None = None  # "pilot: n of N items" for a --limit run

    def as_dict(self) -> dict:
        """Plain JSON-ready data (fractions, not points)."""
        return {
            "path": str(self.path),
            "flags": dict(scoring.FLAGS),
            "unfinished_fallback": self.unfinished_fallback,
            "pilot": self.pilot,
            "tasks": {
                name: {
                    **{k: getattr(t, k) for k in ("n_items", "n_responses", "accuracy", "recorded_accuracy",
                                                  "changed_items", "flagged", "flagged_correct",
                                                  "unfinished_fallback", "unfinished_fallback_right", "untraced")},
                    "counts": dict(t.counts),
                    "items": [{k: getattr(i, k) for k in ("doc_id", "response", "gold", "answer", "correct",
                                                          "finished")}
                              | {"flags": list(i.flags)} for i in t.items],
                }
                for name, t in self.tasks.items()
            },
            "skipped": dict(self.skipped),
        }

    def to_text(self) -> str:
        """A per-task table of counts, the skipped tasks, the flag legend, then one line per flagged response."""
        from loopeval.analysis.stats.display import points

        header = ("task", "items", "responses", "acc", "acc (run)", "changed", "flagged", "flagged right",
                  "fallback unfinished", "of them right", *scoring.FLAGS)
        rows = [(t.task, str(t.n_items), str(t.n_responses), points(t.accuracy), points(t.recorded_accuracy),
                 str(t.changed_items), str(t.flagged), str(t.flagged_correct),
                 str(t.unfinished_fallback) + ("?" if t.untraced else ""), str(t.unfinished_fallback_right),
                 *(str(t.counts[f]) for f in scoring.FLAGS)) for t in self.tasks.values()]
        widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
        lines = [f"score audit of {self.path}" + (f" ({self.pilot})" if self.pilot else ""), ""]
        lines += ["  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths))).rstrip()
                  for r in (header, *rows)]
        lines += ["", "acc: rescored now, in points; acc (run): as the run recorded it; changed: items whose "
                  "verdict differs; flagged: responses with at least one flag (counts per flag are responses).",
                  "fallback unfinished: number-fallback responses that did not finish (cut at the budget, from the "
                  "trace; '?': some responses have no trace); of them right: verdicts resting on the last number "
                  f"of a cut response, counted {'wrong' if self.unfinished_fallback == 'wrong' else 'right'} in acc "
                  f"(--unfinished-fallback {self.unfinished_fallback})."]
        lines += [f"  {flag}: {meaning}" for flag, meaning in scoring.FLAGS.items()]
        lines += [f"skipped {task}: {why}" for task, why in self.skipped.items()]
        for t in self.tasks.values():
            if t.items:
                lines += ["", f"{t.task}: {len(t.items)} flagged responses"]
            for i in t.items:
                which = f"doc {i.doc_id}" + (f" #{i.response}" if t.n_responses > t.n_items else "")
                cut = "  UNFINISHED" if i.finished is False else ""
                lines.append(f"  {which}  {'right' if i.correct else 'wrong'}  {', '.join(i.flags)}{cut}  "
                             f"answer: {_shown(i.answer)}  gold: {_shown(i.gold)}")
        return "\n".join(lines)


def score_audit(run: str | Path | Run, *, tasks: Sequence[str] | None = None,
                unfinished_fallback: str = "credit") -> ScoreAudit:
    """Audit the scoring of an lm-eval run (a results file, model folder or ``--output_path``
    folder written with ``--log_samples``, or a loaded :class:`Run`); ``tasks`` selects leaf
    tasks or groups (of a loaded run: its leaf tasks; default: all).
    ``unfinished_fallback`` (:data:`loopeval.evaluation.fallback.UNFINISHED_FALLBACK`): ``"wrong"``
    rescores number-fallback verdicts from unfinished responses as wrong."""
    check_option(unfinished_fallback)
    loaded = run if isinstance(run, Run) else load_run(run, tasks=tasks, allow_subset=True)  # labelled a pilot
    configs = json.loads(loaded.path.read_text(encoding="utf-8"))["configs"]
    audited, skipped = {}, {}
    selected = loaded.tasks if tasks is None or not isinstance(run, Run) else {t: loaded.tasks[t] for t in tasks}
    for name, scores in selected.items():
        config = configs[name]
        options = scoring_options(config)
        if config.get("output_type") != "generate_until":
            skipped[name] = f"not generative ({config.get('output_type')}): no answer is extracted"
        elif options is None:
            skipped[name] = "its process_results is not loopeval's boxed-answer scoring"
        else:
            records = {} if scores.trace is None else dict(zip(scores.doc_ids.tolist(), scores.trace))
            audited[name] = _audit_task(name, scores.samples_path, scores.metric.split(",", 1)[1], records,
                                        wrong=unfinished_fallback == "wrong", **options)
    return ScoreAudit(path=loaded.path, tasks=audited, skipped=skipped, unfinished_fallback=unfinished_fallback,
                      pilot=pilot_label([loaded]))


def _audit_task(task: str, samples: Path, filter_name: str, records: Mapping[int, tuple], *, wrong: bool,
                number_fallback: bool, thinking: bool) -> TaskAudit:
    def parse(lineno: int, rec: dict):
        if rec["filter"] != filter_name:
            return None
        resps = rec["filtered_resps"]
        # One response per request, or the list of sampled responses when the task repeats.
        responses = resps[0] if resps and isinstance(resps[0], list) else resps
        return int(rec["doc_id"]), str(rec["doc"]["gold"]), responses, float(rec["acc"])

    items: list[AuditItem] = []
    counts = dict.fromkeys(scoring.FLAGS, 0)
    rescored, recorded, n_responses = [], [], 0
    unfinished = unfinished_right = untraced = 0
    for _, (doc_id, gold, responses, acc) in read_jsonl(samples, parse, what="lm-eval samples"):
        grades = [scoring.grade(r, gold, number_fallback=number_fallback, thinking=thinking) for r in responses]
        done = response_finished(records.get(doc_id, ()), len(grades))
        n_responses += len(grades)
        right = 0
        for k, (g, finished) in enumerate(zip(grades, done)):
            for flag in g.flags:
                counts[flag] += 1
            cut = "number_fallback" in g.flags and finished is False
            if "number_fallback" in g.flags and finished is None:
                untraced += 1
            unfinished += cut
            unfinished_right += cut and g.correct
            right += g.correct and not (cut and wrong)
            if g.flags:
                items.append(AuditItem(task, doc_id, k, gold, g.answer, g.correct, g.flags, finished))
        rescored.append(right / len(grades))
        recorded.append(acc)
    if not rescored:
        raise ValueError(f"{samples}: no samples with filter {filter_name!r}")
    return TaskAudit(
        task=task,
        n_items=len(rescored),
        n_responses=n_responses,
        accuracy=sum(rescored) / len(rescored),
        recorded_accuracy=sum(recorded) / len(recorded),
        changed_items=sum(a != b for a, b in zip(rescored, recorded)),
        counts=counts,
        flagged=len(items),
        flagged_correct=sum(i.correct for i in items),
        items=tuple(sorted(items, key=lambda i: (i.doc_id, i.response))),
        unfinished_fallback=unfinished,
        unfinished_fallback_right=unfinished_right,
        untraced=untraced,
    )


def fallback_tasks(run: Run) -> list[str]:
    """The run's tasks scored by :mod:`loopeval.evaluation.scoring` with GSM8K's number fallback."""
    configs = json.loads(run.path.read_text(encoding="utf-8"))["configs"]
    return [t for t in run.tasks if (scoring_options(configs.get(t, {})) or {}).get("number_fallback")]


def unfinished_fallback_wrong(run: Run) -> Run:
    """``run`` read with every right verdict from the number fallback on a response that did
    not finish counted wrong (an item's score loses that response's share); tasks not scored
    by the number fallback are unchanged. Refuses a run whose fallback responses have no
    trace, since whether they finished is then unknown."""
    audit = score_audit(run, tasks=fallback_tasks(run))
    tasks = dict(run.tasks)
    for name, t in audit.tasks.items():
        if t.untraced:
            raise ValueError(f"{run.path}: task {name}: {t.untraced} number-fallback responses have no trace record, "
                             "so whether they finished is unknown; --unfinished-fallback wrong needs the looped "
                             "model's cost trace")
        cut = Counter(i.doc_id for i in t.items if i.correct and i.finished is False and "number_fallback" in i.flags)
        if cut:
            per_item = t.n_responses // t.n_items
            scores = run.tasks[name]
            lost = np.array([cut.get(d, 0) for d in scores.doc_ids.tolist()]) / per_item
            tasks[name] = replace(scores, scores=scores.scores - lost)
    return replace(run, tasks=tasks)


def read_runs(runs: Mapping[str, Run], unfinished_fallback: str) -> dict[str, Run]:
    """The runs as ``--unfinished-fallback`` reads them (:data:`loopeval.evaluation.fallback.UNFINISHED_FALLBACK`)."""
    check_option(unfinished_fallback)
    if unfinished_fallback == "credit":
        return dict(runs)
    return {name: unfinished_fallback_wrong(r) for name, r in runs.items()}


def _shown(text: str | None, width: int = 60) -> str:
    if text is None:
        return "(none)"
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."
