"""Decontamination: remove every training row that shares an n-gram of lower-cased words
with a test document (paper A.4). Torch-free.

Paper A.4: "We remove any training problem that shares a 13-gram of lower-cased words
with GSM8K test, MATH-500, AIME 2024/2025 or GPQA-Diamond. This does not detect
paraphrases or problems shorter than 13 words."

* **Words** are the runs of Unicode word characters (``\\w+``) of the lower-cased text;
  punctuation, LaTeX backslashes and whitespace separate words.
* **Test documents** are read through lm-eval's task configs (our YAMLs, lm-eval's own
  tasks, and user tasks from ``include_path``), so whatever a task evaluates is what
  is checked: each document's evaluated split (``eval_docs``, after the task's
  ``process_docs``), every string in it (question, solution, options, ...), each field
  on its own. The prompt template is not part of a document, so an instruction that
  every prompt shares flags nothing.
* **Training rows** are the JSONL lines of the data; every string in a row is checked,
  each field on its own, so no n-gram spans two fields.

One pass over the data: words map to the test vocabulary's ids (a word no test
document has breaks every n-gram through it), each window of ``n`` ids is hashed in
numpy, and a hash that some test n-gram has is confirmed word by word, so hash
collisions never remove a row.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path

import numpy as np

WORD = re.compile(r"\w+")
DEFAULT_N = 13
PAPER_TEST_SETS = ("gsm8k_boxed", "math500_boxed", "aime24_boxed", "aime25_boxed", "gpqa_diamond_boxed")
"""The test sets of paper A.4: "GSM8K test, MATH-500, AIME 2024/2025 or GPQA-Diamond"."""
RECORD_FORMAT = "loopeval-decontamination/1"

_SEGMENT, _ROW = "\x00", "\x01"  # separators in a joined chunk; neither is a word character
_TOKEN = re.compile(r"\w+|[\x00\x01]")
_CHUNK_ROWS = 20_000
_FILTER_BITS = 24  # a 16 MiB table of the test hashes' top bits screens windows before the exact lookup
_MULTIPLIERS = np.random.default_rng(0x13C0DE).integers(1, 2**63, size=4096, dtype=np.uint64) * np.uint64(2) + np.uint64(1)


@dataclass(frozen=True)
class EvalDocument:
    """One test document: its task, lm-eval ``doc_id`` and every string in it."""

    task: str
    doc_id: int
    texts: tuple[str, ...]


@dataclass(frozen=True)
class Decontamination:
    """What :func:`decontaminate` did: ``rows`` read, ``kept`` written to ``out``,
    ``removed`` listed (with why) in ``removed_path``; ``removed_by_task`` counts rows
    per task (a row may share n-grams with several); ``record_path`` is the record that
    training reads back."""

    rows: int
    kept: int
    removed: int
    removed_by_task: dict[str, int]
    out: Path
    removed_path: Path
    record_path: Path
    record: dict = field(repr=False)


def words(text: str) -> list[str]:
    """The lower-cased words of ``text``."""
    return WORD.findall(text.lower())


def _strings(value) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)


def eval_documents(tasks: Sequence[str], *, include_path: str | Path | Sequence[str | Path] | None = None) -> list[EvalDocument]:
    """The test documents of lm-eval tasks or groups ``tasks`` (groups expand to their
    tasks), found in loopeval's tasks, then ``include_path``, then lm-eval's own."""
    from lm_eval.tasks import TaskManager

    from loopeval.common.paths import tasks_path

    if isinstance(tasks, str) or not tasks:
        raise ValueError(f"tasks {tasks!r}: give a non-empty list of lm-eval task or group names")
    extra = [] if include_path is None else [include_path] if isinstance(include_path, (str, Path)) else list(include_path)
    for p in extra:
        if not Path(p).exists():
            raise FileNotFoundError(f"include path {p}: no such file or folder")
    paths = [str(tasks_path()), *map(str, extra)]
    manager = TaskManager(include_path=paths, include_defaults=False)
    if any(t not in manager.all_tasks for t in tasks):
        manager = TaskManager(include_path=paths)  # lm-eval's own tasks too (slower to index)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise ValueError(f"unknown lm-eval task(s) {', '.join(unknown)}: not in loopeval's tasks, lm-eval's, "
                         f"or the include path {extra or '(none given)'}")
    docs = []
    for name, task in sorted(manager.load(list(tasks))["tasks"].items()):
        docs += [EvalDocument(name, doc_id, tuple(_strings(doc))) for doc_id, doc in enumerate(task.eval_docs)]
    return docs


class NgramIndex:
    """The n-grams of lower-cased words of some documents, hashed for a one-pass scan."""

    def __init__(self, documents: Iterable[EvalDocument], *, n: int = DEFAULT_N):
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(_MULTIPLIERS):
            raise ValueError(f"n {n!r}: must be an integer in [1, {len(_MULTIPLIERS)}]")
        self.n = n
        self.vocab: dict[str, int] = {}  # word -> id >= 1; 0 breaks n-grams
        self.documents: dict[str, int] = {}  # task -> documents
        self.short: dict[str, int] = {}  # task -> documents without a text of n words (no n-gram can match)
        digest = hashlib.sha256()
        parts, self._owners = [], []  # each text's ids and a 0; its (task, doc_id)
        for doc in documents:
            self.documents[doc.task] = self.documents.get(doc.task, 0) + 1
            digest.update(json.dumps([doc.task, doc.doc_id, doc.texts]).encode())
            longest = 0
            for text in doc.texts:
                parts.append(np.array([*(self.vocab.setdefault(w, len(self.vocab) + 1) for w in words(text)), 0], dtype=np.int64))
                self._owners.append((doc.task, doc.doc_id))
                longest = max(longest, len(parts[-1]) - 1)
            if longest < n:
                self.short[doc.task] = self.short.get(doc.task, 0) + 1
        self.sha256 = digest.hexdigest()
        self._ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        self._starts = np.cumsum([0] + [len(x) for x in parts[:-1]])
        where, h = self._windows(self._ids)
        order = np.argsort(h, kind="stable")  # equal hashes stay in document order
        self.hashes, self._where = h[order], where[order]
        self._filter = np.zeros(1 << _FILTER_BITS, dtype=bool)
        self._filter[self.hashes >> np.uint64(64 - _FILTER_BITS)] = True
        self._lookup = {**self.vocab, _ROW: -1}
        self._words = {i: w for w, i in self.vocab.items()}

    def __len__(self) -> int:
        """Distinct n-grams (distinct hashes: collisions of different n-grams are left to chance)."""
        return len(np.unique(self.hashes))

    def _windows(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Start and hash of every window of ``n`` ids without a 0 (a word break)."""
        count = len(ids) - self.n + 1
        if count <= 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.uint64)
        breaks = np.concatenate([[0], np.cumsum(ids == 0)])
        where = np.flatnonzero(breaks[self.n:] == breaks[:-self.n])
        h = np.zeros(count, dtype=np.uint64)
        u = ids.astype(np.uint64)
        for k in range(self.n):
            h += u[k:k + count] * _MULTIPLIERS[k]  # wraps modulo 2**64, as intended
        return where, h[where]

    def scan(self, rows: Sequence[Sequence[str]]) -> list[dict[str, tuple[int, str]]]:
        """For each row (its strings), ``{task: (doc_id, shared n-gram)}`` with the first
        shared n-gram per task (and the first document of the task that has it); ``{}``
        for a clean row."""
        hits: list[dict[str, tuple[int, str]]] = [{} for _ in rows]
        if not rows or not len(self.hashes):
            return hits
        joined = _ROW.join(_SEGMENT.join(strings) for strings in rows)
        if joined.count(_ROW) != len(rows) - 1 or joined.count(_SEGMENT) != sum(max(len(r) - 1, 0) for r in rows):
            # a row holds a separator character itself: blank them out (they are not word characters)
            joined = _ROW.join(_SEGMENT.join(s.replace(_ROW, " ").replace(_SEGMENT, " ") for s in r) for r in rows)
        ids = np.array(list(map(self._lookup.get, _TOKEN.findall(joined.lower()), repeat(0))), dtype=np.int64)
        row_of = np.cumsum(ids == -1)
        ids[ids == -1] = 0
        where, h = self._windows(ids)
        keep = self._filter[h >> np.uint64(64 - _FILTER_BITS)]
        where, h = where[keep], h[keep]
        lo, hi = np.searchsorted(self.hashes, h, "left"), np.searchsorted(self.hashes, h, "right")
        for start, a, b in zip(where.tolist(), lo.tolist(), hi.tolist()):
            gram = ids[start:start + self.n]
            row = hits[row_of[start]]
            for at in self._where[a:b].tolist():
                if np.array_equal(self._ids[at:at + self.n], gram):
                    task, doc_id = self._owners[int(np.searchsorted(self._starts, at, "right")) - 1]
                    if task not in row:
                        row[task] = (doc_id, " ".join(self._words[i] for i in gram.tolist()))
        return hits


