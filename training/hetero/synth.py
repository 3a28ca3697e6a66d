"""A small synthetic heterogeneous graph shaped like ogbn-mag, with labels a model can learn.

Four node types: ``paper`` (labelled, float32 features), ``author`` (float16 features, narrower),
``institution`` (uint8 features), ``field_of_study`` (no features, as in MAG). Relations as in
ogbn-mag: ``author writes paper``, ``paper cites paper``, ``paper has_topic field_of_study``,
``author affiliated_with institution``. Each paper's class decides its topics (mostly fields
of its own class) and its citations (mostly papers of its own class), and its features are a
noisy class centroid, so neighbours of both types carry the label.
"""

from __future__ import annotations

import numpy as np

from training.hetero.graph import HeteroGraph
from training.hetero.schema import EdgeType
from training.hetero.store import FeatureBlocks
from training.hetero.stream import EdgeChunks, HeteroSource, add_reverse_chunks


def _within_class(rng: np.random.Generator, cls_of_src: np.ndarray, pool_cls: np.ndarray, homophily: float
                  ) -> np.ndarray:
    """For each source a target from ``pool`` of the same class with prob. ``homophily``, else uniform."""
    n_pool = len(pool_cls)
    out = rng.integers(0, n_pool, len(cls_of_src))
    by_cls = np.argsort(pool_cls, kind="stable")
    starts = np.searchsorted(pool_cls[by_cls], np.arange(pool_cls.max() + 2))
    same = rng.random(len(cls_of_src)) < homophily
    c = cls_of_src[same]
    size = starts[c + 1] - starts[c]
    ok = size > 0
    pick = starts[c[ok]] + (rng.random(int(ok.sum())) * size[ok]).astype(np.int64)
    idx = np.flatnonzero(same)[ok]
    out[idx] = by_cls[pick]
    return out


def synth_mag(*, papers: int = 400, authors: int = 200, institutions: int = 20, fields: int = 30,
              num_classes: int = 4, seed: int = 0, homophily: float = 0.8) -> HeteroGraph:
    """The synthetic MAG-like graph (local ids per type); splits 60/20/20 of the papers.

    ``homophily``: the share of citations and topics drawn inside the paper's class.
    """
    rng = np.random.default_rng(seed)
    y = rng.integers(0, num_classes, papers)
    field_cls = np.arange(fields) % num_classes
    cites_src = rng.integers(0, papers, 4 * papers)
    cites = np.stack([cites_src, _within_class(rng, y[cites_src], y, homophily)])
    topic_paper = np.repeat(np.arange(papers), 2)
    topics = np.stack([topic_paper, _within_class(rng, y[topic_paper], field_cls, homophily)])
    writes = np.stack([rng.integers(0, authors, 3 * papers), np.repeat(np.arange(papers), 3)])
    affil = np.stack([np.arange(authors), rng.integers(0, institutions, authors)])
    centroids = rng.normal(size=(num_classes, 16)) * 1.5
    x_paper = (centroids[y] + rng.normal(size=(papers, 16))).astype(np.float32)
    x_author = rng.normal(size=(authors, 8)).astype(np.float16)
    x_inst = rng.integers(0, 256, (institutions, 4)).astype(np.uint8)
    perm = rng.permutation(papers)
    a, b = int(0.6 * papers), int(0.8 * papers)
    return HeteroGraph(
        num_nodes={"paper": papers, "author": authors, "institution": institutions, "field_of_study": fields},
        edges={("author", "writes", "paper"): writes, ("paper", "cites", "paper"): cites,
               ("paper", "has_topic", "field_of_study"): topics,
               ("author", "affiliated_with", "institution"): affil},
        features={"paper": x_paper, "author": x_author, "institution": x_inst},
        target="paper", labels=y.astype(np.int64), num_classes=num_classes,
        splits={"train_idx": np.sort(perm[:a]), "valid_idx": np.sort(perm[a:b]), "test_idx": np.sort(perm[b:])},
    )




#: edges per paper of :func:`synth_mag_stream` with reverse relations (cites 4, writes 3 + 3, has_topic 2 + 2,
#: affiliated_with 1 + 1 per author at one author per two papers)
EDGES_PER_PAPER = 15


