"""What a sampled batch must satisfy, checked against the graph: the rules every sampler here keeps.

:func:`sample_problems` lists every way a :class:`~training.sampler.SampledBatch`
breaks them: the seeds come first and no vertex is listed twice; every edge
``(s, t)`` is an edge of the CSR (``n_id[s]`` among the neighbours of
``n_id[t]``), never more often than the CSR lists it; each hop's targets are
that hop's frontier, and a target of degree ``d`` has ``min(d, fanout)``
edges (``d`` for ``-1``). The GPU sampler and the CPU one draw differently
(their generators differ), so they are compared by these rules, not edge by
edge; ``tools/bench_gpu.py`` checks a GPU's batches with it.

>>> import torch
>>> from training.sampler import NeighborSampler
>>> indptr, indices = torch.tensor([0, 2, 3, 4, 4]), torch.tensor([1, 2, 0, 1])
>>> b = NeighborSampler(indptr, indices, (1, 1), seed=0).sample(torch.tensor([0, 3]))
>>> sample_problems(indptr, indices, b, (1, 1))
[]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from training.sampler import SampledBatch


def _host(a: torch.Tensor | np.ndarray) -> np.ndarray:
    return a.cpu().numpy().astype(np.int64) if isinstance(a, torch.Tensor) else np.asarray(a, dtype=np.int64)


def sample_problems(indptr: torch.Tensor | np.ndarray, indices: torch.Tensor | np.ndarray, batch: SampledBatch,
                    fanouts: Sequence[int], seeds: torch.Tensor | np.ndarray | None = None) -> list[str]:
    """Every rule ``batch`` breaks (empty when it keeps them all); ``seeds``: the seeds asked for, if known."""
    ip = _host(indptr)
    ix = _host(indices)
    n_id = batch.n_id.cpu().numpy().astype(np.int64)
    ei = batch.edge_index.cpu().numpy().astype(np.int64)
    out: list[str] = []
    if np.unique(n_id).size != n_id.size:
        out.append(f"n_id lists {n_id.size - np.unique(n_id).size} vertex id(s) twice")
    if seeds is not None and not np.array_equal(n_id[:batch.batch_size], _host(seeds)):
        out.append("n_id does not begin with the seeds")
    if ei.size and (ei.min() < 0 or ei.max() >= n_id.size):
        return [*out, "edge_index names local ids outside n_id"]
    n = ip.size - 1
    src, dst = n_id[ei[0]], n_id[ei[1]]
    keys = dst * n + src
    rows = np.unique(dst)
    starts, ends = ip[rows], ip[rows + 1]
    pos = np.concatenate([np.arange(a, b) for a, b in zip(starts, ends, strict=True)]) if rows.size else np.empty(0,
                                                                                                              np.int64)
    csr_keys = np.repeat(rows, ends - starts) * n + ix[pos]
    ck, cc = np.unique(csr_keys, return_counts=True)
    ek, ec = np.unique(keys, return_counts=True)
    at = np.searchsorted(ck, ek).clip(max=max(ck.size - 1, 0))
    found = (ck[at] == ek) if ck.size else np.zeros(ek.size, bool)
    if not found.all():
        out.append(f"{int(ec[~found].sum())} sampled edge(s) are not edges of the graph")
    elif (ec > cc[at]).any():
        out.append(f"{int((ec > cc[at]).sum())} edge(s) sampled more often than the graph lists them")
    deg = ip[1:] - ip[:-1]
    first, start = 0, 0
    for hop, f in enumerate(fanouts):
        width = batch.num_sampled_nodes[hop]
        e = batch.num_sampled_edges[hop]
        t = ei[1, first:first + e]
        if t.size and (t.min() < start or t.max() >= start + width):
            out.append(f"hop {hop + 1}: targets outside its frontier")
        got = np.bincount(t - start, minlength=width) if t.size else np.zeros(width, np.int64)
        d = deg[n_id[start:start + width]]
        want = d if f < 0 else np.minimum(d, f)
        if not np.array_equal(got[:width], want):
            out.append(f"hop {hop + 1}: {int((got[:width] != want).sum())} target(s) have other than "
                       f"min(degree, {f}) edges")
        first += e
        start += width
    return out
