"""A stand-in for the part of pytest that a test module run as a program needs, for
machines without pytest: ``python tests/python/test_cuda.py``.

A module imports it as ``pytest`` when it runs as ``__main__`` (or pytest is missing) and
ends with ``if __name__ == "__main__": sys.exit(plain_runner.main(globals()))``. What it
provides, with pytest's meaning:

- ``skip(reason, allow_module_level=False)``: inside a test, that test is skipped; at
  module level (``allow_module_level=True``) the program prints ``SKIP <file>: reason``
  and exits with status 0 before any test runs.
- ``importorskip(name)``: the module, or a skip as above (module level when called
  outside a test).
- ``raises(exception, match=None)``: a context manager; ``.value`` holds the exception.
- ``mark.parametrize(names, values, ids=None)`` (stackable), ``mark.skipif(condition,
  reason=...)``, ``mark.xfail(reason=..., strict=False)``.

``main`` runs every ``test_*`` function of the namespace in definition order, one call per
parameter combination, with no fixtures; after each it destroys ringtree's default group
if the test left one (what conftest.py does under pytest). It prints one line per test,
``PASS``, ``FAIL``, ``SKIP``, ``XFAIL`` or ``XPASS``, then each failure's traceback, then
``<n> passed, <n> failed, <n> skipped, <n> xfailed`` and returns 1 when a test failed (an
unexpected pass of a strict xfail counts as a failure), else 0.
"""

from __future__ import annotations

import importlib
import itertools
import re
import sys
import time
import traceback
from typing import Any, Callable

__all__ = ["skip", "importorskip", "raises", "mark", "main"]

_running_a_test = False


class Skipped(Exception):
    """Raised by skip() inside a test."""


def skip(reason: str = "", *, allow_module_level: bool = False) -> None:
    if allow_module_level and not _running_a_test:
        module = sys.modules.get("__main__")
        name = getattr(module, "__file__", None) or "module"
        print(f"SKIP {name}: {reason}", flush=True)
        sys.exit(0)
    raise Skipped(reason)


def importorskip(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        skip(f"could not import {name!r}: {exc}", allow_module_level=True)


class _Raises:
    def __init__(self, expected: type | tuple, match: str | None) -> None:
        self.expected = expected
        self.match = match
        self.value: BaseException | None = None

    def __enter__(self) -> "_Raises":
        return self

    def __exit__(self, kind, value, tb) -> bool:
        if kind is None:
            raise AssertionError(f"DID NOT RAISE {self.expected}")
        if not issubclass(kind, self.expected):
            return False  # the unexpected exception propagates
        if self.match is not None and not re.search(self.match, str(value)):
            raise AssertionError(f"Regex pattern {self.match!r} does not match {str(value)!r}")
        self.value = value
        return True


def raises(expected: type | tuple, *, match: str | None = None) -> _Raises:
    return _Raises(expected, match)


class _Mark:
    @staticmethod
    def parametrize(names: str | list[str], values: list, ids: list[str] | Callable | None = None) -> Callable:
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)

        def decorate(function: Callable) -> Callable:
            rows = []
            for index, value in enumerate(values):
                row = tuple(value) if len(names) > 1 else (value,)
                if isinstance(ids, list):
                    label = str(ids[index])
                elif callable(ids):
                    label = "-".join(str(ids(v)) for v in row)
                else:
                    label = "-".join(str(v) for v in row)
                rows.append((label, dict(zip(names, row))))
            # The decorator nearest the function is applied first: it varies fastest.
            function.__dict__.setdefault("_plain_parameters", []).insert(0, rows)
            return function

        return decorate

    @staticmethod
    def skipif(condition: bool, *, reason: str = "") -> Callable:
        def decorate(function: Callable) -> Callable:
            if condition:
                function._plain_skip = reason
            return function

        return decorate

    @staticmethod
    def xfail(condition: bool = True, *, reason: str = "", strict: bool = False) -> Callable:
        def decorate(function: Callable) -> Callable:
            if condition:
                function._plain_xfail = (reason, strict)
            return function

        return decorate


mark = _Mark()


def _cases(function: Callable) -> list[tuple[str, dict]]:
    groups = getattr(function, "_plain_parameters", [])
    if not groups:
        return [("", {})]
    cases = []
    for combination in itertools.product(*reversed(groups)):
        label = "-".join(label for label, _ in reversed(combination))
        kwargs: dict = {}
        for _, values in combination:
            kwargs.update(values)
        cases.append((label, kwargs))
    return cases


def _destroy_leftover_group() -> None:
    ringtree = sys.modules.get("ringtree")
    if ringtree is not None and ringtree.is_initialized():
        ringtree.destroy_process_group()


def main(namespace: dict) -> int:
    """Runs the test functions of ``namespace`` (a module's globals()); see the module
    docstring. Returns the exit status."""
    global _running_a_test
    tests = [(name, f) for name, f in namespace.items() if name.startswith("test_") and callable(f)]
    counts = {"passed": 0, "failed": 0, "skipped": 0, "xfailed": 0}
    failures = []
    for name, function in tests:
        for label, kwargs in _cases(function):
            title = f"{name}[{label}]" if label else name
            started = time.monotonic()
            outcome, detail, headline = "PASS", "", ""
            if getattr(function, "_plain_skip", None) is not None:
                outcome, detail = "SKIP", function._plain_skip
            else:
                _running_a_test = True
                try:
                    function(**kwargs)
                except Skipped as exc:
                    outcome, detail = "SKIP", str(exc)
                except BaseException as exc:  # noqa: BLE001 - reported
                    if isinstance(exc, KeyboardInterrupt):
                        raise
                    outcome, detail = "FAIL", traceback.format_exc()
                    message = str(exc).strip().splitlines()
                    headline = f"{type(exc).__name__}: {message[0] if message else ''}"
                finally:
                    _running_a_test = False
                    try:
                        _destroy_leftover_group()
                    except Exception:  # noqa: BLE001 - a test's failure is reported, not this
                        pass
                xfail = getattr(function, "_plain_xfail", None)
                if xfail is not None and outcome in ("PASS", "FAIL"):
                    reason, strict = xfail
                    if outcome == "FAIL":
                        outcome, detail = "XFAIL", reason
                    else:
                        outcome, detail = ("FAIL", f"XPASS(strict): {reason}") if strict else ("XPASS", reason)
                        headline = detail
            took = time.monotonic() - started
            line = headline if outcome == "FAIL" else detail
            print(f"{outcome:5s} {title} ({took:.1f} s){': ' + line if line else ''}", flush=True)
            if outcome == "FAIL":
                counts["failed"] += 1
                failures.append((title, detail))
            elif outcome == "SKIP":
                counts["skipped"] += 1
            elif outcome == "XFAIL":
                counts["xfailed"] += 1
            else:
                counts["passed"] += 1
    for title, detail in failures:
        print(f"\n---- {title}\n{detail}", flush=True)
    print(", ".join(f"{n} {what}" for what, n in counts.items()), flush=True)
    return 1 if counts["failed"] else 0
