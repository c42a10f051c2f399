"""``ringtree-bench call-overhead``: per-call cost of small synchronous and asynchronous
calls from Python, ringtree, torch's gloo backend (``--gloo``) or torch.distributed over
ringtree's torch backend (``--torch-ringtree``: what torch's layer adds), 8-byte float32
buffers.

* One rank, no launcher: ``ringtree-bench call-overhead [--gloo]`` (a one-rank group: what
  remains is the cost of the call itself: wrapper, bindings, engine, and for async calls
  the hand-off to the group's worker).
* Two ranks: ``RINGTREE_TRANSPORT=shm ringtree-run --nproc-per-node 2 -m ringtree.bench
  call-overhead`` (``torchrun --nproc-per-node 2 -m ringtree.bench call-overhead --gloo``
  for gloo); send/recv is timed as ping-pong, one way.

Each figure is the best of ``--repeats`` runs of ``--iterations`` calls (the machine may be
shared: the best run is the least disturbed); rank 0 prints ``name  time(us)``. Needs torch.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from collections.abc import Callable


def _init(dist, backend: str) -> None:
    """A one-rank group when no launcher set RANK, else the launcher's job."""
    if "RANK" in os.environ:
        dist.init_process_group(backend)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)


def _best_time_us(dist, call: Callable[[], None], iterations: int, repeats: int) -> float:
    for _ in range(iterations // 10):
        call()
    best = float("inf")
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iterations):
            call()
        best = min(best, (time.perf_counter() - start) / iterations * 1e6)
    return best


def main(argv: list[str] | None = None) -> int:
    """Run the measurement as one rank (the only one without a launcher); returns 0."""
    parser = argparse.ArgumentParser(
        prog="ringtree-bench call-overhead", description="Per-call cost of small calls from Python."
    )
    systems = parser.add_mutually_exclusive_group()
    systems.add_argument("--gloo", action="store_true", help="time torch.distributed's gloo backend instead")
    systems.add_argument("--torch-ringtree", action="store_true",
                         help="time torch.distributed over ringtree's torch backend instead")
    parser.add_argument("--iterations", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", FutureWarning)  # all_gather_into_tensor's deprecation

    import torch

    if args.gloo or args.torch_ringtree:
        import torch.distributed as dist
    else:
        import ringtree as dist
    _init(dist, "ringtree" if args.torch_ringtree else "gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    x = torch.zeros(2)
    gathered = torch.zeros(2 * size)
    exchanged = torch.zeros(2 * size)
    source = torch.zeros(2 * size)

    def four_async_then_waits() -> None:
        works = [dist.all_reduce(x, async_op=True) for _ in range(4)]
        for work in works:
            work.wait()

    calls: dict[str, tuple[Callable[[], None], int]] = {
        "all_reduce": (lambda: dist.all_reduce(x), 1),
        "all_reduce async + wait": (lambda: dist.all_reduce(x, async_op=True).wait(), 1),
        "4 x all_reduce async, then 4 waits": (four_async_then_waits, 1),
        "all_gather_into_tensor": (lambda: dist.all_gather_into_tensor(gathered, x), 1),
        "all_to_all_single": (lambda: dist.all_to_all_single(exchanged, source), 1),
    }
    if size == 2:
        peer = 1 - rank

        def ping_pong() -> None:
            if rank == 0:
                dist.send(x, peer)
                dist.recv(x, peer)
            else:
                dist.recv(x, peer)
                dist.send(x, peer)

        calls["send/recv, one way"] = (ping_pong, 2)
    for name, (call, per_call) in calls.items():
        iterations = args.iterations if "4 x" not in name else args.iterations // 4
        us = _best_time_us(dist, call, iterations, args.repeats) / per_call
        if rank == 0:
            print(f"{name:36s} {us:9.2f}", flush=True)
    dist.destroy_process_group()
    return 0
