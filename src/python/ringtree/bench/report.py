"""Rows, tables, medians, JSON and plots: everything ``ringtree-bench`` prints or writes.

A row is a dict with nccl-tests' columns (``size count type redop root time_us algbw busbw
wrong``) plus ``collective`` and, from a single run, ``rank_time_us`` (every rank's
per-operation average). ``time_us`` is the largest of the ranks' averages (or, with
``--timing median``, the median over operations of the slowest rank's time), per transfer
(half a pingpong round trip); ``count`` is one rank's part for a collective split by rank
(nccl-tests' convention, see :class:`~ringtree.bench.options.Collective`); algbw is
size / time in decimal GB/s; busbw is algbw times the collective's factor; both are None
for barrier. ``wrong`` is the number of wrong elements summed over ranks, None when
nothing was checked. Standard library only (matplotlib is imported by :func:`plot`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
from typing import Any
from collections.abc import Iterable

from .options import COLLECTIVES, Collective

__all__ = [
    "compare",
    "comparison_table",
    "format_footer",
    "format_header",
    "format_row",
    "json_document",
    "make_row",
    "median_rows",
    "plot",
    "settings_dict",
    "settings_line",
    "write_json",
]

_COLUMN_TITLES = (
    "#       size         count      type   redop    root     time   algbw   busbw #wrong",
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)",
)


def _placement(collective: Collective) -> str:
    return "in-place" if collective.in_place else "out-of-place"


def make_row(
    collective: Collective,
    type_label: str,
    op: str,
    root: int,
    world_size: int,
    size: int,
    count: int,
    per_rank: list[list[Any]],
    timing: str = "avg",
) -> dict[str, Any]:
    """The row of one size from every rank's ``[durations in seconds, wrong or None]``.

    ``timing="avg"``: each rank's durations are one per-operation average, and the time is
    the largest over ranks (nccl-tests). ``timing="median"``: each rank's durations are one
    per operation; the time is the median over operations of the largest over ranks. Either
    is divided by the collective's ``transfers_per_call``.
    """
    transfers = collective.transfers_per_call
    durations = [[seconds / transfers for seconds in mine] for mine, _ in per_rank]
    wrongs = [wrong for _, wrong in per_rank if wrong is not None]
    rank_us = [statistics.fmean(mine) * 1e6 for mine in durations]
    if timing == "median":
        time_us = statistics.median(max(column) for column in zip(*durations)) * 1e6
    else:
        time_us = max(rank_us)
    row = {
        "collective": collective.name,
        "size": size,
        "count": count,
        "type": type_label if collective.has_data else "none",
        "redop": op if collective.uses_redop else "none",
        "root": root if collective.uses_root else -1,
        "time_us": time_us,
        "wrong": sum(wrongs) if wrongs else None,
        "rank_time_us": rank_us,
    }
    _set_bandwidth(row, collective, world_size)
    return row


def _set_bandwidth(row: dict[str, Any], collective: Collective, world_size: int) -> None:
    if collective.busbw_factor is None or row["time_us"] <= 0:
        row["algbw"] = row["busbw"] = None
        return
    algbw = row["size"] / (row["time_us"] * 1e-6) / 1e9
    row["algbw"] = algbw
    row["busbw"] = algbw * collective.busbw_factor(world_size)


def median_rows(runs: list[list[dict[str, Any]]], world_size: int) -> list[dict[str, Any]]:
    """One row per (collective, size) over several runs: the median time (bandwidths
    recomputed from it), ``runs_time_us`` with every run's time, and the wrong elements
    summed over runs. Sizes missing from some runs (a run that failed) use the others."""
    grouped: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for rows in runs:
        for row in rows:
            grouped.setdefault((row["collective"], row["size"]), []).append(row)
    medians = []
    for (name, _), rows in grouped.items():
        first = rows[0]
        row = {key: first[key] for key in ("collective", "size", "count", "type", "redop", "root")}
        row["runs_time_us"] = [r["time_us"] for r in rows]
        row["time_us"] = statistics.median(row["runs_time_us"])
        wrongs = [r["wrong"] for r in rows if r["wrong"] is not None]
        row["wrong"] = sum(wrongs) if wrongs else None
        _set_bandwidth(row, COLLECTIVES[name], world_size)
        medians.append(row)
    return medians


def _by_magnitude(value: float, formats: tuple[tuple[float, str], ...], otherwise: str) -> str:
    """``value`` in the format of the first (lower bound, format) pair whose bound it
    reaches, else (smaller values, NaN) in ``otherwise``."""
    for bound, spec in formats:
        if value >= bound:
            return format(value, spec)
    return format(value, otherwise)


def _time_text(us: float) -> str:
    """nccl-tests' time format: fewer decimals as the time grows."""
    return _by_magnitude(us, ((10000.0, "7.0f"), (100.0, "7.1f")), "7.2f")


