"""How hot each vertex's feature row is: pre-sampling, out-degree, reverse PageRank; saved with the dataset.

Three measures, one ``[num_nodes]`` array each (higher = read more often):

``presample`` (the default for placement, the paper's §3.3)
    Run the training sampler (same fan-outs and batch size as training) over
    the training vertices for some epochs or mini-batches and count how often
    each vertex is in a batch's ``n_id`` (:func:`training.sampler.count_accesses`).
    int64 counts; their sum is the sum of ``len(n_id)`` over the batches, and
    divided by the epochs covered they are the expected reads per epoch.
``degree``
    How many vertices aggregate from ``v``: its number of appearances in
    ``indices`` (the CSR lists, per vertex, the vertices it aggregates from),
    i.e. ``v``'s out-degree in the message direction, the number of
    neighbourhoods a sampler can draw it from. On undirected graphs (both
    directions stored) it equals ``v``'s in-degree, the CSR row length. int64.
``pagerank``
    Reverse PageRank, as GIDS uses: PageRank on the graph with every message
    edge ``u -> v`` reversed, i.e. a random walk that moves from ``v`` to a
    uniform vertex of its CSR row, which is the direction a sampler walks.
    Power iteration over ``scipy.sparse`` CSR blocks of at most
    :data:`CHUNK_EDGES` edges, so it runs over a memory-mapped CSR of any
    size (blocks are rebuilt each iteration when the graph is larger than
    that, cached otherwise). networkx's ``pagerank`` computes the same
    vector, but builds a Python object per edge: the tests use it on a small
    graph as the reference, never here. float64, sums to 1. Dangling
    vertices (empty rows) jump uniformly, as in networkx.

Saved next to the dataset: ``<dataset>/hotness/<method>.npy`` with
``<method>.json`` saying how it was made (method, parameters, the dataset's
vertex and edge counts, the epochs covered), or under another directory
when the dataset is read-only. :func:`get_hotness` loads a saved array when
its parameters match and computes and saves it otherwise.

>>> import numpy as np
>>> indptr, indices = np.array([0, 1, 2, 3]), np.array([1, 2, 0])   # a 3-cycle
>>> degree_from_csr(indptr, indices).tolist()
[1, 1, 1]
>>> np.round(pagerank_from_csr(indptr, indices), 4).tolist()
[0.3333, 0.3333, 0.3333]
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from momentbase.jsontypes import JsonObject
from planner.progress import Progress
from training.data import Dataset
from training.errors import TrainingError
from training.hotness_methods import HOTNESS_METHODS

#: edges per block for the degree count and the PageRank iteration; the
#: cached PageRank blocks of a graph up to this size take about 12 bytes per edge
CHUNK_EDGES = 1 << 24

SCHEMA = "moment.hotness"
VERSION = 1


class HotnessError(TrainingError):
    """A hotness that cannot be computed, saved or loaded (the message names the input and the fix)."""


@dataclass(frozen=True)
class HotnessSpec:
    """Which hotness to compute, with what parameters.

    ``fanouts``, ``batch_size``, ``epochs`` or ``num_batches`` (when given,
    it wins over ``epochs``) and ``seed`` (sampler and shuffling) matter for
    ``presample`` only; ``damping``, ``tol`` (L1 change between iterations)
    and ``max_iter`` for ``pagerank`` only.

    >>> HotnessSpec("degree").params()
    {'method': 'degree'}
    >>> HotnessSpec("presample", fanouts=(10, 5), batch_size=64).params()["fanouts"]
    [10, 5]
    """

    method: str = "presample"
    fanouts: tuple[int, ...] = (25, 10)
    batch_size: int = 8000
    epochs: float = 1.0
    num_batches: int | None = None
    seed: int = 0
    damping: float = 0.85
    tol: float = 1e-10
    max_iter: int = 200

    def __post_init__(self) -> None:
        if self.method not in HOTNESS_METHODS:
            raise HotnessError(f"hotness method {self.method!r}: expected one of {', '.join(HOTNESS_METHODS)}")
        object.__setattr__(self, "fanouts", tuple(int(f) for f in self.fanouts))
        params = HOTNESS_METHODS.caps(self.method).get("params", ())  # a field is checked where it matters
        if "batch_size" in params:
            if self.batch_size < 1:
                raise HotnessError(f"batch size {self.batch_size}: expected a positive number of vertices")
            if self.num_batches is None and not (self.epochs > 0 and math.isfinite(self.epochs)):
                raise HotnessError(f"pre-sampling epochs {self.epochs}: expected a positive number")
            if self.num_batches is not None and self.num_batches < 1:
                raise HotnessError(f"pre-sampling batches {self.num_batches}: expected at least 1")
        if "damping" in params and not 0 < self.damping < 1:
            raise HotnessError(f"PageRank damping {self.damping}: expected a number in (0, 1)")

    def params(self) -> JsonObject:
        """The parameters that determine the result (what a saved hotness must match): the method's
        ``params`` (:data:`~training.hotness_methods.HOTNESS_METHODS`), tuples as lists."""
        out: JsonObject = {"method": self.method}
        for name in HOTNESS_METHODS.caps(self.method).get("params", ()):
            value = getattr(self, name)
            out[name] = list(value) if isinstance(value, tuple) else value
        if "epochs" in out and self.num_batches is not None:
            out["epochs"] = None  # num_batches wins over epochs: the epochs asked for do not matter
        return out


@dataclass(frozen=True)
class Hotness:
    """A hotness array and how it was made.

    ``values``: ``[num_nodes]`` (int64 for ``presample`` and ``degree``,
    float64 for ``pagerank``). ``epochs_covered``: for ``presample``, the
    number of epochs the counted batches amount to (``values /
    epochs_covered`` = expected reads per vertex per epoch); ``None`` for the
    other methods, whose values are not read counts. ``path``: the ``.npy`` it
    was saved to or loaded from (``None`` if unsaved); ``loaded``: whether it
    came from disk; ``seconds``: the time to compute it (0 when loaded).
    """

    values: np.ndarray = field(repr=False)
    spec: HotnessSpec
    epochs_covered: float | None = None
    path: Path | None = None
    loaded: bool = False
    seconds: float = 0.0

    @property
    def reads_per_epoch(self) -> np.ndarray | None:
        """Expected reads of each vertex per epoch (float64), or ``None`` if the values are not counts."""
        if self.epochs_covered is None or self.epochs_covered <= 0:
            return None
        return self.values / self.epochs_covered


# --- the measures ------------------------------------------------------------------------


def _edge_blocks(indptr: np.ndarray, chunk_edges: int) -> list[tuple[int, int]]:
    """Row ranges ``(r0, r1)`` of about ``chunk_edges`` edges each (a row is never split)."""
    n = indptr.shape[0] - 1
    out, r0 = [], 0
    while r0 < n:
        want = int(indptr[r0]) + chunk_edges
        r1 = int(np.searchsorted(indptr, want, side="right")) - 1
        r1 = min(n, max(r1, r0 + 1))
        out.append((r0, r1))
        r0 = r1
    return out


def degree_from_csr(indptr: np.ndarray, indices: np.ndarray, *, chunk_edges: int = CHUNK_EDGES) -> np.ndarray:
    """How many CSR rows list each vertex (int64 ``[num_nodes]``), counted in slices of at least
    ``chunk_edges`` (and ``num_nodes / 4``: see :func:`training.data.count_ids`)."""
    from training.data import count_ids

    return count_ids(lambda a, b: indices[a:b], int(indices.shape[0]), indptr.shape[0] - 1, chunk=chunk_edges)


def pagerank_from_csr(indptr: np.ndarray, indices: np.ndarray, *, damping: float = 0.85, tol: float = 1e-10,
                      max_iter: int = 200, chunk_edges: int = CHUNK_EDGES,
                      progress: Progress | None = None) -> np.ndarray:
    """Reverse PageRank (float64 ``[num_nodes]``, sums to 1): the walk goes from ``v`` to its CSR row.

    ``x ← (1 - d)/N + d · (Aᵀ x + dangling mass / N)`` with ``A[v, u] = 1 /
    len(row v)`` for ``u`` in row ``v``, until the L1 change is below ``tol``
    or ``max_iter`` iterations. Raises :class:`HotnessError` if it has not
    converged by then.
    """
    from scipy import sparse

    n = indptr.shape[0] - 1
    if n == 0:
        return np.zeros(0)
    deg = np.diff(np.asarray(indptr)).astype(np.float64)
    inv = np.divide(1.0, deg, out=np.zeros(n), where=deg > 0)
    dangling = deg == 0
    blocks = _edge_blocks(np.asarray(indptr), chunk_edges)
    cache = indices.shape[0] <= chunk_edges * 4

    def block(r0: int, r1: int):
        e0, e1 = int(indptr[r0]), int(indptr[r1])
        ptr = np.asarray(indptr[r0 : r1 + 1]) - e0
        idx = np.asarray(indices[e0:e1])
        # Aᵀ of the block as CSC = the block's CSR read column-wise; ones, weighted by x/deg below
        return sparse.csr_matrix((np.ones(e1 - e0), idx, ptr), shape=(r1 - r0, n)).T.tocsr()

    mats = [block(r0, r1) for r0, r1 in blocks] if cache else None
    x = np.full(n, 1.0 / n)
    for it in range(max_iter):
        w = x * inv
        y = np.zeros(n)
        for b, (r0, r1) in enumerate(blocks):
            y += (mats[b] if mats is not None else block(r0, r1)) @ w[r0:r1]
        y *= damping
        y += (damping * float(x[dangling].sum()) + 1.0 - damping) / n
        err = float(np.abs(y - x).sum())
        x = y
        if progress is not None:
            progress("pagerank", it + 1, max_iter)
        if err < tol:
            return x
    raise HotnessError(f"PageRank did not converge to L1 change {tol:g} in {max_iter} iterations "
                       f"(last change {err:.3g}); raise max_iter or tol")


def presample_counts(ds: Dataset, spec: HotnessSpec, *, progress: Progress | None = None
                     ) -> tuple[np.ndarray, float]:
    """Access counts by pre-sampling (int64 ``[num_nodes]``) and the epochs they cover.

    Uses the dataset's training vertices (``train_idx``); raises
    :class:`HotnessError` if it has none. An edge-split dataset (:mod:`training.link.store`) is
    pre-sampled as link prediction reads it instead: batches of ``batch_size`` training pairs with as
    many uniform negatives, both endpoints' neighbourhoods in one subgraph
    (:func:`training.link.sampler.link_presample_counts`).
    """
    import torch

    from training.link.store import is_link_dataset
    from training.sampler import NeighborSampler, count_accesses

    if is_link_dataset(ds):
        return _link_presample(ds, spec, progress)
    if ds.train_idx is None or ds.train_idx.shape[0] == 0:
        raise HotnessError(f"{ds.path}: no training vertices (train_idx.npy) to pre-sample from; "
                           "give the dataset a split, or use `method` degree or pagerank")
    sampler = NeighborSampler(ds.indptr, ds.indices, fanouts=spec.fanouts, seed=spec.seed)
    per_epoch = math.ceil(ds.train_idx.shape[0] / spec.batch_size)
    cb = None if progress is None else (lambda done, total: progress("presample", done, total))
    counts = count_accesses(sampler, np.asarray(ds.train_idx), spec.batch_size, num_batches=spec.num_batches,
                            epochs=spec.epochs, shuffle_seed=spec.seed, progress=cb)
    batches = spec.num_batches if spec.num_batches is not None else math.ceil(per_epoch * spec.epochs)
    out = counts.numpy() if isinstance(counts, torch.Tensor) else np.asarray(counts)
    return out.astype(np.int64, copy=False), batches / per_epoch


def _link_presample(ds: Dataset, spec: HotnessSpec, progress: Progress | None) -> tuple[np.ndarray, float]:
    """:func:`presample_counts` of an edge-split dataset: link-level batches (training pairs and negatives)."""
    from training.link.edgeset import EdgeSet
    from training.link.negatives import NegativeSampler
    from training.link.sampler import link_presample_counts
    from training.link.store import open_link_data
    from training.sampler import NeighborSampler

    pairs = open_link_data(ds).train_pos
    if pairs.shape[1] == 0:
        raise HotnessError(f"{ds.path}: no training edges to pre-sample from; split the edges again")
    sampler = NeighborSampler(ds.indptr, ds.indices, fanouts=spec.fanouts, seed=spec.seed)
    negatives = NegativeSampler(EdgeSet.from_csr(ds.indptr, ds.indices, ds.num_nodes))
    rng = np.random.default_rng(spec.seed)
    cb = None if progress is None else (lambda done, total: progress("presample", done, total))
    counts, batches = link_presample_counts(sampler, pairs, spec.batch_size, epochs=spec.epochs,
                                            num_batches=spec.num_batches, shuffle_seed=spec.seed,
                                            negatives=lambda b: negatives.sample(b.shape[1], rng), progress=cb)
    return counts.astype(np.int64, copy=False), batches / math.ceil(pairs.shape[1] / spec.batch_size)


def compute_hotness(ds: Dataset, spec: HotnessSpec, *, progress: Progress | None = None) -> Hotness:
    """Compute ``spec``'s hotness of ``ds`` (not saved; see :func:`get_hotness`)."""
    t = time.perf_counter()
    values, epochs = HOTNESS_METHODS.get(spec.method)(ds, spec, progress=progress)
    return Hotness(values, spec, epochs, seconds=time.perf_counter() - t)


