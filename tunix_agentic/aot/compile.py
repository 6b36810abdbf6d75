"""Compile a run's programs for a topology and read what XLA says of each: bytes per chip,
FLOPs, bytes accessed, the roofline time at the chip's peak, the kernels it calls and
its waste against the least it must do."""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Callable
from typing import Any

import jax

from tunix_agentic.aot.chips import Chip, GiB
from tunix_agentic.aot.programs import (
    Program,
    engine_programs,
    learner_programs,
    sft_programs,
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
    """One compiled program: bytes per chip (``arguments``, ``outputs``, ``temp``,
    ``total``: outputs aliased to donated arguments counted once), per-chip ``flops`` and
    ``bytes_accessed`` (a loop body scaled by its trips, as XLA's cost analysis counts
    them), ``hbm_bytes`` (a program bound by memory: the bytes it moves from HBM, from the
    same program compiled without VMEM assignment, which that count takes for traffic:
    :mod:`~tunix_agentic.aot.chips`), ``roofline_s`` (on ``hbm_bytes`` where measured), the
    custom-call ``kernels``, ``resident_elsewhere`` (bytes per chip other components keep on
    the same chips), the waste ratio against ``minimum`` and the CPU seconds the compiles
    took."""

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
    minimum: float
    minimum_what: str
    compile_s: float
    note: str = ""
    hbm_bytes: float | None = None

    @property
    def moved(self) -> float:
        """Bytes moved from HBM: ``hbm_bytes`` where measured, else ``bytes_accessed``."""
        return self.bytes_accessed if self.hbm_bytes is None else self.hbm_bytes

    @property
    def waste(self) -> float:
        done = self.flops if self.minimum_kind == "flops" else self.moved
        return done / self.minimum if self.minimum else float("nan")

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
            "bytes_accessed": self.bytes_accessed,
            "hbm_bytes": self.hbm_bytes,
            "roofline_s": self.roofline_s,
            "kernels": list(self.kernels),
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
            "fits": self.fits,
            "programs": [p.to_json() for p in self.programs],
        }

    def table(self) -> str:
        """The report as a fixed-width table, then the waste ratios."""
        gib = lambda b: f"{b / GiB:6.2f}"  # noqa: E731
        head = (
            f"{self.topology} ({self.chip.name}, {self.chip.hbm / GiB:.1f} GiB HBM, "
            f"{self.chip.flops / 1e12:.0f} TFLOP/s bf16, {self.chip.hbm_bw / 1e9:.0f} GB/s per chip)\n"
            f"{'program':46} {'chips':>5} {'args':>6} {'out':>6} {'temp':>6} {'total':>6} "
            f"{'+other':>6} {'fits':>4} {'GFLOP':>9} {'GB acc':>7} {'roofline':>10}  kernels"
        )
        lines = [head]
        for p in self.programs:
            kernels = ",".join(k for k in p.kernels if k == "tpu_custom_call") or "-"
            lines.append(
                f"{p.name:46} {p.chips:5d} {gib(p.arguments)} {gib(p.outputs)} {gib(p.temp)} "
                f"{gib(p.total)} {gib(p.resident_elsewhere)} {'yes' if p.fits else 'NO':>4} "
                f"{p.flops / 1e9:9.1f} {p.moved / 1e9:7.2f} {p.roofline_s * 1e3:8.2f}ms  "
                f"{kernels}"
            )
        lines.append(
            "bytes in GiB per chip; +other: what the run's other component keeps on "
            "the same chips; figures per chip; GB acc: XLA's bytes accessed (from HBM, "
            "VMEM prefetches not counted, for a program bound by memory)"
        )
        lines.append("waste (what XLA will do / the least the program must do):")
        for p in self.programs:
            unit = "FLOPs" if p.minimum_kind == "flops" else "bytes"
            least = p.minimum / (1e9 if p.minimum_kind == "flops" else 1e9)
            counted = ""
            if p.hbm_bytes is not None and p.minimum:
                counted = f"; {p.bytes_accessed / p.minimum:.2f}x with VMEM prefetches counted"
            lines.append(
                f"  {p.name:46} {p.waste:5.2f}x {unit} (least {least:.1f} G{'FLOP' if unit == 'FLOPs' else 'B'}: "
                f"{p.minimum_what})" + (f"; {p.note}" if p.note else "") + counted
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
                    f"{(need - self.chip.hbm) / GiB:.2f} GiB over the {self.chip.hbm / GiB:.0f} GiB "
                    f"of a {self.chip.name}: try {HELP[p.component]}"
                )
        return out


