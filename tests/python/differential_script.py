"""One rank of the differential program: the same deterministic cases run under
torch.distributed (backend "gloo"), under ringtree (``import ringtree as dist``) and under
torch.distributed with ringtree's torch backend (``init_process_group("ringtree")``), one
after the other in this process (importing torch once for all).

    python differential_script.py --rank R --world-size N --coord-port C --out-dir DIR \
        --run torch:P1 --run ringtree:P2 [--cases a,b,...] [--extra-torch-cases a,b,...]

For each ``--run IMPL:PORT`` (IMPL: torch, ringtree or torch-ringtree), joins the job with
``init_process_group(BACKEND, init_method="tcp://127.0.0.1:PORT")``, runs every case, and
writes ``{case: {"ok": True, "outputs": {...}} | {"ok": False, "error": ...}}`` to
``DIR/IMPL-R.pt`` with torch.save. Each case is independent: when any rank fails one, every
rank learns it through the coordination store at port C (a ringtree TCPStore the test
hosts, unrelated to the stores under test), and all re-create the default group before
the next case, so a function one implementation lacks fails only its own case. Inputs are
small integers (exact in every dtype), except in ``all_reduce_random_float``.
"""

from __future__ import annotations

import argparse
import importlib
import traceback
import warnings
from datetime import timedelta

import torch

import ringtree

GROUP_TIMEOUT = timedelta(seconds=15)
# A case that neither finishes nor fails on every rank within this is abandoned.
CASE_TIMEOUT = timedelta(seconds=40)

