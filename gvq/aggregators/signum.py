"""Signum with majority vote (Bernstein et al., ICML 2018 / ICLR 2019): ``python cli.py aggregator=signum
optim.lr=...`` (its own learning rate: ``conf/aggregator/signum.yaml``).

Each rank keeps its momentum m <- beta m + (1 - beta) g here, not in the optimizer (the paper's
``Signum_SGD.py``: weight decay is not in the vote), sends sign(m) through its codec
(:class:`gvq.compressors.signum.SignVote`: an int8 vote summed on the ring, or bits gathered), and
writes the majority vote sign(sum_i sign(m_i)) into the gradient, so the plain SGD outside steps
lr * vote.  The vote is not a mean: this aggregator's result is +-1 (0 on a tie), whatever N.

``topology=hierarchical``: each rank's momentum is summed densely inside the node, then the nodes vote on
each rank's shard (the int8 votes summed on the ring across nodes, or the bits all-gathered), then the
shards are gathered inside the node: the voters are the M nodes, each voting the sign of its ranks'
summed momentum.  Momentum is linear, so the sum of the ranks' momenta is the momentum of the node's
summed gradient: the state stays each rank's own, and a node's vote is what one worker with the node's
batch would cast; on the slow links go M votes' worth of bytes instead of N.

Ties: with an even N, a coordinate whose votes cancel (sum 0) gets 0: no step there (torch.sign(0)),
on both wire formats alike.  GRACE breaks ties to +1, which drifts every tied weight up.
"""
from __future__ import annotations

import torch

from gvq.aggregators.base import refuse_optimizer_momentum
from gvq.aggregators.compressed import CompressedAggregator
from gvq.aggregators.flat import FlatAggregator
from gvq.aggregators.dtypes import widest_dtype
from gvq.compressors.signum import INT8_MAX_RANKS, SignVote


class SignumAggregator(CompressedAggregator):
    """:class:`CompressedAggregator` of a :class:`SignVote` codec whose ranks vote with their momentum."""

    # no compression error: the vote is not an estimate of the mean
    extra_fields = FlatAggregator.extra_fields

    @classmethod
    def check_run(cls, cfg: dict) -> None:
        # its momentum is m, before the vote: SGD's on top of the voted signs trains to chance
        refuse_optimizer_momentum("signum", cfg)

    def __init__(self, compressor: SignVote, *, topology: str, hop: str, beta: float, ef_decay: float,
                 ef_units: str):
        # no error feedback here: an ef_decay / ef_units other than these is refused by CompressedAggregator
        super().__init__(compressor, topology=topology, hop=hop, ef_decay=ef_decay, ef_units=ef_units)
        if not isinstance(compressor, SignVote):
            raise ValueError(f"aggregator=signum: compressor {compressor.name!r} is not SignVote")
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"aggregator.beta={beta!r}: must be in [0, 1) (0: signSGD, no momentum)")
        if topology == "ps" or (topology == "ring" and not self.sum_hop):
            raise ValueError(f"aggregator.topology={topology} (hop={hop}): the majority vote needs every rank's "
                             "sign summed: use vote=int8 on the ring (hop=auto), or topology=allgather (a ring "
                             "or server that re-encodes a partial sum as a sign would vote on votes)")
        self.beta = float(beta)

    @property
    def across(self) -> str:
        """``topology=hierarchical``: the int8 votes summed across nodes, or the bits all-gathered (a
        re-encoded partial sum would vote on votes)."""
        return "additive" if self.sum_hop else "allgather"

    def bind(self, params, ctx):
        if self.compressor.vote == "int8" and ctx.world_size > INT8_MAX_RANKS:
            raise ValueError(f"aggregator=signum vote=int8: {ctx.world_size} ranks; an int8 sum of +-1 votes "
                             f"holds N <= {INT8_MAX_RANKS}: use aggregator.compressor.vote=bits")
        super().bind(params, ctx)
        device = self.params[0].device if self.params else torch.device("cpu")
        dtype = widest_dtype((p.dtype for p in self.params), at_least=torch.float32)
        self.momentum = torch.zeros(self.offsets[-1], dtype=dtype, device=device)

    def per_parameter(self):
        return {"momentum": self.momentum}

    def measure(self, bucket):
        return {}

    def average(self, bucket):
        m, flat = bucket.state["momentum"], bucket.flat
        m.mul_(self.beta).add_(flat, alpha=1.0 - self.beta)
        flat.copy_(m)
        super().average(bucket)              # the sum of the ranks' +-1 votes, / N
        flat.sign_()                         # the majority; 0 where the votes tie
        return None

    def state_dict(self) -> dict:
        return {**super().state_dict(), "momentum": self.momentum.clone()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.momentum.copy_(state["momentum"])
