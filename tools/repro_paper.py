"""The paper's §4 beside ours: every figure the planner can address, with the reason for each gap.

    python tools/repro_paper.py                       # writes docs/paper-evaluation.md
    python tools/repro_paper.py --json F --out DOC    # also the figures as JSON
    python tools/repro_paper.py --quick --out DOC     # without the GPU-count sweeps (a test's scope)

Each claim: the paper's value, ours with the bundled spec as it is, the ratio, and for a
difference over 10% the reason, shown with a what-if run (a host-memory share of the
reads, an inter-socket capacity, the flow model, the NVLink pairing). Figures that only a
training run gives (DDAK vs hash, prediction error, cross-socket share) are quoted from
docs/benchmarks.md, where tools/bench_*.py measured them, and say what this machine cannot show.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from planner.flow import solve  # noqa: E402
from planner.plan import add_nvlinks, choose_inventory, plan, workload_for  # noqa: E402
from planner.pricing import PAPER_CLUSTER_C, PAPER_MACHINE_AB, load_prices, tco  # noqa: E402
from planner.scaling import scaling_table  # noqa: E402
from planner.topology.model import LinkKind  # noqa: E402
from planner.topology.spec.load import load_machine  # noqa: E402
from planner.workload import Demand  # noqa: E402

#: the host-memory share of the reads that makes Machine B's best layout give the paper's 15.61
#: GB/s: 1 − 12.88/15.61 (the paper caches 1% of the vertices in host memory, §4.1, and gives no hit rate)
HOST_SHARE = round(1 - 12.88 / 15.61, 3)
COMMAND = "python tools/repro_paper.py"


def _gb(x: float) -> float:
    return round(x / 1e9, 2)


def _claim(section: str, what: str, paper: float, ours: float, reason: str = "", what_if: str = "",
           what_if_value: float | None = None, agrees: bool | None = None) -> dict:
    """One row; ``agrees`` overrides the within-10% test for a claim the paper states as a direction only."""
    ratio = ours / paper if paper else float("nan")
    return {"section": section, "claim": what, "paper": paper, "ours": round(ours, 3), "ratio": round(ratio, 3),
            "within_10pct": abs(ratio - 1) <= 0.10 if agrees is None else agrees, "reason": reason, "what_if": what_if,
            "what_if_value": None if what_if_value is None else round(what_if_value, 3),
            "what_if_ratio": None if what_if_value is None else round(what_if_value / paper, 3)}


def _plan(machine: str, host: float = 0.0, gpus: int | None = None):
    topo, inv = choose_inventory(load_machine(machine), spec=machine, gpus=gpus)
    return plan(topo, inv, Demand(1e9, 0.0, host), tidy_best=False)


def _with_inter_socket(topo, bytes_per_s: float):
    t = topo.copy()
    for link in t.links(LinkKind.INTER_SOCKET):
        t.replace_link(dataclasses.replace(link, bytes_per_s=bytes_per_s))
    return t


def _concurrent_rate(placed, host: float, pairs=()) -> float:
    """Per-GPU GB/s of one placed layout under the concurrent model (every GPU reads every store)."""
    p = add_nvlinks(placed, pairs) if pairs else placed
    r = solve(p, workload_for(p, Demand(1e9, 0.0, host)), "concurrent")
    return 1e9 / r.seconds_per_iteration


def placement_claims() -> list[dict]:
    """§4.3: Machine B's best and (c) with 4 GPUs; the 'up to' speed-ups over the best classic layout."""
    out = []
    b0, bh = _plan("moment-b"), _plan("moment-b", HOST_SHARE)
    why = (f"the paper's per-GPU inlet counts host-memory reads (§4.1 caches 1% of the vertices in CPU memory) "
           f"and 15.61 × 4 = 62.4 GB/s is more than 8 SSDs give; ours with the SSDs alone is bound by their "
           f"8 × 6 GiB/s. The paper gives no hit rate; with host memory serving {HOST_SHARE:.1%} of the reads")
    out.append(_claim("4.3", "Machine B, 4 GPUs: Moment's layout, per-GPU inlet GB/s", 15.61,
                      _gb(b0.best.mean_inlet_bytes_per_s), why, f"--cpu-cache-share {HOST_SHARE}",
                      _gb(bh.best.mean_inlet_bytes_per_s)))
    out.append(_claim("4.3", "Machine B, 4 GPUs: layout (c), per-GPU inlet GB/s", 10.92,
                      _gb(b0.baselines["c"].mean_inlet_bytes_per_s), "", f"--cpu-cache-share {HOST_SHARE}",
                      _gb(bh.baselines["c"].mean_inlet_bytes_per_s)))
    out.append(_claim("4.3", "Machine B, 4 GPUs: Moment / layout (c)", round(15.61 / 10.92, 3), b0.gain_over("c"),
                      "the SSD-only demand; (c) is bound by Bus 11 and the inter-socket link, the best by the SSDs",
                      f"--cpu-cache-share {HOST_SHARE}", bh.gain_over("c")))
    for machine, paper in (("moment-a", 1.54), ("moment-b", 1.63)):
        best = []
        for host in (0.0, HOST_SHARE):
            ups = []
            for g in (2, 3, 4):
                r = _plan(machine, host, g)
                classic = [b.mean_inlet_bytes_per_s for k, b in r.baselines.items()
                           if k in "abcd" and not isinstance(b, str)]
                ups.append(r.best.mean_inlet_bytes_per_s / max(classic))
            best.append(max(ups))
        reason = ("on Machine A our layout (c) is never congested under the paper's max-flow model: each switch "
                  "holds 2 GPUs and 4 SSDs, so every GPU reads its own switch's SSDs; the paper's (c) runs below "
                  "Moment because its GPUs read every SSD (hash/DDAK rows, the concurrent model) across a "
                  "congested inter-socket path whose capacity the paper does not give (see §4.7 below)"
                  if machine == "moment-a" else
                  "the SSD-only demand bounds the best layout; see the host-memory what-if")
        out.append(_claim("4.3", f"{machine}: Moment over the best classic layout, max over 2-4 GPUs", paper,
                          best[0], reason, f"--cpu-cache-share {HOST_SHARE}", best[1]))
    return out


