"""Sampling parameters: how one request is sampled (plain Python, no JAX).

Host-side code (the agent loop, HTTP clients) builds them; engines turn them into
per-row device values (:mod:`tunix_agentic.inference.device_step`).
"""

from __future__ import annotations

import dataclasses
import math

from tunix_agentic.inference.constraint import Constraint

SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to sample one request.

    temperature 0 means greedy. ``top_k`` 0 and ``top_p`` 1.0 switch those
    filters off. Generation stops after a token in ``stop_token_ids`` (which is
    kept in the output) or after ``max_new_tokens``. ``seed`` makes a request
    reproducible on its own, whatever else is batched beside it (a signed
    64-bit integer). ``constraint``: a
    :class:`~tunix_agentic.inference.constraint.Constraint` the output must match (engines
    that cannot enforce one refuse the request). :meth:`check_vocab` adds the limits that depend on the
    model (``top_k`` and stop ids within the vocabulary); engines call it on
    every request.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 128
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    # What the output must match (constrained decoding): a grammar enforced token by token.
    constraint: Constraint | None = None

    def __post_init__(self):
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be finite and >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.seed is not None and not SEED_MIN <= self.seed <= SEED_MAX:
            raise ValueError(f"seed must be a signed 64-bit integer, got {self.seed}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    def check_vocab(self, vocab_size: int) -> None:
        """Raise ValueError unless a model with ``vocab_size`` tokens can honour these values."""
        if self.top_k > vocab_size:
            raise ValueError(
                f"top_k must be at most the vocabulary size {vocab_size}, got {self.top_k}"
            )
        bad = [t for t in self.stop_token_ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"stop_token_ids must be in [0, {vocab_size}), got {bad}")
