"""``moment train``: data-parallel GNN training on a dataset directory (one rank per process under torchrun).

Parses the options into a :class:`training.specs.TrainSpec`, runs
:func:`training.trainer.train` and prints progress (a rich bar on a terminal,
one plain line per epoch otherwise) and a summary table; only rank 0 prints.
"""

from __future__ import annotations

import argparse
import sys
import time

from iostack.backends import backend_choices
from iostack.cachepolicy import CACHE_POLICIES, DEFAULT_POLICY
from moment._args import examples, parse_fanouts
from moment._args import size_arg as _size
from moment.errors import CommandError
from training.tasks import TASKS
from training.vocab import (
    DATASET_CHECKS,
    DYNAMIC_CACHE_ON,
    EXCHANGES,
    GRAPH_ON,
    LINK_DECODERS,
    NEGATIVE_METHODS,
    PRECISIONS,
    SAMPLE_ON,
    TRAIN_MODEL_NAMES,
)


def _spec(args: argparse.Namespace):
    from training.specs import DistributedSpec, IOSpec, ModelSpec, RunSpec, SamplingSpec, TrainSpec

    return TrainSpec(
        args.dataset,
        model=ModelSpec(arch=args.model, hidden=args.hidden, heads=args.heads, dropout=args.dropout,
                        attn_dropout=args.attn_dropout, gcn_norm=args.gcn_norm,
                        normalize_features=args.normalize_features),
        sampling=SamplingSpec(fanouts=parse_fanouts(args.fanouts),
                              eval_fanouts=parse_fanouts(args.eval_fanouts, "--eval-fanouts")
                              if args.eval_fanouts else None,
                              batch_size=args.batch_size, eval_batch_size=args.eval_batch_size,
                              sample_on=args.sample_on, server=args.server, graph_on=args.graph_on,
                              graph_cache_bytes=_size(args.graph_cache, "--graph-cache"),
                              partition=args.partition),
        io=IOSpec(placement=args.placement, backend=args.backend, capacities=args.capacities, prefetch=args.prefetch,
                  node_shared_reads=not args.no_node_shared_reads, exchange=args.exchange,
                  remote_cache_bytes=_size(args.remote_cache, "--remote-cache"),
                  remote_cache_dir=args.remote_cache_dir, cache_policy=_cache_policy(args),
                  dynamic_cache_bytes=_size(args.dynamic_cache, "--dynamic-cache"),
                  dynamic_cache_on=args.dynamic_cache_on, check_dataset=args.check_dataset,
                  replace_every=args.replace_every, replace_count_every=args.replace_count_every,
                  replace_min_gain=args.replace_min_gain),
        distributed=DistributedSpec(timeout_s=args.timeout),
        run=RunSpec(epochs=args.epochs, seed=args.seed, lr=args.lr, weight_decay=args.weight_decay,
                    eval_every_epochs=args.eval_every, checkpoint_dir=args.checkpoint,
                    checkpoint_every_steps=args.checkpoint_every, resume=args.resume, metrics_path=args.metrics,
                    precision=args.precision),
    )


def _check_outputs(args: argparse.Namespace) -> None:
    """--checkpoint and --metrics can be written (before any training: moment/outputs.py)."""
    from moment.outputs import check_dir, check_file

    if args.checkpoint:
        check_dir(args.checkpoint, "--checkpoint", inputs=(args.dataset,), what="checkpoints")
    if args.metrics:
        check_file(args.metrics, "--metrics", what="the metrics")


def _epoch_line(rec: dict) -> str:
    acc = "".join(f" {k.split('_')[0]} {100 * rec[k]:.1f}%" for k in ("train_acc", "valid_acc", "test_acc")
                  if k in rec)
    return (f"epoch {rec['epoch']}: loss {rec['loss']:.4f},{acc}, {rec['epoch_s']:.2f} s, "
            f"{rec['seeds_per_s']:,.0f} seeds/s, I/O wait {100 * rec['io_wait_share']:.0f}%")


