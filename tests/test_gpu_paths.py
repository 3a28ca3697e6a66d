"""The trainer's GPU code paths on a CPU: a fake accelerator, device choice per rank, sampling placement.

Nothing here ran on a GPU (there is none): the fake device shows that data
flows through pinned staging and lands once, and that the results equal the
host run's; the device-choice functions take the CUDA facts as arguments.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from iostack.bins import write_bins
from iostack.placement import simple_placement
from moment.cli import main
from tests.conftest import flat_spec, graph_fixture
from tests.fake_cuda import FakeDeviceMemory
from training.data import open_dataset
from training.devices import (
    DeviceError,
    bus_address_in,
    cuda_bus_addresses,
    partition_of_rank,
    rank_device,
    sampling_device,
)
from training.errors import TrainError
from training.importers import import_dataset
from training.specs import IOSpec
from training.trainer import train

SMALL = dict(fanouts=(10, 5), batch_size=35, hidden=32, seed=3)


@pytest.fixture(scope="module")
def cora(tmp_path_factory):
    return import_dataset(graph_fixture("cora"), tmp_path_factory.mktemp("cora") / "cora")


@pytest.fixture(scope="module")
def cora_tiers(cora, tmp_path_factory):
    """All three tiers: a GPU bin, a CPU bin, an SSD bin."""
    ds = open_dataset(cora)
    d = tmp_path_factory.mktemp("tiers")
    p = simple_placement(ds.num_nodes, [("gpu", 300), ("cpu", 700), ("ssd", ds.num_nodes)])
    write_bins(ds.features, p, d, fsync=False)
    p.save(d)
    return d


@pytest.mark.parametrize("placed", [False, True])
@pytest.mark.parametrize("prefetch", [0, 2])
def test_training_on_a_fake_gpu_equals_the_host_run(cora, cora_tiers, placed, prefetch):
    cfg = flat_spec(dataset=str(cora), placement=str(cora_tiers) if placed else None, epochs=2, prefetch=prefetch,
                      backend="posix", eval_every_epochs=2, gcn_norm="global", model="gcn", **SMALL)
    host = train(cfg)
    mem = FakeDeviceMemory()
    starts = []
    fake = train(cfg, memory=mem, progress=lambda r: starts.append(r) if r["kind"] == "start" else None)
    for k, v in host.model.state_dict().items():
        assert torch.equal(v, fake.model.state_dict()[k]), k
    assert fake.final["valid_acc"] == host.final["valid_acc"]
    moved = fake.final["transfers"]
    # every host→device copy of a step came from pinned memory: features, index, labels, degrees, edges
    assert moved and all(route in ("pinned->device",) for route in moved), moved
    steps = fake.final["steps"]
    per_step = 5 if placed else 4  # + the store's index metadata; MemoryFeatures needs none
    assert moved["pinned->device"][0] == per_step * steps
    assert "transfers" in host.final and host.final["transfers"] == {}  # no accelerator: nothing copied
    if prefetch:
        assert "moment-prefetch" in mem.set_device_calls  # the thread made the training device current
    assert starts[0]["sampling"] == {"device": "cpu", "why": "no CUDA device"}


def test_bus_addresses_map_plan_gpus_to_cuda_ordinals():
    props = [SimpleNamespace(pci_domain_id=0, pci_bus_id=0x0F, pci_device_id=0, uuid="x"),
             SimpleNamespace(pci_domain_id=0, pci_bus_id=0x07, pci_device_id=0, uuid="y")]
    assert cuda_bus_addresses(props, {}) == {0: "0000:0f:00.0", 1: "0000:07:00.0"}
    # a PyTorch without the PCI fields: through NVML's UUIDs
    old = [SimpleNamespace(uuid="GPU-AAAA"), SimpleNamespace(uuid="bbbb")]
    assert cuda_bus_addresses(old, {"aaaa": "0000:07:00.0"}) == {0: "0000:07:00.0"}
    buses = {0: "0000:0f:00.0", 1: "0000:07:00.0"}
    bus = bus_address_in("cache:pci:0000:07:00.0")
    assert rank_device(0, visible=2, bus=bus, buses=buses) == torch.device("cuda", 1)  # not cuda:0
    with pytest.raises(DeviceError, match="does not see"):
        rank_device(0, visible=2, bus="0000:b7:00.0", buses=buses)


def test_rank_device_for_launchers_that_show_one_gpu():
    assert rank_device(3, visible=1) == torch.device("cuda", 0)  # CUDA_VISIBLE_DEVICES per process
    assert rank_device(3, visible=4) == torch.device("cuda", 3)
    with pytest.raises(DeviceError, match="LOCAL_RANK=4"):
        rank_device(4, visible=4)
    with pytest.raises(DeviceError, match="no CUDA device"):
        rank_device(0, visible=0)
    assert partition_of_rank(["cuda"], 1, 2) == [0]  # a replicated cache is everyone's
    assert partition_of_rank(["cuda:0", "cuda:1"], 1, 2) == [1]


def test_sampling_goes_to_the_gpu_only_when_the_graph_fits():
    gpu = torch.device("cuda", 0)
    assert sampling_device("auto", gpu, 10, 100)[0] == gpu
    dev, why = sampling_device("auto", gpu, 60, 100)
    assert dev.type == "cpu" and "more than 50%" in why
    assert sampling_device("cpu", gpu, 1, 100) == (torch.device("cpu"), "asked for")
    with pytest.raises(DeviceError, match="`sample_on` gpu"):
        sampling_device("gpu", gpu, 60, 100)
    with pytest.raises(DeviceError, match="no CUDA device"):
        sampling_device("gpu", torch.device("cpu"), 1, None)


def test_train_refuses_what_this_machine_cannot_do(cora, cora_tiers, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(TrainError, match="backend"):
        IOSpec(backend="spdk")
    rc = main(["train", "--dataset", str(cora), "--placement", str(cora_tiers), "--backend", "kvikio",
               "--epochs", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "kvikio backend needs CUDA" in err[0], err
    rc = main(["train", "--dataset", str(cora), "--sample-on", "gpu", "--epochs", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--sample-on gpu" in err[0], err


def test_cli_says_where_it_samples(cora, capsys):
    rc = main(["train", "--dataset", str(cora), "--epochs", "1", "--fanouts", "5,5", "--hidden", "8"])
    assert rc == 0
    assert "sampling on cpu (no CUDA device)" in capsys.readouterr().err
