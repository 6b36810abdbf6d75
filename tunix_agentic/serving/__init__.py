"""HTTP serving: the JAX engine behind SGLang's native API, and a client for that API.

Names are imported on first use, so the environment server (``serve-env``, host-side
only) starts without loading JAX.
"""

from __future__ import annotations

import importlib
from typing import Any

_API = {
    "SGLangEngine": "tunix_agentic.serving.client",
    "ServerTimeouts": "tunix_agentic.serving.timeouts",
    "build_app": "tunix_agentic.serving.engine_server",
    "engine_from_config": "tunix_agentic.serving.engine_server",
    "serve_forever": "tunix_agentic.serving.engine_server",
    "start_server": "tunix_agentic.serving.engine_server",
}

__all__ = sorted(_API)


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'tunix_agentic.serving' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
