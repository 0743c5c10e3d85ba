"""A resumable store of finished generations, for lm-eval's ``looped`` model (``resume_dir=``).

lm-eval's own ``--use_cache`` keys a result on the request alone, so it would serve the
outputs of another loop, budget or decoding rule, and it stores text before ``looped``
finishes it. This store keys every generated row on the request *and* every setting
that changes outputs (``request_key``), and keeps its generated token ids and outcome,
so a served row yields the same text and the same trace record as a fresh one.

Rows are stored per batch, and a batch is served only when all of its rows are stored:
lm-eval forms the same batches on every run of the same requests, so a resumed run
decodes each remaining batch exactly as an uninterrupted run would.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from loopeval.common.jsonl import append_jsonl, repair_tail
from loopeval.common.schema import check_fields

FORMAT = 1
PREFIX = "loopeval_responses"


def request_key(identity: dict, context: str, gen_kwargs: dict) -> str:
    """sha256 of the model identity and settings, the request context and its generation kwargs."""
    payload = {"format": FORMAT, "identity": identity, "context": context, "gen_kwargs": gen_kwargs}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


class ResponseStore:
    """``folder/loopeval_responses[_rank<k>].jsonl``: one line per generated row."""

    def __init__(self, folder: str | Path, *, rank: int = 0, world_size: int = 1):
        self.path = Path(folder) / (f"{PREFIX}_rank{rank}.jsonl" if world_size > 1 else f"{PREFIX}.jsonl")
        self.rows: dict[str, dict] = {}
        if self.path.exists() and not self.path.is_file():
            raise ValueError(f"resume_dir: {self.path} is not a file; give a resume folder of loopeval's own")
        if self.path.is_file():
            self._load()

    def _load(self) -> None:
        from loopeval.evaluation.decoding import RowOutcome

        repair_tail(self.path)  # a line cut by a crash goes to loopeval_responses.jsonl.cut; that row is generated again
        try:
            lines = self.path.read_text(encoding="utf-8").split("\n")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{self.path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                generated, outcome, prompt_tokens = rec["generated"], rec["outcome"], rec["prompt_tokens"]
                if not (isinstance(generated, list) and all(type(t) is int for t in generated)):
                    raise ValueError(f"field 'generated' is {generated!r:.60}, expected a list of token ids")
                if not isinstance(outcome, dict) or type(prompt_tokens) is not int:
                    raise ValueError("field 'outcome' must be a mapping and 'prompt_tokens' a whole number")
                check_fields(RowOutcome, outcome)
                self.rows[rec["key"]] = {"generated": generated, "outcome": outcome, "prompt_tokens": prompt_tokens}
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{self.path}:{lineno}: corrupt response-store line ({exc})") from None

    def batch(self, keys: list[str]) -> list[dict] | None:
        """The stored rows of a whole batch, or ``None`` unless every row is stored."""
        if not keys or any(k not in self.rows for k in keys):
            return None
        return [self.rows[k] for k in keys]

    def add(self, rows: list[tuple[str, list[int], dict, int]]) -> None:
        """Append ``(key, generated ids, outcome, prompt tokens)`` rows, each on its own line."""
        records = [{"key": key, "generated": generated, "outcome": outcome, "prompt_tokens": prompt_tokens}
                   for key, generated, outcome, prompt_tokens in rows]
        append_jsonl(self.path, records)
        for rec in records:
            self.rows[rec["key"]] = {k: rec[k] for k in ("generated", "outcome", "prompt_tokens")}