def _bw_text(value: float | None) -> str:
    return "   N/A" if value is None else f"{value:6.2f}"


def _ratio_text(ratio: float) -> str:
    """Two decimals, fewer for large ratios, two significant digits for small ones."""
    return _by_magnitude(ratio, ((100.0, ".0f"), (0.1, ".2f")), ".2g")


def settings_line(args: argparse.Namespace) -> str:
    """nccl-tests' first header line, with this tool's settings."""
    return (
        f"# {', '.join(c.name for c in args.collectives)}: minBytes {args.minbytes} maxBytes "
        f"{args.maxbytes} step: {args.stepfactor}(factor) warmup iters: {args.warmup_iters} "
        f"iters: {args.iters} validation: {args.check} type: {args.datatype.name} "
        f"redop: {args.op} root: {args.root}"
        + (f" device: cuda{' (shared GPUs allowed)' if args.allow_shared_gpu else ''}" if args.device == "cuda" else "")
    )


def format_header(
    system: str, collective: Collective, world_size: int, meta: dict[str, Any], runs: int, timing: str = "avg"
) -> list[str]:
    """The lines above one system's table of one collective."""
    details = [meta.get("version", system), f"{meta.get('buffers', '?')} buffers"]
    if meta.get("device"):
        details.append(meta["device"] + (f" ({meta['gpus']} GPUs on this host)" if meta.get("gpus") else ""))
    if meta.get("cuda_path"):
        details.append(f"CUDA path: {meta['cuda_path']}")
    details += [f"{key}={value}" for key, value in meta.get("env", {}).items()]
    if timing == "median":
        timing_text = "time = median over the timed iterations of the slowest rank's time"
    else:
        timing_text = "time = per-rank average over the timed iterations, max over ranks"
    if collective.transfers_per_call > 1:
        timing_text += f", divided by the {collective.transfers_per_call} transfers of one call"
    if runs > 1:
        timing_text += f", median of {runs} runs"
    if collective.busbw_factor is None:
        bandwidth = "no payload: time only"
    else:
        factor = collective.busbw_factor(world_size)
        bandwidth = f"algbw = size/time (GB/s = 1e9 B/s); busbw = algbw x {factor:.3g}"
    return [
        f"# {system} {collective.name}, {world_size} ranks, {_placement(collective)} ({'; '.join(details)})",
        f"# {timing_text}; {bandwidth}",
        "#",
        f"#{_placement(collective):>70s}",
        *_COLUMN_TITLES,
    ]


def format_row(row: dict[str, Any]) -> str:
    """One table line, nccl-tests' widths."""
    wrong = "N/A" if row["wrong"] is None else str(row["wrong"])
    return (
        f"{row['size']:12d}  {row['count']:12d}  {row['type']:>8s}  {row['redop']:>6s}  {row['root']:6d}"
        f"  {_time_text(row['time_us'])}  {_bw_text(row['algbw'])}  {_bw_text(row['busbw'])}  {wrong:>5s}"
    )


def format_footer(rows: list[dict[str, Any]]) -> list[str]:
    """nccl-tests' two summary lines: total wrong elements, average busbw."""
    wrongs = [row["wrong"] for row in rows if row["wrong"] is not None]
    if not wrongs:
        checked = "N/A (not checked)"
    else:
        checked = f"{sum(wrongs)} {'OK' if sum(wrongs) == 0 else 'FAILED'}"
    busbws = [row["busbw"] for row in rows if row["busbw"] is not None]
    lines = [f"# Out of bounds values : {checked}"]
    if busbws:
        lines.append(f"# Avg bus bandwidth    : {statistics.fmean(busbws):.4g}")
    return lines


