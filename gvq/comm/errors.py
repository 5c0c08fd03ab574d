"""gvq's failure on one rank, as a type: :class:`RankError` carries the rank, and its message opens with
``rank N:``.  The hook's communication thread (gvq/hooks/thread.py) hands one to ``backward`` as it is and
wraps anything else in a line naming the rank; :class:`gvq.comm.p2p.PeerLostError` is one.
"""
from __future__ import annotations


class RankError(RuntimeError):
    """What went wrong (``what``) on rank ``rank``."""

    def __init__(self, rank: int, what: str):
        super().__init__(f"rank {rank}: {what}")
        self.rank, self.what = rank, what

    def __reduce__(self):              # pickled with both fields (the default rebuilds from the message)
        return type(self), (self.rank, self.what)
