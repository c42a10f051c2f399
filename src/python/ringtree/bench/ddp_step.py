"""``ringtree-bench ddp-step``: the step time of torch's DistributedDataParallel over the
backends "ringtree" and "gloo", in one run, and what ringtree's torch layer adds.

Model: ``--layers`` Linear(W, W) layers with ReLU between them (W = ``--width``; the
defaults, 6 x 2048, make 25.2 M float32 parameters, 100 MB of gradients a step, all-reduced
in DDP's 25 MB buckets), batch ``--batch`` per rank, SGD. Each job times ``--steps`` steps
after 3 warm-up steps (median), and, on the same processes, the same steps without DDP
(local forward, backward and optimizer step: the compute), and with DDP whose comm hook
communicates nothing (it returns each bucket as it is: DDP's own work, copying gradients
into buckets and back, with compute). The communication share is 1 - compute / step; the
time the backend can save at most is step - "DDP without communication". It also times one 25 MiB float32 all_reduce (DDP's bucket size) through
torch.distributed (median of 10), and, for ringtree, the same call through ringtree's own
API on a group of its own: the difference is what the torch layer adds.

Jobs: ``--rounds`` rounds, each running every backend once (the order rotated from round
to round), ``--nproc`` ranks per job on this host, started by this process and meeting
over ``tcp://`` (rank 0 hosts torch's TCPStore). The table gives the median over rounds of
each job's medians.

``--gradient-as-bucket-view`` gives both DDPs ``gradient_as_bucket_view=True``: the
gradients are views into the buckets, so DDP copies nothing, and what is left of a step
besides the compute is the communication.

Usage: ``ringtree-bench ddp-step [--nproc 2] [--rounds 3] [--steps 20] [--width 2048]
[--layers 6] [--batch 8] [--gradient-as-bucket-view]`` (needs torch).
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import socket
import statistics
import sys
import time
from datetime import date, timedelta
from typing import NoReturn

from .rank_processes import Ranks, emit

BACKENDS = ["ringtree", "gloo"]
BUCKET_BYTES = 25 << 20
WARMUP = 3
_WORKER = [sys.executable, "-m", "ringtree.bench", "ddp-step", "--worker"]


# --- rank side -------------------------------------------------------------------------------


def _median_ms(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def _no_communication(state, bucket):
    """A DDP comm hook that communicates nothing: the bucket as it is, in a done future."""
    import torch

    future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def _worker(backend: str, rank: int, world_size: int, ports: list[int], options: list[int]) -> NoReturn:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    steps, width, layers, batch, bucket_view = options
    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{ports[0]}", rank=rank, world_size=world_size,
                            timeout=timedelta(minutes=5))
    torch.manual_seed(0)
    modules: list[nn.Module] = []
    for _ in range(layers):
        modules += [nn.Linear(width, width), nn.ReLU()]
    model = nn.Sequential(*modules[:-1])
    inputs = torch.randn(batch, width, generator=torch.Generator().manual_seed(rank))

    def train(module: nn.Module, optimizer) -> None:
        optimizer.zero_grad()
        module(inputs).square().mean().backward()
        optimizer.step()

    silent = DDP(copy.deepcopy(model), gradient_as_bucket_view=bool(bucket_view))
    silent.register_comm_hook(None, _no_communication)
    ddp = DDP(model, gradient_as_bucket_view=bool(bucket_view))
    ddp_optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    for _ in range(WARMUP):
        train(ddp, ddp_optimizer)
    step_ms = _median_ms(lambda: train(ddp, ddp_optimizer), steps)
    dist.barrier()
    silent_optimizer = torch.optim.SGD(silent.parameters(), lr=1e-3)
    for _ in range(WARMUP):
        train(silent, silent_optimizer)
    silent_ms = _median_ms(lambda: train(silent, silent_optimizer), steps)
    dist.barrier()
    local_optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for _ in range(WARMUP):
        train(model, local_optimizer)
    compute_ms = _median_ms(lambda: train(model, local_optimizer), steps)
    dist.barrier()
    bucket = torch.ones(BUCKET_BYTES // 4)
    dist.all_reduce(bucket)
    bucket_ms = _median_ms(lambda: dist.all_reduce(bucket), 10)
    native_ms = None
    if backend == "ringtree":
        import ringtree

        ringtree.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{ports[1]}", rank=rank,
                                    world_size=world_size, timeout=timedelta(minutes=5))
        ringtree.all_reduce(bucket)
        native_ms = _median_ms(lambda: ringtree.all_reduce(bucket), 10)
        ringtree.destroy_process_group()
    parameters = sum(p.numel() for p in model.parameters())
    emit("done", step_ms=step_ms, compute_ms=compute_ms, silent_ms=silent_ms, bucket_ms=bucket_ms, native_ms=native_ms,
         parameters=parameters)
    dist.destroy_process_group()
    os._exit(0)


# --- driver side -----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_job(backend: str, args: argparse.Namespace) -> dict:
    """One job; rank 0's report (the slowest rank sets DDP's pace, and they wait for each
    other every bucket, so rank 0's step time is the job's)."""
    ports = f"{_free_port()},{_free_port()}"
    options = f"{args.steps},{args.width},{args.layers},{args.batch},{int(args.gradient_as_bucket_view)}"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    commands = [[*_WORKER, backend, str(rank), str(args.nproc), ports, options] for rank in range(args.nproc)]
    ranks = Ranks(commands, env, time.monotonic() + 600)
    try:
        report = ranks.wait_for(0, ("done",))
    finally:
        ranks.close()
    if report is None:
        raise RuntimeError(f"{backend}: rank 0 did not finish its job")
    return report


def main(argv: list[str] | None = None) -> int:
    """Run the jobs and print the table; with ``--worker backend rank world_size ports
    options`` as the arguments, be one rank of a job instead."""
    if argv and argv[0] == "--worker":
        backend, rank, world_size, ports, options = argv[1:6]
        _worker(backend, int(rank), int(world_size), [int(p) for p in ports.split(",")],
                [int(o) for o in options.split(",")])
    parser = argparse.ArgumentParser(prog="ringtree-bench ddp-step",
                                     description="DDP step time over ringtree and gloo.")
    parser.add_argument("--nproc", type=int, default=2, help="ranks per job (default 2)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of one job per backend (default 3)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per job (default 20)")
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--batch", type=int, default=8, help="samples per rank and step (default 8)")
    parser.add_argument("--gradient-as-bucket-view", action="store_true",
                        help="DDP(gradient_as_bucket_view=True): gradients live in the buckets, no copies")
    args = parser.parse_args(argv)
    import ringtree
    import torch

    reports: dict[str, list[dict]] = {backend: [] for backend in BACKENDS}
    for round_index in range(args.rounds):
        order = BACKENDS[round_index % len(BACKENDS):] + BACKENDS[:round_index % len(BACKENDS)]
        for backend in order:
            reports[backend].append(_run_job(backend, args))
            print(f"round {round_index + 1}: {backend} done", file=sys.stderr, flush=True)

    def median(backend: str, field: str) -> float | None:
        values = [r[field] for r in reports[backend] if r[field] is not None]
        return statistics.median(values) if values else None

    parameters = reports[BACKENDS[0]][0]["parameters"]
    print(f"DDP, {args.nproc} ranks on one host, {date.today().isoformat()}, {os.cpu_count()} CPUs "
          f"({platform.machine()}), ringtree {ringtree.__version__}, torch {torch.__version__}; "
          f"{parameters / 1e6:.1f} M parameters ({args.layers} x Linear({args.width}, {args.width})), batch "
          f"{args.batch} per rank, gradient_as_bucket_view={args.gradient_as_bucket_view}, {args.steps} timed steps "
          f"per job, median of {args.rounds} rounds.\n")
    print("| backend | step (ms) | compute alone (ms) | DDP without communication (ms) | communication share "
          "| 25 MiB all_reduce via torch (ms) | same via ringtree's API (ms) |")
    print("|---|---|---|---|---|---|---|")
    for backend in BACKENDS:
        step, compute = median(backend, "step_ms"), median(backend, "compute_ms")
        native = median(backend, "native_ms")
        share = max(0.0, 1 - compute / step)
        print(f"| {backend} | {step:.1f} | {compute:.1f} | {median(backend, 'silent_ms'):.1f} | {share:.0%} | "
              f"{median(backend, 'bucket_ms'):.2f} | "
              f"{'-' if native is None else f'{native:.2f}'} |")
    ours, theirs = median("ringtree", "step_ms"), median("gloo", "step_ms")
    print(f"\nringtree's step is {theirs / ours:.2f}x as fast as gloo's.")
    return 0
