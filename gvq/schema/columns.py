"""Every per-iteration column gvq logs, declared once: its unit, how a row gets it from the ranks, its
value on a skipped step, its wandb key and what it means.  ``metrics.csv``'s header
(:mod:`gvq.run.logs`), the reduction over ranks (:mod:`gvq.run.rows`), the wandb keys, the training
benchmark's columns (:mod:`gvq.bench.train`), the per-run means of the report (:mod:`gvq.report.stats`)
and the column list in docs/columns.md all come from here;
an aggregator's ``extra_fields`` must name columns declared here (tests/schema/test_columns.py).  Adding
a column: one :class:`Column` below, and the code that computes it.

How a row gets a column from the ranks (``reduce``):

* ``max``: the slowest rank's (an iteration waits for it: times, bytes);
* ``mean``: the mean over ranks (loss, accuracy);
* ``rank0``: rank 0's (counters every rank shares, and what only rank 0 knows);
* ``last_backward``: the value of the rank that ended backward last, i.e. the one with the smallest
  ``exposed_s``: every rank's communication ends at about the same moment, so a rank that ended backward
  earlier also waited for its peers' backward, which is not communication;
* ``spread``: ``exposed_s``'s largest minus smallest over ranks (the wait for the slowest peer's backward).
"""
from __future__ import annotations

from dataclasses import dataclass

REDUCTIONS = ("max", "mean", "rank0", "last_backward", "spread")
NOT_WRITTEN = None        # a skipped step leaves the column as the aggregator's / empty


@dataclass(frozen=True)
class Column:
    name: str
    unit: str              # "s": seconds on the run's clock (``clock``); "B": bytes; "": a count or label
    reduce: str            # see the module docstring
    meaning: str
    skipped: object = NOT_WRITTEN   # its value on a step skipped by nan_policy=skip
    base: bool = False     # in every run's metrics.csv (the rest: when the aggregator or runner has it)
    bench: bool = False    # a column of ``python -m gvq.bench train``
    wandb: str = ""        # its wandb key ("": time/<name> for seconds, comm/<name> for the rest)
    reading: bool = False  # a clock reading at the step's end, not an amount the step spent or sent
    unsynced: object = NOT_WRITTEN  # its value on a step whose method synced nothing (local SGD, DiLoCo
                                    # between syncs): the ranks stepped alone, nothing was sent

    @property
    def wandb_key(self) -> str:
        return self.wandb or f"{'time' if self.unit == 's' else 'comm'}/{self.name}"


