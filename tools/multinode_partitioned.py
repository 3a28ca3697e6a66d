"""``tools/bench_multinode.py --partitioned``: the graph itself partitioned over nodes, against one node holding it all.

Nodes are torchrun process groups on this machine, as in the rest of
``bench_multinode.py`` (:func:`bench_multinode.run_job`). The dataset is cut
with ``moment data partition --parts 2`` (the default partitioner: METIS where
pymetis is installed, else LDG) and each node trains with ``--partition`` and no
placement (:mod:`training.partition.rank`): it opens the shared index (the
relabelled ``indptr``, ``old_ids``), its partition's neighbour lists, feature
rows and labels, and nothing else of the graph; other partitions' rows come
through the feature exchange, their neighbour lists through the distributed
sampler. Figures, each beside its reference from the same run:

* bytes a node holds of the graph (CSR) and of the whole dataset (CSR, feature
  rows, labels), against one node holding all of it, with the halo share (the
  other partitions' vertices a partition's lists name, over its own vertices:
  they are reached through the exchanges, not stored);
* seeds/s of 2 partitioned nodes against one node of one rank with the whole
  graph in memory (median and range of ``--repeat`` runs each, interleaved);
* the valid and test accuracy and the step losses on Cora and Amazon Photo
  (the held fixtures), full neighbourhoods, no dropout: the same model as one
  process up to float rounding.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Callable
from pathlib import Path

from _cli import moment
from _results import Figure

REPO = Path(__file__).resolve().parents[1]

__all__ = ["bench_partitioned"]


def _partition(g: Path, out: Path, parts: int) -> dict:
    if not (out / "partition.json").exists():
        moment("data", "partition", str(g), str(out), "--parts", str(parts))
    return json.loads((out / "partition.json").read_text())


def _nbytes(path: Path) -> int:
    import numpy as np

    a = np.load(path, mmap_mode="r")
    return int(a.nbytes)


def opened_anon(runs: list) -> float:
    """Anonymous memory (PSS) a rank's training added by its start record (what opening the feed allocated:
    the feature rows copied in, the label and id tables), the mean over the ranks of the first run."""
    return statistics.mean(r["start_mem"]["Pss_Anon"] - r["before"]["Pss_Anon"] for r in runs[0])


def memory_figures(g: Path, p: Path, man: dict, measured: str) -> list[Figure]:
    """Bytes a rank opens of the graph and of the dataset (the arrays' sizes), against the whole dataset's;
    ``measured``: the processes' own figure, for the note."""
    n = int(man["num_nodes"])
    shared = _nbytes(p / "indptr.npy") + _nbytes(p / "old_ids.npy")
    labels_view = 8 * n  # the rank's [N] labels, its range filled (training.partition.rank)
    graph, data = [], []
    for k in range(int(man["parts"])):
        d = p / f"part-{k}"
        graph.append(shared + _nbytes(d / "indices.npy"))
        data.append(graph[-1] + _nbytes(d / "features.npy") + labels_view)
    whole_graph = _nbytes(g / "indptr.npy") + _nbytes(g / "indices.npy")
    whole = whole_graph + _nbytes(g / "features.npy") + _nbytes(g / "labels.npy")
    detail = man["parts_detail"]
    halo = [r["halo"] / max(1, r["nodes"]) for r in detail]
    halo_note = (f"halo share (other partitions' vertices a partition's lists name, over its own) "
                 f"{', '.join(f'{h:.1%}' for h in halo)}; edge cut {man['edge_cut'] / max(1, man['num_edges']):.1%} "
                 f"({man['method']})")
    parts = int(man["parts"])
    return [
        Figure("multinode", f"graph bytes per node, {parts} partitioned nodes (indptr, old_ids, own lists) vs the "
                            "whole CSR on one node", "bytes", statistics.mean(graph), whole_graph,
               "one node, whole CSR",
               higher_is_better=False, target=f"about 1/{parts} of the lists plus 16 bytes a vertex",
               note=f"max node {max(graph) / whole_graph:.3f} of the whole; {halo_note}"),
        Figure("multinode", f"dataset bytes per node, {parts} partitioned nodes (graph, own feature rows, labels) vs "
                            "one node with all of it", "bytes", statistics.mean(data), whole, "one node, whole dataset",
               higher_is_better=False, target=f"about 1/{parts} plus the shared index",
               note=f"max node {max(data) / whole:.3f} of the whole; halo rows are exchanged, not stored; {measured}"),
    ]


def _accuracy(work: Path, name: str, fixture: Path, run_job: Callable, last: Callable, cfg: dict) -> list[Figure]:
    """Two partitioned nodes against one process on an imported fixture: accuracy and the largest loss difference."""
    import numpy as np

    from training.importers import import_dataset

    ds_dir = work / name
    if not (ds_dir / "meta.json").exists():
        import_dataset(fixture, ds_dir)
    man = _partition(ds_dir, work / f"{name}-p2", 2)
    cfg = dict(cfg, dataset=str(ds_dir))
    print(f"  {name} ...", flush=True)
    a = run_job(work, f"{name}-partitioned", dict(cfg, partition=str(work / f"{name}-p2")), [None, None])
    b = run_job(work, f"{name}-one", cfg, [None])
    la = [s["loss"] for s in next(r for r in a if r["rank"] == 0)["steps"]]
    lb = [s["loss"] for s in next(r for r in b if r["rank"] == 0)["steps"]]
    diff = float(np.max(np.abs(np.array(la) - np.array(lb))))
    ea, eb = last(a), last(b)
    note = (f"valid {ea.get('valid_acc')} vs {eb.get('valid_acc')}; largest step-loss difference {diff:.2e} over "
            f"{len(la)} steps; remote share of rows {ea['nodes']['remote_share']:.1%} ({man['method']})")
    return [Figure("multinode", f"{name} test accuracy, 2 partitioned nodes vs one process (fan-outs "
                                f"{cfg['fanouts']}, dropout 0)", "accuracy", ea.get("test_acc"), eb.get("test_acc"),
                   "one process, whole graph", target="the same accuracy (the same model up to float rounding)",
                   note=note)]


def bench_partitioned(args, work: Path, run_job: Callable, last: Callable, graph: Callable) -> list[Figure]:
    """The partitioned figures (see the module doc); ``run_job``, ``last`` and ``graph`` (the Chung-Lu data set of
    ``args``) are bench_multinode's."""
    g = graph(args, work)
    man = _partition(g, work / "graph-p2", 2)
    base = dict(dataset=str(g), model="sage", fanouts=[10, 5], batch_size=args.batch_size, epochs=args.epochs,
                eval_every_epochs=0, hidden=128, seed=0, prefetch=2)
    part, one = [], []
    for i in range(args.repeat):  # interleaved: a load that drifts touches both sides alike
        print(f"  partitioned-2 ({i + 1}/{args.repeat}) ...", flush=True)
        part.append(run_job(work, f"partitioned-2-{i}", dict(base, partition=str(work / "graph-p2")), [None, None]))
        print(f"  whole-1x1 ({i + 1}/{args.repeat}) ...", flush=True)
        one.append(run_job(work, f"whole-1x1-{i}", base, [None]))
    sp = [last(r)["seeds_per_s"] for r in part]
    so = [last(r)["seeds_per_s"] for r in one]

    def step_s(runs: list) -> float:
        """The median step time of the last epoch, over every run (rank 0's steps): the typical step, which the
        few slowest steps of an epoch on a loaded machine move less than they move seeds/s."""
        ep = max(s["epoch"] for s in runs[0][0]["steps"])
        return statistics.median(s["step_s"] for r in runs for s in next(x for x in r if x["rank"] == 0)["steps"]
                                 if s["epoch"] == ep)
    nodes = last(part[0])["nodes"]
    measured = (f"measured: opening the feed added {opened_anon(part) / 2**20:.0f} MiB of anonymous memory (PSS) per "
                f"partitioned rank vs {opened_anon(one) / 2**20:.0f} MiB for the whole-graph rank")
    figs = memory_figures(g, work / "graph-p2", man, measured)
    figs.append(Figure("multinode", "seeds/s, 2 partitioned nodes x 1 rank vs one node x 1 rank with the whole graph",
                       "seeds/s", statistics.median(sp), statistics.median(so), "one node, one rank, whole graph",
                       note=f"median of {len(sp)}; ranges {min(sp):,.0f}-{max(sp):,.0f} vs {min(so):,.0f}-"
                            f"{max(so):,.0f}; median step {step_s(part):.3f} s vs {step_s(one):.3f} s; "
                            f"remote share of rows {nodes['remote_share']:.1%}; "
                            f"{os.cpu_count()} cores shared by every process"))
    shared = Path(os.environ.get("MOMENT_SHARED", REPO.parent / "shared")) / "fixtures" / "graphs"
    cfg = dict(model="sage", fanouts=[-1, -1], batch_size=35, epochs=10, eval_every_epochs=0, hidden=64, seed=1,
               lr=0.01, dropout=0.0, weight_decay=5e-4, normalize_features=True)
    for name, sub in (("cora", "cora"), ("amazon-photo", "amazon-photo/amazon_photo.npz")):
        if (shared / sub).exists():
            figs += _accuracy(work, name, shared / sub, run_job, last, cfg)
        else:
            print(f"{shared / sub} not found: no {name} figure")
    return figs
