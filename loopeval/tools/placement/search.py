"""``place``: score every candidate placement of a loop by calibrated perplexity.

Paper A.1: "A search that never uses benchmark answers scores candidate spans by
calibrated perplexity PPL_T, the perplexity at the candidate's own fitted temperature."
Each candidate's T* minimises its NLL on the validation part of the text; PPL_T is its
perplexity on the test part at T*. Plain perplexity and the mean KL divergence to the
unlooped model ("chosen before training by minimum KL divergence to the unlooped
model") are recorded beside it. The unlooped model is the first row.

Work is done in rounds: the candidates whose windows end at the same layer (then the
MLP-loop candidates). A round streams the validation batches, fits each candidate's
T*, streams the test batches, and appends its rows to ``placements.jsonl``; a re-run
skips candidates already there.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from loopeval.common.allocator import keep_freed_memory
from loopeval.common.outputs import aside
from loopeval.common.threads import configure_threads
from loopeval.core.cost import loop_cost
from loopeval.core.blocks import check_sub_layer_support
from loopeval.core.loop import count_layers, decoder_layers, loop_config, resolve_loop
from loopeval.core.spec import LoopSpec
from loopeval.tools.placement.calibration import (TEMPERATURE_BOUNDS, TOLERANCE, FitChunk, Reference, TestSums,
                                                  fit_temperature, slope_and_curvature)
from loopeval.tools.placement.engine import NaiveEngine, PassMeter, PrefixEngine
from loopeval.tools.placement.grid import (DEFAULT_BETAS, DEFAULT_OPERATOR, DEFAULT_TIMES, DEFAULT_WIDTHS, Candidate,
                                     build_grid, mlp_loop_candidates, planned_passes, rounds)
from loopeval.tools.placement.noise import ppl_interval, resample_counts
from loopeval.tools.placement.results import (PLACEMENTS_NAME, SETTINGS_NAME, RANK_BY, Correlation, PlacementRow, append_placement,
                                        correlate, ranked, read_accuracies, read_placements)
from loopeval.tools.placement.text import SPLITS, ScoringText, load_text

SCORE_ELEMENTS = 1 << 24
"""Logits scored at once: positions per chunk = SCORE_ELEMENTS // vocabulary size."""
FIT_LOGITS_MEMORY = 2 << 30
"""Bytes of one candidate's validation logits kept through its
temperature fit: the LM head is then applied once per candidate, not once per Newton step."""


@dataclass(frozen=True)
class PlacementResult:
    """A finished search: every row of ``placements.jsonl`` (the unlooped model first),
    the ranking metric, and what this run executed."""

    rows: tuple[PlacementRow, ...]
    rank_by: str
    out: Path
    scored: int  # candidates scored by this run (the rest were already in the file)
    layer_passes: float  # layer passes this run executed, per text position
    fit_evaluations: int  # passes over validation logits this run's temperature fits took
    wall_s: float
    text: dict = field(default_factory=dict)
    correlations: tuple[Correlation, ...] = ()

    @property
    def unlooped(self) -> PlacementRow:
        return next(r for r in self.rows if r.loop is None)

    def ranked(self) -> list[PlacementRow]:
        return ranked(list(self.rows), self.rank_by)


INPUTS = ("weights", "data_sha256")
"""What a search was made from, by content: a search folder whose inputs changed is searched
again (its results moved aside first); the paths (``model``, ``data``) do not count."""


def _settings(model_name: str, weights: str | None, num_layers: int, text: ScoringText, *, seq_len, val_fraction,
              max_tokens, dtype) -> dict:
    return {
        "format": 1, "model": model_name, "weights": weights, "num_layers": num_layers, "dtype": dtype,
        "data": str(text.path), "data_sha256": text.sha256, "seq_len": seq_len, "val_fraction": val_fraction,
        "max_tokens": max_tokens, "temperature_bounds": list(TEMPERATURE_BOUNDS), "tolerance": TOLERANCE,
    }