COLUMNS = (
    Column("iteration", "", "rank0", "the step (0-based)", base=True),
    Column("epoch", "", "rank0", "passes over the training set so far", base=True, wandb="train/epoch"),
    Column("phase", "", "rank0", "the aggregator's phase (gradiveq: warmup | sample | compress; ddp: allreduce or "
       "its hook's name; skipped; local: the method synced nothing this step)", skipped="skipped", base=True,
       unsynced="local"),
    Column("compute_s", "s", "max", "forward + backward + optimizer step, without waiting for the averaging "
       "(with torch DDP or gvq's hook, backward's wait for its last bucket is aggregate_s's)", base=True, bench=True),
    Column("aggregate_s", "s", "max", "what the rank waited, after its backward produced the last gradient, until "
       "every gradient was averaged (post-backward: the whole aggregation; inside backward: the exposed "
       "communication), on either clock", skipped=0, base=True, unsynced=0, bench=True),
    Column("compress_s", "s", "max", "encoding payloads (inside aggregate_s, or inside backward when overlapped)",
       skipped=0, base=True, unsynced=0),
    Column("decompress_s", "s", "max", "decoding payloads", skipped=0, base=True, unsynced=0),
    Column("wire_s", "s", "max", "blocked waiting for peers' messages (the link)", skipped=0, base=True,
       unsynced=0, bench=True),
    Column("stage_s", "s", "max", "GPU payloads copied through host memory (0 on CPU)", skipped=0, base=True,
       unsynced=0),
    Column("bytes_sent", "B", "max", "bytes this rank sent (torch DDP: estimated)", skipped=0, base=True, unsynced=0,
       bench=True),
    Column("bytes_received", "B", "max", "bytes this rank received, counted by every aggregator (an all-gather: the "
       "N - 1 other ranks' payloads, growing with N; a ring about what it sends, exactly where its segments are "
       "equal; torch DDP: estimated; method=demo: its all-gather's N - 1 payloads)", skipped=0, unsynced=0),
    Column("bytes_inter", "B", "max", "bytes this rank sent to ranks of other nodes (net.ranks_per_node: the slow "
       "links' share of bytes_sent; the flat net: all of it)", skipped=0, unsynced=0),
    Column("train_loss", "", "mean", "the step's training loss (NaN on a skipped step)", skipped=float("nan"),
       base=True, wandb="train/loss"),
    Column("train_acc", "", "mean", "the step's training accuracy", base=True, wandb="train/acc"),
    Column("lr", "", "rank0", "the learning rate of the step", base=True, wandb="train/lr"),
    Column("wall_s", "s", "rank0", "the run's time at the end of the step (clock synchronised over ranks)", base=True,
       reading=True),
    Column("test_loss", "", "rank0", "test loss (evaluation rows only)", base=True, wandb="test/loss"),
    Column("test_acc", "", "rank0", "test accuracy (evaluation rows only)", base=True, wandb="test/acc"),
    Column("clock", "", "rank0", "the clock the seconds are on: wall | virtual", base=True),
    Column("real_wall_s", "s", "rank0", "real elapsed seconds, whatever the clock", base=True, reading=True),
    Column("skipped", "", "max", "1 when nan_policy=skip skipped the step", skipped=1),
    Column("synced", "", "rank0", "1 where the method synced in the step (averaged the gradients, the parameters, "
       "DiLoCo's pseudo-gradient or one Streaming DiLoCo fragment's), 0 where every rank stepped alone (bytes_sent "
       "and aggregate_s 0, but for a Streaming DiLoCo fragment landing: its wait and outer step); logged by the "
       "methods that skip syncs (method=local_sgd, diloco, streaming_diloco): without the column every step synced",
       skipped=0, unsynced=0),
    # text data sets (a language model)
    Column("test_bpb", "", "rank0", "test loss in bits per byte (evaluation rows only): test_loss / ln 2 / bytes per "
       "token", wandb="test/bpb"),
    Column("tokens_per_second", "", "rank0", "training tokens per second over all ranks, on the run's clock (wall_s)",
       wandb="train/tokens_per_second"),
    # overlapped communication (gvq's hook: aggregator.overlap=true; torch DDP's own)
    Column("buckets", "", "rank0", "DDP buckets averaged in the step"),
    Column("comm_s", "s", "max", "first bucket launched -> last bucket averaged (method=streaming_diloco: the "
       "averaging of the fragment sent in the step, 0 where none was)", bench=True),
    Column("exposed_s", "s", "last_backward", "last bucket averaged - backward produced it: the communication "
       "backward did not hide (method=streaming_diloco: what the step waited for the averaging of the fragment "
       "it merged, the part of comm_s the compute of the method.delay steps between did not hide; on the wall "
       "clock the averaging blocks at the send, so all of it, on the send's row)", bench=True),
    Column("last_bucket_s", "s", "last_backward", "the last bucket's own averaging (exposed_s is no shorter)",
       bench=True),
    Column("averaging_s", "s", "max", "gvq's hook: the buckets' own averaging, summed (on the communication "
       "thread, mostly behind backward; aggregate_s is what backward did not hide)"),
    Column("straggle_s", "s", "spread", "how much longer the rank that ended backward first waited (for its "
       "peers' backward)", bench=True),
    # compressors
    Column("compression_error", "", "rank0", "||g - decoded(g)||^2 / ||g||^2 of rank 0's gradient (NaN: not "
       "compressed)"),
    Column("ring_density", "", "max", "topology=sparse_ring: the densest chunk the rank sent, nnz / segment length "
       "(1: sent dense, as a chunk is from density 1/2 on): how far the ranks' supports filled in over the ring "
       "(overlapped: each bucket's, averaged weighted by bucket size)"),
    Column("aggregate_error", "", "rank0", "||mean - exact mean||^2 / ||exact mean||^2 of the averaged gradient, "
       "every bucket of the step (exact: an untimed fp64 all-reduce of the ranks' raw gradients; only with "
       "aggregate_error=true; NaN: torch DDP)", skipped=float("nan")),
    Column("compression_ratio", "", "rank0", "gradiveq: the iteration's fp32 gradient bytes over the bytes of the "
       "payloads rank 0 encoded (one encoding, not every hop of the ring: bytes_sent counts those; 1 while "
       "uncompressed); the report's compression ratio is not its mean but rar's bytes_sent over the run's"),
    Column("fit_s", "s", "rank0", "gradiveq: fitting the bases (PCA) at a refresh"),
    Column("monitor_s", "s", "rank0", "gradiveq: the Eq. 7 vote"),
    # the training benchmark only
    Column("iter_s", "s", "max", "one whole step", bench=True),
    Column("backward_s", "s", "max", "backward alone", bench=True),
)
BY_NAME = {c.name: c for c in COLUMNS}
BASE = tuple(c.name for c in COLUMNS if c.base)
BENCH = tuple(c.name for c in COLUMNS if c.bench)
#: what a step spent or sent (seconds, bytes): the columns whose mean over a run is a figure (gvq.report)
AMOUNTS = tuple(c.name for c in COLUMNS if c.unit in ("s", "B") and not c.reading)


def column(name: str) -> Column:
    """The declared column ``name``; KeyError names the registry when it is not declared."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name!r} is not a declared column (gvq/schema/columns.py)") from None


def reduced(kind: str, names) -> tuple[str, ...]:
    """Those of ``names`` a row reduces by ``kind``, in ``names``' order."""
    return tuple(n for n in names if column(n).reduce == kind)


def skipped_row() -> dict:
    """What a step skipped by nan_policy=skip writes in the columns that have a value for it."""
    return {c.name: c.skipped for c in COLUMNS if c.skipped is not NOT_WRITTEN}


def unsynced_row() -> dict:
    """What a step whose method synced nothing writes in the columns that have a value for it."""
    return {c.name: c.unsynced for c in COLUMNS if c.unsynced is not NOT_WRITTEN}


def docs_table() -> str:
    """The columns as docs/columns.md's table (a test keeps the page equal to it)."""
    rows = ["| column | unit | over ranks | skipped step | meaning |", "|---|---|---|---|---|"]
    for c in COLUMNS:
        skip = "" if c.skipped is NOT_WRITTEN else str(c.skipped)
        rows.append(f"| `{c.name}` | {c.unit} | {c.reduce} | {skip} | {c.meaning} |")
    return "\n".join(rows) + "\n"
