"""Bandwidth of ringtree's CUDA reduction kernel on one GPU, next to the device's copy
bandwidth measured in the same run.

    python benchmarks/cuda_kernel_bench.py [--sizes 16M,64M,256M,1G] [--dtypes float32,bfloat16,float16,int32]
                                           [--op sum] [-n 20] [-w 3] [--device 0] [--json FILE]

For each element type and buffer size S (bytes of one buffer), times
``ringtree._C._cuda_reduce(inout, in, ...)`` (inout[i] = inout[i] op in[i]) on the current
stream with CUDA events, one pair of events per operation, and reports the median over
``-n`` operations after ``-w`` untimed ones. Bytes moved: 3 x S per reduce (two reads, one
write), 2 x S per copy (``dst.copy_(src)`` between buffers of S bytes, timed the same
way, once per size). GB/s are 1e9 bytes per second. "% of copy" is the reduce's GB/s over
the copy's. Sizes whose two buffers fit in the GPU's L2 cache (16 MiB on an H200) read
above DRAM bandwidth; the goal is stated for 64 MiB and up.

Goal: float32, bfloat16 and float16 SUM reach >= 90% of the copy bandwidth at every size >= 64 MiB.
The last lines say whether each of those rows meets it (the exit status does not depend
on it). Without a GPU (torch without CUDA, no device, or ringtree's CUDA path unavailable)
it prints one line ``skipped: <reason>`` (also written to --json) and exits with status 0.
Exit status 2: an invalid command line.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys

# ringtree's DataType values (src/cpp/include/ringtree/types.h) of the types offered here.
DATA_TYPES = {"float16": 0, "bfloat16": 1, "float32": 2, "float64": 3, "int8": 4, "uint8": 5, "int16": 6,
              "int32": 7, "int64": 8}
REDUCE_OPS = {"sum": 0, "prod": 2, "min": 3, "max": 4, "band": 5, "bor": 6, "bxor": 7}
GOAL_RATIO = 0.90
GOAL_DTYPES = ("float32", "bfloat16", "float16")
GOAL_OP = "sum"
GOAL_MIN_BYTES = 64 << 20


def parse_size(text: str) -> int:
    match = re.fullmatch(r"(\d+)([KMG]?)(i?B?)", text.strip(), re.IGNORECASE)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 16M, 1G, 4096)")
    return int(match.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[match.group(2).upper()]


def size_text(nbytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="16M,64M,256M,1G",
                        help="bytes of one buffer, comma-separated, K/M/G = 2^10/2^20/2^30 (16M,64M,256M,1G)")
    parser.add_argument("--dtypes", default="float32,bfloat16,float16,int32",
                        help=f"element types, comma-separated, of {','.join(DATA_TYPES)} "
                             "(float32,bfloat16,float16,int32)")
    parser.add_argument("--op", default="sum", choices=sorted(REDUCE_OPS), help="reduction (sum)")
    parser.add_argument("-n", "--iters", type=int, default=20, help="timed operations per row (20)")
    parser.add_argument("-w", "--warmup", type=int, default=3, help="untimed operations before them (3)")
    parser.add_argument("--device", type=int, default=0, help="CUDA device (0)")
    parser.add_argument("--json", metavar="FILE", help="also write the rows, the copy bandwidths and the goal as JSON")
    args = parser.parse_args(argv)
    try:
        args.sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    args.dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    unknown = [d for d in args.dtypes if d not in DATA_TYPES]
    if unknown:
        parser.error(f"unknown --dtypes {unknown}; known: {', '.join(DATA_TYPES)}")
    if not args.sizes or not args.dtypes or args.iters < 1 or args.warmup < 0:
        parser.error("need at least one size and one dtype, --iters >= 1 and --warmup >= 0")
    return args


def why_no_gpu() -> str:
    """'' when the kernels can run here, else why not."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device"
    try:
        import ringtree.cuda
    except ImportError as exc:
        return f"ringtree is not importable: {exc}"
    if not ringtree.cuda.is_available():
        return "ringtree's CUDA path is unavailable: " + ringtree.cuda.unavailable_reason()
    return ""


def median_us(operation, iters: int, warmup: int) -> float:
    """The median over `iters` runs of operation() on the current stream, in microseconds,
    each bracketed by its own pair of CUDA events."""
    import torch

    for _ in range(warmup):
        operation()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for start, end in events:
        start.record()
        operation()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events) * 1e3


