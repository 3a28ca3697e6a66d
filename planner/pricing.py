"""Prices and power of the devices a plan places: $ per GB/s of a layout, and a TCO.

A price file (YAML, ``schema: moment.prices``; the bundled one is
``planner/prices/components-2024.yaml``, dated and with a source per entry) gives, per
component (a device model's catalogue name such as ``a100-40gb-pcie``, or a whole
server such as ``server-2s-4gpu``), its price in dollars and its power under load in
watts, and the TCO inputs: years, dollars per kWh, PUE and a yearly upkeep as a share
of the purchase.

The TCO is the purchase plus the energy of running the machine at its load power for
the years (``capex + years × 8760 h × kW × $/kWh × PUE + years × upkeep × capex``):
the usual hardware-plus-energy estimate; the paper (§4.2) gives its totals but not the
method of its ref [54] (Hyperion) nor its prices, so these inputs are ours and stated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from planner.errors import PlannerError

__all__ = ["BUNDLED_PRICES", "Component", "PriceBook", "TcoInputs", "Tco", "load_prices",
           "parse_prices", "tco", "usd_per_gbps"]

#: the bundled, dated price file
BUNDLED_PRICES = Path(__file__).resolve().parent / "prices" / "components-2024.yaml"
HOURS_PER_YEAR = 8760.0


@dataclass(frozen=True)
class Component:
    """One priced component: dollars, watts under load, and where the figures come from."""

    name: str
    usd: float
    watts: float
    source: str


@dataclass(frozen=True)
class TcoInputs:
    """How a TCO is computed (see the module docstring)."""

    years: float
    usd_per_kwh: float
    pue: float
    yearly_upkeep_of_capex: float
    source: str


@dataclass(frozen=True)
class PriceBook:
    """A price file, read: its date, components by name and TCO inputs."""

    date: str
    currency: str
    components: dict[str, Component]
    tco: TcoInputs
    path: str

    def component(self, name: str) -> Component:
        """The component ``name``.

        Raises
        ------
        PlannerError
            If the price file has no such component.
        """
        try:
            return self.components[name]
        except KeyError:
            raise PlannerError(
                f"{self.path}: no price for {name!r} (priced: {', '.join(sorted(self.components))}); "
                "add it to the price file"
            ) from None


@dataclass(frozen=True)
class Tco:
    """Purchase, energy and upkeep over the years, in dollars; ``watts`` at load."""

    capex_usd: float
    energy_usd: float
    upkeep_usd: float
    watts: float

    @property
    def total_usd(self) -> float:
        return self.capex_usd + self.energy_usd + self.upkeep_usd


def _number(path: str, where: str, value: object, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise PlannerError(f"{path}: {where} must be a number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise PlannerError(f"{path}: {where} must be {'≥ 0' if allow_zero else '> 0'}, got {value!r}")
    return float(value)


def parse_prices(text: str, path: str = "<prices>") -> PriceBook:
    """Read a price file's text (YAML).

    Raises
    ------
    PlannerError
        If the text is not YAML of the ``moment.prices`` schema: a missing date or
        component, a price or power that is not a non-negative number, a TCO input out of range.
    """
    import yaml

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise PlannerError(f"{path}: not YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(doc, dict) or doc.get("schema") != "moment.prices":
        raise PlannerError(f"{path}: not a price file (expected `schema: moment.prices` at the top)")
    date = doc.get("date")
    if not isinstance(date, str) or not date.strip():
        raise PlannerError(f"{path}: `date` missing: a price file says when its prices were taken")
    comps = doc.get("components")
    if not isinstance(comps, dict) or not comps:
        raise PlannerError(f"{path}: `components` must map names to {{usd, watts, source}}")
    out: dict[str, Component] = {}
    for name, rec in comps.items():
        if not isinstance(rec, dict):
            raise PlannerError(f"{path}: component {name!r} must be a mapping with usd, watts and source")
        source = rec.get("source")
        if not isinstance(source, str) or not source.strip():
            raise PlannerError(f"{path}: component {name!r} has no `source`: say where its price comes from")
        out[str(name)] = Component(str(name), _number(path, f"{name}.usd", rec.get("usd")),
                                   _number(path, f"{name}.watts", rec.get("watts"), allow_zero=True), source)
    t = doc.get("tco")
    if not isinstance(t, dict):
        raise PlannerError(f"{path}: `tco` must give years, usd_per_kwh, pue and yearly_upkeep_of_capex")
    pue = _number(path, "tco.pue", t.get("pue"))
    if pue < 1:
        raise PlannerError(f"{path}: tco.pue must be ≥ 1 (facility power over IT power), got {pue}")
    inputs = TcoInputs(_number(path, "tco.years", t.get("years")),
                       _number(path, "tco.usd_per_kwh", t.get("usd_per_kwh"), allow_zero=True), pue,
                       _number(path, "tco.yearly_upkeep_of_capex", t.get("yearly_upkeep_of_capex", 0.0),
                               allow_zero=True),
                       str(t.get("source", "")))
    return PriceBook(date.strip(), str(doc.get("currency", "USD")), out, inputs, path)


def load_prices(path: str | Path | None = None) -> PriceBook:
    """Read the price file at ``path`` (default: the bundled one).

    Raises
    ------
    PlannerError
        If the file cannot be read or is not a valid price file.
    """
    p = Path(path) if path is not None else BUNDLED_PRICES
    try:
        text = p.read_text()
    except OSError as e:
        raise PlannerError(f"{p}: cannot read the price file ({e.strerror})") from None
    return parse_prices(text, str(p))


def tco(book: PriceBook, parts: Mapping[str, int] | Sequence[tuple[str, int]]) -> Tco:
    """TCO of a machine made of ``parts`` (component name → count), with ``book``'s inputs.

    Raises
    ------
    PlannerError
        If a part has no price in ``book`` or a count is negative.
    """
    items = parts.items() if isinstance(parts, Mapping) else parts
    capex = watts = 0.0
    for name, n in items:
        if n < 0:
            raise PlannerError(f"{name}: a count cannot be negative, got {n}")
        c = book.component(name)
        capex += c.usd * n
        watts += c.watts * n
    t = book.tco
    energy = t.years * HOURS_PER_YEAR * watts / 1000.0 * t.usd_per_kwh * t.pue
    return Tco(capex, energy, t.years * t.yearly_upkeep_of_capex * capex, watts)


def usd_per_gbps(capex_usd: float, aggregate_bytes_per_s: float) -> float:
    """Dollars of purchase per GB/s (1e9 bytes/s) the layout delivers to all GPUs together."""
    if aggregate_bytes_per_s <= 0:
        return math.inf
    return capex_usd / (aggregate_bytes_per_s / 1e9)


@dataclass(frozen=True)
class LayoutPrice:
    """One ranked layout's purchase price per GB/s delivered to all its GPUs together."""

    rank: int
    summary: str
    aggregate_bytes_per_s: float
    usd_per_gbps: float


