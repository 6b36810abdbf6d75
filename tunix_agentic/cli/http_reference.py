"""docs/reference/http.md from the servers' live route tables.

Each server's aiohttp application is built as its command builds it, without serving:
``serve-engine``'s over an in-process engine on a tiny model, ``serve-env``'s over the
``arithmetic`` environment, ``serve-rollout``'s over a node with no engines in a temporary
state directory (its OpenAI-compatible endpoint mounted on it, as on every node). The
routes are read from their routers; the vLLM guard in front of a Ray engine actor forwards
only the routes of its ``ROUTES`` table, which is read instead of its catch-all route.

A route is described by its entry in :data:`ROUTE_NOTES` (written for a client) or, without
one, by the first paragraph of its handler's own docstring; a request body checked by a
pydantic model names it in :data:`ROUTE_BODIES`. :func:`undescribed_routes` and
:func:`stale_notes` say where the two tables and the live routes disagree
(tests/test_reference_docs.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import importlib
import inspect
import re
import tempfile
from collections.abc import Callable
from typing import Any

from tunix_agentic.config_reference import md_table, md_text


@dataclasses.dataclass(frozen=True)
class Body:
    """The pydantic model that checks a request's JSON body (``at``: the key of the body
    it checks; empty: the whole body)."""

    model: str  # its import path: "tunix_agentic.rollout.wire._Request"
    at: str = ""


@dataclasses.dataclass(frozen=True)
class HttpRoute:
    """One route as the page lists it."""

    method: str  # "POST"
    path: str  # "/envs/{episode_id}/step"
    handler: str  # "tunix_agentic.serving.env_server.handle_step"
    summary: str  # markdown: its note, or its handler's docstring
    bodies: tuple[Body, ...] = ()


@dataclasses.dataclass(frozen=True)
class HttpServer:
    """One server (or endpoint) and its routes, in the order its app registers them."""

    key: str  # the section's anchor: "serve-engine"
    title: str
    intro: str  # markdown
    routes: tuple[HttpRoute, ...]


@dataclasses.dataclass(frozen=True)
class _LiveRoute:
    method: str
    path: str
    handler: Callable[..., Any] | None  # None: a route forwarded to another server


# What each route does, as a client needs it (a route without a note shows its handler's
# own docstring).
ROUTE_NOTES: dict[str, dict[tuple[str, str], str]] = {
    "serve-engine": {
        ("POST", "/generate"): (
            "Sample completions of token ids in SGLang's native wire format: `input_ids` "
            "(one prompt, or a list answered by a list), `sampling_params`, "
            "`return_logprob`, `rid`, and our `session_id` (the session's KV cache kept "
            "between turns). Answers `output_ids` and `meta_info` (finish reason, token "
            "counts, logprobs, `output_token_versions`: each token's policy version); "
            '`"stream": true` answers server-sent events.'
        ),
        ("GET", "/health"): (
            'The engine\'s state (`status` "ok" and its `health()`); 503 once it is '
            "closed. Needs no API key."
        ),
        ("GET", "/get_model_info"): (
            "The model info the server was started with (`model_path`, `vocab_size`, "
            "`max_seq_len`, `eos_token_ids`, ...) and the `weight_version` served now."
        ),
        ("GET", "/model_info"): "The same as `GET /get_model_info` (SGLang's newer name).",
        ("POST", "/abort_request"): (
            '`{"rid": ...}`: abort that request; answers `{"success": bool}`.'
        ),
        ("GET", "/metrics"): (
            "Prometheus' text format: request latency by route, requests in flight, and "
            "the engine's queue, slots, tokens, busy seconds and weight version."
        ),
    },
    "serve-env": {
        ("GET", "/health"): (
            '`{"status": "ok", "env", "episodes"}`: the environment served and the episodes '
            "open. Needs no API key."
        ),
        ("POST", "/envs"): (
            '`{"env": NAME or null, "kwargs": {...}}`: make an environment (`kwargs` only '
            "those the environment takes from clients: `register_env(client_kwargs=...)`); "
            "answers `episode_id`, `episode_token` (send it as `X-Episode-Token` on every "
            "call below), `env` and `tools`."
        ),
        ("POST", "/envs/{episode_id}/reset"): (
            '`{"task": {"type", "fields"}}`: reset the episode on that task; answers '
            "`observation` and `tools`."
        ),
        ("POST", "/envs/{episode_id}/step"): (
            '`{"action": {...}}`: one agent action; answers `observation`, `reward`, '
            "`done`, `info` and `messages`."
        ),
        ("POST", "/envs/{episode_id}/evaluate"): 'The episode\'s final reward: `{"reward"}`.',
        ("DELETE", "/envs/{episode_id}"): ('Close the episode\'s environment: `{"closed": true}`.'),
        ("GET", "/metrics"): (
            "Prometheus' text format: request latency by route, requests in flight and the "
            "episodes open."
        ),
    },
    "serve-rollout": {
        ("GET", "/health"): '`{"ok": true, "engines": N}`. Needs no API key.',
        ("POST", "/v1/groups"): (
            "Submit a group: 202 `{group_id, status}`. The same id with the same body "
            'answers the same, another body 409; `"agent": "external"` and '
            '`"own_tasks"` groups need the admin key.'
        ),
        ("GET", "/v1/groups"): (
            "`?done_since=C&limit=N`: the caller's final groups in completion order after cursor C."
        ),
        ("GET", "/v1/groups/{group_id}"): (
            "A group the caller submitted: its status, and once done its trajectories; "
            "`?wait_s=N` long-polls until it is final, `&members=false` leaves the "
            "learner's view out."
        ),
        ("DELETE", "/v1/groups/{group_id}"): "Cancel a group (idempotent). Admin key.",
        ("GET", "/v1/events"): (
            "Server-sent events: one `group` event per final group (`id`: its cursor) from "
            "`?cursor=C` or `Last-Event-ID` on; a comment line every 15 s keeps it open."
        ),
        ("POST", "/v1/policy"): (
            '`{"version": N, "weights_path"?: DIR}`: the trainer published policy version '
            "N; replies are held to it. Admin key."
        ),
        ("GET", "/v1/status"): (
            "The node's state: groups by status, engines, policy version, caps and counters."
        ),
        ("POST", "/v1/engines"): (
            '`{"url": "http://host:port", "api"?: "sglang" | "vllm"}`: add an engine '
            "behind the node. Admin key."
        ),
        ("DELETE", "/v1/engines"): '`{"url": ...}`: remove an engine (404 if absent). Admin key.',
        ("POST", "/v1/episodes/claim"): (
            '`{"wait_s"?: N}`: claim a member of an `"agent": "external"` group: 200 '
            "`{episode_id, episode_token, group_id, task, prompt, sampling, max_turns, "
            "policy_version, lease_s}`, or 204 when none is offered within `wait_s`."
        ),
    },
    "openai": {
        ("GET", "/v1/models"): (
            "The served policy: `id` the configured model name (`policy` unless set) and "
            "`policy_version` the weights' version now."
        ),
        ("GET", "/v1/models/{model_id}"): "The same model, by its name (404 for another).",
        ("POST", "/v1/chat/completions"): (
            "OpenAI's chat completions, rendered with the policy's chat template and "
            "tokenised once; tool calls parsed with the agent's parser; `stream` answers "
            "server-sent chunks. With `X-Episode-Id` (and `X-Episode-Token`) the call is "
            "recorded token for token into that episode."
        ),
        ("POST", "/v1/episodes/{episode_id}/reward"): (
            '`{"reward": r, "task_id"?: str, "info"?: {...}}`: close the episode with its '
            "reward (its `X-Episode-Token` needed)."
        ),
        ("GET", "/v1/episodes/{episode_id}"): (
            "What the episode recorded, call by call, and once closed its `trajectory` in "
            "the rollout wire format (its `X-Episode-Token` needed)."
        ),
        ("POST", "/v1/responses"): (
            "The Responses API subset agent frameworks send (not stateful), served as the "
            "chat completion it translates to, recorded the same way."
        ),
    },
    "vllm-guard": {
        ("POST", "/inference/v1/generate"): (
            "vLLM's token route: token ids in, ids and logprobs out."
        ),
        ("POST", "/inference/v1/abort_requests"): "Abort requests by vLLM's ids.",
        ("GET", "/v1/models"): "The model served and its `max_model_len`.",
        ("GET", "/weight_info"): "The weight version vLLM holds.",
        ("GET", "/health"): "vLLM's health. Needs no API key.",
        ("POST", "/pause"): (
            "Pause generation (`?mode=keep` keeps the requests) for a weight update."
        ),
        ("POST", "/resume"): "Resume generation after a weight update.",
        ("POST", "/reset_prefix_cache"): "Drop the prefix cache (its KV is the old weights').",
        ("POST", "/update_weight_version"): '`{"new_version": "N"}`: the version now served.',
        ("POST", "/collective_rpc"): (
            "Only `reload_weights`, with a `weights_path` inside the weight directories "
            "named at start (403 otherwise)."
        ),
    },
}

# The pydantic models that check request bodies.
ROUTE_BODIES: dict[str, dict[tuple[str, str], tuple[Body, ...]]] = {
    "serve-engine": {
        ("POST", "/generate"): (
            Body("tunix_agentic.serving.generate_request._Options", "each prompt's options"),
            Body("tunix_agentic.serving.generate_request._Sampling", "sampling_params"),
        ),
    },
    "serve-rollout": {
        ("POST", "/v1/groups"): (Body("tunix_agentic.rollout.wire._Request"),),
    },
    "openai": {
        ("POST", "/v1/chat/completions"): (
            Body("tunix_agentic.rollout.openai_endpoint.protocol.ChatCompletionRequest"),
        ),
        ("POST", "/v1/episodes/{episode_id}/reward"): (
            Body("tunix_agentic.rollout.openai_endpoint.protocol.RewardRequest"),
        ),
        ("POST", "/v1/responses"): (
            Body("tunix_agentic.rollout.openai_endpoint.protocol.ResponsesRequest"),
        ),
    },
}

_INTROS = {
    "serve-engine": (
        "serve-engine",
        "`tunix-agentic serve-engine`: the JAX engine behind SGLang's native API "
        "(`tunix_agentic.serving.engine_server`). `SGLangEngine` is its client, and "
        "sglang-router registers it as a worker. A malformed request is a 400 naming the "
        "field; a closed engine answers 503.",
    ),
    "serve-env": (
        "serve-env",
        "`tunix-agentic serve-env --env NAME`: one registered environment over HTTP, an "
        "episode per client environment (`tunix_agentic.serving.env_server`); the `remote` "
        "environment is its client. Every call on an episode needs the episode's "
        "`X-Episode-Token` (403 otherwise).",
    ),
    "serve-rollout": (
        "serve-rollout",
        "`tunix-agentic serve-rollout`: a rollout node that runs groups submitted over HTTP "
        "(`tunix_agentic.rollout.service.node_http`); the trainer's client is "
        "`ServiceEpisodeRunner`. The operator's routes need the admin key (403 otherwise); "
        "a group is read only by the client that submitted it and the operator.",
    ),
    "openai": (
        "OpenAI-compatible endpoint",
        "Mounted on every rollout node beside its group routes "
        "(`tunix_agentic.rollout.openai_endpoint`): an agent written anywhere calls the "
        "policy through it, and a call with `X-Episode-Id` is recorded token for token so "
        "the episode can be trained on.",
    ),
    "vllm-guard": (
        "vLLM guard",
        "In front of a vLLM server on loopback, when a Ray engine actor serves one "
        "(`engine.backend: vllm`, `tunix_agentic.serving.vllm_guard`): these routes, and "
        "no other, are forwarded to vLLM, each behind the run's API key but `/health`.",
    ),
}


# ---------------------------------------------------------------- the live apps
def _routes(app: Any) -> list[_LiveRoute]:
    """The routes of an aiohttp app in registration order, the HEAD twin aiohttp adds to
    every GET left out."""
    out, seen = [], set()
    for route in app.router.routes():
        method, path = route.method, route.resource.canonical
        if method == "HEAD" or (method, path) in seen:
            continue
        seen.add((method, path))
        out.append(_LiveRoute(method, path, route.handler))
    return out


def _engine_routes() -> list[_LiveRoute]:
    from tunix_agentic.inference.config import EngineConfig
    from tunix_agentic.inference.engine import JaxEngine
    from tunix_agentic.serving.engine_server import build_app
    from tunix_agentic.testing import tiny_model

    engine = JaxEngine(tiny_model(), EngineConfig(max_slots=1, max_seq_len=32))
    try:
        return _routes(build_app(engine, model_info={}))
    finally:
        asyncio.run(engine.close())


def _env_routes() -> list[_LiveRoute]:
    import tunix_agentic.envs  # noqa: F401  (registers the built-in environments)
    from tunix_agentic.serving.env_server import EnvServerConfig, build_env_app

    return _routes(build_env_app(EnvServerConfig("arithmetic")))


def _node_routes() -> list[_LiveRoute]:
    from tunix_agentic.config import load_config
    from tunix_agentic.rollout.service.engines import EngineSet
    from tunix_agentic.rollout.service.node import RolloutNode, setup_from_config
    from tunix_agentic.rollout.service.node_http import build_node_app

    setup = setup_from_config(load_config(None))
    with tempfile.TemporaryDirectory() as state_dir:
        return _routes(build_node_app(RolloutNode(setup, EngineSet([]), state_dir)))


def _guard_routes() -> list[_LiveRoute]:
    from tunix_agentic.serving.vllm_guard import ROUTES

    return [
        _LiveRoute(method, path, None) for method, path in sorted(ROUTES, key=lambda r: r[::-1])
    ]


def _is_openai(route: _LiveRoute) -> bool:
    return (route.handler.__module__ or "").startswith("tunix_agentic.rollout.openai_endpoint")


@functools.cache
def live_routes() -> dict[str, tuple[_LiveRoute, ...]]:
    """Server key -> its routes, read from the applications built now."""
    node = _node_routes()
    return {
        "serve-engine": tuple(_engine_routes()),
        "serve-env": tuple(_env_routes()),
        "serve-rollout": tuple(r for r in node if not _is_openai(r)),
        "openai": tuple(r for r in node if _is_openai(r)),
        "vllm-guard": tuple(_guard_routes()),
    }


# ---------------------------------------------------------------- descriptions
def _docstring(obj: Any) -> str:
    """The first paragraph of ``obj``'s own docstring ("" without one: a method's is not
    inherited from the method it overrides)."""
    doc = getattr(obj, "__doc__", None) if obj is not None else None
    return md_text(inspect.cleandoc(doc).split("\n\n")[0]) if doc else ""


def _first_sentence(text: str) -> str:
    """``text`` up to its first full stop that ends a sentence (no full stop kept)."""
    cut = re.search(r"\.\s+(?=[A-Z`(])", text)
    return (text[: cut.start()] if cut else text).rstrip(".")


def _handler_name(handler: Callable[..., Any] | None) -> str:
    if handler is None:
        return "forwarded"
    return f"{handler.__module__}.{handler.__qualname__}"


def http_servers() -> list[HttpServer]:
    """Every server and its routes, described."""
    out = []
    for key, routes in live_routes().items():
        title, intro = _INTROS[key]
        notes, bodies = ROUTE_NOTES.get(key, {}), ROUTE_BODIES.get(key, {})
        described = tuple(
            HttpRoute(
                r.method,
                r.path,
                _handler_name(r.handler),
                notes.get((r.method, r.path)) or _docstring(r.handler),
                bodies.get((r.method, r.path), ()),
            )
            for r in routes
        )
        out.append(HttpServer(key, title, intro, described))
    return out


def undescribed_routes() -> list[str]:
    """``"server METHOD path"`` of each live route with neither a note nor a docstring."""
    return [
        f"{s.key} {r.method} {r.path}" for s in http_servers() for r in s.routes if not r.summary
    ]


def stale_notes() -> list[str]:
    """``"server METHOD path"`` of each note or body entry whose route no server has."""
    live = {k: {(r.method, r.path) for r in routes} for k, routes in live_routes().items()}
    return [
        f"{key} {method} {path}"
        for table in (ROUTE_NOTES, ROUTE_BODIES)
        for key, entries in table.items()
        for method, path in entries
        if (method, path) not in live.get(key, set())
    ]


def body_model(body: Body) -> Any:
    """The pydantic model ``body`` names (ValueError saying where to fix a moved one)."""
    module, _, name = body.model.rpartition(".")
    try:
        model = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(
            f"{body.model} (a request body in tunix_agentic/cli/http_reference.py "
            f"ROUTE_BODIES) does not resolve: {exc}"
        ) from None
    if not hasattr(model, "model_fields"):
        raise ValueError(f"{body.model} is not a pydantic model")
    return model


_EXTRA = {
    "forbid": "any other field is refused",
    "ignore": "any other field is ignored",
    "allow": "other fields are kept",
}


def field_groups(model: Any) -> list[tuple[Any, list[tuple[str, bool]]]]:
    """``model``'s fields by the class that declares them: ``(cls, [(json name, required)])``,
    ``model``'s own first (with those of its private bases), then each public base's (a
    shared group such as ``EngineExtras``), in the order of the method resolution."""
    owner: dict[str, Any] = {}
    for cls in reversed(model.__mro__):
        for name in cls.__dict__.get("__annotations__", {}):
            if name in model.model_fields:
                owner[name] = model if cls.__name__.startswith("_") else cls
    groups: dict[Any, list[tuple[str, bool]]] = {model: []}
    for name, info in model.model_fields.items():
        groups.setdefault(owner.get(name, model), []).append(
            (info.alias or name, info.is_required())
        )
    ordered = [c for c in model.__mro__ if c in groups]
    return [(cls, groups[cls]) for cls in ordered if groups[cls]]


def _names(fields: list[tuple[str, bool]]) -> str:
    required = [f"`{n}`" for n, req in fields if req]
    optional = [f"`{n}`" for n, req in fields if not req]
    parts = ["required " + ", ".join(required)] if required else []
    return "; ".join(parts + (["optional " + ", ".join(optional)] if optional else []))


def _body_lines(route: HttpRoute, body: Body) -> list[str]:
    model = body_model(body)
    module, _, name = body.model.rpartition(".")
    where = f"`{body.at}`" if body.at and " " not in body.at else (body.at or "the body")
    extra = _EXTRA.get(model.model_config.get("extra") or "ignore", "")
    out = [f"- `{route.method} {route.path}`, {where}: `{name}` in `{module}` ({extra}):"]
    for cls, fields in field_groups(model):
        if cls is model:
            out.append(f"    - {_names(fields)}.")
        else:
            about = _first_sentence(_docstring(cls))
            out.append(f"    - `{cls.__name__}` ({about}): {_names(fields)}.")
    return out


# ---------------------------------------------------------------- the page
def render_http_reference() -> str:
    """The markdown of docs/reference/http.md."""
    servers = http_servers()
    out = [
        "# HTTP reference",
        "",
        "<!-- Generated by `python -m tunix_agentic.cli.reference` from the servers' live route",
        "     tables (tunix_agentic/cli/http_reference.py): edit a route's note there (or its",
        "     handler's docstring) and run it again, not this page. -->",
        "",
        "Every route of the servers, read from the route tables of their applications, each",
        "built as its command builds it. JSON in, JSON out; a refused request answers",
        '`{"error": {"message", "type"}}` with a 4xx naming the field. With an API key',
        "(`--api-key`, or `$TUNIX_AGENTIC_API_KEY`) every route but `/health` needs",
        "`Authorization: Bearer KEY` (401 otherwise); beyond loopback a server refuses to",
        "start without one. [Serving and scaling out](../serving.md),",
        "[Rollout as a service](../service.md) and [Security](../security.md) show them at work.",
        "",
        *md_table(
            ["Server", "Routes"],
            [[f"[{s.title}](#{s.key})", str(len(s.routes))] for s in servers],
        ),
    ]
    for server in servers:
        rows = [[f"`{r.method} {r.path}`", r.summary] for r in server.routes]
        out += ["", f"## {server.title} {{ #{server.key} }}", "", server.intro, ""]
        out += md_table(["Route", "What it does"], rows)
        lines = [line for r in server.routes for b in r.bodies for line in _body_lines(r, b)]
        if lines:
            out += ["", "Request bodies, as their models check them:", "", *lines]
    return "\n".join(out) + "\n"
