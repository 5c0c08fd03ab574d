"""A calibration as a command's keys price it: its codec calls from ``--codec-costs`` files
(:mod:`gvq.predict.codec_costs`, e.g. measured on a GPU) and, with ``posting=false``, its messages posted for
free (a NIC or NCCL posts them: on a GPU cluster the host's CPU per message, which floors every ring here at
large N, is not paid).  One place, so ``project`` and ``utilization`` price alike."""
from __future__ import annotations

from gvq.predict import codec_costs
from gvq.predict import cost_model as M


def as_keys_price(m: M.Calibrated, args, names: list[str] | None = None) -> tuple[M.Calibrated, str]:
    """``m`` priced as ``args`` (:class:`gvq.predict.keys.PostingKeys` and the codec-cost keys) ask, and one
    line saying how."""
    m, how = codec_costs.apply(m, args, names)
    if args.posting:
        return m, how
    return M.Calibrated({**m.cal, "msg": [0.0, 0.0]}, m.struct), f"{how}; messages posted free"
