"""The trainer's hooks: ``rollout.ray`` turned into engines and rollout nodes on Ray and the
run's client.

:func:`start_ray_engines` starts the run's engine servers (``rollout.ray.engines``) before
the trainer builds its engine, a pool of clients of theirs. :func:`connect_ray_nodes` starts the run's nodes as Ray actors
(:class:`~tunix_agentic.cluster.fleet.RayRolloutNodes`), then hands their URLs to
:func:`~tunix_agentic.rollout.client.connect.connect_service` exactly as
``rollout.service.urls`` would, and follows the actors' restarts for the rest of the
run. Everything is closed by the caller's exit stack: the runner first, then the actors.

Keys: the actors listen on their machines' addresses, beyond loopback, so they ask for an
API key: ``rollout.service.api_key`` or ``$TUNIX_AGENTIC_API_KEY`` when given, else a
fresh one for this run. The nodes' admin key is ``$TUNIX_AGENTIC_ADMIN_KEY`` when given,
else a fresh one. Fresh keys are set in this process's environment for the run (the
service and engine clients read them there). Both travel to the actors in their creation arguments,
which anyone with access to the Ray cluster can read: the cluster is trusted.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import secrets
from collections.abc import Callable
from typing import Any

from tunix_agentic.cluster.fleet import RayEngines, RayRolloutNodes, RayVLLMEngines
from tunix_agentic.config import RunConfig, to_dict
from tunix_agentic.rollout.client.connect import connect_service, service_api_key
from tunix_agentic.rollout.config import RayConfig
from tunix_agentic.rollout.service.admin import ADMIN_KEY_ENV
from tunix_agentic.serving.http import API_KEY_ENV, is_loopback


def run_keys(stack: contextlib.AsyncExitStack, service: Any) -> tuple[str, str]:
    """The run's API key and admin key for its actors: ``rollout.service.api_key`` /
    ``$TUNIX_AGENTIC_API_KEY`` and ``$TUNIX_AGENTIC_ADMIN_KEY`` when given, else fresh
    ones, set in this process's environment until ``stack`` closes (the service client and
    the engine clients read them there)."""
    keys = []
    for env, given in ((API_KEY_ENV, service_api_key(service)), (ADMIN_KEY_ENV, None)):
        key = given or os.environ.get(env) or secrets.token_urlsafe(24)
        if not os.environ.get(env):
            os.environ[env] = key
            stack.callback(os.environ.pop, env, None)  # after the clients close
        keys.append(key)
    return keys[0], keys[1]


async def start_ray_engines(
    stack: contextlib.AsyncExitStack,
    cfg: RunConfig,
    *,
    name: str,
    log: Callable[[str], None] | None = None,
) -> RayEngines:
    """Start ``cfg.rollout.ray.engines`` engine servers on Ray for the run ``name`` (see
    :func:`~tunix_agentic.cluster.fleet.run_name`): the fleet, whose ``urls`` are for the
    trainer's engine pool and the nodes, and whose ``moved_to`` callbacks (add the pool's
    ``repoint`` and the node runner's ``replace_engine``) follow an engine that Ray
    restarts at another address. They load the policy's versions from
    ``rollout.service.weights_dir`` and are stopped by ``stack``. With ``engine.backend:
    vllm`` they are vLLM servers (:class:`~tunix_agentic.cluster.fleet.RayVLLMEngines`)."""
    service = cfg.rollout.service
    api_key, _ = run_keys(stack, service)
    kind = RayVLLMEngines if cfg.engine.backend == "vllm" else RayEngines
    fleet = kind(
        cfg.rollout.ray,
        name=name,
        config=to_dict(cfg),
        api_key=api_key,
        weights_dir=str(service.weights_dir),
        log=log,
    )
    stack.push_async_callback(fleet.close)  # also when starting fails half-way
    await asyncio.to_thread(fleet.start)
    fleet.follow(None, every_s=max(1.0, service.health_every_s))
    return fleet


async def connect_ray_nodes(
    stack: contextlib.AsyncExitStack,
    engine: Any,
    cfg: RunConfig,
    *,
    name: str,
    log: Callable[[str], None] | None = None,
    version: int = 0,
    model_info: dict[str, Any] | None = None,
    engine_urls: tuple[str, ...] = (),
    engine_api: str = "sglang",
) -> Any:
    """Start ``cfg.rollout.ray.nodes`` rollout nodes on Ray for the run ``name`` (see
    :func:`~tunix_agentic.cluster.fleet.run_name`). Returns the connected
    :class:`~tunix_agentic.rollout.client.runner.ServiceEpisodeRunner` of groups on them,
    for the run's orchestrator. ``version``/``model_info``: as for ``connect_service``;
    ``engine_urls``: engines the nodes sample from (the run's Ray engines) instead of the
    trainer's own engine, speaking ``engine_api`` (``sglang`` or ``vllm``)."""
    rollout = cfg.rollout
    service = rollout.service
    api_key, admin_key = run_keys(stack, service)
    fleet = RayRolloutNodes(
        rollout.ray,
        name=name,
        config=to_dict(cfg),
        api_key=api_key,
        admin_key=admin_key,
        log=log,
    )
    stack.push_async_callback(fleet.close)  # also when starting fails half-way
    placements = await asyncio.to_thread(fleet.start)
    urls = tuple(p.url for p in placements)
    service = dataclasses.replace(
        service, urls=urls, api_key=api_key, engine_urls=engine_urls or service.engine_urls
    )
    if not service.engine_urls and is_loopback(service.engine_host):
        driver_ip = fleet.driver_ip()
        if any(p.ip != driver_ip for p in placements):
            # Nodes on other machines reach the trainer's engine at its machine's address.
            service = dataclasses.replace(service, engine_host=driver_ip)
    rollout = dataclasses.replace(rollout, service=service, ray=RayConfig())
    runner = await connect_service(
        stack,
        engine,
        rollout,
        cfg.agent,
        version=version,
        model_info=model_info,
        engine_api=engine_api,
    )
    fleet.follow(runner, every_s=max(1.0, rollout.service.health_every_s))
    return runner
