"""One iteration's row from every rank's statistics: which column is reduced how across the ranks.

Times and bytes are the slowest rank's (the iteration waits for it); loss and accuracy the mean over
ranks; anything else rank 0's.  An overlapped aggregator's columns (:mod:`gvq.hooks.overlapped`) are
read at the rank that ended backward last: every rank's ring ends at about the same moment, so a rank
that ended backward earlier also waited for its peers' backward.  Its ``exposed_s`` would count that
compute imbalance as communication; the smallest ``exposed_s`` over ranks is what the iteration's last
backward left to wait for, and ``straggle_s`` (the spread of ``exposed_s`` over ranks) is the wait for
the slowest peer's backward, reported beside it.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from gvq.run.guards import comm_device

TIME_KEYS = ("compute_s", "aggregate_s", "compress_s", "decompress_s", "wire_s", "stage_s", "bytes_sent",
             "skipped")
MEAN_KEYS = ("train_loss", "train_acc")
OVERLAP_MAX_KEYS = ("comm_s", "straggle_s")      # first bucket launched -> last averaged: the slowest rank's
OVERLAP_MIN_KEYS = ("exposed_s", "last_bucket_s")    # at the rank that ended backward last (see above)


def reduce_stats(stats: dict, max_keys=(), mean_keys=(), min_keys=()) -> dict:
    """``stats`` with ``max_keys`` maxed, ``mean_keys`` averaged and ``min_keys`` minimised over ranks (a
    collective: every rank calls it with the same keys); other keys stay this rank's.  Two all-reduces
    per row whatever the keys: a minimum rides in the maximum's as its negation."""
    dev = comm_device()
    extreme = torch.tensor([float(stats[k]) for k in max_keys] + [-float(stats[k]) for k in min_keys],
                           dtype=torch.float64, device=dev)
    mean = torch.tensor([float(stats[k]) for k in mean_keys], dtype=torch.float64, device=dev)
    dist.all_reduce(extreme, op=dist.ReduceOp.MAX)
    dist.all_reduce(mean)
    out = dict(stats)
    out.update({k: float(v) for k, v in zip(max_keys, extreme)})
    out.update({k: -float(v) for k, v in zip(min_keys, extreme[len(max_keys):])})
    out.update({k: float(v) / dist.get_world_size() for k, v in zip(mean_keys, mean)})
    if "bytes_sent" in out:
        out["bytes_sent"] = int(out["bytes_sent"])
    return out


def reduce_row(stats: dict) -> dict:
    """This iteration's logged row from this rank's ``stats`` (a collective, as :func:`reduce_stats`)."""
    if "exposed_s" not in stats:
        return reduce_stats(stats, TIME_KEYS, MEAN_KEYS)
    row = reduce_stats({**stats, "straggle_s": stats["exposed_s"]}, TIME_KEYS + OVERLAP_MAX_KEYS, MEAN_KEYS,
                       OVERLAP_MIN_KEYS)
    row["straggle_s"] -= row["exposed_s"]          # largest exposed_s over ranks - smallest
    return row
