"""Kernel-shaped links in network namespaces (root only): the layout as data (:func:`netns_plan`), made and
removed by :class:`Links`.  ``gvq.bench netns`` / ``netns-train`` (one link class, :mod:`gvq.bench.netns`) and
``netns-nodes`` (nodes of ranks, :mod:`gvq.bench.netns_nodes`) run their ranks behind it.

See docs/design.md#gvqbenchnetns_linkspy for the layouts and why.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

PREFIX = "gvqns"
# tbf is not asked for rates above this: a veth between namespaces on a few shared cores carries less than
# that by itself, so such a class is left unshaped (the kernel's own speed, as a node's NVLink is to its wire)
TBF_MAX_BPS = 1e10


def sh(*cmd: str) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip()}")


def available() -> str | None:
    """Why the kernel check cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, tc)"
    if not shutil.which("ip") or not shutil.which("tc"):
        return "needs iproute2 (ip, tc)"
    return None


def auto_burst_bytes(rate_bps: float) -> int:
    """tbf bucket of 1 ms at the rate, at least two 1500-byte frames.  Kept small on purpose: a bucket
    is credit the link hands out at line speed, so a large one lets a short transfer beat its rate."""
    return max(3000, int(rate_bps / 8 * 1e-3))


def auto_burst(rate_bps: float) -> str:
    return f"{auto_burst_bytes(rate_bps)}b"


@dataclass(frozen=True)
class Port:
    """One rank's end: namespace ``ns``, its veth ``dev`` (gloo's interface) at ``addr``, on node ``node``; egress
    to ranks of other nodes at ``inter_bps``, to its own node's at ``intra_bps`` (None: unshaped)."""
    ns: str
    dev: str
    addr: str
    node: int
    inter_bps: float
    intra_bps: float | None


@dataclass(frozen=True)
class Plan:
    """The namespaces, rank ports and node uplinks of a layout, and the ``ip`` / ``tc`` commands that make
    it.  ``nodes`` are the node namespaces ([] when flat); ``uplink_bps`` each node's egress to the hub."""
    hub: str
    nodes: list[str]
    ports: list[Port]
    ranks_per_node: int
    uplink_bps: float | None
    burst: str

    @property
    def namespaces(self) -> list[str]:
        return [p.ns for p in self.ports] + self.nodes + [self.hub]

    def commands(self) -> list[tuple[str, ...]]:
        x = ("ip", "netns", "exec")
        cmds = [("ip", "netns", "add", self.hub), (*x, self.hub, "ip", "link", "add", "br0", "type", "bridge"),
                (*x, self.hub, "ip", "link", "set", "br0", "up")]
        for j, ns in enumerate(self.nodes):   # a node's bridge, and its uplink into the hub's
            cmds += [("ip", "netns", "add", ns), (*x, ns, "ip", "link", "add", "br0", "type", "bridge"),
                     (*x, ns, "ip", "link", "set", "br0", "up"),
                     ("ip", "link", "add", "up0", "netns", ns, "type", "veth", "peer", "name", f"n{j}", "netns",
                      self.hub),
                     *_attach(self.hub, f"n{j}"), *_attach(ns, "up0"),
                     (*x, ns, "tc", "qdisc", "add", "dev", "up0", "root",
                      *_tbf(self.uplink_bps, auto_burst(self.uplink_bps)))]
        for i, p in enumerate(self.ports):
            bridge_ns = self.nodes[p.node] if self.nodes else self.hub
            # made inside the namespaces: no name is ever taken in the caller's namespace
            cmds += [("ip", "netns", "add", p.ns), (*x, p.ns, "ip", "link", "set", "lo", "up"),
                     ("ip", "link", "add", p.dev, "netns", p.ns, "type", "veth", "peer", "name", f"b{i}", "netns",
                      bridge_ns),
                     *_attach(bridge_ns, f"b{i}"), (*x, p.ns, "ip", "addr", "add", p.addr, "dev", p.dev),
                     (*x, p.ns, "ip", "link", "set", p.dev, "up"), *self._egress(p)]
        return cmds

    def _egress(self, p: Port) -> list[tuple[str, ...]]:
        """A flat port: one tbf.  A node's port: one FIFO per link class, as the model's two links a rank
        (gvq.comm.links.Cluster): an htb (prio is not in every kernel; htb and u32 are) whose class 1:20 takes
        what goes to other nodes' subnets at the inter rate; its own node's subnet goes to class 1:10 at the
        intra rate, or, unshaped, unclassified (htb sends that straight to the device)."""
        tc = ("ip", "netns", "exec", p.ns, "tc")
        if not self.nodes:
            return [(*tc, "qdisc", "add", "dev", p.dev, "root", *_tbf(p.inter_bps, self.burst))]
        cmds = [(*tc, "qdisc", "add", "dev", p.dev, "root", "handle", "1:", "htb", "default", "0"),
                *_htb_class(tc, p.dev, "1:20", p.inter_bps, self.burst)]
        cmds += [(*tc, "filter", "add", "dev", p.dev, "parent", "1:", "protocol", "ip", "prio", "2", "u32", "match",
                  "ip", "dst", f"10.213.{j}.0/24", "flowid", "1:20") for j in range(len(self.nodes)) if j != p.node]
        if p.intra_bps is not None:
            cmds += [*_htb_class(tc, p.dev, "1:10", p.intra_bps, auto_burst(p.intra_bps)),
                     (*tc, "filter", "add", "dev", p.dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32",
                      "match", "ip", "dst", f"10.213.{p.node}.0/24", "flowid", "1:10")]
        return cmds


