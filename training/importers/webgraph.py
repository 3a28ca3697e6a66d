"""WebGraph BV graphs (UK-2014, ClueWeb12 from the LAW collection) to a dataset directory, streamed.

A BV graph is ``BASENAME.properties`` (Java properties: ``nodes``, ``arcs``,
``windowsize``, ``minintervallength``, ``zetak``, ``compressionflags``) and
``BASENAME.graph`` (the compressed successor lists, one bit stream).
``src`` is the basename, or either file. An arc ``x -> y`` is the edge
``x -> y``: ``y`` aggregates from ``x`` (``undirected=True`` stores both directions).

Which reader, and why this one. PyPI has ``webgraph`` (0.2, the Python bindings
of the Rust ``webgraph`` crate, by WebGraph's author): maintained, but its
``BvGraph(basename)`` opens the graph for random access only, which needs a
``BASENAME.ef`` Elias-Fano offset file that the LAW collection does not ship
(it ships ``.graph``, ``.properties``, ``.offsets``) and that must be built with
the Rust command-line tool of a matching version (the ``.ef`` files in the Rust
crate's own repository are refused by the 0.2 binding: "Major version mismatch");
it has no sequential reader and no writer, and it hands successors to Python
one at a time. So the bit stream is decoded here, sequentially (the only access
an import needs, and the only one possible from what LAW ships), by a
numba-compiled decoder of the format (:mod:`training.importers._bvdecode`,
following the Java ``BVGraph`` and the Rust sequential reader), checked
against graphs written by an encoder in the tests and against the real
``cnr-2000`` graph from the LAW collection (the arc counts by kind its
``.properties`` records, and its transpose).

Memory: the ``.graph`` file is memory-mapped; the decoder holds one chunk of
successors (``chunk_edges``) and the lists of the last ``windowsize`` nodes;
the CSR build adds its per-node arrays (:mod:`training.csr`). The stream is
decoded twice (the CSR build's counting and filling passes).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from planner.progress import Progress
from training.data import DEFAULT_CHUNK_EDGES, DatasetError
from training.importers import _bvdecode as bv
from training.writer import DatasetWriter

_CODES = {"UNARY": bv.UNARY, "GAMMA": bv.GAMMA, "DELTA": bv.DELTA, "ZETA": bv.ZETA}
#: the Java BVGraph's defaults, used for what ``compressionflags`` does not name
_DEFAULT_CODES = {"OUTDEGREES": "GAMMA", "REFERENCES": "UNARY", "BLOCKS": "GAMMA", "INTERVALS": "GAMMA",
                  "RESIDUALS": "ZETA", "OFFSETS": "GAMMA"}


@dataclass(frozen=True)
class BVProperties:
    """What ``BASENAME.properties`` says about the bit stream."""

    nodes: int
    arcs: int
    window: int
    min_interval_length: int
    zeta_k: int
    #: code per component (OUTDEGREES, REFERENCES, BLOCKS, INTERVALS, RESIDUALS): a ``_bvdecode`` code
    codes: dict

    def kernel_params(self) -> tuple[int, ...]:
        c = self.codes
        return (self.window, self.min_interval_length, self.zeta_k, c["OUTDEGREES"], c["REFERENCES"],
                c["BLOCKS"], c["INTERVALS"], c["RESIDUALS"], self.nodes)


def basename(src: str | Path) -> Path:
    """``src`` without a ``.graph`` / ``.properties`` suffix."""
    src = Path(src)
    return src.with_suffix("") if src.suffix in (".graph", ".properties") else src


def detect(src: Path) -> bool:
    props = Path(f"{basename(src)}.properties")
    return (
        props.is_file() and Path(f"{basename(src)}.graph").is_file() and "BVGraph" in props.read_text(errors="replace")
    )


def _java_properties(path: Path) -> dict[str, str]:
    """``key=value`` (or ``key: value``) lines; ``#`` and ``!`` start comments."""
    out = {}
    for line in path.read_text(encoding="latin-1").splitlines():
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        key, _, value = line.replace(":", "=", 1).partition("=") if "=" not in line else line.partition("=")
        out[key.strip()] = value.strip()
    return out


