"""GraphSAGE, GAT and GCN over sampled mini-batches (PyG layers), trimmed layer by layer.

Every model takes ``(x, edge_index_per_layer, batch_size)`` as laid out by
:class:`training.sampler.SampledBatch`: ``x`` holds the feature rows of the
batch's vertices (seeds first, then hop 1, hop 2, ...), ``edge_index_per_layer[l]``
the local edges layer ``l`` needs (outermost hop first), and the result is
``[batch_size, num_classes]`` logits of the seeds.

Trimming: layer ``l`` only computes outputs that a later layer reads. Those are the
first ``need(l + 1)`` vertices, where ``need(k)`` is ``max(batch_size, 1 + the
largest local id in edge_index_per_layer[k])`` (and ``need(L) = batch_size``):
the edges of layer ``l + 1`` name every vertex it reads, and the sampler's layout
puts them in a prefix. Layer ``l`` reads ``need(l)`` input rows. This is what
``torch_geometric.utils.trim_to_layer`` does from the per-hop counts, derived from
the edges alone so the models need nothing but the edge lists.

GCN normalisation (:class:`GCN`): ``"local"`` (default) is PyG's ``GCNConv`` on
the batch's own graph (self-loops added, degrees counted in the layer's edges, as
PyG does with ``NeighborLoader``); ``"global"`` takes each vertex's degree in the
whole graph (pass ``deg``), which with full neighbourhoods is exactly Kipf &
Welling's full-graph GCN.

>>> import torch
>>> m = build_model("sage", in_dim=4, num_classes=3, num_layers=2, hidden=8)
>>> x = torch.randn(5, 4)
>>> ei = torch.tensor([[1, 2, 3, 4], [0, 0, 1, 2]])           # hop 1: 1,2 -> 0; hop 2: 3 -> 1, 4 -> 2
>>> m(x, (ei, ei[:, :2]), batch_size=1).shape
torch.Size([1, 3])
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn import GATConv, GCNConv, SAGEConv

from planner.errors import PlannerError

__all__ = ["GAT", "GCN", "GraphSAGE", "ModelError", "build_model", "MODELS"]


class ModelError(PlannerError):
    """A model name or hyperparameter the models do not support."""


def _needs(edge_index_per_layer: Sequence[Tensor], batch_size: int) -> list[int]:
    """``need[k]``: rows layer ``k`` reads (``k < L``), ``need[L] = batch_size`` (see the module doc)."""
    need = []
    for ei in edge_index_per_layer:
        top = int(ei.max()) + 1 if ei.numel() else 0
        need.append(max(batch_size, top))
    need.append(batch_size)
    # a layer must output every row the next one reads
    for k in range(len(need) - 2, -1, -1):
        need[k] = max(need[k], need[k + 1])
    return need


class _Sampled(nn.Module):
    """Shared forward: dropout, per-layer trimming, activation between layers."""

    convs: nn.ModuleList

    def __init__(self, dropout: float) -> None:
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise ModelError(f"dropout: expected a probability in [0, 1), got {dropout}")
        self.dropout = float(dropout)

    def _conv(self, layer: int, x: Tensor, edge_index: Tensor, num_out: int, **extra) -> Tensor:
        raise NotImplementedError

    def _act(self, h: Tensor) -> Tensor:
        return F.relu(h)

    def forward(self, x: Tensor, edge_index_per_layer: Sequence[Tensor], batch_size: int,
                deg: Tensor | None = None) -> Tensor:
        """Logits of the first ``batch_size`` rows of ``x``: ``[batch_size, num_classes]``.

        ``x``: ``[num_nodes, in_dim]``; ``edge_index_per_layer``: one ``[2, E_l]`` int64
        tensor per layer (``len == num_layers``); ``deg``: only :class:`GCN` with
        ``norm="global"`` reads it (float ``[num_nodes]``, whole-graph in-degrees).
        """
        if len(edge_index_per_layer) != len(self.convs):
            raise ModelError(f"the model has {len(self.convs)} layers but the batch was sampled with "
                             f"{len(edge_index_per_layer)} fan-outs; use one fan-out per layer")
        need = _needs(edge_index_per_layer, batch_size)
        h = x
        last = len(self.convs) - 1
        for layer, ei in enumerate(edge_index_per_layer):
            h = F.dropout(h[: need[layer]], p=self.dropout, training=self.training)
            h = self._conv(layer, h, ei, need[layer + 1], deg=deg)
            if layer < last:
                h = self._act(h)
        return h[:batch_size]


class GraphSAGE(_Sampled):
    """GraphSAGE with mean aggregation (Hamilton et al.), ``hidden`` units per hidden layer."""

    def __init__(self, in_dim: int, num_classes: int, num_layers: int, *, hidden: int = 256,
                 dropout: float = 0.5) -> None:
        super().__init__(dropout)
        dims = [in_dim] + [hidden] * (num_layers - 1) + [num_classes]
        self.convs = nn.ModuleList(SAGEConv(dims[i], dims[i + 1]) for i in range(num_layers))

    def _conv(self, layer: int, x: Tensor, edge_index: Tensor, num_out: int, **extra) -> Tensor:
        # bipartite form: sources are all rows read, targets the prefix that is output
        return self.convs[layer]((x, x[:num_out]), edge_index)


class GAT(_Sampled):
    """GAT (Veličković et al.): hidden layers of ``heads`` concatenated heads of ``hidden`` units,
    the output layer ``out_heads`` heads averaged (1 on Cora, as in the paper); ELU between layers.

    ``dropout`` applies to every layer's input, ``attn_dropout`` to the attention coefficients.
    """

    def __init__(self, in_dim: int, num_classes: int, num_layers: int, *, hidden: int = 64,
                 heads: int = 8, out_heads: int = 1, dropout: float = 0.5, attn_dropout: float = 0.0) -> None:
        super().__init__(dropout)
        if heads < 1 or out_heads < 1:
            raise ModelError(f"heads: expected positive integers, got heads={heads}, out_heads={out_heads}")
        convs = []
        d = in_dim
        for _ in range(num_layers - 1):
            convs.append(GATConv(d, hidden, heads=heads, concat=True, dropout=attn_dropout))
            d = hidden * heads
        convs.append(GATConv(d, num_classes, heads=out_heads, concat=False, dropout=attn_dropout))
        self.convs = nn.ModuleList(convs)

    def _act(self, h: Tensor) -> Tensor:
        return F.elu(h)

    def _conv(self, layer: int, x: Tensor, edge_index: Tensor, num_out: int, **extra) -> Tensor:
        # targets are a prefix of the sources: GATConv's self-loops over all rows read are
        # right for the prefix; the rows past it are computed and dropped (cheap: no edges)
        return self.convs[layer](x, edge_index)[:num_out]


class GCN(_Sampled):
    """GCN (Kipf & Welling) with ``hidden`` units; ``norm`` ``"local"`` or ``"global"`` (module doc)."""

    def __init__(self, in_dim: int, num_classes: int, num_layers: int, *, hidden: int = 256,
                 dropout: float = 0.5, norm: str = "local") -> None:
        super().__init__(dropout)
        if norm not in ("local", "global"):
            raise ModelError(f"GCN norm: expected 'local' or 'global', got {norm!r}")
        self.norm = norm
        dims = [in_dim] + [hidden] * (num_layers - 1) + [num_classes]
        local = norm == "local"
        self.convs = nn.ModuleList(GCNConv(dims[i], dims[i + 1], normalize=local, add_self_loops=local)
                                   for i in range(num_layers))

    def _conv(self, layer: int, x: Tensor, edge_index: Tensor, num_out: int, *, deg: Tensor | None = None,
              **extra) -> Tensor:
        if self.norm == "local":
            return self.convs[layer](x, edge_index)[:num_out]
        if deg is None:
            raise ModelError("GCN with norm='global' needs deg, the vertices' whole-graph in-degrees")
        n = x.shape[0]
        loops = torch.arange(n, device=x.device)
        ei = torch.cat([edge_index, loops.expand(2, n)], 1)
        inv = (deg[:n].to(x.dtype) + 1.0).rsqrt()  # +1: the self-loop of Â = A + I
        w = inv[ei[0]] * inv[ei[1]]
        return self.convs[layer](x, ei, w)[:num_out]


#: model name -> (class, default hyperparameters)
MODELS: dict[str, tuple[type[_Sampled], dict]] = {
    "sage": (GraphSAGE, {"hidden": 256}),
    "gat": (GAT, {"hidden": 64, "heads": 8}),
    "gcn": (GCN, {"hidden": 256}),
}


def build_model(name: str, in_dim: int, num_classes: int, num_layers: int, **hyper) -> _Sampled:
    """A model by name (``sage``, ``gat``, ``gcn``) with ``num_layers`` layers.

    ``hyper`` overrides the defaults of :data:`MODELS` (``hidden``, ``dropout``, and
    ``heads``, ``out_heads``, ``attn_dropout`` for GAT, ``norm`` for GCN); ``None``
    values are ignored. Unknown names raise :class:`ModelError`.
    """
    if name not in MODELS:
        raise ModelError(f"model {name!r}: expected one of {', '.join(MODELS)}")
    if num_layers < 1:
        raise ModelError(f"num_layers: expected at least 1, got {num_layers}")
    if in_dim < 1 or num_classes < 1:
        raise ModelError(f"in_dim and num_classes must be positive, got {in_dim} and {num_classes}")
    cls, defaults = MODELS[name]
    kwargs = dict(defaults)
    kwargs.update({k: v for k, v in hyper.items() if v is not None})
    try:
        return cls(in_dim, num_classes, num_layers, **kwargs)
    except TypeError as exc:
        raise ModelError(f"model {name!r}: {exc}") from None
