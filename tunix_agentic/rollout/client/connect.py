"""Switch a run's orchestrator to rollout nodes (``rollout.service.urls``).

:func:`connect_service` serves the trainer's engine over HTTP on its own event loop
(unless ``rollout.service.engine_urls`` names engines the nodes use instead), hands the
engine's URL to every node, and returns the connected
:class:`~tunix_agentic.rollout.client.runner.ServiceEpisodeRunner` that the caller gives
its orchestrator (``RolloutOrchestrator(runner, config)``). Everything it starts is
closed by the caller's exit stack. Weights keep flowing as in process: the served engine
is the trainer's.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from tunix_agentic.agent.loop import AgentConfig
from tunix_agentic.inference.base import InferenceEngine, ServerClient
from tunix_agentic.inference.pool import EnginePool
from tunix_agentic.rollout.client.runner import ServiceEpisodeRunner
from tunix_agentic.rollout.config import RolloutConfig, ServiceConfig
from tunix_agentic.serving.http import resolve_api_key

_log = logging.getLogger(__name__)


def service_api_key(service: ServiceConfig) -> str | None:
    """``rollout.service.api_key``, else ``$TUNIX_AGENTIC_API_KEY`` (kept out of the run's
    saved config), else None."""
    return resolve_api_key(service.api_key)


def weights_path_of(engine: InferenceEngine, version: int) -> str | None:
    """The directory one of ``engine``'s HTTP clients (it, or a pool's backends) had its
    server load ``version`` from (``rollout.service.weights_dir``), or None: the nodes push
    it to an engine server that restarted and lost it."""
    clients = engine.backends if isinstance(engine, EnginePool) else [engine]
    for client in clients:
        if not isinstance(client, ServerClient):
            continue
        path = client.weights_path
        if path is not None and client.version == version:
            return str(path)
    return None


async def connect_service(
    stack: contextlib.AsyncExitStack,
    engine: Any,
    rollout: RolloutConfig,
    agent: AgentConfig,
    *,
    version: int = 0,
    model_info: dict[str, Any] | None = None,
    engine_api: str = "sglang",
) -> ServiceEpisodeRunner:
    """A runner of groups on the nodes of ``rollout.service``, connected: every node
    knows the engines and policy ``version``.

    ``engine``: the trainer's (a :class:`~tunix_agentic.inference.engine.JaxEngine`),
    served on ``service.engine_host:engine_port`` (an API key, ``service.api_key``, is
    required beyond loopback) and named to the nodes as ``service.engine_advertise`` or
    its own URL. ``engine_api``: what ``service.engine_urls`` speak (``sglang``, or
    ``vllm`` with ``engine.backend: vllm``); the served engine speaks ours. A resumed run's runner gets its checkpoint's state (the run id and the
    finished groups it trains on instead of generating them) through its orchestrator's
    ``restore_state``.
    """
    service = rollout.service
    engine_urls = list(service.engine_urls)
    served = not engine_urls
    if served:
        from tunix_agentic.serving.engine_server import start_server
        from tunix_agentic.serving.http import is_loopback, url

        key = None if is_loopback(service.engine_host) else service_api_key(service)
        server, port = await start_server(
            engine,
            host=service.engine_host,
            port=service.engine_port,
            model_info=model_info or {},
            api_key=key,
        )
        stack.push_async_callback(server.cleanup)  # before the engine closes (LIFO)
        engine_urls = [service.engine_advertise or url(service.engine_host, port)]
        _log.info("serving the trainer's engine to the rollout nodes on %s", engine_urls[0])
    runner = ServiceEpisodeRunner(
        service.urls,
        agent_config=agent,
        config=rollout,
        version=version,
        api_key=service_api_key(service),
        engine_urls=engine_urls,
        own_engines=served,
        weights_of=None if served else lambda version: weights_path_of(engine, version),
        engine_api="sglang" if served else engine_api,
    )
    stack.push_async_callback(runner.close)
    await runner.connect()
    return runner