def _paths(out: Path, removed: str | Path | None) -> tuple[Path, Path]:
    return Path(removed) if removed is not None else out.with_suffix(".removed.jsonl"), out.with_suffix(".decontamination.json")


def _check_files(data: Path, out: Path, removed, *, n, overwrite: bool) -> tuple[Path, Path]:
    """The removed-rows and record paths, after refusing a missing ``data``, outputs that are
    not four different files, existing outputs (unless ``overwrite``) and a bad ``n``."""
    if not data.is_file():
        raise FileNotFoundError(f"training data {data}: no such file")
    removed_path, record_path = _paths(out, removed)
    if len({data.resolve(), out.resolve(), removed_path.resolve(), record_path.resolve()}) < 4:
        raise ValueError(f"decontaminate: the data ({data}), --out ({out}) and the removed-rows file ({removed_path}) "
                         "must be different files")
    existing = [p for p in (out, removed_path, record_path) if p.exists()]
    if existing and not overwrite:
        raise ValueError(f"{existing[0]} exists; choose another --out or pass overwrite=True (--overwrite)")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n {n!r}: must be an integer >= 1")
    return removed_path, record_path


def _filter(data: Path, index: NgramIndex, out: Path, removed_path: Path) -> tuple[str, str, int, int, int, dict]:
    """Copy the rows of ``data`` that ``index`` finds nothing in to ``out`` and list the others in
    ``removed_path`` (each written beside as ``.part`` and renamed into place): the sha256 of
    ``data`` and of ``out``, the rows read, kept and removed, and the removals per task."""
    out.parent.mkdir(parents=True, exist_ok=True)
    removed_path.parent.mkdir(parents=True, exist_ok=True)
    tmp_out, tmp_removed = out.with_name(out.name + ".part"), removed_path.with_name(removed_path.name + ".part")
    source, target = hashlib.sha256(), hashlib.sha256()
    rows = kept = dropped = 0
    by_task = dict.fromkeys(sorted(index.documents), 0)
    try:
        with data.open("rb") as f, tmp_out.open("wb") as fo, tmp_removed.open("w") as fr:
            chunk: list[tuple[int, bytes, list[str]]] = []

            def flush():
                nonlocal kept, dropped
                for (lineno, line, _), hit in zip(chunk, index.scan([s for _, _, s in chunk])):
                    if hit:
                        dropped += 1
                        for task, (doc_id, gram) in sorted(hit.items()):
                            by_task[task] += 1
                            fr.write(json.dumps({"row": lineno, "task": task, "doc_id": doc_id, "ngram": gram}) + "\n")
                    else:
                        kept += 1
                        fo.write(line)
                        target.update(line)
                chunk.clear()

            for lineno, line in enumerate(f, start=1):
                source.update(line)
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                    raise ValueError(f"{data}:{lineno}: not valid JSON ({getattr(exc, 'msg', exc)})") from None
                if not line.endswith(b"\n"):
                    line += b"\n"
                rows += 1
                chunk.append((lineno, line, list(_strings(row))))
                if len(chunk) == _CHUNK_ROWS:
                    flush()
            flush()
        os.replace(tmp_out, out)
        os.replace(tmp_removed, removed_path)
    finally:
        for tmp in (tmp_out, tmp_removed):
            tmp.unlink(missing_ok=True)
    return source.hexdigest(), target.hexdigest(), rows, kept, dropped, by_task


