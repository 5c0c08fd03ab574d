"""Streaming DiLoCo (Douillard et al. 2025, arXiv 2501.18512): DiLoCo with the model split into ``fragments``
contiguous blocks of parameters (model order, about equal sizes), each synced every ``every`` steps on a
staggered schedule, so a sync sends one fragment; the averaged Δ of a fragment is applied ``delay`` inner
steps after it was taken (the all-reduce overlapped with those steps) and mixed into the local parameters
with ``alpha``.  ``python cli.py method=streaming_diloco method.fragments=3 aggregator=qsgd
aggregator.compressor.bits=4``.

The schedule and the merge are torchft's (``torchft/local_sgd.py``): fragment f's Δ is taken after step
s = it + 1 when (s − offset_f) % every == 0, offset_f = ⌊every·(f + 1) / fragments⌋ (the last fragment
syncs when DiLoCo does); ``delay`` steps later the outer optimizer steps that fragment's global copy on it
and θ_local_f ← α·θ_local_f + (1 − α)·θ_global_f.  A fragment's Δ, average and outer step are DiLoCo's own
(:meth:`DiLoCo.delta`, :meth:`DiLoCo.average`, :meth:`DiLoCo.outer_apply`), each fragment with its own
outer momentum.

Time (docs/virtual-time.md, "Streaming DiLoCo"): gvq averages Δ when it is taken, and ``delay`` changes
when it lands.  Under ``net.clock=virtual`` the averaging runs on the rank's communication lane (the one
:mod:`gvq.hooks` uses), from the moment Δ is taken; the merge ``delay`` steps later waits on the compute
lane only for what is left of it, so ``exposed_s`` = max(0, communication − the compute of the steps
between) and ``comm_s`` is the averaging itself (its row: the send's).  With ``net.comm_core=shared`` the
averaging's codec work is still owed by the compute lane (one core); the link never is.  Under the wall
clock the averaging blocks at the send (no thread carries it): that row's ``exposed_s`` is all of it.
"""
from __future__ import annotations

import torch

from gvq.comm import clock
from gvq.methods.diloco import DiLoCo


