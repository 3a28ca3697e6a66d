"""Link-prediction training on an edge-split dataset (``moment train --task link``).

Each epoch walks the training positives (one direction of each undirected edge) in shuffled batches
of ``spec.sampling.batch_size`` pairs; every batch draws ``neg_ratio`` fresh negatives per positive
against the training graph (:class:`~training.link.negatives.NegativeSampler`, as PyG's
examples/link_pred.py draws them each epoch), samples the endpoints' subgraph with the training
fan-outs (:class:`~training.link.sampler.LinkSampler`), gathers its rows from the placement's tiered
store (or the dataset's features), and takes a step of binary cross-entropy on the pair logits.
Evaluation scores the stored validation pairs over the training graph and the test pairs over the
training graph plus the validation edges (PyG's split), with ``eval_fanouts``, and reports AUC, MRR
and Hits@K (:mod:`training.link.metrics`); ``test_at_best`` holds the test metrics of the epoch with
the best validation AUC so far (the example's model selection).

One process trains (no ``torchrun`` ranks yet); the records follow :mod:`training.trainer`'s
(``kind`` ``"start"``, ``"step"``, ``"epoch"``; seconds and bytes), with pairs where it counts seeds.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from training.data import open_dataset
from training.errors import TrainError
from training.features import FeatureSource, open_features
from training.link.edges import with_edges
from training.link.edgeset import EdgeSet
from training.link.metrics import link_metrics
from training.link.model import LinkPredictor, bce
from training.link.negatives import NegativeSampler
from training.link.sampler import LinkSampler
from training.link.store import LinkData, open_link_data
from training.metrics import JsonlWriter
from training.sampler import NeighborSampler
from training.specs import TrainSpec
from training.trainer import TrainResult
from training.vocab import LINK_DECODERS, NEGATIVE_METHODS

__all__ = ["LinkSpec", "train_link"]

Progress = Callable[[dict], None]


@dataclass(frozen=True)
class LinkSpec:
    """What link prediction adds to a :class:`~training.specs.TrainSpec`: the decoder (``dot``, ``mlp``),
    how training negatives are drawn (``uniform``, ``degree``), negatives per positive, the embedding width."""

    decoder: str = "dot"
    negatives: str = "uniform"
    neg_ratio: float = 1.0
    embed_dim: int = 64

    def __post_init__(self) -> None:
        if self.decoder not in LINK_DECODERS:
            raise TrainError(f"`decoder` {self.decoder!r}: expected one of {', '.join(LINK_DECODERS)}")
        if self.negatives not in NEGATIVE_METHODS:
            raise TrainError(f"`negatives` {self.negatives!r}: expected one of {', '.join(NEGATIVE_METHODS)}")
        if not self.neg_ratio > 0:
            raise TrainError(f"`neg_ratio` {self.neg_ratio}: expected a positive number of negatives per positive")
        if self.embed_dim < 1:
            raise TrainError(f"`embed_dim` {self.embed_dim}: expected a positive width")

    def to_dict(self) -> dict:
        return {"decoder": self.decoder, "negatives": self.negatives, "neg_ratio": self.neg_ratio,
                "embed_dim": self.embed_dim}


class _Rows:
    """Rows of a sampled batch on the model's device: features (row-normalised when asked) and degrees."""

    def __init__(self, features: FeatureSource, indptr: np.ndarray, normalize: bool, device: torch.device) -> None:
        self.features, self.normalize, self.device = features, normalize, device
        self.deg = torch.from_numpy(np.diff(np.asarray(indptr, np.int64))).float()

    def rows(self, n_id: Tensor) -> tuple[Tensor, Tensor]:
        x = self.features.gather(n_id).float()
        if self.normalize:  # Kipf & Welling's row normalisation, as the node task's pipeline does per row
            x = x / x.sum(1, keepdim=True).clamp(min=1.0)
        return x.to(self.device), self.deg[n_id].to(self.device)


