"""lm-eval hooks for loopeval's tasks: dataset adapters, prompts and per-sample metrics.

Each ``process_*`` adapter maps a hub dataset onto a few shared fields, so one prompt and
one ``process_results`` serve every task:

- generative tasks: ``query`` (the text before the instruction) and ``gold`` (the reference);
- letter-logit tasks: ``query``, ``options`` (option texts) and ``gold`` (the option index).

All answer extraction and comparison is :mod:`loopeval.evaluation.scoring`.
"""

from __future__ import annotations

import hashlib

from loopeval.evaluation import scoring

LETTERS = "ABCDEFGHIJ"
GPQA_ANSWERS = ("Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")
MMLU_PRO_SUBSET_SIZE = 2000


# Generative tasks.


def doc_to_text(doc: dict) -> str:
    """The user turn: the question, a newline, then the boxed-answer instruction."""
    return scoring.user_prompt(doc["query"])


def process_gsm8k(dataset):
    return dataset.map(_gsm8k_doc)


def process_math500(dataset):
    return dataset.map(_math500_doc)


def process_aime24(dataset):
    return dataset.map(_aime24_doc)


def process_aime25(dataset):
    return dataset.map(_aime25_doc)


def process_gpqa(dataset):
    """GPQA with the four answers in a fixed per-question order (:func:`gpqa_order`); the gold is the letter."""
    return dataset.map(_gpqa_doc)


def gpqa_order(record_id: str) -> list[int]:
    """The order in which GPQA question ``record_id`` lists its answers.

    Index 0 is the correct answer and 1-3 are the incorrect ones in dataset order; they are
    sorted by the SHA-256 of ``f"{record_id}/{index}"``, so every run, machine and Python
    version sees the same order.
    """
    if not record_id:
        raise ValueError("GPQA question has an empty 'Record ID'")
    return sorted(range(4), key=lambda k: hashlib.sha256(f"{record_id}/{k}".encode()).hexdigest())


def _results(doc: dict, results: list, *, number_fallback: bool, thinking: bool) -> dict:
    # One response per request, or a list of sampled responses when the task has repeats.
    responses = results[0] if isinstance(results[0], list) else results
    grades = [scoring.grade(r, doc["gold"], number_fallback=number_fallback, thinking=thinking) for r in responses]
    answers = [g.answer for g in grades]
    return {
        "acc": sum(g.correct for g in grades) / len(grades),
        "boxed": sum(g.boxed for g in grades) / len(grades),
        "extracted": answers[0] if len(answers) == 1 else answers,
        "scoring_failures": sum(g.failure is not None for g in grades),
    }


# Named functions rather than partials: lm-eval writes their source into the run's config.
def process_results(doc: dict, results: list) -> dict:
    return _results(doc, results, number_fallback=False, thinking=False)


def process_results_think(doc: dict, results: list) -> dict:
    return _results(doc, results, number_fallback=False, thinking=True)


def process_results_gsm8k(doc: dict, results: list) -> dict:
    return _results(doc, results, number_fallback=True, thinking=False)


def process_results_gsm8k_think(doc: dict, results: list) -> dict:
    return _results(doc, results, number_fallback=True, thinking=True)


def process_gsm8k_nll(dataset):
    """GSM8K with ``solution``, the reference solution as the boxed task asks for it
    (:func:`loopeval.evaluation.scoring.gsm8k_solution`), the text ``gsm8k_nll`` scores."""
    return dataset.map(_gsm8k_nll_doc)


def process_results_nll(doc: dict, results: list) -> dict:
    """``gsm8k_nll``'s per-item scores: the negative log-likelihood of ``doc["solution"]``
    given the prompt, in nats per UTF-8 byte of the solution (lower is better); the summed
    log-likelihood and the byte count beside it."""
    loglikelihood, _ = results[0]
    size = len(doc["solution"].encode("utf-8"))
    return {"nll_per_byte": -loglikelihood / size, "loglikelihood": loglikelihood, "solution_bytes": size}