def _expected_dtype(model, dtype: str | None) -> str:
    """The dtype the weights will have: ``dtype``, else the model's or its config's."""
    if dtype is not None:
        return str(getattr(torch, dtype))
    if isinstance(model, nn.Module):
        return str(next(model.parameters()).dtype)
    from transformers import AutoConfig

    stored = getattr(AutoConfig.from_pretrained(model), "dtype", None) or "float32"
    return str(stored if isinstance(stored, torch.dtype) else getattr(torch, str(stored), torch.float32))


def _check_resume(out: Path, settings: dict, *, rerun: bool = True) -> list[PlacementRow]:
    """The rows already in ``out`` (none for a new folder); refuses a folder of another search.
    A search of changed :data:`INPUTS` (weights retrained in place, edited text) is moved to
    ``out/.replaced/TIME`` and started again (``rerun=False``: refused, naming the change)."""
    file, rows = out / SETTINGS_NAME, []
    if file.exists():
        try:
            stored = json.loads(file.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{file}: not a readable search record ({exc}); give another --out") from None
        if not isinstance(stored, dict):
            raise ValueError(f"{file}: expected a mapping of search settings, got a {type(stored).__name__}; "
                             "give another --out")
        differ = [k for k in settings if k not in ("data", "model") and stored.get(k) != settings[k]]
        changes = "; ".join(f"{k}: {stored.get(k)!r} there, {settings[k]!r} now" for k in differ)
        if any(k not in INPUTS for k in differ):
            raise ValueError(f"{out} holds a search with other settings ({changes}); give another --out")
        if differ and not rerun:
            raise ValueError(f"{out} holds a search made from other inputs ({changes}); run without --no-rerun "
                             "to search again (the old results are kept), or give another --out")
        if differ:
            replaced = aside(out)
            for name in (SETTINGS_NAME, PLACEMENTS_NAME, "placement.html", "loop_config.json"):
                if (out / name).exists():
                    (out / name).replace(replaced / name)
            print(f"place: {out} was searched with other inputs ({', '.join(differ)} changed); searching again, "
                  f"the old results moved to {replaced}", file=sys.stderr)
            return []
    if (out / PLACEMENTS_NAME).exists():
        rows = read_placements(out / PLACEMENTS_NAME)
    return rows


def _batches(text: ScoringText, split: str, rows_per_batch: int, device) -> list[tuple]:
    """``(key, ids, labels, docs)`` per batch of rows; ``docs`` holds each scored label's document."""
    part = text.part(split)
    return [((split, i), part.ids[i:i + rows_per_batch].to(device), part.labels[i:i + rows_per_batch].to(device),
             part.docs[i:i + rows_per_batch, 1:][part.labels[i:i + rows_per_batch, 1:] != -100])
            for i in range(0, part.rows, rows_per_batch)]


class _Scorer:
    """Turns final hidden states into the sums of ``calibration``, chunk by chunk."""

    def __init__(self, model: nn.Module):
        self.head = model.get_output_embeddings()
        vocab = self.head.weight.shape[0]
        self.chunk = max(1, SCORE_ELEMENTS // vocab)

    @staticmethod
    def positions(labels: torch.Tensor):
        """Where a next token is scored: hidden position i predicts token i + 1."""
        mask = labels[:, 1:] != -100
        return mask, labels[:, 1:][mask]

    def _logits(self, hidden: torch.Tensor) -> Iterator[torch.Tensor]:
        """The LM head on ``hidden``, ``chunk`` rows at a time, written into one buffer
        (each yielded chunk is overwritten by the next: use it before asking for more)."""
        linear = type(self.head) is nn.Linear
        buffer = None
        for i in range(0, hidden.shape[0], self.chunk):
            h = hidden[i:i + self.chunk]
            if not linear:
                yield self.head(h)
                continue
            if buffer is None:
                buffer = h.new_empty(min(self.chunk, hidden.shape[0]), self.head.weight.shape[0])
            out = buffer[:h.shape[0]]
            if self.head.bias is None:
                yield torch.mm(h, self.head.weight.t(), out=out)
            else:
                yield torch.addmm(self.head.bias, h, self.head.weight.t(), out=out)

    def chunks(self, final: torch.Tensor, mask) -> Iterator[torch.Tensor]:
        """The logits at the scored positions of ``final``, as ``_logits`` yields them."""
        yield from self._logits(final[:, :-1][mask])

    def kept_logits(self, kept: list[torch.Tensor], targets: list[torch.Tensor]):
        """``(logits, labels)`` chunks of hidden states kept at scored positions."""
        for h, y in zip(kept, targets):
            yield from zip(self._logits(h), y.split(self.chunk))

    def fit(self, kept: list[torch.Tensor], targets: list[torch.Tensor], start: float):
        """T* from the kept hidden states; their logits are computed once and reused by every
        Newton step when they fit in ``FIT_LOGITS_MEMORY`` (else once per step)."""
        size = sum(h.shape[0] for h in kept) * self.head.weight.shape[0] * 4  # float32 logits
        if size <= FIT_LOGITS_MEMORY:
            prepared = [FitChunk.of(z, y) for z, y in self.kept_logits(kept, targets)]
            return fit_temperature(lambda b: slope_and_curvature(prepared, b), start=start)
        return fit_temperature(lambda b: slope_and_curvature(self.kept_logits(kept, targets), b), start=start)


def _check_options(*, rank_by: str, mlp_loop, results, dtype, batch_tokens: int, seq_len: int) -> None:
    if rank_by not in RANK_BY:
        raise ValueError(f"rank_by {rank_by!r}: choose one of {', '.join(RANK_BY)}")
    if isinstance(mlp_loop, bool) or not isinstance(mlp_loop, int) or mlp_loop < 0:
        raise ValueError(f"mlp_loop {mlp_loop!r}: the number of top windows to try with an MLP loop, >= 0")
    if results is not None and not Path(results).is_file():
        raise FileNotFoundError(f"results {results}: no such file")
    if dtype is not None and not isinstance(getattr(torch, str(dtype), None), torch.dtype):
        raise ValueError(f"dtype {dtype!r}: expected a torch dtype name such as float32 or bfloat16")
    if batch_tokens < seq_len:
        raise ValueError(f"batch_tokens {batch_tokens}: must hold at least one row of seq_len {seq_len} tokens")


def _unlooped_source(model, tokenizer) -> tuple[int, str, object]:
    """The layer count, name and weights fingerprint of ``model`` (a model or a checkpoint), which
    must have no loop; a model object needs its ``tokenizer``. Reads no weights of a checkpoint."""
    if isinstance(model, nn.Module):
        if tokenizer is None:
            raise ValueError("place: give the tokenizer with a model object")
        if loop_config(model) is not None:
            raise ValueError(f"place searches loops for an unlooped model; this one has {loop_config(model).spec}")
        from loopeval.core.checkpoint import weights_fingerprint

        return count_layers(model), type(model).__name__, weights_fingerprint(model)
    stored = resolve_loop(model)
    if stored is not None:
        raise ValueError(f"{model} already has the loop {stored.spec}; place searches loops for the base checkpoint")
    num_layers = count_layers(model)
    model_name = str(Path(model).resolve()) if Path(model).is_dir() else str(model)
    from loopeval.evaluation.identity import loaded_fingerprint

    return num_layers, model_name, loaded_fingerprint({"pretrained": model})["pretrained"]


def _score_grid(search: _Search, meter, grid, done: dict, *, num_layers: int, text_rows: int, round_size: int,
                reuse: bool, mlp_loop: int, rank_by: str, progress: bool) -> None:
    """Score the unlooped model, then the ``grid``'s candidates not ``done`` in rounds (saying
    how long it should take), then the best ``mlp_loop`` windows with an MLP loop added."""
    started = time.perf_counter()
    search.unlooped(Candidate())
    pending = [c for c in grid if c.key not in done]
    search.bar_add(len(pending))
    work = rounds(pending, round_size)
    left = (planned_passes(pending, num_layers, reuse=reuse, text_rows=text_rows, max_candidates=round_size)
            - meter.rows / text_rows)
    if progress and work:
        rate = meter.rows / text_rows / (time.perf_counter() - started)
        search.say(f"{len(pending)} candidates, {left:.0f} layer passes per text position planned; at the "
                   f"unlooped model's speed ({rate:.2f} passes/s) about {_duration(left / rate)}")
    for i, group in enumerate(work):
        started, before = time.perf_counter(), meter.rows
        search.round(group)
        if progress and i == 0 and len(work) > 1:
            spent, passes = time.perf_counter() - started, (meter.rows - before) / text_rows
            search.say(f"first round: {len(group)} candidates in {spent:.1f} s ({spent / len(group):.2f} s "
                       f"each, {passes / spent:.2f} passes/s with scoring); about "
                       f"{_duration((left - passes) / (passes / spent))} for the other "
                       f"{len(pending) - len(group)}")
    if mlp_loop:
        grid_keys = {c.key for c in grid}
        best = [r for r in ranked(list(search.rows.values()), rank_by) if r.key in grid_keys][:mlp_loop]
        extra = [c for c in mlp_loop_candidates([_candidate(r) for r in best]) if c.key not in done]
        search.bar_add(len(extra))
        for group in rounds(extra, round_size):
            search.round(group)


def place(model, data, *, out, tokenizer=None, widths=DEFAULT_WIDTHS, times=DEFAULT_TIMES, betas=DEFAULT_BETAS,
          operator: str = DEFAULT_OPERATOR, starts=None, mlp_loop: int = 0, max_tokens: int | None = None,
          seq_len: int = 1024, val_fraction: float = 0.5, batch_tokens: int = 8192, rank_by: str = "ppl_t",
          reuse: bool = True, fit_memory: int = 4 << 30, dtype: str | None = None, device: str | None = None,
          results=None, progress: bool = True, rerun: bool = True) -> PlacementResult:
    """Score every window of the grid on ``data`` (a JSONL of ``{"text"}`` documents) and
    write ``out/placements.jsonl``; return the rows.

    ``model`` is an unlooped checkpoint path or hub id (loaded with ``dtype`` onto
    ``device``; its tokenizer too) or a model (give ``tokenizer``). The grid is every
    start (or ``starts``), ``widths``, ``times`` (K) and ``betas`` with ``operator``;
    ``mlp_loop`` > 0 also scores the best ``mlp_loop`` windows by ``rank_by`` with one
    added MLP-only loop (K=3) at their first layer. ``reuse=False`` runs every candidate
    as a full forward (the naive search, for comparison). ``fit_memory`` bounds the bytes
    of validation hidden states kept for the temperature fits (it sets the round size).
    ``results``, a JSONL of
    benchmark accuracies (``read_accuracies``), adds Spearman's rho for PPL_T, PPL and KL
    (paper D.1). Every check on the options, the text and the architecture runs before
    the first forward pass. A re-run into ``out`` skips the candidates already scored when
    the weights and the text are the same by content (:data:`INPUTS`); when they changed it
    searches again (``rerun=False``: refused).
    """
    start_time = time.perf_counter()
    _check_options(rank_by=rank_by, mlp_loop=mlp_loop, results=results, dtype=dtype, batch_tokens=batch_tokens,
                   seq_len=seq_len)
    num_layers, model_name, weights = _unlooped_source(model, tokenizer)
    grid = build_grid(num_layers, widths=widths, times=times, betas=betas, operator=operator, starts=starts)
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model)
    text = load_text(data, tokenizer, seq_len=seq_len, val_fraction=val_fraction, max_tokens=max_tokens)
    out = Path(out)
    settings = _settings(model_name, weights, num_layers, text, seq_len=seq_len, val_fraction=val_fraction,
                         max_tokens=max_tokens, dtype=_expected_dtype(model, dtype))
    _check_resume(out, settings, rerun=rerun)  # before the weights load
    configure_threads()
    if not isinstance(model, nn.Module):
        from loopeval.core.checkpoint import load_model

        model, _ = load_model(model, dtype=getattr(torch, dtype) if dtype else "auto")
        model.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    keep_freed_memory()
    layers = decoder_layers(model)
    if mlp_loop:
        check_sub_layer_support(layers, LoopSpec.parse(f"0:{num_layers}x2/mlp"))
    settings["dtype"] = str(next(model.parameters()).dtype)  # as loaded, should the config not say
    done = {r.key: r for r in _check_resume(out, settings, rerun=rerun)}
    out.mkdir(parents=True, exist_ok=True)
    (out / SETTINGS_NAME).write_text(json.dumps(settings, indent=2) + "\n")

    device = next(model.parameters()).device
    rows_per_batch = max(1, batch_tokens // seq_len)
    batches = {split: _batches(text, split, rows_per_batch, device) for split in SPLITS}
    engine = (PrefixEngine if reuse else NaiveEngine)(model, batch_tokens=batch_tokens)
    scorer = _Scorer(model)
    kept_bytes = text.val.tokens * scorer.head.weight.shape[1] * next(model.parameters()).element_size()
    round_size = max(1, fit_memory // max(1, kept_bytes))
    search = _Search(model, engine, scorer, batches, out / PLACEMENTS_NAME, done, progress, text.test.documents)
    with torch.no_grad(), PassMeter(model) as meter:
        was_training = model.training
        model.eval()
        try:
            _score_grid(search, meter, grid, done, num_layers=num_layers, text_rows=text.val.rows + text.test.rows,
                        round_size=round_size, reuse=reuse, mlp_loop=mlp_loop, rank_by=rank_by, progress=progress)
        finally:
            model.train(was_training)
            search.close()
    return _write_result(out, search, text, layer_passes=meter.rows / (text.val.rows + text.test.rows),
                         seq_len=seq_len, rank_by=rank_by, results=results, start_time=start_time)


def _write_result(out: Path, search: _Search, text, *, layer_passes: float, seq_len: int, rank_by: str, results,
                  start_time: float) -> PlacementResult:
    """The search's result, from ``out/placements.jsonl``; written as ``placement.html`` and the
    best loop as ``loop_config.json``."""
    rows = read_placements(out / PLACEMENTS_NAME)
    text_rows = text.val.rows + text.test.rows
    correlations = tuple(correlate(rows, read_accuracies(results, rows))) if results is not None else ()
    result = PlacementResult(
        rows=tuple(rows), rank_by=rank_by, out=out, scored=search.scored, layer_passes=layer_passes,
        fit_evaluations=search.fit_evaluations, wall_s=time.perf_counter() - start_time,
        text={"val_tokens": text.val.tokens, "test_tokens": text.test.tokens, "val_documents": text.val.documents,
              "test_documents": text.test.documents, "rows": text_rows, "seq_len": seq_len},
        correlations=correlations,
    )
    from loopeval.tools.placement.report import write_html

    write_html(result, out / "placement.html", list(correlations))
    best = next(iter(result.ranked()), None)
    if best is not None:  # the best loop, whole, as a checkpoint's loop_config.json holds it
        (out / "loop_config.json").write_text(json.dumps(_candidate(best).loop().to_dict(), indent=2) + "\n")
    return result


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _candidate(row: PlacementRow) -> Candidate:
    return Candidate(row.start, row.width, row.times, row.operator, row.beta, row.mlp_loop)


class _Search:
    """The state one run of ``place`` shares across rounds."""

    def __init__(self, model, engine, scorer, batches, path: Path, done: dict, progress: bool, test_documents: int):
        from tqdm.auto import tqdm

        self.model, self.engine, self.scorer, self.batches, self.path = model, engine, scorer, batches, path
        self.rows = dict(done)
        self.base: dict[tuple, torch.Tensor] = {}  # the unlooped final hidden states of each test batch
        self.base_temperature = 1.0  # the unlooped model's T*: where each candidate's fit starts
        self.scored = self.fit_evaluations = 0
        # the bar counts whole candidates, written; its postfix the text batches of the round under way
        self.steps = sum(len(b) for b in self.batches.values())
        self.step = 0
        self.val_tokens = sum(int((labels[:, 1:] != -100).sum()) for _, _, labels, _ in batches["val"])
        self.test_documents = test_documents
        self.counts = resample_counts(test_documents)  # every candidate's interval uses the same resamples
        self.base_doc_nll_t = None
        self.bar = tqdm(total=0, unit="cand", disable=not progress, dynamic_ncols=True)

    def bar_add(self, n: int) -> None:
        self.bar.total += n
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()

    def say(self, message: str) -> None:
        self.bar.write(f"place: {message}", file=sys.stderr)

    def _advance(self, candidates: int) -> None:
        """One text batch of ``candidates`` candidates done (shown in the postfix; 0: not counted)."""
        if candidates:
            self.step = self.step % self.steps + 1
            self.bar.set_postfix_str(f"{candidates} in this round, text batch {self.step}/{self.steps}")

    def _fit(self, kept: list[torch.Tensor], targets: list[torch.Tensor]) -> float:
        fit = self.scorer.fit(kept, targets, self.base_temperature)
        self.fit_evaluations += fit.evaluations
        return fit.temperature

    def unlooped(self, candidate: Candidate) -> None:
        """The first row. Also keeps what every round needs: the unlooped model's final
        hidden states on the test batches (its logits, for the KL) and, in the prefix
        engine, each batch's embeddings."""
        new = candidate.key not in self.rows
        if new:
            self.bar_add(1)
        kept, targets = [], []
        for key, ids, labels, _ in self.batches["val"]:
            mask, y = self.scorer.positions(labels)
            kept.append(self.engine.unlooped(key, ids)[:, :-1][mask])
            targets.append(y)
            self._advance(int(new))
        self.base_temperature = self._fit(kept, targets)
        del kept
        test = TestSums(self.base_temperature, self.test_documents)
        for key, ids, labels, docs in self.batches["test"]:
            final = self.engine.unlooped(key, ids)
            self.base[key] = final
            mask, targets = self.scorer.positions(labels)
            for logits, y, d in zip(self.scorer.chunks(final, mask), targets.split(self.scorer.chunk),
                                    docs.split(self.scorer.chunk)):
                test.add(logits, y, None, d)
            self._advance(int(new))
        self.base_doc_nll_t = test.doc_nll_t.numpy()
        if new:
            self._write(candidate, test)

    def round(self, candidates: list[Candidate]) -> None:
        """Validation: keep each candidate's final hidden states at the scored positions,
        then fit its T*. Test: score every candidate at its T*, against the unlooped logits."""
        kept, targets = {c: [] for c in candidates}, []
        for key, ids, labels, _ in self.batches["val"]:
            mask, y = self.scorer.positions(labels)
            targets.append(y)
            for group, finals in self.engine.round(key, ids, candidates):
                for c, final in zip(group, finals):
                    kept[c].append(final[:, :-1][mask])
            self._advance(len(candidates))
        test = {c: TestSums(self._fit(kept.pop(c), targets), self.test_documents) for c in candidates}
        for key, ids, labels, docs in self.batches["test"]:
            mask, targets = self.scorer.positions(labels)
            for group, finals in self.engine.round(key, ids, candidates):
                # the unlooped logits of each chunk are computed once for the whole group
                chunks = [self.scorer.chunks(self.base[key], mask), *(self.scorer.chunks(f, mask) for f in finals)]
                for y, d, base, *logits in zip(targets.split(self.scorer.chunk), docs.split(self.scorer.chunk),
                                               *chunks):
                    reference = Reference.of(base)
                    for c, z in zip(group, logits):
                        test[c].add(z, y, reference, d)
            self._advance(len(candidates))
        for c in candidates:
            self._write(c, test[c])

    def _write(self, candidate: Candidate, test: TestSums) -> None:
        cost = loop_cost(self.model, candidate.spec)
        noise = ppl_interval(test.doc_nll_t.numpy(), test.doc_tokens.numpy(), self.base_doc_nll_t, counts=self.counts)
        row = PlacementRow(
            loop=None if candidate.spec is None else str(candidate.spec), operator=candidate.operator,
            beta=candidate.beta, times=candidate.times, width=candidate.width, start=candidate.start,
            mlp_loop=candidate.mlp_loop, passes=cost.passes, multiplier=cost.multiplier,
            ppl=math.exp(test.nll / test.tokens), ppl_t=math.exp(test.nll_t / test.tokens),
            temperature=test.temperature, kl=test.kl / test.tokens, tokens=test.tokens, tokens_val=self.val_tokens,
            ppl_t_ci=list(noise.confidence_interval), ratio_ci=list(noise.ratio_interval),
            test_documents=noise.documents,
        )
        append_placement(self.path, row)
        self.rows[row.key] = row
        self.scored += 1
        self.bar.update(1)
