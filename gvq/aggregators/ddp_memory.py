"""torch's PowerSGD hook memory, per parameter: what :class:`gvq.aggregators.ddp.DDPAggregator` saves and
restores so that ``aggregator=ddp_powersgd`` resumes bitwise.

The hook keys its error-feedback memory and its warm-start P / Q by DDP bucket index, as flat tensors
laid out in the bucket's parameter order.  That key is not stable: a new DDP instance buckets parameters
in model order until it rebuilds its buckets after its first iteration (gradient-ready order), so a
resumed run's bucket 0 is not the saved run's.  Cut per parameter, the memory survives any re-bucketing:
on resume, and whenever DDP re-buckets, each bucket's tensors are rebuilt from its parameters' pieces the
first time the hook sees it.

The P / Q layout mirrors ``powerSGD_hook``: a bucket's gradients viewed as (shape[0], -1) matrices; those
that pass :func:`hook_compresses` grouped by matrix shape in order of first appearance; inside a group, in
bucket order; each matrix takes n*r of P and m*r of Q, r = min(n, m, rank).
"""
from __future__ import annotations

import math

import torch


def hook_compresses(n: int, m: int, rank: int, min_compression_rate: float) -> bool:
    """Does ``powerSGD_hook`` compress an n x m matrix at this rank?  Its rule (torch's private
    ``_should_compress``), restated so gvq calls no private torch function;
    tests/run/test_internals.py holds the two equal, so a torch that changes its rule fails there."""
    return (n + m) * rank * min_compression_rate < n * m


def pq_layout(state, params: list[int]) -> list[tuple[int, int, int]]:
    """(parameter index, P length, Q length) in the order the hook lays them out in its P / Q memory."""
    st, groups = state.inner_state, {}
    for i in params:
        shape = state.shapes[i]
        n, m = shape[0], math.prod(shape[1:])
        r = min(n, m, st.matrix_approximation_rank)
        if hook_compresses(n, m, r, st.min_compression_rate):
            groups.setdefault((n, m), []).append((i, n * r, m * r))
    return [item for group in groups.values() for item in group]


def per_parameter(state) -> dict:
    """{"error", "p", "q"}: a list over the model's parameters of each one's piece (None: none held)."""
    st, n = state.inner_state, len(state.shapes)
    out = {"error": [None] * n, "p": [None] * n, "q": [None] * n}
    for b, params in state.buckets.items():
        err = st.error_dict.get(b)
        if err is not None:
            pieces = err.split([math.prod(state.shapes[i]) for i in params])
            for i, piece in zip(params, pieces):
                out["error"][i] = piece.clone()
        if b not in st.p_memory_dict:
            continue
        layout = pq_layout(state, params)
        for key, memory, col in (("p", st.p_memory_dict[b], 1), ("q", st.q_memory_dict[b], 2)):
            for item, piece in zip(layout, memory.split([item[col] for item in layout])):
                out[key][item[0]] = piece.clone()
    return out


def restore_bucket(state, b: int) -> None:
    """Rebuild bucket ``b``'s error memory and P / Q from ``state.pending`` (pieces of its parameters)."""
    st, params, pend = state.inner_state, state.buckets[b], state.pending
    if st.use_error_feedback and params and all(pend["error"][i] is not None for i in params):
        st.error_dict[b] = torch.cat([pend["error"][i] for i in params])
    layout = pq_layout(state, params)
    if st.warm_start and layout and all(pend["p"][i] is not None for i, _, _ in layout):
        st.p_memory_dict[b] = torch.cat([pend["p"][i] for i, _, _ in layout])
        st.q_memory_dict[b] = torch.cat([pend["q"][i] for i, _, _ in layout])


def see_bucket(state, b: int, params: list[int]) -> None:
    """The hook's first look at bucket ``b`` this iteration: if DDP re-bucketed, cut the memory per
    parameter on the old layout and drop the hook's stale dicts; then restore what is pending."""
    old = state.buckets.get(b)
    if old is not None and old != params and state.pending is None:
        state.pending = per_parameter(state)
        st = state.inner_state
        st.error_dict.clear()
        st.p_memory_dict.clear()
        st.q_memory_dict.clear()
        state.buckets = {}
    state.buckets[b] = params
    if state.pending is not None:
        restore_bucket(state, b)