def _scores(model: LinkPredictor, sampler: LinkSampler, rows: _Rows, pairs: np.ndarray, batch: int) -> np.ndarray:
    out = []
    for a in range(0, pairs.shape[1], batch):
        b = sampler.sample(pairs[:, a:a + batch])
        x, deg = rows.rows(b.batch.n_id)
        ei = [e.to(rows.device) for e in b.batch.edge_index_per_layer]
        out.append(model(x, ei, b.batch.batch_size, b.pair_index, deg=deg).float().cpu().numpy())
    return np.concatenate(out) if out else np.zeros(0)


@torch.no_grad()
def _evaluate(model: LinkPredictor, evals: dict, batch: int, seed: int) -> dict[str, float]:
    """Metrics of the stored validation and test pairs; the samplers restart at ``seed`` (the same sample each time)."""
    model.eval()
    rec: dict[str, float] = {}
    for split, (sampler, rows, pos, neg) in evals.items():
        sampler.sampler.reseed(seed)
        both = _scores(model, sampler, rows, np.concatenate([pos, neg], axis=1), batch)
        for k, v in link_metrics(both[: pos.shape[1]], both[pos.shape[1]:]).items():
            rec[f"{split}_{k}"] = v
    return rec


def _eval_parts(spec: TrainSpec, data: LinkData, features: FeatureSource, device: torch.device) -> dict:
    ds, fan = data.ds, spec.sampling.evaluation_fanouts
    norm = spec.model.normalize_features
    test_ptr, test_idx = with_edges(np.asarray(ds.indptr), np.asarray(ds.indices), data.valid_pos, data.undirected)
    return {"valid": (LinkSampler(NeighborSampler(ds.indptr, ds.indices, fan, seed=spec.run.seed)),
                      _Rows(features, ds.indptr, norm, device), *data.pairs("valid")),
            "test": (LinkSampler(NeighborSampler(test_ptr, test_idx, fan, seed=spec.run.seed)),
                     _Rows(features, test_ptr, norm, device), *data.pairs("test"))}


def _model(spec: TrainSpec, link: LinkSpec, dim: int, device: torch.device) -> LinkPredictor:
    m = spec.model
    torch.manual_seed(spec.run.seed)
    return LinkPredictor(m.arch, dim, link.embed_dim, len(spec.sampling.fanouts), decoder=link.decoder,
                         hidden=m.hidden, heads=m.heads, out_heads=m.out_heads, dropout=m.dropout,
                         attn_dropout=m.attn_dropout if m.arch == "gat" else None,
                         norm=m.gcn_norm if m.arch == "gcn" else None).to(device)


def train_link(spec: TrainSpec, link: LinkSpec | None = None, *, progress: Progress | None = None) -> TrainResult:
    """Train a link predictor on ``spec.dataset``, an edge-split dataset (see the module doc).

    Raises
    ------
    TrainError
        Several ranks, a dataset without features or placement, a placement of another dataset.
    LinkSplitError
        The dataset has no edge splits (``moment data split-edges`` makes them).
    """
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise TrainError("link prediction trains in one process; run it without torchrun")
    link = link or LinkSpec()
    ds = open_dataset(spec.dataset, validate=False)
    data = open_link_data(ds)
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    features = open_features(ds, spec.io.placement, spec.io.backend, capacities=spec.io.capacities)
    metrics_file = JsonlWriter(spec.run.metrics_path) if spec.run.metrics_path else None

    def emit(rec: dict) -> None:
        rec = {"rank": 0, "world_size": 1, "task": "link", **rec}
        if metrics_file is not None:
            metrics_file.write(rec)
        if progress is not None:
            progress(rec)

    try:
        return _run(spec, link, data, features, device, emit)
    finally:
        features.close()
        if metrics_file is not None:
            metrics_file.close()