INT_DTYPES = [torch.int8, torch.uint8, torch.int32, torch.int64]
FLOAT_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def values(rank: int, count: int, dtype: torch.dtype, salt: int = 0, span: int = 7) -> torch.Tensor:
    """Rank's input: integers in [-(span // 2), span // 2] (uint8: [0, span)), bool: a pattern."""
    k = torch.arange(count, dtype=torch.int64) * 5 + rank * 3 + salt
    if dtype is torch.bool:
        return (k % 3) == 0
    if dtype is torch.uint8:
        return (k % span).to(dtype)
    if dtype.is_complex:
        return torch.complex((k % span - span // 2).double(), (k % 5 - 2).double()).to(dtype)
    return (k % span - span // 2).to(dtype)


def bit_patterns(rank: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    k = torch.arange(count, dtype=torch.int64) + rank * 1000
    return ((k * 2654435761 + 12345) % 251).to(dtype)


# --- the cases: each returns {name: tensor or picklable object} -------------------------------


def reduce_op_case(op_name: str, dtypes: list[torch.dtype], bitwise: bool = False, span: int = 7):
    def case(dist, rank, n):
        op = getattr(dist.ReduceOp, op_name)
        out = {}
        for dtype in dtypes:
            for count in (1, 33):
                t = bit_patterns(rank, count, dtype) if bitwise else values(rank, count, dtype, span=span)
                dist.all_reduce(t, op=op)
                out[f"{dtype}/{count}"] = t
        return out
    return case


def all_reduce_random_float(dist, rank, n):
    generator = torch.Generator().manual_seed(1234 + rank)
    t = torch.randn(4097, generator=generator)
    dist.all_reduce(t)
    return {"sum": t}


def all_reduce_async(dist, rank, n):
    a, b = values(rank, 1000, torch.float32), values(rank, 5, torch.int64)
    works = [dist.all_reduce(a, async_op=True), dist.broadcast(b, src=n - 1, async_op=True)]
    for work in works:
        work.wait()
    return {"a": a, "b": b, "completed": [work.is_completed() for work in works]}


def async_results_and_futures(dist, rank, n):
    """Work.result() and Work.get_future() values of async collectives. Left out:
    all_gather_single (gloo's future holds its per-rank chunks, ringtree's [output]) and
    reduce_scatter (gloo's Work has no future: "Work::getFuture not implemented")."""
    out = {}
    t = values(rank, 6, torch.float32)
    calls = {
        "all_reduce": lambda: dist.all_reduce(t, async_op=True),
        "broadcast": lambda: dist.broadcast(t, src=n - 1, async_op=True),
        "reduce": lambda: dist.reduce(t.clone(), dst=0, async_op=True),
        "all_gather": lambda: dist.all_gather([torch.zeros(6) for _ in range(n)], t, async_op=True),
        "gather": lambda: dist.gather(t, [torch.zeros(6) for _ in range(n)] if rank == 0 else None, dst=0,
                                      async_op=True),
        "scatter": lambda: dist.scatter(torch.zeros(6), [t + r for r in range(n)] if rank == 0 else None, src=0,
                                        async_op=True),
        "all_to_all": lambda: dist.all_to_all([torch.zeros(2) for _ in range(n)],
                                              [t[:2] + r for r in range(n)], async_op=True),
        "all_to_all_single": lambda: dist.all_to_all_single(torch.zeros(2 * n), t[:1].repeat(2 * n),
                                                            async_op=True),
        "barrier": lambda: dist.barrier(async_op=True),
    }
    for name, call in calls.items():
        work = call()
        value = work.get_future().wait()
        work.wait()  # gloo may complete the future before the Work, and result() needs the Work
        out[name] = {"future": [v.clone() for v in value], "result": [v.clone() for v in work.result()]}
        if name == "reduce" and rank != 0:  # see reduce(): only the destination's buffer is specified
            out[name] = {"future": len(value), "result": len(work.result())}
    out["then"] = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0] * 2).wait()
    return out


def broadcast(dist, rank, n):
    out = {}
    for src in range(n):
        for dtype in (torch.float32, torch.int64, torch.bool, torch.bfloat16):
            t = values(rank, 37, dtype, salt=src)
            dist.broadcast(t, src=src)
            out[f"{src}/{dtype}"] = t
    return out


def reduce(dist, rank, n):
    """Only the destination's result is compared: torch leaves what the others' buffers
    hold afterwards unspecified (gloo leaves partial results there, ringtree the input)."""
    out = {}
    for dst in range(n):
        for op_name in ("SUM", "MAX", "PRODUCT"):
            t = values(rank, 19, torch.float32, salt=dst, span=5)
            dist.reduce(t, dst=dst, op=getattr(dist.ReduceOp, op_name))
            if rank == dst:
                out[f"{dst}/{op_name}"] = t
    return out


def all_gather(dist, rank, n):
    out = {}
    for dtype in (torch.float32, torch.int32, torch.bool):
        outputs = [torch.zeros(6, dtype=dtype) for _ in range(n)]
        dist.all_gather(outputs, values(rank, 6, dtype))
        out[str(dtype)] = outputs
    return out


def all_gather_into_tensor(dist, rank, n):
    output = torch.zeros(5 * n, dtype=torch.float64)
    dist.all_gather_into_tensor(output, values(rank, 5, torch.float64))
    stacked = torch.zeros(n, 3, dtype=torch.int64)
    dist.all_gather_into_tensor(stacked, values(rank, 3, torch.int64).reshape(1, 3))
    return {"flat": output, "stacked": stacked}


def gather(dist, rank, n):
    out = {}
    for dst in range(n):
        gather_list = [torch.zeros(4, dtype=torch.int32) for _ in range(n)] if rank == dst else None
        dist.gather(values(rank, 4, torch.int32, salt=dst), gather_list, dst=dst)
        out[str(dst)] = gather_list
    return out


def scatter(dist, rank, n):
    out = {}
    for src in range(n):
        scatter_list = [values(j, 4, torch.float32, salt=src) for j in range(n)] if rank == src else None
        t = torch.zeros(4)
        dist.scatter(t, scatter_list, src=src)
        out[str(src)] = t
    return out


def reduce_scatter(dist, rank, n):
    out = {}
    for op_name in ("SUM", "MAX"):
        output = torch.zeros(7, dtype=torch.int64)
        inputs = [values(rank, 7, torch.int64, salt=j) for j in range(n)]
        dist.reduce_scatter(output, inputs, op=getattr(dist.ReduceOp, op_name))
        out[op_name] = output
    return out


def reduce_scatter_tensor(dist, rank, n):
    output = torch.zeros(6)
    dist.reduce_scatter_tensor(output, values(rank, 6 * n, torch.float32))
    return {"sum": output}


def all_to_all(dist, rank, n):
    """Tensors of one size: gloo refuses lists of different sizes (see gloo_limits)."""
    outputs = [torch.zeros(3, dtype=torch.int64) for _ in range(n)]
    dist.all_to_all(outputs, [values(rank, 3, torch.int64, salt=j) for j in range(n)])
    return {"outputs": outputs}


def split_sizes(n: int) -> list[list[int]]:
    """[sender][receiver] element counts of the uneven all_to_all_single (some are 0)."""
    return [[(sender + 2 * receiver) % 3 for receiver in range(n)] for sender in range(n)]


def all_to_all_single(dist, rank, n):
    splits = split_sizes(n)
    input_splits = splits[rank]
    output_splits = [splits[sender][rank] for sender in range(n)]
    output = torch.zeros(sum(output_splits))
    dist.all_to_all_single(output, values(rank, sum(input_splits), torch.float32), output_splits, input_splits)
    even = torch.zeros(2 * n, dtype=torch.int32)
    dist.all_to_all_single(even, values(rank, 2 * n, torch.int32))
    return {"uneven": output, "even": even}


def _pairs(n: int) -> list[tuple[int, int]]:
    return [(a, b) for a in range(n) for b in range(a + 1, n)]


def send_recv(dist, rank, n):
    """Every pair exchanges one tensor, pairs in one global order: the lower rank sends
    first, so blocking calls never wait on each other in a cycle."""
    out = {}
    for a, b in _pairs(n):
        if rank not in (a, b):
            continue
        peer = b if rank == a else a
        received = torch.zeros(9)
        if rank == a:
            dist.send(values(rank, 9, torch.float32, salt=peer), dst=peer)
            dist.recv(received, src=peer)
        else:
            dist.recv(received, src=peer)
            dist.send(values(rank, 9, torch.float32, salt=peer), dst=peer)
        out[f"from {peer}"] = received
    return out


def recv_any_source(dist, rank, n):
    """Rank 0 receives from every other rank with src=None; recv returns the sender."""
    if rank != 0:
        dist.send(values(rank, 3, torch.int64), dst=0)
        return {}
    received = {}
    for _ in range(n - 1):
        t = torch.zeros(3, dtype=torch.int64)
        sender = dist.recv(t)
        received[sender] = t
    return {"received": dict(sorted(received.items()))}


def isend_irecv(dist, rank, n):
    receives = {peer: torch.zeros(5, dtype=torch.float64) for peer in range(n) if peer != rank}
    works = [dist.irecv(t, src=peer, tag=7) for peer, t in receives.items()]
    works += [dist.isend(values(rank, 5, torch.float64, salt=peer), dst=peer, tag=7) for peer in receives]
    for work in works:
        work.wait()
    return {f"from {peer}": t for peer, t in receives.items()}


def batch_isend_irecv(dist, rank, n):
    right, left = (rank + 1) % n, (rank - 1) % n
    from_left, from_right = torch.zeros(4), torch.zeros(4)
    ops = [
        dist.P2POp(dist.isend, values(rank, 4, torch.float32, salt=1), right),
        dist.P2POp(dist.irecv, from_left, left),
        dist.P2POp(dist.isend, values(rank, 4, torch.float32, salt=2), left),
        dist.P2POp(dist.irecv, from_right, right),
    ]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return {"from_left": from_left, "from_right": from_right}


def _object(rank: int) -> dict:
    return {"rank": rank, "list": list(range(rank + 1)), "text": "x" * (rank * 50), "nested": {"t": (rank, None)}}


def all_gather_object(dist, rank, n):
    gathered = [None] * n
    dist.all_gather_object(gathered, _object(rank))
    return {"gathered": gathered}


def broadcast_object_list(dist, rank, n):
    out = {}
    for src in range(n):
        objects = [_object(rank), [rank] * 3] if rank == src else [None, None]
        dist.broadcast_object_list(objects, src=src)
        out[str(src)] = objects
    return out


def gather_object(dist, rank, n):
    out = {}
    for dst in range(n):
        gathered = [None] * n if rank == dst else None
        dist.gather_object(_object(rank), gathered, dst=dst)
        out[str(dst)] = gathered
    return out


def scatter_object_list(dist, rank, n):
    out = {}
    for src in range(n):
        output = [None]
        dist.scatter_object_list(output, [_object(j) for j in range(n)] if rank == src else None, src=src)
        out[str(src)] = output
    return out


def barrier(dist, rank, n):
    return {"returned": [dist.barrier(), dist.barrier(timeout=timedelta(seconds=10))]}


def monitored_barrier(dist, rank, n):
    return {"returned": [dist.monitored_barrier(timeout=timedelta(seconds=10)),
                         dist.monitored_barrier(timeout=timedelta(seconds=10), wait_all_ranks=True)]}


def subgroups(dist, rank, n):
    """A strict subset and a reordered group: membership, translation, collectives inside,
    and what a non-member gets (return values and the warning's text)."""
    ranks = [1] if n == 2 else [0, 2]
    subset = dist.new_group(ranks)
    reordered = dist.new_group(list(reversed(range(n))), sort_ranks=False)
    out = {"subset": [dist.get_rank(subset), dist.get_world_size(subset)],
           "reordered": [dist.get_rank(reordered), dist.get_world_size(reordered)],
           "reordered_ranks": dist.get_process_group_ranks(reordered),
           "reordered_global": [dist.get_global_rank(reordered, i) for i in range(n)]}
    t = values(rank, 6, torch.int64)
    if rank in ranks:
        out["subset_ranks"] = dist.get_process_group_ranks(subset)
        out["group_rank"] = dist.get_group_rank(subset, rank)
        dist.all_reduce(t, group=subset)
        dist.broadcast(t, src=ranks[-1], group=subset)
        reduced = values(rank, 3, torch.int32)
        dist.reduce(reduced, dst=ranks[0], group=subset, op=dist.ReduceOp.MAX)
        if rank == ranks[0]:  # see reduce(): only the destination's buffer is specified
            out["subset_reduce"] = reduced
        dist.barrier(group=subset)
    else:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out["non_member_returns"] = [dist.all_reduce(t, group=subset),
                                         dist.broadcast(t, src=ranks[0], group=subset), dist.barrier(group=subset)]
        out["non_member_warnings"] = [str(w.message) for w in caught]
    out["subset_result"] = t
    r = values(rank, 4, torch.float32)
    dist.broadcast(r, group_src=0, group=reordered)
    dist.all_reduce(r, group=reordered)
    out["reordered_result"] = r
    dist.destroy_process_group(subset)
    dist.destroy_process_group(reordered)
    return out


def gloo_limits(dist, rank, n):
    """What torch's gloo refuses (run under torch only; test_differential_gloo.py lists
    these as data): the error message of each attempt."""
    attempts = {
        "PREMUL_SUM": lambda: dist.all_reduce(torch.ones(2), op=dist._make_nccl_premul_sum(2.0)),
        "AVG on integers": lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist.ReduceOp.AVG),
        "int16": lambda: dist.all_reduce(torch.ones(2, dtype=torch.int16)),
        "split_group": lambda: dist.split_group(split_ranks=[list(range(n))]),
        "all_to_all of different sizes": lambda: dist.all_to_all(
            [torch.zeros(j + 1) for j in range(n)], [torch.zeros(rank + 1) for _ in range(n)]),
    }
    out = {}
    for name, attempt in attempts.items():
        try:
            attempt()
            out[name] = None
        except Exception as exc:  # noqa: BLE001 - the point of the case
            out[name] = str(exc)
    return out


CASES = {
    "all_reduce_sum": reduce_op_case("SUM", FLOAT_DTYPES + INT_DTYPES + [torch.bool, torch.complex64]),
    "all_reduce_product": reduce_op_case("PRODUCT", FLOAT_DTYPES + [torch.int32, torch.int64], span=5),
    "all_reduce_min": reduce_op_case("MIN", FLOAT_DTYPES + INT_DTYPES + [torch.bool]),
    "all_reduce_max": reduce_op_case("MAX", FLOAT_DTYPES + INT_DTYPES + [torch.bool]),
    "all_reduce_avg": reduce_op_case("AVG", FLOAT_DTYPES),
    "all_reduce_band": reduce_op_case("BAND", INT_DTYPES, bitwise=True),
    "all_reduce_bor": reduce_op_case("BOR", INT_DTYPES, bitwise=True),
    "all_reduce_bxor": reduce_op_case("BXOR", INT_DTYPES, bitwise=True),
    "all_reduce_random_float": all_reduce_random_float,
    "all_reduce_async": all_reduce_async,
    "async_results_and_futures": async_results_and_futures,
    "broadcast": broadcast,
    "reduce": reduce,
    "all_gather": all_gather,
    "all_gather_into_tensor": all_gather_into_tensor,
    "gather": gather,
    "scatter": scatter,
    "reduce_scatter": reduce_scatter,
    "reduce_scatter_tensor": reduce_scatter_tensor,
    "all_to_all": all_to_all,
    "all_to_all_single": all_to_all_single,
    "send_recv": send_recv,
    "recv_any_source": recv_any_source,
    "isend_irecv": isend_irecv,
    "batch_isend_irecv": batch_isend_irecv,
    "all_gather_object": all_gather_object,
    "broadcast_object_list": broadcast_object_list,
    "gather_object": gather_object,
    "scatter_object_list": scatter_object_list,
    "barrier": barrier,
    "monitored_barrier": monitored_barrier,
    "subgroups": subgroups,
    "gloo_limits": gloo_limits,
}


# --- running them ---------------------------------------------------------------------------


# impl -> (the module whose API the cases call, the backend they init)
IMPLS = {
    "torch": ("torch.distributed", "gloo"),
    "ringtree": ("ringtree", "gloo"),
    "torch-ringtree": ("torch.distributed", "ringtree"),
}


def _init(dist, backend: str, port: int, args, attempt: str = "") -> None:
    """The first group over tcp://127.0.0.1:PORT; one re-created after a failed case
    (``attempt`` names it) over a file of its own: a TCPStore server re-created on the same
    port races with clients still connected to the one before."""
    method = f"file://{args.out_dir}/{attempt}" if attempt else f"tcp://127.0.0.1:{port}"
    dist.init_process_group(backend, init_method=method, rank=args.rank, world_size=args.world_size,
                            timeout=GROUP_TIMEOUT)


def _all_ranks_succeeded(coord, key: str, args, ok: bool) -> bool:
    coord.set(f"{key}/{args.rank}", b"1" if ok else b"0")
    keys = [f"{key}/{r}" for r in range(args.world_size)]
    coord.wait(keys, CASE_TIMEOUT)
    return all(coord.get(k) == b"1" for k in keys)


def run_cases(impl: str, port: int, cases: list[str], coord, args) -> dict:
    module, backend = IMPLS[impl]
    dist = importlib.import_module(module)
    _init(dist, backend, port, args)
    results = {}
    for name in cases:
        try:
            results[name] = {"ok": True, "outputs": CASES[name](dist, args.rank, args.world_size)}
        except Exception as exc:  # noqa: BLE001 - recorded, compared by the test
            results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        if not _all_ranks_succeeded(coord, f"{impl}/{name}", args, results[name]["ok"]):
            # Some rank failed: start the next case on a fresh default group everywhere.
            dist.destroy_process_group()
            _init(dist, backend, port, args, attempt=f"{impl}-after-{name}")
    dist.destroy_process_group()
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--coord-port", type=int, required=True)
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--run", action="append", required=True, help="IMPL:PORT, IMPL one of " + ", ".join(IMPLS))
    parser.add_argument("--cases", default=",".join(name for name in CASES if name != "gloo_limits"))
    parser.add_argument("--extra-torch-cases", default="gloo_limits")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", FutureWarning)  # torch 2.13's deprecation notices
    coord = ringtree.TCPStore("127.0.0.1", args.coord_port, timeout=CASE_TIMEOUT)
    for run in args.run:
        impl, port = run.split(":")
        cases = args.cases.split(",")
        if impl == "torch" and args.extra_torch_cases:
            cases += args.extra_torch_cases.split(",")
        results = run_cases(impl, int(port), cases, coord, args)
        torch.save(results, f"{args.out_dir}/{impl}-{args.rank}.pt")


if __name__ == "__main__":
    main()