class StreamingDiLoCo(DiLoCo):
    """DiLoCo one fragment at a time: staggered syncs, each landing ``delay`` steps later, mixed by ``alpha``."""

    name = "streaming_diloco"
    extra_fields = ("synced", "comm_s", "exposed_s")

    def __init__(self, every: int = 30, fragments: int = 3, delay: int = 1, alpha: float = 0.0,
                 outer_lr: float = 0.7, outer_momentum: float = 0.9, workers: str = "rank"):
        super().__init__(every=every, outer_lr=outer_lr, outer_momentum=outer_momentum, workers=workers)
        if isinstance(fragments, bool) or not isinstance(fragments, int) or not 1 <= fragments <= every:
            raise ValueError(f"method.fragments={fragments!r}: must be an integer in [1, method.every={every}] "
                             "(one fragment sync per step at most)")
        if isinstance(delay, bool) or not isinstance(delay, int) or not 0 <= delay < every:
            raise ValueError(f"method.delay={delay!r}: must be an integer in [0, method.every={every}) "
                             "(a fragment lands before its next sync)")
        if not 0 <= alpha < 1:
            raise ValueError(f"method.alpha={alpha!r}: must be in [0, 1) (1: the global copy never lands)")
        self.fragments, self.delay, self.alpha = fragments, delay, float(alpha)
        #: averaged fragments in flight: (iteration it lands after, fragment, its averaged Δ, when its
        #: averaging ends on the compute lane's clock: None on the wall clock, where it already has)
        self.pending: list[tuple[int, int, torch.Tensor, float | None]] = []

    def fragment_bounds(self) -> list[int]:
        """``fragments`` contiguous blocks of :attr:`params`: each cut at the parameter boundary nearest
        an equal share of the values, every block at least one parameter."""
        sizes = [p.numel() for p in self.params]
        if self.fragments > len(sizes):
            raise ValueError(f"method.fragments={self.fragments}: the model has {len(sizes)} parameters")
        ends = torch.tensor(sizes).cumsum(0).tolist()
        cuts = [0]
        for k in range(1, self.fragments):
            share = k * ends[-1] / self.fragments
            room = range(cuts[-1] + 1, len(sizes) - (self.fragments - k) + 1)
            cuts.append(min(room, key=lambda i: abs(ends[i - 1] - share)))
        return [*cuts, len(sizes)]

    # -- the schedule --------------------------------------------------------------------------------------
    def offset(self, f: int) -> int:
        return self.every * (f + 1) // self.fragments

    def check(self, agg) -> None:
        super().check(agg)
        if self.fragments > 1 and agg.fits_whole_vectors:
            raise ValueError(f"method=streaming_diloco with method.fragments={self.fragments} sends part of the "
                             f"model each sync; aggregator={agg.name} fits its state from whole-model vectors "
                             "(a fragment's sync leaves the other layers unsampled): use method.fragments=1 or "
                             "another aggregator")

    def sends(self, f: int, iteration: int) -> bool:
        """Whether fragment ``f``'s Δ is taken and averaged after ``iteration``'s inner step."""
        return (iteration + 1 - self.offset(f)) % self.every == 0

    def syncs(self, iteration: int) -> bool:
        return any(self.sends(f, iteration) for f in range(self.fragments))

    # -- one iteration -------------------------------------------------------------------------------------
    def after_step(self, iteration: int) -> dict:
        """This step's fragment (if any) sent, then every fragment due lands (with ``delay`` 0, the one
        just sent).  Every row has ``comm_s`` and ``exposed_s`` (0 where nothing was sent or waited for);
        ``aggregate_s`` is what the rank spent on the method in the step: Δ, the wait for a landing's
        averaging and the outer step (a landing on a step that sent nothing included)."""
        row = {"comm_s": 0.0, "exposed_s": 0.0}
        for f in range(self.fragments):
            if self.sends(f, iteration):
                delta, stats, done = self.send(f, iteration)
                self.pending.append((iteration + self.delay, f, delta, done))
                row = {**row, **stats, **self.sync_marker(True)}
        t0 = clock.now()
        due = [p for p in self.pending if p[0] <= iteration]     # <=: a due step skipped (nan_policy) lands next
        for _, f, delta, done in due:
            row["exposed_s"] += self.wait_for(done)
            self.outer_apply(f, delta, self.alpha)
        self.pending = [p for p in self.pending if p[0] > iteration]
        if due:
            row["aggregate_s"] = row.get("aggregate_s", 0.0) + clock.now() - t0
        return row if self.nodes is None else self.nodes.plus_gradients(row)

    def send(self, f: int, iteration: int) -> tuple[torch.Tensor, dict, float | None]:
        """Fragment ``f``'s Δ taken and averaged: the row's columns, and when the averaging ends on the
        compute lane's clock (module docstring; None on the wall clock: it blocked here)."""
        lanes = clock.lanes()
        if not lanes.compute.virtual:
            delta, stats = self.averaged_delta(f, iteration)
            return delta, {**stats, "comm_s": stats["aggregate_s"], "exposed_s": stats["aggregate_s"]}, None
        t0 = clock.now()
        delta = self.delta(f)
        start = clock.now()
        with lanes.comm_lane() as comm:            # every clock reading of the ring's is this lane's
            comm.advance_to(start)                 # begins at Δ, or when the lane is free (a fragment before)
            begun = comm.now()
            stats = self.average(f, delta, iteration)
            done = comm.now()
        lanes.compute.bind_thread()                # that CPU was the communication lane's
        return delta, {**stats, "aggregate_s": clock.now() - t0, "comm_s": done - begun}, done

    @staticmethod
    def wait_for(done: float | None) -> float:
        """The compute lane waits for an averaging that ends at ``done``; returns the wait (exposed)."""
        if done is None:
            return 0.0
        lane = clock.get()
        t = lane.now()
        lane.advance_to(done)
        return max(0.0, done - t)

    # -- checkpoints: DiLoCo's, the fragments in flight, and the blocks they were cut into -----------------
    def state_dict(self) -> dict:
        now = clock.get().now()             # an averaging's end as what is left of it (a new process, a new clock)
        return {**super().state_dict(), "bounds": list(self.bounds),
                "pending": [{"due": due, "fragment": f, "delta": d.clone(),
                             "left_s": None if done is None else max(0.0, done - now)}
                            for due, f, d, done in self.pending]}

    def load_state_dict(self, state: dict) -> None:
        if list(state["bounds"]) != self.bounds:
            raise ValueError(f"method={self.name}: the checkpoint's fragments {list(state['bounds'])} are not "
                             f"this run's {self.bounds}")
        super().load_state_dict(state)
        now = clock.get().now()
        self.pending = [(p["due"], p["fragment"], p["delta"].clone(),
                         None if p.get("left_s") is None else now + p["left_s"]) for p in state["pending"]]
