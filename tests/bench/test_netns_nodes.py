"""Two-level kernel-shaped links (``gvq.bench netns-nodes``): the layout plan (everywhere), and root only, the
namespaces made and removed and a transfer across nodes held to the inter-node link."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from gvq.bench import netns_links
from gvq.bench.netns_nodes import aggregate_keys, check
from gvq.schema.errors import ConfigError

root_only = pytest.mark.skipif(netns_links.available() is not None,
                               reason=f"kernel shaping: {netns_links.available()}")


def test_the_flat_plan_is_one_tbf_per_rank_into_the_hub():
    p = netns_links.netns_plan(2, 5e7, tag="t")
    assert p.namespaces == ["tr0", "tr1", "thub"] and p.nodes == [] and p.uplink_bps is None
    qdiscs = [c for c in p.commands() if "qdisc" in c]
    assert qdiscs == [("ip", "netns", "exec", f"tr{i}", "tc", "qdisc", "add", "dev", f"v{i}", "root", "tbf", "rate",
                       "50000000bit", "burst", "6250b", "latency", "100ms") for i in range(2)]
    assert ("ip", "link", "add", "v1", "netns", "tr1", "type", "veth", "peer", "name", "b1", "netns", "thub") \
        in p.commands()


def test_the_two_level_plan_puts_each_node_behind_its_uplink_and_each_rank_has_two_classes():
    p = netns_links.netns_plan(4, 1e8, ranks_per_node=2, intra_bps=2.4e12, tag="t")
    assert p.namespaces == ["tr0", "tr1", "tr2", "tr3", "tn0", "tn1", "thub"]
    assert [(q.node, q.addr, q.inter_bps, q.intra_bps) for q in p.ports] == [
        (0, "10.213.0.1/16", 1e8, None), (0, "10.213.0.2/16", 1e8, None),     # beyond tbf: unshaped
        (1, "10.213.1.1/16", 1e8, None), (1, "10.213.1.2/16", 1e8, None)]
    assert p.uplink_bps == 2e8                   # a node carries its ranks' inter links together
    cmds = p.commands()
    assert ("ip", "link", "add", "v2", "netns", "tr2", "type", "veth", "peer", "name", "b2", "netns", "tn1") in cmds
    assert ("ip", "link", "add", "up0", "netns", "tn1", "type", "veth", "peer", "name", "n1", "netns", "thub") in cmds
    on_v2 = [c[4:] for c in cmds if c[:4] == ("ip", "netns", "exec", "tr2") and c[4] == "tc"]
    assert on_v2 == [("tc", "qdisc", "add", "dev", "v2", "root", "handle", "1:", "htb", "default", "0"),
                     ("tc", "class", "add", "dev", "v2", "parent", "1:", "classid", "1:20", "htb", "rate",
                      "100000000bit", "ceil", "100000000bit", "burst", "12500b", "cburst", "12500b"),
                     ("tc", "qdisc", "add", "dev", "v2", "parent", "1:20", "pfifo"),
                     # the other node's subnet to the inter class; its own node's unclassified (unshaped)
                     ("tc", "filter", "add", "dev", "v2", "parent", "1:", "protocol", "ip", "prio", "2", "u32",
                      "match", "ip", "dst", "10.213.0.0/24", "flowid", "1:20")]
    slow = netns_links.netns_plan(4, 1e8, ranks_per_node=2, intra_bps=1e9, tag="t")
    assert slow.ports[0].intra_bps == 1e9
    assert ("ip", "netns", "exec", "tr0", "tc", "filter", "add", "dev", "v0", "parent", "1:", "protocol", "ip", "prio",
            "1", "u32", "match", "ip", "dst", "10.213.0.0/24", "flowid", "1:10") in slow.commands()
    assert ("ip", "netns", "exec", "tr0", "tc", "class", "add", "dev", "v0", "parent", "1:", "classid", "1:10", "htb",
            "rate", "1000000000bit", "ceil", "1000000000bit", "burst", "125000b", "cburst", "125000b") \
        in slow.commands()
    with pytest.raises(ValueError, match="ranks_per_node=3: must divide world_size=4"):
        netns_links.netns_plan(4, 1e8, ranks_per_node=3)


def _args(**kw):
    base = dict(settings=["rar", "qsgd"], set=["aggregator.topology=hierarchical"], world_size=4, reps=2,
                model="cnn", ranks_per_node=2, intra_bandwidth_bps=2.4e12, rates=[1e8])
    return SimpleNamespace(**{**base, **kw})


def test_the_ranks_and_the_in_process_runs_get_aggregates_keys(tmp_path):
    """Kernel ranks: nodes but no link of gvq's; the emulated and virtual runs: both classes at the same rates."""
    from gvq.bench.__main__ import COMMANDS
    from gvq.bench.aggregate import aggregation_args
    from gvq.schema.tool import compose_command
    got = {}
    for how in ("kernel", "emulated", "virtual"):
        cfg = compose_command(COMMANDS["aggregate"], aggregate_keys(_args(), 1e8, how))
        got[how] = aggregation_args(cfg, SimpleNamespace(out=None))
    k, e, v = got["kernel"], got["emulated"], got["virtual"]
    assert k.bandwidth == [None] and k.net["intra_bandwidth_bps"] is None and k.net["ranks_per_node"] == 2
    assert (e.bandwidth, e.net["intra_bandwidth_bps"], e.net["clock"]) == ([1e8], 2.4e12, "wall")
    assert (v.bandwidth, v.net["clock"], v.set, v.aggregators) == ([1e8], "virtual", _args().set, ["rar", "qsgd"])
    for bad in (dict(ranks_per_node=4), dict(ranks_per_node=3), dict(rates=[]), dict(ranks_per_node=1)):
        with pytest.raises(ConfigError):
            check(_args(**bad))


