"""Which verdicts of an lm-eval run rest on a scoring rule a reader might dispute.

:func:`score_audit` grades every response of a run's boxed-answer tasks again with
:func:`loopeval.evaluation.scoring.grade` and lists those whose grade carries a flag of
:data:`loopeval.evaluation.scoring.FLAGS` (number fallback, hedged letter, several boxes, math-verify
failure, relation against interval), with counts per task. The scoring options of each task
(``number_fallback``, ``thinking``) are read from the ``process_results`` source that
lm-eval records in the run's configuration; tasks not scored by :mod:`loopeval.evaluation.scoring`
(letter log-likelihood tasks, lm-eval's own tasks) are listed as skipped, with the reason.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from loopeval.evaluation import scoring
from loopeval.common.jsonl import read_jsonl
from loopeval.analysis.runs import load_run

# loopeval's process_results hooks call _results(doc, results, number_fallback=..., thinking=...).
_OPTION = re.compile(r"\b(number_fallback|thinking)\s*=\s*(True|False)\b")


@dataclass(frozen=True)
class AuditItem:
    """One flagged response: ``response`` is its index among the item's sampled answers (0 unless repeated)."""

    task: str
    doc_id: int
    response: int
    gold: str
    answer: str | None
    correct: bool
    flags: tuple[str, ...]


@dataclass(frozen=True)
class TaskAudit:
    """One task: its items and responses, accuracy as rescored now and as the run recorded it
    (mean over items of the fraction of correct responses), responses per flag, and the
    flagged responses (``flagged_correct`` of them scored correct)."""

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


@dataclass(frozen=True)
class ScoreAudit:
    """The audit of one run: ``tasks`` audited, and ``skipped`` tasks with the reason."""

    path: Path
    tasks: Mapping[str, TaskAudit]
    skipped: Mapping[str, str]

    def as_dict(self) -> dict:
        """Plain JSON-ready data (fractions, not points)."""
        return {
            "path": str(self.path),
            "flags": dict(scoring.FLAGS),
            "tasks": {
                name: {
                    **{k: getattr(t, k) for k in ("n_items", "n_responses", "accuracy", "recorded_accuracy",
                                                  "changed_items", "flagged", "flagged_correct")},
                    "counts": dict(t.counts),
                    "items": [{k: getattr(i, k) for k in ("doc_id", "response", "gold", "answer", "correct")}
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
                  *scoring.FLAGS)
        rows = [(t.task, str(t.n_items), str(t.n_responses), points(t.accuracy), points(t.recorded_accuracy),
                 str(t.changed_items), str(t.flagged), str(t.flagged_correct),
                 *(str(t.counts[f]) for f in scoring.FLAGS)) for t in self.tasks.values()]
        widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
        lines = [f"score audit of {self.path}", ""]
        lines += ["  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths))).rstrip()
                  for r in (header, *rows)]
        lines += ["", "acc: rescored now, in points; acc (run): as the run recorded it; changed: items whose "
                  "verdict differs; flagged: responses with at least one flag (counts per flag are responses)."]
        lines += [f"  {flag}: {meaning}" for flag, meaning in scoring.FLAGS.items()]
        lines += [f"skipped {task}: {why}" for task, why in self.skipped.items()]
        for t in self.tasks.values():
            if t.items:
                lines += ["", f"{t.task}: {len(t.items)} flagged responses"]
            for i in t.items:
                which = f"doc {i.doc_id}" + (f" #{i.response}" if t.n_responses > t.n_items else "")
                lines.append(f"  {which}  {'right' if i.correct else 'wrong'}  {', '.join(i.flags)}  "
                             f"answer: {_shown(i.answer)}  gold: {_shown(i.gold)}")
        return "\n".join(lines)


def score_audit(run: str | Path, *, tasks: Sequence[str] | None = None) -> ScoreAudit:
    """Audit the scoring of an lm-eval run (a results file, model folder or ``--output_path``
    folder written with ``--log_samples``); ``tasks`` selects leaf tasks or groups (default: all)."""
    loaded = load_run(run, tasks=tasks)
    configs = json.loads(loaded.path.read_text(encoding="utf-8"))["configs"]
    audited, skipped = {}, {}
    for name, scores in loaded.tasks.items():
        config = configs[name]
        options = dict(_OPTION.findall(str(config.get("process_results", ""))))
        if config.get("output_type") != "generate_until":
            skipped[name] = f"not generative ({config.get('output_type')}): no answer is extracted"
        elif set(options) != {"number_fallback", "thinking"}:
            skipped[name] = "its process_results is not loopeval's boxed-answer scoring"
        else:
            flags = {key: value == "True" for key, value in options.items()}
            audited[name] = _audit_task(name, scores.samples_path, scores.metric.split(",", 1)[1], **flags)
    return ScoreAudit(path=loaded.path, tasks=audited, skipped=skipped)


def _audit_task(task: str, samples: Path, filter_name: str, *, number_fallback: bool, thinking: bool) -> TaskAudit:
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
    for _, (doc_id, gold, responses, acc) in read_jsonl(samples, parse, what="lm-eval samples"):
        grades = [scoring.grade(r, gold, number_fallback=number_fallback, thinking=thinking) for r in responses]
        n_responses += len(grades)
        rescored.append(sum(g.correct for g in grades) / len(grades))
        recorded.append(acc)
        for k, g in enumerate(grades):
            for flag in g.flags:
                counts[flag] += 1
            if g.flags:
                items.append(AuditItem(task, doc_id, k, gold, g.answer, g.correct, g.flags))
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
    )


def _shown(text: str | None, width: int = 60) -> str:
    if text is None:
        return "(none)"
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."
