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

Dropout: GraphSAGE drops units between layers only (the convention of DGL's and PyG's
GraphSAGE); GAT and GCN also drop the input features, as their papers do. On the CPU the
mask comes from :func:`dropout`, not ``F.dropout`` (see there: 3-4x cheaper).

GCN normalisation (:class:`GCN`): ``"local"`` (default) is PyG's ``GCNConv`` on
the batch's own graph (self-loops added, degrees counted in the layer's edges, as
PyG does with ``NeighborLoader``); ``"global"`` takes each vertex's degree in the
whole graph (pass ``deg``), which with full neighbourhoods is exactly Kipf &
Welling's full-graph GCN. Any GCN given ``deg`` normalises with it (layer-wise
inference does: on the whole graph the two are the same).

>>> import torch
>>> m = build_model("sage", in_dim=4, num_classes=3, num_layers=2, hidden=8)
>>> x = torch.randn(5, 4)
>>> ei = torch.tensor([[1, 2, 3, 4], [0, 0, 1, 2]])           # hop 1: 1,2 -> 0; hop 2: 3 -> 1, 4 -> 2
>>> m(x, (ei, ei[:, :2]), batch_size=1).shape
torch.Size([1, 3])
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn import GATConv, GCNConv, SAGEConv

from training.errors import TrainingError

# torch says once per process that sparse CSR support is "beta"; the one operation used here
# (torch.sparse.mm with a reduction, through PyG) is tested below and in tests/test_train.py
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta", category=UserWarning)

__all__ = ["GAT", "GCN", "GraphSAGE", "ModelError", "adjacency", "build_model", "dropout", "relu_dropout", "MODELS"]


class ModelError(TrainingError):
    """A model name or hyperparameter the models do not support."""


