"""The arithmetic a run trains in: float32, or mixed precision fed rows in their stored type.

``precision`` (:data:`training.vocab.PRECISIONS`, Lightning's names):

* ``32``: everything in float32 (the default). Rows stored as float16,
  bfloat16 or int8 are widened to float32 where they land (the gather's cast on
  the device, :meth:`iostack.store.FeatureStore.gather_landing`).
* ``bf16-mixed``: the forward (and evaluation) under :func:`torch.autocast` to
  bfloat16, on CUDA or on the CPU; parameters, gradients and the optimiser stay
  float32 (autocast's own rule). Rows stored as float16 or bfloat16 stay in
  that type through the gather into the model; int8 rows (and a dataset's
  integer features) are decoded on the rank's device straight into bfloat16,
  one ``addcmul`` over the gathered block and one cast (the codec's
  :meth:`~iostack.codec.FeatureCodec.decode`), never a float32 copy in the batch.
* ``16-mixed``: autocast to float16, the loss scaled (:class:`torch.amp.GradScaler`:
  a step whose gradients overflow is skipped and the scale lowered, instead of
  the run stopping on a non-finite gradient). float16 and bfloat16 rows stay as
  stored; int8 rows become float32 (their decoded range may pass float16's
  65504; autocast narrows them in the first matrix product).

Through a cache that fills on access (``cache_policy``, :mod:`training.cached_features`) the rows are
held in the cache as float32 (what its fill source returns) and cast to the rows' type where the batch
lands; a sharded placement holds the features' own type.

Which operations autocast narrows is torch's list (matrix products, linear
layers); the rest (sums, softmax, the loss) run in float32 there. Autocast
on the CPU needs no hardware support, but is only faster where the CPU has
bfloat16 instructions (AMX, AVX512-BF16): ``tools/bench_mixed_precision.py``
measures it beside float32.

>>> p = Precision.of("bf16-mixed", "cpu")
>>> p.mixed, p.rows_dtype("float16"), p.rows_dtype("int8"), p.rows_dtype("float32")
(True, torch.float16, torch.bfloat16, torch.float32)
>>> Precision.of("32", "cuda").rows_dtype("bfloat16")
torch.float32
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from training.errors import TrainError
from training.vocab import PRECISIONS

__all__ = ["Precision", "StepScaler"]

#: autocast's compute type per precision (``None``: no autocast)
_COMPUTE: dict[str, torch.dtype | None] = {"32": None, "bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}
#: stored row types that reach the model as they are under mixed precision
_KEPT = {"float16": torch.float16, "bfloat16": torch.bfloat16}
#: integer row types decoded (or cast) on the device into the compute type: -128..255 are exact in both
_INTEGER = ("int8", "uint8")


@dataclass(frozen=True)
class Precision:
    """A run's precision (``name``, :data:`~training.vocab.PRECISIONS`) on a device of ``device_type``
    (``cuda`` or ``cpu``, where autocast runs); ``compute``: autocast's type (``None``: float32, none)."""

    name: str = "32"
    device_type: str = "cpu"
    compute: torch.dtype | None = None

    @classmethod
    def of(cls, name: str, device_type: str) -> Precision:
        """The precision ``name`` on a device of ``device_type``.

        Raises
        ------
        TrainError
            ``name`` is not one of :data:`~training.vocab.PRECISIONS`.
        """
        if name not in PRECISIONS:
            raise TrainError(f"`precision` {name!r}: expected one of {', '.join(PRECISIONS)}")
        return cls(name, "cuda" if device_type == "cuda" else "cpu", _COMPUTE[name])

    @property
    def mixed(self) -> bool:
        return self.compute is not None

    @property
    def scaled(self) -> bool:
        """Whether the loss is scaled (float16: its gradients underflow and overflow without it)."""
        return self.compute == torch.float16

    def rows_dtype(self, stored: str | None) -> torch.dtype:
        """The type the gathered rows of ``stored`` type (a numpy or storage name) reach the model in."""
        if self.compute is None or stored is None:
            return torch.float32
        if stored in _KEPT:
            return _KEPT[stored]
        if stored in _INTEGER and self.compute == torch.bfloat16:
            return torch.bfloat16
        return torch.float32

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """The forward's context: :func:`torch.autocast` to :attr:`compute`, or nothing for float32."""
        if self.compute is None:
            yield
            return
        with torch.autocast(self.device_type, dtype=self.compute):
            yield


class StepScaler:
    """A step's backward and update under ``precision``: :class:`torch.amp.GradScaler` for float16, else plain.

    With a scaler a step whose gradients hold an infinity or a NaN is skipped
    (and the scale halved), so the trainer refuses only a non-finite loss;
    DDP's gradients are the same on every rank, so every rank skips the same
    steps. Its state is not checkpointed: a resumed float16 run starts again at
    the initial scale (2^16), which the scaler lowers within a few steps.
    """

    def __init__(self, precision: Precision) -> None:
        self.precision = precision
        self.scaler = torch.amp.GradScaler(precision.device_type) if precision.scaled else None

    @property
    def skips_overflow(self) -> bool:
        """Whether a step with non-finite gradients is skipped here (the trainer then checks the loss only)."""
        return self.scaler is not None

    def backward(self, loss: Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)  # unscales, and skips the update when a gradient overflowed
        self.scaler.update()