def measure(args: argparse.Namespace) -> dict:
    import torch

    from ringtree import _C

    torch.cuda.set_device(args.device)
    op_code = REDUCE_OPS[args.op]
    copy_rows, rows = [], []
    largest = max(args.sizes)
    # Two buffers of the largest size, reused (as bytes) for every size and type.
    inout_bytes = torch.empty(largest, dtype=torch.uint8, device="cuda")
    in_bytes = torch.empty(largest, dtype=torch.uint8, device="cuda")
    for nbytes in args.sizes:
        dst, src = inout_bytes[:nbytes], in_bytes[:nbytes]
        copy_us = median_us(lambda: dst.copy_(src), args.iters, args.warmup)
        copy_gbps = 2 * nbytes / (copy_us * 1e-6) / 1e9
        copy_rows.append({"bytes": nbytes, "time_us": copy_us, "gbps": copy_gbps})
        for name in args.dtypes:
            dtype = getattr(torch, name)
            count = nbytes // dtype.itemsize
            inout = inout_bytes[:count * dtype.itemsize].view(dtype)
            source = in_bytes[:count * dtype.itemsize].view(dtype)
            inout.fill_(1)
            source.fill_(0)  # sums stay finite whatever the number of runs
            stream = torch.cuda.current_stream().cuda_stream
            reduce_us = median_us(
                lambda: _C._cuda_reduce(inout.data_ptr(), source.data_ptr(), count, DATA_TYPES[name], op_code, stream),
                args.iters, args.warmup)
            reduce_gbps = 3 * count * dtype.itemsize / (reduce_us * 1e-6) / 1e9
            rows.append({"dtype": name, "op": args.op, "bytes": nbytes, "count": count, "reduce_us": reduce_us,
                         "reduce_gbps": reduce_gbps, "copy_us": copy_us, "copy_gbps": copy_gbps,
                         "ratio": reduce_gbps / copy_gbps})
    properties = torch.cuda.get_device_properties(args.device)
    return {"device": properties.name, "torch": torch.__version__, "copy": copy_rows, "rows": rows}


def goal_rows(result: dict) -> list[dict]:
    return [r for r in result["rows"]
            if r["dtype"] in GOAL_DTYPES and r["op"] == GOAL_OP and r["bytes"] >= GOAL_MIN_BYTES]


def report(result: dict, args: argparse.Namespace) -> list[str]:
    lines = [
        f"# ringtree CUDA reduction kernel vs device copy on {result['device']} (torch {result['torch']}), "
        f"median of {args.iters} after {args.warmup} warm-up",
        "# GB/s = 1e9 B/s; reduce moves 3 x size (2 reads + 1 write), copy 2 x size",
        f"# {'dtype':>9s} {'op':>4s} {'size':>9s} {'reduce (us)':>12s} {'reduce GB/s':>12s} "
        f"{'copy (us)':>10s} {'copy GB/s':>10s} {'% of copy':>10s}",
    ]
    for r in result["rows"]:
        lines.append(f"  {r['dtype']:>9s} {r['op'].upper():>4s} {size_text(r['bytes']):>9s} {r['reduce_us']:12.1f} "
                     f"{r['reduce_gbps']:12.0f} {r['copy_us']:10.1f} {r['copy_gbps']:10.0f} {100 * r['ratio']:9.1f}%")
    checked = goal_rows(result)
    if not checked:
        lines.append(f"# goal (>= {GOAL_RATIO:.0%} of copy for {'/'.join(GOAL_DTYPES)} {GOAL_OP.upper()} at "
                     f">= {size_text(GOAL_MIN_BYTES)}): no row measured it")
    else:
        missed = [r for r in checked if r["ratio"] < GOAL_RATIO]
        verdict = "met" if not missed else "MISSED at " + ", ".join(
            f"{r['dtype']} {size_text(r['bytes'])} ({100 * r['ratio']:.1f}%)" for r in missed)
        lines.append(f"# goal: >= {GOAL_RATIO:.0%} of copy bandwidth for {' and '.join(GOAL_DTYPES)} "
                     f"{GOAL_OP.upper()} at >= {size_text(GOAL_MIN_BYTES)}: {verdict}")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    reason = why_no_gpu()
    if reason:
        print(f"skipped: {reason}", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"tool": "cuda_kernel_bench", "skipped": reason}, f, indent=1)
        return 0
    result = measure(args)
    print("\n".join(report(result, args)), flush=True)
    checked = goal_rows(result)
    result.update({
        "tool": "cuda_kernel_bench",
        "settings": {"sizes": args.sizes, "dtypes": args.dtypes, "op": args.op, "iters": args.iters,
                     "warmup": args.warmup, "device": args.device},
        "goal": {"ratio": GOAL_RATIO, "dtypes": list(GOAL_DTYPES), "op": GOAL_OP, "min_bytes": GOAL_MIN_BYTES,
                 "checked": len(checked), "met": bool(checked) and all(r["ratio"] >= GOAL_RATIO for r in checked)},
    })
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
