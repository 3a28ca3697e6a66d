"""HeteroSAGE (PyG's ``to_hetero`` over GraphSAGE) and R-GCN models trained on typed batches.

:func:`to_hetero_data` turns a :class:`training.hetero.sampler.HeteroBatch` into PyG's
``HeteroData`` (features gathered per type from the dataset's ``feat_<type>`` tables, cast to
float32; ``n_id`` and the seed type's ``batch_size`` as PyG's hetero ``NeighborLoader`` sets
them). Types without features get a learnable embedding row per node (PyG's ogbn-mag example
does the same for author, institution and field_of_study). :func:`train_epoch` runs one epoch
of node classification on the target type's training split.

This module imports ``torch_geometric``: import it only where PyG is wanted.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor, nn
from torch_geometric.data import HeteroData
from torch_geometric.nn import Linear, RGCNConv, SAGEConv, to_hetero

from training.data import DatasetError
from training.hetero.sampler import HeteroBatch, HeteroNeighborSampler
from training.hetero.store import HeteroDataset

#: rows of a type by local ids, in the order given, as float32 ``[len(ids), width]`` (a tiered store's gather)
Rows = Callable[[str, Tensor], Tensor]


def to_hetero_data(batch: HeteroBatch, data: HeteroDataset, rows: Rows | None = None) -> HeteroData:
    """The batch as PyG ``HeteroData``: ``x`` (float32) of featured types, ``n_id``, ``edge_index``, ``y``.

    ``rows``: where the features come from (e.g. :class:`training.hetero.train.FeatureRows` over a
    tiered store); default the dataset's ``feat_<type>`` memory maps, cast to float32.
    """
    out = HeteroData()
    for t, ids in batch.n_id.items():
        out[t].n_id = ids
        out[t].num_nodes = int(ids.numel())
        if t in data.features and rows is not None:
            out[t].x = rows(t, ids)
        elif t in data.features:
            got = np.asarray(data.features[t][np.sort(ids.numpy())], dtype=np.float32)
            # the gather reads rows in id order (a memory map's pages in order); put them back in n_id order
            out[t].x = torch.from_numpy(got)[torch.argsort(torch.argsort(ids))]
    for k, ei in batch.edge_index.items():
        out[k].edge_index = ei
    out[batch.seed_type].batch_size = batch.batch_size
    labels = data.labels_of(batch.seed_type)
    if labels is not None:
        out[batch.seed_type].y = torch.from_numpy(np.asarray(labels[batch.n_id[batch.seed_type].numpy()]))
    return out


def split_ids(data: HeteroDataset, name: str) -> Tensor:
    """``name`` (``train_idx``/``valid_idx``/``test_idx``) as int64 local ids of the target type.

    Raises
    ------
    DatasetError
        The dataset has no such split.
    """
    ids = data.split(name)
    if ids is None:
        raise DatasetError(f"{data.base.path}: has no {name}; write the dataset with splits of its target type")
    return torch.from_numpy(np.asarray(ids, dtype=np.int64))


class _SAGE(nn.Module):
    def __init__(self, hidden: int, out: int, layers: int) -> None:
        super().__init__()
        dims = [hidden] * (layers - 1) + [out]
        self.convs = nn.ModuleList(SAGEConv((-1, -1), d) for d in dims)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = x.relu()
        return x


class HeteroSAGE(nn.Module):
    """GraphSAGE made heterogeneous by ``to_hetero`` (one SAGEConv per relation, summed per type).

    ``embed``: node counts of the types without features, each given a ``hidden``-wide
    learnable embedding.
    """

    def __init__(self, metadata: tuple[list[str], list[tuple[str, str, str]]], embed: dict[str, int], *,
                 hidden: int, num_classes: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.ModuleDict({t: nn.Embedding(n, hidden) for t, n in embed.items()})
        self.body = to_hetero(_SAGE(hidden, num_classes, layers), metadata, aggr="sum")

    def forward(self, data: HeteroData) -> dict[str, Tensor]:
        x = {t: data[t].x for t in data.node_types if "x" in data[t]}
        for t, emb in self.embed.items():
            x[t] = emb(data[t].n_id)
        return self.body(x, data.edge_index_dict)


class RGCN(nn.Module):
    """R-GCN (Schlichtkrull et al., PyG's ``RGCNConv``) over a typed batch laid out homogeneously.

    Every type's rows go through their own linear map (lazy input width) or embedding to
    ``hidden``; the types' rows are stacked in the order of ``metadata`` and every relation's
    edges shifted to those rows, with the relation's index as ``edge_type``.
    """

    def __init__(self, metadata: tuple[list[str], list[tuple[str, str, str]]], embed: dict[str, int], *,
                 hidden: int, num_classes: int, layers: int) -> None:
        super().__init__()
        self.types, self.relations = metadata
        self.embed = nn.ModuleDict({t: nn.Embedding(n, hidden) for t, n in embed.items()})
        self.proj = nn.ModuleDict({t: Linear(-1, hidden) for t in self.types if t not in embed})
        dims = [hidden] * (layers - 1) + [num_classes]
        self.convs = nn.ModuleList(RGCNConv(hidden, d, len(self.relations)) for d in dims)

    def forward(self, data: HeteroData) -> dict[str, Tensor]:
        rows, start = [], {}
        at = 0
        for t in self.types:
            h = self.embed[t](data[t].n_id) if t in self.embed else self.proj[t](data[t].x)
            rows.append(h)
            start[t] = at
            at += h.shape[0]
        x = torch.cat(rows)
        shifted = [data[k].edge_index + torch.tensor([[start[k[0]]], [start[k[2]]]]) for k in self.relations]
        edge_index = torch.cat(shifted, 1)
        edge_type = torch.cat([torch.full((e.shape[1],), i, dtype=torch.int64) for i, e in enumerate(shifted)])
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index, edge_type)
            if i < len(self.convs) - 1:
                x = x.relu()
        return {t: x[start[t]:start[t] + data[t].num_nodes] for t in self.types}


#: the models :func:`build_model` makes, by name
MODELS: dict[str, type[HeteroSAGE] | type[RGCN]] = {"sage": HeteroSAGE, "rgcn": RGCN}


def build_model(data: HeteroDataset, sampler: HeteroNeighborSampler, *, kind: str = "sage", hidden: int = 32,
                layers: int = 2, rows: Rows | None = None) -> HeteroSAGE | RGCN:
    """A model of ``kind`` (:data:`MODELS`) for ``data``'s types and relations and its target's classes.

    Its input widths are lazy (one per type, ``SAGEConv((-1, -1), ...)``): one forward pass over
    a small batch from ``sampler`` sets them, so the optimiser can be made right after.

    Raises
    ------
    DatasetError
        The dataset has no training split, or ``kind`` is not one of :data:`MODELS`.
    """
    if kind not in MODELS:
        raise DatasetError(f"`kind` {kind!r} is not one of {', '.join(MODELS)}")
    s = data.schema
    metadata = ([t.name for t in s.node_types], s.keys())
    embed = {t.name: t.count for t in s.node_types if not t.feature_dim}
    model = MODELS[kind](metadata, embed, hidden=hidden, num_classes=data.base.num_classes, layers=layers)
    with torch.no_grad():
        model(to_hetero_data(sampler.sample(str(s.target), split_ids(data, "train_idx")[:2]), data, rows))
    return model


def train_epoch(model: nn.Module, opt: torch.optim.Optimizer, data: HeteroDataset,
                sampler: HeteroNeighborSampler, *, batch_size: int, seed: int = 0) -> float:
    """One epoch over the target type's training split; the mean loss of its batches.

    Raises
    ------
    DatasetError
        The dataset has no training split.
    """
    target = str(data.schema.target)
    train = split_ids(data, "train_idx")
    order = train[torch.randperm(len(train), generator=torch.Generator().manual_seed(seed))]
    losses = []
    model.train()
    for at in range(0, len(order), batch_size):
        batch = to_hetero_data(sampler.sample(target, order[at:at + batch_size]), data)
        n = batch[target].batch_size
        out = model(batch)[target][:n]
        loss = nn.functional.cross_entropy(out, batch[target].y[:n])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return float(np.mean(losses))


def accuracy(model: nn.Module, data: HeteroDataset, sampler: HeteroNeighborSampler, split: str,
             batch_size: int = 256, rows: Rows | None = None) -> float:
    """Share of ``split``'s target nodes classified right (sampled neighbourhoods).

    Raises
    ------
    DatasetError
        The dataset has no such split.
    """
    target = str(data.schema.target)
    ids = split_ids(data, split)
    right = 0
    model.eval()
    with torch.no_grad():
        for at in range(0, len(ids), batch_size):
            batch = to_hetero_data(sampler.sample(target, ids[at:at + batch_size]), data, rows)
            n = batch[target].batch_size
            right += int((model(batch)[target][:n].argmax(1) == batch[target].y[:n]).sum())
    return right / max(len(ids), 1)


__all__ = ["MODELS", "RGCN", "HeteroSAGE", "Rows", "accuracy", "build_model", "split_ids", "to_hetero_data",
           "train_epoch"]
