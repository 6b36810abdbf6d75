"""Serve a registered environment over HTTP, one episode per remote client environment.

``tunix-agentic serve-env --env NAME`` runs this server; :class:`~tunix_agentic.envs.remote.RemoteEnv`
is its client. Routes (JSON in, JSON out; the wire format of tasks, actions and step
results is in :mod:`tunix_agentic.envs.remote`):

- ``POST /envs`` ``{"env": NAME or null, "kwargs": {...}}``: builds an environment
  (``make_env(NAME, **operator_kwargs, **kwargs)``), answers ``{"episode_id",
  "episode_token", "env", "tools"}``: both unguessable (``secrets``); every request on the
  episode below must send the token as ``X-Episode-Token`` (403 otherwise), so no other
  client can step, evaluate or close it. ``kwargs`` may hold only the keywords NAME was registered to take from a
  client (``register_env(..., client_kwargs=...)``: task-level knobs); the sandbox and
  resource limits are the operator's (:class:`EnvServerConfig`, ``serve-env --config``).
- ``POST /envs/{id}/reset`` ``{"task": {"type", "fields"}}``: answers
  ``{"observation", "tools"}``.
- ``POST /envs/{id}/step`` ``{"action": {...}}``: answers ``{"observation", "reward",
  "done", "info", "messages"}``.
- ``POST /envs/{id}/evaluate``: answers ``{"reward"}``.
- ``DELETE /envs/{id}``: closes the environment, answers ``{"closed": true}``.
- ``GET /health``: ``{"status": "ok", "env", "episodes"}`` (no API key needed).

Errors are ``{"error": {"message", "type"}}``: 400 for a malformed body, a task type
the server does not accept, a ``kwargs`` key a client may not set (the message names
it) or factory arguments the environment refuses; 401 for a missing or wrong API key;
403 for a missing or wrong episode token; 404 for an unknown (or reaped) episode; 408 for a body not received within
``timeouts.body_s``; 413 for one over ``MAX_BODY_BYTES``; 500 when the environment
raised (``type`` names the exception, so a client can re-raise ``ToolUnavailable``);
503 when the episode limit is reached or the server is stopping. A connection whose
request head does not arrive within ``timeouts.header_s`` is closed.

A task is rebuilt only as :class:`~tunix_agentic.envs.base.Task` or as a dataclass
defined in the environment's own module or a module named in ``task_modules`` (the
CLI's ``--import``): nothing else a client names is imported or built. Requests on one
episode run one at a time. An episode untouched for ``idle_timeout_s`` is closed (its
client died or forgot it), and stopping the server closes every episode. Beyond
loopback an API key is required, as for the engine server.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import inspect
import json
import math
import os
import secrets
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from aiohttp import web

from tunix_agentic.envs.base import (
    Environment,
    Task,
    available_envs,
    env_client_kwargs,
    get_env_factory,
    import_env_modules,
    make_env,
    offered_keywords,
)
from tunix_agentic.envs.remote import (
    action_from_json,
    step_result_to_json,
    task_from_json,
    type_name,
)
from tunix_agentic.envs.sandbox import SandboxConfig, SandboxError, check_uid_range
from tunix_agentic.serving.http import (
    ServerTimeouts,
    api_key_guard,
    check_exposure,
    json_error,
    read_json,
    run_server_main,
    serve_app,
    serve_until_signal,
    url,
)
from tunix_agentic.serving.prom import EnvCollector, add_prometheus
from tunix_agentic.serving.validation import Strict, validate_body

MAX_BODY_BYTES = 16 * 1024 * 1024
_CLOSE_TIMEOUT_S = 30.0  # an environment's close() that hangs is abandoned after this
_SHUTDOWN_TIMEOUT_S = 5.0


@dataclasses.dataclass(frozen=True)
class EnvServerConfig:
    """What :func:`build_env_app` serves and how.

    ``env_name``: the registered environment served. ``task_modules``: modules whose
    dataclasses a task may be (besides :class:`Task` and the environment's own module).
    ``idle_timeout_s``: an episode no request touched for this long is closed.
    ``max_episodes``: open episodes at once (more are refused with 503). ``api_key``:
    required as ``Authorization: Bearer KEY`` on every route but ``/health``.

    The operator's policy, the same for every episode: ``sandbox`` is given to an
    environment whose factory takes ``sandbox``; ``env_kwargs`` are the factory's other
    keywords (resource limits such as ``tool_timeout``). A client's ``kwargs`` may set only
    the keywords the environment lists as ``client_kwargs`` when registered
    (:func:`~tunix_agentic.envs.base.register_env`), over ``env_kwargs``; any other key is
    a 400 naming it. ``timeouts``: how long a client may take to send a request.
    """

    env_name: str
    task_modules: tuple[str, ...] = ()
    idle_timeout_s: float = 600.0
    max_episodes: int = 4096
    api_key: str | None = None
    sandbox: SandboxConfig = SandboxConfig()
    env_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    timeouts: ServerTimeouts = ServerTimeouts()

    def __post_init__(self) -> None:
        if not isinstance(self.env_name, str) or not self.env_name:
            raise ValueError(f"env_name must be a non-empty string, got {self.env_name!r}")
        if not (math.isfinite(self.idle_timeout_s) and self.idle_timeout_s > 0):
            raise ValueError(f"idle_timeout_s must be > 0, got {self.idle_timeout_s}")
        if self.max_episodes < 1:
            raise ValueError(f"max_episodes must be >= 1, got {self.max_episodes}")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must not be empty")
        if not isinstance(self.sandbox, SandboxConfig):
            raise ValueError(f"sandbox must be a SandboxConfig, got {self.sandbox!r}")
        if not isinstance(self.env_kwargs, Mapping):
            raise ValueError(f"env_kwargs must be a mapping, got {self.env_kwargs!r}")
        if "sandbox" in self.env_kwargs:
            raise ValueError("env_kwargs must not hold 'sandbox': give it as sandbox")
        if not isinstance(self.timeouts, ServerTimeouts):
            raise ValueError(f"timeouts must be a ServerTimeouts, got {self.timeouts!r}")
        object.__setattr__(self, "env_kwargs", MappingProxyType(dict(self.env_kwargs)))


TOKEN_HEADER = "X-Episode-Token"


@dataclasses.dataclass
class _Episode:
    env: Environment
    last_used: float
    token: str = dataclasses.field(default_factory=lambda: secrets.token_urlsafe(24), repr=False)
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    busy: int = 0  # requests holding or awaiting the lock; the reaper skips busy episodes


class _State:
    """The served environment, its open episodes, and the task types it accepts."""

    def __init__(self, config: EnvServerConfig):
        self.config = config
        self.check_name(config.env_name)
        self.base_kwargs = _operator_kwargs(config)
        self.client_keys = env_client_kwargs(config.env_name)
        self.task_types: dict[str, type] = {type_name(Task): Task}
        self._modules: set[str] = set()
        for module in config.task_modules:
            self.accept_tasks_of(module)
        self.episodes: dict[str, _Episode] = {}
        self.stopping = False

    @staticmethod
    def check_name(env_name: str) -> None:
        """ValueError naming the registered environments unless ``env_name`` is one."""
        known = available_envs()
        if env_name not in known:
            raise ValueError(
                f"unknown environment {env_name!r}; registered: {', '.join(known)} "
                "(import the module that registers yours with --import MODULE)"
            )

    def accept_tasks_of(self, module: str) -> None:
        """Accept the dataclasses defined in ``module`` (already imported) as task types."""
        if module in self._modules or module not in sys.modules:
            return
        self._modules.add(module)
        for _, obj in inspect.getmembers(sys.modules[module], inspect.isclass):
            if dataclasses.is_dataclass(obj) and obj.__module__ == module:
                self.task_types[type_name(obj)] = obj

    def new_id(self) -> str:
        """An unguessable episode id (128 random bits): not a prefix and a counter."""
        while True:
            episode_id = secrets.token_urlsafe(16)
            if episode_id not in self.episodes:
                return episode_id


_STATE = web.AppKey("env_state", _State)


def _operator_kwargs(config: EnvServerConfig) -> dict[str, Any]:
    """The factory keywords every episode gets: ``env_kwargs``, and ``sandbox`` when the
    factory takes it. ValueError naming the environment if the factory refuses them."""
    factory = get_env_factory(config.env_name)
    kwargs = dict(config.env_kwargs)
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):  # no signature to read: checked when an episode is made
        return kwargs
    kwargs.update(offered_keywords(config.env_name, {"sandbox": config.sandbox}))
    try:
        sig.bind(**kwargs)
    except TypeError as exc:
        raise ValueError(
            f"environment {config.env_name!r} does not take {sorted(kwargs)}: {exc}"
        ) from None
    return kwargs


def _refused_kwargs(state: _State, kwargs: dict[str, Any]) -> str | None:
    """Why a client's ``kwargs`` are refused (a key the environment does not list as
    ``client_kwargs``), or None."""
    refused = sorted(key for key in kwargs if key not in state.client_keys)
    if not refused:
        return None
    keys = ", ".join(map(repr, sorted(state.client_keys)))
    takes = f"takes only {keys} from a client" if keys else "takes no kwargs from a client"
    return (
        f"kwargs key {refused[0]!r} is not accepted: environment {state.config.env_name!r} "
        f"{takes}; the sandbox and resource limits are the server operator's "
        "(serve-env --config)"
    )


_error = json_error


async def _close_env(env: Environment) -> None:
    """Close ``env`` within ``_CLOSE_TIMEOUT_S``; a failing close is reported, not raised."""
    try:
        async with asyncio.timeout(_CLOSE_TIMEOUT_S):
            await env.close()
    except Exception as exc:  # one env's broken close must not stop the others'
        print(
            f"serve-env: closing an environment failed: {type(exc).__name__}: {exc}",
            file=sys.stderr,
            flush=True,
        )


_guard = api_key_guard(lambda app: app[_STATE].config.api_key, typed=True)


async def handle_health(request: web.Request) -> web.Response:
    state = request.app[_STATE]
    return web.json_response(
        {"status": "ok", "env": state.config.env_name, "episodes": len(state.episodes)}
    )


class _Create(Strict, extra="ignore"):
    """``POST /envs``: the environment (this server's, or null) and the factory keywords
    the client sets (checked against the environment's ``client_kwargs`` after)."""

    env: str | None = None
    kwargs: dict[str, Any] | None = None


async def handle_create(request: web.Request) -> web.Response:
    state = request.app[_STATE]
    name = state.config.env_name
    try:
        body = await read_json(request, if_empty={})
        create = validate_body(_Create, body, shape='{"env"?: NAME, "kwargs"?: {...}}')
        asked, kwargs = create.env, create.kwargs or {}
        if asked is not None and asked != name:
            raise ValueError(f"this server serves environment {name!r}, not {asked!r}")
        refused = _refused_kwargs(state, kwargs)
        if refused is not None:
            raise ValueError(refused)
    except ValueError as exc:
        return _error(400, str(exc), "ValueError")
    if state.stopping:
        return _error(503, "the server is stopping")
    if len(state.episodes) >= state.config.max_episodes:
        return _error(
            503, f"{len(state.episodes)} episodes are open, the limit of this server (close some)"
        )
    try:
        env = make_env(name, **{**state.base_kwargs, **kwargs})
    except (TypeError, ValueError) as exc:  # arguments the factory refuses: the client's fault
        return _error(400, f"cannot make {name!r}: {type(exc).__name__}: {exc}", type(exc).__name__)
    except Exception as exc:
        return _error(500, f"cannot make {name!r}: {type(exc).__name__}: {exc}", type(exc).__name__)
    state.accept_tasks_of(type(env).__module__)  # the environment's own task class
    episode_id = state.new_id()
    episode = state.episodes[episode_id] = _Episode(env, time.monotonic())
    return web.json_response(
        {
            "episode_id": episode_id,
            "episode_token": episode.token,
            "env": name,
            "tools": env.tool_schemas(),
        }
    )


def _episode(request: web.Request) -> tuple[str, _Episode | None]:
    episode_id = request.match_info["episode_id"]
    return episode_id, request.app[_STATE].episodes.get(episode_id)


def _not_holder(request: web.Request, episode_id: str, episode: _Episode) -> web.Response | None:
    """A 403 unless the request carries the episode's token (compared in constant time)."""
    given = request.headers.get(TOKEN_HEADER, "").encode()
    if hmac.compare_digest(given, episode.token.encode()):
        return None
    return _error(
        403,
        f"{TOKEN_HEADER}: missing or not the token of episode {episode_id!r} "
        "(POST /envs answered it as episode_token)",
        "Forbidden",
    )


def _unknown(episode_id: str, idle_timeout_s: float) -> web.Response:
    return _error(
        404,
        f"unknown episode {episode_id!r} (never created, closed, or closed after "
        f"{idle_timeout_s:g}s without requests)",
        "KeyError",
    )


async def _on_episode(request: web.Request, verb: str) -> web.Response:
    """Runs ``verb`` (reset, step, evaluate) on the request's episode, one request at a time."""
    state = request.app[_STATE]
    episode_id, episode = _episode(request)
    if episode is None:
        return _unknown(episode_id, state.config.idle_timeout_s)
    refused = _not_holder(request, episode_id, episode)
    if refused is not None:
        return refused
    episode.busy += 1
    try:
        try:
            body = await read_json(request, if_empty={}, object_only=True)
            if verb == "reset":
                args: tuple = (task_from_json(body.get("task"), state.task_types),)
            elif verb == "step":
                args = (action_from_json(body.get("action")),)
            else:
                args = ()
        except ValueError as exc:
            return _error(400, str(exc), "ValueError")
        async with episode.lock:
            if state.episodes.get(episode_id) is not episode:  # closed while we waited
                return _unknown(episode_id, state.config.idle_timeout_s)
            env = episode.env
            try:
                if verb == "reset":
                    observation = await env.reset(*args)
                    answer = {"observation": observation, "tools": env.tool_schemas()}
                elif verb == "step":
                    answer = step_result_to_json(await env.step(*args))
                else:
                    answer = {"reward": float(await env.evaluate())}
            except Exception as exc:  # the environment's failure: the client raises it
                return _error(500, f"{verb}: {type(exc).__name__}: {exc}", type(exc).__name__)
    finally:
        episode.busy -= 1
        episode.last_used = time.monotonic()
    try:  # JSON has no NaN or infinity: refuse to send such a reward as invalid JSON
        text = json.dumps(answer, allow_nan=False, default=str)
    except ValueError as exc:
        return _error(500, f"{verb}: the environment's answer is not JSON: {exc}", "ValueError")
    return web.json_response(text=text)


async def handle_reset(request: web.Request) -> web.Response:
    return await _on_episode(request, "reset")


async def handle_step(request: web.Request) -> web.Response:
    return await _on_episode(request, "step")


async def handle_evaluate(request: web.Request) -> web.Response:
    return await _on_episode(request, "evaluate")


async def handle_delete(request: web.Request) -> web.Response:
    state = request.app[_STATE]
    episode_id, episode = _episode(request)
    if episode is None:
        return _unknown(episode_id, state.config.idle_timeout_s)
    refused = _not_holder(request, episode_id, episode)
    if refused is not None:
        return refused
    async with episode.lock:  # after any request under way on it
        if state.episodes.pop(episode_id, None) is episode:
            await _close_env(episode.env)
    return web.json_response({"closed": True})


async def _reap(state: _State) -> None:
    """Close episodes idle for ``idle_timeout_s``, checking a few times per timeout."""
    period = min(state.config.idle_timeout_s / 4, 5.0)
    while True:
        await asyncio.sleep(period)
        deadline = time.monotonic() - state.config.idle_timeout_s
        stale = [
            (eid, ep)
            for eid, ep in state.episodes.items()
            if ep.busy == 0 and ep.last_used < deadline
        ]
        for eid, ep in stale:
            if state.episodes.get(eid) is ep and ep.busy == 0:
                del state.episodes[eid]
                await _close_env(ep.env)


async def _lifecycle(app: web.Application):
    """The reaper while serving; on shutdown, every open episode closed."""
    state = app[_STATE]
    reaper = asyncio.get_running_loop().create_task(_reap(state), name="env-reaper")
    yield
    state.stopping = True
    reaper.cancel()
    await asyncio.gather(reaper, return_exceptions=True)
    episodes, state.episodes = list(state.episodes.values()), {}
    await asyncio.gather(*(_close_env(ep.env) for ep in episodes))


def build_env_app(config: EnvServerConfig) -> web.Application:
    """The aiohttp application serving ``config.env_name`` (see the module docstring).

    Raises ``ValueError`` if the environment is not registered.
    """
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_guard])
    app[_STATE] = _State(config)
    app.cleanup_ctx.append(_lifecycle)
    app.router.add_get("/health", handle_health)
    app.router.add_post("/envs", handle_create)
    app.router.add_post("/envs/{episode_id}/reset", handle_reset)
    app.router.add_post("/envs/{episode_id}/step", handle_step)
    app.router.add_post("/envs/{episode_id}/evaluate", handle_evaluate)
    app.router.add_delete("/envs/{episode_id}", handle_delete)
    state = app[_STATE]
    add_prometheus(app, EnvCollector(lambda: len(state.episodes)))  # GET /metrics
    return app


