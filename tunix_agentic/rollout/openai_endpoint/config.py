"""The endpoint's limits and defaults (episode bounds: :class:`~.store.EpisodeLimits`).
Nothing here imports JAX."""

from __future__ import annotations

import dataclasses

from tunix_agentic.agent.tool_parser import get_parser
from tunix_agentic.rollout.config import check_reward_limit
from tunix_agentic.rollout.openai_endpoint.store import EpisodeLimits


@dataclasses.dataclass(frozen=True)
class OpenAIConfig:
    """Limits and defaults of the endpoint (episode bounds in ``episodes``)."""

    model_name: str = "policy"  # the only model a call may name (GET /v1/models)
    default_max_tokens: int = 512
    max_n: int = 16
    max_messages: int = 1024
    max_body_bytes: int = 8 << 20
    parser: str = "qwen3"
    episodes: EpisodeLimits = EpisodeLimits()
    reward_limit: float = 1e6  # rewards outside [-limit, limit] are a 400 (rollout.reward_limit)

    def __post_init__(self):
        for name in ("default_max_tokens", "max_n", "max_messages", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"openai.{name} must be >= 1, got {getattr(self, name)}")
        get_parser(self.parser)
        check_reward_limit(self.reward_limit, "openai.reward_limit")