def _with_link(topo, a: str, b: str, bytes_per_s: float):
    t = topo.copy()
    for key in ((a, b), (b, a)):
        link = t.link_between(*key)
        if link is not None:
            t.replace_link(dataclasses.replace(link, bytes_per_s=bytes_per_s))
    return t


#: the link each machine's NVLink what-if varies: Machine A's inter-socket link, Machine B's Bus 16
_NVLINK_KNOB = {"moment-a": ("inter-socket link", lambda t, c: _with_inter_socket(t, c)),
                "moment-b": ("Bus 16 (switch 0 ↔ switch 1)",
                             lambda t, c: _with_link(t, "switch:sw0", "switch:sw1", c))}


def nvlink_claims() -> list[dict]:
    """§4.7: NVLink gain on layout (c), in percent; the paper's pairs are across switches (our 0-2, 1-3)."""
    out = []
    for machine, paper in (("moment-a", 11.7), ("moment-b", 6.8)):
        base = _plan(machine)
        placed = base.baselines["c"].placed
        typed = _plan_nvlink(machine, ((0, 1), (2, 3))).baselines["c"].mean_inlet_bytes_per_s
        same = (typed / base.baselines["c"].mean_inlet_bytes_per_s - 1) * 100
        knob, modify = _NVLINK_KNOB[machine]
        sweep = []
        for cap in (None, 18e9, 17e9, 16e9, 15e9, 14e9, 12e9):
            p = modify(placed, cap) if cap else placed
            off = _concurrent_rate(p, HOST_SHARE)
            sweep.append((cap, (_concurrent_rate(p, HOST_SHARE, ((0, 2), (1, 3))) / off - 1) * 100, off))
        text = "; ".join(f"{'spec' if c is None else f'{c / 1e9:g} GB/s'}: {g:+.1f}% ((c) {o / 1e9:.2f} GB/s)"
                         for c, g, o in sweep)
        where = ("each switch holds 2 GPUs and 4 SSDs, so every GPU reads its own switch's SSDs"
                 if machine == "moment-a" else
                 "all four GPUs sit under Bus 11, so the binding cut (Bus 11, the inter-socket link) is shared "
                 "by every GPU and no bridge crosses it")
        reason = (f"under max-flow no GPU path of (c) congests ({where}), so a relay has nothing to relieve; and "
                  "`--nvlink 0-1 --nvlink 2-3` in our numbering bridges GPUs on the SAME switch, while the paper's "
                  "GPU1-GPU2/GPU3-GPU4 are across switches ('without NVLink, GPU 0 and 1 could only exchange "
                  "data through Bus9-11'). With every GPU reading every SSD (the concurrent model: rows spread by "
                  f"hash/DDAK), pairs 0-2 1-3, host memory {HOST_SHARE:.1%} and the {knob} at a capacity the paper "
                  f"does not give, the relay's gain is: {text}")
        best = min(sweep, key=lambda s: abs(s[1] - paper))
        out.append(_claim("4.7", f"{machine}: NVLink gain on layout (c), % (pairs 0-1 2-3 as typed)", paper,
                          same, reason, f"concurrent model, pairs 0-2 1-3, {knob} "
                          f"{'spec' if best[0] is None else f'{best[0] / 1e9:g} GB/s'}", best[1]))
    return out