def _htb_class(tc: tuple[str, ...], dev: str, classid: str, rate_bps: float, burst: str) -> list[tuple[str, ...]]:
    """An htb class held to ``rate_bps`` (ceil too: it borrows nothing), a FIFO under it."""
    rate = f"{int(rate_bps)}bit"
    return [(*tc, "class", "add", "dev", dev, "parent", "1:", "classid", classid, "htb", "rate", rate, "ceil", rate,
             "burst", burst, "cburst", burst),
            (*tc, "qdisc", "add", "dev", dev, "parent", classid, "pfifo")]


def _attach(ns: str, dev: str) -> list[tuple[str, ...]]:
    return [("ip", "netns", "exec", ns, "ip", "link", "set", dev, "master", "br0"),
            ("ip", "netns", "exec", ns, "ip", "link", "set", dev, "up")]


def _tbf(rate_bps: float, burst: str) -> tuple[str, ...]:
    return "tbf", "rate", f"{int(rate_bps)}bit", "burst", burst, "latency", "100ms"


def netns_plan(n: int, rate_bps: float, burst: str | None = None, ranks_per_node: int = 1,
         intra_bps: float | None = None, tag: str = PREFIX) -> Plan:
    """The layout of ``n`` ranks.  Flat (``ranks_per_node`` 1): each rank's veth into the hub's bridge, egress
    tbf at ``rate_bps``.  Nodes of ``ranks_per_node`` consecutive ranks: each rank's veth into its node's
    bridge, its egress one FIFO per class (to other nodes at ``rate_bps``, the model's per-rank inter link; to
    its node at ``intra_bps``, unshaped when None or above :data:`TBF_MAX_BPS`), and each node's bridge
    joined to the hub by an uplink shaped at the sum of its ranks' inter links (what the node can carry)."""
    from gvq.comm.links import whole_nodes
    whole_nodes(n, ranks_per_node)
    burst = burst or auto_burst(rate_bps)
    intra = None if intra_bps is None or intra_bps > TBF_MAX_BPS else intra_bps
    if ranks_per_node == 1:
        ports = [Port(f"{tag}r{i}", f"v{i}", f"10.213.0.{i + 1}/24", 0, rate_bps, None) for i in range(n)]
        return Plan(f"{tag}hub", [], ports, 1, None, burst)
    ports = [Port(f"{tag}r{i}", f"v{i}", f"10.213.{i // ranks_per_node}.{i % ranks_per_node + 1}/16",
                  i // ranks_per_node, rate_bps, intra) for i in range(n)]
    uplink = ranks_per_node * rate_bps
    return Plan(f"{tag}hub", [f"{tag}n{j}" for j in range(n // ranks_per_node)], ports, ranks_per_node, uplink,
                burst)


class Links:
    """The ranks' namespaces of :func:`netns_plan`, made on entry.  A context manager: everything is removed on exit,
    even when setup fails half-way."""

    def __init__(self, n: int, rate_bps: float, burst: str | None = None, ranks_per_node: int = 1,
                 intra_bps: float | None = None):
        self.plan = netns_plan(n, rate_bps, burst, ranks_per_node, intra_bps, f"{PREFIX}{os.getpid()}")
        self.n, self.rate_bps, self.burst = n, rate_bps, self.plan.burst
        self.hub, self.ns = self.plan.hub, [p.ns for p in self.plan.ports]
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> "Links":
        try:
            for cmd in self.plan.commands():
                sh(*cmd)
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()

    def teardown(self) -> None:
        for p in self.procs:                  # our own rank processes, if any are still running
            if p.poll() is None:
                p.kill()
                p.wait()
        self.procs = []
        for name in self.plan.namespaces:     # deleting a namespace deletes its veth ends
            subprocess.run(["ip", "netns", "del", name], capture_output=True)

    def run_ranks(self, module_args, timeout_s: float = 600) -> None:
        """Run ``python -m <module_args(i)>`` as rank i inside namespace i; raise if any fails (the
        others are then killed) or all have not finished within ``timeout_s``."""
        self.procs = [subprocess.Popen(
            ["ip", "netns", "exec", p.ns, "env", f"GLOO_SOCKET_IFNAME={p.dev}", sys.executable, "-m",
             *module_args(i)]) for i, p in enumerate(self.plan.ports)]
        deadline = time.monotonic() + timeout_s
        while True:
            codes = [p.poll() for p in self.procs]
            if any(c not in (None, 0) for c in codes):
                raise RuntimeError(f"a shaped rank failed: exit codes {codes}")
            if all(c == 0 for c in codes):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"shaped ranks still running after {timeout_s:g} s: exit codes {codes}")
            time.sleep(0.1)
