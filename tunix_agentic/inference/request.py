"""One generation request as the engine's scheduler holds it.

Built by the caller (:meth:`~tunix_agentic.inference.engine.JaxEngine.generate`); once
submitted, only the scheduler thread (:mod:`~tunix_agentic.inference.scheduler`) and its
admission (:mod:`~tunix_agentic.inference.admission`) touch it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable

import numpy as np

from tunix_agentic.inference.base import TokenOutput
from tunix_agentic.inference.constraint import Matcher
from tunix_agentic.inference.paged import BlockCopy
from tunix_agentic.inference.params import SamplingParams
from tunix_agentic.inference.slots import Grant


@dataclasses.dataclass
class Request:
    """One generation. Built by the caller; after :class:`Submit`, the scheduler's alone."""

    rid: str
    prompt: list[int]
    sampling: SamplingParams
    session_id: str | None
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop  # the caller's: the result is handed over there
    submitted: float
    key: np.ndarray
    max_new: int = 0
    slot: int = -1
    cached: int = 0
    grant: Grant | None = None  # where its cached prefix comes from (:class:`~.slots.Grant`)
    block_copy: BlockCopy | None = None  # paged layout: copied on device before its prefill
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)
    aborted: bool = False
    pending: int = 0  # tokens dispatched to the device for this request, not yet collected
    matcher: Matcher | None = None  # constrained decoding: the grammar's state (host side)
    on_tokens: Callable[[list[int]], None] | None = None  # streaming: called on ``loop``
    streamed: int = 0  # tokens handed to ``on_tokens`` so far

    def output(self, reason: str) -> TokenOutput:
        """What the caller gets back: the tokens so far, ended for ``reason``."""
        return TokenOutput(
            token_ids=list(self.tokens),
            logprobs=list(self.logprobs),
            finish_reason=reason,
            matched_stop=self.tokens[-1] if reason == "stop" else None,
            versions=list(self.versions),
            prompt_tokens=len(self.prompt),
            cached_tokens=self.cached,
            latency_s=time.perf_counter() - self.submitted,
        )

    def fill_mask(self, masks: np.ndarray, row: int) -> None:
        """Constrained decoding: write the grammar's allowed tokens into ``masks[row]``
        (left allowing every token without a grammar)."""
        if self.matcher is not None:
            self.matcher.fill(masks[row])