def _keep_mask(x: Tensor, p: float) -> Tensor | None:
    """Bool keep mask of ``x``'s shape (rate ``round(p * 256) / 256`` dropped), ``None`` if all drop."""
    threshold = round(p * 256)
    if threshold >= 256:
        return None
    n = x.numel()
    # the whole int64 range: all 8 bytes of a word are uniform (``random_()`` alone leaves the top bit 0)
    words = torch.empty((n + 7) // 8, dtype=torch.int64).random_(-(2**63), 2**63 - 1)
    return words.view(torch.uint8)[:n].view(x.shape) >= threshold


def _scale(p: float) -> float:
    return 256.0 / (256 - round(p * 256))


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """``F.dropout`` with the keep mask drawn from random 64-bit words on the CPU.

    Why not ``F.dropout`` everywhere: on the CPU, torch's ``bernoulli_`` draws one
    Mersenne-Twister number per element; on a sampled batch's input (~10⁷ values)
    that alone was 70% of a GraphSAGE training step here (``python
    tools/bench_train_dgl.py``). Here every 64-bit word of ``torch.random_`` over the
    whole int64 range gives 8 random bytes, and an element is kept when its byte is at
    least ``round(p * 256)``: ``p`` is rounded to a multiple of 1/256 (exact for 0.5,
    0.25, ...; at most 1/512 off otherwise) and kept values are scaled by the exact
    inverse keep probability, so the expectation is unchanged. The mask is made a float
    tensor before it multiplies (a float × bool product is 3x slower than float ×
    float here, and the backward pass multiplies by it again). The draw comes from
    torch's default generator (``torch.manual_seed`` reproduces it). On other devices
    ``F.dropout`` is already fused and is used as is.

    >>> _ = torch.manual_seed(0)
    >>> y = dropout(torch.ones(100_000), 0.5)
    >>> round(float((y == 0).float().mean()), 2), round(float(y.mean()), 2), sorted(set(y.unique().tolist()))
    (0.5, 1.0, [0.0, 2.0])
    """
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu":
        return F.dropout(x, p=p, training=True)
    keep = _keep_mask(x, p)
    if keep is None:
        return x * 0.0
    return x * keep.to(x.dtype).mul_(_scale(p))


def relu_dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """``dropout(F.relu(x), p, training)`` in one multiplication on the CPU.

    Between two layers the activation and the dropout each read and write the whole
    hidden matrix, forward and backward. One mask that is zero where the unit is
    dropped *or* not positive does both: the output is ``x * mask`` and the
    gradient ``grad * mask`` (ReLU's derivative is 0 at 0, as torch's). Forward and
    backward over 17k × 256 hidden rows (a GraphSAGE batch of 1024 seeds, fan-outs 25,10)
    took 10-11 ms instead of 17-18 ms here, 2 threads.

    >>> _ = torch.manual_seed(0)
    >>> x = torch.tensor([[-1.0, 2.0, 3.0, 0.0]]).repeat(10_000, 1)
    >>> y = relu_dropout(x, 0.5)
    >>> y.abs().unique().tolist(), bool((y[:, 0] == 0).all()), round(float((y[:, 1] != 0).float().mean()), 1)
    ([0.0, 4.0, 6.0], True, 0.5)
    """
    if not training or p == 0.0:
        return F.relu(x)
    if x.device.type != "cpu":
        return F.dropout(F.relu(x), p=p, training=True)
    keep = _keep_mask(x, p)
    if keep is None:
        return x * 0.0
    keep &= x > 0
    return x * keep.to(x.dtype).mul_(_scale(p))


def adjacency(edge_index: Tensor, num_out: int, num_in: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """The ``[num_out, num_in]`` sparse CSR adjacency (ones) of ``edge_index`` (``[2, E]``, source row 0).

    Row ``i`` holds the sources of the edges into ``i``. PyG's ``SAGEConv`` given this
    instead of ``edge_index`` aggregates with ``torch.sparse.mm(adj, x, "mean")``: on a
    sampled GraphSAGE batch here 4 ms instead of 59 ms for gathering one message per
    edge and scattering it back (forward; ``python tools/bench_train_dgl.py``). The
    sampler emits edges grouped by target in order; others are sorted first.

    >>> a = adjacency(torch.tensor([[2, 3, 1], [0, 0, 1]]), 2, 4)
    >>> a.to_dense().tolist()
    [[0.0, 0.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0]]
    """
    src, dst = edge_index[0], edge_index[1]
    if dst.numel() > 1 and (dst.device.type != "cpu" or bool((dst[1:] < dst[:-1]).any())):
        order = torch.argsort(dst, stable=True)  # a no-op order for sorted edges; no host sync on a GPU
        src, dst = src[order], dst[order]
    crow = torch.zeros(num_out + 1, dtype=torch.int64, device=dst.device)
    torch.cumsum(torch.bincount(dst, minlength=num_out), 0, out=crow[1:])
    ones = torch.ones(src.numel(), dtype=dtype, device=src.device)
    return torch.sparse_csr_tensor(crow, src.to(torch.int64), ones, size=(num_out, num_in), check_invariants=False)


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
    """Shared forward: dropout, per-layer trimming, activation between layers.

    ``input_dropout``: whether the first layer's input features are dropped too
    (every other layer's input always is).
    """

    convs: nn.ModuleList
    input_dropout: bool = True

    def __init__(self, dropout: float) -> None:
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise ModelError(f"dropout: expected a probability in [0, 1), got {dropout}")
        self.dropout = float(dropout)

    def _conv(self, layer: int, x: Tensor, edge_index: Tensor, num_out: int, **extra) -> Tensor:
        raise NotImplementedError

    def _act_dropout(self, h: Tensor) -> Tensor:
        """Between layers: the activation, then dropout (fused for ReLU on the CPU)."""
        return relu_dropout(h, self.dropout, self.training)

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
        for layer, ei in enumerate(edge_index_per_layer):
            h = h[: need[layer]]
            if layer == 0 and self.input_dropout:
                h = dropout(h, self.dropout, self.training)
            h = self.layer_forward(layer, h, ei, need[layer + 1], deg=deg)
        return h[:batch_size]

    def layer_forward(self, layer: int, x: Tensor, edge_index: Tensor, num_out: int, *,
                      deg: Tensor | None = None) -> Tensor:
        """Layer ``layer`` alone on one block: ``[num_out, out_dims[layer]]``, the outputs of ``x``'s first rows.

        ``x``: ``[n, in_dim of the layer]``, the rows the layer reads (its ``num_out`` targets first);
        ``edge_index``: ``[2, E]`` local ids into ``x`` (row 0 the neighbour, row 1 the target, ``< num_out``).
        Below the last layer the activation (and, in training, dropout) follows, as in :meth:`forward`,
        which applies the layers one by one through this method; the input dropout of layer 0 is
        :meth:`forward`'s. Layer-wise inference (:mod:`training.infer`) calls it for one layer over every
        vertex before the next.
        """
        h = self._conv(layer, x, edge_index, num_out, deg=deg)
        if layer < len(self.convs) - 1:
            # a layer outputs exactly the rows the next one reads: dropping units here is
            # the next layer's input dropout
            h = self._act_dropout(h)
        return h

    @property
    def out_dims(self) -> tuple[int, ...]:
        """Width of each layer's output (a GAT hidden layer's: its heads concatenated)."""
        return tuple(int(c.out_channels) * (int(c.heads) if getattr(c, "concat", False) else 1) for c in self.convs)


class GraphSAGE(_Sampled):
    """GraphSAGE with mean aggregation (Hamilton et al.), ``hidden`` units per hidden layer;
    dropout between layers, not on the input features (as DGL's and PyG's GraphSAGE)."""

    input_dropout = False

    def __init__(self, in_dim: int, num_classes: int, num_layers: int, *, hidden: int = 256,
                 dropout: float = 0.5) -> None:
        super().__init__(dropout)
        dims = [in_dim] + [hidden] * (num_layers - 1) + [num_classes]
        self.convs = nn.ModuleList(SAGEConv(dims[i], dims[i + 1]) for i in range(num_layers))

    def _conv(self, layer: int, x: Tensor, edge_index: Tensor, num_out: int, **extra) -> Tensor:
        # bipartite form: sources are all rows read, targets the prefix that is output; the
        # edges as a sparse CSR adjacency, which PyG aggregates with one torch.sparse.mm
        # (mean reduction) instead of gathering a message per edge and scattering it back
        return self.convs[layer]((x, x[:num_out]), adjacency(edge_index, num_out, x.shape[0], x.dtype))


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

    def _act_dropout(self, h: Tensor) -> Tensor:
        return dropout(F.elu(h), self.dropout, self.training)

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
        if self.norm == "local" and deg is None:
            return self.convs[layer](x, edge_index)[:num_out]
        if deg is None:
            raise ModelError("GCN with norm='global' needs deg, the vertices' whole-graph in-degrees")
        # whole-graph degrees (given `deg`, whatever `norm`: layer-wise inference passes them to compute
        # the full-graph GCN block by block, where a block's own degrees would be wrong for its sources)
        n = x.shape[0]
        loops = torch.arange(n, device=x.device)
        ei = torch.cat([edge_index, loops.expand(2, n)], 1)
        inv = (deg[:n].to(x.dtype) + 1.0).rsqrt()  # +1: the self-loop of Â = A + I
        w = inv[ei[0]] * inv[ei[1]]
        conv = self.convs[layer]
        # GCNConv.forward without its own normalisation (a "local" model's conv would renormalise `w`):
        # the same lin, propagate (edge-weighted sum) and bias it runs with normalize=False
        out = conv.propagate(ei, x=conv.lin(x), edge_weight=w)
        return (out if conv.bias is None else out + conv.bias)[:num_out]


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
