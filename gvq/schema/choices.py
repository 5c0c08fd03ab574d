"""The string knobs' allowed values, as enums a schema's field is typed by (a value outside is refused at
compose time, naming the key).  No torch here: the CLI imports this before Hydra composes.
"""
from __future__ import annotations

import enum


class Choice(enum.StrEnum):
    """A string knob's allowed values; members are named as their values (``Topology.ring == "ring"``)."""

    def __reduce_ex__(self, protocol):
        # pickled (spawned ranks, checkpoints) as the plain string: a loader needs neither this module
        # nor to allow it (torch.load(weights_only=True))
        return str, (self.value,)


class Clock(Choice):
    wall = "wall"               # real time; links emulated by sleeping
    virtual = "virtual"         # each rank's CPU time x scales + the link model, computed


class Topology(Choice):
    ring = "ring"               # decode-add-encode (or summed payloads) around a ring
    allgather = "allgather"     # every rank's payload to every rank, decoded once each
    ps = "ps"                   # a parameter server (rank 0) gathers, sums, re-encodes, broadcasts
    sparse_ring = "sparse_ring"  # sparse codecs: a ring of summed sparse chunks, dense from density 1/2; fewer
                                 #   bytes than allgather where supports overlap, more where they are disjoint
    # a two-level net (net.ranks_per_node): reduce-scatter inside the node, the ring above across nodes on each
    # rank's shard (1/R of the vector on the slow links), all-gather inside the node (gvq/comm/hierarchy.py)
    hierarchical = "hierarchical"


class Hop(Choice):
    auto = "auto"               # sum payloads on the ring when the compressor is additive
    sum = "sum"                 # always sum (refused for a non-additive compressor)
    reencode = "reencode"       # always decode-add-encode


RarTopology = Choice("RarTopology", "ring hierarchical", module=__name__)   # aggregator=rar's (Topology's)
Workers = Choice("Workers", "rank node", module=__name__)    # method.workers (gvq/methods/nodes.py)
IntraDtype = Choice("IntraDtype", "fp32 fp16", module=__name__)   # net.intra_dtype (gvq/comm/hierarchy.py)
QgzWire = Choice("QgzWire", "compressed fp16 fp32", module=__name__)   # aggregator=qgz's intra
QgzGather = Choice("QgzGather", "compressed fp32", module=__name__)     # aggregator=qgz's gather
CommCore = Choice("CommCore", "shared own", module=__name__)   # net.comm_core (gvq/comm/clock.py)
# choices whose meaning the option files say
Hook = Choice("Hook", "allreduce fp16 powersgd", module=__name__)
Sampling = Choice("Sampling", "qsgd rar", module=__name__)
Norm = Choice("Norm", "l2 max", module=__name__)
Fit = Choice("Fit", "histogram sorted", module=__name__)
Threshold = Choice("Threshold", "lloyd mean", module=__name__)
Mu = Choice("Mu", "slice group", module=__name__)
BasisDtype = Choice("BasisDtype", "float32 bfloat16", module=__name__)
Matrices = Choice("Matrices", "auto conv rows", module=__name__)
SignScope = Choice("SignScope", "tensor bucket", module=__name__)      # efsignsgd's compressor.scope
OneBitScope = Choice("OneBitScope", "tensor column", module=__name__)  # onebit's compressor.scope
Vote = Choice("Vote", "int8 bits", module=__name__)                    # signum's compressor.vote
Kernels = Choice("Kernels", "auto triton torch", module=__name__)   # compressor.kernels (gvq/compressors/_kernels.py)
Scope = Choice("Scope", "tensor bucket global", module=__name__)            # topk's scope (gvq/compressors/topk.py)
ValueDtype = Choice("ValueDtype", "float32 float16", module=__name__)       # a sparsifier's wire values
IndexFormat = Choice("IndexFormat", "int32 packed", module=__name__)        # a sparsifier's wire indices
EFUnits = Choice("EFUnits", "gradient step", module=__name__)               # aggregator.ef_units (error_feedback.py)
# dataset.split: how ranks divide the training set (gvq/data/batches.py); the option files say which way each pushes
SourceSplit = Choice("SourceSplit", "pooled by_source", module=__name__)   # a corpus of several texts (austen)
LabelSplit = Choice("LabelSplit", "pooled by_label", module=__name__)      # a labelled data set (classes)
OneSource = Choice("OneSource", "pooled", module=__name__)                 # one text: nothing to split by
Tokenizer = Choice("Tokenizer", "bytes bpe", module=__name__)   # dataset.tokenizer (gvq/data/bpe.py)