def _adjusted(tier: dict) -> str:
    """The tier's contention-adjusted seconds (a bracket where the store timed its reads' wait for a core)."""
    if tier.get("adjusted_error") is None:
        return ""
    high = tier.get("adjusted_high_s")
    span = f"{tier['adjusted_s']:.3f}" + (f"..{high:.3f}" if high is not None and high != tier["adjusted_s"] else "")
    return f" · {span} s adjusted for the contention measured ({100 * tier['adjusted_error']:+.1f}% at the low end)"


def _prediction_rows(t, pred: dict | None) -> None:
    """Predicted against measured read time and bytes per tier (the plan's check), when there is one."""
    if not pred:
        return
    from momentbase.units import format_size

    for tier in pred["tiers"]:
        if not tier["measured_bytes"] and not tier["predicted_bytes"]:
            continue
        secs = ("no rate measured for it (moment profile --out FILE, then --capacities FILE)"
                if tier["predicted_s"] is None else
                f"{tier['predicted_s']:.3f} s predicted · {tier['measured_s'] or 0:.3f} s measured"
                + (f" ({100 * tier['error']:+.1f}%)" if tier["error"] is not None else "")
                + _adjusted(tier))
        t.add_row(f"{tier['tier']} reads: plan vs run",
                  f"{format_size(tier['predicted_bytes'])} predicted · {format_size(tier['measured_bytes'])} "
                  f"measured · {secs}")


