"""Issue 34's defects found by reading the GPU path, each pinned by a test that failed before its fix.

No GPU here: each test drives the real code through a small local stand-in for the CUDA
facts it needs (a namespace in place of ``torch``, a monkeypatched call), never through a
faked GPU figure.
"""

from __future__ import annotations

import contextlib
import types

import pytest
import torch


class _Props:
    def __init__(self, name: str, uuid: str = "") -> None:
        self.name, self.uuid = name, uuid  # no pci_* fields: PyTorch before they were exposed


def _fake_cuda_torch(count: int, props: list[_Props], registered: list, pinned_asks: list):
    """A ``torch`` stand-in for hwprofile.cuda: real CPU tensors, CUDA calls recorded, events timed as 1 ms."""

    class Event:
        def __init__(self, enable_timing=False):
            pass

        def record(self):
            pass

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return 1.0

    class Cudart:
        def cudaHostRegister(self, ptr, n, flags):  # noqa: N802 - CUDA's name
            registered.append(("register", ptr, n))
            return 0

        def cudaHostUnregister(self, ptr):  # noqa: N802 - CUDA's name
            registered.append(("unregister", ptr))
            return 0

    def empty(n, dtype=None, device=None, pin_memory=False):
        if pin_memory:
            pinned_asks.append(n)
        return torch.empty(n, dtype=dtype)

    cuda = types.SimpleNamespace(
        is_available=lambda: True, device_count=lambda: count, get_device_properties=lambda i: props[i],
        device=lambda i: contextlib.nullcontext(), Event=Event, cudart=lambda: Cudart(),
        can_device_access_peer=lambda i, j: False)
    return types.SimpleNamespace(cuda=cuda, empty=empty, from_numpy=torch.from_numpy, uint8=torch.uint8)


def test_profiled_gpus_get_their_own_pinned_block_and_distinct_keys(monkeypatch):
    """Defects 8 and 11f: every GPU's host buffer is freshly allocated (first-touched on its node) and
    page-locked in place, not a block PyTorch's caching host allocator kept from GPU 0; and two GPUs of
    one model without bus addresses (older torch) get different keys."""
    import sys

    from hwprofile import cuda as hc

    registered: list = []
    pinned_asks: list = []
    fake = _fake_cuda_torch(2, [_Props("H200"), _Props("H200")], registered, pinned_asks)
    monkeypatch.setitem(sys.modules, "torch", fake)
    links, _, notes = hc.cuda_bandwidths(bytes=1 << 16, repeats=1)
    assert pinned_asks == []  # the caching host allocator is never asked
    regs = [r for r in registered if r[0] == "register"]
    assert len(regs) == 2 and all(r[2] == 1 << 16 for r in regs)
    assert sum(r[0] == "unregister" for r in registered) == 2  # each block unlocked after its GPU
    keys = {lk.device for lk in links if lk.link_class == "host-to-device"}
    assert len(keys) == 2, keys


def test_gpu_key_prefers_the_uuid():
    from hwprofile.cuda import _gpu_node

    assert _gpu_node(None, _Props("A100", "GPU-abc"), 3) == ("cuda:GPU-abc:A100", None)
    assert _gpu_node(None, _Props("A100"), 3) == ("cuda:3:A100", None)


def test_cuda_serving_starts_one_worker_per_gpu_each_bound_to_it(tmp_path, monkeypatch):
    """Defect 2: `moment serve --device cuda` started one worker per CPU, each with a CUDA context and a whole
    CSR on GPU 0. Now one per GPU, each told its own GPU; more workers than GPUs is refused."""
    from training.serve import device as sd
    from training.serve import workers as sw
    from training.serve.protocol import SamplingParams
    from training.serve.server import SamplingServer, ServerError
    from training.synth import SynthSpec
    from training.synth_run import synthesize

    graph = tmp_path / "g"
    synthesize(graph, SynthSpec(num_nodes=500, num_edges=4000, feature_dim=4, train_share=0.5, seed=5))
    monkeypatch.setattr(sd, "device_handover_available", lambda device: None)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    started: list[list[str]] = []
    monkeypatch.setattr(sw.WorkerPool, "start", lambda self, timeout_s: started.append(list(self.devices)))
    server = SamplingServer(graph, SamplingParams(16, (2,)), device="cuda", port=0)
    assert server.workers == 3 and server.worker_devices == ["cuda:0", "cuda:1", "cuda:2"]
    with pytest.raises(ServerError, match="at most one sampler worker per GPU"):
        SamplingServer(graph, SamplingParams(16, (2,)), device="cuda", workers=4, port=0)
    assert SamplingServer(graph, SamplingParams(16, (2,)), device="cuda", workers=2, port=0).workers == 2
    # the pool hands each worker process its device (what serve_worker binds with torch.cuda.set_device)
    pool = sw.WorkerPool({"device": "cuda"}, ["a", "b"], ["cuda:0", "cuda:1"])
    assert pool.devices == ["cuda:0", "cuda:1"]
