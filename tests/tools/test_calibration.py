"""The block-by-block vocabulary-wide sums of placement scoring against the same sums over
whole rows in double precision, with blocks that split the rows unevenly."""

import pytest
import torch

from loopeval.tools.placement import calibration
from loopeval.tools.placement.calibration import FitChunk, Reference, slope_and_curvature


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(calibration, "BLOCK_ELEMENTS", 3 * 7)  # 3 rows of 7: blocks of 3, 3, 3, 1


def test_blocked_sums_equal_whole_row_sums_in_double_precision(small_blocks):
    g = torch.Generator().manual_seed(0)
    z, base = 4 * torch.randn(10, 7, generator=g), 4 * torch.randn(10, 7, generator=g)
    y, docs = torch.randint(0, 7, (10,), generator=g), torch.tensor([0, 0, 1, 1, 1, 2, 2, 2, 2, 0])
    temperature, b = 1.7, 0.6

    sums = calibration.TestSums(temperature, documents=3)
    sums.add(z, y, Reference.of(base), docs)
    zd, bd = z.double(), base.double()
    nll_t = torch.logsumexp(zd / temperature, -1) - zd.gather(-1, y[:, None])[:, 0] / temperature
    p = torch.softmax(bd, -1)
    kl = (p * (torch.log_softmax(bd, -1) - torch.log_softmax(zd, -1))).sum()
    assert sums.nll == pytest.approx(float((torch.logsumexp(zd, -1) - zd.gather(-1, y[:, None])[:, 0]).sum()), rel=1e-6)
    assert sums.nll_t == pytest.approx(float(nll_t.sum()), rel=1e-6)
    assert sums.kl == pytest.approx(float(kl), rel=1e-5)
    assert sums.doc_nll_t.tolist() == pytest.approx(torch.zeros(3, dtype=torch.float64).index_add_(0, docs, nll_t).tolist(),
                                                    rel=1e-6)

    q = torch.softmax(b * zd, -1)
    m1, m2 = (q * zd).sum(-1), (q * zd * zd).sum(-1)
    slope, curvature = slope_and_curvature([FitChunk.of(z, y)], b)
    assert slope == pytest.approx(float((m1 - zd.gather(-1, y[:, None])[:, 0]).mean()), rel=1e-5)
    assert curvature == pytest.approx(float((m2 - m1 * m1).mean()), rel=1e-5)


def test_the_unlooped_rows_have_no_kl_and_temperature_one_needs_one_sum(small_blocks):
    z = torch.randn(5, 7)
    y = torch.randint(0, 7, (5,))
    sums = calibration.TestSums(1.0)
    sums.add(z, y, None)
    assert sums.kl == 0 and sums.nll_t == pytest.approx(sums.nll, rel=1e-12)
