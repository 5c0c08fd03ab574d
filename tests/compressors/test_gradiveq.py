"""GradiVeQ compressor: layout (Fig. 3a), K / tail / s rules, Eq. 6 choice of d, Eq. 1/3-5 additivity,
wire format and state round trip; single process, small shapes."""
from __future__ import annotations

import io
import math
import random

import pytest
import torch

from gvq.compressors.base import split_on_cuts
from gvq.compressors.gradiveq.codec import GradiVeQ, relative_loss
from gvq.compressors.gradiveq.layout import GradLayout
from gvq.compressors.gradiveq.pca import principal_subspace
from gvq.compressors.gradiveq.state import PCAState, value_count

# two conv layers with biases / a BN-like vector / a linear head in between (raw regions)
SHAPES = [(8, 3, 3, 3), (8,), (8,), (8, 8, 3, 3), (8,), (10, 8), (10,)]
NUMEL = sum(math.prod(s) for s in SHAPES)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _samples(L: int, numel: int, rank: int = 4, seed: int = 0, noise: float = 0.05) -> torch.Tensor:
    """Correlated 'aggregated gradients': a shared mean, a low-rank part with decaying scales, noise."""
    g = _gen(seed)
    coef = torch.randn(L, rank, generator=g) * torch.logspace(0, -1, rank)
    return (torch.randn(numel, generator=g) + coef @ torch.randn(rank, numel, generator=g)
            + noise * torch.randn(L, numel, generator=g))


def _fitted(world_size: int = 1, shapes=SHAPES, L: int = 20, **kw) -> GradiVeQ:
    comp = GradiVeQ(world_size=world_size, **kw).bind(shapes)
    return comp.fit(_samples(L, comp.layout.numel))


