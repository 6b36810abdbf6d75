"""Cross-policy sampling (AgentRL, Zhang et al. 2025): actions drawn from a mix of policies.

Each agent action is sampled from an engine picked at random from a pool in
which engine 0 always holds the newest weights and the others are refreshed
only every ``stale_every`` versions. Mixing in slightly older policies widens
exploration in multi-turn episodes; every token still records the version
that sampled it, so the learner sees exactly how off-policy it is.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any

from tunix_agentic.inference.base import (
    InferenceEngine,
    TokenCallback,
    TokenOutput,
    WeightUpdate,
    summed_counters,
)
from tunix_agentic.inference.params import SamplingParams


class CrossPolicyEngine:
    """An :class:`InferenceEngine` over ``engines`` (engine 0 fresh, the rest stale).

    ``fresh_fraction`` is the probability that an action comes from engine 0;
    the rest is spread evenly over the stale engines. Sessions stay on the
    engine chosen for their first action only while the draw repeats, so KV
    reuse is partial by design.
    """

    def __init__(
        self,
        engines: Sequence[InferenceEngine],
        *,
        stale_every: int = 4,
        fresh_fraction: float = 0.5,
        seed: int = 0,
    ):
        if len(engines) < 2:
            raise ValueError(
                "cross-policy sampling needs at least two engines (one fresh, one stale)"
            )
        if stale_every < 1:
            raise ValueError(f"stale_every must be >= 1, got {stale_every}")
        if not 0.0 <= fresh_fraction <= 1.0:
            raise ValueError(f"fresh_fraction must be in [0, 1], got {fresh_fraction}")
        self.engines = list(engines)
        self.stale_every = stale_every
        self.fresh_fraction = fresh_fraction
        self._rng = random.Random(seed)
        self.version = 0
        self.picks = [0] * len(self.engines)

    def _pick(self) -> int:
        if self._rng.random() < self.fresh_fraction:
            return 0
        return self._rng.randrange(1, len(self.engines))

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams = SamplingParams(),
        *,
        session_id: str | None = None,
        request_id: str | None = None,
        on_tokens: TokenCallback | None = None,
    ) -> TokenOutput:
        i = self._pick()
        self.picks[i] += 1
        stream = {} if on_tokens is None else {"on_tokens": on_tokens}
        return await self.engines[i].generate(
            prompt_ids, sampling, session_id=session_id, request_id=request_id, **stream
        )

    def update_weights(self, params: Any, version: int) -> WeightUpdate:
        """Engine 0 always; the stale engines when ``version`` is a multiple of ``stale_every``.

        The handle resolves when every engine given the weights has applied them.
        """
        self.version = version
        updated = self.engines[:1] if version % self.stale_every else self.engines
        return WeightUpdate.all(
            [WeightUpdate.of(e.update_weights(params, version), version) for e in updated],
            version,
        )

    @property
    def in_flight(self) -> int:
        return sum(e.in_flight for e in self.engines)

    @property
    def stats(self) -> dict[str, float]:
        """Engine counters summed over the pool (busy time, tokens, ...)."""
        return summed_counters(e.stats for e in self.engines)

    def clock(self) -> dict[str, float]:
        """Busy, host-gap and idle seconds summed over the pool (each engine has its own clock)."""
        return summed_counters(e.clock() for e in self.engines)

    def health(self) -> dict[str, Any]:
        parts = [e.health() for e in self.engines]
        return {
            "ok": all(p.get("ok", False) for p in parts),
            "version": self.version,
            "picks": list(self.picks),
            "engines": parts,
        }

    async def check_health(self) -> bool:
        """Probe every engine; True when all can serve (as :meth:`health`'s ``ok``)."""
        return all(await asyncio.gather(*(e.check_health() for e in self.engines)))

    def use_tokenizer(self, tokenizer: Any, stop_ids: tuple[int, ...] | None = None) -> None:
        """Offered to every engine of the mix."""
        for e in self.engines:
            e.use_tokenizer(tokenizer, stop_ids)

    async def close(self) -> None:
        for e in self.engines:
            await e.close()
