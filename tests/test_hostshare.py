"""Node-shared host segments: one copy, no leak after the job ends, is unlinked, or is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import uuid

import torch

from iostack.hostshare import shared_host_tensor, sweep_stale
from tests.conftest import REPO


def _key() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


def test_unlink_removes_the_name_and_keeps_every_mapping(tmp_path):
    k = _key()
    a = shared_host_tensor(k, (4, 2), torch.float32, lambda t: t.fill_(3), directory=tmp_path)
    b = shared_host_tensor(k, (4, 2), torch.float32, lambda t: t.fill_(0), directory=tmp_path)
    assert a.built and not b.built
    a.unlink()
    assert os.listdir(tmp_path) == []
    a.tensor[0, 0] = 9  # still one copy, still mapped by both
    assert float(b.tensor[0, 0]) == 9 and float(b.tensor.sum()) == 9 + 3 * 7
    # a new user of the key builds a new segment: nothing is trusted that nobody holds
    c = shared_host_tensor(k, (4, 2), torch.float32, lambda t: t.fill_(1), directory=tmp_path)
    assert c.built and float(c.tensor.sum()) == 8
    for x in (a, b, c):
        x.close()
    assert os.listdir(tmp_path) == []


def _holder(directory, key: str, building: bool = False) -> subprocess.Popen:
    """A process that maps a segment (or, ``building``, is stuck filling it) until it is killed."""
    code = textwrap.dedent(f"""
        import time, torch
        from iostack.hostshare import shared_host_tensor
        def fill(t):
            if {building!r}:
                print("ready", flush=True)
                time.sleep(600)
            t.fill_(1)
        seg = shared_host_tensor({key!r}, (256, 16), torch.float32, fill, directory={str(directory)!r})
        print("ready", flush=True)
        time.sleep(600)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert p.stdout.readline().strip() == "ready"
    return p


def test_segments_of_killed_processes_are_swept_and_live_ones_kept(tmp_path):
    dead, half, live, filling = _key(), _key(), _key(), _key()
    procs = [_holder(tmp_path, dead), _holder(tmp_path, half, building=True), _holder(tmp_path, live),
             _holder(tmp_path, filling, building=True)]
    try:
        names = os.listdir(tmp_path)
        assert sum(dead in n for n in names) == 2 and sum(half in n for n in names) == 2  # seg + lock, tmp + lock
        assert sweep_stale(tmp_path) == []  # every holder alive: nothing goes
        for p in procs[:2]:
            p.send_signal(signal.SIGKILL)
            p.wait()
        # the next user of the directory (a restart) sweeps what the killed processes left
        s = shared_host_tensor(_key(), (2,), torch.float32, lambda t: t.zero_(), directory=tmp_path)
        left = os.listdir(tmp_path)
        assert not any(dead in n or half in n for n in left), left
        assert sum(live in n for n in left) == 2 and sum(filling in n for n in left) == 2  # live ones stay
        s.close()
    finally:
        for p in procs:
            p.kill()
            p.wait()
    sweep_stale(tmp_path)
    assert os.listdir(tmp_path) == []
