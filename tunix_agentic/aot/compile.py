"""Compile a run's programs for a topology and read what XLA says of each: bytes per chip,
FLOPs, bytes accessed, the roofline time at the chip's peak, the kernels it calls and
its waste against the least it must do. A program with loops is counted op by op
(:mod:`.ops`), each loop body times its trips; one without keeps XLA's cost analysis."""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable
from typing import Any, Literal

import jax

from tunix_agentic.aot.chips import Chip, GiB
from tunix_agentic.aot.count import charge
from tunix_agentic.aot.ops import OpCount, count_ops, has_loops
from tunix_agentic.aot.programs import (
    Program,
    engine_programs,
    learner_programs,
    sft_programs,
    shard_bytes,
    tpu_model_config,
)
from tunix_agentic.aot.topology import AotError, Topology, get_topology
from tunix_agentic.config import RunConfig

_CUSTOM_CALL = re.compile(r'custom_call_target="([^"]+)"')

# What would shrink each component's programs, for the "does not fit" message.
HELP = {
    "learner": "more chips for learner.mesh (fsdp), LoRA (learner.lora.rank), a smaller "
    "learner.micro_batch_rows, learner.remat: true",
    "sync": "more chips for learner.mesh (fsdp), LoRA (learner.lora.rank)",
    "engine": "fewer engine.max_slots, a shorter engine.max_seq_len, more chips for "
    "engine.mesh (tp), engine.kv_layout: paged",
}


@dataclasses.dataclass(frozen=True)
class ProgramReport:
    """One compiled program, every figure per chip.

    Memory: ``arguments``, ``outputs``, ``temp``, ``total`` (outputs aliased to donated
    arguments counted once), ``resident_elsewhere`` (what other components keep on the
    same chips), ``fits`` (against the compiler's limit, :attr:`Chip.usable`).

    Work, the honest count (``method`` says which): a program without loops, ``"xla"``:
    ``flops`` is XLA's cost analysis plus the Pallas kernels' (``kernel_flops``, charged
    by :mod:`~tunix_agentic.aot.count`: XLA's analysis charges a kernel nothing) and
    ``hbm_bytes`` XLA's bytes of the program compiled without VMEM assignment (a prefetch
    into VMEM is not HBM traffic) plus the kernels' (``kernel_bytes``). A program with
    while loops (micro-batches, a layer scan, the sampler's), ``"op-by-op"``: XLA's
    analysis counts a loop's body once, so both are counted op by op instead
    (:mod:`~tunix_agentic.aot.ops`: matmul FLOPs, each top-level instruction's bytes),
    each computation times the trip counts of the loops around it (``loops``), kernels
    and collectives likewise. ``counted`` False: a loop's trip count could not be read
    (``note`` says which); no figures then. ``xla_flops`` and ``bytes_accessed``: XLA's
    own counts, for reference (a loop's body once; VMEM prefetches included).
    Conditionals count their costliest branch, as XLA's analysis does; ``optional_flops``
    and ``optional_bytes`` (op by op) are what a call taking the cheapest skips.
    ``ici_bytes``: what a chip sends in the program's collectives. ``roofline_s``: the
    longest of compute, HBM and interconnect at the chip's peaks, with the conditionals
    at their cheapest (a floor: the optional work left out). ``least_flops`` /
    ``least_bytes``: the least the program must do
    (:class:`~tunix_agentic.aot.programs.Minimum`); ``minimum_kind`` names the bound whose
    ratio is its waste."""

    name: str
    component: str
    chips: int
    arguments: int
    outputs: int
    temp: int
    total: int
    flops: float
    bytes_accessed: float
    roofline_s: float
    kernels: tuple[str, ...]
    resident_elsewhere: int
    fits: bool
    minimum_kind: str
    least_flops: float
    least_bytes: float
    minimum_what: str
    compile_s: float
    note: str = ""
    hbm_bytes: float = 0.0
    xla_flops: float = 0.0
    kernel_flops: float = 0.0
    kernel_bytes: float = 0.0
    kernel_calls: tuple[tuple[str, int], ...] = ()
    ici_bytes: float = 0.0
    collectives: tuple[tuple[str, int], ...] = ()
    transfer_bytes: int = 0
    counted: bool = True  # False: a loop's trip count was not found (no figures)
    method: Literal["xla", "op-by-op"] = "xla"
    loops: tuple[str, ...] = ()  # each loop's trips (op-by-op): "x28 (x4 around)"
    # Op by op, conditionals count their costliest branch: what a call that takes the
    # cheapest of each skips (the sampler's top-k/top-p filter, a prefill's prefix copy).
    optional_flops: float = 0.0
    optional_bytes: float = 0.0

    @property
    def flops_ratio(self) -> float | None:
        """The honest FLOPs over the least; None where the least is none (a copy) or the
        program was not counted."""
        return self.flops / self.least_flops if self.least_flops and self.counted else None

    @property
    def bytes_ratio(self) -> float | None:
        return self.hbm_bytes / self.least_bytes if self.least_bytes and self.counted else None

    @property
    def waste(self) -> float:
        ratio = self.flops_ratio if self.minimum_kind == "flops" else self.bytes_ratio
        return float("nan") if ratio is None else ratio

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "chips": self.chips,
            "bytes_per_chip": {
                "arguments": self.arguments,
                "outputs": self.outputs,
                "temp": self.temp,
                "total": self.total,
            },
            "flops": self.flops,
            "xla_flops": self.xla_flops,
            "kernel_flops": self.kernel_flops,
            "bytes_accessed": self.bytes_accessed,
            "hbm_bytes": self.hbm_bytes,
            "kernel_bytes": self.kernel_bytes,
            "ici_bytes": self.ici_bytes,
            "least_flops": self.least_flops,
            "least_bytes": self.least_bytes,
            "flops_ratio": self.flops_ratio,
            "bytes_ratio": self.bytes_ratio,
            "roofline_s": self.roofline_s,
            "kernels": list(self.kernels),
            "kernel_calls": dict(self.kernel_calls),
            "collectives": dict(self.collectives),
            "counted": self.counted,
            "method": self.method,
            "loops": list(self.loops),
            "optional_flops": self.optional_flops,
            "optional_bytes": self.optional_bytes,
            "fits": self.fits,
        }


