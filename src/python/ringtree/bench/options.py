"""The command line of ``ringtree-bench`` and the tables it is built on: collectives (with
their bus-bandwidth factors), data types, reductions, and the size sweep.

Standard library only: this module is imported by the orchestrating process, which never
needs NumPy or mpi4py itself, and torch only for --device cuda and the gloo and nccl
systems (see :mod:`ringtree.bench.devices`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from typing import Callable

__all__ = [
    "COLLECTIVES",
    "DEVICES",
    "DTYPES",
    "HOST_ONLY_SYSTEMS",
    "REDOPS",
    "SYSTEMS",
    "TOOLS",
    "Collective",
    "DType",
    "build_parser",
    "parse_args",
    "parse_size",
    "size_sweep",
    "worker_argv",
]

PROG = "ringtree-bench"
#: The measurements other than the collective sweep: ``ringtree-bench NAME ...`` runs the
#: ``main`` of the module of this package named here (see cli.main).
TOOLS = {
    "call-overhead": "call_overhead",
    "ddp-step": "ddp_step",
    "failure-table": "failure_table",
    "groups": "groups",
    "p2p-pingpong": "p2p_pingpong",
    "rendezvous-faults": "rendezvous_faults",
    "scale": "scale",
    "startup": "startup",
}
SYSTEMS = ("ringtree", "ringtree-mpi", "gloo", "mpi", "nccl")
#: Where the buffers live: host memory, or the GPU of each rank (see --device).
DEVICES = ("cpu", "cuda")
#: The systems measured on host buffers only (--device cpu); "nccl" is the one measured
#: on CUDA buffers only, and "ringtree" runs on both.
HOST_ONLY_SYSTEMS = ("ringtree-mpi", "gloo", "mpi")
REDOPS = ("sum", "prod", "min", "max", "avg", "band", "bor", "bxor")
_REDOP_ALIASES = {"product": "prod", "mean": "avg"}
_BITWISE = ("band", "bor", "bxor")


@dataclasses.dataclass(frozen=True)
class Collective:
    """One benchmarked collective.

    ``functions`` are the torch.distributed functions the ringtree and gloo adapters of
    :mod:`ringtree.bench.systems` call for it; ``aliases`` are other names accepted on the
    command line (torch's spelling). ``busbw_factor(n)`` turns algbw into busbw at ``n``
    ranks (nccl-tests' factors); it is None for a collective without a payload, whose table
    shows time only.

    Sizes are nccl-tests' S, the bytes of the whole array. ``layout`` says how each rank's
    buffers relate to it:

    - ``in_place``: one buffer of S, input and output (allreduce, broadcast, reduce);
    - ``copy``: an input and an output of S each (sendrecv, pingpong);
    - ``gather``: the input is one rank's part, S / n; the output all n parts (allgather);
    - ``scatter``: the input is all n parts, the output one part (reduce_scatter);
    - ``exchange``: input and output are n parts each, one per peer (alltoall).

    For the last three the element count of S is a multiple of n, and the ``count`` column
    shows one part (nccl-tests' convention). ``transfers_per_call``: transfers of S one
    call makes one after the other; the row's time is per transfer (pingpong: 2, so time
    is half the round trip). ``min_ranks``: fewer ranks cannot run it.
    """

    name: str
    functions: tuple[str, ...]
    busbw_factor: Callable[[int], float] | None
    uses_redop: bool = False
    uses_root: bool = False
    layout: str = "in_place"
    aliases: tuple[str, ...] = ()
    transfers_per_call: int = 1
    min_ranks: int = 1

    @property
    def has_data(self) -> bool:
        """Whether the collective moves a buffer (and so sweeps sizes and can be checked)."""
        return self.busbw_factor is not None

    @property
    def in_place(self) -> bool:
        """Whether the output overwrites the input (else a second buffer holds it)."""
        return self.layout == "in_place"

    def parts(self, world_size: int) -> int:
        """How many equal parts S is made of: ``world_size`` when split by rank, else 1."""
        return world_size if self.layout in ("gather", "scatter", "exchange") else 1

    def buffer_parts(self, world_size: int) -> tuple[int, int]:
        """(input, output) of one rank, in parts of S (see :meth:`parts`)."""
        n = world_size
        return {"gather": (1, n), "scatter": (n, 1), "exchange": (n, n)}.get(self.layout, (1, 1))


def _allreduce_factor(world_size: int) -> float:
    return 2.0 * (world_size - 1) / world_size


def _all_but_own_part_factor(world_size: int) -> float:
    return (world_size - 1) / world_size


def _unit_factor(world_size: int) -> float:
    return 1.0


COLLECTIVES = {
    c.name: c
    for c in (
        Collective("allreduce", ("all_reduce",), _allreduce_factor, uses_redop=True, aliases=("all_reduce",)),
        Collective("broadcast", ("broadcast",), _unit_factor, uses_root=True),
        Collective("reduce", ("reduce",), _unit_factor, uses_redop=True, uses_root=True),
        Collective("barrier", ("barrier",), None),
        Collective(
            "allgather", ("all_gather_single",), _all_but_own_part_factor, layout="gather",
            aliases=("all_gather", "all_gather_single", "all_gather_into_tensor"),
        ),
        Collective(
            "reduce_scatter", ("reduce_scatter_single",), _all_but_own_part_factor, uses_redop=True, layout="scatter",
            aliases=("reducescatter", "reduce_scatter_single", "reduce_scatter_tensor"),
        ),
        Collective(
            "alltoall", ("all_to_all_single",), _all_but_own_part_factor, layout="exchange",
            aliases=("all_to_all", "all_to_all_single"),
        ),
        Collective("sendrecv", ("isend", "irecv"), _unit_factor, layout="copy", min_ranks=2),
        Collective("pingpong", ("send", "recv"), _unit_factor, layout="copy", transfers_per_call=2, min_ranks=2),
    )
}
# Other spellings accepted on the command line.
_COLLECTIVE_ALIASES = {alias: name for name, c in COLLECTIVES.items() for alias in c.aliases}


@dataclasses.dataclass(frozen=True)
class DType:
    """An element type. ``name`` is torch's (``torch.float32``), ``label`` what nccl-tests
    prints in its ``type`` column. ``exact_max``: every integer in [0, exact_max] is
    representable (verification data and results stay within it; uint8's stops at 254, so
    that 255 marks an element a collective did not write); ``pow2_max``: the largest k with 2**k
    representable; ``eps``: the unit roundoff (0 for integers)."""

    name: str
    label: str
    itemsize: int
    is_float: bool
    exact_max: int
    pow2_max: int
    eps: float


DTYPES = {
    d.name: d
    for d in (
        DType("float32", "float", 4, True, 2**24, 127, 2.0**-23),
        DType("float16", "half", 2, True, 2**11, 15, 2.0**-10),
        DType("bfloat16", "bfloat16", 2, True, 2**8, 127, 2.0**-7),
        DType("float64", "double", 8, True, 2**53, 1023, 2.0**-52),
        DType("int8", "int8", 1, False, 2**7 - 1, 6, 0.0),
        DType("uint8", "uint8", 1, False, 2**8 - 2, 7, 0.0),
        DType("int32", "int32", 4, False, 2**31 - 1, 30, 0.0),
        DType("int64", "int64", 8, False, 2**53, 62, 0.0),
    )
}
_DTYPE_ALIASES = {
    "float": "float32",
    "f32": "float32",
    "fp32": "float32",
    "half": "float16",
    "f16": "float16",
    "fp16": "float16",
    "bf16": "bfloat16",
    "double": "float64",
    "f64": "float64",
    "fp64": "float64",
    "int": "int32",
    "long": "int64",
}

_SIZE_RE = re.compile(r"^\s*(\d+)\s*(?:([kmgt])(?:i?b)?|b)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {None: 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes from ``"8"``, ``"64K"``, ``"64M"``, ``"1G"`` (binary multiples, as in nccl-tests;
    ``KB``/``KiB`` and lower case are accepted too). Raises ValueError for anything else."""
    match = _SIZE_RE.match(text)
    if match is None:
        raise ValueError(f"not a size: {text!r} (expected e.g. 8, 64K, 64M, 1G)")
    number, unit = match.groups()
    return int(number) * _SIZE_UNITS[unit.lower() if unit else None]


def size_sweep(
    minbytes: int, maxbytes: int, factor: int, itemsize: int, parts: int = 1
) -> list[tuple[int, int]]:
    """The (bytes, elements) pairs of a sweep: minbytes, minbytes*factor, ... up to maxbytes,
    each rounded down to whole elements, and to a multiple of ``parts`` elements (a
    collective whose S is split by rank, see :meth:`Collective.parts`); sizes that round
    down to nothing are dropped and duplicates removed."""
    if minbytes < 1 or factor < 2:
        raise ValueError(f"need minbytes >= 1 and factor >= 2, got {minbytes} and {factor}")
    sweep: list[tuple[int, int]] = []
    size = minbytes
    while size <= maxbytes:
        count = size // itemsize // parts * parts
        if count and (not sweep or sweep[-1][1] != count):
            sweep.append((count * itemsize, count))
        size *= factor
    return sweep


def _size_arg(text: str) -> int:
    try:
        size = parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if size < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte, got {text!r}")
    return size


def _int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def _collectives_arg(text: str) -> list[Collective]:
    """One positional word: a collective name, or several separated by commas."""
    found = []
    for word in filter(None, text.lower().split(",")):
        name = _COLLECTIVE_ALIASES.get(word, word)
        if name not in COLLECTIVES:
            raise argparse.ArgumentTypeError(
                f"unknown collective {word!r}; expected one of {', '.join(COLLECTIVES)}"
            )
        found.append(COLLECTIVES[name])
    return found


def _dtype_arg(text: str) -> DType:
    name = _DTYPE_ALIASES.get(text.lower(), text.lower())
    if name not in DTYPES:
        raise argparse.ArgumentTypeError(f"unknown data type {text!r}; expected one of {', '.join(DTYPES)}")
    return DTYPES[name]


def _redop_arg(text: str) -> str:
    name = _REDOP_ALIASES.get(text.lower(), text.lower())
    if name not in REDOPS:
        raise argparse.ArgumentTypeError(f"unknown reduction {text!r}; expected one of {', '.join(REDOPS)}")
    return name


def _systems_arg(text: str) -> list[str]:
    names = [word for word in text.lower().split(",") if word]
    for name in names:
        if name not in SYSTEMS:
            raise argparse.ArgumentTypeError(
                f"unknown system {name!r}; expected some of {', '.join(SYSTEMS)}"
            )
    return names


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (flags follow nccl-tests where they exist there)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Benchmark collectives nccl-tests style: ringtree, and side by side torch's "
        "gloo backend and MPI (mpi4py) on host buffers, or torch's NCCL backend on CUDA buffers "
        "(--device cuda). With --nproc N the command launches N local ranks per "
        "system itself; without it, it is one rank of a job started by ringtree-run, torchrun "
        "or mpirun.",
        epilog="example: ringtree-bench allreduce allgather reduce_scatter alltoall sendrecv --nproc 4 "
        f"-b 8 -e 64M --compare gloo,mpi -c 1 --repeat 3; on GPUs: {PROG} allreduce --device cuda --nproc 2 "
        f"--compare nccl. Other measurements: {PROG} "
        f"{{{','.join(TOOLS)}}} ... (each with its own --help).",
    )
    parser.add_argument(
        "collectives",
        nargs="*",
        type=_collectives_arg,
        metavar="COLLECTIVE",
        help=f"what to benchmark, in order: {', '.join(COLLECTIVES)} (torch names such as "
        "all_reduce, all_gather, all_to_all too; several as separate words or comma-separated; "
        "default allreduce). pingpong: rank 0 sends to rank 1, which sends it back; time is "
        "half the round trip",
    )
    sizes = parser.add_argument_group("sizes and iterations")
    sizes.add_argument(
        "-b",
        "--minbytes",
        type=_size_arg,
        default=8,
        metavar="SIZE",
        help="smallest size in bytes, K/M/G suffixes allowed (default 8)",
    )
    sizes.add_argument(
        "-e",
        "--maxbytes",
        type=_size_arg,
        default=64 << 20,
        metavar="SIZE",
        help="largest size in bytes (default 64M)",
    )
    sizes.add_argument(
        "-f",
        "--stepfactor",
        type=_int_at_least(2),
        default=2,
        metavar="F",
        help="multiply the size by F at each step (default 2)",
    )
    sizes.add_argument(
        "-n",
        "--iters",
        type=_int_at_least(1),
        default=20,
        metavar="N",
        help="timed operations per size (default 20)",
    )
    sizes.add_argument(
        "-w",
        "--warmup_iters",
        "--warmup-iters",
        type=_int_at_least(0),
        default=5,
        metavar="N",
        help="untimed operations before them (default 5)",
    )
    sizes.add_argument(
        "--timing",
        choices=("avg", "median"),
        default="avg",
        help="avg: per-rank average over the timed operations, max over ranks (nccl-tests); median: "
        "each operation timed, the slowest rank's time per operation, median over operations (robust "
        "to preemption; one more clock read per operation) (default avg)",
    )
    data = parser.add_argument_group("data")
    data.add_argument(
        "-c",
        "--check",
        type=int,
        choices=(0, 1),
        default=1,
        help="1: before timing, run each size once on integer-valued data and count "
        "the wrong elements (#wrong, exact; 2 ulp for float avg); 0: skip (default 1)",
    )
    data.add_argument(
        "-d",
        "--datatype",
        type=_dtype_arg,
        default=DTYPES["float32"],
        metavar="TYPE",
        help=f"element type: {', '.join(DTYPES)} (default float32)",
    )
    data.add_argument(
        "-o",
        "--op",
        type=_redop_arg,
        default="sum",
        metavar="OP",
        help=f"reduction: {', '.join(REDOPS)} (default sum)",
    )
    data.add_argument(
        "-r",
        "--root",
        type=_int_at_least(0),
        default=0,
        metavar="RANK",
        help="root of broadcast and reduce (default 0)",
    )
    data.add_argument(
        "--device",
        choices=DEVICES,
        default="cpu",
        help="cpu: buffers in host memory; cuda: torch CUDA tensors, every rank on GPU LOCAL_RANK, "
        "the device synchronised before each clock read; systems ringtree and nccl (default cpu)",
    )
    data.add_argument(
        "--allow-shared-gpu",
        action="store_true",
        help="with --device cuda: let more ranks than GPUs share them round-robin (ringtree then "
        "stages through host memory; nccl, which refuses shared GPUs, is skipped)",
    )
    systems = parser.add_argument_group("systems and launch")
    systems.add_argument(
        "--nproc",
        type=_int_at_least(1),
        default=None,
        metavar="N",
        help="launch N local ranks per system; without it this process is one "
        "rank of a job started by a launcher",
    )
    systems.add_argument(
        "--system",
        choices=SYSTEMS,
        default=None,
        help="the system benchmarked (and the numerator of the ratios): default "
        "ringtree, or mpi when started by mpirun without RANK set; nccl is torch's NCCL backend "
        "(--device cuda only)",
    )
    systems.add_argument(
        "--backend",
        choices=("gloo", "mpi"),
        default=None,
        help="the backend of the ringtree system: gloo (ringtree's own engine, the default) or mpi "
        "(ringtree's API over the MPI library, launched by mpirun; the same as --system ringtree-mpi)",
    )
    systems.add_argument(
        "--compare",
        type=_systems_arg,
        default=[],
        metavar="LIST",
        help="with --nproc: also run these systems (comma-separated, of ringtree, ringtree-mpi, gloo, mpi "
        "on cpu; ringtree, nccl on cuda) on the same sizes and print a side-by-side table",
    )
    systems.add_argument(
        "--repeat",
        type=_int_at_least(1),
        default=1,
        metavar="K",
        help="with --nproc: run everything K times, systems interleaved, and "
        "report per-size medians (default 1)",
    )
    systems.add_argument(
        "--algo",
        default=None,
        metavar="NAME",
        help="ringtree only: algorithm (ring, tree, halving_doubling, chain), passed as RINGTREE_ALGO; "
        "a collective that lacks it keeps its automatic choice",
    )
    systems.add_argument(
        "--transport",
        choices=("auto", "tcp", "shm"),
        default=None,
        help="ringtree only: transport, passed as RINGTREE_TRANSPORT",
    )
    systems.add_argument(
        "--mpirun-args",
        default="",
        metavar="ARGS",
        help="extra arguments for mpirun (one string, split like a shell)",
    )
    systems.add_argument(
        "--timeout",
        type=_int_at_least(1),
        default=3600,
        metavar="S",
        help="seconds one launch of one system may take, and the timeout of its process group (default 3600)",
    )
    output = parser.add_argument_group("output")
    output.add_argument("-J", "--json", default=None, metavar="FILE", help="write all results as JSON")
    output.add_argument(
        "--plot",
        default=None,
        metavar="FILE.png",
        help="with --nproc: plot busbw and time against size (needs matplotlib)",
    )
    parser.add_argument("--result-file", default=None, help=argparse.SUPPRESS)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and check the command line (argparse exits with status 2 on errors).

    The result has ``collectives`` as a list of :class:`Collective` (duplicates removed),
    ``datatype`` as a :class:`DType` and ``compare`` without the primary system.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    unique: dict[str, Collective] = {}
    for group in args.collectives or [[COLLECTIVES["allreduce"]]]:
        for collective in group:
            unique.setdefault(collective.name, collective)
    args.collectives = list(unique.values())
    if args.maxbytes < args.minbytes:
        parser.error(f"--maxbytes ({args.maxbytes}) is below --minbytes ({args.minbytes})")
    if args.op in _BITWISE and args.datatype.is_float:
        parser.error(f"--op {args.op} needs an integer --datatype, not {args.datatype.name}")
    if args.nproc is None:
        for flag, value in (
            ("--compare", args.compare),
            ("--plot", args.plot),
            ("--repeat", args.repeat > 1),
        ):
            if value:
                parser.error(f"{flag} needs --nproc (this process is one rank of a launched job)")
    elif args.root >= args.nproc:
        parser.error(f"--root {args.root} is not a rank of --nproc {args.nproc}")
    if args.backend == "mpi":
        if args.system not in (None, "ringtree", "ringtree-mpi"):
            parser.error(f"--backend mpi names the ringtree-mpi system, not --system {args.system}")
        args.system = "ringtree-mpi"
    if args.system is None:
        args.system = "mpi" if args.nproc is None and _started_by_mpirun() else "ringtree"
    args.compare = [name for name in dict.fromkeys(args.compare) if name != args.system]
    _check_device(parser, args)
    return args


def _check_device(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The parser's error for a system that cannot run on ``--device``, or
    ``--allow-shared-gpu`` without CUDA. Whether this machine has the GPUs is asked later
    (:func:`ringtree.bench.devices.check`): parsing never imports torch."""
    if args.allow_shared_gpu and args.device != "cuda":
        parser.error("--allow-shared-gpu needs --device cuda")
    for name in [args.system, *args.compare]:
        if name == "nccl" and args.device != "cuda":
            parser.error("the nccl system (torch's NCCL backend) needs --device cuda")
        if name in HOST_ONLY_SYSTEMS and args.device == "cuda":
            parser.error(f"the {name} system measures host buffers only: --device cuda runs ringtree and nccl")


def _started_by_mpirun() -> bool:
    """Whether this process looks like an MPI rank rather than a torch-style one."""
    env = os.environ
    return "RANK" not in env and ("OMPI_COMM_WORLD_RANK" in env or "PMI_RANK" in env)


def worker_argv(args: argparse.Namespace, system: str, result_file: str) -> list[str]:
    """The arguments of ``python -m ringtree.bench`` for one rank of ``system`` launched by
    the orchestrator, which reads the rows from ``result_file``."""
    flags = {
        "-b": args.minbytes,
        "-e": args.maxbytes,
        "-f": args.stepfactor,
        "-n": args.iters,
        "-w": args.warmup_iters,
        "--timing": args.timing,
        "-c": args.check,
        "-d": args.datatype.name,
        "-o": args.op,
        "-r": args.root,
        "--timeout": args.timeout,
        "--device": args.device,
        "--system": system,
        "--result-file": result_file,
    }
    argv = [",".join(c.name for c in args.collectives)]
    for flag, value in flags.items():
        argv += [flag, str(value)]
    return argv + (["--allow-shared-gpu"] if args.allow_shared_gpu else [])
