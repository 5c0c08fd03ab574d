"""The ring schedules on a cost model (gvq/predict/schedule.py) against times computed by hand."""
from __future__ import annotations

import numpy as np
import pytest

from gvq.predict import schedule as S


@pytest.mark.parametrize("n", [2, 3, 4, 8, 16])
def test_uncompressed_ring_is_the_textbook_formula(n):
    S_bytes, B, alpha = 1.9e6, 5e7, 2e-3
    t = S.plain_ring(np.full(n, S_bytes / n), np.zeros(n), S.Link(B, alpha))
    assert t.max() == pytest.approx(2 * (n - 1) / n * S_bytes * 8 / B + 2 * (n - 1) * alpha, rel=1e-12)
    assert np.ptp(t) == pytest.approx(0, abs=1e-12)                # equal segments: every rank alike


def test_reencode_ring_pays_every_codec_call_on_the_critical_path():
    # N = 2, c = compress, d = decompress, a = add, w = wire of one segment: c; send, wait w; d + a + c;
    # d; send, wait w; d  =>  2c + 2w + 3d + a
    c, d, a, w = 1.0, 0.5, 0.1, 3.0
    t = S.reencode_ring(np.full(2, w * 1e6 / 8), np.full(2, c), np.full(2, d), np.full(2, d + a + c), S.Link(1e6))
    assert t == pytest.approx(np.full(2, 2 * c + 2 * w + 3 * d + a))


def _pieces(n, P, c, d, a, nbytes):
    shape = (n, P)
    return S.Pieces(np.full(shape, c), np.full(shape, d), np.full(shape, a), np.full(shape, float(nbytes)),
                    np.ones(shape, bool))


def test_algorithm_1_one_piece_by_hand():
    # N = 2, one piece: own compress c, send (arrives c + w); compress the other segment (2c), wait for
    # the left's payload (c + w), add a => t1 = max(2c, c + w) + a; all-gather: send the sum (arrives
    # t1 + w), decompress the held one while it travels (t1 + d), wait (t1 + w), decompress it => + d
    c, d, a, w = 1.0, 0.5, 0.1, 3.0
    t = S.additive_ring(_pieces(2, 1, c, d, a, w * 1e6 / 8), S.Link(1e6))
    t1 = max(2 * c, c + w) + a
    assert t == pytest.approx(np.full(2, max(t1 + d, t1 + w) + d))


def test_pieces_hide_compression_behind_the_wire():
    # same bytes and codec work cut in 4 pieces: the pipeline leaves less of it outside the wire
    c, d, a, w = 0.4, 0.4, 0.0, 1.0
    one = S.additive_ring(_pieces(4, 1, c, d, a, w * 1e6 / 8), S.Link(1e6)).max()
    four = S.additive_ring(_pieces(4, 4, c / 4, d / 4, a, w * 1e6 / 8 / 4), S.Link(1e6)).max()
    wire = 2 * 3 * w                                               # 2(N-1) segment transfers
    assert wire < four < one


def test_empty_pieces_send_nothing_and_latency_counts_per_message():
    n = 4
    p = _pieces(n, 2, 0.0, 0.0, 0.0, 1000.0)
    p.nbytes[:, 1] = 0                                             # second piece of each segment: empty
    t = S.additive_ring(p, S.Link(8e3, alpha=0.5)).max()
    assert t == pytest.approx(2 * (n - 1) * (1.0 + 0.5))           # one 1000-byte message per step


def test_a_rank_waits_for_its_own_send_to_arrive():
    # P2P.wait on a send moves the virtual clock to its arrival.  N = 2, segment 0 takes 3 s on the wire,
    # segment 1 takes 1 s.  Reduce-scatter: rank 0 sends 0 (arrives 3), gets 1 at 1, waits its send: 3;
    # rank 1 gets 0 at 3.  All-gather: rank 0 sends 1 from 3 (arrives 4), rank 1 sends 0 from 3 (6);
    # rank 1 has its receive at 4 but its own send arrives at 6.  Without that wait rank 1 ends at 4.
    t = S.plain_ring(np.array([3e6, 1e6]) / 8, np.zeros(2), S.Link(1e6))
    assert t == pytest.approx([6.0, 6.0])


def test_posting_costs_fixed_plus_per_byte():
    link = S.Link(1e9, msg=1e-4, msg_per_byte=1e-9)
    t = S.plain_ring(np.full(2, 1000.0), np.zeros(2), link)
    # per step: a receive and a send posted (2 x (1e-4 + 1e-6)), then 8 us on the wire
    assert t == pytest.approx(np.full(2, 2 * (2 * (1e-4 + 1e-6)) + 2 * 8e-6))


def test_the_sparse_ring_by_hand_two_messages_a_hop():
    """N = 2, segments of 100 values, 10 of a rank's entries in each: the reduce-scatter hop sends a 4-byte
    header, then 10 pairs (80 B), merges (1 s); the all-gather hop a header, then the 20 pairs of both ranks
    (160 B, density 1/5: still pairs); compress first (2 s), write-back last (3 s)."""
    B, a = 8.0, 0.5                                # 1 byte a second
    t = S.sparse_ring(np.full(2, 10.0), np.full(2, 100.0), 2.0, np.ones(2), 3.0, S.Link(B, a))

    def hop(body):                                 # a header, then the body: each its bytes on the link and alpha
        return (4 + a) + (body + a)
    assert t == pytest.approx(np.full(2, 2.0 + hop(80) + 1.0 + hop(160) + 3.0))
    dense = S.sparse_ring(np.full(2, 30.0), np.full(2, 100.0), 0.0, np.zeros(2), 0.0, S.Link(B, a))
    assert dense == pytest.approx(np.full(2, hop(240) + hop(400)))      # 60 of 100 >= 1/2: 4 B a value
