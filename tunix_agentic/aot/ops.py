"""A compiled program counted op by op, each computation as often as it runs: the count
for a program with loops, whose bodies XLA's cost analysis counts once.

- **FLOPs**: the matmuls, ``dot`` (2 x result elements x contracted size) and
  ``convolution`` (2 x the multiply-adds at its valid window positions, XLA's rule),
  top level or inside fusions. Elementwise work is left out (XLA's count has it): it runs
  on the vector units, not at the matmul peak the roofline divides by, and it is ~5 % of
  the tiny test model's FLOPs and less of a real one's.
- **HBM bytes**: each instruction of a computation that runs (the entry, loop bodies and
  conditions, conditional branches), not those inside a fusion: its operands read and its
  result written, at the sizes the TPU lays them out (:func:`~.hlo.padded_bytes`, as
  XLA's TPU analysis counts them), by XLA's rules for fusions
  (``FusionParameterReadBytes``: an operand only sliced reads its slices, the buffer a
  dynamic-update-slice updates in place is neither read nor written whole) and two more:
  a gather reads the rows it gathers and a scatter writes the rows it updates, in place
  (XLA's TPU count charges some gathers the whole table: an embedding lookup). Nothing is
  charged for what moves nothing: parameters, tuples, get-tuple-element, bitcasts,
  constants, the loop and conditional instructions themselves (their computations are
  counted), the waiting half of an async pair. Pallas calls are left to
  :func:`~tunix_agentic.aot.count.charge`.
- **Loops**: each computation counts as often as it runs
  (:func:`~tunix_agentic.aot.loops.runs`: nested loops multiply); a conditional counts
  its costlier branch, FLOPs and bytes each, as XLA's analysis does, and what the
  cheapest branches would skip is kept apart (:attr:`OpCount.optional_bytes`).

Against XLA's count of a program without loops: the train step of Qwen3-0.6B's recipe at
two layers with its micro-batch loop counted once, 0.995x XLA's FLOPs and 0.996x its
bytes; the tiny test model's unrolled step, 0.95x and 0.91x (its elementwise share is
larger, and its head dimension of 16 pads to 128 inside the TPU's gather fusions, which
XLA charges at that layout). 2026-12-07, jax 0.10.2, libtpu 0.0.42.1.
"""

from __future__ import annotations

import dataclasses
import math
import re

from tunix_agentic.aot.hlo import Instr, arrays, entry_name, padded_bytes, parse, root
from tunix_agentic.aot.loops import Loop, calls, describe, find_loops, runs

_CONTRACTING = re.compile(r"\blhs_contracting_dims=\{([\d,]*)\}")
_DIM_LABELS = re.compile(r"\bdim_labels=(\w+)_(\w+)->(\w+)")
_WINDOW = re.compile(r"\bwindow=\{([^}]*)\}")
_FEATURE_GROUPS = re.compile(r"\bfeature_group_count=(\d+)")
_BATCH_GROUPS = re.compile(r"\bbatch_group_count=(\d+)")
_PARAMETER = re.compile(r"\bparameter\((\d+)\)")
# Instructions that move no bytes of their own (an async wrapper's computation is counted).
_FREE = {
    "parameter", "tuple", "get-tuple-element", "bitcast", "constant", "while",
    "conditional", "call", "after-all", "add-dependency", "opt-barrier", "partition-id",
    "replica-id", "domain", "get-dimension-size", "async-start", "async-update",
}  # fmt: skip
# Custom calls that are bookkeeping (a buffer's allocation) or charged by count.py (Pallas).
_FREE_TARGETS = ('"AllocateBuffer"', '"tpu_custom_call"')


