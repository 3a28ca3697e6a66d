"""The specs of training (training/specs.py) and placement (training/place/specs.py), and what `train()` takes
as objects: a batch source, a feature source."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from hypothesis import given, settings

from iostack.transfer import Gathered, Transfer
from tests.conftest import REPO
from training.batches import LocalBatchSource, num_steps
from training.data import open_dataset
from training.errors import TrainError
from training.features import MemoryFeatures
from training.place.bins import PlacingError
from training.place.specs import PlaceSpec, PolicySpec, ShardSpec, TierSpec
from training.sampler import NeighborSampler, SampledBatch
from training.specs import (
    RECORD_FIELDS,
    DistributedSpec,
    IOSpec,
    ModelSpec,
    RunSpec,
    SamplingSpec,
    TrainSpec,
)
from training.synth import SynthSpec
from training.synth_run import synthesize
from training.trainer import train

OLD_CHECKPOINT = REPO / "tests" / "data" / "checkpoint-before-specs" / "checkpoint.pt"
#: the dataset the old checkpoint was trained on (tests/data/checkpoint-before-specs/SOURCE.md)
OLD_DATASET = SynthSpec(num_nodes=300, num_edges=2400, feature_dim=8, num_classes=4, train_share=0.3,
                        valid_share=0.1, test_share=0.1, seed=5)


@pytest.fixture(scope="module")
def graph(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("specs")
    return synthesize(d / "ds", OLD_DATASET).path


def _small(dataset: Path, **run) -> TrainSpec:
    return TrainSpec(str(dataset), model=ModelSpec(hidden=8), sampling=SamplingSpec(fanouts=(4, 4), batch_size=40),
                     run=RunSpec(seed=2, **run))


def _params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_same(a: torch.nn.Module, b: torch.nn.Module) -> None:
    pa, pb = _params(a), _params(b)
    assert pa.keys() == pb.keys()
    for k in pa:
        assert torch.equal(pa[k], pb[k]), k


# ----------------------------------------------------------------------------------------------
# the specs and their record


def test_record_is_the_flat_dict_it_always_was():
    """Metrics' start records and checkpoints hold the run's settings under these names, in this order."""
    d = TrainSpec("ds").to_dict()
    # 36 until cache_policy, dynamic_cache; then check_dataset, precision; then partition; then the three
    # of re-placement while training (replace_every, replace_count_every, replace_min_gain); then dynamic_cache_on
    assert tuple(d) == RECORD_FIELDS and len(RECORD_FIELDS) == 45
    assert d["model"] == "sage" and d["remote_cache"] == 0 and d["fanouts"] == [25, 10]
    json.dumps(d)  # JSON as it is
    spec_fields = sum(len(dataclasses.fields(c)) for c in (ModelSpec, SamplingSpec, IOSpec, DistributedSpec, RunSpec))
    assert spec_fields + 1 == len(RECORD_FIELDS)  # every spec field is in the record, once


@settings(max_examples=60, deadline=None)
@given(arch=st.sampled_from(["sage", "gat", "gcn"]), hidden=st.none() | st.integers(1, 512),
       fanouts=st.lists(st.integers(-1, 30).filter(bool), min_size=1, max_size=4),
       batch=st.integers(1, 10_000), prefetch=st.integers(0, 8), seed=st.integers(0, 2**31),
       placement=st.none() | st.text(st.characters(codec="utf-8"), min_size=1, max_size=20),
       timeout=st.floats(1e-3, 1e6), cache=st.integers(0, 2**40))
def test_record_round_trips(arch, hidden, fanouts, batch, prefetch, seed, placement, timeout, cache):
    spec = TrainSpec(
        "ds",
        model=ModelSpec(arch, hidden=hidden),
        sampling=SamplingSpec(tuple(fanouts), batch_size=batch),
        io=IOSpec(placement=placement, prefetch=prefetch, remote_cache_bytes=cache),
        distributed=DistributedSpec(timeout),
        run=RunSpec(seed=seed),
    )
    assert TrainSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


@pytest.mark.parametrize("make, match", [
    (lambda: ModelSpec("gin"), "`arch` 'gin': expected one of"),
    (lambda: ModelSpec(hidden=0), "hidden"),
    (lambda: ModelSpec(gcn_norm="sym"), "gcn_norm"),
    (lambda: ModelSpec("sage", attn_dropout=0.1), "GAT model only"),
    (lambda: SamplingSpec(fanouts=(10, 0)), "fanouts"),
    (lambda: SamplingSpec(fanouts=(10, 5), eval_fanouts=(5,)), "one per layer"),
    (lambda: SamplingSpec(batch_size=0), "batch_size"),
    (lambda: SamplingSpec(sample_on="tpu"), "sample_on"),
    (lambda: SamplingSpec(server_timeout_s=0), "server_timeout_s"),
    (lambda: IOSpec(backend="spdk"), "backend"),
    (lambda: IOSpec(prefetch=-1), "prefetch"),
    (lambda: IOSpec(exchange="mpi"), "exchange"),
    (lambda: IOSpec(remote_cache_bytes=-1), "remote_cache"),
    (lambda: DistributedSpec(timeout_s=float("inf")), "timeout_s"),
    (lambda: RunSpec(epochs=0), "epochs"),
    (lambda: RunSpec(lr=float("nan")), "lr"),
    (lambda: RunSpec(checkpoint_every_steps=-1), "checkpoint_every_steps"),
    (lambda: TrainSpec("ds", model=SamplingSpec()), "`model`: expected a ModelSpec"),
    (lambda: TrainSpec.from_dict({"dataset": "ds", "fanout": [5]}), "unknown field.*fanout"),
    (lambda: TrainSpec.from_dict({"model": "sage"}), "no dataset"),
])
def test_each_spec_refuses_bad_values_in_one_line(make, match):
    with pytest.raises(TrainError, match=match) as info:
        make()
    assert "\n" not in str(info.value)


def test_paths_are_kept_as_strings(tmp_path):
    spec = TrainSpec(tmp_path, io=IOSpec(placement=tmp_path / "p"), run=RunSpec(checkpoint_dir=tmp_path / "ck"))
    assert spec.dataset == str(tmp_path) and spec.io.placement == str(tmp_path / "p")
    assert spec.run.checkpoint_dir == str(tmp_path / "ck")


# ----------------------------------------------------------------------------------------------
# checkpoints written before the specs


def test_a_checkpoint_written_before_the_specs_resumes_exactly(graph, tmp_path):
    """The old checkpoint (epoch 1 of 2) resumes; the run ends where an uninterrupted run of today's code does."""
    ck = tmp_path / "ck"
    ck.mkdir()
    shutil.copy(OLD_CHECKPOINT, ck / "checkpoint.pt")
    old = torch.load(ck / "checkpoint.pt", weights_only=False)
    assert old["config"]["batch_size"] == 40 and "sampling" not in old["config"]  # the flat record of before
    resumed = train(_small(graph, epochs=2, checkpoint_dir=str(ck), resume=True))
    whole = train(_small(graph, epochs=2))
    assert resumed.resumed_from == (1, 0) and len(resumed.epochs) == 1
    _assert_same(resumed.model, whole.model)
    with pytest.raises(TrainError, match="hidden=8, this run has 16"):  # its settings still guard it
        train(dataclasses.replace(_small(graph, epochs=3, checkpoint_dir=str(ck), resume=True),
                                  model=ModelSpec(hidden=16)))


