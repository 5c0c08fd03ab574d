"""The training loop's guards: non-finite gradients before and after aggregation (``nan_policy``), and
raw communication errors of the runner's own collectives turned into one line saying a peer was lost.
"""
from __future__ import annotations

import logging
import math
from pathlib import Path

import torch
import torch.distributed as dist

from gvq.comm.p2p import PeerLostError
from gvq.run.errors import RunFailed

log = logging.getLogger("gvq")
STOP_EXIT = 4                       # a rank's exit code for a deliberate stop (its reason in the run dir)


class DeliberateStop(FloatingPointError):
    """A stop the user asked for (``nan_policy=error``): reported in one line, without a traceback."""


def record_stop(run_dir: str, rank: int, e: DeliberateStop) -> RunFailed:
    """Leave this rank's reason where the launcher reads it (:func:`recorded_stop`) and return the end
    to raise (the rank process exits with its ``code``): every rank raises the same stop, and whichever
    exits first has written its reason."""
    (Path(run_dir) / f".stopped-rank{rank}").write_text(str(e))
    return RunFailed(STOP_EXIT)


def recorded_stop(run_dir: Path) -> str | None:
    """A rank's deliberate-stop reason (the files are removed), or None."""
    found = sorted(run_dir.glob(".stopped-rank*"))
    reason = found[0].read_text() if found else None
    for f in found:
        f.unlink(missing_ok=True)
    return reason


