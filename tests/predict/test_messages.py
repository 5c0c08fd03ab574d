"""What a posted message costs: the posts a plain all-reduce makes, flat and hierarchical, the fit of
[fixed, per byte] from two ring sizes, and the hierarchical ring timed on real gloo ranks."""
import pytest

from gvq.predict import calibrate_overlap
from gvq.predict.messages import MSG_SEGMENTS, fit, message_cost, posts


@pytest.mark.parametrize("world", [2, 4, 8])
def test_a_flat_ring_posts_a_send_and_a_receive_of_one_segment_each_step(world):
    n_posts, n_bytes, adds = posts(world, 1, 100)
    assert n_posts == 4 * (world - 1) and n_bytes == n_posts * 400 and adds == [100] * (world - 1)


def test_a_hierarchical_ring_posts_the_node_phases_on_shards_and_the_ring_across_nodes_on_segments():
    """2 nodes of 4, 100-value segments (800 values): the node's reduce-scatter and all-gather move 200-value
    shards in 3 steps each, the ring across the 2 nodes moves 100-value segments in 2 steps."""
    n_posts, n_bytes, adds = posts(8, 4, 100)
    assert n_posts == 2 * 3 * 2 + 2 * 2
    assert n_bytes == 4 * (2 * 3 * 2 * 200 + 2 * 2 * 100)
    assert adds == [200, 200, 200, 100]


@pytest.mark.parametrize("world,per", [(4, 1), (4, 2), (8, 4), (32, 8)])
def test_fixed_and_per_byte_costs_come_back_from_calls_priced_with_them(world, per):
    fixed, per_byte, add = 1e-4, 2e-10, 3e-6
    calls = [posts(world, per, s)[0] * fixed + posts(world, per, s)[1] * per_byte + add for s in MSG_SEGMENTS]
    assert fit(world, per, calls, [add] * 2) == pytest.approx([fixed, per_byte], rel=1e-6)


def test_host_messages_time_flat_rings_and_the_hierarchical_rings_of_each_node_size_that_fits(monkeypatch):
    """R = 1 under ``host_msg``; R > 1 under ``host_msg_nodes`` where R divides N into two or more nodes."""
    seen = []
    monkeypatch.setattr("gvq.predict.messages.message_cost",
                        lambda reps, n, per: seen.append((n, per)) or [n * 1e-6, per * 1e-12])
    out = calibrate_overlap.host_messages([4, 8], [1, 2, 4])
    assert seen == [(4, 1), (8, 1), (4, 2), (8, 2), (8, 4)]
    assert out["host_msg"] == {"4": [4e-6, 1e-12], "8": [8e-6, 1e-12]}
    assert out["host_msg_nodes"] == {"2": {"4": [4e-6, 2e-12], "8": [8e-6, 2e-12]}, "4": {"8": [8e-6, 4e-12]}}


@pytest.mark.slow
def test_messages_posted_inside_a_hierarchical_ring_are_timed_on_real_ranks():
    """2 x 2 gloo ranks under the virtual clock's lock, as the benchmarks run: a cost, never negative."""
    got = message_cost(reps=2, world=4, ranks_per_node=2)
    assert min(got) >= 0 and sum(got) > 0 and got[0] < 0.1   # a fit may put all in one term


def test_a_shape_that_is_not_whole_nodes_is_refused_before_any_rank_starts():
    with pytest.raises(ValueError, match="ranks_per_node=3: must divide world_size=4"):
        message_cost(reps=2, world=4, ranks_per_node=3)
