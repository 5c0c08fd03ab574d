"""BinGrad-b's histogram Lloyd fit read by pointer doubling equals the round-by-round loop it replaced,
on histograms chosen to make the loop walk far (one spike, two spikes far apart, sparse, empty rows)."""
from __future__ import annotations

import torch

from gvq.compressors._histogram import cumulative
from gvq.compressors.bingrad_b import lloyd_edge


def loop_edge(counts: torch.Tensor) -> torch.Tensor:
    """The reference: Lloyd's rounds one at a time until the edge stops moving (row by row, in float64)."""
    cum, mom = cumulative(counts.double())
    out = []
    for c, s in zip(cum.tolist(), mom.tolist()):
        n, total = c[-1], s[-1]
        edge = round(total / max(n, 1))
        for _ in range(10_000):
            lo = s[edge] / c[edge] if c[edge] > 0 else total / max(n, 1)
            hi = (total - s[edge]) / (n - c[edge]) if c[edge] < n else lo
            again = round((lo + hi) / 2)
            if again == edge:
                break
            edge = again
        out.append(edge)
    return torch.tensor(out)[:, None]


def histograms(bins: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    rows = [torch.randint(0, 5, (bins,), generator=g).float() for _ in range(20)]
    sparse = torch.zeros(bins)
    sparse[torch.randint(0, bins, (7,), generator=g)] = torch.randint(1, 9, (7,), generator=g).float()
    spikes = torch.zeros(bins)
    spikes[0], spikes[-1] = 1000, 1
    one = torch.zeros(bins)
    one[bins // 3] = 50
    tail = torch.zeros(bins)
    tail[0], tail[1:] = 500, 1.0
    skewed = torch.distributions.Exponential(0.05).sample((bins,)).floor()
    return torch.stack([*rows, sparse, spikes, spikes.flip(0), one, tail, tail.flip(0), skewed, torch.zeros(bins)])


def test_doubling_lands_where_the_rounds_stop():
    for bins in (8, 512, 1024):
        counts = histograms(bins)
        got = lloyd_edge(counts)
        assert torch.equal(got, loop_edge(counts)), bins
        assert got.shape == (counts.shape[0], 1) and int(got.min()) >= 0 and int(got.max()) <= bins


def test_a_walk_of_many_rounds_is_followed_to_its_end():
    """Counts growing geometrically to the right: Lloyd from the mean creeps one edge a round, so a
    fixed round budget short of bins would stop early; doubling must not."""
    bins = 256
    counts = (1.04 ** torch.arange(bins, dtype=torch.float64))[None]
    ref = loop_edge(counts)
    cum, mom = cumulative(counts)
    start = round(float(mom[0, -1] / cum[0, -1]))
    assert abs(int(ref) - start) > 3        # the setting really walks
    assert torch.equal(lloyd_edge(counts), ref)