def _run(spec: TrainSpec, link: LinkSpec, data: LinkData, features: FeatureSource, device: torch.device,
         emit: Callable[[dict], None]) -> TrainResult:
    ds, run, bs = data.ds, spec.run, spec.sampling.batch_size
    model = _model(spec, link, features.dim, device)
    opt = torch.optim.Adam(model.parameters(), lr=run.lr, weight_decay=run.weight_decay)
    rng = np.random.default_rng(run.seed)
    sampler = LinkSampler(NeighborSampler(ds.indptr, ds.indices, spec.sampling.fanouts, seed=run.seed))
    rows = _Rows(features, ds.indptr, spec.model.normalize_features, device)
    negatives = NegativeSampler(EdgeSet.from_csr(ds.indptr, ds.indices, ds.num_nodes), method=link.negatives,
                                degree=np.diff(np.asarray(ds.indptr)))
    evals = _eval_parts(spec, data, features, device)
    pos_all = data.train_pos
    steps = -(-pos_all.shape[1] // bs)
    emit({"kind": "start", "config": {**spec.to_dict(), "link": link.to_dict()}, "steps_per_epoch": steps,
          "num_train": int(pos_all.shape[1]), "device": str(device), "features": type(features).__name__,
          "parameters": sum(p.numel() for p in model.parameters()), "start_epoch": 0, "start_step": 0})
    records: list[dict] = []
    best: tuple[float, dict] = (-1.0, {})
    for epoch in range(run.epochs):
        rec = _epoch(model, opt, sampler, rows, negatives, pos_all, bs, link.neg_ratio, rng, epoch, steps, emit)
        if epoch == run.epochs - 1 or (run.eval_every_epochs and (epoch + 1) % run.eval_every_epochs == 0):
            t = time.perf_counter()
            rec.update(_evaluate(model, evals, spec.sampling.eval_batch_size, run.seed))
            rec["eval_s"] = time.perf_counter() - t
            if rec["valid_auc"] > best[0]:
                best = (rec["valid_auc"], {k[5:]: v for k, v in rec.items() if k.startswith("test_")})
            rec["test_at_best"] = dict(best[1])
        records.append(rec)
        emit(rec)
    return TrainResult(model=model, epochs=tuple(records), resumed_from=None, world_size=1, rank=0)


def _epoch(model: LinkPredictor, opt: torch.optim.Optimizer, sampler: LinkSampler, rows: _Rows,
           negatives: NegativeSampler, pos_all: np.ndarray, bs: int, ratio: float, rng: np.random.Generator,
           epoch: int, steps: int, emit: Callable[[dict], None]) -> dict:
    """One epoch of steps; its record (the step records emitted)."""
    t_epoch = time.perf_counter()
    order = rng.permutation(pos_all.shape[1])
    before = rows.features.totals()
    loss_sum = pairs = 0.0
    times = {"sample_s": 0.0, "gather_s": 0.0, "compute_s": 0.0}
    model.train()
    for step in range(steps):
        t0 = time.perf_counter()
        pos = pos_all[:, order[step * bs:(step + 1) * bs]]
        neg = negatives.sample(int(pos.shape[1] * ratio), rng)
        b = sampler.sample(np.concatenate([pos, neg], axis=1))
        t1 = time.perf_counter()
        x, deg = rows.rows(b.batch.n_id)
        ei = [e.to(rows.device) for e in b.batch.edge_index_per_layer]
        t2 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = bce(model(x, ei, b.batch.batch_size, b.pair_index, deg=deg), pos.shape[1])
        loss.backward()
        opt.step()
        t3 = time.perf_counter()
        k, value = pos.shape[1] + neg.shape[1], float(loss.detach())
        loss_sum += value * k
        pairs += k
        times["sample_s"] += t1 - t0
        times["gather_s"] += t2 - t1
        times["compute_s"] += t3 - t2
        emit({"kind": "step", "epoch": epoch, "step": step, "steps": steps, "seeds": int(k),
              "loss": value, "step_s": t3 - t0})
    after = rows.features.totals()
    tiers = {k: {"rows": r - before.get(k, (0, 0))[0], "bytes": n - before.get(k, (0, 0))[1]}
             for k, (r, n) in after.items()}
    epoch_s = time.perf_counter() - t_epoch
    return {"kind": "epoch", "epoch": epoch, "steps": steps, "loss": loss_sum / max(pairs, 1.0), "pairs": int(pairs),
            "epoch_s": epoch_s, "pairs_per_s": pairs / epoch_s if epoch_s > 0 else 0.0, "tiers": tiers, **times}

