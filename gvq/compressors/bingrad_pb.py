"""BinGrad-pb, the ORQ paper's partially biased binary quantizer (Eq. 14-15), per bucket.

See docs/design.md#gvqcompressorsbingrad_pbpy for how it works and why.
"""
from __future__ import annotations

import torch

from gvq.compressors import _fused as fused
from gvq.compressors import _triton
from gvq.compressors._histogram import HistogramQuantizer, bin_counts, bins_for, cumulative, grid_coords


def pb_level(rows: torch.Tensor) -> torch.Tensor:
    """b1 (m, 1) minimising |b1 - mean(|v| * [|v| >= b1])| per bucket."""
    a = rows.abs().sort(dim=1, descending=True).values
    n = a.shape[1]
    fit = a.double().cumsum(dim=1) / n                        # S_k / n: the root on piece k
    below = torch.nn.functional.pad(a[:, 1:], (0, 1)).double()  # a_{k+1}, a_{n+1} = 0
    best = torch.minimum(torch.maximum(fit, below), a.double())
    k = (best - fit).abs().argmin(dim=1, keepdim=True)
    return best.gather(1, k).float()


def pb_level_grid(q, rows: torch.Tensor, inv_count=None, weights=None) -> torch.Tensor:
    """b1 (m, 1) from a histogram of |v| over [0, max|v|] (``q``: the quantizer, for scratch): the root of
    f(b) = b - sum_{|v| >= b} |v| / n, increasing, interpolated inside the bin where it turns >= 0, then
    one exact step on the values (``pb_refine``).  A padded batch: ``inv_count`` (m, 1) is 1 / n a row,
    ``weights`` 0 on padding."""
    m, n = rows.shape
    bins = bins_for(n)
    t = torch.abs(rows, out=q.scratch_like("y", rows))
    top = t.amax(dim=1, keepdim=True)
    idx = q.scratch_like("idx", rows, torch.int32)
    sc = grid_coords(t, None, top, bins, t, idx, q.health)             # t = |v| * sc, in bin units
    mom = cumulative(bin_counts(idx, m, bins, weights), moments_only=True)
    edge = torch.arange(bins + 1, dtype=mom.dtype, device=rows.device)
    f = torch.sub(mom, mom[:, -1:]).mul_(1.0 / n if inv_count is None else inv_count).add_(edge)   # f at every edge
    e = torch.searchsorted(f, torch.zeros(m, 1, dtype=f.dtype, device=f.device)).clamp_(1, bins)
    f0, f1 = f.gather(1, e - 1), f.gather(1, e)
    b_t = (e - 1) + (-f0 / torch.where(f1 > f0, f1 - f0, 1.0)).clamp_(0.0, 1.0)
    return pb_refine(q, rows, t, b_t.float(), sc, top, inv_count, weights)


def pb_refine(q, rows: torch.Tensor, t: torch.Tensor, b: torch.Tensor, sc: torch.Tensor, top: torch.Tensor,
              inv_count=None, weights=None) -> torch.Tensor:
    """One exact step from the estimate b (t units, t = |rows| sc): r = sum_{t >= b} t / n is the root of
    f if no value lies in [b, r) (it holds on that piece), else the minimiser is at a jump of f, at the
    first value above b: b1 = min(r, that value).  Exact for constant and sparse buckets.  The sum is
    taken over |v| and scaled once: exact in float32 on a grid of values (the t are not), so the Triton
    path, which sums in another order, agrees bitwise there.  Float 0/1 masks: bool ops are slower.
    (Padding repeats a real value: the minimum ignores it, the sum weighs it 0.)"""
    below = torch.lt(t, b, out=q.scratch_like("below", t))
    first_above = torch.add(t, below, alpha=2.0 ** 30, out=q.scratch_like("z", t)).amin(dim=1, keepdim=True)
    a = torch.abs(rows, out=q.scratch_like("z", t))
    aw = a if weights is None else a.mul_(weights)
    r = (aw.sum(dim=1, keepdim=True) - below.mul_(aw).sum(dim=1, keepdim=True)).mul_(sc)
    r = r / t.shape[1] if inv_count is None else r * inv_count
    b1 = torch.minimum(r, first_above)
    return torch.where(sc > 0, b1 / sc, top)                  # back from bin units (top: an all-zero bucket)


class BinGradPB(HistogramQuantizer):
    name = "bingrad_pb"
    stochastic = True
    levels = 2
    n_side = 1
    dither_base = 0.5              # code 1 <=> +b1, with probability (v + b1) / 2b1
    absolute = True                # the grid spans [0, max|v|]

    def __init__(self, bucket: int | None = 2048,   # larger => fewer side floats, one b1 for more values
                 clip: float | None = None,       # c: clip to +-c*RMS first (rarely useful: b1 clips)
                 fit: str = "histogram",            # histogram (no sort, faster) | sorted (exact b1)
                 kernels: str = "auto"):           # auto | triton | torch (gvq/compressors/_kernels.py)
        super().__init__(bucket, clip, fit, kernels)
        self.side_flags_nonfinite = fit == "histogram"   # its grid raises on NaN/Inf: no separate pass

    def fused_kernel(self):
        return fused.encode_bingrad_pb

    def triton_spec(self):
        """The Triton kernels fit b1 on the histogram (no clipping); decoded as code * 2 b1 - b1."""
        if self.fit != "histogram" or self.clip:
            return None
        return _triton.FitSpec("bingrad_pb_fit", bins_for, binary=True, mult=2.0)

    def _encode_histogram(self, rows, inv_count=None, weights=None):
        return self._round_at(rows, pb_level_grid(self, rows, inv_count, weights))

    def _encode_sorted(self, rows):
        return self._round_at(rows, pb_level(rows))

    def _round_at(self, rows, b1):
        """Eq. 14 with the level b1 (m, 1): clip to +-b1, round at random between them."""
        inv = torch.where(b1 > 0, 0.5 / b1, 0.0)
        y = torch.mul(rows, inv, out=self.scratch_like("y", rows)).clamp_(-0.5, 0.5)   # Eq. 14 clip
        return self.dither_floor_(y), b1

    def _decode(self, codes, side, out):
        torch.mul(codes, 2 * side, out=out).sub_(side)
