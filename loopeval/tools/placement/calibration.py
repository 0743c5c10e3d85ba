"""Calibrated perplexity: the fitted temperature T*, and the test sums (NLL, NLL at T*, KL).

The paper scores a candidate by "perplexity after temperature scaling, which divides
each candidate's logits by the one temperature that minimises its loss on a validation
split" (section 3): PPL_T = exp NLL_test(T*) with T* = argmin_T NLL_val(T).

NLL_val is convex in the inverse temperature b = 1/T (a log-sum-exp of functions linear
in b, minus a linear term), with derivatives d/db = mean(E_p[z] - z_y) and
d2/db2 = mean(Var_p[z]) under p = softmax(b z). ``fit_temperature`` minimises it over
``TEMPERATURE_BOUNDS`` exactly: Newton's method in log b, warm-started, kept inside a
bracket that every evaluation narrows (bisection when a step would leave it), to a step
of ``TOLERANCE``. Each evaluation is one pass over the validation logits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

TEMPERATURE_BOUNDS = (0.05, 20.0)
"""The bounded range of T* (a candidate whose best temperature lies outside gets the bound)."""

TOLERANCE = 1e-7
"""Newton stops when a step changes log T by less than this."""

_MAX_EVALUATIONS = 100


BLOCK_ELEMENTS = 1 << 20
"""Logits one vocabulary-wide step handles at once (4 MiB of float32): a block stays in
cache between the passes over it, and its scratch memory is reused, not page-faulted."""


def _blocks(rows: int, vocab: int) -> list[slice]:
    step = max(1, BLOCK_ELEMENTS // vocab)
    return [slice(i, min(i + step, rows)) for i in range(0, rows, step)]


def _scratch(z: torch.Tensor) -> torch.Tensor:
    """Scratch memory for one block of ``z``'s rows."""
    return torch.empty(min(z.shape[0], max(1, BLOCK_ELEMENTS // z.shape[1])), z.shape[1], device=z.device)


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise dot products of two (n, V) tensors."""
    return torch.bmm(a.unsqueeze(1), b.unsqueeze(2))[:, 0, 0]


@dataclass(frozen=True)
class FitChunk:
    """A chunk of validation logits as every Newton step reads it: shifted by their row
    maximum (shift-invariant; keeps the moments small) and the label's logit."""

    z: torch.Tensor
    target: torch.Tensor

    @classmethod
    def of(cls, logits: torch.Tensor, labels: torch.Tensor) -> FitChunk:
        z = logits.float()
        z = z - z.amax(-1, keepdim=True)
        return cls(z, z.gather(-1, labels[:, None])[:, 0])


def slope_and_curvature(chunks: Iterable[tuple[torch.Tensor, torch.Tensor] | FitChunk], b: float) -> tuple[float, float]:
    """Mean d/db and d2/db2 of the NLL at inverse temperature ``b`` over ``(logits, labels)``
    chunks (or ``FitChunk``s prepared once for many steps)."""
    slope = curvature = 0.0
    n = 0
    for chunk in chunks:
        c = chunk if isinstance(chunk, FitChunk) else FitChunk.of(*chunk)
        e, ez = _scratch(c.z), _scratch(c.z)
        m1, m2 = torch.empty_like(c.target), torch.empty_like(c.target)
        for rows in _blocks(*c.z.shape):
            z, eb, ezb = c.z[rows], e[:rows.stop - rows.start], ez[:rows.stop - rows.start]
            total = torch.mul(z, b, out=eb).exp_().sum(-1)  # z <= 0 with a 0 in every row: no overflow, a sum >= 1
            torch.mul(eb, z, out=ezb)
            m1[rows] = ezb.sum(-1) / total  # E_p[z]
            m2[rows] = _dot(ezb, z) / total  # E_p[z^2]
        slope += float((m1 - c.target).double().sum())
        curvature += float((m2 - m1 * m1).clamp_min(0).double().sum())
        n += c.target.numel()
    return slope / n, curvature / n


@dataclass(frozen=True)
class TemperatureFit:
    temperature: float
    evaluations: int  # passes over the validation logits


def fit_temperature(derivatives: Callable[[float], tuple[float, float]], *, start: float = 1.0) -> TemperatureFit:
    """T* = argmin over ``TEMPERATURE_BOUNDS`` of NLL_val(T), given ``derivatives(b)`` =
    (dNLL/db, d2NLL/db2) at b = 1/T; Newton in u = log b from T = ``start``."""
    u_min, u_max = -math.log(TEMPERATURE_BOUNDS[1]), -math.log(TEMPERATURE_BOUNDS[0])
    lo, hi = u_min, u_max  # the minimiser lies in [lo, hi]
    u, evaluated = min(max(-math.log(start), u_min), u_max), set()
    for evaluation in range(1, _MAX_EVALUATIONS + 1):
        b = math.exp(u)
        slope_b, curvature_b = derivatives(b)
        evaluated.add(u)
        slope, curvature = b * slope_b, b * b * curvature_b + b * slope_b  # d/du, d2/du2
        if slope == 0:
            return TemperatureFit(1.0 / b, evaluation)
        lo, hi = (lo, u) if slope > 0 else (u, hi)
        if hi == u_min or lo == u_max:  # still sloping at a bound: the bound is the minimiser
            return TemperatureFit(1.0 / b, evaluation)
        step = u - slope / curvature if curvature > 0 else math.nan
        if not lo < step < hi:  # try the bound Newton points past, once; else bisect
            edge = u_min if slope > 0 else u_max
            step = edge if edge in (lo, hi) and edge not in evaluated else 0.5 * (lo + hi)
        if abs(step - u) <= TOLERANCE:
            return TemperatureFit(math.exp(-step), evaluation)
        u = step
    raise RuntimeError(f"fit_temperature: no convergence in {_MAX_EVALUATIONS} evaluations (T = {math.exp(-u)})")


def _log_sum_exps(z: torch.Tensor, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of ``z`` (n, V): log sum exp z and log sum exp z/T, block by block."""
    scaled = temperature != 1.0
    lse, lse_t = z.new_empty(z.shape[0]), z.new_empty(z.shape[0]) if scaled else None
    e, f = _scratch(z), _scratch(z) if scaled else None
    for rows in _blocks(*z.shape):
        eb = e[:rows.stop - rows.start]
        top = z[rows].amax(-1)
        torch.sub(z[rows], top[:, None], out=eb)  # <= 0: no overflow
        if scaled:
            lse_t[rows] = top / temperature + torch.div(eb, temperature, out=f[:len(eb)]).exp_().sum(-1).log()
        lse[rows] = top + eb.exp_().sum(-1).log()
    return lse, lse_t if scaled else lse


@dataclass(frozen=True)
class Reference:
    """The unlooped model's distribution on a chunk of test positions, prepared once for
    every candidate scored against it: probabilities ``p`` (n, V) and sum_v p log p (n,)."""

    p: torch.Tensor
    p_log_p: torch.Tensor

    @classmethod
    def of(cls, logits: torch.Tensor) -> Reference:
        """With lse = log sum exp z: p = exp(z - lse), sum p log p = p.z - lse."""
        z = logits.float()
        lse, _ = _log_sum_exps(z)
        p = torch.sub(z, lse[:, None]).exp_()
        return cls(p, _dot(p, z) - lse)


@dataclass
class TestSums:
    """Sums over test tokens of the plain NLL, the NLL at T*, and KL(unlooped || candidate);
    with ``documents``, also the NLL at T* and the tokens of each test document."""

    temperature: float
    documents: int = 0
    nll: float = 0.0
    nll_t: float = 0.0
    kl: float = 0.0
    tokens: int = 0

    def __post_init__(self):
        self.doc_nll_t = torch.zeros(self.documents, dtype=torch.float64)
        self.doc_tokens = torch.zeros(self.documents, dtype=torch.float64)

    def add(self, logits: torch.Tensor, labels: torch.Tensor, reference: Reference | None,
            docs: torch.Tensor | None = None) -> None:
        """``logits`` (n, V), ``labels`` (n,), the unlooped model's ``Reference`` on the same
        positions (None: these are the unlooped logits, KL 0) and each label's test document
        (n,). With log q = z - lse(z):
        NLL = lse(z) - z_y, NLL_T = lse(z/T) - z_y/T, KL = sum p log p - p.z + lse(z)."""
        z = logits.float()
        lse, lse_t = _log_sum_exps(z, self.temperature)
        z_y = z.gather(-1, labels[:, None])[:, 0]
        self.nll += float((lse - z_y).double().sum())
        nll_t = (lse_t - z_y / self.temperature).double()
        self.nll_t += float(nll_t.sum())
        if docs is not None:
            self.doc_nll_t.index_add_(0, docs.cpu(), nll_t.cpu())
            self.doc_tokens.index_add_(0, docs.cpu(), torch.ones(len(docs), dtype=torch.float64))
        if reference is not None:
            self.kl += float((reference.p_log_p - _dot(reference.p, z) + lse).double().sum())
        self.tokens += int(labels.numel())
