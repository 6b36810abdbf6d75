"""HTTP serving: the JAX engine behind SGLang's native API, and a client for that API.

Names are imported on first use, so the environment server (``serve-env``, host-side
only) starts without loading JAX.
"""

from __future__ import annotations

from tunix_agentic.lazy import lazy_exports

_API = {
    "SGLangEngine": "tunix_agentic.serving.client",
    "ServerTimeouts": "tunix_agentic.serving.timeouts",
    "build_app": "tunix_agentic.serving.engine_server",
    "serve_forever": "tunix_agentic.serving.engine_server",
    "start_server": "tunix_agentic.serving.engine_server",
}

__all__ = sorted(_API)


__getattr__, __dir__ = lazy_exports(__name__, _API, globals())
