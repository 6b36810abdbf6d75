"""What a training step logs about its engine: shares of its time in the step, from its clock.

A pure function of two readings of the engine's clock (:func:`engine_fractions`),
read once per step through an :class:`EngineWindow`; the trainer adds them to the
step's metrics beside the rollout's (:func:`~tunix_agentic.rollout.stats.rollout_stats`).
"""

from __future__ import annotations

from typing import Any

# The clock's parts, and the names they are logged under (``engine/<name>_fraction``).
_PARTS = {"busy_s": "busy", "sched_gap_s": "host_gap", "idle_s": "idle"}
# The engine's KV counters as gauges, each name ending in its unit.
_KV_GAUGES = (
    ("kv_tokens_held", "kv_held_tokens"),
    ("kv_blocks_used", "kv_used_blocks"),
    ("kv_blocks_peak", "kv_peak_blocks"),
)


def engine_fractions(clock: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    """``engine/{busy,host_gap,idle}_fraction``: each part's share of the engine time the
    clock accounted between the readings ``before`` and ``clock``. They sum to 1: a device
    call is accounted when it is collected, so shares of the clock's own total, not of the
    wall time between the readings, keep a call that straddles two steps from leaving one
    short of 1 and the other over it. Empty when the clock accounted nothing."""
    deltas = {name: clock.get(k, 0.0) - before.get(k, 0.0) for k, name in _PARTS.items()}
    total = sum(deltas.values())
    if total <= 0:
        return {}
    return {f"engine/{name}_fraction": v / total for name, v in deltas.items()}


class EngineWindow:
    """The engine's figures per RL step: its clock, generated-token and busy counters read
    at the start of RL, then once per step (each step's figures are since the one before)."""

    def __init__(self, engine: Any):
        self.engine = engine
        self._clock = engine.clock()
        stats = engine.stats
        self._tokens = stats.get("generated_tokens", 0.0)
        self._prompt = {k: stats.get(k, 0.0) for k in ("cached_tokens", "prefill_tokens")}

    def scalars(self) -> dict[str, float]:
        """``engine/*`` and the engine's ``throughput`` and ``count`` figures, from one
        reading of its counters and one of its clock."""
        counters, clock = self.engine.stats, self.engine.clock()
        tokens = counters.get("generated_tokens", 0.0)
        out = {
            "engine/busy_s_total": counters.get("busy_s", 0.0),
            # Running totals: prompt tokens reused from cached KV, decode steps past every end.
            "count/engine/cached_tokens_total": counters.get("cached_tokens", 0.0),
            "count/engine/void_decode_steps_total": counters.get("void_decode_steps", 0.0),
            # KV the engine holds now (paged layout: the blocks in use, and their peak).
            **{f"gauge/engine/{name}": counters[k] for k, name in _KV_GAUGES if k in counters},
            # Where the engine's time in this step went: device calls, host-side gaps
            # while work waited, and idle (nothing to generate).
            **engine_fractions(clock, self._clock),
        }
        # Tokens generated per second of device calls in this step (not for an engine over
        # HTTP: its device is not seen from here).
        busy = clock.get("busy_s", 0.0) - self._clock.get("busy_s", 0.0)
        if busy > 0:
            out["throughput/generated_tokens_per_accelerator_s"] = (tokens - self._tokens) / busy
        # Prompt tokens of the step's prefills whose KV came from the prefix cache.
        prompt = {k: counters.get(k, 0.0) for k in ("cached_tokens", "prefill_tokens")}
        cached, fresh = (prompt[k] - self._prompt.get(k, 0.0) for k in prompt)
        if cached + fresh > 0:
            out["engine/prefix_cache_hit_fraction"] = cached / (cached + fresh)
        if counters.get("kv_tokens_reserved"):
            out["engine/kv_occupancy_fraction"] = (
                counters.get("kv_tokens_held", 0.0) / counters["kv_tokens_reserved"]
            )
        self._clock, self._tokens, self._prompt = clock, tokens, prompt
        return out