def comm_device() -> torch.device:
    """Where small bookkeeping tensors must live for the process group's backend (NCCL alone: the GPU;
    the launcher's ``cuda:nccl,cpu:gloo`` and gloo: the host)."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def compute_device(device: str) -> torch.device:
    """Where the model, its gradients and the codecs live: this rank's GPU (``device=cuda``: set by the
    launcher, one per rank or shared round-robin) or the host."""
    return torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")


def broadcast_(t: torch.Tensor, src: int = 0) -> None:
    """``dist.broadcast`` of a tensor wherever it lives: through a host copy when the process group
    cannot carry its device (gloo and a GPU tensor: ranks sharing a GPU)."""
    dev = comm_device()
    if t.device == dev:
        dist.broadcast(t, src)
        return
    host = t.to(dev)
    dist.broadcast(host, src)
    t.copy_(host)


def nonfinite(model, agg) -> str | None:
    """Name of the first parameter whose gradient holds NaN/Inf on this rank, or None."""
    # Fast path, every iteration: a finite sum proves every value finite (NaN propagates, +-Inf gives
    # Inf or NaN).  One reduction, no bool temporary: far cheaper than isfinite().all() on the
    # bucket.  A non-finite sum (NaN/Inf, or finite values that overflow) falls to the exact scan.
    if agg.bucket is not None:
        if math.isfinite(float(agg.bucket.sum())):
            return None
    elif math.isfinite(sum(float(p.grad.sum()) for p in model.parameters() if p.grad is not None)):
        return None                      # no flat buffer (e.g. torch DDP): one sum per parameter
    for name, p in model.named_parameters():
        if p.grad is not None and not bool(torch.isfinite(p.grad).all()):
            return name
    return None


def check_gradients(model, agg, it: int, policy: str) -> bool:
    """Agree across ranks, *before* aggregation, whether any gradient is non-finite (a NaN summed into
    the ring would poison every replica) or too large for the wire (world_size x max|g| beyond the
    compressor's ``max_abs``: a partial sum would overflow a 16-bit payload mid-ring, on some ranks
    only).  One collective.  Returns True to skip the iteration (policy ``skip``); raises naming the
    rank and layer, or the magnitude (policy ``error``)."""
    bad = nonfinite(model, agg)
    limit, bucket = agg.max_abs, agg.bucket
    peak = 0.0
    if math.isfinite(limit) and bucket is not None and bad is None:
        lo, hi = torch.aminmax(bucket)                # max|g| without an |g| temporary
        peak = max(-float(lo), float(hi))
    flag = torch.tensor([0.0 if bad is None else 1.0, peak], dtype=torch.float64, device=comm_device())
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    world, top = dist.get_world_size(), float(flag[1])
    if flag[0] > 0:
        names = [None] * world
        dist.all_gather_object(names, bad)
        what = f"non-finite gradient at iteration {it} (" + ", ".join(
            f"rank {r}: {n}" for r, n in enumerate(names) if n) + ")"
    elif world * top > limit:
        what = (f"gradient too large for the wire at iteration {it} (|g| up to {top:.4g} x {world} ranks > "
                f"{agg.name}'s {limit:g}: a partial sum would overflow)")
    else:
        return False
    if policy == "skip":
        log.warning("iteration %d skipped on all ranks: %s", it, what)
        return True
    raise DeliberateStop(f"{what}; nan_policy=skip skips such iterations on all ranks")


def aggregated_overflow(model, agg, it: int, policy: str) -> bool:
    """A gradient finite before aggregation but not after: a compressor or a 16-bit wire overflowed
    (fp16's max is 65504).  Every rank holds the same aggregate (bitwise: the replicas test), so each
    decides alone and all decide alike -- no collective.  True: skip the step (policy ``skip``)."""
    bad = nonfinite(model, agg)
    if bad is None:
        return False
    what = f"aggregated gradient non-finite at iteration {it} ({bad}) though every rank's was finite: " \
           "the compressor or a 16-bit wire overflowed"
    if policy == "skip":
        log.warning("iteration %d skipped on all ranks: %s", it, what)
        return True
    raise DeliberateStop(f"{what}; nan_policy=skip skips such iterations on all ranks")


COMM_FAILURES = ("timed out", "timeout", "connection closed", "connection reset", "broken pipe", "gloo")


def peer_lost(e: BaseException, rank: int, timeout_s: float) -> BaseException:
    """A raw gloo error from a collective the runner calls itself (the non-finite check, the stats, the
    evaluation) as a :class:`PeerLostError` saying what happened; anything else unchanged.  (gvq's own
    P2P waits raise PeerLostError naming the peer; the launcher names a frozen rank.)"""
    text = str(e).strip()
    if isinstance(e, PeerLostError) or not isinstance(e, RuntimeError) or not any(
            w in text.lower() for w in COMM_FAILURES):
        return e
    first = text.splitlines()[0] if text else type(e).__name__
    return PeerLostError(rank, f"a collective got no answer within {timeout_s:g}s or a peer's "
                               f"connection closed (a peer stopped or died): {first[:300]}")


# -- learning stopped: the loss back at chance -----------------------------------------------------------
#: the train loss a uniform guess over C classes scores is ln C; a run whose smoothed loss sits at or above
#: CHANCE_BAND x ln C for the last COLLAPSE_SHARE of its iterations (at least COLLAPSE_MIN) and whose final
#: test accuracy is at most CHANCE_ACC x 1/C learned nothing there, whatever it learned before: collapsed
CHANCE_BAND = 0.95       # lower => also flags runs that still learn a little
COLLAPSE_SHARE = 0.2     # higher => a collapse must last longer before it is named
COLLAPSE_MIN = 20
CHANCE_ACC = 2.0         # higher => flags runs a little better than chance too
LOSS_SMOOTHING = 0.1     # weight of the newest loss in the moving average (higher => reacts faster, noisier)
#: a run of at least NEVER_MIN iterations whose smoothed loss never went below the band, ending at chance
#: accuracy, never learned (too short a run looks the same: lower => flags shorter runs too)
NEVER_MIN = 100


def track_chance(ema: float, since: int | None, learned: bool, loss: float, it: int,
                 num_classes: int) -> tuple[float, int | None, bool]:
    """(moving average of the train loss, first iteration of its current stretch back at chance, whether
    it has been below chance yet).  A run that never left chance is not said to collapse: too short a
    run or too small a learning rate looks the same.  A skipped step's NaN loss changes nothing."""
    if not math.isfinite(loss):
        return ema, since, learned
    ema = loss if not math.isfinite(ema) else (1 - LOSS_SMOOTHING) * ema + LOSS_SMOOTHING * loss
    if ema < CHANCE_BAND * math.log(num_classes):
        return ema, None, True
    return ema, (it if since is None and learned else since), learned


def never_learned_reason(learned: bool, ema: float, iters: int, test_acc: float, num_classes: int) -> str | None:
    """One line saying the run never left chance (loss and final accuracy), or None where it did or was
    too short to say (:data:`NEVER_MIN`)."""
    if learned or iters < NEVER_MIN or test_acc > CHANCE_ACC / num_classes:
        return None
    return (f"train loss never left chance in {iters} iterations (smoothed {ema:.3f} >= {CHANCE_BAND} x ln "
            f"{num_classes} = {CHANCE_BAND * math.log(num_classes):.3f}); final test accuracy {test_acc:.3f}, "
            f"chance {1 / num_classes:.3f}")


def collapse_reason(ema: float, since: int | None, iters: int, test_acc: float, num_classes: int) -> str | None:
    """One line saying the run ended back at chance, or None where it did not."""
    tail = max(COLLAPSE_MIN, math.ceil(COLLAPSE_SHARE * iters))
    if since is None or iters - since < tail or test_acc > CHANCE_ACC / num_classes:
        return None
    return (f"train loss back at chance since iteration {since} to the end (smoothed {ema:.3f} >= {CHANCE_BAND} x "
            f"ln {num_classes} = {CHANCE_BAND * math.log(num_classes):.3f}); final test accuracy {test_acc:.3f}, "
            f"chance {1 / num_classes:.3f}")
