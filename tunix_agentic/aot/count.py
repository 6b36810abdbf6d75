"""What a compiled program does that XLA's cost analysis does not see: its Pallas kernels'
FLOPs and bytes, charged from their operands' shapes, and its collectives' bytes over the
chips' interconnect, read from the compiled program's text.

XLA's cost analysis charges a Mosaic custom call (``tpu_custom_call``: JAX's splash and
ragged paged attention) nothing: no FLOPs, no bytes. Each kernel here is charged what it
does at its block sizes (padded dimensions, causal blocks skipped where the kernel skips
them; the ragged kernel reads every KV block of a sequence for every query block), from
the shapes in the program and the work the program is assumed to do (``Workload``: the
KV length a sequence attends to, which the shapes do not say). A kernel or collective
inside loops (the micro-batches, a layer scan) counts once per trip of each, the trip
counts read from the program (:mod:`~tunix_agentic.aot.loops`).
"""

from __future__ import annotations

import dataclasses
import math
import re

from tunix_agentic.aot.hlo import ITEMSIZE, Instr, arrays, nbytes, parse
from tunix_agentic.aot.loops import find_loops, runs

_GROUPS = re.compile(r"replica_groups=\{\{([\d,]+)\}")
_GROUPS_IOTA = re.compile(r"replica_groups=\[\d+,(\d+)\]")
_GROUPS_MESH = re.compile(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}")
COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")


@dataclasses.dataclass(frozen=True)
class Workload:
    """What the shapes do not say: the keys each sequence of a ragged paged attention
    call attends to (``kv_len``: the decode's window, a prefill's length)."""

    kv_len: int = 0


@dataclasses.dataclass
class Charged:
    """Per chip, per call: kernel FLOPs and bytes, collective bytes, and how many of each."""

    flops: float = 0.0
    bytes: float = 0.0
    ici_bytes: float = 0.0
    kernels: dict[str, int] = dataclasses.field(default_factory=dict)
    collectives: dict[str, int] = dataclasses.field(default_factory=dict)


def charge(text: str, work: Workload, chips: int, *, per_trip: bool = False) -> Charged:
    """The kernels' and collectives' cost per chip of one call of the program whose
    compiled text is ``text``, each counted as often as its computation runs (its loops'
    trip counts multiplied, :func:`~tunix_agentic.aot.loops.runs`; a loop without one
    counts once, and the caller reports the program as not counted). ``per_trip``: the
    entry's own loops count one trip (a program reported per step)."""
    comps = parse(text)
    times = runs(comps, find_loops(comps), per_trip=per_trip)
    out = Charged()
    for comp, instrs in comps.items():
        n = times.get(comp, 0)
        if comp == "__entry__" or n == 0:
            continue
        shapes = {i.name: i.shape for i in instrs}
        for instr in instrs:
            if instr.op == "custom-call" and 'custom_call_target="tpu_custom_call"' in instr.text:
                kind, flops, moved = kernel_cost(instr, shapes, work)
                out.kernels[kind] = out.kernels.get(kind, 0) + n
                out.flops += flops * n
                out.bytes += moved * n
            base = instr.op.removesuffix("-start")
            if base in COLLECTIVES and not instr.op.endswith("-done"):
                if base == "all-reduce" and comp.startswith("all-reduce-scatter"):
                    # XLA's reduce-scatter as a fused all-reduce whose result each chip
                    # slices: on the wire a reduce-scatter.
                    base = "reduce-scatter"
                out.collectives[base] = out.collectives.get(base, 0) + n
                out.ici_bytes += collective_bytes(instr, shapes, chips, base) * n
    return out


def _group_size(instr: Instr, chips: int) -> int:
    """How many chips one collective spans: its replica groups as a list (``{{0,1,2,3}}``),
    an iota (``[2,4]``) or mesh axes (``mesh['axis_0'=4,'axis_1'=1] {'axis_0'}``)."""
    m = _GROUPS_MESH.search(instr.text)
    if m:
        sizes = dict(re.findall(r"'([^']+)'=(\d+)", m.group(1)))
        return math.prod(int(sizes.get(a, 1)) for a in re.findall(r"'([^']+)'", m.group(2)))
    m = _GROUPS.search(instr.text)
    if m:
        return len(m.group(1).split(","))
    m = _GROUPS_IOTA.search(instr.text)
    return int(m.group(1)) if m else chips


def collective_bytes(
    instr: Instr, shapes: dict[str, str], chips: int, base: str | None = None
) -> float:
    """Bytes one chip sends for one collective over ``n`` chips (a ring's share):
    all-gather ``(n-1)/n`` of its result, reduce-scatter ``(n-1)/n`` of its operand,
    all-reduce twice that, all-to-all ``(n-1)/n`` of its operand, a permute its operand."""
    base = base or instr.op.removesuffix("-start")
    operand = sum(nbytes(shapes.get(o, "")) for o in instr.operands)
    n = _group_size(instr, chips)
    if n <= 1:
        return 0.0
    share = (n - 1) / n
    if base == "all-gather":
        result = nbytes(instr.shape)
        if instr.op.endswith("-start"):  # (operands, results): the results' half
            result -= operand
        return share * result
    if base == "all-reduce":
        return 2 * share * operand
    if base == "collective-permute":
        return operand
    return share * operand