# ----------------------------------------------------------------------------------------------
# a batch source and a feature source handed to train()


class DegreeOrderedSource:
    """A user's sampler: every epoch the training seeds in one fixed order, highest degree first."""

    def __init__(self, indptr: np.ndarray, indices: np.ndarray, train_idx: np.ndarray, batch_size: int,
                 fanouts: tuple[int, ...]) -> None:
        self.sampler = NeighborSampler(torch.from_numpy(np.asarray(indptr)), torch.from_numpy(np.asarray(indices)),
                                       fanouts, seed=0)
        degree = np.diff(np.asarray(indptr))[train_idx]
        self.order = torch.from_numpy(train_idx[np.argsort(-degree, kind="stable")])
        self.batch_size = batch_size
        self.closed = False

    def steps(self, epoch: int) -> int:
        return num_steps(self.order.numel(), self.batch_size)

    def batches(self, epoch: int, start_step: int = 0) -> Iterator[SampledBatch]:
        for step in range(start_step, self.steps(epoch)):
            self.sampler.reseed(1000 * epoch + step)
            yield self.sampler.sample(self.order[step * self.batch_size:(step + 1) * self.batch_size])

    def close(self) -> None:
        self.closed = True


class RowsInMemory:
    """A user's feature store: a float32 tensor, every gathered id noted."""

    def __init__(self, x: np.ndarray) -> None:
        self.x = torch.from_numpy(np.array(x, dtype=np.float32))
        self.dim, self.transfer = int(self.x.shape[1]), Transfer()
        self.gathered: list[torch.Tensor] = []
        self.closed = False

    def gather(self, ids: torch.Tensor) -> torch.Tensor:
        return self.gather_landing(ids).rows

    def gather_landing(self, ids: torch.Tensor, dtype: torch.dtype | None = None) -> Gathered:
        self.gathered.append(ids.clone())
        rows = self.x.index_select(0, ids)
        return Gathered(rows if dtype is None else rows.to(dtype), None)

    def totals(self) -> dict[str, tuple[int, int]]:
        n = sum(int(i.numel()) for i in self.gathered)
        return {"mine": (n, n * self.dim * 4)}

    def close(self) -> None:
        self.closed = True


