"""One iteration's row from every rank's statistics, each column reduced over the ranks as
:mod:`gvq.schema.columns` declares it (max, mean, rank 0's, at the rank that ended backward last, the
spread of ``exposed_s``); a key no column declares stays this rank's."""
from __future__ import annotations

import torch
import torch.distributed as dist

from gvq.run.guards import comm_device
from gvq.schema import columns

#: the row's columns summed into summary.json's totals (every run's slowest-rank columns)
TIME_KEYS = columns.reduced("max", columns.BASE + ("skipped",))


def reduce_stats(stats: dict, max_keys=(), mean_keys=()) -> dict:
    """``stats`` with ``max_keys`` maxed and ``mean_keys`` averaged over ranks (a collective: every rank
    calls it with the same keys); other keys stay this rank's."""
    dev = comm_device()
    top = torch.tensor([float(stats[k]) for k in max_keys], dtype=torch.float64, device=dev)
    mean = torch.tensor([float(stats[k]) for k in mean_keys], dtype=torch.float64, device=dev)
    dist.all_reduce(top, op=dist.ReduceOp.MAX)
    dist.all_reduce(mean)
    out = dict(stats)
    out.update({k: float(v) for k, v in zip(max_keys, top)})
    out.update({k: float(v) / dist.get_world_size() for k, v in zip(mean_keys, mean)})
    for k in ("bytes_sent", "bytes_received"):        # counts, not floats, in the CSV
        if k in out:
            out[k] = int(out[k])
    return out


def at_last_backward(stats: dict, keys: tuple[str, ...]) -> dict:
    """``keys`` (``exposed_s`` first) as the rank that ended backward last has them (the smallest
    ``exposed_s``; the lowest such rank on a tie), and the spread columns of ``exposed_s`` over ranks."""
    mine = torch.tensor([float(stats[k]) for k in keys], dtype=torch.float64, device=comm_device())
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    exposed = torch.stack([t[0] for t in every])
    last = every[int(torch.argmin(exposed))]            # argmin: the first of equal minima
    out = {k: float(v) for k, v in zip(keys, last)}
    out.update(dict.fromkeys(columns.reduced("spread", columns.BY_NAME), float(exposed.max() - exposed.min())))
    return out


def reduce_row(stats: dict) -> dict:
    """This iteration's logged row from this rank's ``stats`` (a collective, as :func:`reduce_stats`)."""
    declared = tuple(k for k in stats if k in columns.BY_NAME)
    row = reduce_stats(stats, columns.reduced("max", declared), columns.reduced("mean", declared))
    if "exposed_s" in stats:
        others = tuple(k for k in columns.reduced("last_backward", declared) if k != "exposed_s")
        row.update(at_last_backward(stats, ("exposed_s", *others)))
    return row
