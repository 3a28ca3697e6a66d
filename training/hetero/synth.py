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


__all__ = ["synth_mag"]
