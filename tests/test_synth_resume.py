"""Generation at scale, at a small size: resume after ``kill -9``, the bucketed CSR, and the faults that scale
showed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from training.bucketcsr import BucketPlan, BuildState, SpillState, build, spill
from training.csr import count_rows, edge_chunks, place_edges, sort_rows
from training.data import count_ids
from training.synth import EDGE_BLOCK, SynthSpec
from training.synth_run import KILL_ENV, synthesize, work_dir_of

ROOT = Path(__file__).resolve().parents[1]
SPEC = dict(num_nodes=3000, num_edges=3 * EDGE_BLOCK + 123, feature_dim=6, feature_dtype="float16",
            num_classes=5, seed=4)
# small chunks, buckets and feature blocks, so that every phase has several checkpoints
RUN = ("import sys\nfrom training.synth import SynthSpec\nfrom training.synth_run import synthesize\n"
       f"synthesize(sys.argv[1], SynthSpec(**{SPEC!r}), chunk_edges={EDGE_BLOCK}, bucket_edges=50_000, "
       "feature_chunk_bytes=4096)\n")


def _run(dst: Path, kill_at: str | None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(KILL_ENV, None)
    if kill_at:
        env[KILL_ENV] = kill_at
    return subprocess.run([sys.executable, "-c", RUN, str(dst)], env=env, capture_output=True, text=True)


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


@pytest.mark.slow
def test_killed_runs_resume_to_the_same_bytes(tmp_path):
    whole = tmp_path / "a" / "g"
    whole.parent.mkdir()
    assert _run(whole, None).returncode == 0
    cut = tmp_path / "b" / "g"
    cut.parent.mkdir()
    # killed (SIGKILL, no clean-up) after a spill chunk, after a bucket, after a feature block,
    # then left to finish: each re-run continues from the checkpoint, not from the start
    for kill_at in ("spill:2", "build:3", "feature_rows:1364"):
        proc = _run(cut, kill_at)
        assert proc.returncode == -9, proc.stderr
        assert not cut.exists() and (work_dir_of(cut) / "progress.json").exists()
    assert _run(cut, None).returncode == 0
    assert not work_dir_of(cut).exists()
    a, b = _files(whole), _files(cut)
    assert a.keys() == b.keys() and {"indices.npy", "features.npy", "meta.json"} <= a.keys()
    for name in a:
        assert a[name] == b[name], name


def test_a_different_spec_does_not_resume_a_stopped_run(tmp_path):
    dst = tmp_path / "g"
    work = work_dir_of(dst)
    work.mkdir()
    (work / "progress.json").write_text('{"source": {"seed": -1}, "state": {}}')
    from training.data import DatasetError

    with pytest.raises(DatasetError, match="different spec"):
        synthesize(dst, SynthSpec(num_nodes=100, num_edges=300, feature_dim=2))
    rep = synthesize(dst, SynthSpec(num_nodes=100, num_edges=300, feature_dim=2), overwrite=True)
    assert rep.num_nodes == 100 and not work.exists()


def _three_pass(edges: np.ndarray, n: int, tmp: Path) -> tuple[np.ndarray, np.ndarray]:
    chunks = edge_chunks(lambda: [(edges[0], edges[1])], n, 7)
    indptr = count_rows(chunks, n)
    place_edges(chunks, indptr, tmp / "raw.npy", np.int32)
    new = sort_rows(tmp / "raw.npy", indptr, tmp / "ref.npy", 7)
    return new, np.load(tmp / "ref.npy")


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 40), m=st.integers(0, 300), buckets=st.integers(1, 9), stop=st.integers(0, 20),
       seed=st.integers(0, 2**31))
def test_bucketed_csr_equals_the_three_pass_csr_even_when_resumed(tmp_path_factory, n, m, buckets, stop, seed):
    tmp = tmp_path_factory.mktemp("b")
    rng = np.random.default_rng(seed)
    edges = rng.integers(0, n, size=(2, m))
    edges = edges[:, edges[0] != edges[1]]
    ref_indptr, ref_indices = _three_pass(edges, n, tmp)
    plan = BucketPlan(n, min(buckets, n))
    chunks = [(edges[0][a:a + 11], edges[1][a:a + 11]) for a in range(0, edges.shape[1], 11)]
    # stop the spill after `stop` chunks, as a kill would, with half a chunk more written after
    # the checkpoint; the resumed spill truncates it away
    saved = []
    state = spill(tmp, plan, chunks[:stop], SpillState.empty(plan), checkpoint=saved.append)
    if stop < len(chunks):
        spill(tmp, plan, [(c[0][: len(c[0]) // 2], c[1][: len(c[1]) // 2]) for c in chunks[stop:stop + 1]], state)
    state = spill(tmp, plan, chunks[stop:], state)
    assert state.blocks_done == len(chunks)
    built = build(tmp, plan, tmp / "indptr.npy", tmp / "indices.npy", np.int32,
                  BuildState(), checkpoint=lambda s: None)
    assert np.array_equal(np.load(tmp / "indptr.npy"), ref_indptr)
    assert np.array_equal(np.load(tmp / "indices.npy"), ref_indices)
    assert built.edges == ref_indices.size
    assert not list(tmp.glob("bucket-*"))


def test_counting_ids_is_linear_not_one_pass_per_chunk():
    # the fault: `counts += np.bincount(chunk, minlength=n)` per 4 M-edge chunk is one O(n) pass
    # per chunk (400 passes over 111 M counts at papers100M's size); count_ids reads slices of at
    # least n / 4, so the passes are about 4 * total / n however small `chunk` is
    n, total = 1000, 20_000
    ids = np.random.default_rng(0).integers(0, n, size=total)
    slices = []

    def read(a, b):
        slices.append(b - a)
        return ids[a:b]

    counts = count_ids(read, total, n, chunk=16)
    assert np.array_equal(counts, np.bincount(ids, minlength=n))
    assert len(slices) <= 4 * total // n + 1 and sum(slices) == total


@pytest.mark.slow
def test_peak_memory_does_not_grow_with_the_edges(tmp_path):
    # the fault the issue measured: 817 MiB at 2e7 edges, 1,330 MiB at 8e7. Same nodes, 4x the
    # edges: the edges as int64 pairs would be 16 bytes each more; the run may grow by a small
    # share of that (allocator noise), not by the edges
    # (buckets of 2**17 edges: at the default 2**24 these graphs would fit one bucket each)
    code = ("import resource, sys\nfrom training.synth import SynthSpec\nfrom training.synth_run import synthesize\n"
            "synthesize(sys.argv[1], SynthSpec(num_nodes=10**5, num_edges=int(sys.argv[2]), feature_dim=4), "
            "chunk_edges=1 << 17, bucket_edges=1 << 17)\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    peaks = []
    for i, m in enumerate((10**6, 4 * 10**6)):
        out = subprocess.run([sys.executable, "-c", code, str(tmp_path / f"g{i}"), str(m)], env=env,
                             capture_output=True, text=True, check=True).stdout
        peaks.append(int(out) * 1024)
    grown = peaks[1] - peaks[0]
    assert grown < 0.25 * 3 * 10**6 * 16, f"peak RSS {peaks[0] / 2**20:.0f} -> {peaks[1] / 2**20:.0f} MiB"


def test_counting_rows_pools_small_chunks(monkeypatch):
    # the same fault in the three-pass builder's first pass (the importers'): one O(n) bincount
    # per chunk; it now pools chunks to n / 4 targets per bincount
    import training.csr as csr

    calls = []
    real = np.bincount
    monkeypatch.setattr(csr.np, "bincount", lambda *a, **k: calls.append(1) or real(*a, **k))
    n, m = 400, 5000
    rng = np.random.default_rng(1)
    src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
    indptr = count_rows(edge_chunks(lambda: [(src, dst)], n, 10, drop_self_loops=False), n)
    monkeypatch.undo()
    assert np.array_equal(np.diff(indptr), np.bincount(dst, minlength=n))
    assert len(calls) <= 4 * m // n + 1


def test_progress_lines_for_a_log_file(monkeypatch, capsys):
    # under nohup (stderr a file) the bars are off; MOMENT_PROGRESS_LOG asks for lines with an ETA,
    # whose rate counts only what this run did (a resumed stage starts part-way)
    from moment import bars

    monkeypatch.setenv(bars.LOG_ENV, "0")
    monkeypatch.setattr(bars.time, "monotonic", iter([100.0, 110.0]).__next__)
    b = bars.Bars(quiet=True)
    b("generating edges", 500, 1000)
    b("generating edges", 600, 1000)
    lines = capsys.readouterr().err.splitlines()
    assert lines[-1].endswith("generating edges: 600 / 1,000 (10/s, 10 s, eta 40 s)")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 4)), min_size=1, max_size=14), st.integers(1, 5))
def test_placement_duplicate_rows_found_by_chunks(cells, chunk):
    # the duplicate-row check sorted every (bin, row) key at once (~32 B a vertex: 3.5 GB at 111 M
    # vertices); by chunks against a bitmap it must name the same clash: the first vertex, in id
    # order, on a row an earlier vertex holds, and that earlier vertex
    import iostack.placement as ipl
    from iostack.errors import StoreError

    bin_of, row_of = np.array([c[0] for c in cells]), np.array([c[1] for c in cells])
    keys = list(zip(bin_of.tolist(), row_of.tolist(), strict=True))
    second = next((i for i in range(len(keys)) if keys[i] in keys[:i]), None)
    caps = np.full(3, 5, np.int64)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ipl, "_CHECK_CHUNK", chunk)
        if second is None:
            ipl._check_rows_distinct(bin_of, row_of, caps)
            return
        first = keys.index(keys[second])
        with pytest.raises(StoreError, match=f"vertices {first} and {second} are both on row {row_of[first]} "
                                             f"of bin {bin_of[first]}$"):
            ipl._check_rows_distinct(bin_of, row_of, caps)
