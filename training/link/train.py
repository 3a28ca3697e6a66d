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

Under ``torchrun`` (``WORLD_SIZE > 1``) the ranks train data-parallel as the node task does
(:func:`training.distributed.open_world`, DDP on the world's step group): each rank takes its part of
every step's positives (:mod:`training.link.batches`: every positive once per epoch across the
ranks, the same number of steps on each) and draws its own negatives from a stream of its own;
the loss is the rank's summed cross-entropy scaled by ``world_size / pairs of the step over all
ranks`` (one all-reduce of the count), so DDP's averaged gradient is the gradient of the mean over
the world's pairs, what one process computes on the ranks' pairs together. Evaluation scores each
rank's share of the stored pairs and gathers the scores in order before the metrics, so they are
computed on the same numbers as in one process. The records follow :mod:`training.trainer`'s
(``kind`` ``"start"``, ``"step"``, ``"epoch"``; seconds and bytes), with pairs where it counts seeds;
rank 0 writes ``metrics_path``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from iostack.transfer import memory_for
from training.data import open_dataset
from training.distributed import World, data_parallel, open_world
from training.errors import TrainError
from training.features import FeatureSource
from training.feed import open_run_features
from training.link.batches import LinkSteps
from training.link.edges import with_edges
from training.link.edgeset import EdgeSet
from training.link.metrics import link_metrics
from training.link.model import LinkPredictor, pair_loss
from training.link.negatives import NegativeSampler
from training.link.sampler import LinkSampler
from training.link.store import LinkData, open_link_data
from training.metrics import RankRecords
from training.sampler import NeighborSampler
from training.specs import TrainSpec
from training.trainer import TrainResult
from training.vocab import LINK_DECODERS, NEGATIVE_METHODS

__all__ = ["LinkSpec", "build_link_model", "pair_logits", "train_link"]

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


def pair_logits(model: nn.Module, sampler: LinkSampler, rows: _Rows, pairs: np.ndarray) -> Tensor:
    """Logits ``[k]`` of ``pairs`` (``[2, k]``): their endpoints' subgraph sampled, its rows gathered, ``model`` run."""
    b = sampler.sample(pairs)
    x, deg = rows.rows(b.batch.n_id)
    ei = [e.to(rows.device) for e in b.batch.edge_index_per_layer]
    out: Tensor = model(x, ei, b.batch.batch_size, b.pair_index, deg=deg)
    return out


def _scores(model: LinkPredictor, sampler: LinkSampler, rows: _Rows, pairs: np.ndarray, batch: int,
            world: World) -> np.ndarray:
    """Scores of ``pairs``: this rank's contiguous share in batches of ``batch``, every rank's gathered in order."""
    share = np.array_split(np.arange(pairs.shape[1]), world.size)[world.rank]
    lo, hi = (int(share[0]), int(share[-1]) + 1) if share.size else (0, 0)
    out = [pair_logits(model, sampler, rows, pairs[:, a:min(a + batch, hi)]).float().cpu().numpy()
           for a in range(lo, hi, batch)]
    mine = np.concatenate(out) if out else np.zeros(0, np.float32)
    return np.concatenate(world.gather_objects(mine, "gathering the evaluation scores"))


@torch.no_grad()
def _evaluate(model: LinkPredictor, evals: dict, batch: int, seed: int, world: World) -> dict[str, float]:
    """Metrics of the stored validation and test pairs (every rank's scores); the samplers restart at ``seed``."""
    model.eval()
    rec: dict[str, float] = {}
    for split, (sampler, rows, pos, neg) in evals.items():
        sampler.sampler.reseed(seed)
        both = _scores(model, sampler, rows, np.concatenate([pos, neg], axis=1), batch, world)
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


def build_link_model(spec: TrainSpec, link: LinkSpec, dim: int, device: torch.device) -> LinkPredictor:
    """The run's link predictor for ``dim``-wide rows on ``device``, initialised from ``spec.run.seed``."""
    m = spec.model
    torch.manual_seed(spec.run.seed)
    return LinkPredictor(m.arch, dim, link.embed_dim, len(spec.sampling.fanouts), decoder=link.decoder,
                         hidden=m.hidden, heads=m.heads, out_heads=m.out_heads, dropout=m.dropout,
                         attn_dropout=m.attn_dropout if m.arch == "gat" else None,
                         norm=m.gcn_norm if m.arch == "gcn" else None).to(device)


def train_link(spec: TrainSpec, link: LinkSpec | None = None, *, progress: Progress | None = None) -> TrainResult:
    """Train a link predictor on ``spec.dataset``, an edge-split dataset (see the module doc); under ``torchrun``
    this rank's part of a data-parallel run.

    Raises
    ------
    TrainError
        A dataset without features or placement, a placement of another dataset.
    LinkSplitError
        The dataset has no edge splits (``moment data split-edges`` makes them).
    """
    link = link or LinkSpec()
    ds = open_dataset(spec.dataset, validate=False)
    data = open_link_data(ds)
    world = open_world(spec.io.placement, None, spec.distributed.timeout_s)
    features: FeatureSource | None = None
    emit = RankRecords(spec.run.metrics_path, rank=world.rank, world_size=world.size, task="link", progress=progress)
    try:
        features = open_run_features(spec, ds, world, memory_for(world.device))
        return _run(spec, link, data, features, world, emit)
    finally:
        if features is not None:
            features.close()
        emit.close()
        world.end()  # the heartbeat, and a group this run started (torchrun's ranks without one of the caller's)


