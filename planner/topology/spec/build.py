"""Reading a machine spec's YAML into a topology: one builder whose methods follow the schema's sections."""

from __future__ import annotations

from collections.abc import Callable

from yaml.nodes import Node as YamlNode
from yaml.nodes import ScalarNode

from momentbase.jsontypes import JsonObject
from planner.errors import TopologyError
from planner.topology.model import Link, LinkKind, Node, NodeKind, Topology
from planner.topology.pcie import DEFAULT_EFFICIENCY, GT_PER_S, VALID_WIDTHS, pcie_bytes_per_s
from planner.topology.pcitree import add_memory_and_interconnect, normalize_address
from planner.topology.spec.schema import (
    _DEFAULT_KEYS,
    _DEVICE_KEYS,
    _INTERCONNECT_KEYS,
    _INVENTORY_KEYS,
    _NVLINK_KEYS,
    _SLOT_KEYS,
    _SOCKET_KEYS,
    _SWITCH_KEYS,
    _TOP_KEYS,
    _UPLINK_KEYS,
    DEVICE_KINDS,
    FORM_FACTORS,
    MAX_COUNT,
    MAX_INVENTORY_COUNT,
    MAX_SWITCH_DEPTH,
    SCHEMA,
    VERSION,
    InventoryItem,
    MachineSpec,
    inferred_figures,
)
from planner.topology.spec.yamlread import (
    _describe,
    _Fig,
    _Reader,
)

#: a YAML mapping's entries by key: (key node, value node), as SpecReader.mapping gives them
_YamlMap = dict[str, tuple[ScalarNode, YamlNode]]

# ---------------------------------------------------------------------------
# building the topology


class _Prov:
    """Provenance gathered for one node or link: which attributes were inferred, and notes."""

    def __init__(self) -> None:
        self.inferred: list[str] = []
        self.notes: dict[str, str] = {}

    def add(self, attr: str, fig: _Fig | None) -> None:
        if fig is None:
            return
        if fig.inferred and attr not in self.inferred:
            self.inferred.append(attr)
        if fig.note:
            self.notes[attr] = fig.note if attr not in self.notes else \
                f"{self.notes[attr]}; {fig.note}"

    def attrs(self) -> JsonObject:
        out: JsonObject = {}
        if self.inferred:
            out["inferred_fields"] = sorted(self.inferred)
        if self.notes:
            out["field_notes"] = dict(sorted(self.notes.items()))
        return out


_MAX_GEN = max(GT_PER_S)


def _expand(template: str, index: int) -> str:
    return template.replace("{i}", str(index)).replace("{n}", str(index + 1))


