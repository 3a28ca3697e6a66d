"""Opening a partitioned dataset (``moment data partition``'s ``OUT``): the shared index, then any partition.

:func:`open_partition` reads ``partition.json`` and memory-maps what every rank
holds (the relabelled global ``indptr``, ``old_ids``, ``part_of``);
:meth:`Partitioned.part` opens one ``part-K`` directory. A partition directory
is not a dataset of its own (its indices are global new ids over its slice of
the global row pointers), so :func:`training.data.open_dataset` refuses it with
a message naming this module's call.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from momentbase.jsontypes import JsonObject
from training.partition import PartitionError
from training.partition.write import FORMAT, MANIFEST, PART_FORMAT, VERSION, part_dir


def _load(path: Path) -> np.ndarray:
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise PartitionError(f"{path}: missing; partition the dataset again (`write_partition`)") from None
    except (ValueError, OSError) as exc:
        raise PartitionError(f"{path}: not a readable .npy file ({exc}); partition the dataset again") from None


def _json(path: Path, fmt: str) -> JsonObject:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise PartitionError(f"{path}: missing; {path.parent} is not a partitioned dataset "
                             "(make one with `write_partition`)") from None
    except (OSError, ValueError) as exc:
        raise PartitionError(f"{path}: unreadable ({exc}); partition the dataset again") from None
    if not isinstance(data, dict) or data.get("format") != fmt:
        raise PartitionError(f"{path}: not a {fmt} file (no \"format\": \"{fmt}\")")
    if data.get("version") != VERSION:
        raise PartitionError(f"{path}: version {data.get('version')!r}, this Moment reads {VERSION}; "
                             "partition the dataset again")
    return data


def is_partitioned(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` holds a ``partition.json``."""
    return (Path(path) / MANIFEST).is_file()


@dataclass(frozen=True, eq=False)
class PartData:
    """One partition: its ``meta.json`` and memory maps (``features``, ``labels`` and the splits may be None)."""

    part: int
    path: Path
    meta: JsonObject
    indices: np.ndarray
    halo: np.ndarray
    features: np.ndarray | None = None
    labels: np.ndarray | None = None
    train_idx: np.ndarray | None = None
    valid_idx: np.ndarray | None = None
    test_idx: np.ndarray | None = None

    @property
    def node_range(self) -> tuple[int, int]:
        lo, hi = self.meta["node_range"]
        return int(lo), int(hi)


@dataclass(frozen=True, eq=False)
class Partitioned:
    """``OUT`` opened: the manifest and what every rank holds (``indptr`` [N+1], ``old_ids`` [N], ``part_of`` [N])."""

    path: Path
    manifest: JsonObject
    indptr: np.ndarray
    old_ids: np.ndarray
    part_of: np.ndarray = field(repr=False)

    @property
    def parts(self) -> int:
        return int(self.manifest["parts"])

    @property
    def node_offsets(self) -> np.ndarray:
        return np.asarray(self.manifest["node_offsets"], np.int64)

    @property
    def edge_offsets(self) -> np.ndarray:
        return np.asarray(self.manifest["edge_offsets"], np.int64)

    def part(self, k: int) -> PartData:
        """Partition ``k``'s directory, opened.

        Raises
        ------
        PartitionError
            ``k`` outside the partitions, or a file missing or of the wrong shape.
        """
        if not 0 <= int(k) < self.parts:
            raise PartitionError(f"partition {k}: {self.path} has partitions 0..{self.parts - 1}")
        d = part_dir(self.path, k)
        meta = _json(d / "meta.json", PART_FORMAT)
        arrays = {}
        for name, decl in meta["files"].items():
            arr = _load(d / f"{name}.npy")
            if str(arr.dtype) != decl["dtype"] or list(arr.shape) != list(decl["shape"]):
                raise PartitionError(f"{d / f'{name}.npy'}: {arr.dtype} {list(arr.shape)}, meta.json declares "
                                     f"{decl['dtype']} {decl['shape']}; partition the dataset again")
            arrays[name] = arr
        a, b = (int(x) for x in meta["edge_range"])
        if arrays["indices"].shape[0] != b - a:
            raise PartitionError(f"{d / 'indices.npy'}: {arrays['indices'].shape[0]} entries, the edge range "
                                 f"[{a}, {b}) needs {b - a}; partition the dataset again")
        return PartData(int(k), d, meta, **arrays)


def open_partition(path: str | os.PathLike[str]) -> Partitioned:
    """``path`` (a ``moment data partition`` output) opened, its shared arrays checked against the manifest.

    Raises
    ------
    PartitionError
        No ``partition.json``, another format or version, a shared array missing or of the wrong length.
    """
    root = Path(path)
    man = _json(root / MANIFEST, FORMAT)
    n = int(man["num_nodes"])
    indptr, old_ids, part_of = (_load(root / f"{x}.npy") for x in ("indptr", "old_ids", "part_of"))
    for name, arr, want in (("indptr", indptr, n + 1), ("old_ids", old_ids, n), ("part_of", part_of, n)):
        if arr.shape != (want,):
            raise PartitionError(f"{root / f'{name}.npy'}: shape {list(arr.shape)}, the manifest's {n:,} vertices "
                                 f"need [{want}]; partition the dataset again")
    if int(indptr[-1]) != int(man["num_edges"]):
        raise PartitionError(f"{root / 'indptr.npy'}: ends at {int(indptr[-1])}, not at num_edges "
                             f"{man['num_edges']}; partition the dataset again")
    return Partitioned(root, man, indptr, old_ids, part_of)


def summary(man: JsonObject) -> JsonObject:
    """What ``moment data info`` says of a partitioned dataset: counts, cut, balance, halo share (the parts'
    halo vertices summed, over the vertices: above 1 when a vertex is in several parts' halos)."""
    parts = man["parts_detail"]
    n, e = int(man["num_nodes"]), max(int(man["num_edges"]), 1)
    p = int(man["parts"])

    def spread(values: list[int]) -> float:
        """The largest over the mean (1.0: even)."""
        mean = sum(values) / len(values) if values else 0
        return max(values) / mean if mean else 1.0

    return {"name": man.get("name"), "parts": p, "method": man["method"], "num_nodes": n,
            "num_edges": int(man["num_edges"]), "edge_cut": int(man["edge_cut"]),
            "edge_cut_share": int(man["edge_cut"]) / e,
            "balance": {"nodes": spread([r["nodes"] for r in parts]), "edges": spread([r["edges"] for r in parts]),
                        "train_seeds": spread([r["seeds"].get("train", 0) for r in parts])},
            "halo_share": sum(int(r["halo"]) for r in parts) / max(n, 1),
            "parts_detail": parts, "source": man.get("source")}


__all__ = ["PartData", "Partitioned", "is_partitioned", "open_partition", "summary"]