@dataclasses.dataclass(frozen=True)
class AotReport:
    topology: str
    chip: Chip
    programs: tuple[ProgramReport, ...]

    @property
    def fits(self) -> bool:
        return all(p.fits for p in self.programs)

    def to_json(self) -> dict[str, Any]:
        return {
            "topology": self.topology,
            "chip": self.chip.name,
            "hbm_bytes_per_chip": self.chip.hbm,
            "usable_bytes_per_chip": self.chip.usable,
            "fits": self.fits,
            "programs": [p.to_json() for p in self.programs],
        }

    def table(self) -> str:
        """The report as a fixed-width table, then each program's count against its least."""
        gib = lambda b: f"{b / GiB:6.2f}"  # noqa: E731
        chip = self.chip
        ici = f"{chip.ici_bw / 1e9:.0f} GB/s ICI" if chip.ici_bw else "ICI not published"
        head = (
            f"{self.topology} ({chip.name}, {chip.hbm / GiB:.1f} GiB HBM of which the "
            f"compiler lets a program use {chip.usable / GiB:.2f}, "
            f"{chip.flops / 1e12:.0f} TFLOP/s bf16, {chip.hbm_bw / 1e9:.0f} GB/s, {ici} "
            f"per chip)\n"
            f"{'program':46} {'chips':>5} {'args':>6} {'out':>6} {'temp':>6} {'total':>6} "
            f"{'+other':>6} {'fits':>4} {'GFLOP':>9} {'GB HBM':>7} {'GB ICI':>7} "
            f"{'roofline':>10}  kernels"
        )
        lines = [head]
        for p in self.programs:
            calls = ",".join(f"{k}x{n}" for k, n in p.kernel_calls) or "-"
            lines.append(
                f"{p.name:46} {p.chips:5d} {gib(p.arguments)} {gib(p.outputs)} {gib(p.temp)} "
                f"{gib(p.total)} {gib(p.resident_elsewhere)} {'yes' if p.fits else 'NO':>4} "
                f"{p.flops / 1e9:9.1f} {p.hbm_bytes / 1e9:7.2f} {p.ici_bytes / 1e9:7.2f} "
                f"{p.roofline_s * 1e3:8.2f}ms  {calls}"
            )
        lines.append(
            "per chip: bytes in GiB; +other: what the run's other component keeps on the "
            "same chips; GFLOP and GB HBM: XLA's count plus the Pallas kernels' (which XLA's "
            "count leaves out), HBM traffic without VMEM prefetches; a program with loops "
            "counted op by op instead, each loop body times its trips (matmul FLOPs only); "
            "GB ICI: what a chip sends in collectives; roofline: the longest of the three "
            "at the chip's peaks, conditionals at their cheapest (a floor)"
        )
        lines.append("count / least (the bound a program is judged by first):")
        for p in self.programs:
            parts = []
            for kind in (p.minimum_kind, "bytes" if p.minimum_kind == "flops" else "flops"):
                ratio = p.flops_ratio if kind == "flops" else p.bytes_ratio
                least = p.least_flops if kind == "flops" else p.least_bytes
                unit = "GFLOP" if kind == "flops" else "GB"
                if ratio is not None:
                    parts.append(f"{kind} {ratio:.2f}x (least {least / 1e9:.1f} {unit})")
            if not p.counted:
                lines.append(
                    f"  {p.name:46} not counted (its memory is the program's own): {p.note}"
                )
                continue
            kernels = ""
            if p.kernel_flops or p.kernel_bytes:
                kernels = (
                    f"; kernels {p.kernel_flops / 1e9:.1f} GFLOP, {p.kernel_bytes / 1e9:.2f} GB"
                )
            how = f"; op by op over loops {', '.join(p.loops)}" if p.method == "op-by-op" else ""
            if p.optional_bytes > 0.01 * p.hbm_bytes or p.optional_flops > 0.01 * p.flops:
                how += (
                    f" (conditionals at their costliest: {p.optional_bytes / 1e9:.2f} GB, "
                    f"{p.optional_flops / 1e9:.1f} GFLOP of it in branches a call may skip)"
                )
            lines.append(
                f"  {p.name:46} {', '.join(parts)}: {p.minimum_what}{kernels}{how}"
                + (f"; {p.note}" if p.note else "")
            )
        return "\n".join(lines)

    def over(self) -> list[str]:
        """One line per program that does not fit: how far over, and what would help."""
        out = []
        for p in self.programs:
            if not p.fits:
                need = p.total + p.resident_elsewhere
                out.append(
                    f"{p.name} needs {need / GiB:.2f} GiB per chip, "
                    f"{(need - self.chip.usable) / GiB:.2f} GiB over the "
                    f"{self.chip.usable / GiB:.2f} GiB the compiler allows a program on a "
                    f"{self.chip.name}: try {HELP[p.component]}"
                )
        return out


