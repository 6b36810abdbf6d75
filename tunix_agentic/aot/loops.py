"""The while loops of a compiled program and how often each body runs, read from the
program's text, and from them how often each computation runs per call of the program.

XLA's cost analysis counts a loop's body once. The op-by-op count
(:mod:`~tunix_agentic.aot.ops`) and the kernels' and collectives' charge
(:func:`~tunix_agentic.aot.count.charge`) multiply each computation by the trip counts of
the loops it is nested in (a layer scan inside the micro-batch loop: both). A trip count
is read, in this order, from:

- the while instruction's ``backend_config={"known_trip_count":{"n":"N"}}``, where XLA
  put it;
- its condition: a root ``compare(i, constant(N)), direction=LT`` (or ``LE``, ``GT`` and
  ``GE`` with the counter on the right) on one element ``i`` of the loop's state, whose
  start is a constant in the while's operand (through copies and bitcasts) and whose body
  adds a constant step to it: ``ceil((N - start) / step)`` trips.

Anything else (a loop that ends on data, like the engine's decode chunk, or a counter
whose start is computed) has no trip count here, and :attr:`Loop.trips` is None with the
reason: the caller reports the program as not counted rather than count its body once.
"""

from __future__ import annotations

import dataclasses
import math
import re

from tunix_agentic.aot.hlo import Instr, entry_name, root

_KNOWN = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_COND = re.compile(r"\bcondition=%?([\w.\-]+)")
_BODY = re.compile(r"\bbody=%?([\w.\-]+)")
_INDEX = re.compile(r"\bindex=(\d+)")
_DIRECTION = re.compile(r"\bdirection=([A-Z]+)")
_CONSTANT = re.compile(r"\bconstant\((-?\d+)\)")
_BRANCHES = re.compile(r"\bbranch_computations=\{([^}]*)\}")
_TRUE_FALSE = re.compile(r"\b(?:true|false)_computation=%?([\w.\-]+)")
_CALLS = re.compile(r"\bcalls=%?([\w.\-]+)")
_TO_APPLY = re.compile(r"\bto_apply=%?([\w.\-]+)")
# Each comparison as the counter's: GT and GE have it on the right (N > i is i < N).
_DIRECTIONS = {"LT": "LT", "LE": "LE", "GT": "LT", "GE": "LE"}


@dataclasses.dataclass(frozen=True)
class Loop:
    """One while instruction: ``name`` in computation ``caller``, its ``body`` and
    ``condition``; ``trips`` how often the body runs a call (None: not found), ``how``
    where it was read from, or why it was not."""

    name: str
    caller: str
    body: str
    condition: str
    trips: int | None
    how: str


def _constant(name: str, by_name: dict[str, Instr]) -> int | None:
    """The integer a scalar constant holds, through copies, bitcasts and converts."""
    seen = 0
    while name in by_name and seen < 8:
        instr = by_name[name]
        if instr.op == "constant":
            m = _CONSTANT.search(instr.text)
            return int(m.group(1)) if m else None
        if instr.op not in ("copy", "bitcast", "convert") or len(instr.operands) != 1:
            return None
        name, seen = instr.operands[0], seen + 1
    return None


def _counter_index(instr: Instr, by_name: dict[str, Instr]) -> int | None:
    """``instr`` as ``get-tuple-element(param), index=k`` of the computation's parameter
    (through copies and bitcasts): ``k``, else None."""
    for _ in range(8):
        if instr.op not in ("copy", "bitcast") or len(instr.operands) != 1:
            break
        if instr.operands[0] not in by_name:
            return None
        instr = by_name[instr.operands[0]]
    if instr.op != "get-tuple-element" or len(instr.operands) != 1:
        return None
    source = by_name.get(instr.operands[0])
    if source is None or source.op != "parameter":
        return None
    m = _INDEX.search(instr.text)
    return int(m.group(1)) if m else None


def _bound(cond: list[Instr]) -> tuple[int, str, int] | str:
    """The condition as ``(counter index, "LT" | "LE", bound)``, or why it is not one."""
    top = root(cond)
    by_name = {i.name: i for i in cond}
    if top is None or top.op != "compare" or len(top.operands) != 2:
        op = top.op if top is not None else "none"
        return f"its condition's root is {op}, not a compare of a counter with a constant"
    m = _DIRECTION.search(top.text)
    direction = m.group(1) if m else ""
    if direction not in _DIRECTIONS:
        return f"its condition compares with direction={direction or '?'}"
    left, right = (by_name.get(o) for o in top.operands)
    if direction in ("GT", "GE"):  # N > i: the counter on the right
        left, right = right, left
    k = _counter_index(left, by_name) if left is not None else None
    n = _constant(right.name, by_name) if right is not None else None
    if k is None or n is None:
        return "its condition does not compare a loop counter with a constant"
    return k, _DIRECTIONS[direction], n


