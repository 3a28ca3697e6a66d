"""The model a ``moment train`` checkpoint holds, rebuilt for inference and checked against the dataset.

A checkpoint (:mod:`training.checkpoint`) records the run's settings
(``config``: model, hidden units, heads, GCN norm, fan-outs: one layer each,
feature normalisation) and the model's ``state_dict``. The input width and the
number of classes are read from the parameters themselves, so a checkpoint of
another dataset is refused in one line naming both shapes, before any row is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from training.checkpoint import CHECKPOINT_NAME, load_checkpoint
from training.errors import TrainingError
from training.models import _Sampled, build_model
from training.specs import ModelSpec, TrainSpec

__all__ = ["InferError", "LoadedModel", "load_model"]


class InferError(TrainingError):
    """Inference cannot run as asked: a checkpoint or dataset that does not fit, an output in the way."""


@dataclass(frozen=True)
class LoadedModel:
    """The model in evaluation mode, the settings it was trained with, its input width and classes."""

    model: _Sampled
    spec: ModelSpec
    path: Path
    trained_on: str
    in_dim: int
    num_classes: int

    @property
    def num_layers(self) -> int:
        return len(self.model.convs)


def _checkpoint_file(path: str | Path) -> Path:
    p = Path(path)
    if p.is_dir():
        p = p / CHECKPOINT_NAME
    if not p.is_file():
        raise InferError(f"`checkpoint` {path}: no such checkpoint (a `moment train` checkpoint directory or its "
                         f"{CHECKPOINT_NAME})")
    return p


def _shapes(state: dict) -> tuple[int, int, int]:
    """(input width, classes, layers) read from a model's ``state_dict``."""
    layers = 1 + max(int(k.split(".")[1]) for k in state if k.startswith("convs."))
    first = [v for k, v in state.items() if k.startswith("convs.0.") and k.endswith("weight") and v.dim() == 2]
    # every layer's output bias has one entry per output unit (SAGE's in lin_l, GCN's and GAT's its own)
    last = [v for k, v in state.items() if k.startswith(f"convs.{layers - 1}.") and k.endswith("bias")]
    if not first or not last:
        raise KeyError("convs")
    return int(first[0].shape[1]), int(last[0].shape[0]), layers


def load_model(path: str | Path, in_dim: int, num_classes: int, dataset: str) -> LoadedModel:
    """The model of the checkpoint at ``path`` (a file or its directory), for features of ``in_dim`` and
    ``num_classes`` classes (0: the dataset has no labels, take the checkpoint's).

    Raises
    ------
    InferError
        No checkpoint there, not one of ``moment train``'s, or trained for another feature width or class count
        (naming the dataset it was trained on and ``dataset``).
    TrainError
        An unreadable checkpoint file.
    """
    p = _checkpoint_file(path)
    ck = load_checkpoint(p)
    if not isinstance(ck, dict) or not {"config", "model"} <= set(ck) or not isinstance(ck["model"], dict):
        raise InferError(f"{p}: not a Moment training checkpoint (no model and settings in it); pass the "
                         "`checkpoint` of `moment train`")
    try:
        spec = TrainSpec.from_dict(ck["config"])
        want_dim, want_classes, layers = _shapes(ck["model"])
    except (KeyError, ValueError, TrainingError) as exc:
        raise InferError(f"{p}: its settings or parameters are not a model's ({exc}); pass the `checkpoint` "
                         "of `moment train`") from None
    trained_on = str(ck["config"].get("dataset", "?"))
    if want_dim != in_dim or (num_classes and want_classes != num_classes):
        raise InferError(f"{p}: trained on {trained_on} (features of dim {want_dim}, {want_classes} classes); "
                         f"{dataset} has features of dim {in_dim} and {num_classes} classes; infer with a "
                         "checkpoint of this dataset")
    if spec.sampling.layers != layers:
        raise InferError(f"{p}: its settings name {spec.sampling.layers} layers, its parameters hold {layers}; "
                         "pass the `checkpoint` of `moment train`")
    m = spec.model
    model = build_model(m.arch, want_dim, want_classes, layers, hidden=m.hidden, heads=m.heads,
                        out_heads=m.out_heads, dropout=m.dropout,
                        attn_dropout=m.attn_dropout if m.arch == "gat" else None,
                        norm=m.gcn_norm if m.arch == "gcn" else None)
    try:
        model.load_state_dict(ck["model"])
    except (RuntimeError, KeyError) as exc:
        why = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        raise InferError(f"{p}: its parameters do not fit a {m.arch} model of its own settings ({why})") from None
    model.eval()
    return LoadedModel(model, m, p, trained_on, want_dim, want_classes)