def read_properties(path: Path) -> BVProperties:
    """Parse and check ``BASENAME.properties``; a DatasetError names what is wrong and the fix.

    Raises
    ------
    DatasetError
        The file is missing, not a big-endian BVGraph, or has fields out of range.
    """
    if not path.is_file():
        raise DatasetError(f"{path}: no such file; a WebGraph BV graph is BASENAME.properties + BASENAME.graph")
    p = _java_properties(path)
    cls = p.get("graphclass", "")
    if "BVGraph" not in cls:
        raise DatasetError(f"{path}: graphclass {cls or '(none)'} is not a BVGraph; convert it to BV with "
                           "WebGraph (java it.unimi.dsi.webgraph.BVGraph -g CLASS BASENAME NEWBASENAME)")
    if p.get("endianness", "big") != "big":
        raise DatasetError(f"{path}: endianness={p['endianness']}; only big-endian (Java-compatible) BV graphs "
                           "are read: recompress with `webgraph to endianness` (Rust CLI)")
    try:
        nums = {k: int(p[k]) for k in ("nodes", "arcs")}
        window, min_int, k = int(p.get("windowsize", 7)), int(p.get("minintervallength", 4)), int(p.get("zetak", 3))
    except (KeyError, ValueError) as exc:
        raise DatasetError(f"{path}: missing or non-integer {exc}; the properties file is damaged") from None
    codes = dict(_DEFAULT_CODES)
    for flag in filter(None, p.get("compressionflags", "").replace(" ", "").split("|")):
        part, _, code = flag.partition("_")
        if part not in codes or code.rstrip("1234567") not in _CODES:
            raise DatasetError(f"{path}: compression flag {flag!r} is not read here (codes: "
                               f"{', '.join(_CODES)}); recompress with the default flags")
        codes[part] = code
        if code.startswith("ZETA") and code != "ZETA":
            k = int(code[4:])
    if not 1 <= k <= 7 or window < 0 or min_int < 0:
        raise DatasetError(f"{path}: zetak={k}, windowsize={window}, minintervallength={min_int} out of range")
    return BVProperties(nums["nodes"], nums["arcs"], window, min_int, k,
                        {key: _CODES[c.rstrip("1234567")] for key, c in codes.items() if key != "OFFSETS"})


def bv_edge_chunks(graph: Path, props: BVProperties, chunk_edges: int, progress: Progress | None = None):
    """A callable yielding ``(src, dst)`` chunks of the arcs of ``graph``, decoded afresh per call."""
    decode = bv.kernels()
    params = props.kernel_params()
    n, w = props.nodes, props.window

    def chunks():
        data = np.memmap(graph, dtype=np.uint8, mode="r") if graph.stat().st_size else np.zeros(0, np.uint8)
        out = np.empty(max(chunk_edges, 16), dtype=np.int64)
        offs = np.zeros(w + min(chunk_edges, n) + 2, dtype=np.int64)
        need = np.zeros(1, dtype=np.int64)
        pos = x = nh = arcs = 0
        while x < n:
            k, pos, status = decode(data, pos, x, min(n, x + offs.size - w - 2), params, out, offs, nh, need)
            if k:
                deg = np.diff(offs[nh : nh + k + 1])
                yield np.repeat(np.arange(x, x + k, dtype=np.int64), deg), out[offs[nh] : offs[nh + k]].copy()
                arcs += int(offs[nh + k] - offs[nh])
                x += k
                keep = min(w, nh + k)  # the window's lists move to the front for the next call
                a = offs[nh + k - keep]
                out[: offs[nh + k] - a] = out[a : offs[nh + k]]
                offs[: keep + 1] = offs[nh + k - keep : nh + k + 1] - a
                nh = keep
                if progress is not None:
                    progress("decoding BV graph", x, n)
            if status == bv.NEED_ROOM and not k:  # one list longer than the buffer: grow it
                out = np.concatenate([out[: offs[nh]], np.empty(max(out.size, int(need[0])), np.int64)])
            elif status < 0 and status != bv.NEED_ROOM:
                what = {bv.PAST_END: "the bit stream ends early (the file is truncated); download it again",
                        bv.BAD_LIST: "a successor list is out of range or repeats an id; the file is damaged",
                        bv.BAD_CODE: "a reference or block is inconsistent; the file is damaged or its "
                                     ".properties (windowsize, compressionflags) do not match it"}[status]
                raise DatasetError(f"{graph}: node {x:,} (bit {pos:,}): {what}")
        if arcs != props.arcs:
            raise DatasetError(f"{graph}: {arcs:,} arcs decoded, the .properties says {props.arcs:,}; "
                               "the two files do not belong together")

    return chunks


def import_webgraph(
    src: str | Path,
    dst: str | Path,
    *,
    name: str | None = None,
    undirected: bool = False,
    feature_dtype: str | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
    chunk_edges: int = DEFAULT_CHUNK_EDGES,
) -> Path:
    """Convert the BV graph ``src`` (basename, ``.graph`` or ``.properties``) into the dataset directory ``dst``.

    A web graph has no features or labels (``feature_dtype`` is accepted for
    the common signature and unused). Self-loops and repeated arcs are dropped.

    Raises
    ------
    DatasetError
        The ``.graph`` file is missing beside the ``.properties``, or either is malformed.
    """
    base, dst = basename(src), Path(dst)
    props = read_properties(Path(f"{base}.properties"))
    graph = Path(f"{base}.graph")
    if not graph.is_file():
        raise DatasetError(f"{graph}: no such file; the .properties needs its .graph beside it")
    source = {"format": "webgraph", "path": str(graph.resolve()), "arcs": props.arcs, "undirected": undirected,
              "windowsize": props.window, "minintervallength": props.min_interval_length, "zetak": props.zeta_k}
    with DatasetWriter(dst, num_nodes=props.nodes, name=name or base.name, source=source, overwrite=overwrite,
                       progress=progress, chunk_edges=chunk_edges) as w:
        w.write_edges(bv_edge_chunks(graph, props, chunk_edges, progress), undirected=undirected,
                      drop_self_loops=True, dedup=True)
    return dst


__all__ = ["BVProperties", "basename", "bv_edge_chunks", "import_webgraph", "read_properties"]