def _ours() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(f"{netns_links.PREFIX}{os.getpid()}")]


RECV = ("import socket,sys,time; s=socket.socket(); s.bind((sys.argv[1],5201)); s.listen(1); c,_=s.accept(); "
        "t=time.perf_counter(); n=0\nwhile True:\n b=c.recv(1<<16)\n if not b: break\n n+=len(b)\n"
        "print(n, time.perf_counter()-t)")
SEND = ("import socket,sys; s=socket.create_connection((sys.argv[1],5201)); s.sendall(bytes(int(sys.argv[2]))); "
        "s.close()")


def _transfer(links, src: int, dst: int, nbytes: int) -> float:
    """Seconds the receiver in rank ``dst``'s namespace saw ``nbytes`` from rank ``src``'s take."""
    addr = links.plan.ports[dst].addr.split("/")[0]
    recv = subprocess.Popen(["ip", "netns", "exec", links.ns[dst], sys.executable, "-c", RECV, addr],
                            stdout=subprocess.PIPE, text=True)
    for _ in range(100):                     # until the receiver listens
        r = subprocess.run(["ip", "netns", "exec", links.ns[src], sys.executable, "-c", SEND, addr, str(nbytes)],
                           capture_output=True)
        if r.returncode == 0:
            break
        time.sleep(0.1)
    out, _ = recv.communicate(timeout=60)
    got, secs = out.split()
    assert int(got) == nbytes
    return float(secs)


@pytest.mark.slow
@root_only
def test_two_level_links_shape_across_nodes_and_are_removed():
    rate, nbytes = 2e7, 1_000_000            # 0.4 s across nodes at the rate; the node's own link unshaped
    with netns_links.Links(4, rate, ranks_per_node=2, intra_bps=2.4e12) as links:
        assert sorted(_ours()) == sorted(links.plan.namespaces)
        across = _transfer(links, 0, 2, nbytes)
        inside = _transfer(links, 0, 1, nbytes)
    assert _ours() == []
    assert across >= 0.5 * nbytes * 8 / rate          # held to the inter link (not a speed target)
    assert inside < across                             # the intra band is not behind the inter tbf
