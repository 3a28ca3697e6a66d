"""Which GPU each rank trains on: CUDA ordinals, PCI bus addresses, and the plan's partitions.

A CUDA ordinal (``cuda:1``) is not a GPU of the plan: the CUDA runtime orders
devices fastest first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, NVML in PCI
order, and ``CUDA_VISIBLE_DEVICES`` renumbers them. The one name they share is
the PCI bus address, which the plan's GPU node ids carry
(``pci:0000:07:00.0``) and which :func:`cuda_bus_addresses` reads for each
visible ordinal: from ``torch.cuda.get_device_properties`` (``pci_domain_id``,
``pci_bus_id``, ``pci_device_id``, in PyTorch versions that expose them), else
by matching the device's UUID with NVML's (``nvidia-ml-py``).

:func:`rank_device` is where a rank trains: ``cuda:0`` when the launcher
shows each process one GPU, else ``cuda:LOCAL_RANK``, or the GPU at the bus
address its partition was planned for. :func:`partition_of_rank` says which
GPU bins of a partitioned placement a rank holds. Not run on a GPU in this
project; the functions take the CUDA facts as arguments so they are tested
here.

>>> partition_of_rank(["cuda:0", "cuda:1", "cuda:2", "cuda:3"], local_rank=1, local_world_size=2)
[1, 3]
>>> str(rank_device(local_rank=3, visible=1))
'cuda:0'
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from planner.hostinfo import props_bus_address
from planner.topology.nvidia.nvml import NvmlError, normalize_bus_id
from training.errors import TrainingError
from training.vocab import SAMPLE_ON

_BUS = re.compile(r"([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])")


class DeviceError(TrainingError):
    """No GPU fits what a rank was asked to use (LOCAL_RANK, a planned bus address)."""


def bus_address_in(text: str | None) -> str | None:
    """The PCI bus address inside a node id or store id (``cache:pci:0000:07:00.0``), normalised.

    >>> bus_address_in("cache:pci:00000000:B7:00.0"), bus_address_in("cache:gpu0")
    ('0000:b7:00.0', None)
    """
    m = _BUS.search(text or "")
    if not m:
        return None
    try:
        return normalize_bus_id(m.group(1))
    except NvmlError:
        return None


def _nvml_bus_by_uuid() -> dict[str, str]:
    """NVML's GPU UUID (without ``GPU-``, lower case) → bus address; empty without NVML."""
    try:
        import pynvml  # optional: nvidia-ml-py
    except ImportError:
        return {}
    out: dict[str, str] = {}
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver: NVMLError, OSError
        return {}
    try:
        for i in range(int(pynvml.nvmlDeviceGetCount())):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            out[uuid.lower().removeprefix("gpu-")] = normalize_bus_id(pynvml.nvmlDeviceGetPciInfo(h).busId)
    except Exception:  # a partial answer is still an answer
        pass
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    return out


