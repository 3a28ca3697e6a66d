"""Time the flow models on a ~40-node two-socket machine (not a test).

    python tools/bench_flow.py [repeats]

Prints milliseconds per solve for each model, with and without the tie-break
(median of ``repeats``; wall clock and CPU time, since the machine may be busy).
"""

from __future__ import annotations

import statistics
import sys
import time

from planner.flow import solve
from planner.topology.model import Link, LinkKind, Node, NodeKind, Topology
from planner.workload import Consumer, Store, Tier, Workload


def machine() -> tuple[Topology, Workload]:
    """2 sockets, 2 switches, 4 GPUs, 8 NVMe, NICs, other devices and slots: 40 nodes."""
    t = Topology("bench")
    gpus, ssds = [], []

    def dev(parent: str, dev_id: str, kind: NodeKind, gen: int, lanes: int) -> None:
        slot = f"slot:{dev_id}"
        t.add_node(Node(slot, NodeKind.SLOT))
        t.add_node(Node(dev_id, kind))
        t.add_link(Link.pcie(parent, slot, gen, lanes))
        t.add_link(Link.pcie(slot, dev_id, gen, lanes))

    for s in (0, 1):
        t.add_node(Node(f"socket{s}", NodeKind.SOCKET, numa_node=s))
        t.add_node(Node(f"mem{s}", NodeKind.MEMORY, numa_node=s))
        t.add_link(Link(f"socket{s}", f"mem{s}", LinkKind.MEMORY, 100e9))
        sw = f"switch{s}"
        t.add_node(Node(sw, NodeKind.SWITCH))
        t.add_link(Link.pcie(f"socket{s}", sw, 4, 16))
        for i in range(2):
            g = f"gpu{2 * s + i}"
            dev(sw, g, NodeKind.GPU, 4, 16)
            gpus.append(g)
            n = f"nvme{4 * s + i}"
            dev(sw, n, NodeKind.NVME, 4, 4)
            ssds.append(n)
            n = f"nvme{4 * s + 2 + i}"
            dev(f"socket{s}", n, NodeKind.NVME, 4, 4)
            ssds.append(n)
        dev(f"socket{s}", f"nic{s}", NodeKind.NIC, 4, 16)
        dev(f"socket{s}", f"sata{s}", NodeKind.OTHER, 3, 4)
        t.add_node(Node(f"bmc{s}", NodeKind.OTHER))
        t.add_link(Link.pcie(f"socket{s}", f"bmc{s}", 1, 1))
    t.add_link(Link("socket0", "socket1", LinkKind.INTER_SOCKET, 40e9))
    w = Workload(
        [Consumer(g, 1e9) for g in gpus],
        [
            Tier("gpu", [Store(f"hbm{i}", g) for i, g in enumerate(gpus)], 0.2, replicated=True),
            Tier("cpu", [Store("dram0", "mem0"), Store("dram1", "mem1")], 0.3),
            Tier("ssd", [Store(f"ssd{i}", n, 6 * 2**30) for i, n in enumerate(ssds)], 1.0),
        ],
    )
    return t, w


def main(repeats: int = 200) -> None:
    topo, work = machine()
    print(f"{len(topo)} nodes, {len(topo.links())} links, {len(work.consumers)} consumers, "
          f"{len(work.stores)} stores")
    for model in ("maxflow", "concurrent"):
        for tie_break in (True, False):
            solve(topo, work, model, tie_break=tie_break)  # warm up
            wall, cpu = [], []
            for _ in range(repeats):
                t0, c0 = time.perf_counter(), time.process_time()
                r = solve(topo, work, model, tie_break=tie_break)
                wall.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
            print(f"{model:>10} tie_break={tie_break!s:5}: "
                  f"{statistics.median(wall) * 1e3:6.2f} ms median wall, "
                  f"{min(wall) * 1e3:6.2f} ms best, {statistics.median(cpu) * 1e3:6.2f} ms CPU; "
                  f"T = {r.seconds_per_iteration * 1e3:.2f} ms, {len(r.bottleneck)} bottleneck links")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
