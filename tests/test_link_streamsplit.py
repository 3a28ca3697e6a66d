"""The edge split in chunks equals the in-memory split (same seed, every array), on random graphs and chunk sizes;
the CSR membership answers what the edge keys answer; `moment data split-edges` writes the streamed split."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_link import _csr, graphs
from training.link.edges import split_edges
from training.link.edgeset import EdgeSet, csr_edges
from training.link.streamsplit import CsrEdges, split_edges_streamed

FIELDS = ("train_pos", "valid_pos", "test_pos", "valid_neg", "test_neg", "indptr", "indices")


@settings(max_examples=60, deadline=None)
@given(graphs, st.integers(1, 40), st.sampled_from(["uniform", "degree"]), st.sampled_from([0.5, 1.0, 2.0]),
       st.booleans())
def test_streamed_split_equals_the_in_memory_split(tmp_path_factory, g, chunk, method, ratio, repeats):
    n, edges, undirected, seed = g
    e = np.array(edges).T
    indptr, indices = _csr(n, e[0], e[1], undirected)
    if repeats and indices.size:  # a CSR that repeats edges: both splits treat the copies alike
        indptr, indices = _csr_with_repeats(indptr, indices)
    src, dst = csr_edges(indptr, indices)
    if (src <= dst).sum() < 5 if undirected else src.size < 5:
        return
    kw = {"undirected": undirected, "num_val": 0.2, "num_test": 0.15, "seed": seed, "negatives": method,
          "neg_ratio": ratio}
    want = split_edges(indptr, indices, **kw)
    got = split_edges_streamed(indptr, indices, tmp_path_factory.mktemp("scratch"), chunk_edges=chunk, **kw)
    for name in FIELDS:
        a, b = np.asarray(getattr(got, name)), np.asarray(getattr(want, name))
        assert a.dtype == b.dtype and np.array_equal(a, b), name


def _csr_with_repeats(indptr: np.ndarray, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every row's first source listed twice."""
    deg = np.diff(indptr)
    extra = (deg > 0).astype(np.int64)
    out_ptr = np.zeros_like(indptr)
    np.cumsum(deg + extra, out=out_ptr[1:])
    rows = [np.concatenate([indices[a:b], indices[a:min(a + 1, b)]])
            for a, b in zip(indptr[:-1], indptr[1:], strict=True)]
    return out_ptr, np.concatenate(rows).astype(indices.dtype)


@settings(max_examples=60, deadline=None)
@given(graphs, st.integers(1, 30), st.integers(0, 2**16))
def test_csr_membership_is_the_edge_keys(g, chunk, seed):
    n, edges, undirected, _ = g
    e = np.array(edges).T
    indptr, indices = _csr(n, e[0], e[1], undirected)
    rng = np.random.default_rng(seed)
    s, d = rng.integers(0, n, 200), rng.integers(0, n, 200)
    src, dst = csr_edges(indptr, indices)
    s, d = np.concatenate([s, src[:50]]), np.concatenate([d, dst[:50]])  # some queries are edges
    want = EdgeSet.from_csr(indptr, indices, n).contains(s, d)
    assert np.array_equal(CsrEdges(indptr, indices, chunk).contains(s, d), want)


def test_the_split_benchmark_runs_both_splits_and_finds_them_equal(tmp_path):
    import json
    import subprocess
    import sys

    from tests.conftest import REPO

    out = tmp_path / "split.json"
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "bench_split_edges.py"), "--edges", "20000",
                           "--chunk-edges", "3000", "--json", str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "same output: yes" in proc.stdout
    figures = json.loads(out.read_text())["figures"]
    assert len(figures) == 2 and all(f["reference"] > 0 for f in figures)