def run_programs(
    cfg: RunConfig,
    topology: str | Topology,
    *,
    all_shapes: bool = False,
    select: Callable[[str], bool] | None = None,
    log: Callable[[str], None] | None = None,
    count: bool = True,
) -> AotReport:
    """Compile ``cfg``'s programs (``cfg.model`` resolved: a ``config.json`` is enough)
    for ``topology`` and report on each (``select``: only the programs whose name it
    accepts). Raises :class:`AotError` before compiling when the meshes want more chips
    than the topology has. ``count`` False: memory only (no second compile without VMEM
    assignment; ``hbm_bytes`` is then XLA's count with the prefetches)."""
    topo = topology if isinstance(topology, Topology) else get_topology(topology)
    mc = tpu_model_config(cfg.model)
    programs: list[Program] = []
    # The meshes are checked (AotError) before anything compiles.
    topo.mesh(cfg.learner.mesh, "learner.mesh")
    topo.mesh(cfg.engine.mesh, "engine.mesh")
    with jax.default_device(topo.devices[0]):  # Pallas' Mosaic asks it which chip it targets
        programs += learner_programs(cfg, mc, topo)
        programs += sft_programs(cfg, mc, topo)
        programs += engine_programs(cfg, mc, topo, all_shapes=all_shapes)
    programs = [p for p in programs if select is None or select(p.name)]
    return compile_programs(programs, topo, log=log, count=count)


