"""Synthetic power-law graphs with learnable labels, streamed to a dataset directory.

The generative model (what ``moment data synth`` writes):

1. **Classes.** Every node ``v`` draws a latent class ``y[v]`` uniformly from
   ``num_classes``; ``y`` is the label array.
2. **Popularity.** Edges come from a skewed generator over *raw* ids
   ``0..N-1``, which a random permutation then relabels, so that a node's id
   says nothing about its degree (as in real datasets, and so that placement by
   ``id mod bins`` is not accidentally degree-aware):

   - ``rmat``: R-MAT (Chakrabarti et al., 2004). Each edge descends
     ``k = ceil(log2 N)`` levels of the adjacency matrix, choosing the quadrant
     top-left, top-right, bottom-left, bottom-right with probabilities
     ``a, b, c, d``. ``skew`` is ``a``; ``b = c`` and ``d`` share ``1 - a`` in
     Graph500's proportions 0.19 : 0.19 : 0.05, so the default ``skew=0.57`` is
     Graph500's ``(0.57, 0.19, 0.19, 0.05)``. The ``2**k`` cells fold onto ``N``
     nodes by ``raw = cell * N >> k`` (neighbouring cells merge; every node gets
     one or two cells). Six levels are drawn at once from an alias table of
     their 4096 joint outcomes (exact, and several times faster than a pass
     per level).
   - ``chung-lu``: Chung–Lu. Node ``i`` has weight ``w_i = (i + 1) ** -skew``;
     both endpoints of an edge are drawn with probability proportional to
     ``w``, so expected degrees are proportional to ``w`` and the degree
     distribution has a power-law tail of exponent ``1 + 1 / skew``
     (``skew=0.7`` gives about 2.4). ``skew=0`` is Erdős–Rényi.
3. **Homophily.** With probability ``homophily`` an edge's destination is
   redrawn from the source's class, with the generator's destination
   popularity restricted to that class (so hubs stay hubs). The share of edges
   inside a class is therefore about ``homophily + (1 - homophily) / C``;
   aggregating neighbours' features recovers the class.
4. **Features.** ``x[v] = centroid[y[v]] + noise``, noise standard normal per
   entry, centroids random directions of length ``feature_snr``. A nearest
   centroid rule on the features alone is right for part of the nodes only
   (about 55% at the defaults with 16 classes); the mean over a node's
   neighbours has far less noise and, with homophily, the same class.
5. **Splits.** A random permutation of the nodes gives the first
   ``train_share * N`` to training (1% by default, as in the paper), the
   next ``valid_share * N`` to validation and the next ``test_share * N`` to
   test; each index file is sorted.

Self-loops and duplicate edges are dropped when the CSR is written (the
dataset writer removes them), so fewer edges are stored than generated (6%
fewer for R-MAT with 10 edges per node on 10**7 nodes; far more on small dense
graphs); ``meta.json`` records both. With ``undirected`` every generated edge
is stored in both directions. R-MAT at Graph500's skew leaves about half the
nodes without any edge (popularity is a product over id bits); Chung–Lu does not.

Determinism: every random draw comes from a stream derived from ``seed``
with :class:`numpy.random.SeedSequence` spawn keys: ``(0,)`` for the model
(labels, relabelling, centroids), ``(1, b)`` for edge block ``b`` of
:data:`EDGE_BLOCK` edges, ``(2, r)`` for feature block ``r`` of
:data:`FEATURE_BLOCK_ROWS` rows, ``(3,)`` for the splits. The blocks are
fixed, so the chunk sizes used to stream the data to disk change memory use,
never the result: the same seed gives byte-identical files.

>>> spec = SynthSpec(num_nodes=1000, num_edges=5000, feature_dim=8, seed=1)
>>> model = build_model(spec)
>>> src, dst = next(iter_edge_chunks(spec, model))
>>> src.shape, int(src.max()) < 1000
((5000,), True)
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import numpy as np

from training.draws import RMAT_LEVELS_PER_DRAW, rmat_probabilities
from training.draws import guide as _guide
from training.draws import locate as _locate
from training.draws import rmat_destination_weights as _rmat_destination_weights
from training.draws import rmat_table as _rmat_table
from training.errors import TrainingError

#: edges per random stream; fixed so that results do not depend on chunk sizes
EDGE_BLOCK = 1 << 16
#: feature rows per random stream; fixed for the same reason
FEATURE_BLOCK_ROWS = 1 << 12
#: node ids must fit int32 indices and ``cell * N`` must fit int64
MAX_NODES = 2**31 - 1
GENERATORS = ("rmat", "chung-lu")
DEFAULT_SKEW = {"rmat": 0.57, "chung-lu": 0.7}

_STREAM_MODEL, _STREAM_EDGES, _STREAM_FEATURES, _STREAM_SPLITS = 0, 1, 2, 3


class SynthError(TrainingError):
    """A synthetic-graph option that cannot be honoured (the message names the option)."""


@dataclass(frozen=True)
class SynthSpec:
    """What to generate. Counts are nodes and edges; shares are fractions of the nodes.

    ``num_edges`` counts generated edges (before self-loops and duplicates are
    dropped); with ``undirected`` each is stored twice, once per direction.
    ``skew=None`` takes the generator's default (:data:`DEFAULT_SKEW`).

    >>> SynthSpec(num_nodes=100, num_edges=400).resolved_skew
    0.57
    """

    num_nodes: int
    num_edges: int
    generator: str = "rmat"
    skew: float | None = None
    feature_dim: int = 128
    feature_dtype: str = "float32"
    num_classes: int = 16
    homophily: float = 0.7
    feature_snr: float = 2.0
    train_share: float = 0.01
    valid_share: float = 0.01
    test_share: float = 0.02
    undirected: bool = False
    seed: int = 0

    @property
    def resolved_skew(self) -> float:
        return DEFAULT_SKEW.get(self.generator, 0.0) if self.skew is None else float(self.skew)

    def validate(self) -> SynthSpec:
        """Raise :class:`SynthError` naming the first bad field; return ``self``."""
        n, m = self.num_nodes, self.num_edges
        if self.generator not in GENERATORS:
            raise SynthError(f"`generator` {self.generator!r}: expected one of {', '.join(GENERATORS)}")
        if not 2 <= n <= MAX_NODES:
            raise SynthError(f"`num_nodes` {n}: expected a whole number from 2 to {MAX_NODES}")
        if m < 1:
            raise SynthError(f"`num_edges` {m}: expected a positive whole number")
        possible = n * (n - 1) // (2 if self.undirected else 1)
        if m > possible:
            kind = "undirected" if self.undirected else "directed"
            raise SynthError(
                f"`num_edges` {m}: a graph of {n} nodes has at most {possible} {kind} edges "
                "without self-loops; ask for fewer edges or more nodes"
            )
        s = self.resolved_skew
        if self.generator == "rmat" and not 0.25 <= s < 1:
            raise SynthError(f"`skew` {s}: R-MAT's a must be in [0.25, 1) (0.57 is Graph500's)")
        if self.generator == "chung-lu" and not 0 <= s <= 2:
            raise SynthError(f"`skew` {s}: the Chung-Lu weight exponent must be in [0, 2]")
        if self.feature_dim < 0:
            raise SynthError(f"`feature_dim` {self.feature_dim}: expected 0 or more")
        if self.feature_dtype not in ("float32", "float16"):
            raise SynthError(f"`feature_dtype` {self.feature_dtype!r}: expected float32 or float16")
        if self.num_classes < 1:
            raise SynthError(f"`num_classes` {self.num_classes}: expected 1 or more")
        if not 0 <= self.homophily <= 1:
            raise SynthError(f"`homophily` {self.homophily}: expected a share in [0, 1]")
        if not (math.isfinite(self.feature_snr) and self.feature_snr >= 0):
            raise SynthError(f"`feature_snr` {self.feature_snr}: expected 0 or more")
        shares = {"train": self.train_share, "valid": self.valid_share, "test": self.test_share}
        for name, share in shares.items():
            if not 0 <= share <= 1:
                raise SynthError(f"`{name}_share` {share}: expected a share in [0, 1]")
        if sum(shares.values()) > 1 + 1e-12:
            raise SynthError(
                f"`train_share` + `valid_share` + `test_share` = {sum(shares.values()):g}: "
                "the splits cannot cover more than all nodes"
            )
        if self.seed < 0:
            raise SynthError(f"`seed` {self.seed}: expected 0 or more")
        return self


def _rng(seed: int, *key: int) -> np.random.Generator:
    # SeedSequence(seed, spawn_key=key) is exactly the child that
    # SeedSequence(seed).spawn(...) hands out at that position, reached in O(1)
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=key)))


@dataclass(frozen=True, eq=False)
class SynthModel:
    """The per-node state shared by every chunk (all arrays have ``num_nodes`` rows).

    ``relabel[raw]`` is a node's final id; ``labels[v]`` its class;
    ``class_order`` the nodes sorted by class and ``class_cumweight`` the running
    sum of their destination popularity, with ``class_bounds[c]:class_bounds[c+1]``
    the slice of class ``c`` (what a homophilous edge draws from);
    ``raw_cumweight`` the Chung–Lu running weights over raw ids (``None`` for
    R-MAT), each with a guide table for fast lookups; ``centroids`` is
    ``(num_classes, feature_dim)`` float32.
    """

    spec: SynthSpec
    relabel: np.ndarray
    labels: np.ndarray
    class_order: np.ndarray
    class_cumweight: np.ndarray
    class_bounds: np.ndarray
    raw_cumweight: np.ndarray | None
    centroids: np.ndarray
    class_guide: np.ndarray
    raw_guide: np.ndarray | None

    @property
    def nbytes(self) -> int:
        arrays = (self.relabel, self.labels, self.class_order, self.class_cumweight,
                  self.raw_cumweight, self.centroids, self.class_guide, self.raw_guide)
        return sum(a.nbytes for a in arrays if a is not None)


#: R-MAT levels resolved by one uniform draw (4**6 = 4096 joint outcomes, an alias table
#: that stays in cache)
def build_model(spec: SynthSpec) -> SynthModel:
    """Labels, relabelling, class-restricted popularity and centroids for ``spec``.

    Memory: about 28 bytes per node for R-MAT and 40 for Chung–Lu, plus about as much again
    in temporaries while building (the edges are not held).
    """
    spec.validate()
    n, classes = spec.num_nodes, spec.num_classes
    rng = _rng(spec.seed, _STREAM_MODEL)
    # int16 when the classes fit (the values, and so every draw, are the same as int64's):
    # 2 bytes a node instead of 8, which is 0.7 GB less at papers100M's 111 M nodes
    labels = rng.integers(0, classes, size=n, dtype=np.int64)
    if classes <= np.iinfo(np.int16).max:
        labels = labels.astype(np.int16)
    index_dtype = np.int32 if n <= np.iinfo(np.int32).max else np.int64
    relabel = rng.permutation(n).astype(index_dtype)
    direction = rng.standard_normal((classes, spec.feature_dim))
    norms = np.linalg.norm(direction, axis=1, keepdims=True)
    centroids = (spec.feature_snr * direction / np.where(norms > 0, norms, 1.0)).astype(np.float32)

    skew = spec.resolved_skew
    if spec.generator == "rmat":
        raw_weight = _rmat_destination_weights(n, rmat_probabilities(skew))
        raw_cumweight = None
    else:
        raw_weight = np.arange(1, n + 1, dtype=np.float64) ** -skew
        raw_cumweight = np.cumsum(raw_weight)
    # popularity by final id: node relabel[raw] has raw's weight
    weight = np.empty(n, dtype=np.float64)
    weight[relabel] = raw_weight
    del raw_weight
    class_order = np.argsort(labels, kind="stable").astype(index_dtype)
    class_cumweight = np.cumsum(weight[class_order])
    del weight
    class_bounds = np.searchsorted(labels[class_order], np.arange(classes + 1)).astype(np.int64)
    return SynthModel(spec, relabel, labels, class_order, class_cumweight, class_bounds,
                      raw_cumweight, centroids, _guide(class_cumweight),
                      None if raw_cumweight is None else _guide(raw_cumweight))


def _block_edges(spec: SynthSpec, model: SynthModel, block: int) -> tuple[np.ndarray, ...]:
    """The random draws of edge block ``block``: raw endpoints (R-MAT) or positions on the
    cumulative weight line (Chung–Lu), homophily coin, target."""
    n = spec.num_nodes
    count = min(EDGE_BLOCK, spec.num_edges - block * EDGE_BLOCK)
    rng = _rng(spec.seed, _STREAM_EDGES, block)
    if spec.generator == "rmat":
        k = max(1, math.ceil(math.log2(n)))
        src = np.zeros(count, dtype=np.int64)
        dst = np.zeros(count, dtype=np.int64)
        # descend RMAT_LEVELS_PER_DRAW levels per uniform draw: one alias-table lookup of
        # their joint outcome replaces that many passes of comparisons over the edges
        for at in range(0, k, RMAT_LEVELS_PER_DRAW):
            g = min(RMAT_LEVELS_PER_DRAW, k - at)
            keep, alias, src_bits, dst_bits = _rmat_table(spec.resolved_skew, g)
            x = rng.random(count) * keep.size
            slot = x.astype(np.intp)
            pick = np.where(x - slot < keep[slot], slot, alias[slot])
            src <<= g
            dst <<= g
            src |= src_bits[pick]
            dst |= dst_bits[pick]
        src = (src * n) >> k
        dst = (dst * n) >> k
    else:
        # positions on the cumulative weight line; iter_edge_chunks resolves them to
        # nodes for a whole chunk at once (the guided lookup is cheaper in bulk)
        src, dst = rng.random((2, count)) * model.raw_cumweight[-1]
    coin = rng.random(count)
    target = rng.random(count)
    return src, dst, coin, target


def _homophilous(model: SynthModel, src: np.ndarray, target: np.ndarray) -> np.ndarray:
    """A destination in ``src``'s class for each edge, drawn by popularity within the class."""
    cls = model.labels[src]
    lo_idx, hi_idx = model.class_bounds[cls], model.class_bounds[cls + 1]
    cum = model.class_cumweight
    lo = np.where(lo_idx > 0, cum[np.maximum(lo_idx - 1, 0)], 0.0)
    hi = cum[hi_idx - 1]
    pos = _locate(cum, model.class_guide, lo + target * (hi - lo))
    # rounding can step one past either end of the class's slice
    np.clip(pos, lo_idx, hi_idx - 1, out=pos)
    return model.class_order[pos].astype(np.int64)