def run_programs(
    cfg: RunConfig,
    topology: str | Topology,
    *,
    all_shapes: bool = False,
    select: Callable[[str], bool] | None = None,
    log: Callable[[str], None] | None = None,
) -> AotReport:
    """Compile ``cfg``'s programs (``cfg.model`` resolved: a ``config.json`` is enough)
    for ``topology`` and report on each (``select``: only the programs whose name it
    accepts). Raises :class:`AotError` before compiling when the meshes want more chips
    than the topology has."""
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
        compiled = [_compile(p, topo.chip, log) for p in programs]
    return AotReport(topo.name, topo.chip, tuple(_with_residents(compiled, programs, topo.chip)))


# The TPU compiler refuses a program beyond the chip's HBM and says what it needed.
_OUT_OF_HBM = re.compile(r"required for HLO temporaries \(([\d.]+)([KMGT])\)")
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _argument_bytes(args: Any) -> int:
    """Bytes per chip of abstract arguments (the largest shard of each)."""
    total = 0
    for x in jax.tree.leaves(args):
        shape = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
        total += math.prod(shape) * x.dtype.itemsize
    return total


def _cost(exe: Any) -> dict[str, Any]:
    cost = exe.cost_analysis() or {}
    if isinstance(cost, list):  # older JAX: one dict per computation
        cost = cost[0] if cost else {}
    return cost


def _compile(p: Program, chip: Chip, log) -> tuple[dict[str, Any], float]:
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
        args, temp = _argument_bytes(p.args), int(float(m.group(1)) * _UNITS[m.group(2)])
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
    hbm_bytes = None
    if p.minimum.kind == "bytes" and chip.vmem_assignment:
        # The same program without VMEM assignment: its bytes accessed are HBM traffic.
        plain = lowered.compile(compiler_options={chip.vmem_assignment: False})
        hbm_bytes = float(_cost(plain).get("bytes accessed", 0.0)) * p.trips
    seconds = time.process_time() - t
    kernels = tuple(sorted(set(_CUSTOM_CALL.findall(exe.as_text() or ""))))
    args, outs = mem.argument_size_in_bytes, mem.output_size_in_bytes
    temp, alias = mem.temp_size_in_bytes, mem.alias_size_in_bytes
    info = {
        "arguments": args,
        "outputs": outs,
        "temp": temp,
        "total": args + outs - alias + temp,
        "flops": float(cost.get("flops", 0.0)) * p.trips,
        "bytes_accessed": float(cost.get("bytes accessed", 0.0)) * p.trips,
        "hbm_bytes": hbm_bytes,
        "kernels": kernels,
    }
    if log is not None:
        log(f"compiled {p.name} in {seconds:.0f}s CPU")
    return info, seconds


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
                hbm_bytes=info.get("hbm_bytes"),
                roofline_s=chip.roofline_s(
                    info["flops"],
                    info["bytes_accessed"] if info.get("hbm_bytes") is None else info["hbm_bytes"],
                ),
                kernels=info["kernels"],
                resident_elsewhere=elsewhere,
                fits=not info.get("refused") and info["total"] + elsewhere <= chip.hbm,
                minimum_kind=p.minimum.kind,
                minimum=p.minimum.value,
                minimum_what=p.minimum.what,
                compile_s=seconds,
                note=p.note,
            )
        )
    return out


__all__ = ["AotError", "AotReport", "ProgramReport", "run_programs"]
