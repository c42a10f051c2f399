"""Functions run by harness.run_world for test_groups.py and test_monitored_barrier.py, in
each rank's process.

Each joins the default group through the TCPStore the test hosts, makes groups, runs
collectives on them and returns what it observed (values, ranks, warnings, error
messages) as JSON; the tests compute the expected values from the member lists and
compare exactly. Buffers are ``array.array``s of small integers (so results are exact),
and this module does not import torch: the worlds start several processes each, and
importing torch in each would be most of the tests' time. Tensors on subgroups are covered
by test_differential_gloo.py.
"""

from __future__ import annotations

import functools
import time
import warnings
from array import array
from datetime import timedelta

import ringtree as dist

NON_MEMBER = dist.GroupMember.NON_GROUP_MEMBER


def init(rank: int, world_size: int, port: int) -> None:
    store = dist.TCPStore("127.0.0.1", port, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=60))


def error_of(call) -> dict | None:
    """None if ``call()`` returns, else the error's class name and message."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return {"type": type(exc).__name__, "message": str(exc)}
    return None


def member_round(group, ranks: list[int], rank: int, salt: int) -> dict:
    """all_reduce, broadcast, reduce and barrier on ``group``, whose members are the world
    ranks ``ranks`` in group rank order; sync and async alternate with ``salt``. Returns
    the values this rank ended with."""
    async_op = salt % 2 == 1

    def run(fn, *args, **kwargs):
        work = fn(*args, group=group, async_op=async_op, **kwargs)
        if async_op:
            work.wait()
        else:
            assert work is None

    size = len(ranks)
    summed = array("q", [rank + 1, salt])
    run(dist.all_reduce, summed)
    src = ranks[salt % size]
    broadcasted = array("d", [rank * 10 + salt])
    run(dist.broadcast, broadcasted, src=src)
    dst = ranks[(size - 1 - salt) % size]
    maxed = array("i", [rank + salt])
    run(dist.reduce, maxed, group_dst=ranks.index(dst), op=dist.ReduceOp.MAX)
    mined = array("i", [rank + salt])
    run(dist.reduce, mined, dst=dst, op=dist.ReduceOp.MIN)
    run(dist.barrier)
    return {"sum": list(summed), "bcast": broadcasted[0], "src": src, "max": maxed[0], "min": mined[0], "dst": dst}


def family_round(group, ranks: list[int], rank: int) -> dict:
    """The gather/scatter family, point-to-point (a ring over the members, by world rank)
    and an object collective on ``group``, whose members are the world ranks ``ranks``
    in group rank order. Returns what this rank received."""
    size, me = len(ranks), ranks.index(rank)
    gathered = [array("q", [0, 0]) for _ in ranks]
    dist.all_gather(gathered, array("q", [rank, me]), group=group)
    scattered_sum = array("q", [0])
    dist.reduce_scatter(scattered_sum, [array("q", [rank * 10 + j]) for j in range(size)], group=group)
    exchanged = array("q", [0] * size)
    dist.all_to_all_single(exchanged, array("q", [rank * 100 + j for j in range(size)]), group=group)
    gather_list = [array("q", [0]) for _ in ranks] if rank == ranks[-1] else None
    dist.gather(array("q", [rank]), gather_list, dst=ranks[-1], group=group)
    scattered = array("q", [0])
    scatter_list = [array("q", [ranks[0] * 10 + j]) for j in range(size)] if rank == ranks[0] else None
    dist.scatter(scattered, scatter_list, src=ranks[0], group=group)
    objects = [None] * size
    dist.all_gather_object(objects, {"rank": rank}, group=group)
    out = {"all_gather": [list(a) for a in gathered], "reduce_scatter": scattered_sum[0],
           "all_to_all_single": list(exchanged), "gather": gather_list and [a[0] for a in gather_list],
           "scatter": scattered[0], "objects": objects}
    if size > 1:
        received = array("q", [-1])
        works = [dist.irecv(received, src=ranks[(me - 1) % size], group=group),
                 dist.isend(array("q", [rank]), dst=ranks[(me + 1) % size], group=group)]
        for work in works:
            work.wait()
        out["ring"] = received[0]
    return out


def non_member_calls(group) -> dict:
    """What the collectives and the queries do with a group this rank is not in."""
    buffer = array("d", [7.0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        returned = [
            dist.all_reduce(buffer, group=group),
            dist.broadcast(buffer, src=0, group=group),
            dist.reduce(buffer, dst=0, group=group, async_op=True),
            dist.barrier(group=group),
            dist.monitored_barrier(group=group),
        ]
    dist.destroy_process_group(group)  # a no-op
    return {
        "is_non_member": group == NON_MEMBER,
        "rank": dist.get_rank(group), "size": dist.get_world_size(group),
        "returned": returned, "unchanged": list(buffer),
        "warnings": [str(w.message) for w in caught],
        "get_backend": error_of(lambda: dist.get_backend(group)),
        "get_process_group_ranks": error_of(lambda: dist.get_process_group_ranks(group)),
    }


def translation(group, ranks: list[int], world_size: int) -> dict:
    """Rank translation on a group this rank is in."""
    outsider = next((r for r in range(world_size) if r not in ranks), None)
    return {
        "ranks": dist.get_process_group_ranks(group),
        "global": [dist.get_global_rank(group, i) for i in range(len(ranks))],
        "group": [dist.get_group_rank(group, r) for r in ranks],
        "outsider": None if outsider is None else error_of(lambda: dist.get_group_rank(group, outsider)),
        "bad_group_rank": error_of(lambda: dist.get_global_rank(group, len(ranks))),
    }


def summed_over(group, rank: int) -> int:
    """all_reduce of rank + 1 over ``group``."""
    buffer = array("q", [rank + 1])
    dist.all_reduce(buffer, group=group)
    return buffer[0]


def groups_world(rank: int, world_size: int, port: int) -> dict:
    """Strict-subset, overlapping and reordered groups used alternately with the world
    (every kind of collective and point-to-point on each); non-member behaviour; subgroups, enumeration, split_group, member-only groups; rank
    translation; destroy and re-create."""
    init(rank, world_size, port)
    n = world_size
    specs = {
        "subset": list(range(1, n)) or [0],  # every rank but 0
        "low": list(range((n + 2) // 2)),  # overlaps "high" in the middle
        "high": list(range(n // 2, n)),
        "reversed": list(reversed(range(n))),
    }
    groups = {name: dist.new_group(ranks, sort_ranks=name != "reversed") for name, ranks in specs.items()}
    groups["world"], specs["world"] = dist.group.WORLD, list(range(n))
    out: dict = {"membership": {}, "rounds": [], "non_member": {}, "translation": {}}
    for name, group in groups.items():
        out["membership"][name] = [dist.get_rank(group), dist.get_world_size(group)]
        if rank in specs[name]:
            out["translation"][name] = translation(group, specs[name], n)
        else:
            out["non_member"][name] = non_member_calls(group)
    for salt in range(3):  # each group in turn, three times
        out["rounds"].append({name: member_round(group, specs[name], rank, salt)
                              for name, group in groups.items() if rank in specs[name]})
    out["family"] = {name: family_round(group, specs[name], rank) for name, group in groups.items()
                     if rank in specs[name]}
    # Async work on the two overlapping groups in flight at once.
    pending = []
    for name, value in (("low", 1.0), ("high", 2.0)):
        if rank in specs[name]:
            buffer = array("d", [value] * 4)
            pending.append((buffer, dist.all_reduce(buffer, group=groups[name], async_op=True)))
    for _, work in pending:
        work.wait()
    out["overlapping_async"] = [buffer[0] for buffer, _ in pending]

    out["subgroups"] = {}
    for size in [d for d in range(1, n + 1) if n % d == 0]:
        mine, every = dist.new_subgroups(group_size=size)
        out["subgroups"][size] = {"ranks": dist.get_process_group_ranks(mine), "sum": summed_over(mine, rank),
                                  "count": len(every), "non_members": every.count(NON_MEMBER)}
    evens = list(range(0, n, 2))
    mine, every = dist.new_subgroups_by_enumeration([evens])
    out["enumeration"] = {"mine": None if mine is None else dist.get_process_group_ranks(mine),
                          "every": [g == NON_MEMBER for g in every]}

    split = dist.split_group(split_ranks=[evens, list(range(1, n, 2))] if n > 1 else [[0]])
    out["split"] = {"ranks": dist.get_process_group_ranks(split), "sum": summed_over(split, rank),
                    "desc": split.group_desc}
    if rank in specs["high"]:  # only the parent's members call split_group on it
        child = dist.split_group(groups["high"], split_ranks=[[0]])
        out["split_of_high"] = None if child is None else dist.get_process_group_ranks(child)

    if rank in specs["low"]:  # member-only groups: the other ranks never call new_group
        local = [dist.new_group(specs["low"], use_local_synchronization=True) for _ in range(2)]
        out["local"] = {"sums": [summed_over(group, rank) for group in local],
                        "names_differ": local[0].group_name != local[1].group_name}

    # Destroy and re-create the "low" group; every rank calls new_group again.
    dist.destroy_process_group(groups["low"])
    recreated = dist.new_group(specs["low"])
    if rank in specs["low"]:
        out["destroyed_use"] = error_of(lambda: dist.all_reduce(array("d", [1.0]), group=groups["low"]))
        out["destroy_again"] = error_of(lambda: dist.destroy_process_group(groups["low"]))
        out["recreated"] = {"sum": summed_over(recreated, rank),
                            "same_name": recreated.group_name == groups["low"].group_name}
    else:
        out["recreated"] = {"non_member": recreated == NON_MEMBER}
    out["pg_count"] = dist.get_pg_count()
    dist.destroy_process_group()
    out["pg_count_after_destroy"] = dist.get_pg_count()
    return out


# --- monitored_barrier ----------------------------------------------------------------------


def _timed(call) -> dict:
    start = time.monotonic()
    result = error_of(call) or {"type": None, "message": ""}
    result["elapsed"] = time.monotonic() - start
    return result


def monitored_barrier_keys(group, first: int, last: int, size: int) -> list[str]:
    """The store keys of ``group``'s monitored barriers number first..last still set."""
    keys = [f"ringtree/monitored_barrier/{k}/{suffix}" for k in range(first, last + 1)
            for suffix in ["verdict"] + [f"arrived/{r}" for r in range(size)]]
    return [key for key in keys if group.store.check([key])]


