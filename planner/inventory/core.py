"""Inventories: how many devices of each model to place, which are installed, which stay."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from planner.errors import PlannerError
from planner.inventory.models import (
    DEVICE_MODELS,
    PLACEABLE_KINDS,
    DeviceModel,
    _slug,
    device_model,
    recognise_model,
)
from planner.topology.model import DEVICE_KINDS

__all__ = ["Inventory", "inventory_from_counts", "inventory_from_spec", "merge_inventories"]


@dataclass(frozen=True)
class Inventory:
    """The devices to place.

    ``items`` pairs each :class:`DeviceModel` with how many devices of it
    there are (at least one; model names unique). ``installed`` lists the
    devices of the inventory that already sit in a slot of the machine, as
    ``(device node id, model name)``: their slots are free to reuse and
    :func:`planner.layout.current_layout` reads where they are. ``fixed``
    names the device nodes that stay where they are (onboard devices, boot
    disks, NICs, anything not in a slot). ``notes`` say what was assumed.

    >>> inv = Inventory(((device_model("p5510"), 2),))
    >>> inv.total, inv.kinds()
    (2, {'p5510': 'nvme'})
    >>> Inventory(((device_model("p5510"), 0),))
    Traceback (most recent call last):
    ...
    planner.errors.PlannerError: inventory: 0 devices of p5510; each model needs a count of at least 1
    """

    items: tuple[tuple[DeviceModel, int], ...]
    fixed: tuple[str, ...] = ()
    installed: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.items, (str, bytes)) or not isinstance(self.items, Iterable):
            raise PlannerError(f"inventory: items must be (DeviceModel, count) pairs, "
                               f"got {self.items!r}")
        items = []
        for it in self.items:
            if not (isinstance(it, tuple) and len(it) == 2 and isinstance(it[0], DeviceModel)):
                shown = repr(it) if len(repr(it)) <= 80 else repr(it)[:77] + "..."
                raise PlannerError(f"inventory: each item must be a (DeviceModel, count) pair, "
                                   f"got {shown}")
            m, n = it
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise PlannerError(f"inventory: {n!r} devices of {m.name}; each model needs a "
                                   "count of at least 1")
            items.append((m, n))
        if not items:
            raise PlannerError("inventory: nothing to place (no devices)")
        names = [m.name for m, _ in items]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise PlannerError(f"inventory: model(s) listed twice: {', '.join(dup)}")
        installed = tuple((str(d), str(m)) for d, m in self.installed)
        for dev, name in installed:
            if name not in names:
                raise PlannerError(f"inventory: installed device {dev!r} is of model {name!r}, "
                                   "which the inventory does not list")
        for name, n in zip(names, (n for _, n in items), strict=True):
            k = sum(1 for _, m in installed if m == name)
            if k > n:
                raise PlannerError(f"inventory: {k} installed devices of {name} but a count of {n}")
        devs = [d for d, _ in installed]
        if len(set(devs)) != len(devs):
            raise PlannerError("inventory: a device is listed twice as installed")
        object.__setattr__(self, "items", tuple(items))
        object.__setattr__(self, "installed", installed)
        object.__setattr__(self, "fixed", tuple(self.fixed))
        object.__setattr__(self, "notes", tuple(self.notes))

    @property
    def models(self) -> tuple[DeviceModel, ...]:
        return tuple(m for m, _ in self.items)

    @property
    def total(self) -> int:
        """How many devices, all models together."""
        return sum(n for _, n in self.items)

    def count(self, name: str) -> int:
        """How many devices of the model ``name`` (0 if it is not listed)."""
        return next((n for m, n in self.items if m.name == name), 0)

    def count_kind(self, kind: str) -> int:
        """How many devices of ``kind`` (``"gpu"`` or ``"nvme"``)."""
        return sum(n for m, n in self.items if m.kind == kind)

    def model(self, name: str) -> DeviceModel:
        for m, _ in self.items:
            if m.name == name:
                return m
        raise PlannerError(f"inventory has no model {name!r} (it has: "
                           f"{', '.join(m.name for m, _ in self.items)})")

    def kinds(self) -> dict[str, str]:
        """Model name → kind."""
        return {m.name: m.kind for m, _ in self.items}

    def __str__(self) -> str:
        return ", ".join(f"{n} × {m.name}" for m, n in self.items)


def _count(what: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlannerError(f"the number of {what} must be a whole number, got {value!r}")
    if value < 0:
        raise PlannerError(f"the number of {what} cannot be negative, got {value}")
    return value


def inventory_from_counts(
    gpus: int,
    ssds: int,
    gpu_model: str | DeviceModel = "a100-40gb-pcie",
    ssd_model: str | DeviceModel = "p5510",
) -> Inventory:
    """``gpus`` GPUs and ``ssds`` NVMe SSDs of the named models.

    A count of 0 leaves that kind out; both 0, a negative count or a model
    of the wrong kind is a :class:`~planner.errors.PlannerError`.

    >>> str(inventory_from_counts(2, 0, gpu_model="h100-pcie"))
    '2 × h100-pcie'
    >>> inventory_from_counts(2, -1)
    Traceback (most recent call last):
    ...
    planner.errors.PlannerError: the number of SSDs cannot be negative, got -1
    """
    g = _count("GPUs", gpus)
    s = _count("SSDs", ssds)
    if g == 0 and s == 0:
        raise PlannerError("nothing to place: 0 GPUs and 0 SSDs")
    items = []
    for n, name, kind in ((g, gpu_model, "gpu"), (s, ssd_model, "nvme")):
        if n == 0:
            continue
        m = device_model(name)
        if m.kind != kind:
            raise PlannerError(f"{m.name} is a {m.kind} model, not a {kind} model")
        items.append((m, n))
    return Inventory(tuple(items))


def merge_inventories(*inventories: Inventory) -> Inventory:
    """One inventory holding the devices of all ``inventories``.

    Counts of a model named in several add up (the models must then be
    equal); ``fixed``, ``installed`` and ``notes`` are joined.

    >>> str(merge_inventories(inventory_from_counts(2, 0), inventory_from_counts(2, 4)))
    '4 × a100-40gb-pcie, 4 × p5510'
    """
    if not inventories:
        raise PlannerError("merge_inventories: no inventory given")
    counts: dict[str, int] = {}
    models: dict[str, DeviceModel] = {}
    for inv in inventories:
        for m, n in inv.items:
            if m.name in models and models[m.name] != m:
                raise PlannerError(f"two different device models are both called {m.name!r}")
            models[m.name] = m
            counts[m.name] = counts.get(m.name, 0) + n
    fixed = tuple(dict.fromkeys(d for inv in inventories for d in inv.fixed))
    installed = tuple(p for inv in inventories for p in inv.installed)
    moving = {d for d, _ in installed}
    return Inventory(
        tuple((models[k], counts[k]) for k in models),
        fixed=tuple(d for d in fixed if d not in moving),
        installed=installed,
        notes=tuple(n for inv in inventories for n in inv.notes),
    )


def inventory_from_spec(name_or_path: str | Path) -> Inventory:
    """The ``inventory:`` of a machine spec (a bundled name or a YAML path).

    Each item becomes a :class:`DeviceModel`: a model the planner knows
    (matched by name, e.g. "NVIDIA A100 40GB PCIe") gives its key and the
    figures the spec leaves out; the spec's own ``fits``, ``double_width``,
    ``gen``, ``lanes``, read bandwidth, IOPS and capacity win. Devices
    installed in the spec's slots stay where they are (``fixed``).

    >>> inv = inventory_from_spec("moment-b")
    >>> str(inv), inv.model("p5510").form_factors
    ('4 × a100-40gb-pcie, 8 × p5510', ('u.2', 'cem'))
    """
    from planner.topology.spec.load import read_machine_spec
    from planner.topology.spec.schema import FORM_FACTORS

    spec = read_machine_spec(name_or_path)
    if not spec.inventory:
        raise PlannerError(f"{spec.source}: the machine spec lists no devices to place "
                           "(no 'inventory:'); give the counts instead")
    items: list[tuple[DeviceModel, int]] = []
    notes: list[str] = []
    for it in spec.inventory:
        where = f"{spec.source}:{it.line}" if it.line else spec.source
        if it.kind.value not in PLACEABLE_KINDS:
            raise PlannerError(f"{where}: the planner places GPUs and NVMe SSDs, not "
                               f"{it.kind.value} devices ({it.model!r})")
        known = recognise_model(it.model)
        if known is not None and known.kind != it.kind.value:
            known = None
        base = known or DEVICE_MODELS[f"generic-{it.kind.value}"]
        fits = tuple(it.fits)
        if known is not None and set(fits) == set(FORM_FACTORS) and it.form_factor is None:
            fits = known.form_factors  # the spec said nothing: the known model's
        attrs = it.attrs
        mem = attrs.get("capacity_bytes") if it.kind.value == "gpu" else None
        model = DeviceModel(
            name=known.name if known is not None else _slug(it.model),
            kind=it.kind.value,
            lanes=it.lanes or base.lanes,
            pcie_gen=it.pcie_gen or base.pcie_gen,
            form_factors=fits,
            double_width=bool(it.double_width or (known is not None and known.double_width)),
            read_bytes_per_s=attrs.get("read_bytes_per_s") or base.read_bytes_per_s,
            read_iops=attrs.get("random_read_iops") or base.read_iops,
            memory_bytes=int(mem) if mem else base.memory_bytes,
            title=it.model,
            source=f"{where} (machine spec)" + (f"; {base.source}" if known else ""),
        )
        if known is None:
            missing = [a for a, v in (("read_bandwidth", attrs.get("read_bytes_per_s")),
                                      ("random_read_iops", attrs.get("random_read_iops")))
                       if it.kind.value == "nvme" and v is None]
            if missing:
                notes.append(f"{it.model}: {', '.join(missing)} not in the spec; "
                             f"took {base.name}'s typical figures")
        if any(m.name == model.name for m, _ in items):
            raise PlannerError(f"{where}: the spec lists model {it.model!r} twice")
        items.append((model, it.count))
    fixed = tuple(n.id for n in spec.topology.nodes() if n.kind in DEVICE_KINDS)
    return Inventory(tuple(items), fixed=fixed, notes=tuple(notes))