def _float_operands(instr: Instr, shapes: dict[str, str]) -> list[tuple[str, tuple[int, ...]]]:
    out = []
    for o in instr.operands:
        arr = arrays(shapes.get(o, ""))
        if len(arr) == 1 and arr[0][0] in ("f32", "bf16", "f16") and len(arr[0][1]) >= 3:
            out.append(arr[0])
    return out


def _causal_pairs(lq: int, lk: int, bq: int, bk: int) -> int:
    """Query x key block pairs a causal kernel computes (blocks wholly above the diagonal
    skipped): every key block that starts at or before a query block's last row."""
    return sum(min(-(-lk // bk), ((i + 1) * bq - 1) // bk + 1) for i in range(-(-lq // bq)))


def splash_block(length: int) -> int:
    """The block the project gives JAX's splash attention at ``length`` (padded to 128):
    :func:`tunix_agentic.models.attention._splash_kernel`."""
    return next(b for b in (512, 256, 128) if length % b == 0)


# Matmuls a (query block x key block) pair costs in each splash kernel, each
# ``2 x bq x bk x D`` FLOPs: forward QK^T, PV; dq: QK^T again, dO V^T, dS K; dkv: QK^T,
# dO V^T, P^T dO, dS^T Q.
_SPLASH_MATMULS = {"fwd": 2, "dq": 3, "dkv": 4}


def kernel_cost(instr: Instr, shapes: dict[str, str], work: Workload) -> tuple[str, float, float]:
    """``(kind, flops, bytes)`` of one Pallas call, by the kernel its name says."""
    name = instr.name
    floats = _float_operands(instr, shapes)
    if name.startswith("splash_mha") and len(floats) >= 3:
        kind = next((k for k in ("dkv", "dq", "fwd") if f"_{k}" in name), "fwd")
        (dt, q), (_, k) = floats[0], floats[1]
        *lead, heads, lq, dim = q
        lk = k[-2]
        rows = math.prod(lead)
        bq, bk = splash_block(lq), splash_block(lk)
        pairs = _causal_pairs(lq, lk, bq, bk)
        flops = 2.0 * _SPLASH_MATMULS[kind] * rows * heads * pairs * bq * bk * dim
        item = ITEMSIZE[dt]
        # Per head: its query block's tensors once (q, o or q, dO, dq), a key and a value
        # block per pair; for dkv the key side's tensors once and a query block per pair.
        once = {"fwd": 2, "dq": 3, "dkv": 4}[kind] * (lq if kind != "dkv" else lk)
        streamed = 2 * pairs * (bk if kind != "dkv" else bq)
        moved = item * rows * heads * dim * (once + streamed)
        return f"splash_{kind}", flops, moved
    if "ragged" in name:
        return ("ragged_paged_attention", *_ragged_cost(instr, shapes, work))
    out = nbytes(instr.shape) + sum(nbytes(shapes.get(o, "")) for o in instr.operands)
    return name.split(".")[0], 0.0, out


def _ragged_cost(instr: Instr, shapes: dict[str, str], work: Workload) -> tuple[float, float]:
    """JAX's ragged paged attention: for each query block (``num_queries_per_block``
    tokens, up to 32) every KV block (``num_kv_pages_per_block`` pages) of each sequence
    in it, up to the sequence's ``kv_len``: no causal skipping. Charged for the program's
    sequences (the block tables' rows), each with ``T / seqs`` queries and ``kv_len`` keys
    (the block sizes as :func:`tunix_agentic.models.attention._ragged_call` gives them)."""
    floats = _float_operands(instr, shapes)
    if len(floats) < 2:
        return 0.0, 0.0
    (dt, q), (_, pages) = floats[0], floats[1]
    tokens, heads, dim = q[-3:]
    _, block_size, combined, _ = pages[-4:]
    tables = [arrays(shapes.get(o, "")) for o in instr.operands]
    tables = [a[0][1] for a in tables if len(a) == 1 and a[0][0] == "s32" and len(a[0][1]) == 2]
    seqs, width = tables[0] if tables else (1, max(1, work.kv_len // block_size))
    per_block = min(width, max(1, 512 // block_size)) * block_size
    kv = -(-max(work.kv_len, 1) // per_block) * per_block
    q_len = max(1, tokens // seqs)
    q_block = min(tokens, 32)
    reads = seqs * max(1, -(-q_len // q_block))  # (sequence, query block) visits
    item = ITEMSIZE[dt]
    flops = 4.0 * seqs * q_len * kv * heads * dim
    moved = item * (reads * kv * combined * dim + 2 * tokens * heads * dim)
    return flops, moved


__all__ = [
    "COLLECTIVES",
    "Charged",
    "Instr",
    "Workload",
    "arrays",
    "charge",
    "collective_bytes",
    "kernel_cost",
    "nbytes",
    "parse",
    "splash_block",
]
