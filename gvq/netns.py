"""Validate the link emulator against the kernel: ``sudo python -m gvq.netns [--rates 5e7 2e8]``.

Root only.  Puts each of N ranks in its own network namespace with a veth into a bridge (in a hub
namespace) and shapes every rank's egress with ``tc tbf`` (this kernel has no netem), so each rank has
its own link, as in a real ring of machines (shaping the shared loopback would instead model one bus
shared by all ranks).  Runs uncompressed RAR there with no emulation, then the same benchmark on loopback
under the in-process emulator at the same rate, and prints both medians and their ratio.  Every
interface it makes lives inside namespaces it makes and removes; nothing outside this machine is touched.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from . import bench

PREFIX = "gvqns"


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


def available() -> str | None:
    """Why the kernel check cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, tc)"
    if not shutil.which("ip") or not shutil.which("tc"):
        return "needs iproute2 (ip, tc)"
    return None


def setup(n: int, rate_bps: float) -> None:
    hub = f"{PREFIX}hub"
    sh("ip", "netns", "add", hub)
    sh("ip", "netns", "exec", hub, "ip", "link", "add", "br0", "type", "bridge")
    sh("ip", "netns", "exec", hub, "ip", "link", "set", "br0", "up")
    for i in range(n):
        ns, v, b = f"{PREFIX}{i}", f"v{i}", f"b{i}"
        sh("ip", "netns", "add", ns)
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        sh("ip", "link", "add", v, "type", "veth", "peer", "name", f"{PREFIX}b{i}")
        sh("ip", "link", "set", v, "netns", ns)
        sh("ip", "link", "set", f"{PREFIX}b{i}", "netns", hub)
        sh("ip", "netns", "exec", hub, "ip", "link", "set", f"{PREFIX}b{i}", "name", b)
        sh("ip", "netns", "exec", hub, "ip", "link", "set", b, "master", "br0")
        sh("ip", "netns", "exec", hub, "ip", "link", "set", b, "up")
        sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"10.213.0.{i + 1}/24", "dev", v)
        sh("ip", "netns", "exec", ns, "ip", "link", "set", v, "up")
        sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", v, "root", "tbf", "rate",
           f"{int(rate_bps)}bit", "burst", "512kb", "latency", "100ms")


def teardown(n: int) -> None:
    for name in [f"{PREFIX}{i}" for i in range(n)] + [f"{PREFIX}hub"]:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def kernel_shaped(args, rate: float) -> dict:
    """RAR with every rank in its namespace, no emulation: the kernel shapes the links."""
    teardown(args.world_size)
    setup(args.world_size, rate)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out = f"{tmp}/records.json"
            procs = [subprocess.Popen(
                ["ip", "netns", "exec", f"{PREFIX}{i}", "env", f"GLOO_SOCKET_IFNAME=v{i}",
                 sys.executable, "-m", "gvq.bench", "aggregate", "--aggregators", "rar",
                 "--world-size", str(args.world_size), "--reps", str(args.reps), "--model", args.model,
                 "--rank", str(i), "--init", f"file://{tmp}/rendezvous", "--out", out])
                for i in range(args.world_size)]
            codes = [p.wait(timeout=600) for p in procs]
            if any(codes):
                raise RuntimeError(f"a shaped rank failed: exit codes {codes}")
            rec = json.loads(Path(out).read_text())[0]
    finally:
        teardown(args.world_size)
    rec.update(bandwidth_bps=rate, shaping="kernel tbf, per-rank veth")
    rec["bound_s"] = rec["bytes_per_rank"] * 8 / rate
    return rec


def emulated(args, rate: float) -> dict:
    ns = argparse.Namespace(aggregators=["rar"], world_size=args.world_size, bandwidth=rate, latency=0.0,
                            model=args.model, num_classes=100, reps=args.reps, warmup=3, set=[])
    rec = bench.run(ns)[0]
    rec["shaping"] = "in-process emulator, loopback"
    return rec


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(prog="python -m gvq.netns", description=__doc__.splitlines()[0])
    p.add_argument("--rates", type=float, nargs="+", default=[5e7, 2e8], help="bit/s per rank")
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--model", default="resnet32")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    why = available()
    if why:
        print(f"gvq.netns: skipped: {why}")
        return []
    rows = []
    for rate in args.rates:
        k, e = kernel_shaped(args, rate), emulated(args, rate)
        rows.append({"rate_mbps": rate / 1e6, "N": args.world_size, "kernel_median_s": k["median_s"],
                     "emulated_median_s": e["median_s"], "emulated_over_kernel": e["median_s"] / k["median_s"],
                     "bound_s": k["bound_s"], "kernel_over_bound": k["median_s"] / k["bound_s"],
                     "emulated_over_bound": e["median_s"] / e["bound_s"]})
    import pandas as pd
    print(f"\n# uncompressed RAR, model={args.model}, N={args.world_size}: kernel tbf per-rank links vs emulator")
    print(pd.DataFrame(rows).to_markdown(index=False, floatfmt=".4g"))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
