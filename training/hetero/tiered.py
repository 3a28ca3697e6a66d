"""A heterogeneous placement on disk, and the tiered store that gathers typed batches from it.

:func:`write_hetero_placement` writes what :func:`training.hetero.place.place_hetero` decided:
each featured type's sub-bins (:func:`iostack.bins.write_bins`: SSD files in the type's own
width and dtype) and its placement index under ``<out>/types/<type>/``, then, last, the
manifest :data:`MANIFEST` (nothing under ``out`` is a placement before it exists).

:class:`HeteroFeatureStore` opens one :class:`iostack.store.FeatureStore` per type over those
sub-bins (caches filled from the type's ``feat_<type>.npy``) and gathers a type's rows by local
id in that type's width and dtype; its per-tier counters are the types' summed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

import numpy as np
import torch

from iostack.placement import load_placement, save_json
from iostack.store import FeatureStore
from momentbase.jsontypes import JsonObject
from planner.progress import Progress
from training.data import fingerprint
from training.hetero.place import HeteroPlaceResult
from training.hetero.store import HeteroDataset
from training.place.bins import PlacingError

#: the manifest of a heterogeneous placement (written last)
MANIFEST = "hetero_place.json"


def type_dir(out: str | os.PathLike[str], node_type: str) -> Path:
    """Where ``node_type``'s placement index lives under the placement directory ``out``."""
    return Path(out) / "types" / node_type


def write_hetero_placement(data: HeteroDataset, res: HeteroPlaceResult, out: str | os.PathLike[str],
                           report: JsonObject, *, progress: Progress | None = None) -> Path:
    """Write every type's sub-bins and index, then ``report`` as the manifest; returns its path.

    Raises
    ------
    PlacingError
        A bin file could not be written (the message names it).
    """
    from iostack.bins import write_bins

    out = Path(out)
    fp = fingerprint(data.base)
    for t, p in res.placements.items():
        try:
            write_bins(data.features[t], p, out, progress=progress)
        except OSError as exc:
            raise PlacingError(f"writing the bins of {t}: {exc.strerror or exc} ({getattr(exc, 'filename', '')}); "
                               "check the `ssd_dirs` directories") from None
        p.save(type_dir(out, t), dataset_fingerprint=fp)
    save_json(out / MANIFEST, {**report, "types": list(res.placements)})
    return out / MANIFEST


def read_manifest(out: str | os.PathLike[str]) -> JsonObject:
    """The manifest of the heterogeneous placement in ``out``.

    Raises
    ------
    PlacingError
        ``out`` holds no heterogeneous placement, or its manifest is unreadable.
    """
    man = Path(out) / MANIFEST
    try:
        data = json.loads(man.read_text())
    except FileNotFoundError:
        raise PlacingError(f"`placement` {out}: no {MANIFEST}; place the heterogeneous dataset there first") from None
    except (OSError, ValueError) as exc:
        raise PlacingError(f"{man}: unreadable ({exc}); place the dataset again") from None
    if not isinstance(data, dict) or not isinstance(data.get("types"), list):
        raise PlacingError(f"{man}: not a heterogeneous placement manifest; place the dataset again")
    return data


class HeteroFeatureStore:
    """Tiered gathers of typed rows: ``gather(node_type, local_ids)`` in the type's width and dtype.

    ``out``: a placement directory :func:`write_hetero_placement` wrote for ``data``;
    ``device``, ``backend``, ``backend_options``: as :class:`iostack.store.FeatureStore` takes them.
    """

    def __init__(self, data: HeteroDataset, out: str | os.PathLike[str], *, device: str | torch.device = "cpu",
                 backend: str = "auto", backend_options: Mapping[str, object] | None = None) -> None:
        man = read_manifest(out)
        fp = fingerprint(data.base)
        self.stores: dict[str, FeatureStore] = {}
        try:
            for t in man["types"]:
                p = load_placement(type_dir(out, str(t)))
                if p.dataset_fingerprint is not None and dict(p.dataset_fingerprint) != fp:
                    raise PlacingError(f"`placement` {out}: made from another dataset than {data.base.path}; "
                                       "place this dataset")
                if str(t) not in data.features or p.num_vertices != data.features[str(t)].shape[0]:
                    raise PlacingError(f"`placement` {out}: type {t} does not match {data.base.path}; "
                                       "place this dataset")
                self.stores[str(t)] = FeatureStore(p, out, features=data.features[str(t)], backend=backend,
                                                   backend_options=dict(backend_options or {}), device=device)
        except BaseException:
            self.close()
            raise

    def gather(self, node_type: str, ids: torch.Tensor | np.ndarray) -> torch.Tensor:
        """Rows of ``node_type``'s nodes ``ids`` (local ids), ``[len(ids), width]`` in the type's dtype."""
        return self.stores[node_type].gather(ids)

    def tier_stats(self) -> dict[str, dict[str, float]]:
        """Rows, bytes and requests per tier since opening, every type's summed; ``share`` of rows."""
        out: dict[str, dict[str, float]] = {}
        for s in self.stores.values():
            for kind, v in s.tier_stats().items():
                t = out.setdefault(kind, {"rows": 0, "bytes": 0, "requests": 0, "seconds": 0.0})
                for k in t:
                    t[k] += v[k]
        total = sum(t["rows"] for t in out.values()) or 1
        for t in out.values():
            t["share"] = t["rows"] / total
        return out

    def reset_stats(self) -> None:
        for s in self.stores.values():
            s.reset_stats()

    def close(self) -> None:
        for s in getattr(self, "stores", {}).values():
            s.close()

    def __enter__(self) -> HeteroFeatureStore:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


__all__ = ["MANIFEST", "HeteroFeatureStore", "read_manifest", "type_dir", "write_hetero_placement"]
