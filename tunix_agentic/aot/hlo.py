"""A compiled program's text (``exe.as_text()``) read as computations of instructions,
and the bytes of the arrays its types name: what :mod:`.count`, :mod:`.loops` and
:mod:`.ops` read the program with."""

from __future__ import annotations

import dataclasses
import math
import re

ITEMSIZE = {
    "pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1,
    "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
    "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
}  # fmt: skip
# An array type and its layout: ``bf16[96,96]{0,1:T(8,128)(2,1)}`` (minor-to-major, tiles).
_ARRAY = re.compile(r"\b([a-z]+\d*(?:e\dm\d(?:fn)?)?)\[([\d,]*)\](?:\{([\d,]*)(?::([^}]*))?\})?")
_TILE = re.compile(r"T\(([\d,]+)\)")
_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\{\s*$")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(.*)$")
_OPERANDS = re.compile(r"%([\w.\-]+)")


@dataclasses.dataclass(frozen=True)
class Instr:
    name: str
    shape: str  # the result's type text
    op: str
    operands: tuple[str, ...]
    text: str

    @property
    def is_root(self) -> bool:
        return self.text.lstrip().startswith("ROOT ")


def arrays(shape_text: str) -> list[tuple[str, tuple[int, ...]]]:
    """Every array in a type text: ``(dtype, dims)``, a tuple's elements in order."""
    out = []
    for dt, dims, _, _ in _ARRAY.findall(shape_text):
        if dt in ITEMSIZE:
            out.append((dt, tuple(int(d) for d in dims.split(",") if d)))
    return out


def nbytes(shape_text: str) -> float:
    """The arrays' bytes as their shapes say (no layout padding)."""
    return sum(ITEMSIZE[dt] * math.prod(d) for dt, d in arrays(shape_text))


def padded_bytes(shape_text: str) -> float:
    """The arrays' bytes as the TPU lays them out: the minor dimensions padded to the
    layout's first tile (``f32[4,64,96]{2,1,0:T(8,128)}``: 96 to 128; a scalar
    ``{:T(128)}`` takes 128 elements). XLA's TPU cost analysis counts these bytes; an
    array without a layout counts its shape's."""
    total = 0.0
    for dt, dims, minor_to_major, layout in _ARRAY.findall(shape_text):
        if dt not in ITEMSIZE:
            continue
        shape = [int(d) for d in dims.split(",") if d]
        tile = _TILE.search(layout or "")
        if tile is None:
            total += ITEMSIZE[dt] * math.prod(shape)
            continue
        order = [int(d) for d in minor_to_major.split(",") if d] or list(range(len(shape)))
        physical = [shape[d] for d in reversed(order)]  # major to minor
        sizes = [int(t) for t in tile.group(1).split(",")]
        physical = [1] * max(0, len(sizes) - len(physical)) + physical
        for k, t in enumerate(sizes, start=len(physical) - len(sizes)):
            physical[k] = -(-physical[k] // t) * t
        total += ITEMSIZE[dt] * math.prod(physical)
    return total


def _split_type(rest: str) -> tuple[str, str]:
    """``rest`` after ``name =``: the result's type text and what follows it."""
    if rest.startswith("("):
        depth = 0
        for i, ch in enumerate(rest):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                return rest[: i + 1], rest[i + 1 :]
    head, _, tail = rest.partition(" ")
    return head, " " + tail


def parse(text: str) -> dict[str, list[Instr]]:
    """The program's computations by name, each its instructions in order; the entry
    computation also as ``"__entry__"``."""
    comps: dict[str, list[Instr]] = {}
    current: list[Instr] | None = None
    for line in text.splitlines():
        if current is None:
            m = _HEADER.match(line)
            if m:
                current = comps.setdefault(m.group(1), [])
                if line.startswith("ENTRY"):
                    comps["__entry__"] = current
            continue
        if line.strip() == "}":
            current = None
            continue
        m = _INSTR.match(line)
        if not m:
            continue
        shape, after = _split_type(m.group(2))
        om = re.match(r"\s*([\w\-]+)\((.*)", after)
        if not om:
            continue
        depth, args = 1, []
        for ch in om.group(2):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                break
            args.append(ch)
        operands = tuple(_OPERANDS.findall("".join(args)))
        current.append(Instr(m.group(1), shape, om.group(1), operands, line))
    return comps


def entry_name(comps: dict[str, list[Instr]]) -> str:
    """The name of the program's entry computation."""
    entry = comps["__entry__"]
    return next(n for n, instrs in comps.items() if n != "__entry__" and instrs is entry)


def root(instrs: list[Instr]) -> Instr | None:
    """A computation's root instruction."""
    return next((i for i in instrs if i.is_root), None)


__all__ = ["ITEMSIZE", "Instr", "arrays", "entry_name", "nbytes", "padded_bytes", "parse", "root"]