def test_train_takes_a_users_batch_source_and_feature_source(graph):
    ds = open_dataset(graph)
    train_idx = np.asarray(ds.train_idx, np.int64)
    source = DegreeOrderedSource(ds.indptr, ds.indices, train_idx, 40, (4, 4))
    rows = RowsInMemory(ds.features)
    starts: list[dict] = []
    res = train(_small(graph, epochs=3, eval_every_epochs=0), source=source, features=rows,
                progress=lambda r: starts.append(r) if r["kind"] == "start" else None)
    steps = source.steps(0)
    assert [r["steps"] for r in res.epochs] == [steps] * 3 and res.epochs[0]["seeds"] == train_idx.size
    # the trainer gathered the source's batches in its order: the seeds come first in each batch's ids
    firsts = [ids[:40] for ids in rows.gathered[:steps]]
    assert torch.equal(torch.cat(firsts), source.order)
    assert set(res.final["tiers"]) == {"mine"} and res.final["tiers"]["mine"]["rows"] > train_idx.size
    assert starts[0]["sampling"]["device"] == "DegreeOrderedSource" and starts[0]["features"] == "RowsInMemory"
    assert res.epochs[-1]["loss"] < res.epochs[0]["loss"]
    assert not source.closed and not rows.closed  # the caller's to close


def test_handed_in_objects_train_what_the_spec_builds(graph):
    """The same source and features as objects: byte-identical parameters to the run that builds them."""
    spec = _small(graph, epochs=2)
    ds = open_dataset(graph)
    sampler = NeighborSampler(torch.from_numpy(np.asarray(ds.indptr)), torch.from_numpy(np.asarray(ds.indices)),
                              spec.sampling.fanouts, seed=spec.run.seed)
    source = LocalBatchSource(sampler, np.asarray(ds.train_idx), spec.sampling.batch_size, seed=spec.run.seed)
    given_in = train(spec, source=source, features=MemoryFeatures(ds.features))
    built = train(spec)
    _assert_same(given_in.model, built.model)
    assert [r["loss"] for r in given_in.epochs] == [r["loss"] for r in built.epochs]


# ----------------------------------------------------------------------------------------------
# the placement's specs (training/place/specs.py)


@pytest.mark.parametrize("make, match", [
    (lambda: TierSpec(gpu_cache_bytes=-1), "gpu_cache_bytes"),
    (lambda: TierSpec(gpu_mode="stripe"), "`gpu_mode` 'stripe'"),
    (lambda: PolicySpec("best"), "`strategy` 'best'"),
    (lambda: PolicySpec(pool=0), "`pool` 0"),
    (lambda: ShardSpec(nodes=0), "`nodes` 0"),
    (lambda: ShardSpec(nodes=2, replicas=3), "`replicas` 3: expected 1 to `nodes`"),
    (lambda: ShardSpec(nodes=2, hot_rows=1.5), "`hot_rows` 1.5"),
    (lambda: PlaceSpec(feature_dtype="float8"), "`feature_dtype` 'float8'"),
    (lambda: PlaceSpec(shards=ShardSpec(nodes=2), feature_dtype="int8"), "`feature_dtype` with `nodes` > 1"),
    (lambda: PlaceSpec(shards=ShardSpec(nodes=2), in_place=True), "`in_place` with `nodes` > 1"),
    (lambda: PlaceSpec(feature_dtype="int8", in_place=True), "`in_place` with `feature_dtype`"),
    (lambda: PlaceSpec(tiers=PolicySpec()), "`tiers`: expected a TierSpec"),
])
def test_each_placement_spec_refuses_bad_values_in_one_line(make, match):
    with pytest.raises(PlacingError, match=match) as info:
        make()
    assert "\n" not in str(info.value)


def test_tier_spec_keeps_ssd_directories_as_strings(tmp_path):
    tiers = TierSpec(ssd_dirs=[tmp_path / "a", str(tmp_path / "b")])
    assert tiers.ssd_dirs == (str(tmp_path / "a"), str(tmp_path / "b"))
    assert ShardSpec(nodes=2, hot_rows=0.1).hot_row_count(300) == 30
