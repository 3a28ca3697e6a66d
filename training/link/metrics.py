"""Link-prediction metrics: ROC AUC, and Hits@K and MRR as OGB's ``linkproppred.Evaluator`` computes them.

Scores are higher-is-more-likely floats. OGB's (ogb/linkproppred/evaluate.py):

- **Hits@K** (``_eval_hits``): the share of positives scored strictly above the ``K``-th highest
  negative score; 1.0 when there are fewer than ``K`` negatives.
- **MRR** (``_eval_mrr``): each positive ``i`` is ranked among its negatives ``neg[i]``: rank =
  1 + (optimistic + pessimistic) / 2, where optimistic counts negatives strictly above it and
  pessimistic those at or above it (ties count half); MRR is the mean of 1 / rank. Given a 1-D
  ``neg``, every positive is ranked against the same negatives (our splits store one pool per
  split); ranks come from binary searches in the sorted pool instead of OGB's
  ``[num_pos, num_neg]`` comparison, the same numbers without its memory.
- **AUC**: the Mann-Whitney statistic over ranks with ties averaged (``scipy.stats.rankdata``),
  what ``sklearn.metrics.roc_auc_score`` returns for binary labels.

>>> import numpy as np
>>> pos, neg = np.array([0.9, 0.4]), np.array([0.5, 0.1, 0.3])
>>> round(auc(pos, neg), 4), hits_at_k(pos, neg, 1), mrr(pos, neg)
(0.8333, 0.5, 0.75)
"""

from __future__ import annotations

import numpy as np
from scipy.stats import rankdata

__all__ = ["auc", "hits_at_k", "link_metrics", "mrr"]


def auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """ROC AUC of positives ``pos`` against negatives ``neg`` (1-D score arrays; ``nan`` if either is empty)."""
    pos, neg = np.asarray(pos, np.float64).ravel(), np.asarray(neg, np.float64).ravel()
    if pos.size == 0 or neg.size == 0:
        return float("nan")
    ranks = rankdata(np.concatenate([pos, neg]))
    u = ranks[: pos.size].sum() - pos.size * (pos.size + 1) / 2.0
    return float(u / (pos.size * neg.size))


def hits_at_k(pos: np.ndarray, neg: np.ndarray, k: int) -> float:
    """OGB's Hits@K: share of ``pos`` strictly above the ``k``-th highest of ``neg`` (1.0 if ``len(neg) < k``)."""
    pos, neg = np.asarray(pos, np.float64).ravel(), np.asarray(neg, np.float64).ravel()
    if neg.size < k:
        return 1.0
    if pos.size == 0:
        return float("nan")
    kth = np.partition(neg, neg.size - k)[neg.size - k]
    return float((pos > kth).sum() / pos.size)


def _ranks(pos: np.ndarray, neg: np.ndarray) -> np.ndarray:
    if neg.ndim == 2:  # per-positive negatives, OGB's layout [num_pos, num_neg]
        optimistic = (neg > pos[:, None]).sum(1)
        pessimistic = (neg >= pos[:, None]).sum(1)
    else:
        s = np.sort(neg)
        optimistic = s.size - np.searchsorted(s, pos, side="right")
        pessimistic = s.size - np.searchsorted(s, pos, side="left")
    return 0.5 * (optimistic + pessimistic) + 1.0


def mrr(pos: np.ndarray, neg: np.ndarray) -> float:
    """OGB's MRR of ``pos`` ``[num_pos]`` against ``neg``: ``[num_pos, num_neg]`` per positive, or one 1-D pool."""
    pos = np.asarray(pos, np.float64).ravel()
    if pos.size == 0:
        return float("nan")
    return float((1.0 / _ranks(pos, np.asarray(neg, np.float64))).mean())


def link_metrics(pos: np.ndarray, neg: np.ndarray, ks: tuple[int, ...] = (10, 50, 100)) -> dict[str, float]:
    """``{"auc", "mrr", "hits@K"...}`` of one split's positive and negative scores."""
    out = {"auc": auc(pos, neg), "mrr": mrr(pos, neg)}
    out.update({f"hits@{k}": hits_at_k(pos, neg, k) for k in ks})
    return out
