"""GradiVeQ on some of the layers: the codec a DDP bucket is averaged with.

A bucket holds some of the model's parameters.  :func:`restrict` binds a codec to just those layers and
hands it the fitted bases and means of their groups, as views of the whole codec's (a group is one
conv layer's slices, so its basis belongs to that layer, whatever bucket the layer lands in): every
bucketing compresses each layer with the same basis, and Eq. (1) holds on each bucket as on the whole
gradient.
"""
from __future__ import annotations

import copy

import torch

from gvq.compressors.gradiveq.codec import GradiVeQ
from gvq.compressors.gradiveq.state import PCAState


def restrict(codec: GradiVeQ, layers: list[int]) -> GradiVeQ:
    """A codec bound to ``layers`` (positions in ``codec``'s shapes, in the bucket's order), sharing
    ``codec``'s fitted state for their groups (none if ``codec`` is not fitted)."""
    sub = copy.copy(codec)                  # the configuration; bind() below replaces all layout state
    sub._track = None
    sub.bind([codec.layout.shapes[i] for i in layers])
    if not codec.fitted:
        return sub
    by_layer: dict[int, list[int]] = {}
    for g in codec.groups:
        by_layer.setdefault(g.layer, []).append(g.gid)
    gids = [gid for i in layers for gid in by_layer.get(i, [])]    # sub's groups, in sub's order
    if len(gids) != len(sub.groups):
        raise ValueError("gradiveq: a bucket's groups differ from the whole codec's")
    pca = codec.pca
    sub.pca = PCAState.of([pca.U[j] for j in gids], [pca.mu[j] for j in gids],
                          [pca.energy[j] for j in gids], pca.device)
    # the forms compress / decompress apply: the whole codec's, not copies (bases are large)
    sub._muU = [codec._muU[j] for j in gids]
    sub._Uc = [codec._Uc[j] for j in gids]
    sub._Ud = [codec._Ud[j] for j in gids]
    sub._fold = [codec._fold[j] for j in gids]
    sub._mu_flat = torch.zeros(sub.layout.numel, device=pca.device)
    for g, j in zip(sub.groups, gids):
        sub._mu_flat[g.start: g.stop] = pca.mu[j].reshape(-1)
    sub._plans = {}
    return sub