@dataclasses.dataclass(frozen=True)
class OpCount:
    """A program's FLOPs and HBM bytes a call, counted op by op, every conditional at its
    costliest branch (``optional_*``: how much of that a call whose conditionals all take
    their cheapest branch skips); ``loops`` its while loops with their trip counts,
    ``times`` how often each computation runs, ``entry`` the entry computation (whose
    loops count one trip with ``per_trip``)."""

    flops: float
    bytes: float
    loops: tuple[Loop, ...]
    times: dict[str, int]
    entry: str
    per_trip: bool = False
    optional_flops: float = 0.0
    optional_bytes: float = 0.0

    @property
    def unknown(self) -> tuple[Loop, ...]:
        """The loops whose trip count was not found and matters."""
        return tuple(
            lp
            for lp in self.loops
            if lp.trips is None and not (self.per_trip and lp.caller == self.entry)
        )

    @property
    def counted(self) -> bool:
        return not self.unknown

    def why_not(self) -> str:
        """Why the count is not given, naming each loop without a trip count."""
        return "no trip count for " + "; ".join(describe(lp) for lp in self.unknown)

    def trips(self) -> list[str]:
        """Each loop's trips (``?``: not found; ``x1 (a step)``: the entry's, per step) and,
        for a nested one, how often the loop around it runs: ``x28 (x4 around)``."""
        out = []
        for lp in self.loops:
            if self.per_trip and lp.caller == self.entry:
                out.append("x1 (a step)")
                continue
            outer = self.times.get(lp.caller, 1)
            trips = "?" if lp.trips is None else str(lp.trips)
            out.append(f"x{trips}" + (f" (x{outer} around)" if outer > 1 else ""))
        return out


def _dims(shape_text: str) -> tuple[int, ...]:
    found = arrays(shape_text)
    return found[0][1] if len(found) == 1 else ()


def dot_flops(instr: Instr, shapes: dict[str, str]) -> float:
    """2 x result elements x the product of the lhs's contracting dimensions."""
    lhs = _dims(shapes.get(instr.operands[0], "")) if instr.operands else ()
    m = _CONTRACTING.search(instr.text)
    idx = [int(d) for d in m.group(1).split(",") if d] if m else []
    contracted = math.prod(lhs[d] for d in idx if d < len(lhs))
    return 2.0 * math.prod(_dims(instr.shape)) * contracted


