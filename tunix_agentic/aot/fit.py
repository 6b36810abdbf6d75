"""``aot --fit``: the largest setting of each knob that still fits its mesh.

Each knob is doubled from the recipe's value, everything else as the recipe has it, and
the programs it shapes compiled (memory only: no second compile for the count) until one
does not fit or the cap is reached: ``learner.micro_batch_rows`` (the train step's
activations; capped at the batch's rows), ``rollout.groups_per_batch`` (the batch the
learner holds; capped at 8x the recipe's), ``engine.max_slots`` (the engine's KV and its
prefill and decode; capped at 8x). What binds is the program that stopped the doubling,
with the GiB it asked for.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from tunix_agentic.aot.chips import GiB
from tunix_agentic.aot.compile import run_programs
from tunix_agentic.aot.topology import Topology
from tunix_agentic.config import RunConfig, load_config, resolve_model

KNOBS: dict[str, tuple[str, ...]] = {
    "learner.micro_batch_rows": ("learner.train_step",),
    "rollout.groups_per_batch": ("learner.train_step",),
    "engine.max_slots": ("engine.prefill", "engine.decode"),
}
GROWTH = 8  # a knob is tried up to this many times the recipe's value


@dataclasses.dataclass(frozen=True)
class Fit:
    knob: str
    recipe: int
    largest: int | None  # None: not even the recipe's value fits
    binds: str  # what stopped the doubling

    def line(self) -> str:
        if self.recipe == 0:  # learner.micro_batch_rows: 0 is the whole batch
            return f"{self.knob}: the recipe's 0 (the whole batch) fits; {self.binds}"
        if self.largest is None:
            return f"{self.knob}: the recipe's {self.recipe} does not fit: {self.binds}"
        return f"{self.knob}: {self.largest} fits (the recipe has {self.recipe}); {self.binds}"


def _value(cfg: RunConfig, knob: str) -> int:
    section, name = knob.split(".")
    return int(getattr(getattr(cfg, section), name))


def _cap(cfg: RunConfig, knob: str, start: int) -> int:
    if knob == "learner.micro_batch_rows":
        return cfg.rollout.groups_per_batch * cfg.rollout.group_size
    return start * GROWTH


def _try(cfg: RunConfig, topo: Topology, prefixes: tuple[str, ...]) -> tuple[bool, str]:
    """Compile ``cfg``'s programs named by ``prefixes`` (memory only): whether every one
    fits, and the tightest: the one over, or the fullest."""
    report = run_programs(cfg, topo, select=lambda n: n.startswith(prefixes), count=False)
    tight = max(report.programs, key=lambda p: (not p.fits, p.total + p.resident_elsewhere))
    need = (tight.total + tight.resident_elsewhere) / GiB
    usable = report.chip.usable / GiB
    return report.fits, f"{tight.name} {need:.2f} of {usable:.2f} GiB"


def search(
    config: str,
    overrides: list[str],
    topo: Topology,
    log: Callable[[str], None] | None = None,
) -> list[Fit]:
    """Each knob's largest fitting value for ``config`` with ``overrides``, on ``topo``."""
    base = resolve_model(load_config(config, overrides))
    out = []
    for knob, prefixes in KNOBS.items():
        recipe = _value(base, knob)
        if recipe == 0:  # the whole batch in one micro-batch: nothing larger to try
            fits, tight = _try(base, topo, prefixes)
            out.append(Fit(knob, 0, 0 if fits else None, tight))
            continue
        start = recipe
        cap = _cap(base, knob, start)
        value, largest, binds = start, None, "the cap"
        while value <= cap:
            cfg = resolve_model(load_config(config, [*overrides, f"{knob}={value}"]))
            fits, tight = _try(cfg, topo, prefixes)
            if log is not None:
                log(f"--fit {knob}={value}: {'fits' if fits else 'does not fit'} ({tight})")
            if not fits:
                binds = tight if largest is None else f"{value} does not: {tight}"
                break
            largest, binds = value, f"{value * 2} is past the cap ({cap}); fullest: {tight}"
            value *= 2
        out.append(Fit(knob, start, largest, binds))
    return out
