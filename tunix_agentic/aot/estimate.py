"""One whole RL step's time on the topology, from the compiled programs' rooflines: a
floor (each program at the chips' peaks), not a promise.

The rollout: ``rollout.groups_per_batch x rollout.group_size`` episodes run through
``engine.max_slots`` slots in waves; each wave runs ``agent.max_turns`` turns, each a
prefill (the largest compiled: the longest bucket, most rows) and ``agent.max_new_tokens``
decode steps (the decode compiled at the longest window). Then one learner train step and
one weight sync (across chips: the weights over the interconnect). On shared chips the
terms add up; on separate chips with ``rollout.max_staleness >= 1`` the rollout of the
next batch overlaps the learner's step, so the step is the longer of the two sides.
"""

from __future__ import annotations

import dataclasses

from tunix_agentic.aot.compile import AotReport, ProgramReport
from tunix_agentic.config import RunConfig


@dataclasses.dataclass(frozen=True)
class StepEstimate:
    seconds: float
    terms: dict[str, float]
    how: dict[str, str]  # each term's arithmetic, for the printout
    overlapped: bool

    def lines(self) -> list[str]:
        join = "max(decode + prefill, train + sync)" if self.overlapped else "the sum"
        out = [
            f"one RL step at the chips' peaks (a floor, not a promise): {self.seconds:.2f} s, "
            f"{join} of:"
        ]
        for name, s in self.terms.items():
            out.append(f"  {name:8} {s:9.3f} s  {self.how[name]}")
        return out


def _first(report: AotReport, prefix: str) -> ProgramReport | None:
    found = [p for p in report.programs if p.name.startswith(prefix)]
    return max(found, key=lambda p: p.roofline_s) if found else None


def rl_step(cfg: RunConfig, report: AotReport) -> StepEstimate | None:
    """The estimate, or None when a program it needs was not compiled (or was refused)."""
    decode = _first(report, "engine.decode[")
    prefill = _first(report, "engine.prefill[")
    train = _first(report, "learner.train_step[")
    sync = _first(report, "weight_sync")
    if None in (decode, prefill, train, sync) or not train.counted:
        return None
    episodes = cfg.rollout.groups_per_batch * cfg.rollout.group_size
    slots = cfg.engine.max_slots
    waves = -(-episodes // slots)
    turns, tokens = cfg.agent.max_turns, cfg.agent.max_new_tokens
    transfer = report.chip.ici_s(sync.transfer_bytes / max(sync.chips, 1))
    terms = {
        "decode": waves * turns * tokens * decode.roofline_s,
        "prefill": waves * turns * prefill.roofline_s,
        "train": train.roofline_s,
        "sync": sync.roofline_s + transfer,
    }
    how = {
        "decode": f"{waves} waves x {turns} turns x {tokens} tokens x "
        f"{decode.roofline_s * 1e3:.2f} ms ({decode.name})",
        "prefill": f"{waves} waves x {turns} turns x {prefill.roofline_s * 1e3:.2f} ms "
        f"({prefill.name})",
        "train": f"{train.name}",
        "sync": f"{sync.roofline_s * 1e3:.2f} ms on the learner's chips"
        + (f" + {transfer * 1e3:.2f} ms over ICI to the engine's" if sync.transfer_bytes else ""),
    }
    separate = sync.transfer_bytes > 0
    overlapped = separate and cfg.rollout.max_staleness >= 1
    if overlapped:
        seconds = max(terms["decode"] + terms["prefill"], terms["train"] + terms["sync"])
    else:
        seconds = sum(terms.values())
    return StepEstimate(seconds, terms, how, overlapped)