@dataclasses.dataclass(frozen=True)
class _WindowDim:
    stride: int = 1
    pad_low: int = 0
    lhs_dilate: int = 1
    rhs_dilate: int = 1

    def valid(self, size_in: int, size_k: int, size_out: int) -> int:
        """(output, kernel) position pairs that land on the input, not on padding or
        between dilated elements (XLA's ``GetConvolutionFlops``)."""
        count = 0
        for k in range(size_k):
            at = k * self.rhs_dilate - self.pad_low  # the input index of output 0
            if self.lhs_dilate == 1:  # outputs o with 0 <= o * stride + at < size_in
                first = 0 if at >= 0 else (-at + self.stride - 1) // self.stride
                last = min(size_out - 1, (size_in - 1 - at) // self.stride)
                count += max(0, last - first + 1)
                continue
            for o in range(size_out):
                x = o * self.stride + at
                if x % self.lhs_dilate == 0 and 0 <= x // self.lhs_dilate < size_in:
                    count += 1
        return count


def _window(text: str, spatial: int) -> list[_WindowDim]:
    """A convolution's window, one :class:`_WindowDim` per spatial dimension."""
    fields: dict[str, list[str]] = {}
    m = _WINDOW.search(text)
    for part in m.group(1).split() if m else []:
        key, _, value = part.partition("=")
        fields[key] = value.split("x")

    def get(key: str, d: int, default: str) -> str:
        values = fields.get(key, [])
        return values[d] if d < len(values) else default

    return [
        _WindowDim(
            int(get("stride", d, "1")),
            int(get("pad", d, "0_0").split("_")[0]),
            int(get("lhs_dilate", d, "1")),
            int(get("rhs_dilate", d, "1")),
        )
        for d in range(spatial)
    ]


def convolution_flops(instr: Instr, shapes: dict[str, str]) -> float:
    """2 x (input features / feature groups) x output features x (batch / batch groups)
    x the valid window positions of every spatial dimension (XLA's rule)."""
    m = _DIM_LABELS.search(instr.text)
    if not m or len(instr.operands) != 2:
        return 0.0
    lhs_l, rhs_l, out_l = m.groups()
    lhs, rhs = (_dims(shapes.get(o, "")) for o in instr.operands)
    out = _dims(instr.shape)
    if (len(lhs), len(rhs), len(out)) != (len(lhs_l), len(rhs_l), len(out_l)):
        return 0.0
    features = _FEATURE_GROUPS.search(instr.text)
    batches = _BATCH_GROUPS.search(instr.text)
    spatial = [c for c in lhs_l if c.isdigit()]
    positions = 1
    for d, w in zip(spatial, _window(instr.text, len(spatial)), strict=True):
        positions *= w.valid(lhs[lhs_l.index(d)], rhs[rhs_l.index(d)], out[out_l.index(d)])
    fma = (
        lhs[lhs_l.index("f")]
        // (int(features.group(1)) if features else 1)
        * out[out_l.index("f")]
        * (lhs[lhs_l.index("b")] // (int(batches.group(1)) if batches else 1))
        * positions
    )
    return 2.0 * fma


def _written_bytes(instr: Instr, fused: list[Instr]) -> float:
    """What a fusion writes: its result, but only the update of a dynamic-update-slice
    root (in place), element by element of a tuple root."""
    by_name = {i.name: i for i in fused}
    top = root(fused)
    if top is None:
        return padded_bytes(instr.shape)
    outs = [by_name.get(o) for o in top.operands] if top.op == "tuple" else [top]
    total = 0.0
    for out in outs:
        if out is None:
            continue
        if out.op == "dynamic-update-slice" and out.operands[1] in by_name:
            total += padded_bytes(by_name[out.operands[1]].shape)
        elif out.op == "scatter":
            total += sum(padded_bytes(by_name[o].shape) for o in out.operands[2:] if o in by_name)
        else:
            total += padded_bytes(out.shape)
    return total


def _parameters(body: list[Instr]) -> dict[int, Instr]:
    """A fused computation's parameters by number."""
    return {
        int(m.group(1)): i for i in body if i.op == "parameter" and (m := _PARAMETER.search(i.text))
    }


def _matmul_flops(instr: Instr, shapes: dict[str, str]) -> float:
    if instr.op == "dot":
        return dot_flops(instr, shapes)
    if instr.op == "convolution":
        return convolution_flops(instr, shapes)
    return 0.0


class _Counter:
    """The count of one parsed program, computation by computation (memoised)."""

    def __init__(self, comps: dict[str, list[Instr]], loops: dict[str, Loop], per_trip: bool):
        self.comps, self.loops, self.per_trip = comps, loops, per_trip
        self.entry = entry_name(comps)
        self._fused: dict[str, float] = {}
        self._costs: dict[str, _Cost] = {}

    def fused_flops(self, name: str) -> float:
        """The matmul FLOPs inside a fusion's computation (nested fusions included)."""
        if name not in self._fused:
            instrs = self.comps.get(name, [])
            shapes = {i.name: i.shape for i in instrs}
            total = 0.0
            for i in instrs:
                total += _matmul_flops(i, shapes)
                if i.op == "fusion":
                    total += sum(self.fused_flops(c.computation) for c in calls(i))
            self._fused[name] = total
        return self._fused[name]

    def read_bytes(self, param: Instr, fused: list[Instr]) -> float:
        """What a fusion reads of the operand bound to ``param``, by XLA's
        ``FusionParameterReadBytes``: a slice's bytes where it is sliced, nothing where it
        is the buffer a dynamic-update-slice updates in place, the whole operand for each
        broadcast or reshape of it and once for all its other uses."""
        size, whole = 0.0, False
        full = padded_bytes(param.shape)
        by_name = {i.name: i for i in fused}
        for user in fused:
            if param.name not in user.operands:
                continue
            first = user.operands[0] == param.name
            if user.op == "slice" or (user.op in ("dynamic-slice", "gather") and first):
                size += padded_bytes(user.shape)
            elif user.op == "scatter" and first:  # the rows it updates, in place
                size += sum(
                    padded_bytes(by_name[o].shape) for o in user.operands[2:] if o in by_name
                )
            elif user.op == "dynamic-update-slice" and first:
                continue
            elif user.op in ("broadcast", "reshape"):
                size += full
            elif user.op == "get-tuple-element":
                size += self.read_bytes(user, fused)
            elif user.op == "fusion":
                nested = next((c.computation for c in calls(user) if c.kind == "fused"), "")
                body = self.comps.get(nested, [])
                params = _parameters(body)
                for k, o in enumerate(user.operands):
                    if o == param.name and k in params:
                        size += self.read_bytes(params[k], body)
            elif not whole:
                whole = True
                size += full
        return size

    def instr_bytes(self, instr: Instr, shapes: dict[str, str]) -> float:
        """HBM bytes one top-level instruction moves."""
        op = instr.op
        if op in _FREE or op.endswith("-done"):
            return 0.0
        if op == "custom-call" and any(t in instr.text for t in _FREE_TARGETS):
            return 0.0
        operands = [shapes.get(o, "") for o in instr.operands]
        if op == "fusion":
            fused = next((c.computation for c in calls(instr) if c.kind == "fused"), "")
            body = self.comps.get(fused, [])
            params = _parameters(body)
            read = sum(
                self.read_bytes(params[k], body) if k in params else padded_bytes(s)
                for k, s in enumerate(operands)
            )
            return read + _written_bytes(instr, body)
        # XLA's rules: a slice or gather reads what it writes; a dynamic-update-slice
        # writes its update in place.
        indices = sum(padded_bytes(s) for s in operands[1:])
        if op in ("slice", "dynamic-slice", "gather"):
            return 2 * padded_bytes(instr.shape) + (indices if op != "slice" else 0.0)
        if op == "dynamic-update-slice" and len(operands) > 1:
            return 2 * padded_bytes(operands[1]) + indices - padded_bytes(operands[1])
        if op.endswith("-start") and instr.shape.startswith("("):
            return padded_bytes(instr.shape)  # (operands, results[, context]): each once
        return sum(padded_bytes(s) for s in operands) + padded_bytes(instr.shape)

    def cost(self, name: str) -> _Cost:
        """What one run of computation ``name`` and what it calls does."""
        if name in self._costs:
            return self._costs[name]
        instrs = self.comps.get(name, [])
        shapes = {i.name: i.shape for i in instrs}
        total = _Cost()
        for i in instrs:
            called = calls(i)
            flops = _matmul_flops(i, shapes)
            if i.op == "fusion":
                flops += sum(self.fused_flops(c.computation) for c in called)
            total += _Cost(flops, self.instr_bytes(i, shapes), flops, self.instr_bytes(i, shapes))
            if i.op == "while":
                trips = self.loops[i.name].trips
                if trips is None or (self.per_trip and name == self.entry):
                    trips = 1
                for c in called:
                    total += self.cost(c.computation) * (trips + (c.kind == "condition"))
            elif i.op == "conditional" and called:
                total += _Cost.branches([self.cost(c.computation) for c in called])
            elif i.op != "fusion":
                for c in called:
                    if c.kind == "call":
                        total += self.cost(c.computation)
        self._costs[name] = total
        return total


@dataclasses.dataclass(frozen=True)
class _Cost:
    """FLOPs and bytes with every conditional at its costliest branch, and (``floor_*``)
    at its cheapest."""

    flops: float = 0.0
    bytes: float = 0.0
    floor_flops: float = 0.0
    floor_bytes: float = 0.0

    def __add__(self, other: _Cost) -> _Cost:
        return _Cost(*(a + b for a, b in zip(self.astuple(), other.astuple(), strict=True)))

    def __mul__(self, n: int) -> _Cost:
        return _Cost(*(a * n for a in self.astuple()))

    def astuple(self) -> tuple[float, float, float, float]:
        return (self.flops, self.bytes, self.floor_flops, self.floor_bytes)

    @staticmethod
    def branches(costs: list[_Cost]) -> _Cost:
        return _Cost(
            max(c.flops for c in costs),
            max(c.bytes for c in costs),
            min(c.floor_flops for c in costs),
            min(c.floor_bytes for c in costs),
        )


def count_ops(text: str, *, per_trip: bool = False) -> OpCount:
    """The op-by-op count of the compiled program ``text`` (``per_trip``: its entry's
    loops count one trip, for a program reported per step of its outer loop)."""
    comps = parse(text)
    loops = find_loops(comps)
    counter = _Counter(comps, loops, per_trip)
    cost = counter.cost(counter.entry)
    times = runs(comps, loops, per_trip=per_trip)
    outer_first = sorted(loops.values(), key=lambda lp: times.get(lp.caller, 0))
    return OpCount(
        cost.flops,
        cost.bytes,
        tuple(outer_first),
        times,
        counter.entry,
        per_trip,
        optional_flops=cost.flops - cost.floor_flops,
        optional_bytes=cost.bytes - cost.floor_bytes,
    )


def has_loops(text: str) -> bool:
    """Whether the compiled program has a while loop."""
    return re.search(r"\swhile\(", text) is not None


__all__ = ["OpCount", "convolution_flops", "count_ops", "dot_flops", "has_loops"]
