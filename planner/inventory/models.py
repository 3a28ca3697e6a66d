"""Device models: what a kind of device needs from a slot and what it can do, and the catalogue."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from momentbase.jsontypes import JsonObject, JsonValue
from planner.errors import PlannerError
from planner.topology.pcie import GT_PER_S, VALID_WIDTHS

__all__ = ["DEVICE_MODELS", "PLACEABLE_KINDS", "DeviceModel", "device_attrs", "device_model",
           "recognise_model"]

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
    """  # noqa: E501 (a doctest's or a capture's line, as printed)
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


def _slug(text: str) -> str:
    """A model name made from a device's title: lower case, words joined by dashes."""
    s = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return (s[:48].rstrip("-") or "device")


def device_attrs(model: DeviceModel) -> Mapping[str, JsonValue]:
    """The node attributes a placed device of ``model`` carries (unknown figures left out).

    >>> sorted(device_attrs(device_model("p5510")))
    ['lanes', 'model', 'pcie_gen', 'read_bytes_per_s', 'read_iops', 'title']
    """
    out: JsonObject = {"model": model.name, "title": model.title, "pcie_gen": model.pcie_gen,
                           "lanes": model.lanes}
    for attr, value in (("read_bytes_per_s", model.read_bytes_per_s),
                        ("read_iops", model.read_iops), ("memory_bytes", model.memory_bytes)):
        if value is not None:
            out[attr] = value
    return out