async def start_env_server(
    config: EnvServerConfig, *, host: str = "127.0.0.1", port: int = 0
) -> tuple[web.AppRunner, int]:
    """Serve on the running loop; returns ``(runner, port)`` (``port=0``: a free one).

    ``await runner.cleanup()`` stops it and closes every open episode. Refuses
    (ValueError) to listen beyond loopback without an API key.
    """
    check_exposure(host, config.api_key)
    return await serve_app(
        build_env_app(config),
        host,
        port,
        timeouts=config.timeouts,
        shutdown_timeout_s=_SHUTDOWN_TIMEOUT_S,
    )


async def _serve(config: EnvServerConfig, host: str, port: int) -> None:
    await serve_until_signal(
        lambda: start_env_server(config, host=host, port=port),
        lambda real_port: f"serving env {config.env_name} on {url(host, real_port)}",
    )


def env_server_config(
    path: str | os.PathLike[str] | None,
    env_name: str,
    *,
    backend: str | None = None,
    **fields: Any,
) -> EnvServerConfig:
    """The :class:`EnvServerConfig` serving ``env_name`` with the operator's policy from a
    run config YAML (``fields``: its other fields).

    ``sandbox``: the file's ``env.sandbox`` section (read as ``tunix-agentic sandbox
    --config`` reads it; ``backend``, if given, replaces the file's). ``env_kwargs``: its
    ``env.kwargs`` when its ``env.name`` is ``env_name`` or absent (another environment's
    keywords are left out, with a note on stderr), and ``env.tool_timeout_s`` as
    ``tool_timeout`` when the factory takes one. No file: the defaults. Raises
    ``ValueError`` for an unreadable file or a malformed section.
    """
    from tunix_agentic.envs.sandbox import load_sandbox_config

    sandbox = load_sandbox_config(path, backend)
    env: Any = {}
    if path is not None:
        import yaml

        with open(path) as f:  # readable: load_sandbox_config read it
            doc = yaml.safe_load(f) or {}
        env = doc.get("env") if isinstance(doc, dict) else None
        env = env if env is not None else {}
        if not isinstance(env, dict):
            raise ValueError(f"env in {path} must be a mapping, got {env!r}")
    kwargs = env.get("kwargs") or {}
    if not isinstance(kwargs, dict):
        raise ValueError(f"env.kwargs in {path} must be a mapping, got {kwargs!r}")
    named = env.get("name")
    if kwargs and named is not None and named != env_name:
        print(
            f"tunix-agentic: note: env.kwargs in {path} are environment {named!r}'s, "
            f"not {env_name!r}'s: not used",
            file=sys.stderr,
        )
        kwargs = {}
    kwargs = dict(kwargs)
    timeout = env.get("tool_timeout_s")
    if "tool_timeout" not in kwargs:
        kwargs.update(offered_keywords(env_name, {"tool_timeout": timeout}))
    return EnvServerConfig(env_name, sandbox=sandbox, env_kwargs=kwargs, **fields)


