"""torch DistributedDataParallel as an aggregator, the reference users would pick instead:
``python cli.py aggregator=ddp`` | ``aggregator=ddp_fp16`` | ``aggregator=ddp_powersgd aggregator.rank=4``.

See docs/design.md#gvqaggregatorsddppy for how it works and why.
"""
from __future__ import annotations

import inspect
import logging
import time

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
from torch.nn.parallel import DistributedDataParallel

from gvq.aggregators import ddp_memory
from gvq.aggregators.base import Aggregator, check_bucket_cap, check_int
from gvq.compressors.powersgd import low_rank

log = logging.getLogger("gvq")
_DDP_ARGS = inspect.signature(DistributedDataParallel.__init__).parameters


def wrap_ddp(model: torch.nn.Module, bucket_cap_mb: float | None = None) -> DistributedDataParallel:
    """``model`` in torch DDP as every gvq comparison wraps it (the DDP aggregators, the overlapped hook,
    the benches' torch DDP): on the model's device, buckets of ``bucket_cap_mb`` (None: DDP's defaults, its
    small first bucket included) and no per-forward buffer sync: ranks keep their own BN statistics and
    evaluate with rank 0's, as for every other aggregator, so DDP's broadcast each forward would be extra,
    uncounted communication."""
    dev = next(model.parameters()).device
    kw = ({"forward_sync_buffers": False} if "forward_sync_buffers" in _DDP_ARGS
          else {"broadcast_buffers": False})        # the older spelling (deprecated in 2.13)
    if bucket_cap_mb is not None:
        kw["bucket_cap_mb"] = bucket_cap_mb
    return DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None, **kw)


class _Timing:
    """Comm hook state: the wrapped hook's state plus launch / completion times of this iteration, and
    which parameters (model order) each DDP bucket holds, for the PowerSGD memory's state_dict."""

    def __init__(self, inner_state, params: list):
        self.inner_state = inner_state
        self.launched: list[float] = []
        self.done: list[float] = []
        self.index = {id(p): i for i, p in enumerate(params)}
        self.shapes = [tuple(p.shape) for p in params]
        self.buckets: dict[int, list[int]] = {}         # bucket index -> parameter indices, bucket order
        self.pending: dict | None = None                 # per-parameter memory to restore (a resume)

    def reset(self, *_) -> None:
        if self.launched:                                # an iteration ran: every bucket had its memory
            self.pending = None
        self.launched, self.done = [], []


def _timed(inner):
    """A comm hook that runs ``inner`` and records when each bucket's future is launched and done."""
    def hook(state: _Timing, bucket):
        state.launched.append(time.perf_counter())
        if state.inner_state is not None:               # PowerSGD: its memory follows the parameters
            ddp_memory.see_bucket(state, bucket.index(), [state.index[id(p)] for p in bucket.parameters()])
        fut = inner(state.inner_state, bucket)

        def finished(f):
            state.done.append(time.perf_counter())      # runs on the thread completing the future
            return f.value()
        return fut.then(finished)
    return hook


