"""The link predictor: a GNN encoder from :mod:`training.models` and a pair decoder.

The encoder is any of Moment's sampled GNNs (GraphSAGE, GAT, GCN) built with ``embed_dim`` outputs
instead of class logits: it embeds the batch's seeds (the pairs' distinct endpoints). The decoder
scores a pair ``(u, v)`` from the two embeddings: ``"dot"`` is their inner product (GAE's, and
PyG's examples/link_pred.py's); ``"mlp"`` runs their element-wise product through a two-layer
perceptron (OGB's link-prediction baselines). Scores are logits (``BCEWithLogitsLoss``).

>>> import torch
>>> m = LinkPredictor("sage", in_dim=4, embed_dim=8, num_layers=1, hidden=8)
>>> ei = torch.tensor([[2, 3], [0, 1]])
>>> m(torch.randn(4, 4), (ei,), 2, torch.tensor([[0], [1]])).shape
torch.Size([1])
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from training.models import ModelError, build_model
from training.vocab import LINK_DECODERS

__all__ = ["LinkPredictor", "pair_loss"]


class LinkPredictor(nn.Module):
    """Encoder (``arch`` of :func:`training.models.build_model`, ``embed_dim`` outputs) and decoder.

    Parameters
    ----------
    arch : str
        ``"sage"``, ``"gat"`` or ``"gcn"``.
    in_dim, embed_dim, num_layers : int
        Feature width, embedding width, GNN layers (one per fan-out).
    decoder : str
        ``"dot"`` or ``"mlp"`` (:data:`training.vocab.LINK_DECODERS`).
    **hyper
        The encoder's hyperparameters (``hidden``, ``dropout``, ``norm``, ...).

    Raises
    ------
    ModelError
        An unknown decoder or encoder, or a bad hyperparameter.
    """

    def __init__(self, arch: str, in_dim: int, embed_dim: int, num_layers: int, *, decoder: str = "dot",
                 **hyper: object) -> None:
        super().__init__()
        if decoder not in LINK_DECODERS:
            raise ModelError(f"`decoder` {decoder!r}: expected one of {', '.join(LINK_DECODERS)}")
        self.encoder = build_model(arch, in_dim, embed_dim, num_layers, **hyper)
        self.decoder = decoder
        self.mlp = nn.Sequential(nn.Linear(embed_dim, embed_dim), nn.ReLU(), nn.Linear(embed_dim, 1)) \
            if decoder == "mlp" else None

    def decode(self, z: Tensor, pair_index: Tensor) -> Tensor:
        """Logits ``[k]`` of the pairs ``pair_index`` (``[2, k]`` rows of ``z``)."""
        prod = z[pair_index[0]] * z[pair_index[1]]
        if self.mlp is None:
            return prod.sum(-1)
        return self.mlp(prod).view(-1)

    def forward(self, x: Tensor, edge_index_per_layer: Sequence[Tensor], batch_size: int, pair_index: Tensor,
                deg: Tensor | None = None) -> Tensor:
        """Logits ``[k]`` of the pairs, their endpoints among the first ``batch_size`` rows of ``x``."""
        z = self.encoder(x, edge_index_per_layer, batch_size, deg=deg)
        return self.decode(z, pair_index.to(z.device))


def pair_loss(logits: Tensor, positives: int) -> Tensor:
    """Summed binary cross-entropy of pair logits ``[k]`` whose first ``positives`` are edges, the rest negatives.

    Summed, not averaged: a data-parallel step scales it by ``world_size / the world's pairs``.
    """
    target = torch.zeros_like(logits)
    target[:positives] = 1.0
    return nn.functional.binary_cross_entropy_with_logits(logits, target, reduction="sum")