def cuda_bus_addresses(props: Sequence[Any] | None = None,
                       nvml_by_uuid: Mapping[str, str] | None = None) -> dict[int, str]:
    """Bus address of each visible CUDA ordinal that has one (``{0: "0000:07:00.0", ...}``).

    ``props`` (default: ``torch.cuda.get_device_properties`` of each visible
    device) and ``nvml_by_uuid`` (default: asked of NVML when needed) are
    parameters for tests.
    """
    if props is None:
        props = ([torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
                 if torch.cuda.is_available() else [])
    out: dict[int, str] = {}
    missing = []
    for i, p in enumerate(props):
        bus = props_bus_address(p)
        if bus is not None:
            out[i] = bus
        else:
            missing.append(i)
    if missing:
        by_uuid = nvml_by_uuid if nvml_by_uuid is not None else _nvml_bus_by_uuid()
        for i in missing:
            uuid = str(getattr(props[i], "uuid", "")).lower().removeprefix("gpu-")
            if uuid and uuid in by_uuid:
                out[i] = by_uuid[uuid]
    return out


def rank_device(local_rank: int = 0, visible: int | None = None, bus: str | None = None,
                buses: Mapping[int, str] | None = None) -> torch.device:
    """The CUDA device a rank trains on.

    ``visible``: CUDA devices this process sees (default: ask torch). One
    visible device is this rank's whatever ``local_rank`` says (a launcher
    that sets ``CUDA_VISIBLE_DEVICES`` per process); otherwise
    ``cuda:local_rank``, unless ``bus`` (the bus address the rank's partition
    was planned for) names a visible GPU: then that one. ``buses``: the
    ordinals' addresses (default :func:`cuda_bus_addresses`).
    """
    if visible is None:
        visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if visible < 1:
        raise DeviceError("no CUDA device is visible to this process")
    if bus is not None:
        buses = cuda_bus_addresses() if buses is None else buses
        for i, b in buses.items():
            if b == bus and i < visible:
                return torch.device("cuda", i)
        if buses:
            raise DeviceError(f"the placement puts this rank's GPU partition on the GPU at {bus}, which this "
                              f"process does not see (visible: {', '.join(sorted(buses.values()))}); run on "
                              "the planned machine or place with `gpu_mode=replicate`")
    if visible == 1:
        return torch.device("cuda", 0)
    if not 0 <= local_rank < visible:
        raise DeviceError(f"LOCAL_RANK={local_rank} but this process sees {visible} CUDA device(s): start at "
                          "most one rank per GPU, or give each process one GPU (CUDA_VISIBLE_DEVICES)")
    return torch.device("cuda", local_rank)


def rank_devices(planned: Sequence[str | None], visible: int | None = None,
                 buses: Mapping[int, str] | None = None) -> list[torch.device]:
    """Every local rank's CUDA device, decided alike in each rank so that no two ranks share a GPU.

    ``planned[r]``: the bus address rank ``r``'s GPU partition was planned for,
    or None. A rank with a planned GPU gets it (as :func:`rank_device`); the
    others take, in rank order, the lowest ordinals no planned rank holds.
    (Each rank deciding alone, ``cuda:LOCAL_RANK`` for a plain rank, could land
    on the GPU a partition rank was planned onto.) One visible device is every
    rank's (a launcher that gives each process its own GPU).

    >>> [str(d) for d in rank_devices(["0000:02:00.0", "0000:03:00.0", None],
    ...                               buses={0: "0000:01:00.0", 1: "0000:02:00.0", 2: "0000:03:00.0"})]
    ['cuda:1', 'cuda:2', 'cuda:0']

    Raises
    ------
    DeviceError
        No CUDA device is visible, more ranks than GPUs, a planned GPU is not
        visible, or two ranks were planned onto one GPU.
    """
    if visible is None:
        visible = len(buses) if buses is not None else (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    if visible == 1:
        return [torch.device("cuda", 0)] * len(planned)
    fixed = {r: rank_device(r, visible, bus, buses if buses is not None else cuda_bus_addresses()).index
             for r, bus in enumerate(planned) if bus is not None}
    if len(set(fixed.values())) != len(fixed):
        raise DeviceError("two local ranks' GPU partitions were planned onto one GPU; place again for this "
                          "number of ranks per node")
    free = iter(i for i in range(visible) if i not in fixed.values())
    out = []
    for r in range(len(planned)):
        i = fixed.get(r)
        if i is None:
            i = next(free, None)
            if i is None:
                raise DeviceError(f"{len(planned)} local ranks but this process sees {visible} CUDA device(s): "
                                  "start at most one rank per GPU")
        out.append(torch.device("cuda", int(i)))
    return out


def partition_of_rank(gpu_bin_devices: Sequence[str | None], local_rank: int, local_world_size: int) -> list[int]:
    """Positions (among the GPU bins) of the partitions a rank holds: every ``local_world_size``-th from its rank.

    A replicated cache (one GPU bin, device ``cuda``) is every rank's.
    """
    devs = list(gpu_bin_devices)
    if len(devs) <= 1 or local_world_size <= 1:
        return list(range(len(devs)))
    return [i for i in range(len(devs)) if i % local_world_size == local_rank]


#: share of free GPU memory the graph may take when sampling moves to the GPU (the rest: model, batches)
SAMPLE_SHARE = 0.5


def sampling_device(asked: str, device: torch.device, need_bytes: int, free_bytes: int | None
                    ) -> tuple[torch.device, str]:
    """Where to sample, and why: the training GPU when the CSR (and its lookups) fit, else the host.

    ``asked``: ``auto``, ``cpu`` or ``gpu`` (``gpu`` that cannot be honoured
    is a :class:`DeviceError`). ``need_bytes``: the graph's bytes on the
    device; ``free_bytes``: the device's free memory now (after its caches).

    >>> sampling_device("auto", torch.device("cuda", 0), 6 << 30, 40 << 30)
    (device(type='cuda', index=0), 'the graph (6.0 GiB) fits in cuda:0 (40.0 GiB free)')
    >>> sampling_device("auto", torch.device("cpu"), 1, None)[1]
    'no CUDA device'
    """
    if asked not in SAMPLE_ON:
        raise DeviceError(f"sample on {asked!r}: expected one of {', '.join(SAMPLE_ON)}")
    cpu = torch.device("cpu")
    if asked == "cpu":
        return cpu, "asked for"
    if device.type != "cuda":
        if asked == "gpu":
            raise DeviceError("`sample_on` gpu: this run has no CUDA device; use `sample_on` auto or cpu")
        return cpu, "no CUDA device"
    gib = 2**30
    if free_bytes is None or need_bytes > SAMPLE_SHARE * free_bytes:
        why = (f"the graph needs {need_bytes / gib:.1f} GiB on {device}, more than {SAMPLE_SHARE:.0%} of its "
               f"{(free_bytes or 0) / gib:.1f} GiB free")
        if asked == "gpu":
            raise DeviceError(f"`sample_on` gpu: {why}; use `sample_on` auto or cpu")
        return cpu, why
    return device, f"the graph ({need_bytes / gib:.1f} GiB) fits in {device} ({free_bytes / gib:.1f} GiB free)"
