"""The flight recorder from Python: ``dump_flight_recorder``.

Every group's CPU engine records its latest collective calls (the last
``RINGTREE_FLIGHT_RECORDER_ENTRIES``, default 2048): sequence number, collective,
algorithm, dtype, count, root, op, how the call ended and when. See docs/errors.md.
"""

from __future__ import annotations

import json
import os
from typing import Any

from . import _C
from ._C import ProcessGroup as _NativeProcessGroup
from ._resolve import resolve
from .errors import DistBackendError
from .process_group import ProcessGroup, native_engine

__all__ = ["dump_flight_recorder"]


def dump_flight_recorder(
    group: ProcessGroup | None = None, path: str | os.PathLike[str] | None = None
) -> list[dict[str, Any]]:
    """This rank's flight record of ``group`` (default: the world): its latest collective
    calls, oldest first, one dict per call with the keys ``seq``, ``collective``,
    ``algorithm``, ``dtype``, ``count``, ``root``, ``op``, ``description`` (the text errors
    use for the call), ``state`` (``'started'``, ``'completed'`` or ``'failed'``),
    ``error`` (the failure's text, else None), ``start_time`` and ``end_time`` (seconds
    since the epoch; ``end_time`` None while the call runs) and ``duration_us``.

    With ``path``, also writes the whole record to that file as the JSON document that
    ``RINGTREE_FLIGHT_RECORDER_DIR`` receives (a header naming the rank, group and host,
    then ``entries``), which ``python -m ringtree.flight_recorder`` merges.

    Any thread, any time, also while a collective runs or after the group failed or was
    aborted; not after destroy_process_group. DistBackendError for a group without a CPU
    engine.
    """
    pg = resolve(group)
    engine = native_engine(pg.engine)
    if not isinstance(engine, _NativeProcessGroup):
        raise DistBackendError(f"group {pg.group_name!r} has no flight recorder: it has no CPU collective engine")
    document = _C._flight_record_json(engine.communicator, "dump_flight_recorder")
    if path is not None:
        with open(path, "w", encoding="utf-8") as out:
            out.write(document)
    return json.loads(document)["entries"]