def _run(spec: TrainSpec, link: LinkSpec, data: LinkData, features: FeatureSource, world: World,
         emit: Callable[[dict], None]) -> TrainResult:
    ds, run, device = data.ds, spec.run, world.device
    net = build_link_model(spec, link, features.dim, device)
    model = data_parallel(net, world)
    opt = torch.optim.Adam(model.parameters(), lr=run.lr, weight_decay=run.weight_decay)
    sampler = LinkSampler(NeighborSampler(ds.indptr, ds.indices, spec.sampling.fanouts,
                                          seed=run.seed + world.rank))  # each rank's neighbour draws its own
    rows = _Rows(features, ds.indptr, spec.model.normalize_features, device)
    negatives = NegativeSampler(EdgeSet.from_csr(ds.indptr, ds.indices, ds.num_nodes), method=link.negatives,
                                degree=np.diff(np.asarray(ds.indptr)))
    steps = LinkSteps(data.train_pos, negatives, spec.sampling.batch_size, link.neg_ratio, seed=run.seed,
                      rank=world.rank, world_size=world.size)
    evals = _eval_parts(spec, data, features, device)
    emit({"kind": "start", "config": {**spec.to_dict(), "link": link.to_dict()}, "steps_per_epoch": len(steps),
          "num_train": int(data.train_pos.shape[1]), "device": str(device), "features": type(features).__name__,
          "parameters": sum(p.numel() for p in net.parameters()), "start_epoch": 0, "start_step": 0})
    world.barrier()  # everyone set up: the steps' short timeouts start from here
    records: list[dict] = []
    best: tuple[float, dict] = (-1.0, {})
    for epoch in range(run.epochs):
        rec = _epoch(model, opt, sampler, rows, steps, world, epoch, emit)
        if epoch == run.epochs - 1 or (run.eval_every_epochs and (epoch + 1) % run.eval_every_epochs == 0):
            t = time.perf_counter()
            rec.update(_evaluate(net, evals, spec.sampling.eval_batch_size, run.seed, world))
            rec["eval_s"] = time.perf_counter() - t
            if rec["valid_auc"] > best[0]:
                best = (rec["valid_auc"], {k[5:]: v for k, v in rec.items() if k.startswith("test_")})
            rec["test_at_best"] = dict(best[1])
        records.append(rec)
        emit(rec)
    return TrainResult(model=net, epochs=tuple(records), resumed_from=None, world_size=world.size, rank=world.rank)


def _epoch(model: nn.Module, opt: torch.optim.Optimizer, sampler: LinkSampler, rows: _Rows, steps: LinkSteps,
           world: World, epoch: int, emit: Callable[[dict], None]) -> dict:
    """One epoch of this rank's steps; its record over the world (the step records emitted, this rank's)."""
    t_epoch = time.perf_counter()
    before = rows.features.totals()
    sums = torch.zeros(2, dtype=torch.float64)  # the summed loss and the pairs of this rank
    times = {"sample_s": 0.0, "gather_s": 0.0, "compute_s": 0.0}
    n = len(steps)
    model.train()
    for step, (pos, neg) in enumerate(steps.epoch(epoch)):
        t0 = time.perf_counter()
        b = sampler.sample(np.concatenate([pos, neg], axis=1))
        k = pos.shape[1] + neg.shape[1]
        # the world's pairs of the step (a rank's negatives may fall short): the loss is their mean
        total = float(world.all_reduce(torch.tensor([float(k)], dtype=torch.float64),
                                       during=f"epoch {epoch} step {step}: counting the pairs")[0])
        t1 = time.perf_counter()
        x, deg = rows.rows(b.batch.n_id)
        ei = [e.to(rows.device) for e in b.batch.edge_index_per_layer]
        t2 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = pair_loss(model(x, ei, b.batch.batch_size, b.pair_index, deg=deg), pos.shape[1])
        (loss * (world.size / max(total, 1.0))).backward()  # DDP averages: the gradient of the world's mean
        opt.step()
        t3 = time.perf_counter()
        value = float(loss.detach())
        sums += torch.tensor([value, k], dtype=torch.float64)
        times["sample_s"] += t1 - t0
        times["gather_s"] += t2 - t1
        times["compute_s"] += t3 - t2
        emit({"kind": "step", "epoch": epoch, "step": step, "steps": n, "seeds": int(k), "world_pairs": int(total),
              "loss": value / k if k else 0.0, "loss_sum": value, "step_s": t3 - t0})
    after = rows.features.totals()
    tiers = {k: {"rows": r - before.get(k, (0, 0))[0], "bytes": b - before.get(k, (0, 0))[1]}
             for k, (r, b) in after.items()}
    rank_pairs = int(sums[1])
    world.all_reduce(sums, during=f"epoch {epoch}: summing the loss")
    epoch_s = time.perf_counter() - t_epoch
    return {"kind": "epoch", "epoch": epoch, "steps": n, "loss": float(sums[0] / max(float(sums[1]), 1.0)),
            "pairs": int(sums[1]), "rank_pairs": rank_pairs, "epoch_s": epoch_s,
            "pairs_per_s": float(sums[1]) / epoch_s if epoch_s > 0 else 0.0, "tiers": tiers, **times}
