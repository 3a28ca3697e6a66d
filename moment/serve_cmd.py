"""``moment serve``: run the sampling server (:mod:`training.serve`) until told to stop.

Prints the address to give ``moment train --server``, then one line per trainer that
connects, disconnects, is lost or is refused. Stops on SIGINT / SIGTERM, after
``--max-trainers`` trainers have come and gone, or after ``--idle-exit`` seconds with no
trainer connected.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from moment._args import argtype, examples, parse_fanouts, port


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a number") from None
        if not 0 < value < float("inf"):  # nan and inf too
            raise argparse.ArgumentTypeError(f"{text!r}: expected a positive number")
        return value
    return parse


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected 0 or more")
    return value


def _describe(event) -> str:
    t = event.trainer
    who = f"{t.name} (rank {t.rank}/{t.world_size}, pid {t.pid} on {t.host})" if t else "a trainer"
    verb = {"connect": "connected", "disconnect": "disconnected", "lost": "lost",
            "refused": "refused"}.get(event.kind, event.kind)
    return f"{who} {verb}" + (f": {event.detail}" if event.detail else "")


def _serve_command(args: argparse.Namespace) -> int:
    # TensorPipe logs a C++ warning each time a trainer's connection closes, even a clean
    # leave; our own connect/disconnect lines say it better. Read once, when torch loads.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    from training.serve import SamplingParams, SamplingServer

    stop = threading.Event()
    lock = threading.Lock()

    def say(line: str) -> None:
        with lock:  # events arrive on server threads
            print(line, flush=True)

    def on_signal(signum, _frame) -> None:
        stop.set()

    params = SamplingParams(batch_size=args.batch_size, fanouts=args.fanouts, seed=args.seed)
    server = SamplingServer(
        args.dataset,
        params,
        host=args.host,
        port=args.port,
        workers=args.workers,
        lanes=args.lanes,
        compiled=not args.torch_sampler,
        threads=args.threads,
        device=args.device,
        timeout_s=args.timeout,
        trainer_timeout_s=args.trainer_timeout,
        on_event=lambda e: say(_describe(e)),
        validate=not args.no_validate,
    )
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.start()
        say(f"serving {server.dataset.name} ({server.train_idx.numel():,} training vertices) on {server.address}: "
            f"batch size {params.batch_size}, fan-outs {','.join(map(str, params.fanouts))}, seed {params.seed}, "
            f"{server.workers} sampler worker process(es) on {args.device}")
        say(f"trainers: moment train --server {server.address} ...")
        why = server.wait(stop, max_trainers=args.max_trainers, idle_exit_s=args.idle_exit)
        say({"stopped": "stopping (signal)", "max-trainers": f"stopping: {server.connects} trainer(s) served",
             "idle": f"stopping: no trainer for {args.idle_exit} s",
             "worker-died": "stopping: a sampler worker process died (its error is above)"}[why])
    finally:
        server.close()
        for s, h in old.items():
            signal.signal(s, h)
    # The rpc agent is shut down and everything is printed. Leave without the interpreter's
    # teardown: TensorPipe's agent, destroyed there with its transport threads, intermittently
    # aborts the process ("terminate called without an active exception", SIGABRT) after a
    # clean stop — seen under load in CI, after the "stopping" line.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def register(subparsers) -> None:
    """Add ``moment serve``."""
    p = subparsers.add_parser(
        "serve", help="serve sampled mini-batches of a dataset to trainers (moment train --server)",
        description="Own a dataset's graph and serve sampled mini-batches to one or more trainers. "
                    "Sampler worker processes write batches into shared memory the trainers on this host "
                    "lend them; torch.distributed.rpc carries control (and batches to other hosts). "
                    "Trainers must use the same batch size, fan-outs and seed; each batch is exactly what "
                    "the trainer would sample itself.",
        **examples("moment serve --dataset graph --fanouts 25,10 --batch-size 8000 --port 29600 &",
                   "moment train --dataset graph --server 127.0.0.1:29600 --fanouts 25,10 --batch-size 8000"),
    )
    p.add_argument("--dataset", required=True, metavar="DIR", help="dataset directory (with a train split)")
    net = p.add_argument_group("network")
    net.add_argument("--host", default="127.0.0.1",
                     help="address to listen on (default 127.0.0.1: this machine only)")
    net.add_argument("--port", type=port, default=29600, help="port (default 29600; 0 = any free port)")
    smp = p.add_argument_group("sampling (trainers must match)")
    smp.add_argument("--fanouts", type=argtype(parse_fanouts), default=(25, 10), metavar="F1,F2,...",
                     help="neighbours per hop, hop 1 first; -1 = all (default 25,10)")
    smp.add_argument("--batch-size", type=_positive(int), default=1024, metavar="N",
                     help="global seeds per step over all trainers (default 1024)")
    smp.add_argument("--seed", type=int, default=0, help="shuffle / sampling seed (default 0)")
    run = p.add_argument_group("running")
    run.add_argument("--workers", type=_non_negative_int, default=None, metavar="N",
                     help="sampler worker processes for trainers on this host (default: one per CPU; "
                          "with --device cuda one per GPU, at most that); their batches go through shared memory")
    run.add_argument("--lanes", type=_positive(int), default=4, metavar="N",
                     help="requests a worker samples in one pass at most (default 4; 1 = one at a time); "
                          "each lane costs the worker 8 bytes per vertex")
    run.add_argument("--torch-sampler", action="store_true",
                     help="workers sample on the torch path, --lanes requests fused in one pass (the same "
                          "batches; default: the compiled sampler, one request at a time, cheaper per batch)")
    run.add_argument("--threads", type=_positive(int), default=1,
                     help="sampling threads in the server for trainers on other hosts (default 1)")
    run.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                     help="where the workers sample (cuda: batches handed over by CUDA IPC)")
    run.add_argument("--timeout", type=_positive(float), default=30.0, metavar="S",
                     help="rpc timeout of the server's calls (default 30)")
    run.add_argument("--trainer-timeout", type=_positive(float), default=10.0, metavar="S",
                     help="forget a trainer that does not answer a ping within S seconds (default 10)")
    run.add_argument("--max-trainers", type=_positive(int), metavar="N",
                     help="exit once N trainers have connected and all have left")
    run.add_argument("--idle-exit", type=_positive(float), metavar="S",
                     help="exit after S seconds without a connected trainer")
    run.add_argument("--no-validate", action="store_true",
                     help="skip the dataset's value checks at start (large graphs)")
    p.set_defaults(func=_serve_command)

