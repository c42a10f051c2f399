"""Two (or more) processes sum a buffer with ringtree.

Run:  ringtree-run --nproc-per-node 2 examples/python/allreduce.py

Works with any buffer that exports DLPack or the buffer protocol: torch tensors, NumPy
arrays, or (as here, so that nothing else needs installing) the standard library's array.
"""

from array import array

import ringtree as dist

dist.init_process_group("gloo")  # env:// from the variables ringtree-run sets
rank, world_size = dist.get_rank(), dist.get_world_size()

data = array("d", [rank + 1.0] * 4)
dist.all_reduce(data, op=dist.ReduceOp.SUM)  # in place, on every rank
expected = world_size * (world_size + 1) / 2
print(f"rank {rank}/{world_size}: all_reduce -> {list(data)} (expected {expected} each)")

root_value = array("i", [42 if rank == 0 else 0])
dist.broadcast(root_value, src=0)
print(f"rank {rank}/{world_size}: broadcast from rank 0 -> {root_value[0]}")

dist.barrier()
dist.destroy_process_group()