def _plan_nvlink(machine: str, pairs):
    topo, inv = choose_inventory(load_machine(machine), spec=machine)
    return plan(topo, inv, Demand(1e9), nvlink_pairs=pairs, tidy_best=False)


def scaling_claims() -> list[dict]:
    """§4.6: aggregate rate 1 → 4 GPUs for Moment, (c) and (d)."""
    paper = {"moment-a": {"best": 2.26, "c": 1.21, "d": 1.92}, "moment-b": {"best": 2.21, "c": 1.21, "d": 1.57}}
    out = []
    for machine, want in paper.items():
        t0 = scaling_table(load_machine(machine), [1, 2, 4], Demand(1e9), spec=machine)
        th = scaling_table(load_machine(machine), [1, 2, 4], Demand(1e9, 0.0, HOST_SHARE), spec=machine)
        two, four = t0.rows[1].aggregate_bytes_per_s("d"), t0.rows[2].aggregate_bytes_per_s("d")
        if two and four:  # the paper: (d) scales negatively past 2 GPUs (no figure given: 1.0 marks the edge)
            out.append(_claim("4.6", f"{machine}: (d) all GPUs 2→4 (paper: negative scaling, below 1)", 1.0,
                              four / two, "" if four < two else
                              "our (d) on this machine still gains from 2 to 4 GPUs: the switch's slot limit the "
                              "paper names (one SSD per GPU at 4 GPUs) is not what binds in our spec",
                              agrees=four < two))
        for col, value in want.items():
            reason = ("the planner predicts the I/O inlet only: one GPU is bound by its own x16 link (21.5 GB/s), "
                      "four by the SSDs or a shared link; the paper's speed-ups are end-to-end training throughput, "
                      "where sampling and compute (not modelled) cap one GPU and flatten (c)'s curve"
                      if col != "best" else "the same inlet-only model; the host-memory share raises the 4-GPU level")
            out.append(_claim("4.6", f"{machine}: 1→4 GPUs speed-up, {'Moment' if col == 'best' else f'({col})'}",
                              value, t0.speedup(col) or float("nan"), reason, f"--cpu-cache-share {HOST_SHARE}",
                              th.speedup(col)))
    return out


def cost_claims() -> list[dict]:
    """§4.2: 5-year TCO of Machine A/B and of Cluster C, from the bundled price file."""
    book = load_prices()
    ab, c = tco(book, PAPER_MACHINE_AB), tco(book, PAPER_CLUSTER_C)
    src = (f"bundled prices dated {book.date} (planner/prices/), energy {book.tco.usd_per_kwh} $/kWh, PUE "
           f"{book.tco.pue}; the paper gives its totals but neither its prices nor ref [54]'s method")
    node = book.component("server-2s-1gpu")
    # the cluster is linear in the node's price: 4 × (price + its energy) + everything else
    rest = tco(book, [(n, k) for n, k in PAPER_CLUSTER_C if n != "server-2s-1gpu"]).total_usd
    implied = (181100 - rest) / 4 - tco(book, [("server-2s-1gpu", 1)]).energy_usd
    return [_claim("4.2", "5-year TCO, Machine A/B ($)", 90270, ab.total_usd, src),
            _claim("4.2", "5-year TCO, Cluster C ($)", 181100, c.total_usd,
                   src + f"; the paper's total implies ${implied:,.0f} per Cluster C server (ours "
                   f"${node.usd:,.0f})"),
            _claim("4.2", "TCO ratio Machine / Cluster", round(90270 / 181100, 3), ab.total_usd / c.total_usd, src)]


def _bench_row(label: str) -> str | None:
    path = REPO / "docs" / "benchmarks.md"
    if not path.is_file():
        return None
    for line in path.read_text().splitlines():
        if line.startswith("|") and label in line:
            return line
    return None


#: the paper's cross-QPI reduction by DDAK against hash on Machine A, percent per layout (§4.5, Fig. 17)
_PAPER_QPI = {"a": 14.2, "b": 8.7, "c": 18.1, "d": 9.5}


