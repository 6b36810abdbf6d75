"""Inference engines: token-in/token-out, async, batched."""

from tunix_agentic.inference.base import (
    EngineError,
    InferenceEngine,
    PromptTooLongError,
    TokenOutput,
)
from tunix_agentic.inference.engine import EngineConfig, JaxEngine
from tunix_agentic.inference.sampling import SamplingParams

__all__ = [
    "EngineConfig",
    "EngineError",
    "InferenceEngine",
    "JaxEngine",
    "PromptTooLongError",
    "SamplingParams",
    "TokenOutput",
]