def _step(body: list[Instr], k: int) -> int | None:
    """The constant the body adds to element ``k`` of the loop's state a trip."""
    top = root(body)
    by_name = {i.name: i for i in body}
    if top is None or top.op != "tuple" or len(top.operands) <= k:
        return None
    add = by_name.get(top.operands[k])
    if add is None or add.op != "add" or len(add.operands) != 2:
        return None
    a, b = (by_name.get(o) for o in add.operands)
    for counter, step in ((a, b), (b, a)):
        if counter is not None and step is not None and _counter_index(counter, by_name) == k:
            return _constant(step.name, by_name)
    return None


def _start(caller: list[Instr], loop: Instr, k: int) -> int | None:
    """The constant element ``k`` of the while's operand (a tuple) starts at."""
    by_name = {i.name: i for i in caller}
    init = by_name.get(loop.operands[0]) if loop.operands else None
    if init is None or init.op != "tuple" or len(init.operands) <= k:
        return None
    return _constant(init.operands[k], by_name)


def trip_count(loop: Instr, caller: str, comps: dict[str, list[Instr]]) -> Loop:
    """How often ``loop`` (a while instruction in computation ``caller``) runs its body
    a call."""
    body = _BODY.search(loop.text).group(1)
    condition = _COND.search(loop.text).group(1)
    where = (loop.name, caller, body, condition)
    m = _KNOWN.search(loop.text)
    if m:
        return Loop(*where, int(m.group(1)), "known_trip_count")
    bound = _bound(comps.get(condition, []))
    if isinstance(bound, str):
        return Loop(*where, None, bound)
    k, direction, n = bound
    start = _start(comps[caller], loop, k)
    step = _step(comps.get(body, []), k)
    if start is None:
        return Loop(*where, None, f"its counter (state element {k}) starts at no constant")
    if step is None or step <= 0:
        return Loop(*where, None, f"its body does not add a positive constant to its counter {k}")
    end = n + (direction == "LE")
    trips = max(0, math.ceil((end - start) / step))
    return Loop(*where, trips, f"condition: from {start} while {direction} {n}, step {step}")


def find_loops(comps: dict[str, list[Instr]]) -> dict[str, Loop]:
    """Every while instruction of the program by name, with its trip count."""
    out = {}
    for name, instrs in comps.items():
        if name == "__entry__":
            continue
        for i in instrs:
            if i.op == "while":
                out[i.name] = trip_count(i, name, comps)
    return out


@dataclasses.dataclass(frozen=True)
class Call:
    """A computation one instruction calls: ``kind`` "body", "condition", "branch"
    (one of a conditional's), "call" (a called or async computation), "fused" (a fusion's
    computation: its instructions are not HBM traffic, its dots are FLOPs) or "scalar" (a
    reduction's or scatter's combiner: neither)."""

    computation: str
    kind: str


def calls(instr: Instr) -> list[Call]:
    """What ``instr`` calls, each with how its callee runs."""
    if instr.op == "while":
        return [
            Call(_COND.search(instr.text).group(1), "condition"),
            Call(_BODY.search(instr.text).group(1), "body"),
        ]
    if instr.op == "conditional":
        m = _BRANCHES.search(instr.text)
        names = m.group(1).split(",") if m else _TRUE_FALSE.findall(instr.text)
        return [Call(n.strip().lstrip("%"), "branch") for n in names if n.strip()]
    out = [Call(n, "fused" if instr.op == "fusion" else "call") for n in _CALLS.findall(instr.text)]
    for n in _TO_APPLY.findall(instr.text):
        out.append(Call(n, "call" if instr.op == "call" else "scalar"))
    return out


def runs(
    comps: dict[str, list[Instr]], loops: dict[str, Loop], *, per_trip: bool = False
) -> dict[str, int]:
    """How often each computation runs per call of the program: the entry once, a loop's
    body its trips times what runs the loop (its condition once more), every branch of a
    conditional as often as the conditional (an upper bound: one runs), a fusion's or a
    combiner's computation as often as its caller. A loop without a trip count counts once
    here (the caller reports it). ``per_trip``: the entry's own loops count one trip (the
    program is reported per step of its outer loop: the engine's decode chunk)."""
    entry = entry_name(comps)
    times: dict[str, int] = {}

    def visit(name: str, n: int) -> None:
        if name not in comps or n == 0:
            return
        times[name] = times.get(name, 0) + n
        for instr in comps[name]:
            trips = 1
            if instr.op == "while":
                known = loops[instr.name].trips
                trips = 1 if known is None or (per_trip and name == entry) else known
            for call in calls(instr):
                factor = {"body": trips, "condition": trips + 1}.get(call.kind, 1)
                visit(call.computation, n * factor)

    visit(entry, 1)
    return times


def describe(loop: Loop) -> str:
    """A loop in a few words: where it is, and its trips and whence, or why none."""
    where = f"while %{loop.name} in %{loop.caller}"
    return (
        f"{where} ({loop.trips} trips, {loop.how})"
        if loop.trips is not None
        else f"{where}: {loop.how}"
    )


__all__ = ["Call", "Loop", "calls", "describe", "find_loops", "runs", "trip_count"]