def compare(collective: Collective, results: list[tuple[str, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Per size of ``collective``: each system's row and the ratio of the first system to
    each other one (``other time / first time``, which is the busbw ratio at equal size;
    for barrier the ratio of times). A ratio is None where a row is missing."""
    primary = results[0][0]
    by_size: dict[int, dict[str, dict[str, Any]]] = {}
    for name, rows in results:
        for row in rows:
            if row["collective"] == collective.name:
                by_size.setdefault(row["size"], {})[name] = row
    table = []
    for size in sorted(by_size):
        cells = by_size[size]
        base = cells.get(primary)
        ratios = {}
        for other, _ in results[1:]:
            row = cells.get(other)
            usable = base is not None and row is not None and base["time_us"] > 0
            ratios[other] = row["time_us"] / base["time_us"] if usable else None
        table.append({"size": size, "rows": cells, "ratios": ratios})
    return table


def comparison_table(
    collective: Collective, world_size: int, results: list[tuple[str, list[dict[str, Any]]]]
) -> list[str]:
    """The lines of :func:`compare`'s table: busbw and time per system, then the ratios,
    and their geometric mean over sizes."""
    primary = results[0][0]
    others = [name for name, _ in results[1:]]
    ratio_titles = [f"{primary}/{other}" for other in others]
    ratio_width = max([10, *(len(t) + 2 for t in ratio_titles)])
    title = f"# {collective.name} comparison, {world_size} ranks, {_placement(collective)}"
    lines = [
        f"{title}: busbw in GB/s, time in us; {primary}/X = X time / {primary} time (= busbw ratio; > 1: "
        f"{primary} faster)",
        "#"
        + " " * 11
        + "".join(f"{name:>22s}" for name, _ in results)
        + "".join(f"{t:>{ratio_width}s}" for t in ratio_titles),
        "#       size" + "      busbw       time" * len(results),
        "#        (B)" + "     (GB/s)       (us)" * len(results),
    ]
    logs: dict[str, list[float]] = {other: [] for other in others}
    for entry in compare(collective, results):
        text = f"{entry['size']:12d}"
        for name, _ in results:
            row = entry["rows"].get(name)
            if row is None:
                text += f"  {'-':>9s}  {'-':>9s}"
            else:
                busbw = "N/A" if row["busbw"] is None else f"{row['busbw']:.2f}"
                text += f"  {busbw:>9s}  {_time_text(row['time_us']).strip():>9s}"
        for other in others:
            ratio = entry["ratios"][other]
            if ratio is None:
                text += f"{'-':>{ratio_width}s}"
            else:
                logs[other].append(math.log(ratio))
                text += f"{_ratio_text(ratio):>{ratio_width - 1}s}x"
        lines.append(text)
    summary = [
        f"{primary}/{other} {_ratio_text(math.exp(statistics.fmean(v)))}x" for other, v in logs.items() if v
    ]
    if summary:
        lines.append(f"# geometric mean over sizes: {', '.join(summary)}")
    return lines


def settings_dict(args: argparse.Namespace) -> dict[str, Any]:
    """The benchmark's settings, JSON-ready."""
    return {
        "collectives": [c.name for c in args.collectives],
        "minbytes": args.minbytes,
        "maxbytes": args.maxbytes,
        "stepfactor": args.stepfactor,
        "iters": args.iters,
        "warmup_iters": args.warmup_iters,
        "check": args.check,
        "datatype": args.datatype.name,
        "op": args.op,
        "root": args.root,
        "system": args.system,
        "compare": args.compare,
        "repeat": args.repeat,
        "algo": args.algo,
        "transport": args.transport,
        "in_place": {c.name: c.in_place for c in args.collectives},
        "timing": args.timing,
        "device": args.device,
        "allow_shared_gpu": args.allow_shared_gpu,
    }


def json_document(
    args: argparse.Namespace,
    world_size: int,
    systems: dict[str, dict[str, Any]],
    comparisons: list[dict[str, Any]],
) -> dict[str, Any]:
    """The ``-J`` document: settings, each system's status, notes, meta, rows of every run
    and median rows, and the comparison per collective."""
    return {
        "tool": "ringtree-bench",
        "settings": settings_dict(args),
        "world_size": world_size,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "systems": systems,
        "comparison": comparisons,
    }


def write_json(path: str, document: dict[str, Any]) -> None:
    """Write ``document`` as indented JSON."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(document, f, indent=1)
        f.write("\n")


def plot(
    path: str,
    collectives: Iterable[Collective],
    world_size: int,
    results: list[tuple[str, list[dict[str, Any]]]],
) -> str:
    """Plot busbw (linear) and time (log) against size (log2), one line per system and one
    column per collective with a payload; returns a one-line message saying what was done."""
    shown = [c for c in collectives if c.has_data]
    if not shown:
        return f"# --plot: nothing to plot (no collective with a payload); {path} not written"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return f"# --plot: matplotlib is not installed (pip install matplotlib); {path} not written"
    fig, axes = plt.subplots(2, len(shown), figsize=(6 * len(shown), 8), squeeze=False)
    for column, collective in enumerate(shown):
        bw_ax, time_ax = axes[0][column], axes[1][column]
        for name, rows in results:
            mine = [r for r in rows if r["collective"] == collective.name]
            sizes = [r["size"] for r in mine]
            bw_ax.plot(sizes, [r["busbw"] for r in mine], marker="o", label=name)
            time_ax.plot(sizes, [r["time_us"] for r in mine], marker="o", label=name)
        bw_ax.set_title(f"{collective.name}, {world_size} ranks")
        bw_ax.set_ylabel("busbw (GB/s)")
        time_ax.set_ylabel("time (us)")
        time_ax.set_yscale("log")
        for ax in (bw_ax, time_ax):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("size (bytes)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"# plot written to {path}"