def decontaminate(data: str | Path, *, out: str | Path, against: Sequence[str] = PAPER_TEST_SETS, n: int = DEFAULT_N,
                  include_path: str | Path | Sequence[str | Path] | None = None, removed: str | Path | None = None,
                  overwrite: bool = False) -> Decontamination:
    """Copy the JSONL file ``data`` to ``out`` without every row that shares an ``n``-gram
    of lower-cased words with a test document of the lm-eval tasks ``against``.

    Kept rows are copied byte for byte, in order. ``removed`` (default
    ``OUT.removed.jsonl``) gets one line per removed row and task: ``row`` (the line
    number in ``data``), ``task``, ``doc_id`` and the first shared ``ngram``.
    ``OUT.decontamination.json`` records what was checked and the sha256 of ``out``;
    training finds it beside its data and writes it into the training manifest.
    The defaults are the paper's: 13-grams, against GSM8K test, MATH-500, AIME 2024/2025
    and GPQA-Diamond.
    """
    data, out = Path(data), Path(out)
    removed_path, record_path = _check_files(data, out, removed, n=n, overwrite=overwrite)
    against = list(against)
    index = NgramIndex(eval_documents(against, include_path=include_path), n=n)
    for task, short in sorted(index.short.items()):
        warnings.warn(f"decontaminate: task {task}: {short} of {index.documents[task]} test documents have no text of "
                      f"{n} words, so no {n}-gram can find them and a verbatim copy of them stays in the data; "
                      "lower n to check them", stacklevel=2)

    source, target, rows, kept, dropped, by_task = _filter(data, index, out, removed_path)
    record = {
        "format": RECORD_FORMAT,
        "source": str(data),
        "source_sha256": source,
        "sha256": target,
        "n": n,
        "words": "lower-cased \\w+ runs",
        "against": against,
        "test_documents": index.documents,
        "test_sha256": index.sha256,
        "rows": rows,
        "kept": kept,
        "removed": dropped,
        "removed_by_task": by_task,
    }
    record_path.write_text(json.dumps(record, indent=2) + "\n")
    return Decontamination(rows=rows, kept=kept, removed=dropped, removed_by_task=by_task, out=out,
                           removed_path=removed_path, record_path=record_path, record=record)


def decontamination_record(data: str | Path, sha256: str) -> dict | None:
    """The record :func:`decontaminate` wrote beside ``data`` if ``data`` (of hash
    ``sha256``) is the file it wrote, else ``None`` (with a warning when a record is
    there but the file changed since)."""
    file = Path(data).with_suffix(".decontamination.json")
    if not file.is_file():
        return None
    try:
        record = json.loads(file.read_text())
    except json.JSONDecodeError:
        record = None
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        warnings.warn(f"{file}: not a {RECORD_FORMAT} record; {data} counts as not decontaminated", stacklevel=2)
        return None
    if record.get("sha256") != sha256:
        warnings.warn(f"{data} changed after decontamination ({file}); it counts as not decontaminated", stacklevel=2)
        return None
    return {k: v for k, v in record.items() if k not in ("format", "source", "sha256")}