def _train_command(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rich.console import Console

    from moment.bars import Bars

    if not Path(args.dataset).is_dir():
        raise CommandError(f"--dataset {args.dataset}: no such dataset directory "
                           "(create one with `moment data import`)")
    spec = _spec(args)
    _check_outputs(args)
    from training.hetero.workflow import is_hetero
    from training.vocab import HETERO_MODEL_NAMES

    hetero = is_hetero(args.dataset)
    if args.model in HETERO_MODEL_NAMES and not hetero:
        raise CommandError(f"--model {args.model}: for a heterogeneous dataset; {args.dataset} is homogeneous "
                           "(train sage, gat or gcn)")
    err = Console(stderr=True, highlight=False, emoji=False, width=None if sys.stderr.isatty() else 160)
    out = Console(highlight=False, emoji=False, width=None if sys.stdout.isatty() else 160)
    bars = Bars()  # per-step progress within an epoch, on a terminal only
    state: dict = {"rank": 0, "seeds": 0, "t0": 0.0}
    progress = _printer(args, spec, err, bars, state)
    if hetero or args.task == "hetero":
        from moment.train_hetero import run_hetero

        return run_hetero(args, spec, err, out)
    if args.task == "link":
        from moment.train_link import run_link

        return run_link(args, spec, err, out)
    try:
        result = TASKS.get(args.task)(spec, {}, progress=progress)
    finally:
        bars.__exit__(None, None, None)
    if result.rank != 0:
        return 0
    final = result.final
    if args.json:
        import json

        sys.stdout.write(json.dumps({"schema": "moment.train", "version": 1, "world_size": result.world_size,
                                     "resumed_from": result.resumed_from, "epochs": list(result.epochs)},
                                    indent=2, default=str) + "\n")
        return 0
    if final is None:
        out.print(f"nothing to do: the checkpoint is already at epoch {spec.run.epochs}", markup=False)
        return 0
    out.print(_summary(result, spec, state))
    return 0


def _in_flags(message: str, args: argparse.Namespace) -> str:
    """A library message with its parameters as ``moment train``'s options (moment/flags.py)."""
    from moment.cli import build_parser
    from moment.flags import in_flags

    return in_flags(message, build_parser(), args)


def _printer(args: argparse.Namespace, spec, err, bars, state: dict):
    """The progress callback of a run: the start lines, a bar per step, a line per epoch (rank 0 only)."""

    def progress(rec: dict) -> None:
        state["rank"] = rec["rank"]
        if rec["rank"] != 0:
            return
        kind = rec["kind"]
        if kind == "start":
            if rec["start_epoch"] or rec["start_step"]:
                err.print(f"resuming at epoch {rec['start_epoch']}, step {rec['start_step']}", markup=False)
            elif args.resume:
                err.print(f"no checkpoint in {args.checkpoint}: starting from scratch", markup=False)
            err.print(f"training {spec.model.arch} on {rec['num_train']:,} seeds, {rec['world_size']} rank(s), "
                      f"{rec['steps_per_epoch']} steps per epoch, features: "
                      f"{'store ' + str(spec.io.placement) if spec.io.placement else 'in memory'}"
                      + (f" ({rec['feature_dtype']} rows)" if rec.get("feature_dtype") else ""), markup=False)
            state["feature_dtype"] = rec.get("feature_dtype")
            if rec.get("precision", "32") != "32":
                err.print(f"precision {rec['precision']}: rows reach the model as "
                          f"{str(rec.get('model_rows_dtype')).removeprefix('torch.')}", markup=False)
            err.print(f"device {rec['device']}; sampling on {rec['sampling']['device']} ({rec['sampling']['why']})",
                      markup=False)
            if rec.get("integrity"):  # the dataset's checksums: verified (a sample of blocks) or absent
                err.print(f"dataset: {rec['integrity']}", markup=False)
            for note in rec.get("store_notes", []):
                err.print(f"store: {note}", markup=False)
            split = rec.get("socket_split") or {}
            if split.get("used"):
                err.print(f"seeds by socket (the placement's split): rank 0 on {split['socket']}, "
                          f"{split['seeds_of_socket']:,} seeds, {split['seeds_per_step']} per step", markup=False)
            elif split.get("placement_socket_aware"):
                err.print(f"warning: the placement is socket-aware but the seeds are not split by socket "
                          f"({split['why_not']}): its cross-socket shares do not hold for this run", markup=False)
            if rec.get("rng_restored") not in (None, "per-rank"):
                err.print(f"random streams: {rec['rng_restored']}", markup=False)
            bars.__enter__()
        elif kind == "step":
            now = time.perf_counter()
            if state["seeds"] == 0:
                state["t0"] = now - rec["step_s"]
            state["seeds"] += rec["seeds"]
            rate = state["seeds"] / (now - state["t0"]) if now > state["t0"] else 0.0
            bars("steps", rec["step"] + 1, rec["steps"],
                 info=f"epoch {rec['epoch']} · loss {rec['loss']:.3f} · {rate:,.0f} seeds/s")
        elif kind == "epoch":
            state["seeds"] = 0
            lines = [_epoch_line(rec)]
            div = rec.get("divergence")
            if div and div["kind"] not in state.setdefault("warned", set()):  # once per kind of sign
                state["warned"].add(div["kind"])
                lines.append(f"warning: epoch {rec['epoch']}: {_in_flags(div['message'], args)}")
            for line in lines:
                if bars.enabled:
                    bars.print(line)
                else:
                    err.print(line, markup=False)
            if bars.enabled:
                bars.reset("steps")

    return progress


def _summary(result, spec, state: dict):
    """The table printed after a run: loss, accuracies, times, rows per tier, the plan against the run."""
    from pathlib import Path

    from rich.table import Table

    from momentbase.units import format_size
    from training.checkpoint import CHECKPOINT_NAME

    final = result.final
    t = Table(title=f"{spec.model.arch} on {Path(spec.dataset).name}: {len(result.epochs)} epoch(s) this run, "
                    f"{result.world_size} rank(s)", title_justify="left", show_header=False)
    t.add_column("what")
    t.add_column("value", overflow="fold")
    t.add_row("loss (last epoch)", f"{final['loss']:.4f}")
    if state.get("feature_dtype"):
        t.add_row("feature rows held as", str(state["feature_dtype"]))
    for k in ("train_acc", "valid_acc", "test_acc"):
        if k in final:
            t.add_row(k.replace("_acc", " accuracy"), f"{100 * final[k]:.2f}%")
    t.add_row("epoch time", f"{final['epoch_s']:.2f} s · {final['seeds_per_s']:,.0f} seeds/s")
    t.add_row("step split (last epoch)", f"compute {final['compute_s']:.2f} s (with the gradients' all-reduce) · "
              f"loss all-reduce {final['allreduce_s']:.2f} s · "
              f"I/O wait {final['io_wait_s']:.2f} s ({100 * final['io_wait_share']:.0f}%) · "
              f"in the background: sample {final['sample_s']:.2f} s, gather {final['gather_s']:.2f} s")
    for tier, v in sorted(final["tiers"].items()):
        t.add_row(f"rows from {tier}" + (" (rank 0)" if result.world_size > 1 else ""),
                  f"{v['rows']:,} ({format_size(v['bytes'])})")
    _prediction_rows(t, final.get("prediction"))
    if final.get("throughput"):
        from training.throughput import describe as in_paper_terms

        for i, line in enumerate(in_paper_terms(final["throughput"])):
            t.add_row("throughput: plan vs run" if i == 0 else "", line)
    if final.get("contention"):
        from training.contention import describe

        t.add_row("contention (last epoch)", describe(final.get("prediction"), final["contention"]))
    if "param_spread" in final:
        t.add_row("ranks in sync", "yes" if final["param_spread"] == 0 else f"NO (spread {final['param_spread']:.3g})")
    if spec.run.checkpoint_dir:
        t.add_row("checkpoint", str(Path(spec.run.checkpoint_dir) / CHECKPOINT_NAME))
    if spec.run.metrics_path:
        t.add_row("metrics", spec.run.metrics_path)
    return t


def _cache_policy(args: argparse.Namespace) -> str:
    """``--cache-policy``, or the measured default where only ``--dynamic-cache`` was given."""
    if args.cache_policy is not None:
        return args.cache_policy
    return DEFAULT_POLICY if args.dynamic_cache not in ("0", "none") else "static"


def _cache_options(p: argparse.ArgumentParser) -> None:
    """The caches that fill on access (:mod:`training.cached_features`) and the options of several nodes."""
    r = p.add_argument_group("a cache that fills on access")
    r.add_argument("--cache-policy", choices=CACHE_POLICIES.names(),
                   help="static: the placement's caches as filled at start (the default without --dynamic-cache); "
                        "or a host cache of --dynamic-cache SIZE in front of the rows that fills on access, evicting "
                        f"by this policy (default {DEFAULT_POLICY}, the best in tools/bench_dyncache.py), "
                        "warm-started with the placement's GPU and CPU bins; on a placement sharded across nodes, "
                        "the --remote-cache fills on access by this policy, warm-started with its static fill")
    r.add_argument("--dynamic-cache", default="0", metavar="SIZE",
                   help="the size of that cache, e.g. 2GiB (default 0: none)")
    r.add_argument("--dynamic-cache-on", choices=DYNAMIC_CACHE_ON, default="host",
                   help="where that cache holds its rows: host (default; its hits go to the GPU with the misses) "
                        "or gpu (the rank's GPU: hits read there, only the misses copied; needs an accelerator)")
    m = p.add_argument_group("re-placement while training (the hot rows drift)")
    m.add_argument("--replace-every", type=int, default=0, metavar="K",
                   help="after every K-th epoch re-run DDAK on the rows the run read and move the rows whose bin "
                        "changes, in the background, swapping the placement between two gathers (default 0: never)")
    m.add_argument("--replace-count-every", type=int, default=1, metavar="N",
                   help="count the rows of every N-th batch (default 1; 4 bytes a vertex whatever N)")
    m.add_argument("--replace-min-gain", type=float, default=0.01, metavar="F",
                   help="move only when the caches' predicted share of the reads rises by F (default 0.01)")
    n = p.add_argument_group("several nodes (a placement from `moment place --nodes N`)")
    n.add_argument("--exchange", choices=EXCHANGES, default="alltoall",
                   help="how remote rows travel: one all_to_all per step on its own group (default), or "
                        "one-sided RPC fetches")
    n.add_argument("--remote-cache", default="0", metavar="SIZE",
                   help="keep the hottest rows of other nodes in a node-local cache of this size, e.g. 2GiB "
                        "(default 0: none)")
    n.add_argument("--remote-cache-dir", metavar="DIR",
                   help="hold that cache in an SSD bin under DIR instead of host memory")


def _task_options(p: argparse.ArgumentParser) -> None:
    """``--task`` and the options of ``--task link``."""
    p.add_argument("--task", choices=TASKS.names(), default="node",
                   help="node classification (default) or link prediction on an edge-split dataset "
                        "(moment data split-edges)")
    lk = p.add_argument_group("link prediction (--task link)")
    lk.add_argument("--decoder", choices=LINK_DECODERS, default="dot", help="pair scores: dot (default) or mlp")
    lk.add_argument("--negatives", choices=NEGATIVE_METHODS, default="uniform",
                    help="training negatives: uniform (default) or by degree^0.75")
    lk.add_argument("--neg-ratio", type=float, default=1.0, metavar="R", help="negatives per positive (default 1)")
    lk.add_argument("--embed-dim", type=int, default=64, metavar="N", help="embedding width (default 64)")


#: the examples `moment train --help` ends with
_EXAMPLES = ("moment train --dataset cora --placement cora-placement --model gcn --epochs 10",
             "moment train --dataset graph --fanouts 25,10 --batch-size 8000 --metrics m.jsonl",
             "moment train --dataset graph --checkpoint ckpt/ --epochs 5 --resume",
             "moment train --task link --dataset cora-links --model gcn --fanouts -1,-1 --epochs 100",
             "torchrun --nproc-per-node 2 -m moment train --dataset cora --epochs 3   # data-parallel",
             "moment report m.jsonl --out plots/   # plots of the metrics")


def _graph_options(r) -> None:
    """Where and over what the batches are sampled: the device, a server, the CSR's home, a partition."""
    r.add_argument("--sample-on", choices=SAMPLE_ON, default="auto",
                   help="where to sample: auto (default) = on the GPU when the graph fits there, else the CPU")
    r.add_argument("--server", metavar="HOST:PORT", help="take batches from a `moment serve` sampling server")
    r.add_argument("--graph-on", choices=GRAPH_ON, default="memory", help="memory (default): sample "
                   "from the CSR's memory maps; disk: read the sampled lists of indices.npy with direct I/O (on CPU)")
    r.add_argument("--graph-cache", default="0", metavar="SIZE", help="with --graph-on disk: hold the highest-"
                   "degree vertices' lists in memory up to SIZE, e.g. 512MiB (default 0: none)")
    r.add_argument("--partition", metavar="DIR", help="a `moment data partition` output of --dataset: sample the "
                   "training batches over it, each rank holding its partition's neighbour lists (one rank per "
                   "partition, e.g. torchrun --nnodes P)")


def register(subparsers) -> None:
    """Add ``moment train``."""
    p = subparsers.add_parser(
        "train", help="train GraphSAGE / GAT / GCN data-parallel on a dataset (torchrun for several ranks)",
        description="Train a GNN on sampled mini-batches with features from the tiered store (--placement) or "
                    "memory. Launch with `torchrun --nproc-per-node N -m moment train ...` for N data-parallel "
                    "ranks (gloo on CPU, nccl on GPU); N ranks train exactly what one process would.",
        **examples(*_EXAMPLES),
    )
    p.add_argument("--dataset", required=True, metavar="DIR", help="dataset directory (moment data import)")
    p.add_argument("--placement", metavar="DIR",
                   help="placement directory (placement.json, bin_of.npy, row_of.npy, SSD bins); default: "
                        "features in memory")
    m = p.add_argument_group("model and optimisation")
    m.add_argument("--model", choices=TRAIN_MODEL_NAMES, default="sage",
                   help="default sage; a heterogeneous dataset trains hetero-sage or rgcn")
    m.add_argument("--fanouts", default="25,10", metavar="F1,F2,..",
                   help="neighbours per hop, hop 1 first, -1 = all (write --fanouts=-1,-1); one layer per fan-out "
                        "(default 25,10)")
    m.add_argument("--batch-size", type=int, default=1024, metavar="N", help="global seeds per step (default 1024)")
    m.add_argument("--epochs", type=int, default=1, metavar="N", help="epochs to reach (default 1)")
    m.add_argument("--lr", type=float, default=0.003, help="Adam learning rate (default 0.003)")
    m.add_argument("--weight-decay", type=float, default=0.0, help="Adam weight decay (default 0)")
    m.add_argument("--dropout", type=float, default=0.5,
                   help="dropout between layers, and on the input features for gat/gcn (default 0.5)")
    m.add_argument("--attn-dropout", type=float, default=0.0, help="GAT: dropout on attention (default 0)")
    m.add_argument("--hidden", type=int, metavar="N", help="hidden units (default: sage/gcn 256, gat 64 per head)")
    m.add_argument("--heads", type=int, metavar="N", help="GAT heads of the hidden layers (default 8)")
    m.add_argument("--gcn-norm", choices=("local", "global"), default="local",
                   help="GCN degrees from the batch graph (PyG mini-batch default) or the whole graph")
    m.add_argument("--normalize-features", action="store_true", help="row-normalise feature rows (Planetoid style)")
    m.add_argument("--precision", choices=PRECISIONS, default="32",
                   help="32 (default): float32; bf16-mixed: autocast to bfloat16 (GPU or CPU); 16-mixed: float16 "
                        "with loss scaling. Mixed: rows placed as float16/bfloat16 reach the model in that type, "
                        "int8 rows are decoded on the device into bfloat16")
    m.add_argument("--seed", type=int, default=0, help="seed of parameters, shuffling and sampling (default 0)")
    _task_options(p)
    r = p.add_argument_group("pipeline, evaluation, output")
    r.add_argument("--check-dataset", choices=DATASET_CHECKS, default="background",
                   help="background (default): check every block of the dataset arrays training reads against "
                        "their CRC-32s on a background thread, stopping the run at an epoch's end if one is "
                        "corrupt; open: only the sample checked when the dataset opens (a huge CSR read twice)")
    r.add_argument("--prefetch", type=int, default=2, metavar="K",
                   help="batches sampled and gathered ahead on a background thread (default 2; 0 = inline: "
                        "on a machine of 2 cores with small rows in memory, inline can be faster; each batch ahead "
                        "holds its gathered features, e.g. 217 MB for 1024 seeds at 25,10 and 512 floats: with "
                        "SSD-bound steps under a memory limit, 1 leaves that room to --cpu-cache)")
    r.add_argument("--backend", choices=backend_choices(), default="auto",
                   help="SSD read backend: kvikio reads into GPU memory (needs CUDA and KvikIO); auto (default) "
                        "takes kvikio only where --capacities measured it faster, else posix")
    r.add_argument("--capacities", metavar="FILE", help="a `moment profile` file: its figures choose --backend auto")
    _graph_options(r)
    r.add_argument("--eval-fanouts", metavar="F1,F2,..", help="fan-outs of evaluation (default: --fanouts)")
    r.add_argument("--eval-batch-size", type=int, default=4096, metavar="N", help="default 4096")
    r.add_argument("--eval-every", type=int, default=1, metavar="E",
                   help="evaluate every E epochs, 0 = after the last only (default 1)")
    r.add_argument("--metrics", metavar="FILE.jsonl", help="append per-step and per-epoch metrics here (rank 0)")
    r.add_argument("--json", action="store_true",
                   help="print the epochs' records as JSON (with the plan's prediction against the run, per tier)")
    r.add_argument("--checkpoint", metavar="DIR", help="write DIR/checkpoint.pt at every epoch end")
    r.add_argument("--checkpoint-every", type=int, default=0, metavar="STEPS",
                   help="also every STEPS steps (default 0: epoch ends only)")
    r.add_argument("--resume", action="store_true", help="continue from the checkpoint in --checkpoint DIR")
    r.add_argument("--no-node-shared-reads", action="store_true",
                   help="under torchrun, each rank reads its own SSD pages (default: the ranks of a node read each "
                        "SSD page of a training step once, split between them, and take their rows from node-shared "
                        "memory)")
    r.add_argument("--timeout", type=float, default=30.0, metavar="S",
                   help="seconds a rank waits on the others in a step (all-reduce, feature exchange) before it "
                        "stops with an error (default 30)")
    _cache_options(p)
    p.set_defaults(func=_train_command)
