"""A small model trained with torch's DistributedDataParallel on synthetic data, over
torch.distributed's backend "ringtree" (or "gloo", to compare): the only ringtree-specific
part of a training program is the backend name.

Run:  torchrun --nproc-per-node 2 examples/python/train_ddp.py --backend ringtree
      torchrun --nproc-per-node 2 examples/python/train_ddp.py --backend gloo

Rank 0 prints the loss every few steps and the median time per step. Nothing imports
ringtree: installing it registers the backend with torch.
"""

import argparse
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="ringtree", help="torch.distributed backend (default ringtree)")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--width", type=int, default=1024, help="hidden width of the model")
    parser.add_argument("--batch", type=int, default=32, help="samples per rank and step")
    args = parser.parse_args()

    dist.init_process_group(args.backend)  # env://: torchrun's variables
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial model everywhere (DDP broadcasts rank 0's anyway)
    model = nn.Sequential(nn.Linear(64, args.width), nn.ReLU(), nn.Linear(args.width, args.width), nn.ReLU(),
                          nn.Linear(args.width, 1))
    ddp = DDP(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    # Synthetic regression: y = sum of the first 8 features, with noise; each rank its own samples.
    generator = torch.Generator().manual_seed(1000 + rank)
    step_times = []
    for step in range(args.steps):
        x = torch.randn(args.batch, 64, generator=generator)
        y = x[:, :8].sum(dim=1, keepdim=True) + 0.1 * torch.randn(args.batch, 1, generator=generator)
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()  # gradients are all-reduced here, bucket by bucket
        optimizer.step()
        step_times.append(time.perf_counter() - start)
        if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {loss.item():.4f}", flush=True)
    if rank == 0:
        parameters = sum(p.numel() for p in model.parameters())
        print(f"{args.backend}: {world_size} ranks, {parameters / 1e6:.2f} M parameters, "
              f"median step {statistics.median(step_times[5:] or step_times) * 1000:.1f} ms", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