class _Builder:
    def __init__(self, reader: _Reader) -> None:
        self.r = reader
        self.topo = Topology()
        self.ids: dict[str, int] = {}  # spec ids of switches, slots, devices -> line
        self.devices: dict[str, str] = {}  # spec device id -> node id
        self.default_gen: _Fig | None = None
        self.efficiency = _Fig(DEFAULT_EFFICIENCY)
        self.socket_numa: dict[str, int | None] = {}

    # -- helpers ----------------------------------------------------------
    def _claim(self, spec_id: str, node: YamlNode) -> None:
        if spec_id in self.ids:
            self.r.fail(node, f"a unique id ('{spec_id}' is already used on line "
                              f"{self.ids[spec_id]})", spec_id)
        self.ids[spec_id] = self.r.line(node)

    def _add_node(self, node: Node, where: YamlNode) -> None:
        try:
            self.topo.add_node(node)
        except TopologyError as exc:
            self.r.fail(where, "an entry that fits the machine", str(exc))

    def _add_link(self, link: Link, where: YamlNode) -> None:
        try:
            self.topo.add_link(link)
        except TopologyError as exc:
            self.r.fail(where, "a link that fits the machine", str(exc))

    def _opt(self, m: dict[str, tuple[ScalarNode, YamlNode]], key: str) -> YamlNode | None:
        if key not in m or self.r.is_null(m[key][1]):
            return None
        return m[key][1]

    def _fig(self, m: dict[str, tuple[ScalarNode, YamlNode]], key: str, what: str,
             convert: Callable[[YamlNode, str], object]) -> _Fig | None:
        node = self._opt(m, key)
        return None if node is None else self.r.figure(node, what, convert)

    def _gen(self, node: YamlNode, what: str) -> int:
        return self.r.integer(node, f"{what}: a PCIe generation, 1 to {_MAX_GEN}", 1, _MAX_GEN)

    def _lanes(self, node: YamlNode, what: str) -> int:
        expected = f"{what}: a PCIe width ({', '.join(str(w) for w in VALID_WIDTHS)} lanes)"
        v = self.r.integer(node, expected, 1, max(VALID_WIDTHS))
        if v not in VALID_WIDTHS:
            self.r.fail(node, expected, _describe(node))
        return v

    def _entry_flags(self, m: _YamlMap) -> JsonObject:
        out: JsonObject = {}
        node = self._opt(m, "inferred")
        if node is not None and self.r.boolean(node, "inferred: true or false"):
            out["inferred"] = True
        node = self._opt(m, "note")
        if node is not None:
            out["note"] = self.r.text(node, "a note (text)")
        return out

    def _pcie_link(self, src: str, dst: str, gen: _Fig, lanes: _Fig, bandwidth: _Fig | None,
                   attrs: JsonObject, where: YamlNode) -> Link:
        """A PCIe link of ``gen`` × ``lanes``, or of an explicit ``bandwidth`` when given."""
        prov = _Prov()
        prov.add("pcie_gen", gen)
        prov.add("lanes", lanes)
        if bandwidth is not None:
            prov.add("bytes_per_s", bandwidth)
            bw, src_kind = bandwidth.value, "spec"
        else:
            try:
                bw = pcie_bytes_per_s(gen.value, lanes.value, self.efficiency.value)
            except TopologyError as exc:
                self.r.fail(where, "a PCIe link of a known generation and width", str(exc))
            src_kind = "pcie"
            # a capacity computed from an inferred input is itself inferred
            inputs = [name for name, fig in (("generation", gen), ("width", lanes),
                                             ("protocol efficiency", self.efficiency))
                      if fig.inferred]
            if inputs:
                prov.add("bytes_per_s", _Fig(bw, True, f"computed from an inferred "
                                                       f"{' and '.join(inputs)}"))
        return Link(src, dst, LinkKind.PCIE, bw, gen.value, lanes.value, src_kind,
                    {**prov.attrs(), **attrs})

    # -- document ---------------------------------------------------------
    def build(self, root: YamlNode) -> MachineSpec:
        r = self.r
        top = r.mapping(root, f"a machine spec (a YAML mapping starting 'schema: {SCHEMA}')")
        schema = r.require(top, "schema", root, "a machine spec")
        if r.scalar(schema, f"schema: {SCHEMA}") != SCHEMA:
            r.fail(schema, f"schema: {SCHEMA}", _describe(schema))
        version = r.require(top, "version", root, "a machine spec")
        v = r.scalar(version, f"version {VERSION} of the {SCHEMA} schema")
        if isinstance(v, bool) or not isinstance(v, int) or v != VERSION:
            found = f"the string {v!r}" if isinstance(v, str) else _describe(version)
            r.fail(version, f"version {VERSION} (a number) of the {SCHEMA} schema", found)
        r.keys(top, _TOP_KEYS, "a machine spec")

        name = r.ident(r.require(top, "name", root, "a machine spec"), "a machine name")
        description = ""
        if (node := self._opt(top, "description")) is not None:
            description = r.text(node, "a description (text)")
        sources: list[str] = []
        if (node := self._opt(top, "sources")) is not None:
            sources = [r.text(s, "a source (text)") for s in r.sequence(node, "a list of sources")]
        if (node := self._opt(top, "defaults")) is not None:
            self._defaults(node)

        self.topo = Topology(name, [r.source, *sources])
        sockets_node = r.require(top, "sockets", root, "a machine spec")
        entries = r.sequence(sockets_node, "a list of sockets")
        if not entries:
            r.fail(sockets_node, "at least one socket", "an empty list")
        socket_maps = [self._socket(e) for e in entries]
        self._memory_and_interconnect(socket_maps, self._opt(top, "interconnect"))
        for sock_id, m in socket_maps:
            if (ports := self._opt(m, "ports")) is not None:
                self._ports(ports, sock_id, sock_id, 0)
        if (node := self._opt(top, "nvlink")) is not None:
            for e in r.sequence(node, "a list of NVLink links"):
                self._nvlink(e)
        inventory: list[InventoryItem] = []
        if (node := self._opt(top, "inventory")) is not None:
            inventory = [self._inventory_item(e) for e in r.sequence(node, "a list of devices to place")]

        n_inferred = len(inferred_figures(self.topo))
        if n_inferred:
            self.topo.notes.append(
                f"{n_inferred} figures of machine spec {name!r} are inferred, not given by its "
                "sources (attrs 'inferred_fields' and 'inferred' mark them)")
        if inventory:
            total = sum(i.count for i in inventory)
            self.topo.notes.append(
                f"machine spec {name!r} lists {total} devices to place (its inventory)")
        return MachineSpec(name, description, tuple(sources), self.topo, tuple(inventory),
                           r.source)

    def _defaults(self, node: YamlNode) -> None:
        r = self.r
        m = r.mapping(node, "defaults (a mapping)")
        r.keys(m, _DEFAULT_KEYS, "defaults")
        self.default_gen = self._fig(m, "pcie_gen", "defaults.pcie_gen", self._gen)
        eff = self._fig(m, "protocol_efficiency", "defaults.protocol_efficiency",
                        lambda n, w: r.number(n, f"{w}: a share in (0, 1]", hi=1.0))
        if eff is not None:
            self.efficiency = eff

    # -- sockets, memory, interconnect ----------------------------------
    def _socket(self, entry: YamlNode) -> tuple[str, dict[str, tuple[ScalarNode, YamlNode]]]:
        r = self.r
        m = r.mapping(entry, "a socket (a mapping with 'id:')")
        r.keys(m, _SOCKET_KEYS, "a socket")
        idx = r.integer(r.require(m, "id", entry, "a socket"), "a socket id (0 to 1023)", 0, 1023)
        sock_id = f"socket{idx}"
        if sock_id in self.topo:
            r.fail(m["id"][1], f"a unique socket id (socket {idx} is already defined)", str(idx))
        prov = _Prov()
        attrs: JsonObject = {"source": "spec", "spec_line": r.line(entry)}
        numa_fig = self._fig(m, "numa_nodes", "numa_nodes", self._numa_list)
        numa_nodes: list[int] = numa_fig.value if numa_fig else []
        taken = {n for s in self.topo.nodes(NodeKind.SOCKET) for n in s.attrs.get("numa_nodes", [])}
        if set(numa_nodes) & taken:
            r.fail(m["numa_nodes"][1], "NUMA nodes no other socket has",
                   str(sorted(set(numa_nodes) & taken)))
        if numa_fig:
            attrs["numa_nodes"] = numa_nodes
            prov.add("numa_nodes", numa_fig)
        for key, what, conv in (
            ("cpu_model", "a CPU model", r.text),
            ("threads", "a thread count", lambda n, w: r.integer(n, f"{w} (1 to 65536)", 1, 65536)),
            ("clock_ghz", "a clock in GHz", lambda n, w: r.number(n, w, hi=100.0)),
        ):
            fig = self._fig(m, key, what, conv)
            if fig is not None:
                attrs[key] = fig.value
                prov.add(key, fig)
        numa = numa_nodes[0] if len(numa_nodes) == 1 else None
        self.socket_numa[sock_id] = numa
        self._add_node(Node(sock_id, NodeKind.SOCKET, f"socket {idx}", numa_node=numa,
                            attrs={**attrs, **prov.attrs(), **self._entry_flags(m)}), entry)
        return sock_id, m

    def _numa_list(self, node: YamlNode, what: str) -> list[int]:
        items = self.r.sequence(node, "a list of NUMA node numbers")
        out = [self.r.integer(i, "a NUMA node number (0 to 1023)", 0, 1023) for i in items]
        if len(set(out)) != len(out):
            self.r.fail(node, "distinct NUMA node numbers", str(out))
        return out

    def _memory_and_interconnect(self, sockets: list[tuple[str, JsonObject]],
                                 interconnect: YamlNode | None) -> None:
        r = self.r
        pairs: dict[frozenset[str], int] = {}
        if interconnect is not None:
            for e in r.sequence(interconnect, "a list of inter-socket links"):
                m = r.mapping(e, "an inter-socket link (a mapping with 'sockets:' and 'bandwidth:')")
                r.keys(m, _INTERCONNECT_KEYS, "an inter-socket link")
                ends_node = r.require(m, "sockets", e, "an inter-socket link")
                ends = r.sequence(ends_node, "the two socket ids the link joins, like [0, 1]")
                if len(ends) != 2:
                    r.fail(ends_node, "two socket ids, like [0, 1]", f"{len(ends)} items")
                a, b = (f"socket{r.integer(x, 'a socket id', 0, 1023)}" for x in ends)
                for end, x in ((a, ends[0]), (b, ends[1])):
                    if end not in self.topo:
                        r.fail(x, "the id of a socket defined under 'sockets:'", end[6:])
                if a == b:
                    r.fail(ends_node, "two different sockets", f"[{a[6:]}, {b[6:]}]")
                key = frozenset((a, b))
                if key in pairs:
                    r.fail(ends_node, f"one entry per socket pair (also on line {pairs[key]})",
                           f"[{a[6:]}, {b[6:]}]")
                pairs[key] = r.line(ends_node)
                bw = r.figure(r.require(m, "bandwidth", e, "an inter-socket link"),
                              "an inter-socket bandwidth", r.bandwidth)
                prov = _Prov()
                prov.add("bytes_per_s", bw)
                attrs: JsonObject = {**prov.attrs(), **self._entry_flags(m)}
                for key_name in ("technology", "label"):
                    if (node := self._opt(m, key_name)) is not None:
                        attrs[key_name] = r.text(node, f"a {key_name} (text)")
                self._add_link(Link(a, b, LinkKind.INTER_SOCKET, bw.value,
                                    bandwidth_source="spec", attrs=attrs), e)

        mem: dict[str, tuple[_Fig | None, _Fig | None]] = {}
        for sock_id, m in sockets:
            bw = self._fig(m, "memory_bandwidth", "a memory bandwidth", r.bandwidth)
            cap = self._fig(m, "memory_capacity", "a memory capacity", r.size)
            mem[sock_id] = (bw, cap)
        values = {bw.value if bw else None for bw, _ in mem.values()}
        uniform = values.pop() if len(values) == 1 else None
        add_memory_and_interconnect(self.topo, memory_bytes_per_s=uniform)
        for sock_id, (bw, cap) in mem.items():
            mem_id = "mem" + sock_id[len("socket"):]
            mem_node = self.topo.node(mem_id)
            prov = _Prov()
            attrs = {"source": "spec"}
            if cap is not None:
                attrs["capacity_bytes"] = cap.value
                prov.add("capacity_bytes", cap)
            self.topo.replace_node(mem_node.with_attrs(**attrs, **prov.attrs()))
            if bw is not None:
                lprov = _Prov()
                lprov.add("bytes_per_s", bw)
                self.topo.replace_link(Link(sock_id, mem_id, LinkKind.MEMORY, bw.value,
                                            bandwidth_source="spec", attrs=lprov.attrs()))

    # -- the PCIe tree ----------------------------------------------------
    def _ports(self, node: YamlNode, parent_id: str, socket_id: str, depth: int) -> None:
        r = self.r
        for entry in r.sequence(node, "a list of ports (slots and switches)"):
            m = r.mapping(entry, "a port (a mapping with 'slot: ID' or 'switch: ID')")
            if ("slot" in m) == ("switch" in m):
                r.fail(entry, "a port with exactly one of 'slot: ID' or 'switch: ID'",
                       "both" if "slot" in m else ", ".join(m) or "an empty mapping")
            if "switch" in m:
                self._switch(entry, m, parent_id, socket_id, depth)
            else:
                self._slot(entry, m, parent_id, socket_id)

    def _switch(self, entry: YamlNode, m: _YamlMap, parent_id: str, socket_id: str,
                depth: int) -> None:
        r = self.r
        r.keys(m, _SWITCH_KEYS, "a switch")
        if depth >= MAX_SWITCH_DEPTH:
            r.fail(entry, f"switches nested at most {MAX_SWITCH_DEPTH} deep")
        spec_id = r.ident(m["switch"][1], "a switch id")
        if "{i}" in spec_id or "{n}" in spec_id:
            r.fail(m["switch"][1], "a switch id without '{i}'/'{n}' (switches have no count)",
                   spec_id)
        self._claim(spec_id, m["switch"][1])
        node_id = f"switch:{spec_id}"
        attrs: JsonObject = {"source": "spec", "spec_id": spec_id, "spec_line": r.line(entry)}
        prov = _Prov()
        if (n := self._opt(m, "model")) is not None:
            fig = r.figure(n, "a switch model", r.text)
            attrs["model"] = fig.value
            prov.add("model", fig)
        name = r.text(n, "a switch name") if (n := self._opt(m, "name")) is not None \
            else f"switch {spec_id}"
        address = self._address(m)

        up_node = r.require(m, "uplink", entry, "a switch")
        um = r.mapping(up_node, "an uplink (a mapping with 'lanes:' and optionally 'gen:')")
        r.keys(um, _UPLINK_KEYS, "an uplink")
        gen = self._fig(um, "gen", "the uplink's gen", self._gen) or self.default_gen
        if gen is None:
            r.fail(up_node, "a 'gen:' in the uplink (or defaults.pcie_gen)")
        lanes = r.figure(r.require(um, "lanes", up_node, "an uplink"), "the uplink's lanes",
                         self._lanes)
        bandwidth = self._fig(um, "bandwidth", "the uplink's bandwidth", r.bandwidth)
        attrs.update(uplink_lanes=lanes.value, uplink_gen=gen.value)
        prov.add("uplink_lanes", lanes)
        prov.add("uplink_gen", gen)
        self._add_node(Node(node_id, NodeKind.SWITCH, name, bus_address=address,
                            numa_node=self.socket_numa.get(socket_id),
                            attrs={**attrs, **prov.attrs(), **self._entry_flags(m)}), entry)
        link_attrs = {**self._entry_flags(um)}
        if (n := self._opt(um, "label")) is not None:
            link_attrs["label"] = r.text(n, "a label (text)")
        self._add_link(self._pcie_link(parent_id, node_id, gen, lanes, bandwidth, link_attrs,
                                       up_node), entry)
        if (ports := self._opt(m, "ports")) is not None:
            self._ports(ports, node_id, socket_id, depth + 1)

    def _address(self, m: _YamlMap) -> str | None:
        node = self._opt(m, "bus_address")
        if node is None:
            return None
        text = self.r.text(node, "a PCI address like 0000:85:00.0")
        try:
            return normalize_address(text)
        except TopologyError:
            self.r.fail(node, "a PCI address like 0000:85:00.0", text)

    def _slot(self, entry: YamlNode, m: _YamlMap, parent_id: str, socket_id: str) -> None:
        r = self.r
        r.keys(m, _SLOT_KEYS, "a slot")
        id_node = m["slot"][1]
        template = r.ident(id_node, "a slot id")
        count = self._fig(m, "count", "a slot count",
                          lambda n, w: r.integer(n, f"{w} (1 to {MAX_COUNT})", 1, MAX_COUNT)) \
            or _Fig(1)
        templated = "{i}" in template or "{n}" in template
        if count.value > 1 and not templated:
            r.fail(id_node, "a slot id containing '{i}' or '{n}' when count > 1", template)
        if count.value > 1 and self._opt(m, "bus_address") is not None:
            r.fail(m["bus_address"][0], "no bus_address on a slot entry with count > 1")
        form = r.figure(r.require(m, "form_factor", entry, "a slot"), "a slot form factor",
                        lambda n, w: r.choice(n, w, FORM_FACTORS))
        lanes = r.figure(r.require(m, "lanes", entry, "a slot"), "the slot's electrical width",
                         self._lanes)
        gen = self._fig(m, "gen", "the slot's gen", self._gen) or self.default_gen
        if gen is None:
            r.fail(entry, "a 'gen:' in the slot (or defaults.pcie_gen)")
        double = self._fig(m, "double_width", "double_width: true or false", r.boolean) \
            or _Fig(False)
        front = self._fig(m, "front_bay", "front_bay: true or false", r.boolean) or _Fig(False)
        bandwidth = self._fig(m, "bandwidth", "the slot's bandwidth", r.bandwidth)
        designation = self._fig(m, "designation", "a slot designation", r.text)
        label = r.text(n, "a label (text)") if (n := self._opt(m, "label")) is not None else None
        address = self._address(m)
        flags = self._entry_flags(m)
        device_node = self._opt(m, "device")

        for i in range(count.value):
            spec_id = _expand(template, i)
            self._claim(spec_id, id_node)
            slot_id = f"slot:{spec_id}"
            prov = _Prov()
            for attr, fig in (("designation", designation), ("form_factor", form),
                              ("width_lanes", lanes), ("pcie_gen", gen),
                              ("double_width", double), ("front_bay", front)):
                prov.add(attr, fig)
            if count.value > 1 or count.inferred or count.note:
                prov.add("count", count)
            attrs: JsonObject = {
                "designation": _expand(designation.value, i) if designation else spec_id,
                "width_lanes": lanes.value, "pcie_gen": gen.value, "form_factor": form.value,
                "double_width": double.value, "front_bay": front.value,
                "in_use": device_node is not None, "source": "spec", "spec_id": spec_id,
                "spec_line": r.line(entry),
            }
            if label:
                attrs["label"] = _expand(label, i)
            if address:
                attrs["bus_address"] = address
            self._add_node(Node(slot_id, NodeKind.SLOT, f"slot {attrs['designation']}",
                                numa_node=self.socket_numa.get(socket_id),
                                attrs={**attrs, **prov.attrs(), **flags}), entry)
            link_attrs = {**({"label": attrs["label"]} if label else {}), **flags}
            self._add_link(self._pcie_link(parent_id, slot_id, gen, lanes, bandwidth, link_attrs,
                                           entry), entry)
            if device_node is not None:
                self._device(device_node, slot_id, spec_id, i, count.value, gen, lanes, double,
                             bandwidth, socket_id)

    def _device_figs(self, m: _YamlMap) -> tuple[JsonObject, _Prov]:
        """The figures a device (installed or to place) may carry, as node attributes."""
        r = self.r
        attrs: JsonObject = {}
        prov = _Prov()
        for key, attr, what, conv in (
            ("capacity", "capacity_bytes", "a capacity", r.size),
            ("read_bandwidth", "read_bytes_per_s", "a read bandwidth", r.bandwidth),
            ("write_bandwidth", "write_bytes_per_s", "a write bandwidth", r.bandwidth),
            ("random_read_iops", "random_read_iops", "4 KiB random-read IOPS",
             lambda n, w: r.number(n, w)),
        ):
            fig = self._fig(m, key, what, conv)
            if fig is not None:
                attrs[attr] = int(fig.value) if attr == "random_read_iops" and \
                    float(fig.value).is_integer() else fig.value
                prov.add(attr, fig)
        return attrs, prov

    def _device(self, node: YamlNode, slot_id: str, slot_spec_id: str, index: int, count: int,
                slot_gen: _Fig, slot_lanes: _Fig, slot_double: _Fig, slot_bw: _Fig | None,
                socket_id: str) -> None:
        r = self.r
        m = r.mapping(node, "a device (a mapping with 'kind:' and 'model:')")
        r.keys(m, _DEVICE_KEYS, "a device")
        kind_fig = r.figure(r.require(m, "kind", node, "a device"), "a device kind",
                            lambda n, w: r.choice(n, w, DEVICE_KINDS))
        model = r.figure(r.require(m, "model", node, "a device"), "a device model", r.text)
        if (n := self._opt(m, "id")) is not None:
            template = r.ident(n, "a device id")
            if count > 1 and "{i}" not in template and "{n}" not in template:
                r.fail(n, "a device id containing '{i}' or '{n}' in a slot entry with count > 1",
                       template)
            spec_id, id_where = _expand(template, index), n
        else:
            spec_id, id_where = f"{slot_spec_id}-dev", node
        self._claim(spec_id, id_where)
        node_id = f"dev:{spec_id}"
        attrs, prov = self._device_figs(m)
        prov.add("model", model)
        form = self._fig(m, "form_factor", "a device form factor",
                         lambda n, w: r.choice(n, w, FORM_FACTORS))
        if form is not None:
            attrs["form_factor"] = form.value
            prov.add("form_factor", form)
        double = self._fig(m, "double_width", "double_width: true or false", r.boolean)
        if double is not None:
            if double.value and not slot_double.value:
                r.fail(m["double_width"][1], f"a double-width slot for a double-width device "
                       f"(slot '{slot_spec_id}' is single-width)", "double_width: true")
            attrs["double_width"] = double.value
            prov.add("double_width", double)
        gen = self._fig(m, "gen", "the device's gen", self._gen) or slot_gen
        lanes = self._fig(m, "lanes", "the device's link width", self._lanes) or slot_lanes
        if lanes.value > slot_lanes.value:
            r.fail(m["lanes"][1], f"a device no wider than its x{slot_lanes.value} slot "
                   f"'{slot_spec_id}'", f"x{lanes.value}")
        attrs.update(model=model.value, pcie_gen=gen.value, lanes=lanes.value, slot=slot_id,
                     source="spec", spec_id=spec_id, spec_line=r.line(node))
        prov.add("pcie_gen", gen)
        prov.add("lanes", lanes)
        address = self._address(m)
        self._add_node(Node(node_id, DEVICE_KINDS[kind_fig.value], model.value,
                            bus_address=address, numa_node=self.socket_numa.get(socket_id),
                            attrs={**attrs, **prov.attrs(), **self._entry_flags(m)}), node)
        self.devices[spec_id] = node_id
        link_gen = gen if gen.value <= slot_gen.value else slot_gen
        link = self._pcie_link(slot_id, node_id, link_gen, lanes, None, {}, node)
        if slot_bw is not None and (link.bytes_per_s is None or slot_bw.value < link.bytes_per_s):
            link = self._pcie_link(slot_id, node_id, link_gen, lanes, slot_bw, {}, node)
        self._add_link(link, node)

    # -- NVLink and inventory ---------------------------------------------
    def _nvlink(self, entry: YamlNode) -> None:
        r = self.r
        m = r.mapping(entry, "an NVLink link (a mapping with 'devices:' and 'bandwidth:')")
        r.keys(m, _NVLINK_KEYS, "an NVLink link")
        ends_node = r.require(m, "devices", entry, "an NVLink link")
        ends = r.sequence(ends_node, "the ids of the two installed devices it joins")
        if len(ends) != 2:
            r.fail(ends_node, "two device ids", f"{len(ends)} items")
        ids = [r.ident(x, "a device id") for x in ends]
        for spec_id, x in zip(ids, ends, strict=True):
            if spec_id not in self.devices:
                r.fail(x, "the id of a device installed in a slot of this spec", spec_id)
        if ids[0] == ids[1]:
            r.fail(ends_node, "two different devices", f"[{ids[0]}, {ids[1]}]")
        bw = r.figure(r.require(m, "bandwidth", entry, "an NVLink link"),
                      "an NVLink bandwidth per direction", r.bandwidth)
        prov = _Prov()
        prov.add("bytes_per_s", bw)
        attrs: JsonObject = {**prov.attrs(), **self._entry_flags(m)}
        if (n := self._opt(m, "links")) is not None:
            attrs["nvlink_links"] = r.integer(n, "a number of NVLink links (1 to 64)", 1, 64)
        if (n := self._opt(m, "label")) is not None:
            attrs["label"] = r.text(n, "a label (text)")
        self._add_link(Link(self.devices[ids[0]], self.devices[ids[1]], LinkKind.NVLINK, bw.value,
                            bandwidth_source="spec", attrs=attrs), entry)

    def _inventory_item(self, entry: YamlNode) -> InventoryItem:
        r = self.r
        m = r.mapping(entry, "a device to place (a mapping with 'kind:', 'model:', 'count:')")
        r.keys(m, _INVENTORY_KEYS, "a device to place")
        kind = r.figure(r.require(m, "kind", entry, "a device to place"), "a device kind",
                        lambda n, w: r.choice(n, w, DEVICE_KINDS))
        model = r.figure(r.require(m, "model", entry, "a device to place"), "a device model",
                         r.text)
        count = r.figure(r.require(m, "count", entry, "a device to place"), "a device count",
                         lambda n, w: r.integer(n, f"{w} (1 to {MAX_INVENTORY_COUNT})", 1,
                                                MAX_INVENTORY_COUNT))
        attrs, prov = self._device_figs(m)
        prov.add("model", model)
        prov.add("count", count)
        form = self._fig(m, "form_factor", "a device form factor",
                         lambda n, w: r.choice(n, w, FORM_FACTORS))
        prov.add("form_factor", form)
        fits_fig = self._fig(m, "fits", "the slot form factors the device fits",
                             lambda n, w: tuple(r.choice(x, "a slot form factor", FORM_FACTORS)
                                                for x in r.sequence(n, w)))
        if fits_fig is not None and not fits_fig.value:
            r.fail(m["fits"][1], "at least one slot form factor", "an empty list")
        prov.add("fits", fits_fig)
        fits = fits_fig.value if fits_fig else ((form.value,) if form else FORM_FACTORS)
        double = self._fig(m, "double_width", "double_width: true or false", r.boolean)
        prov.add("double_width", double)
        gen = self._fig(m, "gen", "the device's gen", self._gen)
        prov.add("pcie_gen", gen)
        lanes = self._fig(m, "lanes", "the device's link width", self._lanes)
        prov.add("lanes", lanes)
        flags = self._entry_flags(m)
        return InventoryItem(
            kind=DEVICE_KINDS[kind.value], model=model.value, count=count.value,
            form_factor=form.value if form else None, fits=tuple(fits),
            double_width=bool(double.value) if double else False,
            pcie_gen=gen.value if gen else None, lanes=lanes.value if lanes else None,
            attrs={**attrs, **prov.attrs(), **flags}, line=r.line(entry),
        )
