"""One dataclass schema per compressor an aggregator option's ``compressor`` node builds (its fields are the
compressor's keyword arguments, defaults equal to its signature's: ``tests/schema/test_options.py``); the
options that carry them are in :data:`gvq.schema.options.OPTION_SCHEMAS`.  A new codec adds its dataclass
here and its option there.  No torch here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from gvq.schema.choices import (BasisDtype, Fit, IndexFormat, Kernels, Matrices, Mu, Norm, OneBitScope, Scope,
                                SignScope, Threshold, ValueDtype, Vote)


@dataclass
class _Bucketed:
    bucket: Optional[int] = 2048
    clip: Optional[float] = None


@dataclass
class QSGDSchema(_Bucketed):
    _target_: str = "gvq.compressors.qsgd.QSGD"
    bits: Optional[int] = 4
    levels: Optional[int] = None
    norm: Norm = Norm.l2
    kernels: Kernels = Kernels.auto


@dataclass
class _Fitted(_Bucketed):
    fit: Fit = Fit.histogram
    kernels: Kernels = Kernels.auto       # every fitted quantizer has fused Triton kernels


@dataclass
class ORQSchema(_Fitted):
    _target_: str = "gvq.compressors.orq.ORQ"
    levels: int = 5


@dataclass
class LinearSchema(ORQSchema):
    _target_: str = "gvq.compressors.linear.Linear"


@dataclass
class BinGradBSchema(_Fitted):
    _target_: str = "gvq.compressors.bingrad_b.BinGradB"
    threshold: Threshold = Threshold.lloyd


@dataclass
class BinGradPBSchema(_Fitted):
    _target_: str = "gvq.compressors.bingrad_pb.BinGradPB"


@dataclass
class SignSGDSchema(_Bucketed):
    _target_: str = "gvq.compressors.signsgd.ScaledSignSGD"
    kernels: Kernels = Kernels.auto


@dataclass
class EFSignSGDSchema:
    _target_: str = "gvq.compressors.efsignsgd.EFSignSGD"
    scope: SignScope = SignScope.tensor
    bucket: int = 2048
    kernels: Kernels = Kernels.auto       # fused Triton kernels on CUDA (gvq/compressors/_triton_grace.py)


@dataclass
class OneBitSchema:
    _target_: str = "gvq.compressors.onebit.OneBit"
    scope: OneBitScope = OneBitScope.tensor
    kernels: Kernels = Kernels.auto       # fused Triton kernels on CUDA (gvq/compressors/_triton_grace.py)


@dataclass
class SignVoteSchema:
    _target_: str = "gvq.compressors.signum.SignVote"
    vote: Vote = Vote.int8
    kernels: Kernels = Kernels.auto       # fused Triton kernels on CUDA (gvq/compressors/_triton_grace.py)


@dataclass
class TernGradSchema(_Bucketed):
    _target_: str = "gvq.compressors.terngrad.TernGrad"
    kernels: Kernels = Kernels.auto


@dataclass
class TopKSchema:
    _target_: str = "gvq.compressors.topk.TopK"
    ratio: float = 0.01
    scope: Scope = Scope.tensor
    bucket: int = 2048
    values: ValueDtype = ValueDtype.float32
    indices: IndexFormat = IndexFormat.int32
    kernels: Kernels = Kernels.auto       # fused Triton kernels on CUDA (gvq/compressors/_triton_grace.py)


@dataclass
class ChunkTopKSchema:
    _target_: str = "gvq.compressors.topk_chunk.ChunkTopK"
    k: int = 64
    chunk: int = 4096
    bits: int = 2
    clip: float = 6.0
    kernels: Kernels = Kernels.auto       # fused Triton kernels on CUDA (gvq/compressors/_triton_grace.py)


@dataclass
class DGCSchema:
    _target_: str = "gvq.compressors.dgc.DGC"
    ratio: float = 0.001
    sample: float = 0.01
    warmup_iters: int = 0
    warmup_stages: int = 4
    kernels: Kernels = Kernels.auto       # fused Triton kernels on CUDA (gvq/compressors/_dgc_triton.py)


@dataclass
class FP16Schema:
    _target_: str = "gvq.compressors.fp16.FP16"
    kernels: Kernels = Kernels.auto


@dataclass
class GradiVeQSchema:
    _target_: str = "gvq.compressors.gradiveq.codec.GradiVeQ"
    lam: float = 0.01
    K: Any = "auto"             # auto | x<m> | an int (gvq.compressors.gradiveq.layout.parse_K)
    s: float = float("inf")
    pool: bool = False
    d: Optional[int] = None
    target_ratio: Optional[float] = None
    mu: Mu = Mu.slice
    basis_dtype: BasisDtype = BasisDtype.float32
    matrices: Matrices = Matrices.auto
    kernels: Kernels = Kernels.auto       # the device path's steps between its GEMMs (_triton_lowrank.py)


@dataclass
class RandomKSchema:
    _target_: str = "gvq.compressors.randomk.RandomK"
    ratio: float = 0.01
    bucket: Optional[int] = 4096
    scale: bool = False
    kernels: Kernels = Kernels.auto       # fused Triton kernels on CUDA (gvq/compressors/_triton_grace.py)


@dataclass
class NaturalSchema:
    _target_: str = "gvq.compressors.natural.Natural"
    kernels: Kernels = Kernels.auto       # fused Triton kernels on CUDA (gvq/compressors/_triton_grace.py)
