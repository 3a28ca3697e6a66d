"""Partitioning a graph over nodes: partitioners by name, and the on-disk format they are written in.

A partitioner assigns every vertex to one of ``parts`` partitions, balanced by
the training seeds and the CSR's edges, cutting few edges; DistDGL's recipe
(METIS with balance constraints) is ``metis``, and ``ldg`` is a one-pass
streaming partitioner for graphs too large to load. Each is a function
``partitioner(ds, parts, *, seed, progress) -> part_of`` (int16 ``[N]``),
registered in :data:`PARTITIONERS` with capabilities ``streaming`` (memory
O(N) plus a chunk, whatever the edge count) and ``requires`` (the module it
needs: ``pymetis`` for ``metis``, imported lazily). :func:`default_method`
picks one: ``metis`` where pymetis is installed and the graph's symmetrised
CSR fits in memory (at most :data:`METIS_MAX_EDGES` CSR entries), else ``ldg``.
Why METIS is the default where it fits, measured (``tools/bench_partition.py``,
``docs/benchmarks.md``, 2 and 4 parts): it cuts fewer edges than LDG on every
graph measured (Cora 3.1-3.4x fewer, Amazon-Photo 1.4-1.6x, the skewed
Chung-Lu graph 1.2-1.4x, which has no communities to find), balances each of
the three counts within 2% where LDG's are within 11%, and so leaves a rank
3-6.5x less of its sampled rows remote than hash ownership on the fixtures,
where LDG manages about 2x. LDG is for size: at 10^7 CSR entries it partitions
in 3 s against METIS's 50 s, with O(N) memory where METIS needs about 140
bytes a CSR entry (1.3 GiB there).

The table imports nothing heavy: the command line lists its names without numpy.

On-disk format (``moment data partition DATASET OUT --parts P``; version 1; the
contract the distributed sampler reads, ``docs/dataset-format.md``). Vertices
are *relabelled* so that partition ``k`` owns the contiguous new ids
``[node_offsets[k], node_offsets[k+1])``, in increasing old id inside a
partition; the relabelled global CSR has every row sorted by new id, and
partition ``k``'s edge positions are ``[edge_offsets[k], edge_offsets[k+1])``
with ``edge_offsets = indptr[node_offsets]``::

    OUT/partition.json   format "moment.partition", version, parts, method, num_nodes, num_edges,
                         node_offsets, edge_offsets, edge_cut (CSR entries whose two ends are in
                         different partitions), per-part seeds / edges / halo counts,
                         source (dataset path and fingerprint digest), index_dtype
    OUT/indptr.npy       int64 [N + 1]  the relabelled GLOBAL row pointers: every rank holds them
                         (8 bytes a vertex: what lets a rank draw positions for any vertex)
    OUT/old_ids.npy      int64 [N]      new id -> old id
    OUT/part_of.npy      int16 [N]      old id -> partition (what feature ownership in the source's
                                        ids follows: ``moment place --nodes P --partition OUT``)
    OUT/part-K/indices.npy   the relabelled global indices (new ids; int32 or int64 as the source)
                             of positions [edge_offsets[K], edge_offsets[K+1])
    OUT/part-K/features.npy  its rows of the features, new-id order, the source's dtype
    OUT/part-K/labels.npy    int64, new-id order
    OUT/part-K/train_idx.npy, valid_idx.npy, test_idx.npy   its seeds, new ids, increasing
    OUT/part-K/halo.npy      sorted new ids of the remote vertices its rows list (the in-neighbours
                             of its vertices held by other partitions)
    OUT/part-K/meta.json     format "moment.partition-part", its number, ranges, files (dtype, shape)

A rank thus holds ``8 (N + 1) + 8 N`` bytes of shared index (the global indptr
and old_ids; part_of adds 2 N) plus 1/P of the indices and features: the graph
share per node is about ``1/P`` of the indices plus those 16 bytes a vertex.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from momentbase.registry import Registry
from training.errors import TrainingError

__all__ = ["METIS_MAX_EDGES", "PARTITIONERS", "PartitionError", "default_method"]

#: the most CSR entries ``default_method`` hands METIS: its symmetrised int64 copy and METIS's own
#: graph take about 140 bytes an entry (measured at 10^7), 7 GB at 5e7
METIS_MAX_EDGES = 50_000_000


class PartitionError(TrainingError):
    """A partitioning that cannot be made, written or read (the message names the input and the fix)."""


# Any: each partitioner's own keyword options; all return an int16 [N] array
PARTITIONERS: Registry[Callable[..., Any]] = Registry("partitioner", PartitionError)
PARTITIONERS.register("metis", "training.partition.metis:metis_partition", streaming=False, requires="pymetis")
PARTITIONERS.register("ldg", "training.partition.stream:ldg_partition", streaming=True, requires=None)


def default_method(num_edges: int) -> str:
    """``metis`` when pymetis imports and ``num_edges`` is at most :data:`METIS_MAX_EDGES`, else ``ldg``."""
    import importlib.util

    if num_edges <= METIS_MAX_EDGES and importlib.util.find_spec("pymetis") is not None:
        return "metis"
    return "ldg"
