"""Two (or more) processes find each other through ringtree's rendezvous.

Run:  ringtree-run --nproc-per-node 2 examples/python/hello.py
"""

import ringtree as dist

dist.init_process_group("gloo")  # env:// from the variables ringtree-run sets
rank, world_size = dist.get_rank(), dist.get_world_size()

store = dist.group.WORLD.store  # the group's view of the job's key-value store
store.set(f"greeting/{rank}", f"hello from rank {rank}")
arrived = store.add("arrived", 1)
peer = (rank + 1) % world_size
print(f"rank {rank}/{world_size}: arrived #{arrived}; rank {peer} says {store.get(f'greeting/{peer}').decode()!r}")

dist.destroy_process_group()
