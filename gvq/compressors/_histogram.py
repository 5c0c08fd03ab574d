"""Sort-free level fitting: every bucket's values counted on a uniform grid of ``bins`` bins between two
per-bucket bounds (its min and max, or 0 and max|v|), levels solved on the counts and placed on bin edges.

See docs/design.md#gvqcompressors_histogrampy for how it works and why.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from gvq.compressors._bucketing import BucketQuantizer, check_finite
from gvq.compressors._packing import digit_dtype
from gvq.compressors.base import check_choice
from gvq.compressors._kernels import HOST

FITS = ("histogram", "sorted")


def check_fit(fit) -> str:
    return check_choice("fit", fit, FITS, "histogram: fast, levels within one bin of sorted's; sorted: the "
                        "paper's solution on the sorted values, slower (a sort per bucket)")


def bins_for(n: int) -> int:
    """Bins per bucket of ``n`` values: 1-2 values a bin (a power of two, at least 512 or n, at most
    8192).  More bins => levels closer to the sorted reference's, larger tables per call (n/2 bins: the
    error close to sorted's at little extra compress time)."""
    return max(min(512, n), min(8192, 1 << max(0, (n - 1).bit_length() - 1)))


def grid_coords(rows: Tensor, lo: Tensor | None, hi: Tensor, bins: int, t_out: Tensor, idx_out: Tensor,
                health) -> Tensor:
    """t = (rows - lo) * sc into ``t_out`` (float32; ``lo`` None: 0, no subtraction) and the flat bin
    index of every value into ``idx_out`` (int32: floor(t) + row * bins, for one count over all buckets).
    sc = bins * (1 - 2**-20) / (hi - lo): the max lands just below ``bins`` (float32 round-off is ~2**-23).
    A bucket with hi == lo (or a range too small to scale) has sc = 0: everything in bin 0.  Returns sc
    (m, 1), the scale levels are mapped back with.  A NaN/Inf value makes a bound non-finite (min/max
    propagate them): the span goes to ``health`` (the quantizer's watch, read once an iteration), and the
    indices are clamped into the grid so a garbage value still counts inside its bucket's histogram."""
    span = hi if lo is None else hi - lo
    health.note(span)
    sc = (bins * (1 - 2.0 ** -20)) / span
    sc = torch.where(torch.isfinite(sc) & (span > 0), sc, 0.0)
    t = torch.mul(rows, sc, out=t_out) if lo is None else torch.sub(rows, lo, out=t_out).mul_(sc)
    idx_out.copy_(t).clamp_(0, bins - 1)                        # t >= 0: the cast floors
    idx_out.add_(_row_offsets(rows.shape[0], bins, rows.device))
    return sc


def _row_offsets(m: int, bins: int, device) -> Tensor:
    """(m, 1) int32: row * bins, each row's first bin in the flat counts."""
    return torch.arange(0, m * bins, bins, dtype=torch.int32, device=device)[:, None]


def bin_counts(idx: Tensor, m: int, bins: int, weights: Tensor | None = None) -> Tensor:
    """(m, bins) counts of the flat bin indices (``weights``: each index's, 0 for padding; else 1),
    float32 where every prefix sum the fits take is an exact float32 (counts times bin centres below
    2**23), float64 otherwise.  A scatter-add into a fixed-size tensor, not ``bincount`` (whose CUDA
    kernel reads the largest index back to the host)."""
    dtype = torch.float32 if idx.shape[-1] * bins < 1 << 23 else torch.float64
    counts = torch.zeros(m * bins, dtype=dtype, device=idx.device)
    flat = idx.reshape(-1)
    if weights is None:
        weights = torch.ones((), dtype=dtype, device=idx.device).expand(flat.shape)
    return counts.index_add_(0, flat, weights.reshape(-1).to(dtype)).view(m, bins)


def cumulative(counts: Tensor, moments_only: bool = False):
    """Prefix counts and prefix sums of t (bin centres times counts), (m, bins + 1) each in counts'
    dtype, a leading 0: counts / sums of the values below each edge (``moments_only``: the sums)."""
    m, bins = counts.shape
    centre = torch.arange(bins, dtype=counts.dtype, device=counts.device) + 0.5
    mom = torch.empty(m, bins + 1, dtype=counts.dtype, device=counts.device)
    mom[:, 0] = 0
    torch.cumsum(counts * centre, dim=1, out=mom[:, 1:])
    if moments_only:
        return mom
    cum = torch.empty_like(mom)
    cum[:, 0] = 0
    torch.cumsum(counts, dim=1, out=cum[:, 1:])
    return cum, mom


