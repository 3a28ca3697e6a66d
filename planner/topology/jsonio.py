"""JSON form of a topology (schema ``moment.topology`` version 1).

The schema is documented in ``docs/topology-schema.md``. Round-trip is exact:
``from_dict(to_dict(t))`` has the same nodes, links and attributes.

>>> from planner.topology.model import Node, NodeKind, Topology
>>> t = Topology("x"); _ = t.add_node(Node("socket0", NodeKind.SOCKET))
>>> to_dict(from_dict(to_dict(t))) == to_dict(t)
True
"""

from __future__ import annotations

import json
from pathlib import Path

from momentbase.jsontypes import JsonObject
from planner.errors import TopologyError
from planner.topology.model import Link, LinkKind, Node, NodeKind, Topology

SCHEMA = "moment.topology"
VERSION = 1


def to_dict(topo: Topology) -> JsonObject:
    """The topology as plain JSON-able data (see ``docs/topology-schema.md``)."""
    return {
        "schema": SCHEMA,
        "version": VERSION,
        "name": topo.name,
        "sources": list(topo.sources),
        "notes": list(topo.notes),
        "counts": topo.counts(),
        "nodes": [_node_dict(n) for n in topo.nodes()],
        "links": [_link_dict(lk) for lk in topo.links()],
    }


def _node_dict(n: Node) -> JsonObject:
    d: JsonObject = {"id": n.id, "kind": n.kind.value, "name": n.name}
    for key in ("bus_address", "numa_node", "vendor_id", "device_id"):
        value = getattr(n, key)
        if value is not None:
            d[key] = value
    if n.attrs:
        d["attrs"] = dict(n.attrs)
    return d


def _link_dict(lk: Link) -> JsonObject:
    d: JsonObject = {
        "src": lk.src,
        "dst": lk.dst,
        "kind": lk.kind.value,
        "bytes_per_s": lk.bytes_per_s,
        "bandwidth_source": lk.bandwidth_source,
    }
    if lk.pcie_gen is not None:
        d["pcie_gen"] = lk.pcie_gen
    if lk.lanes is not None:
        d["lanes"] = lk.lanes
    if lk.attrs:
        d["attrs"] = dict(lk.attrs)
    return d


def from_dict(data: object, source: str = "<json>") -> Topology:
    """Rebuild a topology from :func:`to_dict` output, checking the schema."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise TopologyError(f"{source}: not a Moment topology (expected \"schema\": \"{SCHEMA}\")")
    if data.get("version") != VERSION:
        raise TopologyError(
            f"{source}: topology schema version {data.get('version')!r} is not supported "
            f"(this Moment reads version {VERSION})"
        )
    topo = Topology(str(data.get("name", "")), data.get("sources", []))
    topo.notes = list(data.get("notes", []))
    try:
        for i, nd in enumerate(data.get("nodes", [])):
            try:
                kind = NodeKind(nd["kind"])
            except ValueError:
                raise TopologyError(
                    f"{source}: node {i} has kind {nd.get('kind')!r}; "
                    f"expected one of {[k.value for k in NodeKind]}"
                ) from None
            topo.add_node(Node(
                str(nd["id"]), kind, nd.get("name", ""), nd.get("bus_address"),
                nd.get("numa_node"), nd.get("vendor_id"), nd.get("device_id"),
                dict(nd.get("attrs", {})),
            ))
        for i, ld in enumerate(data.get("links", [])):
            try:
                link_kind = LinkKind(ld["kind"])
            except ValueError:
                raise TopologyError(
                    f"{source}: link {i} has kind {ld.get('kind')!r}; "
                    f"expected one of {[k.value for k in LinkKind]}"
                ) from None
            bw = ld.get("bytes_per_s")
            topo.add_link(Link(
                str(ld["src"]), str(ld["dst"]), link_kind, float(bw) if bw is not None else None,
                ld.get("pcie_gen"), ld.get("lanes"), ld.get("bandwidth_source", "unknown"),
                dict(ld.get("attrs", {})),
            ))
    except KeyError as exc:
        raise TopologyError(f"{source}: a node or link lacks the field {exc.args[0]!r}") from None
    except (TypeError, AttributeError):
        raise TopologyError(f"{source}: nodes and links must be JSON objects") from None
    return topo


def dumps(topo: Topology) -> str:
    return json.dumps(to_dict(topo), indent=2, sort_keys=False)


def load(path: str | Path) -> Topology:
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise TopologyError(f"{p}: cannot read ({exc})") from None
    except json.JSONDecodeError as exc:
        raise TopologyError(f"{p}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    return from_dict(data, str(p))
