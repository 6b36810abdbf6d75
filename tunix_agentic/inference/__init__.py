"""Inference engines: token-in/token-out, async, batched.

Names are imported on first use: the engine contract (:mod:`.base`) and
:class:`SamplingParams` (:mod:`.params`) are plain Python, so host-side code (the
agent loop, HTTP clients) uses them without loading JAX; the JAX engine loads
when :class:`JaxEngine` is.
"""

from __future__ import annotations

from tunix_agentic.lazy import lazy_exports

_API = {
    "CrossPolicyEngine": "tunix_agentic.inference.cross_policy",
    "EngineConfig": "tunix_agentic.inference.config",
    "EngineError": "tunix_agentic.inference.base",
    "EnginePool": "tunix_agentic.inference.pool",
    "InferenceEngine": "tunix_agentic.inference.base",
    "JaxEngine": "tunix_agentic.inference.engine",
    "PromptTooLongError": "tunix_agentic.inference.base",
    "SamplingParams": "tunix_agentic.inference.params",
    "TokenOutput": "tunix_agentic.inference.base",
    "WeightUpdate": "tunix_agentic.inference.base",
}

__all__ = sorted(_API)


__getattr__, __dir__ = lazy_exports(__name__, _API, globals())