def rank_edge(cum: Tensor, counts: Tensor, rank: Tensor) -> Tensor:
    """Edge (float) at which the value of 0-based sorted position ``rank`` (m, q) sits: its bin, plus
    its place among the bin's values spread evenly over it."""
    bins = counts.shape[1]
    j = (torch.searchsorted(cum, rank, right=True) - 1).clamp_(0, bins - 1)
    c = counts.gather(1, j)
    frac = (rank - cum.gather(1, j) + 0.5) / torch.where(c > 0, c, 1.0)
    return j + frac.clamp_(0.0, 1.0)


def edge_values(edges: Tensor, lo: Tensor, hi: Tensor, sc: Tensor, bins: int) -> Tensor:
    """Level values (m, q) float32 of integer edges, lo + e / sc (the grid's own map); edge 0 is exactly
    lo, edge ``bins`` exactly hi (2**-20 of the range inside the grid's last edge)."""
    vals = torch.addcmul(lo, edges.to(lo.dtype), torch.where(sc > 0, 1.0 / sc, 0.0))
    vals = torch.where(edges <= 0, lo, vals)
    return torch.where(edges >= bins, hi, vals)


def rounding_table(edges: Tensor, bins: int, base: float = 0.0) -> Tensor:
    """For levels on edges (m, s) (nondecreasing, first 0, last ``bins``): per bin the (C, A) with
    y = A * t + C = k + (t - e_k) / (e_k+1 - e_k) + base, k the interval holding the bin, packed as one
    int64 a bin (m * bins,) so a value's pair is one ``index_select`` (``round_on_grid``).  One pass over
    the table: interval k's pair repeated over its e_k+1 - e_k bins (empty intervals: zero times)."""
    m, s = edges.shape
    e_lo = edges[:, :-1].float()
    width = edges[:, 1:] - edges[:, :-1]
    a = torch.where(width > 0, 1.0 / width.float(), 0.0)
    c = torch.arange(s - 1, dtype=torch.float32, device=edges.device) + base - e_lo * a
    pairs = torch.stack([c, a], dim=2).view(torch.int64).reshape(-1)
    return torch.repeat_interleave(pairs, width.reshape(-1), output_size=m * bins)


def round_on_grid(t: Tensor, idx: Tensor, table: Tensor, pairs: Tensor) -> Tensor:
    """y = A * t + C per value from the packed table, written over t (``pairs``: an int64 scratch of
    t's size)."""
    torch.index_select(table, 0, idx.view(-1), out=pairs.view(-1))
    ca = pairs.view(torch.float32).view(*t.shape, 2)
    return torch.addcmul(ca[..., 0], t, ca[..., 1], out=t)