def not_aggregated(items: list) -> None:
    """Aggregation of ``extracted``: none; the answers are read per sample in ``samples_*.jsonl``."""
    return None


def count(items: list) -> int:
    """Aggregation of ``scoring_failures``: the total."""
    return int(sum(items))


def _gsm8k_doc(doc: dict) -> dict:
    return {"query": doc["question"], "gold": scoring.gsm8k_gold(doc["answer"])}


def _gsm8k_nll_doc(doc: dict) -> dict:
    return {**_gsm8k_doc(doc), "solution": scoring.gsm8k_solution(doc["answer"])}


def _math500_doc(doc: dict) -> dict:
    return {"query": doc["problem"], "gold": doc["answer"]}


def _aime24_doc(doc: dict) -> dict:
    return {"query": doc["Problem"], "gold": str(doc["Answer"])}


def _aime25_doc(doc: dict) -> dict:
    return {"query": doc["problem"], "gold": str(doc["answer"])}


def _gpqa_doc(doc: dict) -> dict:
    answers = [doc[key].strip() for key in GPQA_ANSWERS]
    order = gpqa_order(doc["Record ID"])
    options = [answers[k] for k in order]
    listed = "\n".join(f"{letter}. {option}" for letter, option in zip(LETTERS, options))
    return {"query": f"{doc['Question'].strip()}\n\n{listed}", "options": options, "gold": LETTERS[order.index(0)]}


# Letter-logit multiple-choice tasks.


def mc_prompt(doc: dict) -> str:
    """``Question: ...``, one ``X. option`` line per option, then ``Answer:``; the letter is the continuation."""
    lines = [f"Question: {doc['query'].strip()}"]
    lines += [f"{letter}. {option}" for letter, option in zip(LETTERS, doc["options"])]
    return "\n".join(lines + ["Answer:"])


def mc_letters(doc: dict) -> list[str]:
    """The option letters, one per option."""
    if not 2 <= len(doc["options"]) <= len(LETTERS):
        raise ValueError(f"a question needs 2-{len(LETTERS)} options, got {len(doc['options'])}: {doc['query'][:80]!r}")
    return list(LETTERS[: len(doc["options"])])


def process_arc(dataset):
    return dataset.map(_labelled_choices_doc)


def process_commonsenseqa(dataset):
    return dataset.map(_labelled_choices_doc)


def process_mmlu_pro(dataset):
    """The fixed 2,000-question MMLU-Pro subset (:func:`mmlu_pro_subset`), in dataset order."""
    return mmlu_pro_subset(dataset).map(_mmlu_pro_doc)


def mmlu_pro_subset(dataset, size: int = MMLU_PRO_SUBSET_SIZE):
    """The ``size`` questions whose SHA-256 of the decimal ``question_id`` is smallest, in dataset order."""
    ids = dataset["question_id"]
    if len(set(ids)) != len(ids):
        raise ValueError("MMLU-Pro question_id values are not unique")
    if len(ids) < size:
        raise ValueError(f"MMLU-Pro split has {len(ids)} questions, fewer than the subset's {size}")
    ranked = sorted(range(len(ids)), key=lambda i: hashlib.sha256(str(ids[i]).encode()).hexdigest())
    return dataset.select(sorted(ranked[:size]))


def _labelled_choices_doc(doc: dict) -> dict:
    # ARC and CommonsenseQA: choices {"label": [...], "text": [...]} and an answerKey label.
    labels = doc["choices"]["label"]
    if doc["answerKey"] not in labels:
        raise ValueError(f"answerKey {doc['answerKey']!r} is not one of the labels {labels} (id {doc.get('id')!r})")
    return {"query": doc["question"], "options": doc["choices"]["text"], "gold": labels.index(doc["answerKey"])}


def _mmlu_pro_doc(doc: dict) -> dict:
    return {"query": doc["question"], "options": doc["options"], "gold": doc["answer_index"]}
