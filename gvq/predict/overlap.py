"""The cost model with overlap (``aggregator.overlap=true``): DDP's buckets averaged on the communication
lane while backward runs on the compute lane, as :mod:`gvq.hooks` does it under virtual time
(docs/virtual-time.md, "Two lanes").

One iteration of the slowest rank, every rank alike: forward F, then backward B, in which bucket b is
handed over when its last gradient is produced (``ready``: shares of B from ``calibrate-overlap``; DDP
hands buckets over in order).  The communication lane takes buckets in order: bucket b starts at
max(its ready time, the lane free), runs the aggregator's measurement, its ring(s) and the division by
N.  With ``net.comm_core=shared`` the ring's CPU work (codec and ring phases: ``work``) is owed by the
compute lane too: the compute lane is delayed by the work of every bucket that started before it got
there (the communication thread has priority), and backward ends only after all of it.  Then the
non-finite check, the wait for the last bucket (``aggregate_s``) and the optimizer step.
``exposed_s`` = last bucket averaged - backward produced it; ``comm_s`` = first bucket handed over ->
last averaged.

A bucket's rings are its own at that N (``overlap.json``: as the aggregator's declared rings cut
them), costs read off the calibration's curves at its pieces' sizes, its codec's times its
``codec_factor`` (GradiVeQ's bucket codec is its own: see :mod:`gvq.predict.calibrate_overlap`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gvq.predict import cost_model as M
from gvq.predict import schedule as S


@dataclass
class Phases:
    """The slowest rank's compute of one iteration, already scaled: forward (with the loss and
    zero_grad), backward, the optimizer step (seconds)."""
    forward: float
    backward: float
    step: float

    @property
    def total(self) -> float:
        return self.forward + self.backward + self.step


@dataclass
class BucketCost:
    """One bucket on the communication lane: its ring's duration from a common start (``ring``), the
    part of it that is CPU work owed to a shared core (``work``), and the lane's own work around the
    ring that no core sharing charges (``lane``: measurement, division by N)."""
    ring: float
    work: float
    lane: float = 0.0


def replay_lanes(ph: Phases, ready: list[float], buckets: list[BucketCost], shared: bool,
                 finite: float = 0.0) -> dict:
    """The two lanes of one iteration on scripted costs.  ``ready[b]``: share of backward done when
    bucket b's last gradient is produced (made non-decreasing: DDP hands buckets over in order)."""
    owed, pending, free = 0.0, [], -np.inf
    handed, done = [], []
    ready = np.maximum.accumulate(np.asarray(ready, float))
    for r, b in zip(ready.tolist(), buckets):
        t = ph.forward + ph.backward * r + owed
        while shared and pending and pending[0][0] <= t:     # work begun before backward got here
            owed, t = owed + pending[0][1], t + pending[0][1]
            pending.pop(0)
        start = max(t, free)
        free = start + b.ring + b.lane
        handed.append(t)
        done.append(free)
        if shared:
            pending.append((start, b.work))
    owed += sum(w for _, w in pending) if shared else 0.0
    backward_end = ph.forward + ph.backward + owed + finite
    t_done = float(done[-1]) if done else backward_end
    end = max(backward_end, t_done)
    return {"compute_s": ph.forward + ph.backward + owed, "aggregate_s": end - backward_end,
            "iter_s": end + ph.step, "exposed_s": max(0.0, t_done - handed[-1]) if handed else 0.0,
            "comm_s": t_done - handed[0] if handed else 0.0, "buckets": len(buckets)}