def iter_edge_chunks(
    spec: SynthSpec, model: SynthModel | None = None, *, chunk_edges: int = 1 << 22, first_block: int = 0,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield the generated edges as ``(src, dst)`` int64 arrays of at most ``chunk_edges`` edges
    (rounded up to whole :data:`EDGE_BLOCK` blocks), final ids, before dropping self-loops and
    duplicates and before mirroring undirected edges. The concatenation does not depend on
    ``chunk_edges``. ``first_block`` starts at edge block ``first_block`` (of
    :data:`EDGE_BLOCK` edges): a resumed run skips what it has.

    >>> spec = SynthSpec(num_nodes=50, num_edges=200, generator="chung-lu", seed=3)
    >>> sum(len(s) for s, _ in iter_edge_chunks(spec, chunk_edges=64))
    200
    """
    model = build_model(spec) if model is None else model
    blocks = -(-spec.num_edges // EDGE_BLOCK)
    per_chunk = max(1, -(-chunk_edges // EDGE_BLOCK))
    for first in range(first_block, blocks, per_chunk):
        parts = [_block_edges(spec, model, b) for b in range(first, min(first + per_chunk, blocks))]
        src, dst, coin, target = (np.concatenate(x) if len(parts) > 1 else x[0] for x in zip(*parts, strict=True))
        del parts
        if spec.generator == "chung-lu":
            src, dst = _locate(model.raw_cumweight, model.raw_guide, np.concatenate([src, dst])).reshape(2, -1)
        src = model.relabel[src].astype(np.int64)
        dst = model.relabel[dst].astype(np.int64)
        rewire = coin < spec.homophily
        if rewire.any():
            dst[rewire] = _homophilous(model, src[rewire], target[rewire])
        yield src, dst


def feature_rows(spec: SynthSpec, model: SynthModel, start: int, stop: int) -> np.ndarray:
    """Feature rows ``start:stop``, shape ``(stop - start, feature_dim)``, in ``spec.feature_dtype``.

    Rows are drawn per :data:`FEATURE_BLOCK_ROWS` block, so any ``start`` and
    ``stop`` give the same values as the whole matrix sliced.

    >>> spec = SynthSpec(num_nodes=10_000, num_edges=10, feature_dim=4)
    >>> m = build_model(spec)
    >>> bool((feature_rows(spec, m, 4000, 4200) == feature_rows(spec, m, 0, 10_000)[4000:4200]).all())
    True
    """
    f = spec.feature_dim
    out = np.empty((stop - start, f), dtype=spec.feature_dtype)
    first_block, last_block = start // FEATURE_BLOCK_ROWS, -(-stop // FEATURE_BLOCK_ROWS)
    for blk in range(first_block, last_block):
        b_lo = blk * FEATURE_BLOCK_ROWS
        b_hi = min(b_lo + FEATURE_BLOCK_ROWS, spec.num_nodes)
        noise = _rng(spec.seed, _STREAM_FEATURES, blk).standard_normal((b_hi - b_lo, f), dtype=np.float32)
        lo, hi = max(start, b_lo), min(stop, b_hi)
        rows = noise[lo - b_lo:hi - b_lo]
        rows += model.centroids[model.labels[lo:hi]]
        out[lo - start:hi - start] = rows
    return out


def split_indices(spec: SynthSpec) -> dict[str, np.ndarray]:
    """Sorted int64 node ids of ``train``, ``valid`` and ``test`` (disjoint).

    >>> s = split_indices(SynthSpec(num_nodes=1000, num_edges=10))
    >>> [len(s[k]) for k in ("train", "valid", "test")]
    [10, 10, 20]
    """
    n = spec.num_nodes
    order = _rng(spec.seed, _STREAM_SPLITS).permutation(n)
    out, at = {}, 0
    for name, share in (("train", spec.train_share), ("valid", spec.valid_share),
                        ("test", spec.test_share)):
        count = min(n - at, round(share * n))
        if share > 0 and count == 0 and at < n:
            count = 1  # a tiny graph still gets one node of each split asked for
        out[name] = np.sort(order[at:at + count]).astype(np.int64)
        at += count
    return out


def source_block(spec: SynthSpec) -> dict:
    """The ``meta.json`` ``source`` entry describing the generator, parameters and seed."""
    params = asdict(spec)
    params["skew"] = spec.resolved_skew
    block = {"kind": "synthetic", "generator": spec.generator, "parameters": params,
             "seed": spec.seed, "edge_block": EDGE_BLOCK, "feature_block_rows": FEATURE_BLOCK_ROWS,
             "model": "latent classes; features = class centroid + N(0, 1) noise; "
                      "homophilous destinations redrawn within the source's class"}
    if spec.generator == "rmat":
        block["rmat_abcd"] = [round(p, 6) for p in rmat_probabilities(spec.resolved_skew)]
    else:
        block["chung_lu_weight_exponent"] = spec.resolved_skew
        block["degree_tail_exponent"] = (1 + 1 / spec.resolved_skew) if spec.resolved_skew else None
    return block



@dataclass(frozen=True)
class SynthReport:
    """What :func:`training.synth_run.synthesize` wrote: counts and the degree skew of the stored graph.

    ``generated_edges`` counts draws (doubled when undirected); ``num_edges`` the
    CSR entries kept after dropping self-loops and duplicates. ``top1pct_in_share``
    is the share of CSR entries in the rows of the 1% of nodes with the most
    in-neighbours; ``top1pct_out_share`` the share of ``indices`` entries naming the
    1% most-named nodes (how often a node's feature row is read: its hotness);
    ``isolated_nodes`` have no edge either way (R-MAT at high skew leaves many).
    """

    path: str
    num_nodes: int
    num_edges: int
    generated_edges: int
    max_in_degree: int
    max_out_degree: int
    top1pct_in_share: float
    top1pct_out_share: float
    isolated_nodes: int
    model_bytes: int
    #: the most edges one bucket of the CSR build held (what sets that phase's memory)
    largest_bucket_edges: int = 0
