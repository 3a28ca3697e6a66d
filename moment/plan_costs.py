"""``moment plan --gpus 1,2,4`` and ``--prices``: print a scaling table and a priced plan."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from planner.pricing import PlanPrices
    from planner.scaling import ScalingTable


def _g(x: float | None) -> str:
    return "-" if x is None else ("∞" if math.isinf(x) else f"{x / 1e9:.2f}")


def print_scaling(table: ScalingTable, console: Console) -> None:
    """Per GPU count: the recommended layout's and each classic layout's mean per-GPU GB/s."""
    from rich.table import Table

    from planner.scaling import CLASSIC_NAMES

    t = Table(title=f"{table.machine}: mean per-GPU inlet GB/s by GPU count", title_justify="left")
    for col in ("GPUs", "recommended", *(f"({c})" for c in CLASSIC_NAMES), "recommended layout"):
        t.add_column(col, justify="left" if col == "recommended layout" else "right", overflow="fold")
    for r in table.rows:
        t.add_row(str(r.gpus), _g(r.best_bytes_per_s), *(_g(r.classic_bytes_per_s[c]) for c in CLASSIC_NAMES),
                  r.best_summary)
    ups = []
    for c in ("best", *CLASSIC_NAMES):
        s = table.speedup(c)
        ups.append(f"{'recommended' if c == 'best' else f'({c})'} {'-' if s is None else f'{s:.2f}×'}")
    console.print(t)
    console.print(f"all GPUs together, {table.rows[0].gpus} → {table.rows[-1].gpus} GPUs: " + ", ".join(ups))


def print_prices(prices: PlanPrices, console: Console) -> None:
    """The price file used, the machine's TCO and $ per GB/s of every ranked layout."""
    b = prices.book
    c = prices.machine_tco
    parts = " + ".join(f"{n} × {name}" for name, n in prices.parts)
    console.print(f"prices: {b.path} (dated {b.date}, {b.currency}); machine: {parts}")
    console.print(f"purchase ${c.capex_usd:,.0f}; {c.watts:,.0f} W at load; {b.tco.years:g}-year TCO "
                  f"${c.total_usd:,.0f} (energy ${c.energy_usd:,.0f} at ${b.tco.usd_per_kwh:g}/kWh, "
                  f"PUE {b.tco.pue:g}; upkeep ${c.upkeep_usd:,.0f})")
    for lp in prices.layouts:
        console.print(f"  #{lp.rank}: ${lp.usd_per_gbps:,.0f} per GB/s ({_g(lp.aggregate_bytes_per_s)} GB/s "
                      f"all GPUs) · {lp.summary}")