@dataclass(frozen=True)
class PlanPrices:
    """A plan priced: the machine's TCO (devices + ``server``) and $ per GB/s of every ranked layout."""

    book: PriceBook
    server: str
    parts: tuple[tuple[str, int], ...]
    machine_tco: Tco
    layouts: tuple[LayoutPrice, ...]


def price_plan(result, book: PriceBook, server: str = "server-2s-4gpu") -> PlanPrices:
    """Price the devices of ``result`` (a :class:`planner.plan.PlanResult`) plus the ``server``.

    Every ranked layout uses the same devices, so its $ per GB/s differs by its rate alone.

    Raises
    ------
    PlannerError
        If a placed device model or the server has no price in ``book``.
    """
    from planner.plan import layout_summary

    parts = ((server, 1), *((m.name, n) for m, n in result.inventory.items))
    cost = tco(book, parts)
    rows = []
    for e in result.ranked:
        agg = e.mean_inlet_bytes_per_s * len(e.result.inlet_bytes_per_s)
        rows.append(LayoutPrice(e.rank, layout_summary(e.placed), agg, usd_per_gbps(cost.capex_usd, agg)))
    return PlanPrices(book, server, tuple(parts), cost, tuple(rows))


#: the paper's §4.2 machines as parts of the price file: Machine A/B (one server, 4 GPUs,
#: 8 SSDs) and Cluster C (4 nodes, each a server with one GPU, a 100 Gb/s NIC and a switch port)
PAPER_MACHINE_AB = (("server-2s-4gpu", 1), ("a100-40gb-pcie", 4), ("p5510", 8))
PAPER_CLUSTER_C = (("server-2s-1gpu", 4), ("a100-40gb-pcie", 4), ("nic-100g", 4), ("switch-100g-port", 4))