@dataclass
class Overlap:
    """A calibration with its ``overlap.json``."""
    m: M.Calibrated
    ov: dict

    @classmethod
    def load(cls, folder: Path, pricing=None) -> Overlap:
        """``pricing``: Calibrated -> (Calibrated, how), the codec costs' override (``codec_costs.apply``)."""
        m = M.Calibrated.load(folder)
        if pricing is not None:
            m, how = pricing(m)
            print(f"gvq.predict: {folder.name}: {how}", flush=True)
        path = folder / "overlap.json"
        if not path.exists():
            raise FileNotFoundError(f"{path}: run `python -m gvq.predict calibrate-overlap --calibration {folder}`")
        ov = json.loads(path.read_text())
        if any("rounds" not in b for caps in ov["buckets"].values() for bs in caps.values() for b in bs):
            raise M.PredictError(f"{path}: written before buckets kept their own rings: run `python -m "
                                 f"gvq.predict calibrate-overlap --calibration {folder}` again")
        ov["curves"] = {**m.cal, "codecs": {k: {op: c for op, c in v.items() if op != "pieces"}
                                            for k, v in m.cal["codecs"].items()}}
        return cls(m, ov)

    @property
    def finite_s(self) -> float:
        """One non-finite check of the whole gradient (the guards' before / after aggregation)."""
        return float(M.op_cost(self.m.cal["vector"]["finite"], self.m.struct["numel"], 1.0))

    def phases(self, n: int, compute_scale: float) -> Phases:
        """This machine's calibrated phases, the slowest of ``n`` ranks (as :func:`M.slowest`: each
        phase scaled by the slowest-of-N share of the whole compute), times ``compute_scale``."""
        prof = self.ov["profile"]
        med = {k: float(np.median(prof[k])) for k in ("forward", "backward", "step")}
        q = M.compute_time(self.m, n) / float(np.median(self.m.cal.get("compute_samples") or [self.m.cal["compute_s"]]))
        return Phases(*(med[k] * q * compute_scale for k in ("forward", "backward", "step")))

    def msg(self, n: int, host: bool) -> tuple[float, float]:
        """[fixed, per byte] seconds to post a message: with ``host``, as ``n`` ranks sharing this host's
        cores pay it (``calibrate-overlap host_ranks=[...]``: what its virtual-time benchmarks measure),
        else the calibration's (a rank a core: the clusters projected to)."""
        if not host:
            return tuple(self.m.cal["msg"])
        got = self.ov["host_msg"].get(str(n))
        if got is None:
            raise M.PredictError(f"gvq.predict: no message cost of {n} ranks on this host: run `python -m "
                                 f"gvq.predict calibrate-overlap host_ranks=[{n}]` (have "
                                 f"{', '.join(self.ov['host_msg']) or 'none'})")
        return tuple(got)

    def bucket_costs(self, name: str, n: int, bps: float, alpha: float, codec_scale: float,
                     cap: str = "default", host: bool = False) -> tuple[list[float], list[BucketCost]]:
        """(ready share, cost) per bucket of aggregator ``name`` at bucket size ``cap`` (``host``: see
        :meth:`msg`)."""
        msg = self.msg(n, host)
        key = ("overlap", name, n, bps, alpha, codec_scale, cap, msg)     # keyed by the cost, not the flag
        if key not in self.m.cache:
            self.m.cache[key] = self._bucket_costs(name, n, bps, alpha, codec_scale, cap, msg)
        return self.m.cache[key]

    def _bucket_costs(self, name, n, bps, alpha, codec_scale, cap, msg):
        cal, numel = self.m.cal, self.m.struct["numel"]
        ready, costs = [], []
        for b in self.ov["buckets"][name][cap]:
            rnds = b["rounds"].get(str(n))
            if rnds is None:
                raise M.PredictError(f"gvq.predict: N={n} not in overlap.json's bucket structure (have "
                                     f"{', '.join(sorted(b['rounds'], key=int))})")
            v = b["values"] * numel
            lane = (float(M.op_cost(cal["vector"]["div"], v, 1.0)) + cal["measure"].get(name, 0.0) * b["values"])
            extra = self.m.passes(name) * float(M.op_cost(cal["vector"]["add"], v, codec_scale))
            scale = codec_scale * b["codec_factor"]          # the bucket's own codec (GradiVeQ's restricted)
            ready.append(max(self.ov["profile"]["ready"][i] for i in b["params"]))
            costs.append(BucketCost(self._ring(rnds, n, S.Link(bps, alpha, *msg), scale) + extra,
                                    self._work(rnds, n, scale, msg, (name, cap, len(costs))) + extra, lane))
        return ready, costs

    def _work(self, rnds: list[dict], n: int, codec_scale: float, msg: tuple, which: tuple) -> float:
        """A bucket's CPU work in its rings: the ranks' mean end on an infinitely fast link (the link
        does not change it: kept per bucket, N, codec scale and message cost)."""
        key = ("work", *which, n, codec_scale, msg)
        if key not in self.m.cache:
            self.m.cache[key] = self._ring(rnds, n, S.Link(np.inf, 0.0, *msg), codec_scale, True)
        return self.m.cache[key]

    def _ring(self, rnds: list[dict], n: int, link: S.Link, codec_scale: float, mean: bool = False) -> float:
        """The bucket's rings back to back from a common start: the slowest rank's end (``mean``: the
        ranks' mean, on an infinitely fast link the CPU work a rank does in them)."""
        t = np.zeros(n)
        for rnd in rnds:
            t = M.replay_ring(rnd, self.ov["curves"], link, codec_scale, t)
        return float(t.mean() if mean else t.max())

    def iteration(self, name: str, n: int, bps: float, alpha: float = 0.0, codec_scale: float = 1.0,
                  compute_scale: float = 1.0, cap: str = "default", shared: bool = True,
                  phases: Phases | None = None, host: bool = False) -> dict:
        """One overlapped iteration (see the module docstring); ``phases``: measured ones (e.g. the
        benchmark's own compute-alone mode) instead of the calibration's; ``host``: see :meth:`msg`."""
        ph = phases or self.phases(n, compute_scale)
        ready, costs = self.bucket_costs(name, n, bps, alpha, codec_scale, cap, host)
        return replay_lanes(ph, ready, costs, shared, self.finite_s)

    def post_iteration(self, name: str, n: int, bps: float, alpha: float = 0.0, codec_scale: float = 1.0,
                       compute_scale: float = 1.0, phases: Phases | None = None, host: bool = False) -> dict:
        """Today's post-backward model with the same phases: compute, two non-finite checks, the
        untimed measurement, aggregation."""
        ph = phases or self.phases(n, compute_scale)
        agg = M.aggregation(self.m, name, n, bps, alpha, codec_scale, self.msg(n, host))
        meas = self.m.cal["measure"].get(name, 0.0)
        return {"compute_s": ph.forward + ph.backward, "aggregate_s": agg,
                "iter_s": ph.total + 2 * self.finite_s + meas + agg,
                "exposed_s": agg, "comm_s": agg, "buckets": 1}

