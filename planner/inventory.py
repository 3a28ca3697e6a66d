"""What to place: device models and the inventory of devices to put into slots.

A :class:`DeviceModel` says what a kind of device needs from a slot (its
form factors, electrical width, a double-width opening) and what it can do
(read bandwidth and IOPS for an SSD, memory for a GPU). An
:class:`Inventory` lists how many devices of each model are to be placed,
which of them sit in slots already (``installed``: they may move) and which
devices stay where they are (``fixed``).

Three ways to get an inventory:

- :func:`inventory_from_counts`: "4 GPUs and 8 SSDs" of named models (the
  paper's A100 40GB PCIe and Intel P5510 by default);
- :func:`inventory_from_spec`: the ``inventory:`` of a machine spec;
- :func:`inventory_from_topology`: the GPUs and NVMe SSDs a (live or
  captured) machine has in its slots.

>>> inv = inventory_from_counts(4, 8)
>>> str(inv)
'4 × a100-40gb-pcie, 8 × p5510'
>>> inv.count("p5510"), inv.model("p5510").read_bytes_per_s / 2**30
(8, 6.0)
>>> device_model("a100").name
'a100-40gb-pcie'
>>> inventory_from_counts(0, 0)
Traceback (most recent call last):
...
planner.errors.PlannerError: nothing to place: 0 GPUs and 0 SSDs

Figures can be overridden with :func:`dataclasses.replace`, e.g. a measured
read bandwidth (``replace(device_model("p5510"), read_bytes_per_s=5.8e9)``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from planner.errors import PlannerError
from planner.topology.model import DEVICE_KINDS, Link, LinkKind, Node, NodeKind, Topology
from planner.topology.pcie import GT_PER_S, VALID_WIDTHS

__all__ = [
    "DEVICE_MODELS",
    "PLACEABLE_KINDS",
    "DeviceModel",
    "Inventory",
    "device_attrs",
    "device_model",
    "inventory_from_counts",
    "inventory_from_spec",
    "inventory_from_topology",
    "merge_inventories",
    "recognise_model",
    "slot_form_factor",
    "with_virtual_slots",
]

#: the device kinds the planner places
PLACEABLE_KINDS = ("gpu", "nvme")

#: slot form factors a model may fit (the spec's, plus ``sxm`` for GPU sockets on a board)
SLOT_FORM_FACTORS = ("cem", "u.2", "m.2", "ocp", "sxm", "other")

_GIB = 2**30


@dataclass(frozen=True)
class DeviceModel:
    """A kind of device to place, with what it needs from a slot.

    ``name`` is the short key (``"a100-40gb-pcie"``) that layouts use;
    ``title`` the human name. ``kind`` is ``"gpu"`` or ``"nvme"``.
    ``lanes``/``pcie_gen`` are the device's own link: a slot must be at
    least ``lanes`` wide electrically (the link then runs at the lower
    generation of the two). ``form_factors`` lists the slot form factors
    it goes into — a U.2 SSD fits ``"u.2"`` bays and, through an adapter
    card, ``"cem"`` slots — and ``double_width`` says it needs a
    double-width opening. ``read_bytes_per_s`` and ``read_iops`` (4 KiB
    random reads) describe an SSD, ``memory_bytes`` a GPU; ``None`` means
    unknown. ``source`` says where the figures come from.

    >>> m = device_model("p5510")
    >>> m.kind, m.lanes, m.form_factors, m.read_iops
    ('nvme', 4, ('u.2', 'cem'), 700000)
    """

    name: str
    kind: str
    lanes: int
    pcie_gen: int
    form_factors: tuple[str, ...]
    double_width: bool = False
    read_bytes_per_s: float | None = None
    read_iops: float | None = None
    memory_bytes: int | None = None
    title: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise PlannerError(f"a device model needs a name, got {self.name!r}")
        where = f"device model {self.name!r}"
        if self.kind not in PLACEABLE_KINDS:
            raise PlannerError(f"{where}: kind must be one of {', '.join(PLACEABLE_KINDS)}, "
                               f"got {self.kind!r}")
        if isinstance(self.lanes, bool) or self.lanes not in VALID_WIDTHS:
            raise PlannerError(f"{where}: lanes must be a PCIe width "
                               f"({', '.join(map(str, VALID_WIDTHS))}), got {self.lanes!r}")
        if isinstance(self.pcie_gen, bool) or self.pcie_gen not in GT_PER_S:
            raise PlannerError(f"{where}: pcie_gen must be 1 to {max(GT_PER_S)}, "
                               f"got {self.pcie_gen!r}")
        ffs = tuple(self.form_factors) if not isinstance(self.form_factors, str) else ()
        if not ffs or any(f not in SLOT_FORM_FACTORS for f in ffs):
            raise PlannerError(f"{where}: form_factors must be a non-empty list of "
                               f"{', '.join(SLOT_FORM_FACTORS)}, got {self.form_factors!r}")
        object.__setattr__(self, "form_factors", ffs)
        for attr in ("read_bytes_per_s", "read_iops", "memory_bytes"):
            v = getattr(self, attr)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or v <= 0:
                raise PlannerError(f"{where}: {attr} must be a positive number or None, got {v!r}")
        if not self.title:
            object.__setattr__(self, "title", self.name)

    def describe_needs(self) -> str:
        """What a slot must offer, in words.

        >>> device_model("a100-40gb-pcie").describe_needs()
        'a cem slot, x16 or wider, double width'
        """
        ffs = " or ".join(self.form_factors)
        out = f"a {ffs} slot, x{self.lanes} or wider"
        if self.double_width:
            out += ", double width"
        return out


#: the device models the planner knows, by name; every figure says where it comes from
DEVICE_MODELS: dict[str, DeviceModel] = {
    m.name: m
    for m in (
        DeviceModel(
            "a100-40gb-pcie", "gpu", lanes=16, pcie_gen=4, form_factors=("cem",),
            double_width=True, memory_bytes=40 * _GIB, title="NVIDIA A100 40GB PCIe",
            source="Moment Table 1 (4 x A100 40GB PCIe, PCIe 4.0 x16) and §3.2 (needs a dual, "
                   "double-width slot); NVIDIA A100 PCIe datasheet: Gen4 x16, dual-slot "
                   "full-height full-length card, 40 GB HBM2 (40 GiB)",
        ),
        DeviceModel(
            "p5510", "nvme", lanes=4, pcie_gen=4, form_factors=("u.2", "cem"),
            read_bytes_per_s=6 * _GIB, read_iops=700_000, title="Intel P5510 3.84 TB",
            source="Moment Table 1 (8 x Intel P5510 3.84 TB) and §2.2 (about 6 GiB/s per PCIe "
                   "4.0 NVMe SSD), as in the bundled specs; Intel D7-P5510 3.84 TB brief: "
                   "U.2 15 mm, PCIe 4.0 x4, 6500 MB/s sequential read, 700K 4 KiB random-read "
                   "IOPS; a CEM slot takes it through a U.2 adapter card",
        ),
        DeviceModel(
            "samsung-980-pro", "nvme", lanes=4, pcie_gen=4, form_factors=("m.2", "cem"),
            read_bytes_per_s=7.0e9, read_iops=1_000_000, title="Samsung 980 PRO",
            source="Samsung 980 PRO datasheet (1 TB / 2 TB): M.2 2280, PCIe 4.0 x4, up to "
                   "7,000 MB/s sequential read, up to 1,000K 4 KB random-read IOPS (QD32); "
                   "a CEM slot takes it through an M.2 adapter card. The Moment artifact's "
                   "README lists 980 Pro drives beside the P5510s",
        ),
        DeviceModel(
            "h100-pcie", "gpu", lanes=16, pcie_gen=5, form_factors=("cem",),
            double_width=True, memory_bytes=80 * _GIB, title="NVIDIA H100 PCIe",
            source="NVIDIA H100 PCIe datasheet: PCIe Gen5 x16, dual-slot full-height "
                   "full-length card, 80 GB HBM2e (80 GiB)",
        ),
        DeviceModel(
            "h100-sxm", "gpu", lanes=16, pcie_gen=5, form_factors=("sxm",),
            memory_bytes=80 * _GIB, title="NVIDIA H100 SXM5 80GB",
            source="NVIDIA H100 SXM5 datasheet: 80 GB HBM3 (80 GiB) on an SXM5 socket of an "
                   "HGX board; host link PCIe Gen5 x16 (LnkCap 32GT/s x16 in the HPE Cray "
                   "XD665 capture, device 10de:2330)",
        ),
        DeviceModel(
            "generic-gpu", "gpu", lanes=16, pcie_gen=4, form_factors=("cem",),
            double_width=True, title="GPU (generic)",
            source="placeholder for an unknown GPU: a PCIe 4.0 x16 double-width card like the "
                   "paper's A100; memory unknown",
        ),
        DeviceModel(
            "generic-nvme", "nvme", lanes=4, pcie_gen=4, form_factors=("u.2", "m.2", "cem"),
            read_bytes_per_s=6 * _GIB, read_iops=1_000_000, title="NVMe SSD (generic)",
            source="placeholder for an unknown NVMe SSD: Moment §2.2's typical PCIe 4.0 NVMe "
                   "SSD, about 6 GiB/s and over one million random IOPS (not a measurement)",
        ),
    )
}

#: how a device found in a topology or named in a spec is recognised: PCI ids, or name tokens
_RECOGNISE: dict[str, tuple[tuple[str, ...], tuple[frozenset[str], ...]]] = {
    "a100-40gb-pcie": (("10de:20f1",), (frozenset({"a100", "pcie", "40gb"}),)),
    "h100-pcie": (("10de:2331",), (frozenset({"h100", "pcie"}),)),
    "h100-sxm": (("10de:2330",), (frozenset({"h100", "sxm5"}), frozenset({"h100", "sxm"}))),
    "p5510": ((), (frozenset({"p5510"}),)),
    "samsung-980-pro": ((), (frozenset({"980", "pro"}), frozenset({"980pro"}))),
}

_ALIASES = {"a100": "a100-40gb-pcie", "a100-pcie": "a100-40gb-pcie", "980pro": "samsung-980-pro",
            "980-pro": "samsung-980-pro", "gpu": "generic-gpu", "nvme": "generic-nvme",
            "ssd": "generic-nvme", "h100": "h100-pcie"}


def _key(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "", text.lower())


def device_model(name: str | DeviceModel) -> DeviceModel:
    """The known model called ``name`` (its key, title or a short alias, any case).

    >>> device_model("Intel P5510 3.84 TB").name
    'p5510'
    >>> device_model("a200")
    Traceback (most recent call last):
    ...
    planner.errors.PlannerError: unknown device model 'a200' (known: a100-40gb-pcie, generic-gpu, generic-nvme, h100-pcie, h100-sxm, p5510, samsung-980-pro)
    """
    if isinstance(name, DeviceModel):
        return name
    if not isinstance(name, str):
        raise PlannerError(f"a device model name must be text, got {name!r}")
    want = _key(name)
    for m in DEVICE_MODELS.values():
        if want in (_key(m.name), _key(m.title)):
            return m
    for alias, target in _ALIASES.items():
        if want == _key(alias):
            return DEVICE_MODELS[target]
    raise PlannerError(f"unknown device model {name!r} (known: {', '.join(sorted(DEVICE_MODELS))})")


def recognise_model(text: str | None, vendor_id: str | None = None,
                    device_id: str | None = None) -> DeviceModel | None:
    """The known model a device's name or PCI ids point to, or ``None``.

    >>> recognise_model("NVIDIA Corporation GH100 [H100 SXM5 80GB HBM3]").name
    'h100-sxm'
    >>> recognise_model("anything", "10de", "20f1").name
    'a100-40gb-pcie'
    >>> recognise_model("NVIDIA A100-SXM4-40GB") is None
    True
    """
    pci = f"{vendor_id}:{device_id}".lower() if vendor_id and device_id else None
    if pci is not None:
        for name, (ids, _) in _RECOGNISE.items():
            if pci in ids:
                return DEVICE_MODELS[name]
    if not text:
        return None
    tokens = set(re.split(r"[^a-z0-9]+", text.lower()))
    for name, (_, token_sets) in _RECOGNISE.items():
        if any(ts <= tokens for ts in token_sets):
            return DEVICE_MODELS[name]
    return None


# ---------------------------------------------------------------------------
# inventories


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


def _slug(text: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return (s[:48].rstrip("-") or "device")


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
    from planner.topology.spec import FORM_FACTORS, read_machine_spec

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


# ---------------------------------------------------------------------------
# devices of a topology


def _has_slots(topo: Topology) -> bool:
    return any(True for _ in topo.nodes(NodeKind.SLOT))


def _placeable(n: Node) -> bool:
    return n.kind in (NodeKind.GPU, NodeKind.NVME)


def with_virtual_slots(topo: Topology) -> Topology:
    """``topo`` itself if it has slot nodes; otherwise a copy with virtual slots.

    A topology without slot nodes (``nvidia-smi topo -m``, hwloc or NCCL XML
    alone) says where devices are but not where they could go. Each GPU's
    and NVMe SSD's attachment point then becomes a *virtual slot*
    ``slot:virtual:<device id>`` between the device and its parent, as wide
    as the device's link and taking only a device of the same kind
    (``attrs["virtual_kind"]``); the link above it is the device's old link.

    >>> t = Topology("toy")
    >>> for n in (Node("socket0", NodeKind.SOCKET), Node("g", NodeKind.GPU, "GPU")):
    ...     _ = t.add_node(n)
    >>> _ = t.add_link(Link.pcie("socket0", "g", gen=4, lanes=16))
    >>> v = with_virtual_slots(t)
    >>> v.parent("g").id, v.node("slot:virtual:g").attrs["virtual_kind"]
    ('slot:virtual:g', 'gpu')
    """
    if _has_slots(topo):
        return topo
    out = topo.copy()
    added = 0
    for dev in topo.nodes():
        if not _placeable(dev):
            continue
        parent = topo.parent(dev.id)
        if parent is None:
            continue
        old = topo.link_between(parent.id, dev.id)
        assert old is not None  # the parent is found through this link
        sid = f"slot:virtual:{dev.id}"
        out.add_node(Node(sid, NodeKind.SLOT, f"slot (position of {dev.label})",
                          numa_node=dev.numa_node,
                          attrs={"designation": f"position of {dev.label}",
                                 "width_lanes": old.lanes, "pcie_gen": old.pcie_gen,
                                 "form_factor": None, "virtual": True,
                                 "virtual_kind": dev.kind.value, "in_use": True,
                                 "source": "virtual"}))
        out.remove_node(dev.id)
        out.add_node(dev)
        out.add_link(Link(parent.id, sid, old.kind, old.bytes_per_s, old.pcie_gen, old.lanes,
                          old.bandwidth_source, dict(old.attrs)))
        out.add_link(Link(sid, dev.id, old.kind, old.bytes_per_s, old.pcie_gen, old.lanes,
                          old.bandwidth_source, dict(old.attrs)))
        for lk in topo.links():
            if dev.id in lk.key and lk.key != old.key:
                out.add_link(lk)
        added += 1
    if not added:
        return topo
    out.notes.append(f"no slot nodes: the positions of the {added} GPU(s)/NVMe SSD(s) stand "
                     "for slots (a GPU position takes a GPU, an NVMe position an SSD)")
    return out


def slot_form_factor(slot: Node) -> str | None:
    """The form factor of a slot for the fit rules, ``None`` when unknown.

    ``attrs["form_factor"]`` as given, except that a PCI Express slot of
    length ``Other`` that dmidecode classed ``other`` is a GPU socket on a
    board (an SXM socket of an HGX baseboard): ``"sxm"``.

    >>> slot_form_factor(Node("s", NodeKind.SLOT, attrs={"form_factor": "other",
    ...     "length": "Other", "slot_type": "PCI Express 5 x16"}))
    'sxm'
    """
    ff = slot.attrs.get("form_factor")
    if not isinstance(ff, str) or not ff:
        return None
    if ff == "other" and str(slot.attrs.get("length") or "").lower() == "other" \
            and "pci express" in str(slot.attrs.get("slot_type") or "").lower():
        return "sxm"
    return ff


def _derived_model(dev: Node, slot: Node, link: Link | None) -> DeviceModel:
    """A model for a device the planner does not know, from what the topology says of it."""
    kind = dev.kind.value
    base = DEVICE_MODELS[f"generic-{kind}"]
    lanes = (link.lanes if link is not None else None) or slot.attrs.get("width_lanes") \
        or base.lanes
    gen = (link.pcie_gen if link is not None else None) or slot.attrs.get("pcie_gen") \
        or base.pcie_gen
    ff = slot_form_factor(slot)
    if kind == "gpu":
        ffs: tuple[str, ...] = (ff,) if ff else ("cem",)
        double = ffs == ("cem",) and lanes >= 16
    else:
        ffs = tuple(dict.fromkeys((ff, "cem"))) if ff else base.form_factors
        double = False
    if slot.attrs.get("virtual"):
        ffs, double = base.form_factors, False  # a virtual slot takes any device of its kind
    title = str(dev.attrs.get("model") or dev.name or dev.id)
    read = dev.attrs.get("read_bytes_per_s") or base.read_bytes_per_s
    iops = dev.attrs.get("random_read_iops") or base.read_iops
    mem = (dev.attrs.get("memory_bytes") or dev.attrs.get("capacity_bytes")) if kind == "gpu" \
        else None
    return DeviceModel(
        name=_slug(title), kind=kind, lanes=lanes if lanes in VALID_WIDTHS else base.lanes,
        pcie_gen=gen if gen in GT_PER_S else base.pcie_gen, form_factors=ffs,
        double_width=double, read_bytes_per_s=read, read_iops=iops,
        memory_bytes=int(mem) if mem else None, title=title,
        source=f"derived from {dev.id} in the topology: link and slot as found"
               + ("" if dev.attrs.get("read_bytes_per_s") or kind == "gpu"
                  else f"; read figures {base.name}'s typical ones"),
    )


def inventory_from_topology(
    topo: Topology,
    *,
    keep: Iterable[str] = (),
    move_nvlinked: bool = False,
) -> Inventory:
    """The GPUs and NVMe SSDs installed in the slots of ``topo``, to be moved around.

    A GPU or NVMe device whose parent is a slot node is movable and counted;
    every other device — onboard, a boot disk on a root port without a slot,
    NICs, anything not in a slot — is ``fixed``, and so are the devices
    named in ``keep`` and, unless ``move_nvlinked``, devices with NVLink
    links (moving one would break its bridge or baseboard links). A topology
    with no slot nodes at all uses the devices' positions as slots
    (:func:`with_virtual_slots`): all its GPUs and NVMe SSDs are movable.

    Devices are matched to a known model by PCI id or name
    (:func:`recognise_model`); others get a model derived from their link
    and slot, named after the device. A known model found in a slot
    narrower than its link is allowed that width (it works there, slower).

    >>> from planner.topology.spec import load_machine
    >>> inventory_from_topology(load_machine("moment-a"))
    Traceback (most recent call last):
    ...
    planner.errors.PlannerError: topology 'moment-a' has no GPU or NVMe SSD in a slot: nothing to move (give the devices to place as counts or a spec inventory)
    """
    keep = set(keep)
    for k in keep:
        if k not in topo:
            raise PlannerError(f"keep: no node {k!r} in topology {topo.name!r}")
    work = with_virtual_slots(topo)
    notes: list[str] = []
    models: dict[str, DeviceModel] = {}
    counts: dict[str, int] = {}
    installed: list[tuple[str, str]] = []
    fixed: list[str] = []
    for dev in work.nodes():
        if dev.kind not in DEVICE_KINDS:
            continue
        slot = work.parent(dev.id)
        in_slot = slot is not None and slot.kind == NodeKind.SLOT
        nvlinked = any(lk.kind == LinkKind.NVLINK and dev.id in lk.key for lk in work.links())
        if not (_placeable(dev) and in_slot) or dev.id in keep or dev.attrs.get("onboard"):
            fixed.append(dev.id)
            continue
        if nvlinked and not move_nvlinked:
            fixed.append(dev.id)
            notes.append(f"{dev.id} ({dev.label}) has NVLink links: kept where it is")
            continue
        assert slot is not None
        link = work.link_between(slot.id, dev.id)
        known = recognise_model(str(dev.attrs.get("model") or dev.name), dev.vendor_id,
                                dev.device_id)
        if known is not None and known.kind != dev.kind.value:
            known = None
        model = known or _derived_model(dev, slot, link)
        if slot.attrs.get("virtual"):
            width = link.lanes if link is not None else None
        else:
            width = slot.attrs.get("width_lanes")
        if known is not None and isinstance(width, int) and width < model.lanes \
                and width in VALID_WIDTHS:
            notes.append(f"{dev.id}: {model.name} sits in a x{width} slot; "
                         f"x{width} slots are allowed for it")
            model = replace(model, lanes=width)
        old = models.get(model.name)
        if old is not None and old != model:
            # one name, different slots seen: the loosest needs that all of them satisfy
            model = replace(old, lanes=min(old.lanes, model.lanes),
                            form_factors=tuple(dict.fromkeys(old.form_factors
                                                             + model.form_factors)),
                            double_width=old.double_width and model.double_width)
        models[model.name] = model
        counts[model.name] = counts.get(model.name, 0) + 1
        installed.append((dev.id, model.name))
    if not installed:
        held = [d for d in fixed if work.node(d).kind in (NodeKind.GPU, NodeKind.NVME)
                and any(lk.kind == LinkKind.NVLINK and d in lk.key for lk in work.links())]
        why = (f"; {len(held)} GPU(s)/SSD(s) with NVLink links stay where they are "
               "(move_nvlinked=True moves them)") if held and not move_nvlinked else ""
        raise PlannerError(f"topology {topo.name!r} has no GPU or NVMe SSD in a slot: nothing to "
                           f"move (give the devices to place as counts or a spec inventory){why}")
    if work is not topo:
        notes.append(work.notes[-1])
    return Inventory(tuple((models[k], counts[k]) for k in models), fixed=tuple(fixed),
                     installed=tuple(installed), notes=tuple(dict.fromkeys(notes)))


def device_attrs(model: DeviceModel) -> Mapping[str, Any]:
    """The node attributes a placed device of ``model`` carries (unknown figures left out).

    >>> sorted(device_attrs(device_model("p5510")))
    ['lanes', 'model', 'pcie_gen', 'read_bytes_per_s', 'read_iops', 'title']
    """
    out: dict[str, Any] = {"model": model.name, "title": model.title, "pcie_gen": model.pcie_gen,
                           "lanes": model.lanes}
    for attr, value in (("read_bytes_per_s", model.read_bytes_per_s),
                        ("read_iops", model.read_iops), ("memory_bytes", model.memory_bytes)):
        if value is not None:
            out[attr] = value
    return out