def encode_on_grid(q, rows: Tensor, fit_edges, weights: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """ORQ's and Linear's encode: bounds, grid, counts, integer level edges ``fit_edges(counts)`` (m, s),
    Eq. (7) rounding by table; returns (codes, level values (m, s)).  ``q``: the BucketQuantizer (its
    scratch buffers and dither); ``weights``: 0 on a padded batch's padding (it counts for nothing)."""
    m, n = rows.shape
    bins = bins_for(n)
    lo, hi = torch.aminmax(rows, dim=1, keepdim=True)
    idx, t = q.scratch_like("idx", rows, torch.int32), q.scratch_like("y", rows)
    sc = grid_coords(rows, lo, hi, bins, t, idx, q.health)
    edges = fit_edges(bin_counts(idx, m, bins, weights))
    table = rounding_table(edges, bins, q.dither_shift)
    y = round_on_grid(t, idx, table, q.scratch_like("pairs", rows, torch.int64))
    return q.dither_floor_(y, shifted=True), edge_values(edges, lo, hi, sc, bins)


def fused_serves(q, rows) -> bool:
    """True where a fused kernel (:mod:`gvq.compressors._fused`) encodes quantizer ``q``'s buckets
    ``rows``: ``fit: histogram``, float32 contiguous host data."""
    return (q.fit == "histogram" and q.path(rows.device) == HOST
            and rows.dtype == torch.float32 and rows.is_contiguous())


def encode_fused(q, rows: Tensor, kernel, absolute: bool = False) -> tuple[Tensor, Tensor]:
    """(codes, side) of ``q``'s buckets ``rows`` (m, n) by ``kernel``, as ``q._encode`` returns them.
    Each bucket's bounds come from torch's vectorised min and max (numba's loops do not vectorise them),
    (min, max) or, ``absolute``, (0, max|v|); a NaN/Inf makes a bound non-finite and raises
    (``check_finite``) before a kernel could cast it to a bin.  Uniforms from q's lanes (stochastic ones)."""
    m, n = rows.shape
    bounds = torch.empty(m, 2, dtype=torch.float32, device=rows.device)
    if absolute:
        bounds[:, 0] = 0
        torch.maximum(rows.amax(dim=1), rows.amin(dim=1).neg_(), out=bounds[:, 1])
    else:
        torch.amin(rows, dim=1, out=bounds[:, 0])
        torch.amax(rows, dim=1, out=bounds[:, 1])
    if not bool(torch.isfinite(bounds).all()):
        check_finite(rows, q.name)
    codes = q.scratch_like("codes", rows, digit_dtype(q.levels))
    side = torch.empty(m, q.n_side, dtype=torch.float32, device=rows.device)
    u = (q.lanes.uniform16(rows.numel(), rows.device, q.gen) if q.stochastic
         else torch.empty(0, dtype=torch.int16, device=rows.device))
    kernel(rows.detach().numpy(), bounds.numpy(), bins_for(n), q.dither_shift, u.numpy(), codes.numpy(),
           side.numpy())
    return codes, side


class HistogramQuantizer(BucketQuantizer):
    """Base of the quantizers that fit their levels to each bucket (Linear-s, ORQ-s, BinGrad-b,
    BinGrad-pb): the one encode dispatch over three ways to the same fit, the fused host kernel
    (``fit: histogram`` on float32 host data, :func:`encode_fused`), the torch histogram ops (CUDA,
    meta, ``kernels=torch``) and the sorted reference (``fit: sorted``).  A subclass supplies its kernel
    (``fused_kernel``) and its two torch fits (``_encode_histogram``, ``_encode_sorted``), each
    returning ``(codes, side)`` as ``_encode`` does."""

    absolute: bool = False     # the fused kernel's grid: (min, max) of a bucket, or (0, max|v|)
    pad_repeat = True          # padding repeats a real value, weighted 0: bounds and counts stay real

    def __init__(self, bucket: int | None, clip: float | None, fit: str, kernels: str = "auto"):
        super().__init__(bucket, clip, kernels)
        self.fit = check_fit(fit)

    @property
    def pads(self) -> bool:
        """The histogram fits take a padded batch (one batch a call off the host); a sort would not."""
        return self.fit == "histogram"

    def encode_padded(self, rows, inv_count, weights=None):
        return self._encode_histogram(rows, inv_count, weights)

    def fused_kernel(self):
        """The ``_fused`` entry point that encodes these buckets, or None where it has none."""
        raise NotImplementedError

    def _encode(self, rows):
        kernel = self.fused_kernel()
        if kernel is not None and fused_serves(self, rows):
            return encode_fused(self, rows, kernel, absolute=self.absolute)
        return self._encode_sorted(rows) if self.fit == "sorted" else self._encode_histogram(rows)

    def _encode_histogram(self, rows, inv_count=None, weights=None):
        """(codes, side) of buckets ``rows``; on a padded batch ``inv_count`` (m, 1) is 1 / real values
        a row and ``weights`` 0 on padding (None where no row is padded)."""
        raise NotImplementedError

    def _encode_sorted(self, rows):
        raise NotImplementedError


class LevelFit(NamedTuple):
    """A level quantizer's fit, three ways: the ``_fused`` kernel, the levels (m, s) of sorted buckets
    (m, n) and the integer edges (m, s) of bucket histograms (m, bins), the last two given s."""
    kernel: Callable
    sorted_levels: Callable[[Tensor, int], Tensor]
    grid_edges: Callable[[Tensor, int], Tensor]


class LevelQuantizer(HistogramQuantizer):
    """s levels per bucket sent as its side floats, each value rounded at random to a neighbouring one
    (Eq. 7), decoded by lookup (Linear-s, ORQ-s).  A subclass supplies its fit only (``level_fit``)."""

    side_flags_nonfinite = True    # min and max are levels: NaN/Inf propagate into them
    level_fit: LevelFit

    def fused_kernel(self):
        return self.level_fit.kernel

    def _encode_histogram(self, rows, inv_count=None, weights=None):
        return encode_on_grid(self, rows, self._grid_edges, weights)

    def _grid_edges(self, counts: Tensor) -> Tensor:
        return self.level_fit.grid_edges(counts, self.levels)

    def _encode_sorted(self, rows):
        levels = self.level_fit.sorted_levels(rows.sort(dim=1).values, self.levels)
        return self.round_to_levels(rows, levels), levels

    def _decode(self, codes, side, out):
        torch.gather(side, 1, codes.long(), out=out)
