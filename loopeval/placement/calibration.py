"""Calibrated perplexity: NLL sums that stream over text, the fitted temperature, KL.

The paper scores a candidate by "perplexity after temperature scaling, which divides
each candidate's logits by the one temperature that minimises its loss on a validation
split" (section 3): PPL_T = exp NLL_test(T*) with T* = argmin_T NLL_val(T).

NLL_val is convex in the inverse temperature b = 1/T (a log-sum-exp of functions linear
in b, minus a linear term), with derivatives d/db = E_p[z] - z_y and
d2/db2 = Var_p[z] under p = softmax(b z). A search cannot keep every candidate's
validation logits, so ``ValidationSums`` accumulates NLL_val and both derivatives at
``NODES`` log-spaced values of b across ``TEMPERATURE_BOUNDS`` while the text streams by;
``fit_temperature`` then takes the bracket where the derivative changes sign and
minimises the quintic Hermite interpolant there, which matches both derivatives at
both ends (a bounded 1-D minimisation; the tests check it against a brute-force grid
on the exact loss). Test sums (plain NLL, NLL at T*, KL) are plain sums.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

TEMPERATURE_BOUNDS = (0.05, 20.0)
"""The bounded range of T* (a candidate whose best temperature lies outside gets the bound)."""

NODES = 17
"""Inverse temperatures at which NLL_val and its derivatives are accumulated (log-spaced,
45% apart). The exponentials at the nodes are most of the scoring's cost; with both
derivatives matched at each end of the bracket, the interpolated T* is within 1e-4
(relative) of the exact argmin in our checks."""

INVERSE_TEMPERATURES = np.geomspace(1.0 / TEMPERATURE_BOUNDS[1], 1.0 / TEMPERATURE_BOUNDS[0], NODES)


@dataclass
class ValidationSums:
    """Sums over validation tokens of NLL(b), dNLL/db and d2NLL/db2 at each node."""

    values: np.ndarray = field(default_factory=lambda: np.zeros((NODES, 3)))
    tokens: int = 0

    def add(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """``logits`` (n, V) and ``labels`` (n,) of scored positions only."""
        z = logits.float()
        z = z - z.amax(-1, keepdim=True)  # max 0: exp(b z) cannot overflow, and the moments stay small
        zy = z.gather(-1, labels[:, None])[:, 0]
        z2 = z * z
        for b in INVERSE_TEMPERATURES:
            e = torch.exp(float(b) * z)
            s0, s1, s2 = e.sum(-1), (e * z).sum(-1), (e * z2).sum(-1)
            m1 = s1 / s0
            terms = torch.stack([s0.log() - float(b) * zy, m1 - zy, (s2 / s0 - m1 * m1).clamp_min(0)])
            self.values[INVERSE_TEMPERATURES == b] += terms.double().sum(-1).cpu().numpy()
        self.tokens += int(labels.numel())


def fit_temperature(sums: ValidationSums) -> float:
    """T* = argmin over ``TEMPERATURE_BOUNDS`` of NLL_val(T), from the accumulated sums."""
    from scipy.interpolate import BPoly
    from scipy.optimize import brentq

    if sums.tokens == 0:
        raise ValueError("fit_temperature: no validation tokens were accumulated")
    b, v = INVERSE_TEMPERATURES, sums.values / sums.tokens
    slope = v[:, 1]
    if slope[0] >= 0:  # increasing everywhere: the flattest allowed distribution
        return float(1.0 / b[0])
    if slope[-1] <= 0:
        return float(1.0 / b[-1])
    i = int(np.argmax(slope >= 0))
    if slope[i] == 0:
        return float(1.0 / b[i])
    poly = BPoly.from_derivatives([b[i - 1], b[i]], [v[i - 1], v[i]])
    best = brentq(poly.derivative(), b[i - 1], b[i], xtol=1e-12 * b[i])
    return float(1.0 / best)


@dataclass
class TestSums:
    """Sums over test tokens of the plain NLL, the NLL at T*, and KL(unlooped || candidate)."""

    temperature: float
    nll: float = 0.0
    nll_t: float = 0.0
    kl: float = 0.0
    tokens: int = 0

    def add(self, logits: torch.Tensor, labels: torch.Tensor, base_logprobs: torch.Tensor) -> None:
        """``logits`` (n, V), ``labels`` (n,) and the unlooped model's log-probabilities (n, V)."""
        z = logits.float()
        logp = torch.log_softmax(z, -1)
        logp_t = torch.log_softmax(z / self.temperature, -1)
        index = labels[:, None]
        self.nll -= float(logp.gather(-1, index).double().sum())
        self.nll_t -= float(logp_t.gather(-1, index).double().sum())
        self.kl += float((base_logprobs.exp() * (base_logprobs - logp)).sum(-1).double().sum())
        self.tokens += int(labels.numel())
