"""Whether a slot takes a device model: the fit rules of :mod:`planner.layout`."""

from __future__ import annotations

from dataclasses import dataclass

from planner.inventory import DeviceModel, slot_form_factor
from planner.topology.model import Node, NodeKind

__all__ = ["Fit", "slot_fit", "slot_fits"]


@dataclass(frozen=True)
class Fit:
    """Whether a slot takes a model: ``ok``, and why not (``reason``) or what was assumed."""

    ok: bool
    reason: str = ""
    assumed_double_width: bool = False
    assumed_form_factor: bool = False

    def __bool__(self) -> bool:
        return self.ok


def _length_class(slot: Node) -> str:
    ln = str(slot.attrs.get("length") or "").strip().lower()
    return ln if ln in ("long", "short", "other") else ("unknown" if ln in ("", "unknown") else
                                                         "other")


def slot_fit(slot: Node, model: DeviceModel) -> Fit:
    """Whether ``slot`` takes a device of ``model``, by the rules of the module docstring.

    >>> from planner.inventory import device_model
    >>> bay = Node("b", NodeKind.SLOT, attrs={"form_factor": "u.2", "width_lanes": 4})
    >>> slot_fit(bay, device_model("a100-40gb-pcie")).reason
    'a u.2 slot; a100-40gb-pcie fits cem'
    >>> cem = Node("c", NodeKind.SLOT, attrs={"form_factor": "cem", "width_lanes": 16,
    ...                                       "length": "Long"})
    >>> slot_fit(cem, device_model("a100-40gb-pcie")).assumed_double_width
    True
    """
    if slot.kind != NodeKind.SLOT:
        return Fit(False, f"{slot.id} is a {slot.kind.value}, not a slot")
    a = slot.attrs
    if a.get("placement") == "unknown":
        return Fit(False, "placement unknown: the slot is not in the PCIe tree")
    width = a.get("width_lanes")
    if a.get("virtual"):
        if a.get("virtual_kind") != model.kind:
            return Fit(False, f"the position of a {a.get('virtual_kind')} takes a "
                              f"{a.get('virtual_kind')}, not a {model.kind}")
        if isinstance(width, int) and width < model.lanes:
            return Fit(False, f"x{width}; {model.name} needs x{model.lanes}")
        return Fit(True)
    ff = slot_form_factor(slot)
    if ff is not None and ff not in model.form_factors:
        return Fit(False, f"a {ff} slot; {model.name} fits {' or '.join(model.form_factors)}")
    if not isinstance(width, int) or isinstance(width, bool):
        return Fit(False, "electrical width unknown")
    if width < model.lanes:
        return Fit(False, f"x{width}; {model.name} needs x{model.lanes}")
    assumed = False
    if model.double_width:
        dw = a.get("double_width")
        if dw is False:
            return Fit(False, f"single width; {model.name} needs a double-width slot")
        if dw is not True:
            if ff in ("cem", None) and width >= 16 and _length_class(slot) in ("long", "unknown"):
                assumed = True
            else:
                return Fit(False, f"double width unknown and not a x16 long CEM slot; "
                                  f"{model.name} needs a double-width slot")
    return Fit(True, assumed_double_width=assumed, assumed_form_factor=ff is None)


def slot_fits(slot: Node, model: DeviceModel) -> bool:
    """``slot_fit(slot, model).ok``."""
    return slot_fit(slot, model).ok