def compile_programs(
    programs: list[Program],
    topology: str | Topology,
    *,
    log: Callable[[str], None] | None = None,
    count: bool = True,
) -> AotReport:
    """Compile ``programs`` (built for ``topology``'s devices) and report on each, as
    :func:`run_programs` does for a run's."""
    topo = topology if isinstance(topology, Topology) else get_topology(topology)
    with jax.default_device(topo.devices[0]):
        compiled = [_compile(p, topo.chip, log, count) for p in programs]
    return AotReport(topo.name, topo.chip, tuple(_with_residents(compiled, programs, topo.chip)))


# The TPU compiler refuses a program beyond the chip's HBM and says what it needed.
_OUT_OF_HBM = re.compile(r"required for HLO temporaries \(([\d.]+)([KMGT])\)")
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _cost(exe: Any) -> dict[str, Any]:
    cost = exe.cost_analysis() or {}
    if isinstance(cost, list):  # older JAX: one dict per computation
        cost = cost[0] if cost else {}
    return cost


def _compile(p: Program, chip: Chip, log, count: bool = True) -> tuple[dict[str, Any], float]:
    t = time.process_time()
    try:
        lowered = p.fn.lower(*p.args)
        exe = lowered.compile()
    except jax.errors.JaxRuntimeError as exc:
        m = _OUT_OF_HBM.search(str(exc))
        if "RESOURCE_EXHAUSTED" not in str(exc) or m is None:
            raise
        seconds = time.process_time() - t
        if log is not None:
            log(f"{p.name} does not fit ({seconds:.0f}s CPU): {str(exc).splitlines()[0][:200]}")
        args, temp = shard_bytes(p.args), int(float(m.group(1)) * _UNITS[m.group(2)])
        info = {
            "arguments": args,
            "outputs": 0,
            "temp": temp,
            "total": args + temp,
            "flops": 0.0,
            "bytes_accessed": 0.0,
            "kernels": (),
            "refused": True,
        }
        return info, seconds
    mem = exe.memory_analysis()
    cost = _cost(exe)
    text = exe.as_text() or ""
    plain_text = text
    bytes_accessed = hbm_bytes = float(cost.get("bytes accessed", 0.0))
    if chip.vmem_assignment and count:
        # The same program without VMEM assignment: its bytes accessed are HBM traffic.
        plain = lowered.compile(compiler_options={chip.vmem_assignment: False})
        hbm_bytes = float(_cost(plain).get("bytes accessed", 0.0))
        plain_text = plain.as_text() or ""
    xla_flops = float(cost.get("flops", 0.0))
    ops = count_ops(plain_text, per_trip=p.per_step) if has_loops(plain_text) else None
    charged = charge(text, p.work, len(p.mesh_devices), per_trip=p.per_step)
    seconds = time.process_time() - t
    kernels = tuple(sorted(set(_CUSTOM_CALL.findall(text))))
    args, outs = mem.argument_size_in_bytes, mem.output_size_in_bytes
    temp, alias = mem.temp_size_in_bytes, mem.alias_size_in_bytes
    flops = ops.flops if ops is not None else xla_flops
    moved = ops.bytes if ops is not None else hbm_bytes
    info = {
        "arguments": args,
        "outputs": outs,
        "temp": temp,
        "total": args + outs - alias + temp,
        "flops": flops + charged.flops,
        "xla_flops": xla_flops,
        "kernel_flops": charged.flops,
        "kernel_bytes": charged.bytes,
        "kernel_calls": tuple(sorted(charged.kernels.items())),
        "bytes_accessed": bytes_accessed,
        "hbm_bytes": moved + charged.bytes,
        "ici_bytes": charged.ici_bytes,
        "collectives": tuple(sorted(charged.collectives.items())),
        "kernels": kernels,
        **_loops_info(ops),
    }
    if log is not None:
        log(f"compiled {p.name} in {seconds:.0f}s CPU")
    return info, seconds