def _socket_claims() -> list[tuple[str, str, float, str, str]]:
    """§4.5 Fig. 17 per layout: DDAK against hash with every GPU reading alike (the paper's setting) and
    socket-aware (`moment place`'s default where the GPUs span sockets), from tools/bench_sockets.py."""
    out = []
    for layout, paper in _PAPER_QPI.items():
        out.append(("4.5", f"cross-socket share, Machine A layout ({layout}), DDAK vs hash, every GPU alike "
                           f"(paper: {paper}% less)", paper,
                    f"DDAK vs hash, every GPU reading alike: Chung-Lu 1e5, Machine A layout ({layout})",
                    "shares of pre-sampled reads, not QPI counters (no second socket here)"))
        spans = layout in "ac"  # (b) and (d) put all four GPUs on socket 0
        out.append(("4.5", f"cross-socket share, Machine A layout ({layout}), socket-aware DDAK vs hash "
                           f"(paper: {paper}% less)", paper,
                    f"socket-aware DDAK vs hash: Chung-Lu 1e5, Machine A layout ({layout})",
                    "each socket's GPUs on their own part of the training vertices (moment place's default where "
                    "the GPUs span sockets; moment train on it splits its seeds the same way); reads of an "
                    "independent pre-sample" if spans else
                    "all four GPUs on one socket in this layout: socket-aware placement does not apply (the same "
                    "placement as every GPU alike)"))
    return out


def measured_claims() -> list[dict]:
    """§4.4/§4.5: figures only a training run gives, quoted from docs/benchmarks.md with what they show."""
    rows = []
    for section, what, paper, label, note in (
        ("4.5", "DDAK over hash, seeds/s (paper: up to +30.6% A, +34.0% B)", 1.340,
         "seeds/s, SSD-bound skewed graph: DDAK vs hash",
         "one disk on this machine: the paper's mechanism, balancing reads across 8 SSDs behind congested "
         "links, cannot show; 8 emulated SSDs are issue 29's item 2"),
        *_socket_claims(),
        ("4.4", "prediction error, SSD read time per epoch (paper: max 8.61%)", 0.0861,
         "SSD read time per epoch, predicted vs measured: ddak",
         "one disk; per-tier read seconds; moment train now reports the paper's quantity per epoch (feature "
         "GB/s and seeds/s against the plan's inlet, and whether the flow model applies: training/throughput.py)"),
    ):
        line = _bench_row(label)
        cells = [c.strip() for c in line.strip("|").split("|")] if line else []
        rows.append({"section": section, "claim": what, "paper": paper, "measured_row": line,
                     "ours_text": (f"{cells[3]} vs {cells[4]}, {cells[5]}" if len(cells) > 5 else "not measured"),
                     "reason": note})
    return rows


def write_markdown(doc: dict, out: Path) -> None:
    lines = ["# The paper's evaluation (§4) beside ours", "",
             f"Generated by `{COMMAND}` on {doc['date']}; do not edit by hand. Ours are the planner's predictions "
             "with the bundled machine specs (planner/machines/) unless a row says it quotes a measured figure. "
             "A what-if shows the input behind a difference over 10%.", "",
             "| § | claim | paper | ours | ours/paper | what-if | what-if value | what-if/paper |",
             "|---|---|---|---|---|---|---|---|"]
    for c in doc["claims"]:
        wr = "" if c["what_if_ratio"] is None else f"{c['what_if_ratio']:.2f}"
        lines.append(f"| {c['section']} | {c['claim']} | {c['paper']:g} | {c['ours']:g} | {c['ratio']:.2f}"
                     f"{'' if c['within_10pct'] else ' ⚠'} | {c['what_if']} | "
                     f"{'' if c['what_if_value'] is None else c['what_if_value']} | {wr} |")
    lines += ["", "## Reasons for the differences over 10%", ""]
    for c in doc["claims"]:
        if not c["within_10pct"] and c["reason"]:
            lines.append(f"- **§{c['section']} {c['claim']}** (ours/paper {c['ratio']:.2f}): {c['reason']}.")
    lines += ["", "## Figures only a training run gives (quoted from docs/benchmarks.md)", ""]
    for m in doc["measured"]:
        lines.append(f"- **§{m['section']} {m['claim']}**: ours {m['ours_text']}. {m['reason']}.")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    import datetime

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=REPO / "docs" / "paper-evaluation.md")
    p.add_argument("--json", type=Path, metavar="FILE", help="also write the figures as JSON")
    p.add_argument("--quick", action="store_true", help="skip the GPU-count sweeps (for a test)")
    a = p.parse_args(argv)
    claims = placement_claims()[:3] if a.quick else placement_claims()
    claims += nvlink_claims()
    if not a.quick:
        claims += scaling_claims()
    claims += cost_claims()
    doc = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "host_share": HOST_SHARE, "claims": claims, "measured": measured_claims()}
    write_markdown(doc, a.out)
    if a.json:
        a.json.write_text(json.dumps(doc, indent=2) + "\n")
    for c in claims:
        print(f"§{c['section']} {c['claim']}: paper {c['paper']:g}, ours {c['ours']:g}, ratio {c['ratio']:.2f}"
              + (f"; what-if {c['what_if_value']:g} ({c['what_if_ratio']:.2f})" if c["what_if_value"] else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

