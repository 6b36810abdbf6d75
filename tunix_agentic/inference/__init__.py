"""Inference engines: token-in/token-out, async, batched."""

from tunix_agentic.inference.base import (
    EngineError,
    InferenceEngine,
    PromptTooLongError,
    TokenOutput,
    WeightUpdate,
)
from tunix_agentic.inference.cross_policy import CrossPolicyEngine
from tunix_agentic.inference.engine import EngineConfig, JaxEngine
from tunix_agentic.inference.pool import EnginePool
from tunix_agentic.inference.sampling import SamplingParams

__all__ = [
    "CrossPolicyEngine",
    "EngineConfig",
    "EngineError",
    "EnginePool",
    "InferenceEngine",
    "JaxEngine",
    "PromptTooLongError",
    "SamplingParams",
    "TokenOutput",
    "WeightUpdate",
]