def _loops_info(ops: OpCount | None) -> dict[str, Any]:
    """The report's fields for how the program was counted."""
    if ops is None:
        return {"method": "xla", "counted": True, "loops": ()}
    return {
        "method": "op-by-op",
        "counted": ops.counted,
        "loops": tuple(ops.trips()),
        "why_not": "" if ops.counted else ops.why_not(),
        "optional_flops": ops.optional_flops,
        "optional_bytes": ops.optional_bytes,
    }


def _with_residents(compiled, programs: list[Program], chip: Chip) -> list[ProgramReport]:
    """Each program's report, with what the other component keeps on the same chips (a
    colocated engine's weights and cache beside the learner's state, and the reverse)."""
    resident: dict[str, tuple[int, set]] = {}
    for (info, _), p in zip(compiled, programs, strict=True):
        comp = "learner" if p.component == "sync" else p.component
        held, devs = resident.get(comp, (0, set()))
        resident[comp] = (max(held, info["arguments"]), devs | set(p.mesh_devices))
    out = []
    for (info, seconds), p in zip(compiled, programs, strict=True):
        comp = "learner" if p.component == "sync" else p.component
        elsewhere = sum(
            held
            for other, (held, devs) in resident.items()
            if other != comp and devs & set(p.mesh_devices)
        )
        out.append(
            ProgramReport(
                name=p.name,
                component=p.component,
                chips=len(p.mesh_devices),
                arguments=info["arguments"],
                outputs=info["outputs"],
                temp=info["temp"],
                total=info["total"],
                flops=info["flops"],
                bytes_accessed=info["bytes_accessed"],
                hbm_bytes=info.get("hbm_bytes", 0.0),
                xla_flops=info.get("xla_flops", 0.0),
                kernel_flops=info.get("kernel_flops", 0.0),
                kernel_bytes=info.get("kernel_bytes", 0.0),
                kernel_calls=info.get("kernel_calls", ()),
                ici_bytes=info.get("ici_bytes", 0.0),
                collectives=info.get("collectives", ()),
                roofline_s=0.0
                if not info.get("counted", True)
                # A floor: its conditionals at their cheapest (a call may skip the rest).
                else chip.roofline_s(
                    info["flops"] - info.get("optional_flops", 0.0),
                    info.get("hbm_bytes", 0.0) - info.get("optional_bytes", 0.0),
                    info.get("ici_bytes", 0.0),
                ),
                kernels=info["kernels"],
                resident_elsewhere=elsewhere,
                fits=not info.get("refused") and info["total"] + elsewhere <= chip.usable,
                minimum_kind=p.minimum.kind,
                least_flops=p.minimum.flops,
                least_bytes=p.minimum.bytes,
                minimum_what=p.minimum.what,
                compile_s=seconds,
                note=info.get("why_not") or p.note,
                transfer_bytes=p.transfer_bytes,
                counted=info.get("counted", True),
                method=info.get("method", "xla"),
                loops=info.get("loops", ()),
                optional_flops=info.get("optional_flops", 0.0),
                optional_bytes=info.get("optional_bytes", 0.0),
            )
        )
    return out


__all__ = ["AotError", "AotReport", "ProgramReport", "compile_programs", "run_programs"]