def late_arrivals(rank: int, late: list[int], wait_all_ranks: bool, timeout_s: float, late_by_s: float) -> dict:
    """A monitored_barrier of the world that the ranks ``late`` reach ``late_by_s`` after
    the others, then two that every rank reaches in time (the group recovers)."""
    dist.barrier()  # everyone is here: the lateness below is the only delay
    if rank in late:
        time.sleep(late_by_s)
    failed = _timed(lambda: dist.monitored_barrier(timeout=timedelta(seconds=timeout_s), wait_all_ranks=wait_all_ranks))
    dist.barrier()  # the late ranks have been through it too
    recovered = _timed(lambda: dist.monitored_barrier(timeout=timedelta(seconds=30)))
    again = _timed(lambda: dist.monitored_barrier(timeout=timedelta(seconds=30)))
    return {"failed": failed, "recovered": recovered, "again": again}


def monitored_barrier_world(rank: int, world_size: int, port: int, late: list[int], timeout_s: float,
                            late_by_s: float) -> dict:
    """Late ranks without and with wait_all_ranks (and the keys left afterwards), passing
    barriers on the world and on a subgroup, a non-member, rank 0 arriving late (the others
    give up, and rank 0 then fails too), a destroyed group."""
    init(rank, world_size, port)
    out: dict = {}
    for wait_all_ranks in (False, True):
        out[f"late/{wait_all_ranks}"] = late_arrivals(rank, late, wait_all_ranks, timeout_s, late_by_s)
        dist.barrier()
        if rank == 0:
            barriers = 3 * (1 + wait_all_ranks)
            out[f"keys_left/{wait_all_ranks}"] = monitored_barrier_keys(dist.group.WORLD, 1, barriers, world_size)
    out["passes"] = [error_of(functools.partial(dist.monitored_barrier, timeout=timedelta(seconds=30),
                                                wait_all_ranks=k % 2 == 1)) for k in range(4)]
    dist.barrier()
    if rank == 0:
        out["keys_left_after_passes"] = monitored_barrier_keys(dist.group.WORLD, 1, 10, world_size)
    subgroup = dist.new_group(list(range(1, world_size)))
    if subgroup == NON_MEMBER:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out["non_member"] = {"returned": dist.monitored_barrier(group=subgroup),
                                 "warnings": [str(w.message) for w in caught]}
    else:
        out["subgroup"] = error_of(lambda: dist.monitored_barrier(group=subgroup, timeout=timedelta(seconds=30)))
    dist.barrier()
    if rank == 0:
        time.sleep(late_by_s)
    out["root_late"] = _timed(lambda: dist.monitored_barrier(timeout=timedelta(seconds=timeout_s)))
    dist.barrier()
    if subgroup != NON_MEMBER:
        dist.destroy_process_group(subgroup)
        out["destroyed"] = error_of(lambda: dist.monitored_barrier(group=subgroup))
    dist.destroy_process_group()
    return out


