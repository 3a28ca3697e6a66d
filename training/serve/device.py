"""Batches of CUDA tensors handed from a sampler worker to a trainer by CUDA IPC, as the paper's server does.

When a worker samples on a GPU (``moment serve --device cuda``), copying the batch to
host memory and back would cost two PCIe trips. Instead the worker sends the tensors'
CUDA IPC handles: :func:`pack_device_batch` pickles them with
``torch.multiprocessing``'s reductions (``ForkingPickler``: ``cudaIpcGetMemHandle`` of
each tensor's storage, plus the ref-count and event handles that keep it alive and
ordered), :func:`unpack_device_batch` rebuilds the tensors in the trainer
(``cudaIpcOpenMemHandle``): same device memory, no copy. torch keeps a sent block in its
"limbo" until every receiver has dropped it, so the worker may free its references at
once; the worker process itself must outlive the trainer's use of the batch, which the
server guarantees by keeping its workers until it stops.

Not run on this project's machines (no GPU): :func:`device_handover_available` says why
not, and the server refuses ``device="cuda"`` with that reason. The CPU path
(:mod:`training.serve.ring`) is the one tested here.

>>> device_handover_available("cpu")
'the batches are on the CPU: they go through the shared-memory ring'
"""

from __future__ import annotations

import io
import pickle

import torch

from training.sampler import SampledBatch


def device_handover_available(device: str | torch.device) -> str | None:
    """None when batches sampled on ``device`` can be handed over by CUDA IPC here, else why not."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return f"the batches are on the {dev.type.upper()}: they go through the shared-memory ring"
    if not torch.cuda.is_available():
        return "CUDA is not available on this machine"
    return None


def worker_devices(device: str, workers: int | None, visible: int, cpus: int) -> list[str]:
    """The device of each sampler worker: ``cpu`` for every one of ``workers`` (default ``cpus``), or one
    worker per GPU (``cuda:0``, ``cuda:1``, ...; default every ``visible`` GPU).

    A CUDA worker holds the whole CSR in its GPU's memory and a CUDA context of its own, so
    two on one GPU would double both for no gain: more workers than GPUs is refused
    (:class:`ValueError`, the server words it).

    >>> worker_devices("cuda", None, 2, 64), worker_devices("cpu", None, 2, 3)
    (['cuda:0', 'cuda:1'], ['cpu', 'cpu', 'cpu'])

    Raises
    ------
    ValueError
        ``workers`` is above ``visible`` GPUs for a CUDA device.
    """
    if torch.device(device).type != "cuda":
        return ["cpu"] * (cpus if workers is None else int(workers))
    count = visible if workers is None else int(workers)
    if count > visible:
        raise ValueError(f"{count} workers on {visible} GPU(s): at most one sampler worker per GPU (each holds "
                         "the whole graph in its GPU's memory)")
    return [f"cuda:{i}" for i in range(count)]


def pack_device_batch(batch: SampledBatch) -> bytes:
    """The CUDA IPC handles of ``batch``'s tensors (bytes to send to a process on the same host)."""
    if batch.n_id.device.type != "cuda":
        raise ValueError(f"pack_device_batch needs CUDA tensors, got {batch.n_id.device}")
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401 - registers the CUDA IPC reductions with ForkingPickler

    buf = io.BytesIO()
    ForkingPickler(buf, pickle.HIGHEST_PROTOCOL).dump((batch.n_id, batch.edge_index))
    return buf.getvalue()


def unpack_device_batch(payload: bytes, *, batch_size: int, counts: tuple[int, ...]) -> SampledBatch:
    """The batch whose tensors :func:`pack_device_batch` sent: opened from their IPC handles, no copy."""
    import torch.multiprocessing  # noqa: F401 - the rebuild functions live there

    n_id, edge_index = pickle.loads(payload)
    layers = (len(counts) - 1) // 2
    return SampledBatch(n_id, int(batch_size), edge_index, tuple(counts[:layers + 1]), tuple(counts[layers + 1:]))