class DDPAggregator(Aggregator):
    """Plain DDP (``hook=allreduce``), DDP + fp16 compression hook, or DDP + torch's PowerSGD hook."""

    extra_fields = ("comm_s", "exposed_s", "straggle_s", "buckets", "bytes_received")   # as gvq's hook names them
    #: averages during backward: the loop trains :meth:`wrap`'s DistributedDataParallel
    inside_backward = True

    def __init__(self, *, hook: str, rank: int, start_iter: int, min_compression_rate: float,
                 bucket_cap_mb: float | None):
        """Every knob as given (its default lives in ``DDPSchema``: :func:`gvq.schema.options.knobs`)."""
        check_int("aggregator.rank", rank, 1)
        # the torch hook refuses start_iter < 2 with error feedback / warm start (DDP rebuilds buckets at 1)
        check_int("aggregator.start_iter", start_iter, 2)
        if not min_compression_rate > 0:
            raise ValueError(f"aggregator.min_compression_rate={min_compression_rate!r}: must be > 0")
        self.hook, self.rank, self.start_iter = hook, rank, start_iter
        self.min_compression_rate = float(min_compression_rate)
        # None: DDP's own defaults, including its small first bucket (torch drops it when a size is passed)
        self.bucket_cap_mb = check_bucket_cap(bucket_cap_mb)
        self.name = "ddp" if hook == "allreduce" else f"ddp_{hook}"
        self.timing: _Timing | None = None

    def setup(self, params, ctx) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.ctx = ctx
        if ctx.bandwidth_bps and ctx.rank == 0:
            log.warning("%s: the emulated link (net.bandwidth_bps=%g) does not apply to DDP's own "
                        "collectives; they run at loopback speed. Compare under kernel shaping "
                        "(sudo python -m gvq.bench netns-train).", self.name, ctx.bandwidth_bps)

    def wrap(self, model: torch.nn.Module) -> DistributedDataParallel:
        ddp = wrap_ddp(model, self.bucket_cap_mb)
        if self.hook == "powersgd":
            inner_state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=self.rank,
                                             start_powerSGD_iter=self.start_iter,
                                             min_compression_rate=self.min_compression_rate,
                                             random_seed=self.ctx.seed)
            inner = psgd.powerSGD_hook
        else:
            inner_state = None                       # the default hooks take the process group
            inner = default_hooks.fp16_compress_hook if self.hook == "fp16" else default_hooks.allreduce_hook
        self.timing = _Timing(inner_state, list(model.parameters()))
        ddp.register_comm_hook(self.timing, _timed(inner))
        ddp.register_forward_pre_hook(self.timing.reset)      # an iteration's times start at its forward
        self.model = ddp
        return ddp

    def aggregate(self, iteration: int) -> dict:
        t0 = time.perf_counter()
        if self.timing is None:
            raise RuntimeError(f"{self.name}: the model was not wrapped (the training loop must call "
                               "agg.wrap(model) after agg.setup)")
        tm = self.timing
        comm = max(tm.done) - min(tm.launched) if tm.done else 0.0
        wait = max(0.0, max(tm.done) - max(tm.launched)) if tm.done else 0.0
        self.inside_compute_s = wait
        compressed = self.hook == "fp16" or (self.hook == "powersgd" and self._powersgd_was_on())
        return {"compress_s": 0.0, "decompress_s": 0.0, "wire_s": 0.0, "stage_s": 0.0, "comm_s": comm,
                "exposed_s": wait, "buckets": len(tm.launched), "bytes_sent": self.estimated_bytes(compressed),
                "bytes_received": self.estimated_bytes(compressed),       # a ring all-reduce receives what it sends
                "phase": self.name if compressed else "allreduce",
                # torch averages inside its own hooks: no raw copy to hold the mean against
                "aggregate_error": float("nan"),
                # backward returned only once every bucket was averaged: the wait is inside compute_s
                "aggregate_s": time.perf_counter() - t0 + wait}

    def _powersgd_was_on(self) -> bool:
        # the hook counts iterations itself (incremented after the last bucket): ask it, not our counter
        st = self.timing.inner_state
        return st.iter > st.start_powerSGD_iter

    def estimated_bytes(self, compressed: bool) -> int:
        """Per-rank bytes a ring all-reduce of what DDP all-reduces would send (an estimate)."""
        n = self.ctx.world_size
        elems = sum(p.numel() for p in self.params)
        if compressed and self.hook == "fp16":
            nbytes = 2 * elems
        elif compressed and self.hook == "powersgd":
            nbytes = 4 * sum(self._powersgd_elems(p.shape) for p in self.params)
        else:
            nbytes = 4 * elems
        return int(round(2 * (n - 1) / n * nbytes))

    def _powersgd_elems(self, shape) -> int:
        # the hook views every tensor as (shape[0], -1), 1-D ones as (n, 1): same rule as ours
        n = int(shape[0]) if len(shape) else 1
        m = max(1, int(torch.Size(shape).numel()) // max(n, 1))
        r = low_rank((n, m), self.rank, self.min_compression_rate)
        return (n + m) * r if r else n * m

    def benchmark_warmup(self) -> int:
        """The PowerSGD hook all-reduces uncompressed until its own count reaches ``start_iter``."""
        return self.start_iter + 1 if self.hook == "powersgd" else 0

    #: the hook's fields a resume carries over as numbers (its memory goes per parameter, see below)
    _CARRIED = ("iter", "total_numel_before_compression", "total_numel_after_compression", "next_stats_report")

    def state_dict(self) -> dict:
        """The PowerSGD hook's iteration count, RNG, and its error memory and warm-start P / Q cut per
        parameter (tensors; no pickled objects): the hook keys them by DDP bucket, and a new DDP
        instance buckets in another order until its first rebuild."""
        if self.timing is None or self.hook != "powersgd":
            return {}
        st = self.timing.inner_state
        name, keys, pos, has_gauss, gauss = st.rng.get_state()       # numpy MT19937 state
        return {"powersgd": {**{k: getattr(st, k) for k in self._CARRIED}, "rng_keys": torch.from_numpy(
            keys.astype("int64")), "rng_rest": [name, int(pos), int(has_gauss), float(gauss)],
            "memory": ddp_memory.per_parameter(self.timing)}}

    def load_state_dict(self, state: dict) -> None:
        if "powersgd" in state and self.timing is not None:
            saved, mine = state["powersgd"], self.timing.inner_state
            for k in self._CARRIED:
                setattr(mine, k, saved[k])                  # in place: DDP holds this object
            name, pos, has_gauss, gauss = saved["rng_rest"]
            mine.rng.set_state((name, saved["rng_keys"].numpy().astype("uint32"), pos, has_gauss, gauss))
            self.timing.pending = saved["memory"]           # put back bucket by bucket, at first sight