def synth_mag_stream(*, papers: int, authors: int | None = None, institutions: int | None = None,
                     fields: int | None = None, num_classes: int = 4, seed: int = 0, homophily: float = 0.8,
                     block_nodes: int = 1 << 18, reverse: bool = True) -> HeteroSource:
    """:func:`synth_mag`'s shape at any size, as a :class:`~training.hetero.stream.HeteroSource` whose edges
    and features are drawn in blocks of ``block_nodes`` nodes (the same on every call, seeded per block).

    Every paper cites 4 papers (mostly of its class), is written by 3 authors and has 2 topics
    (mostly fields of its class); every author is affiliated with one institution. Defaults:
    ``papers / 2`` authors, ``papers / 100`` institutions, ``papers / 50`` fields. With
    ``reverse``, ``rev_<rel>`` relations for the relations between types (about
    :data:`EDGES_PER_PAPER` edges a paper). Memory: the labels and the class index of the
    papers and fields (16 bytes a paper) and one block.
    """
    authors = max(papers // 2, 1) if authors is None else authors
    institutions = max(papers // 100, 1) if institutions is None else institutions
    fields = max(papers // 50, 1) if fields is None else fields
    y = np.random.default_rng([seed, 0]).integers(0, num_classes, papers)
    field_cls = np.arange(fields) % num_classes
    pools = {"paper": _ClassPool(y), "field_of_study": _ClassPool(field_cls)}

    def blocks(count: int, rel: int, draw):
        def gen():
            for i, a in enumerate(range(0, count, block_nodes)):
                ids = np.arange(a, min(a + block_nodes, count))
                yield draw(np.random.default_rng([seed, rel, i]), ids)
        return gen

    def near(pool: str, k: int):
        def draw(rng, ids):
            d = np.repeat(ids, k)
            return pools[pool].draw(rng, y[d], homophily), d
        return draw

    def topic(rng, ids):
        s = np.repeat(ids, 2)
        return s, pools["field_of_study"].draw(rng, y[s], homophily)

    edges: dict[EdgeType, EdgeChunks] = {
        ("author", "writes", "paper"): blocks(papers, 1, lambda rng, ids: (rng.integers(0, authors, 3 * ids.size),
                                                                           np.repeat(ids, 3))),
        ("paper", "cites", "paper"): blocks(papers, 2, near("paper", 4)),
        ("paper", "has_topic", "field_of_study"): blocks(papers, 3, topic),
        ("author", "affiliated_with", "institution"): blocks(authors, 4, lambda rng, ids: (
            ids, rng.integers(0, institutions, ids.size))),
    }
    centroids = np.random.default_rng([seed, 5]).normal(size=(num_classes, 16)) * 1.5
    feats = {
        "paper": FeatureBlocks(16, "float32", blocks(papers, 6, lambda rng, ids: (
            centroids[y[ids]] + rng.normal(size=(ids.size, 16))).astype(np.float32))),
        "author": FeatureBlocks(8, "float16", blocks(authors, 7, lambda rng, ids: rng.normal(
            size=(ids.size, 8)).astype(np.float16))),
        "institution": FeatureBlocks(4, "uint8", blocks(institutions, 8, lambda rng, ids: rng.integers(
            0, 256, (ids.size, 4)).astype(np.uint8))),
    }
    perm = np.random.default_rng([seed, 9]).permutation(papers)
    a, b = int(0.6 * papers), int(0.8 * papers)
    return HeteroSource(
        {"paper": papers, "author": authors, "institution": institutions, "field_of_study": fields},
        add_reverse_chunks(edges) if reverse else edges, feats, "paper", y.astype(np.int64), num_classes,
        {"train_idx": np.sort(perm[:a]), "valid_idx": np.sort(perm[a:b]), "test_idx": np.sort(perm[b:])})


class _ClassPool:
    """Members of a pool sorted by class, to draw one of a given class in O(1)."""

    def __init__(self, cls: np.ndarray) -> None:
        self.n = len(cls)
        self.by_cls = np.argsort(cls, kind="stable")
        self.starts = np.searchsorted(cls[self.by_cls], np.arange(int(cls.max(initial=0)) + 2))

    def draw(self, rng: np.random.Generator, want: np.ndarray, homophily: float) -> np.ndarray:
        """One member per entry of ``want``: of class ``want[i]`` with probability ``homophily``, else uniform."""
        out = rng.integers(0, self.n, want.size)
        same = rng.random(want.size) < homophily
        c = want[same]
        lo, size = self.starts[c], self.starts[c + 1] - self.starts[c]
        ok = size > 0
        out[np.flatnonzero(same)[ok]] = self.by_cls[lo[ok] + (rng.random(int(ok.sum())) * size[ok]).astype(np.int64)]
        return out


__all__ = ["EDGES_PER_PAPER", "synth_mag", "synth_mag_stream"]
