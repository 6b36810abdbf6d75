"""What a training step logs about its engine: shares of the wall time, from its clock.

A pure function of two readings of the engine's clock (:func:`engine_fractions`),
read per step through an :class:`EngineWindow`; the trainer adds them to the step's
metrics beside the rollout's (:func:`~tunix_agentic.rollout.stats.rollout_stats`).
"""

from __future__ import annotations

import time
from typing import Any


def engine_fractions(
    clock: dict[str, float], start: dict[str, float], since: float
) -> dict[str, float]:
    """``engine/<part>_fraction``: each part's share of the wall time since ``since``."""
    wall = time.perf_counter() - since
    return {
        f"engine/{k.removesuffix('_s')}_fraction": (v - start[k]) / wall for k, v in clock.items()
    }


class EngineWindow:
    """The engine's figures over a window that starts now (the start of RL): its clock,
    generated-token and busy counters read once at the start, then once per step."""

    def __init__(self, engine: Any):
        self.engine = engine
        self.since = time.perf_counter()
        self.clock_at_start = engine.clock()
        self.tokens_at_start = engine.stats.get("generated_tokens", 0.0)

    def scalars(self) -> dict[str, float]:
        """``engine/*`` and the engine's ``throughput`` and ``count`` figures, from one
        reading of its counters and one of its clock."""
        counters, clock = self.engine.stats, self.engine.clock()
        out = {
            "engine/busy_s_total": counters.get("busy_s", 0.0),
            # Cumulative: prompt tokens reused from cached KV, decode steps past every end.
            "count/engine/cached_tokens": counters.get("cached_tokens", 0.0),
            "count/engine/void_decode_steps": counters.get("void_decode_steps", 0.0),
            # KV the engine holds now (paged layout: the blocks in use, and their peak).
            **{
                f"gauge/engine/{k}": counters[k]
                for k in ("kv_tokens_held", "kv_blocks_used", "kv_blocks_peak")
                if k in counters
            },
            # Where the engine's wall clock went since RL started: device calls,
            # host-side gaps while work waited, and idle (nothing to generate).
            **engine_fractions(clock, self.clock_at_start, self.since),
        }
        # Tokens generated per second of device calls since RL started (cumulative, as
        # the fractions: a call is accounted when collected, often in the next step).
        tokens = counters.get("generated_tokens", 0.0) - self.tokens_at_start
        busy = clock.get("busy_s", 0.0) - self.clock_at_start.get("busy_s", 0.0)
        if busy > 0:  # not for an engine over HTTP: its device is not seen from here
            out["throughput/generated_tokens_per_accelerator_s"] = tokens / busy
        return out