def serve_env_main(
    env_name: str,
    *,
    imports: Sequence[str] = (),
    host: str = "127.0.0.1",
    port: int = 8100,
    api_key: str | None = None,
    idle_timeout_s: float = 600.0,
    max_episodes: int = 4096,
    config: str | os.PathLike[str] | None = None,
    sandbox_backend: str | None = None,
    timeouts: ServerTimeouts | None = None,
) -> int:
    """``tunix-agentic serve-env``: import ``imports``, then serve ``env_name`` until SIGINT
    or SIGTERM. Prints ``serving env NAME on http://HOST:PORT`` once listening. Returns
    the exit status (2 for a bad argument, 1 when the address cannot be bound).
    ``api_key`` defaults to ``$TUNIX_AGENTIC_API_KEY``. ``config`` (a run config YAML)
    and ``sandbox_backend`` give the operator's sandbox and factory keywords
    (:func:`env_server_config`); the environment's factory is checked against them before
    the port opens."""

    def set_up(api_key: str | None) -> Callable[[], Awaitable[None]]:
        import_env_modules(list(imports))
        _State.check_name(env_name)
        server_config = env_server_config(
            config,
            env_name,
            backend=sandbox_backend,
            task_modules=tuple(imports),
            idle_timeout_s=idle_timeout_s,
            max_episodes=max_episodes,
            api_key=api_key,
            timeouts=timeouts or ServerTimeouts(),
        )
        state = _State(server_config)  # the factory refusing the operator's keywords fails here
        if "sandbox" in state.base_kwargs and os.geteuid() == 0:
            # As root, sandboxes run as uid_base.. : none of those uids may be the host's.
            check_uid_range(server_config.sandbox.uid_base)
        return lambda: _serve(server_config, host, port)

    return run_server_main(host, port, api_key, set_up, refused=(SandboxError,))
