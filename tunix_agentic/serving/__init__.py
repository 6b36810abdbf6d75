"""HTTP serving: the JAX engine behind SGLang's native API, and a client for that API."""

from tunix_agentic.serving.client import SGLangEngine
from tunix_agentic.serving.engine_server import (
    build_app,
    engine_from_config,
    serve_forever,
    start_server,
)

__all__ = ["SGLangEngine", "build_app", "engine_from_config", "serve_forever", "start_server"]