def degree_hotness(ds: Dataset, spec: HotnessSpec, *, progress: Progress | None = None) -> tuple[np.ndarray, None]:
    """The ``degree`` method: :func:`degree_from_csr` of the dataset's graph (not a read count)."""
    return degree_from_csr(ds.indptr, ds.indices), None


def pagerank_hotness(ds: Dataset, spec: HotnessSpec, *, progress: Progress | None = None
                     ) -> tuple[np.ndarray, None]:
    """The ``pagerank`` method: :func:`pagerank_from_csr` with ``spec``'s damping, tolerance and iterations."""
    return pagerank_from_csr(ds.indptr, ds.indices, damping=spec.damping, tol=spec.tol, max_iter=spec.max_iter,
                             progress=progress), None


# --- saved with the dataset -------------------------------------------------------------


def hotness_dir(ds: Dataset, directory: str | os.PathLike[str] | None = None) -> Path:
    """Where hotness files go: ``directory`` if given, else ``<dataset>/hotness``."""
    return Path(directory) if directory is not None else ds.path / "hotness"


def _identity(ds: Dataset) -> JsonObject:
    return {"dataset": str(ds.name), "num_nodes": ds.num_nodes, "num_edges": ds.num_edges}


def load_hotness(ds: Dataset, spec: HotnessSpec, directory: str | os.PathLike[str] | None = None
                 ) -> Hotness | None:
    """The saved hotness of ``spec`` for ``ds``, or ``None`` if there is none or it was made differently."""
    d = hotness_dir(ds, directory)
    npy, meta_path = d / f"{spec.method}.npy", d / f"{spec.method}.json"
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("schema") != SCHEMA or meta.get("params") != spec.params():
        return None
    if any(meta.get(k) != v for k, v in _identity(ds).items()):
        return None
    try:
        values = np.load(npy, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError):
        return None
    if values.shape != (ds.num_nodes,) or str(values.dtype) != meta.get("dtype"):
        return None
    return Hotness(np.asarray(values), spec, meta.get("epochs_covered"), npy, loaded=True)