# --- groups over the world's connections ----------------------------------------------------


def shared_connections(rank: int, world_size: int, port: int) -> dict:
    """Twenty groups (all ranks, pairs, a reversed order) open no socket; two groups and the
    world run large all_reduces at once from three threads; a mismatch in one group leaves
    the world and the other groups working."""
    import threading

    from ringtree.bench.scale import open_sockets as sockets

    init(rank, world_size, port)
    n = world_size
    dist.barrier()
    before = sockets()
    specs = [list(range(n)), [0, n - 1], list(reversed(range(n)))] * 7
    groups = [dist.new_group(ranks, sort_ranks=False) for ranks in specs[:20]]
    after = sockets()
    members = {i: ranks for i, ranks in enumerate(specs[:20]) if rank in ranks}
    sums = {i: summed_over(groups[i], rank) for i in members}

    results: dict = {}

    def loop(name, group, ranks, rounds=6, count=1 << 18):
        got = []
        for r in range(rounds):
            buffer = array("d", [float(rank + r)]) * count
            dist.all_reduce(buffer, group=group)
            got.append(buffer[count // 2] == float(sum(x + r for x in ranks)) and buffer[0] == buffer[-1])
        results[name] = all(got)

    threads = [threading.Thread(target=loop, args=("world", dist.group.WORLD, list(range(n))))]
    threads.append(threading.Thread(target=loop, args=("all", groups[0], specs[0])))
    if rank in specs[1]:
        threads.append(threading.Thread(target=loop, args=("pair", groups[1], specs[1])))
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    # A mismatch in the pair group: both its ranks fail, the rest goes on.
    mismatch = None
    if rank in specs[1]:
        buffer = array("d", [1.0] * 8)
        if rank == 0:
            mismatch = error_of(lambda: dist.all_reduce(buffer, group=groups[1]))
        else:
            mismatch = error_of(lambda: dist.broadcast(buffer, src=0, group=groups[1]))
    after_failure = {"world": summed_over(dist.group.WORLD, rank), "all": summed_over(groups[0], rank)}
    dist.destroy_process_group()
    return {"before": before, "after": after, "sums": sums, "members": {i: r for i, r in members.items()},
            "concurrent": results, "mismatch": mismatch, "after_failure": after_failure}
