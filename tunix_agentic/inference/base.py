"""The engine contract: token ids in, token ids with logprobs out.

Every engine (the in-process JAX engine, the SGLang HTTP client, a pool of
either) implements :class:`InferenceEngine`, so agents never know which one
they talk to. Generated ids are never decoded and re-encoded on their way to
the learner.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable

from tunix_agentic.inference.sampling import SamplingParams


class EngineError(RuntimeError):
    """The engine could not serve a request (an infrastructure fault, not the policy's)."""


class PromptTooLongError(ValueError):
    """The prompt does not fit the engine's context window."""


@dataclasses.dataclass
class TokenOutput:
    """What one generate call produced.

    ``finish_reason``: "stop" (a stop token, kept as the last id), "length"
    (max_new_tokens or the context window) or "abort". ``versions[i]`` is the
    policy version that sampled ``token_ids[i]``.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    matched_stop: int | None = None
    versions: list[int] = dataclasses.field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    latency_s: float = 0.0


@runtime_checkable
class InferenceEngine(Protocol):
    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams = ...,
        *,
        session_id: str | None = None,
        request_id: str | None = None,
    ) -> TokenOutput: ...

    def update_weights(self, params: Any, version: int) -> None: ...

    def health(self) -> dict[str, Any]: ...