def save_hotness(ds: Dataset, hot: Hotness, directory: str | os.PathLike[str] | None = None) -> Hotness:
    """Write ``hot`` as ``<dir>/<method>.npy`` + ``.json``; returns it with ``path`` set.

    The old ``.json`` goes first and the new one last, each file through a
    temporary name and ``os.replace``: a crash leaves either the old pair, or
    an array without its ``.json`` (ignored by :func:`load_hotness`), never a
    mismatched pair. Raises :class:`HotnessError` when the directory cannot
    be written (a read-only dataset: give another directory).
    """
    d = hotness_dir(ds, directory)
    method = hot.spec.method
    npy, meta_path = d / f"{method}.npy", d / f"{method}.json"
    meta = {"schema": SCHEMA, "version": VERSION, **_identity(ds), "params": hot.spec.params(),
            "dtype": str(hot.values.dtype), "epochs_covered": hot.epochs_covered,
            "seconds": round(hot.seconds, 3), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    try:
        d.mkdir(parents=True, exist_ok=True)
        meta_path.unlink(missing_ok=True)
        tmp = d / f".{method}.npy.tmp"
        with open(tmp, "wb") as f:
            np.save(f, np.ascontiguousarray(hot.values))
        os.replace(tmp, npy)
        tmp = d / f".{method}.json.tmp"
        tmp.write_text(json.dumps(meta, indent=1) + "\n")
        os.replace(tmp, meta_path)
    except OSError as exc:
        fix = ("pass `hotness_dir=DIR` (a writable directory) to keep it elsewhere" if directory is None
               else "choose a writable `hotness_dir`")
        raise HotnessError(f"{d}: cannot save the hotness ({exc.strerror or exc}); {fix}") from None
    return Hotness(hot.values, hot.spec, hot.epochs_covered, npy, loaded=False, seconds=hot.seconds)


def get_hotness(ds: Dataset, spec: HotnessSpec, *, directory: str | os.PathLike[str] | None = None,
                recompute: bool = False, save: bool = True, progress: Progress | None = None) -> Hotness:
    """The saved hotness if it matches ``spec``, else computed now (and saved unless ``save=False``)."""
    if not recompute:
        hot = load_hotness(ds, spec, directory)
        if hot is not None:
            return hot
    hot = compute_hotness(ds, spec, progress=progress)
    return save_hotness(ds, hot, directory) if save else hot


def hot_share(values: np.ndarray, sizes: Sequence[int]) -> list[float]:
    """Share of all hotness held by consecutive groups of the hottest vertices.

    ``sizes`` are group sizes in vertices, hottest first: ``[g, c]`` gives the
    share of the ``g`` hottest vertices, then of the next ``c`` (what a GPU
    cache of ``g`` rows and a host cache of ``c`` rows can serve at best).

    >>> hot_share(np.array([1, 5, 3, 1]), [1, 2])
    [0.5, 0.4]
    """
    v = np.asarray(values, dtype=np.float64)
    total = float(v.sum())
    n = v.shape[0]
    k = min(n, int(sum(sizes)))
    if total <= 0 or k == 0:
        return [0.0] * len(sizes)
    top = -np.sort(-np.partition(v, n - k)[n - k:]) if k < n else -np.sort(-v)
    out, start = [], 0
    for s in sizes:
        out.append(float(top[start:start + int(s)].sum()) / total)
        start += int(s)
    return out


__all__ = [
    "Hotness",
    "HotnessError",
    "HotnessSpec",
    "compute_hotness",
    "degree_from_csr",
    "degree_hotness",
    "get_hotness",
    "hot_share",
    "hotness_dir",
    "load_hotness",
    "pagerank_from_csr",
    "pagerank_hotness",
    "presample_counts",
    "save_hotness",
]
