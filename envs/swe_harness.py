"""The swe_lite judge's harness: calls the agent's functions in a sandbox and reports values.

Run as ``python -I -S -B swe_harness.py WORKDIR`` in a fresh sandbox that holds nothing but this
file and ``lib/`` (an empty ``__init__.py`` and the agent's ``utils.py``). Its first stdin line
is a JSON list of ``[function name, [arguments...]]``; it imports ``lib.utils``, calls each
function and writes one line, :data:`MARKER` followed by a JSON list of the values returned,
:func:`encode`-d, then exits at once.

Nothing here decides anything. The agent's code runs in this process and may rewrite any of
it, print any line or exit early; what comes out is only a claim of values, which the judge
(:mod:`tunix_agentic.envs.swe_judge`, outside the sandbox) compares with the reference's
values for the same arguments, values that never enter the sandbox. Standard library only;
importing it has no side effects, so the judge uses :func:`encode` for its expected values.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
from typing import Any

MARKER = "swe-judge-values: "
MAX_NODES = 10_000  # values, items and keys in one returned value
MAX_DEPTH = 20
MAX_STR = 10_000  # characters of one string


class _TooLarge(Exception):
    pass


def encode(value: Any) -> list[Any]:
    """``value`` as tagged JSON data: ``["none"]``, ``["bool", b]``, ``["int", "123"]``,
    ``["float", repr]``, ``["str", s]``, ``["list" | "tuple", [items]]``, ``["dict", [[k, v],
    ...]]``; ``["unsupported", why]`` for any other type (subclasses included, so no object of
    the agent's, such as one equal to everything, reaches a comparison) or past the limits."""
    try:
        return _encode(value, [MAX_NODES], 0)
    except _TooLarge as exc:
        return ["unsupported", f"too large: {exc}"]
    except (ValueError, RecursionError) as exc:  # an int past str()'s digit limit
        return ["unsupported", f"{type(exc).__name__}"]


def _encode(value: Any, budget: list[int], depth: int) -> list[Any]:
    budget[0] -= 1
    if budget[0] < 0 or depth > MAX_DEPTH:
        raise _TooLarge(f"over {MAX_NODES} items or {MAX_DEPTH} levels")
    kind = type(value)
    if value is None:
        return ["none"]
    if kind is bool:
        return ["bool", value]
    if kind is int:
        return ["int", str(value)]
    if kind is float:
        return ["float", repr(value)]
    if kind is str:
        if len(value) > MAX_STR:
            raise _TooLarge(f"a string over {MAX_STR} characters")
        return ["str", value]
    if kind is list or kind is tuple:
        return [kind.__name__, [_encode(v, budget, depth + 1) for v in value]]
    if kind is dict:
        pairs = [
            [_encode(k, budget, depth + 1), _encode(v, budget, depth + 1)] for k, v in value.items()
        ]
        return ["dict", pairs]
    return ["unsupported", f"type {kind.__name__[:50]}"]


def call(function: Any, args: list[Any]) -> list[Any]:
    """``function(*args)`` encoded; an exception as ``["raised", its type's name]``."""
    try:
        value = function(*args)
    except BaseException as exc:  # noqa: BLE001 - SystemExit and the like are answers too
        return ["raised", type(exc).__name__[:100]]
    return encode(value)


def run_cases(cases: list[list[Any]]) -> list[list[Any]]:
    """Imports ``lib.utils`` and calls each case's function (a failed import or a missing
    function answers every case it touches with ``["raised", ...]``)."""
    try:
        module = importlib.import_module("lib.utils")
    except BaseException as exc:  # noqa: BLE001
        traceback.print_exc()
        return [["raised", f"import: {type(exc).__name__}"[:100]] for _ in cases]
    results = []
    for name, args in cases:
        function = getattr(module, name, None)
        if not callable(function):
            results.append(["raised", f"no function {name}"])
            continue
        results.append(call(function, args))
    return results


def main() -> None:
    cases = json.loads(sys.stdin.readline())  # before any code under test is imported
    out = os.dup(1)
    os.dup2(2, 1)  # what the code under test prints goes to stderr, never before our line
    sys.path.insert(0, sys.argv[1])
    line = "\n" + MARKER + json.dumps(run_cases(cases)) + "\n"
    data = line.encode("utf-8", "replace")
    while data:
        data = data[os.write(out, data) :]
    os._exit(0)  # no atexit handler or thread of the code under test runs after the line


if __name__ == "__main__":
    main()
