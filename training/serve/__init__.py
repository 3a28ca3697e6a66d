"""The sampling server: one process owns the graph and serves sampled mini-batches to trainers.

``moment serve --dataset DIR`` runs a :class:`SamplingServer`; ``moment train --server
HOST:PORT`` reads its batches through a :class:`RemoteBatchSource`, which implements
:class:`training.batches.BatchSource`. A batch is a pure function of ``(seed, epoch,
rank, world_size, step)`` (a sampler is reseeded exactly as
:class:`~training.batches.LocalBatchSource` does), so a trainer fed by the server gets
bit-identical batches to one that samples locally, and a resumed trainer asking for
epoch ``e`` from step ``s`` gets what the uninterrupted run got.

**Who owns the parameters.** The server is started with the sampling parameters
(fan-outs, global batch size, shuffle seed); the client passes its own and the server
refuses a trainer whose parameters differ, naming each one and both values
(:class:`ServerError`). The trainer's ``shuffle``, ``rank`` and ``world_size`` are its
own; every trainer registered at one time must agree on ``world_size`` and hold a
distinct rank (one job per server).

**Design.** Sampling runs in worker processes (one per CPU by default), not in threads
of the server: threads of one interpreter share its GIL. Control — registration,
pings, membership — goes over ``torch.distributed.rpc``; data does not. A trainer on
the server's host lends each worker its ring of preallocated batch slots in shared
memory and sends its requests over a Unix socket, a chunk of them in one message of 33
bytes per request; a worker samples the requests waiting for it (every trainer's) in one
pass (:class:`training.fused.FusedSampler`: the per-operation overhead of a batch paid
once per pass, each batch still bit-identical) straight into the slots they name, and
replies with the batches' shapes, one message per trainer and pass; the trainer's
tensors are views of the slot (no copy, no pickling), and the slot is reused once they
are freed. On CUDA the paper
hands device tensors over by CUDA IPC; so does :mod:`training.serve.device` (not run
here: no GPU). A trainer on another host gets its batches copied through rpc.

The modules, by job: :mod:`~training.serve.protocol` (parameters, records, errors,
wire formats), :mod:`~training.serve.ring` (the shared-memory ring),
:mod:`~training.serve.workers` (the sampler processes and what they sample),
:mod:`~training.serve.device` (CUDA IPC), :mod:`~training.serve.membership` (torch's
dynamic rpc group), :mod:`~training.serve.server`, :mod:`~training.serve.client`.

**Failures.** A dead or hung server makes the trainer's next batch raise
:class:`ServerError` within ``timeout_s``; a killed one at once (its workers die with
it and their sockets close). A dead trainer costs the others nothing: its worker
connections close and its ring goes with them, and the server forgets it within a
ping interval or two. No shared memory outlives its processes: the ring's segments are
``memfd`` files with no name, freed by the kernel with the last process mapping them.

>>> parse_address("localhost:29600")
('localhost', 29600)
"""

from training.serve.client import RemoteBatchSource
from training.serve.protocol import (
    DEFAULT_PORT,
    SamplingParams,
    ServerError,
    ServerEvent,
    TrainerInfo,
    parse_address,
)
from training.serve.server import SamplingServer

__all__ = [
    "DEFAULT_PORT",
    "RemoteBatchSource",
    "SamplingParams",
    "SamplingServer",
    "ServerError",
    "ServerEvent",
    "TrainerInfo",
    "parse_address",
]