def _reference(comp: GradiVeQ, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Whole-vector payload U_d^T (g - mu) and reconstruction U_d U_d^T (g - mu) + mu, built from the
    bases directly (raw values pass through), for an aggregate g."""
    payload, recon, pos = [], g.clone(), 0
    for grp in comp.groups:
        payload.append(g[pos: grp.start])
        U, mu = comp.basis(grp.gid)
        X = g[grp.start: grp.stop].view(grp.n, grp.K) - mu
        payload.append((X @ U).reshape(-1))
        recon[grp.start: grp.stop] = (X @ U @ U.T + mu).reshape(-1)
        pos = grp.stop
    payload.append(g[pos:])
    return torch.cat(payload), recon


def _assert_ring_sums_are_linear(comp: GradiVeQ, grads: list, numel: int) -> None:
    """Eq. 1 through every segmentation: ranks' payloads summed per segment are the payload of the sum,
    and decompress to its projection."""
    ref_payload, ref_recon = _reference(comp, sum(grads))
    for segs in _segmentations(comp, numel):
        summed = [sum(comp.compress(g[s], s) for g in grads) for s in segs]
        torch.testing.assert_close(torch.cat(summed), ref_payload, rtol=1e-5, atol=1e-4)
        recon = torch.cat([comp.decompress(p, s) for p, s in zip(summed, segs)])
        torch.testing.assert_close(recon, ref_recon, rtol=1e-5, atol=1e-4)


def _segmentations(comp: GradiVeQ, numel: int) -> list[list[slice]]:
    cuts = comp.cuts(numel)
    rng = random.Random(0)
    picked = sorted(rng.choices(cuts, k=9) + [0, numel])   # duplicates => empty segments
    units = [slice(a, b) for a, b in zip(cuts[:-1], cuts[1:])]   # one slice or one raw value each
    return [[slice(0, numel)], split_on_cuts(cuts, 3), split_on_cuts(cuts, 7),
            [slice(a, b) for a, b in zip(picked[:-1], picked[1:])], units]


# -- layout --------------------------------------------------------------------------------------------
def test_flatten_matches_paper_index_formula_and_unflatten_inverts():
    shapes = [(4, 3, 2, 5), (4,), (6, 4), (2, 4, 1, 3)]
    layout = GradLayout(shapes)
    grads = [torch.randn(s, generator=_gen(i)) for i, s in enumerate(shapes)]
    flat = layout.flatten(grads)
    assert flat.numel() == layout.numel == sum(math.prod(s) for s in shapes)
    for t, shape, off in zip(grads, shapes, layout.offsets):
        if len(shape) == 4:
            F, D, H, W = shape
            for f in range(F):
                for d in range(D):
                    for h in range(H):
                        for w in range(W):
                            assert flat[off + ((h * W + w) * D + d) * F + f] == t[f, d, h, w]
        else:
            assert torch.equal(flat[off: off + t.numel()], t.reshape(-1))
    out = [torch.zeros(s) for s in shapes]
    layout.unflatten(flat, out)
    assert all(torch.equal(a, b) for a, b in zip(out, grads))
    # and the other direction: every flat vector is the image of the tensors it unflattens to
    other = torch.randn(layout.numel, generator=_gen(9))
    layout.unflatten(other, out)
    assert torch.equal(layout.flatten(out), other)


# -- K rule, tail rule, reuse factor ---------------------------------------------------------------------
def test_K_auto_is_F_times_D_times_W():
    comp = GradiVeQ().bind([(16, 16, 3, 3), (4, 2, 3, 5)])       # paper's example, and H != W
    assert [(g.K, g.n) for g in comp.groups] == [(768, 3), (40, 3)]


def test_K_x3_is_three_F_times_D():
    comp = GradiVeQ(K="x3").bind([(16, 16, 3, 3), (4, 2, 3, 5)])
    assert [(g.K, g.n, g.tail) for g in comp.groups] == [(768, 3, 0), (24, 5, 0)]


def test_explicit_K_not_a_multiple_of_F_times_D_raises():
    GradiVeQ(K=48).bind([(4, 2, 3, 3)])
    with pytest.raises(ValueError, match=r"^K=24: must be a multiple of F\*D=16 for layer 1 shape \(4, 4, 3, 3\)"):
        GradiVeQ(K=24).bind([(4, 2, 3, 3), (4, 4, 3, 3)])


def test_nondividing_layer_keeps_K_and_sends_its_tail_raw():
    comp = GradiVeQ(K="x2").bind([(4, 2, 3, 3), (3,)])            # M = 72 = 4 slices of 16 + tail 8
    [g] = comp.groups
    assert (g.start, g.K, g.n, g.tail) == (0, 16, 4, 8)
    assert comp.cuts(75) == [0, 16, 32, 48] + list(range(64, 76))
    comp.fit(_samples(10, 75))
    d = comp.layer_stats()[0]["d"]
    x = torch.randn(75, generator=_gen(1))
    p = comp.compress(x, slice(0, 75))
    assert p.numel() == 4 * d + 8 + 3 and torch.equal(p[4 * d:], x[64:])
    assert torch.equal(comp.decompress(p, slice(0, 75))[64:], x[64:])
    # a layer smaller than one slice travels wholly raw
    raw = GradiVeQ(K="x10").bind([(4, 2, 3, 3)]).fit(_samples(10, 72))
    assert raw.groups == [] and torch.equal(raw.compress(x[:72], slice(0, 72)), x[:72])


@pytest.mark.parametrize("s, sizes", [(1, [1] * 16), (5, [5, 5, 5, 1]), (math.inf, [16]), ("inf", [16])])
def test_reuse_factor_s_groups_consecutive_slices(s, sizes):
    comp = GradiVeQ(K="x1", s=s).bind([(4, 4, 4, 4)])
    assert [g.n for g in comp.groups] == sizes
    assert [g.start for g in comp.groups] == [16 * sum(sizes[:i]) for i in range(len(sizes))]


def test_group_basis_is_fitted_from_its_first_slice_only():
    shapes = [(4, 4, 4, 4)]
    samples = _samples(12, 256)
    a = GradiVeQ(K="x1", s=4).bind(shapes).fit(samples)
    changed = samples.clone()
    changed[:, 16:64] = torch.randn(12, 48, generator=_gen(5))   # slices 1..3 of group 0
    b = GradiVeQ(K="x1", s=4).bind(shapes).fit(changed)
    assert torch.equal(a.basis(0)[0], b.basis(0)[0])
    first = samples[:, :16].double()
    ref = principal_subspace(first - first.mean(0), 11, 0.01, first.mean(0)).U
    torch.testing.assert_close(a.basis(0)[0] @ a.basis(0)[0].T, ref @ ref.T)
    # pooling uses every slice of the group, so the changed slices change the basis
    pa = GradiVeQ(K="x1", s=4, pool=True).bind(shapes).fit(samples)
    pb = GradiVeQ(K="x1", s=4, pool=True).bind(shapes).fit(changed)
    assert not torch.equal(pa.basis(0)[0], pb.basis(0)[0])


def test_mu_is_each_slice_mean_or_the_first_slice_mean_with_mu_group():
    samples = _samples(12, 256)
    per_slice = GradiVeQ(K="x1").bind([(4, 4, 4, 4)]).fit(samples)
    torch.testing.assert_close(per_slice.basis(0)[1], samples.mean(0).view(16, 16))
    shared = GradiVeQ(K="x1", mu="group").bind([(4, 4, 4, 4)]).fit(samples)
    torch.testing.assert_close(shared.basis(0)[1], samples[:, :16].mean(0).expand(16, 16))


# -- choice of d (Eq. 6) ------------------------------------------------------------------------------------
def _known_spectrum(eig: list[float], L: int = 40, K: int = 128) -> torch.Tensor:
    """L samples of a K-slice whose sample covariance has exactly the eigenvalues ``eig``."""
    g = _gen(3)
    Q = torch.linalg.qr(torch.randn(K, len(eig), generator=g, dtype=torch.float64))[0]
    C = torch.randn(L, len(eig), generator=g, dtype=torch.float64)
    C = torch.linalg.qr(C - C.mean(0))[0]                    # orthonormal, zero-mean columns
    X = C * torch.tensor(eig, dtype=torch.float64).mul(L - 1).sqrt() @ Q.T
    return X + torch.randn(K, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("lam, d", [(0.3, 1), (0.05, 2), (0.01, 3), (0.005, 4), (0.001, 5), (0.0, 5)])
def test_d_is_smallest_meeting_eq6_on_known_spectrum(lam, d):
    eig = [100.0, 25.0, 4.0, 1.0, 0.25]                       # cumulative: .768 .960 .9904 .9981 1
    comp = GradiVeQ(lam=lam).bind([(4, 4, 1, 8)]).fit(_known_spectrum(eig).float())
    [st] = comp.layer_stats()
    assert (st["K"], st["d"], st["ratio"]) == (128, d, 128 / d)
    assert st["energy"] == pytest.approx(sum(eig[:d]) / sum(eig), rel=1e-4)
    assert comp.mean_ratio == pytest.approx(128 / d)


@pytest.mark.parametrize("kw, d", [({"d": 3}, 3), ({"d": 50}, 5), ({"target_ratio": 64}, 2),
                                   ({"target_ratio": 2.0}, 5)])
def test_d_overrides_are_capped_at_the_sample_rank(kw, d):
    comp = GradiVeQ(**kw).bind([(4, 4, 1, 8)]).fit(_known_spectrum([100.0, 25.0, 4.0, 1.0, 0.25]).float())
    assert comp.layer_stats()[0]["d"] == d


def test_zero_variance_gives_d1_along_the_mean():
    comp = GradiVeQ().bind([(4, 4, 1, 8)]).fit(torch.arange(128.0).expand(5, 128))
    U, mu = comp.basis(0)
    assert U.shape == (128, 1)
    torch.testing.assert_close(U[:, 0], mu[0] / mu[0].norm())
    zero = GradiVeQ().bind([(4, 4, 1, 8)]).fit(torch.zeros(1, 128))   # L_t = 1, all zero
    assert zero.basis(0)[0][:, 0].tolist() == [1.0] + [0.0] * 127


@pytest.mark.parametrize("lam", [0.2, 0.05, 0.01, 0.001])
def test_eq6_bounds_the_loss_on_the_sampled_slices_by_lambda(lam):
    samples = _samples(30, NUMEL, rank=8, noise=0.2)
    comp = GradiVeQ(lam=lam).bind(SHAPES).fit(samples)
    for grp, st in zip(comp.groups, comp.layer_stats()):
        U = comp.basis(grp.gid)[0].double()
        X = samples[:, grp.start: grp.start + grp.K].double()
        X = X - X.mean(0)
        loss = float((X - X @ U @ U.T).square().sum() / X.square().sum())
        assert loss <= lam + 1e-6
        assert loss == pytest.approx(1 - st["energy"], abs=1e-6)


# -- compress / decompress (Eq. 1, 3-5) -------------------------------------------------------------------
@pytest.mark.parametrize("N", [2, 3, 4])
def test_sum_of_rank_payloads_is_the_payload_of_the_sum_and_decompresses_to_the_projection(N):
    comp = _fitted(world_size=N)
    _assert_ring_sums_are_linear(comp, [torch.randn(NUMEL, generator=_gen(100 + n)) * 2 for n in range(N)], NUMEL)


# a transformer's parameters: an embedding, LayerNorm vectors, attention and MLP weights with biases (no conv)
TRANSFORMER = [(16, 8), (8,), (8,), (24, 8), (24,), (8, 8), (8,), (32, 8), (32,), (8, 32)]


@pytest.mark.parametrize("shapes, matrices, layers", [
    (SHAPES, "auto", [0, 3]), (SHAPES, "conv", [0, 3]), (SHAPES, "rows", [0, 3, 5]),
    (TRANSFORMER, "auto", [0, 3, 5, 7, 9]), (TRANSFORMER, "rows", [0, 3, 5, 7, 9]), (TRANSFORMER, "conv", [])])
def test_matrices_chooses_the_sliced_layers_rows_as_slices(shapes, matrices, layers):
    comp = GradiVeQ(matrices=matrices).bind(shapes)
    assert sorted({g.layer for g in comp.groups}) == layers
    for g in comp.groups:
        if len(g.shape) == 2:
            assert (g.K, g.n) == (g.shape[1], g.shape[0])          # one row a slice, every row


def test_a_bucket_of_matrices_in_a_cnn_stays_raw_as_in_the_whole_codec():
    comp = GradiVeQ().bind(SHAPES)                          # auto: a CNN, conv kernels only
    assert comp.restricted_to([5, 6]).groups == []          # the head's bucket: raw, as in the whole codec


def test_K_for_a_matrix_counts_rows_and_refuses_a_partial_row():
    assert [g.K for g in GradiVeQ(K="x2").bind(TRANSFORMER).groups][:2] == [16, 16]
    with pytest.raises(ValueError, match="multiple of a row"):
        GradiVeQ(K=12).bind(TRANSFORMER)


@pytest.mark.parametrize("pool", [False, True])
def test_rows_of_matrices_stay_linear_through_the_ring_s_segments(pool):
    """Eq. 1 on a transformer's layout: ranks' payloads summed segment by segment (as the ring sums them)
    are the payload of the sum, and decompress to its projection."""
    numel = sum(math.prod(s) for s in TRANSFORMER)
    comp = GradiVeQ(world_size=3, pool=pool).bind(TRANSFORMER)
    comp.fit(_samples(12, numel))
    _assert_ring_sums_are_linear(comp, [torch.randn(numel, generator=_gen(200 + n)) for n in range(3)], numel)
    assert comp.wire_ratio(numel) > 1


def test_payload_length_equals_payload_spec_for_every_segment():
    comp = _fitted(world_size=3)
    x = torch.randn(NUMEL, generator=_gen(7))
    for segs in _segmentations(comp, NUMEL):
        for s in segs:
            p = comp.compress(x[s], s)
            assert comp.payload_spec(s) == (torch.float32, p.numel())
            assert comp.decompress(p, s).numel() == s.stop - s.start
    n_raw = NUMEL - sum(g.n * g.K for g in comp.groups)
    payload = n_raw + sum(g.n * st["d"] for g, st in zip(comp.groups, comp.layer_stats()))
    assert comp.wire_ratio(NUMEL) == pytest.approx(NUMEL / payload)


def test_segment_end_inside_a_slice_raises():
    comp = _fitted()
    with pytest.raises(ValueError, match="inside a slice"):
        comp.compress(torch.zeros(10), slice(0, 10))


def test_compress_before_fit_raises_clearly():
    comp = GradiVeQ().bind(SHAPES)
    with pytest.raises(RuntimeError, match="not fitted"):
        comp.compress(torch.zeros(NUMEL), slice(0, NUMEL))
    with pytest.raises(RuntimeError, match="bind"):
        GradiVeQ().cuts(NUMEL)


def test_local_loss_is_eq7_and_compression_error_is_the_aggregate_projection_error():
    N = 3
    comp = _fitted(world_size=N)
    g = torch.randn(NUMEL, generator=_gen(11))
    err = den = 0.0
    for grp in comp.groups:
        U, mu = comp.basis(grp.gid)
        X = g[grp.start: grp.stop].view(grp.n, grp.K)
        err += float((X - ((X - mu / N) @ U @ U.T + mu / N)).square().sum())
        den += float(X.square().sum())
    assert comp.local_loss(g) == pytest.approx(err / den, rel=1e-4)
    _, recon = _reference(comp, g)
    mask = torch.zeros(NUMEL, dtype=torch.bool)
    for grp in comp.groups:
        mask[grp.start: grp.stop] = True
    ref = float((recon - g)[mask].square().sum() / g[mask].square().sum())
    assert comp.compression_error(g) == pytest.approx(ref, rel=1e-4)


@pytest.mark.parametrize("N", [1, 3])
def test_tracked_sums_read_off_the_payloads_equals_local_loss(N):
    """The ring's Eq. 7 (||c||^2 - ||U^T c||^2 from the payloads it sends) == the direct residual, for
    any segmentation the ring may use, raw values included; track(None) stops it."""
    comp = _fitted(world_size=N, s=2)
    g = torch.randn(NUMEL, generator=_gen(21))
    for segs in _segmentations(comp, NUMEL):
        comp.track(g)
        for s in segs:
            comp.compress(g[s], s)
        assert relative_loss(*comp.tracked_sums()) == pytest.approx(comp.local_loss(g), rel=1e-4, abs=1e-6)
    comp.track(None)
    with pytest.raises(RuntimeError, match="track"):
        relative_loss(*comp.tracked_sums())


@pytest.mark.parametrize("N", [2, 4])
def test_bfloat16_bases_keep_eq1_to_bf16_precision_and_the_ratio(N):
    """basis_dtype=bfloat16: same state, same payload sizes; payload sums still decompress to the
    projection of the sum up to bf16 rounding (2**-8 relative), and the loss barely moves."""
    exact = _fitted(world_size=N, K="x1")
    fast = GradiVeQ(world_size=N, K="x1", basis_dtype="bfloat16").bind(SHAPES)
    fast.load_pca(exact.pca)                                      # one state value, two codecs
    grads = [torch.randn(NUMEL, generator=_gen(200 + n)) for n in range(N)]
    _, ref_recon = _reference(exact, sum(grads))
    scale = float(ref_recon.abs().max())
    for segs in _segmentations(exact, NUMEL)[:3]:
        summed = [sum(fast.compress(g[s], s) for g in grads) for s in segs]
        assert [p.numel() for p in summed] == [exact.payload_spec(s)[1] for s in segs]
        recon = torch.cat([fast.decompress(p, s) for p, s in zip(summed, segs)])
        assert float((recon - ref_recon).abs().max()) < 2 ** -6 * scale
        assert not torch.equal(recon, ref_recon)          # it really ran in bf16
    g = sum(grads)
    assert fast.compression_error(g) == pytest.approx(exact.compression_error(g), rel=1e-4)
    assert fast.wire_ratio(NUMEL) == exact.wire_ratio(NUMEL)


# -- state ----------------------------------------------------------------------------------------------------
def test_pca_state_round_trip_gives_bitwise_identical_payloads():
    src = _fitted(world_size=2, s=2, K="x1")
    ds, vals = src.pca.tensors()
    dst = GradiVeQ(world_size=2, s=2, K="x1").bind(SHAPES)       # a receiving rank: buffers first
    d_buf = torch.empty(len(dst.groups), dtype=torch.int64)
    d_buf.copy_(ds)
    v_buf = torch.empty(value_count(dst.groups, d_buf))
    v_buf.copy_(vals)
    dst.load_pca(PCAState.from_tensors(d_buf, v_buf, dst.groups))
    assert dst.pca.digest == src.pca.digest and dst.pca.ds == src.pca.ds
    buf = io.BytesIO()
    torch.save(src.state_dict(), buf)
    buf.seek(0)
    ckpt = GradiVeQ(world_size=2, s=2, K="x1")                   # unbound: the checkpoint binds it
    ckpt.load_state_dict(torch.load(buf))
    x = torch.randn(NUMEL, generator=_gen(13))
    for other in (dst, ckpt):
        assert other.layer_stats() == src.layer_stats()
        for s in split_on_cuts(src.cuts(NUMEL), 3):
            p = src.compress(x[s], s)
            assert torch.equal(other.compress(x[s], s), p)
            assert torch.equal(other.decompress(p, s), src.decompress(p, s))


def test_a_codec_restricted_to_some_layers_shares_their_bases_and_codes_them_alike():
    """``restricted_to`` (a DDP bucket's codec): the layers' groups in the bucket's order, holding the
    whole codec's bases themselves (no copies), and each layer reconstructed as the whole codec does it;
    the whole codec keeps its layout, and an unfitted codec gives an unfitted one."""
    comp, layers = _fitted(world_size=2, s=2, K="x1"), [3, 4, 1, 0]      # a bucket: reversed, raw inside
    sub = comp.restricted_to(layers)
    whole = [comp.basis(g.gid)[0] for i in layers for g in comp.groups if g.layer == i]
    shared = [sub.basis(g.gid)[0] for g in sub.groups]
    assert len(shared) == len(whole) > 2 and all(a is b for a, b in zip(shared, whole))
    grads = [torch.randn(s, generator=_gen(i)) for i, s in enumerate(SHAPES)]
    want, got = [torch.empty(s) for s in SHAPES], [torch.empty(SHAPES[i]) for i in layers]
    for codec, g, out in ((comp, grads, want), (sub, [grads[i] for i in layers], got)):
        x, seg = codec.flatten(g), slice(0, codec.layout.numel)
        codec.unflatten(codec.decompress(codec.compress(x, seg), seg), out)
    for i, g in zip(layers, got):
        torch.testing.assert_close(g, want[i], rtol=1e-6, atol=1e-6)
    assert comp.layout.shapes == [tuple(s) for s in SHAPES] and comp.fitted
    assert not GradiVeQ().bind(SHAPES).restricted_to([3, 0]).fitted


# -- config ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw, key", [
    ({"lam": 1.0}, "lambda="), ({"lambda": -0.1}, "lambda="), ({"lam": float("nan")}, "lambda="),
    ({"K": "x0"}, "K="), ({"K": 0}, "K="), ({"K": "big"}, "K="), ({"K": True}, "K="),
    ({"s": 0}, "s="), ({"s": 1.5}, "s="), ({"s": float("nan")}, "s="), ({"d": 0}, "d="),
    ({"target_ratio": 1.0}, "target_ratio="), ({"d": 2, "target_ratio": 4}, "d="),
    ({"world_size": 0}, "world_size="), ({"mu": "x"}, "mu="), ({"pool": "yes"}, "pool="), ({"foo": 1}, "foo"),
    ({"basis_dtype": "float16"}, "basis_dtype="), ({"matrices": "cols"}, "matrices="),
])
def test_bad_config_raises_a_one_line_error_naming_the_key(kw, key):
    with pytest.raises(ValueError) as err:
        GradiVeQ(**kw)
    assert str(err.value).startswith(key) and "\n" not in str(err.value)


def test_lambda_is_accepted_under_its_yaml_key():
    assert GradiVeQ(**{"lambda": 0.2}).lam == 0.2


def test_fitted_state_lives_on_the_device_of_the_fit():
    """Codecs allocate on their input's device: state set from meta tensors (a stand-in for CUDA here)
    is built on meta, nothing on the host."""
    comp = _fitted()
    U, mu = [u.to("meta") for u in comp.pca.U], [m.to("meta") for m in comp.pca.mu]
    comp.load_pca(PCAState.of(U, mu, comp.pca.energy, "meta"))
    for t in [comp._mu_flat, *comp._Uc, *comp._Ud, *comp._muU]:
        assert t.device.type == "meta"
    whole = slice(0, comp.layout.numel)
    payload = comp.compress(torch.empty(comp.layout.numel, device="meta"), whole)   # payload on meta too
    assert payload.device.type == "meta"
    assert comp.decompress(payload, whole).device.type == "meta"
    ds, vals = comp.pca.tensors()                                # what the relay sends, and receives into
    assert ds.device.type == vals.device.type == "meta"


@pytest.mark.parametrize("rows, K", [(30, 200), (400, 64)])      # sample space, then K space
def test_gram_spectrum_is_the_svds_within_float_tolerance(rows, K):
    """The fit's eigendecomposition of the smaller Gram matrix gives the SVD's singular values and, for
    every direction above the rank tolerance, its vector up to sign."""
    from gvq.compressors.gradiveq.pca import _spectrum
    g = torch.Generator().manual_seed(1)
    scales = torch.logspace(0, -3, 12, dtype=torch.float64)
    X = (torch.randn(rows, 12, generator=g, dtype=torch.float64) * scales) @ torch.randn(12, K, generator=g,
                                                                                         dtype=torch.float64)
    X = (X + 1e-6 * torch.randn(rows, K, generator=g, dtype=torch.float64)).float().double()
    S, top = _spectrum(X, torch.finfo(torch.float32).eps)
    _, S_ref, Vh_ref = torch.linalg.svd(X, full_matrices=False)
    n = min(rows, K)
    Vh = top(n)
    # the first k: the same rows, from a GEMM of another shape (X^T times k or n columns of P), whose
    # blocking and so last bits depend on the CPU's BLAS kernels: float64 round-off, not bit for bit
    torch.testing.assert_close(top(5), Vh[:5], rtol=0, atol=1e-12)
    assert S.shape == (n,) and Vh.shape == (n, K)
    assert torch.allclose(S, S_ref, rtol=0, atol=1e-7 * float(S_ref[0]))
    cos = (Vh[:12] * Vh_ref[:12]).sum(1).abs()                          # the 12 real directions
    assert float((1 - cos).abs().max()) < 1e-6
    S64, _ = _spectrum(X, torch.finfo(torch.float64).eps)              # float64 samples: the SVD itself
    assert torch.equal(S64, S_ref)


def test_folded_addmm_and_streaming_layouts_agree(monkeypatch):
    """Small fp32 bases compress/decompress as one addmm (mu folded in), large ones through the
    streaming layouts: the two give the same payloads and reconstructions within float tolerance."""
    import gvq.compressors.gradiveq.codec as codec_mod
    shapes = [(16, 3, 3, 3), (16,), (32, 16, 3, 3), (10, 32)]
    g = torch.Generator().manual_seed(3)
    outs = []
    for fold_bytes in (0, 1 << 30):
        monkeypatch.setattr(codec_mod, "FOLD_BYTES", fold_bytes)
        comp = GradiVeQ(K="auto", world_size=2)
        comp.bind(shapes)
        n = comp.layout.numel
        g.manual_seed(3)
        comp.fit(torch.randn(6, 4, generator=g) @ torch.randn(4, n, generator=g))
        assert all(comp._fold) == bool(fold_bytes) and any(comp._fold) == bool(fold_bytes)
        x = torch.randn(n, generator=g)
        payload = comp.compress(x, slice(0, n))
        outs.append((payload, comp.decompress(payload, slice(0, n))))
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(outs[0][1], outs[1][1], rtol=1e-5, atol=1e-6)


# ---- the device path (batched.py) against the host's per-piece GEMMs ---------------------------------
RESNETISH = [(16, 3, 3, 3), (16,), (16, 16, 3, 3), (16, 16, 3, 3), (16,), (32, 16, 3, 3), (32, 32, 3, 3),
             (32,), (32, 32, 3, 3), (10, 32), (10,)]


@pytest.mark.parametrize("kw", [{}, {"basis_dtype": "bfloat16"}, {"pool": True, "target_ratio": 4},
                                {"s": 2, "mu": "group"}], ids=["paper", "bf16", "pooled", "s2"])
@pytest.mark.parametrize("world_size", [1, 3])
def test_batched_device_path_codes_as_the_host_path(kw, world_size, monkeypatch):
    """Whole gradient and ring segments (cut inside groups and across layers): the batched path's payloads,
    reconstructions, payload sums and Eq. 7 loss equal the per-piece GEMMs' to float (bf16) round-off."""
    comp = _fitted(world_size=world_size, shapes=RESNETISH, L=12, **kw)
    n = comp.layout.numel
    g = torch.randn(n, generator=_gen(5))
    tol = {"rtol": 2e-2, "atol": 2e-2} if kw.get("basis_dtype") else {"rtol": 1e-4, "atol": 1e-4}
    for segs in ([slice(0, n)], split_on_cuts(comp.cuts(n), 4), split_on_cuts(comp.cuts(n), 7)):
        got = {}
        for flag in ("1", "0"):
            comp.kernels, comp._paths = ("auto" if flag == "1" else "torch"), {}   # chosen anew: host, then torch
            comp.track(g)
            pays = [comp.compress(g[s], s) for s in segs]
            outs = [comp.decompress(p + p, s) for p, s in zip(pays, segs)]      # summed in the code domain
            got[flag] = pays, outs, relative_loss(*comp.tracked_sums())
        for a, b in zip(got["1"][0] + got["1"][1], got["0"][0] + got["0"][1]):
            torch.testing.assert_close(b, a, **tol)
        assert got["0"][2] == pytest.approx(got["1"][2], rel=1e-3, abs=1e-5)
