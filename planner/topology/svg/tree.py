"""Which node a topology picture draws under which: the tree of the picture.

A node is drawn once, under its upstream neighbour; sockets head the row of
trees, memory sits beside its socket, and what hangs under nothing goes to the
"unplaced" band (see :mod:`planner.topology.svg.layout`).
"""

from __future__ import annotations

from collections.abc import Mapping

from planner.topology.model import Node, NodeKind, Topology


def _tree(topo: Topology) -> tuple[list[str], dict[str, str], list[str], dict[str, list[str]]]:
    """(sockets, memory beside each socket, unplaced roots, children of each node).

    Every node ends up in exactly one place: a second upstream link or a
    cycle (which a well-formed topology never has) is drawn as an extra link.
    """
    nodes = topo.nodes()
    parent_of: dict[str, str] = {}
    for n in nodes:
        p = topo.parent(n.id)
        if p is not None:
            parent_of[n.id] = p.id
    # a socket hanging under something (no real machine does) is an ordinary node
    sockets = [n.id for n in nodes if n.kind == NodeKind.SOCKET and n.id not in parent_of]
    socket_set = set(sockets)
    has_kids = set(parent_of.values())
    beside: dict[str, str] = {}
    for n in nodes:
        p = parent_of.get(n.id)
        if (n.kind == NodeKind.MEMORY and p in socket_set and p not in beside
                and n.id not in has_kids):
            beside[p] = n.id
    kids: dict[str, list[str]] = {}
    for n in nodes:
        p = parent_of.get(n.id)
        if p is not None and n.id not in beside.values():
            kids.setdefault(p, []).append(n.id)

    seen: set[str] = set(beside.values())

    def claim(root: str) -> None:
        # a node reached a second time (two parents, a cycle) keeps its first place
        stack = [root]
        while stack:
            x = stack.pop()
            if x in seen:
                continue
            seen.add(x)
            kept = [c for c in kids.get(x, []) if c not in seen]
            kids[x] = kept
            stack.extend(reversed(kept))

    for s in sockets:
        claim(s)
    unplaced: list[str] = []
    for n in nodes:
        if n.id not in seen and n.id not in parent_of:
            unplaced.append(n.id)
            claim(n.id)
    for n in nodes:  # a cycle with no way in: start it anywhere
        if n.id not in seen:
            unplaced.append(n.id)
            claim(n.id)
    placed_under: dict[str, str] = {}
    for p, cs in kids.items():
        for c in cs:
            placed_under.setdefault(c, p)
    for p in list(kids):
        kids[p] = [c for c in kids[p] if placed_under[c] == p]
    return sockets, beside, unplaced, kids


def _chain_device(node: Node, kids: Mapping[str, list[str]], nvlinked: set[str]) -> str | None:
    """The one leaf device of a slot, when the slot holds exactly that (else ``None``)."""
    if node.kind != NodeKind.SLOT:
        return None
    cs = kids.get(node.id, [])
    if len(cs) != 1 or kids.get(cs[0]) or cs[0] in nvlinked:
        return None
    return cs[0]
