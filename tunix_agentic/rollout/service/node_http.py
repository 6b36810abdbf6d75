"""The rollout node's HTTP API (``tunix-agentic serve-rollout``) over a
:class:`~tunix_agentic.rollout.service.node.RolloutNode`.

Routes (JSON; every route but ``/health`` behind the API key when one is set; a bad field
answers 400 naming it, JSON nested past ``MAX_JSON_DEPTH`` too; a request past one of the
node's :class:`~tunix_agentic.rollout.service.caps.NodeCaps` answers 429 or 413 naming the
cap): ``POST /v1/groups`` (202 ``{group_id, status}``; the same id and
body again answers the same, another body 409), ``GET /v1/groups/{id}?wait_s=N`` (long
poll; ``&members=false`` leaves the learner's view out and answers the group alone),
``GET /v1/groups?done_since=C`` (final groups in completion order),
``GET /v1/events`` (server-sent events of the same, resumable with ``?cursor=C`` or
``Last-Event-ID``), ``DELETE /v1/groups/{id}`` (cancel, idempotent), ``POST /v1/policy
{version}`` (a trainer's; until one, the policy version is the one the engines serve),
``GET /v1/status``, ``POST`` / ``DELETE /v1/engines {url}``, ``GET
/health``, and the OpenAI-compatible endpoint of
:mod:`~tunix_agentic.rollout.openai_endpoint.api`. Nothing here imports JAX.

Operator routes (``POST`` / ``DELETE /v1/engines``, ``POST /v1/policy``, ``DELETE
/v1/groups/{id}``) need the admin key (``Authorization: Bearer ADMIN_KEY``; 403 otherwise),
whatever the API key: the operator's ``--admin-key``, else a token the node makes at start
and leaves, for its own user only, where its trainer on this machine reads it (see
:mod:`~tunix_agentic.rollout.service.admin`). The admin key opens every other route too.

Groups are their submitter's: a group is read (``GET /v1/groups/{id}``, the listing, the
events) by the client that submitted it (its API key, or its address on a node without
keys) and by the operator; to anyone else it answers 404 and is left out of listings, and
its id is taken (409). ``"agent": "external"`` and ``"own_tasks"`` groups, whose members
any agent may claim or fill, are submitted with the admin key only (403 otherwise).

Outside agents: a group submitted with ``"agent": "external"`` runs no agent loop; its
members are offered on ``POST /v1/episodes/claim`` (``{"wait_s": N}`` long-polls; 200
``{episode_id, group_id, task, task_id, prompt, sampling, max_turns, policy_version,
lease_s}`` or 204 when none is offered). The agent makes its chat calls with
``X-Episode-Id: <episode_id>`` (the group's sampling and a per-call seed apply where a
call omits them) and closes the member with ``POST /v1/episodes/{id}/reward``; the group
ends when every member is closed, its trajectories recorded token for token. The claim's
``episode_id`` is unguessable and comes with an ``episode_token``, sent as
``X-Episode-Token`` on each of those calls and the reward: nobody else can read, reward or
close the member. A claimed
member silent for ``lease_s`` (300 s; :func:`start_node_server`'s ``external_lease_s``), or
for a minute before its first call, is offered again; a client holds at most
``--max-claims`` (256) claimed members at once (429 past it) (see :class:`~tunix_agentic.rollout.openai_endpoint.offers.EpisodeOffers`).

Agents on their own tasks: a group submitted with ``"agent": "own_tasks"`` runs nothing
either; it is the next ``num_samples`` ad-hoc episodes (an agent's own ``X-Episode-Id`` and
token, not a claim) closed with a reward and the same ``task_id`` (``POST
/v1/episodes/{id}/reward`` ``{"reward": r, "task_id": "..."}``), whichever task id fills
first. Rewarded episodes wait for a group for ``closed_ttl_s`` (an hour: the endpoint's
:class:`~tunix_agentic.rollout.openai_endpoint.store.EpisodeLimits`; then they
expire, counted in ``/v1/status`` ``own_tasks.expired`` beside ``waiting``); one closed
without a ``task_id`` is never grouped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import logging
import math
import os
import secrets
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated

from aiohttp import web
from pydantic import Field

from tunix_agentic.rollout.openai_endpoint.api import openai_routes
from tunix_agentic.rollout.openai_endpoint.errors import TooManyClaims
from tunix_agentic.rollout.service import admin
from tunix_agentic.rollout.service.caps import NodeCaps, TooLarge, TooMany
from tunix_agentic.rollout.service.engines import EngineSet, check_url
from tunix_agentic.rollout.service.node import (
    GroupIdConflict,
    NodeRunConfig,
    NodeSetup,
    RolloutNode,
    setup_from_config,
)
from tunix_agentic.rollout.service.wal import OPERATOR
from tunix_agentic.rollout.wire import FINAL_STATUSES, GroupRequest
from tunix_agentic.serving.http import (
    api_key_guard,
    client_identity,
    json_error,
    read_json,
    run_server_main,
    serve_app,
    serve_until_signal,
    url,
)
from tunix_agentic.serving.timeouts import ServerTimeouts
from tunix_agentic.serving.validation import NonEmpty, Strict, validate_body

MAX_BODY_BYTES = 8 * 1024 * 1024  # the OpenAI endpoint's bodies (whole conversations) too
MAX_WAIT_S = 300.0  # the longest a long poll holds a request
_SSE_HEARTBEAT_S = 15.0
_SHUTDOWN_TIMEOUT_S = 5.0


logger = logging.getLogger(__name__)


@dataclasses.dataclass
class AdminScope:
    """The node's admin key; ``token_file``: where a generated one was left for the
    node's own trainer (see :mod:`.admin`), None when the operator gave the key."""

    key: str
    generated: bool
    token_file: Path | None = None


NODE = web.AppKey("rollout_node", RolloutNode)
API_KEY = web.AppKey("rollout_api_key", str)
ADMIN = web.AppKey("rollout_admin", AdminScope)
# Routes that change what the node trusts (engines, policy) or undo other clients' work.
ADMIN_ROUTES = frozenset(
    {
        ("POST", "/v1/engines"),
        ("DELETE", "/v1/engines"),
        ("POST", "/v1/policy"),
        ("DELETE", "/v1/groups/{group_id}"),
    }
)


def _has_admin_key(request: web.Request) -> bool:
    """Whether ``request`` carries the node's admin key (compared in constant time)."""
    given = request.headers.get("Authorization", "").encode()
    return hmac.compare_digest(given, f"Bearer {request.app[ADMIN].key}".encode())


@web.middleware
async def _admin_guard(request: web.Request, handler) -> web.StreamResponse:
    """The admin key on :data:`ADMIN_ROUTES` (403 otherwise, compared in constant time)."""
    resource = request.match_info.route.resource
    route = (request.method, resource.canonical if resource is not None else "")
    if route in ADMIN_ROUTES:
        scope = request.app[ADMIN]
        if not _has_admin_key(request):
            where = (
                f"; on this machine the node's token is in {scope.token_file}"
                if scope.token_file is not None
                else ""
            )
            return json_error(
                403,
                f"{request.method} {resource.canonical} is an operator route: send the admin key "
                f"as Authorization: Bearer KEY (serve-rollout --admin-key or "
                f"${admin.ADMIN_KEY_ENV}{where})",
                "Forbidden",
            )
    return await handler(request)


def _number_param(request: web.Request, name: str, default: float, hi: float) -> float:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {raw!r:.80}") from None
    if not (math.isfinite(value) and 0 <= value):
        raise ValueError(f"{name} must be a finite number >= 0, got {raw!r:.80}")
    return min(value, hi)


def _int_param(request: web.Request, name: str, default: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r:.80}") from None
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def _bool_param(request: web.Request, name: str, default: bool) -> bool:
    raw = request.query.get(name)
    if raw is None:
        return default
    value = {"1": True, "true": True, "0": False, "false": False}.get(raw.lower())
    if value is None:
        raise ValueError(f"{name} must be true or false (or 1 or 0), got {raw!r:.80}")
    return value


def _bad_request(handler):
    """A handler whose ValueError is the client's: a 400 naming the field; a cap the
    request breaks a 413 (too large) or 429 (too many) naming it; a group id that names
    another request a 409."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except GroupIdConflict as exc:
            return json_error(409, str(exc), "Conflict")
        except TooLarge as exc:
            return json_error(413, str(exc), "TooLarge")
        except (TooMany, TooManyClaims) as exc:
            return json_error(429, str(exc), "TooMany")
        except ValueError as exc:
            return json_error(400, str(exc), "BadRequest")

    wrapped.__name__ = handler.__name__
    return wrapped


def caller(request: web.Request) -> str:
    """:data:`~.wal.OPERATOR` for a request with the admin key, else the client's identity
    (:func:`~tunix_agentic.serving.http.client_identity`): who owns the groups it submits
    and which groups it may read."""
    return OPERATOR if _has_admin_key(request) else client_identity(request)


# Groups whose members any agent may claim or fill with its own rewarded episodes: only the
# operator submits them (another client's would take the trainer's members).
OPERATOR_AGENTS = frozenset({"external", "own_tasks"})


@_bad_request
async def handle_submit(request: web.Request) -> web.Response:
    node = request.app[NODE]
    req = GroupRequest.from_json(await read_json(request, if_empty={}), task_types=node.task_types)
    who = caller(request)
    if req.agent in OPERATOR_AGENTS and who != OPERATOR:
        return json_error(
            403,
            f'agent: "{req.agent}" groups are the operator\'s: send the admin key as '
            "Authorization: Bearer KEY (any agent may claim or fill their members)",
            "Forbidden",
        )
    # Shielded: a client hanging up must not leave a group half accepted.
    answer = await asyncio.shield(node.submit(req, owner=who))
    return web.json_response(answer, status=202)


def _readable(request: web.Request, gid: str):
    """Group ``gid``'s state when the caller may read it (its submitter or the operator),
    else None: another client's group answers as a missing one."""
    st = request.app[NODE].groups.get(gid)
    return st if st is not None and st.readable_by(caller(request)) else None


@_bad_request
async def handle_get(request: web.Request) -> web.Response:
    node = request.app[NODE]
    gid = request.match_info["group_id"]
    wait_s = _number_param(request, "wait_s", 0.0, MAX_WAIT_S)
    members = _bool_param(request, "members", True)
    st = _readable(request, gid)
    if st is None:
        return json_error(404, f"no group {gid!r} on this node", "NotFound")
    if st.status not in FINAL_STATUSES and wait_s > 0:
        try:
            await asyncio.wait_for(st.finished.wait(), wait_s)
        except TimeoutError:
            pass
        st = node.groups[gid]
    text = await node.answer_text(st, members=members)
    return web.Response(text=text, content_type="application/json")


@_bad_request
async def handle_list(request: web.Request) -> web.Response:
    node = request.app[NODE]
    cursor = _int_param(request, "done_since", 0)
    limit = max(1, min(_int_param(request, "limit", 1000), 10_000))
    return web.json_response(node.done_since(cursor, limit, caller(request)))


@_bad_request
async def handle_events(request: web.Request) -> web.StreamResponse:
    """Server-sent events: one ``group`` event per final group (``id``: its cursor) from
    ``?cursor=C`` or ``Last-Event-ID`` on; a comment line every 15 s keeps it open."""
    node = request.app[NODE]
    cursor = _int_param(request, "cursor", 0)
    last = request.headers.get("Last-Event-ID")
    if last is not None:
        try:
            cursor = max(cursor, int(last))
        except ValueError:
            raise ValueError(f"Last-Event-ID must be an integer cursor, got {last!r:.80}") from None
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    who = caller(request)
    await resp.prepare(request)
    while True:
        changed = node.changed.event()  # before reading: a group ending after is not missed
        page = node.done_since(cursor, 1000, who)
        for g in page["groups"]:
            data = json.dumps(g, separators=(",", ":"))
            await resp.write(f"id: {g['cursor']}\nevent: group\ndata: {data}\n\n".encode())
        cursor = page["cursor"]
        if page["groups"]:
            continue
        try:
            await asyncio.wait_for(changed.wait(), _SSE_HEARTBEAT_S)
        except TimeoutError:
            await resp.write(b": keep-alive\n\n")


async def handle_delete(request: web.Request) -> web.Response:
    node = request.app[NODE]
    gid = request.match_info["group_id"]
    answer = await asyncio.shield(node.cancel(gid))
    if answer is None:
        return json_error(404, f"no group {gid!r} on this node", "NotFound")
    return web.json_response(answer)


class _Policy(Strict, extra="ignore"):
    """``POST /v1/policy``: the version the trainer publishes and where its engines loaded
    it from (pushed to an engine that restarted, see engine_gate; absent or null when not
    on a shared filesystem)."""

    version: Annotated[int, Field(ge=0)]
    weights_path: NonEmpty | None = None


class _Claim(Strict):
    """``POST /v1/episodes/claim``: how long to wait for a member to be offered."""

    wait_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0


class _Engine(Strict, extra="ignore"):
    """``POST`` / ``DELETE /v1/engines``: the engine's URL and (``POST``) its API."""

    url: str
    api: str = "sglang"  # or "vllm": checked by the engine set


@_bad_request
async def handle_policy(request: web.Request) -> web.Response:
    node = request.app[NODE]
    body = await read_json(request, if_empty={})
    policy = validate_body(_Policy, body, shape='{"version": N, "weights_path"?: DIR}')
    # Now the node's policy: replies are held to it.
    node.engines.publish(policy.version, policy.weights_path)
    return web.json_response({"version": node.engines.policy_version})


@_bad_request
async def handle_claim(request: web.Request) -> web.Response:
    node = request.app[NODE]
    body = await read_json(request, if_empty={})
    wait_s = validate_body(_Claim, body, shape='{"wait_s"?: N}').wait_s
    offer = await node.external.claim(min(wait_s, MAX_WAIT_S), client_identity(request))
    if offer is None:
        return web.Response(status=204)
    answer = {
        "episode_id": offer.episode_id,
        "episode_token": offer.token,  # the agent's alone: X-Episode-Token on its calls
        "group_id": offer.group_id,
        **offer.claim,
    }
    return web.json_response({**answer, "lease_s": node.external.lease_s})


async def handle_status(request: web.Request) -> web.Response:
    return web.json_response(request.app[NODE].status())


async def handle_health(request: web.Request) -> web.Response:
    node = request.app[NODE]
    return web.json_response({"ok": True, "engines": len(node.engines.urls)})


@_bad_request
async def handle_engines(request: web.Request) -> web.Response:
    node = request.app[NODE]
    body = await read_json(request, if_empty={})
    shape = '{"url": "http://host:port", "api"?: "sglang" (the default) or "vllm"}'
    engine = validate_body(_Engine, body, shape=shape)
    where = check_url(engine.url)
    if request.method == "POST":
        changed = node.engines.add(where, engine.api)
    else:
        changed = node.engines.remove(where)
        if not changed:
            return json_error(404, f"url: no engine {where!r} on this node", "NotFound")
    return web.json_response({"changed": changed, "engines": node.engines.urls})


def _keys(app: web.Application) -> tuple[str, ...] | None:
    # With an API key, the admin key opens the same routes; without one, none needs a key.
    return (app[API_KEY], app[ADMIN].key) if API_KEY in app else None


def build_node_app(
    node: RolloutNode,
    *,
    api_key: str | None = None,
    admin_key: str | None = None,
    external_lease_s: float | None = None,
    external_first_call_s: float | None = None,
) -> web.Application:
    """The aiohttp application of ``node`` (its routes in the module docstring).
    ``admin_key``: the operator's (None: a random one, left for the node's own trainer
    by :func:`start_node_server`). ``external_lease_s``: how long a claimed external
    member may stay silent (``external_first_call_s`` before its first call); None: as
    the node's offers have it (300 s and 60 s unless the node was given its own)."""
    app = web.Application(
        client_max_size=MAX_BODY_BYTES, middlewares=[api_key_guard(_keys), _admin_guard]
    )
    app[NODE] = node
    app[ADMIN] = AdminScope(admin_key or secrets.token_urlsafe(32), generated=not admin_key)
    app.on_cleanup.append(_remove_token)
    if api_key:
        app[API_KEY] = api_key
    app.router.add_get("/health", handle_health)
    app.router.add_post("/v1/groups", handle_submit)
    app.router.add_get("/v1/groups", handle_list)
    app.router.add_get("/v1/groups/{group_id}", handle_get)
    app.router.add_delete("/v1/groups/{group_id}", handle_delete)
    app.router.add_get("/v1/events", handle_events)
    app.router.add_post("/v1/policy", handle_policy)
    app.router.add_get("/v1/status", handle_status)
    app.router.add_post("/v1/engines", handle_engines)
    app.router.add_delete("/v1/engines", handle_engines)
    _mount_openai(app, node, external_lease_s, external_first_call_s)
    return app


def _mount_openai(
    app: web.Application, node: RolloutNode, lease_s: float | None, first_call_s: float | None
) -> None:
    """The node's OpenAI-compatible endpoint (``POST /v1/chat/completions``,
    ``/v1/responses``, ``/v1/episodes/...``: see
    :mod:`tunix_agentic.rollout.openai_endpoint.api`) and the claim route of its offers,
    whose leases ``lease_s`` and ``first_call_s`` become when given."""
    for name, value in (("lease_s", lease_s), ("first_call_s", first_call_s)):
        if value is not None:
            if not value > 0:
                raise ValueError(f"external_{name} must be > 0, got {value}")
            setattr(node.external, name, value)
    app.add_routes(openai_routes(node.openai))
    # After the OpenAI routes' /v1/episodes/{episode_id}: a static route wins anyway.
    app.router.add_post("/v1/episodes/claim", handle_claim)


async def _remove_token(app: web.Application) -> None:
    scope = app[ADMIN]
    if scope.token_file is not None:
        admin.remove_token(scope.token_file, scope.key)


async def start_node_server(
    node: RolloutNode,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    api_key: str | None = None,
    admin_key: str | None = None,
    timeouts: ServerTimeouts | None = None,
    external_lease_s: float | None = None,
    external_first_call_s: float | None = None,
) -> tuple[web.AppRunner, int]:
    """Replay the node's log, then serve it on the running loop: ``(runner, port)``.
    Without ``admin_key`` the node's generated one is written to
    :func:`~tunix_agentic.rollout.service.admin.token_path` of the port (removed when the
    runner is cleaned up)."""
    await node.start()
    app = build_node_app(
        node,
        api_key=api_key,
        admin_key=admin_key,
        external_lease_s=external_lease_s,
        external_first_call_s=external_first_call_s,
    )
    runner, real_port = await serve_app(
        app,
        host,
        port,
        timeouts=timeouts or ServerTimeouts(),
        shutdown_timeout_s=_SHUTDOWN_TIMEOUT_S,
    )
    scope = app[ADMIN]
    if scope.generated:
        try:
            scope.token_file = await asyncio.to_thread(admin.write_token, real_port, scope.key)
        except OSError as exc:  # the operator routes stay closed: say why
            logger.warning(
                "could not leave the admin token for this machine's trainer (%s); operator "
                "routes are closed until the node is started with --admin-key",
                exc,
            )
    return runner, real_port


async def _serve(
    setup: NodeSetup,
    engine_urls: list[str],
    state_dir: str | Path,
    *,
    host: str,
    port: int,
    api_key: str | None,
    engine_api_key: str | None,
    timeouts: ServerTimeouts,
    max_groups: int | None = None,
    admin_key: str | None = None,
    caps: NodeCaps | None = None,
) -> None:
    engines = EngineSet(engine_urls, api_key=engine_api_key)
    node = RolloutNode(setup, engines, state_dir, max_groups=max_groups, caps=caps)
    await serve_until_signal(
        lambda: start_node_server(
            node, host=host, port=port, api_key=api_key, admin_key=admin_key, timeouts=timeouts
        ),
        lambda real_port: f"serving rollout node on {url(host, real_port)}",
        before_cleanup=node.close,
    )


def serve_rollout_main(
    config: NodeRunConfig,
    *,
    engine_urls: list[str] | tuple[str, ...] = (),
    state_dir: str | Path = "runs/rollout_node",
    host: str = "127.0.0.1",
    port: int = 8200,
    api_key: str | None = None,
    engine_api_key: str | None = None,
    timeouts: ServerTimeouts | None = None,
    max_groups: int | None = None,
    repair_log: bool = False,
    admin_key: str | None = None,
    caps: NodeCaps | None = None,
) -> int:
    """``tunix-agentic serve-rollout``: serve a node for ``config`` (a loaded
    :class:`~tunix_agentic.config.RunConfig`; the CLI reads it) until SIGINT or SIGTERM. Prints ``serving rollout node on http://HOST:PORT`` once
    listening. Returns the exit status (2 for a bad argument or config, 1 when the address
    cannot be bound). ``api_key`` defaults to ``$TUNIX_AGENTIC_API_KEY``; the engines get
    ``engine_api_key`` (default: the same key). ``max_groups``: groups run at once, the
    rest wait by priority (default :attr:`NodeSetup.max_groups`: enough to fill the
    config's INIT, RUN and EVAL pools). ``admin_key`` (default
    ``$TUNIX_AGENTIC_ADMIN_KEY``, else a token left for this machine's trainer: see
    :mod:`.admin`) opens the operator routes; ``caps``: queued groups, inline task and
    log bytes (:class:`~tunix_agentic.rollout.service.caps.NodeCaps`). ``repair_log``: first drop the log's damaged lines,
    printing each (see :func:`~tunix_agentic.rollout.service.wal.repair_log`); exit status
    2 as well when the state dir is another node's or its log is damaged."""
    from tunix_agentic.rollout.service.wal import LogDamaged, StateDirBusy

    def set_up(api_key: str | None) -> Callable[[], Awaitable[None]]:
        operator_key = admin_key or os.environ.get(admin.ADMIN_KEY_ENV) or None
        if operator_key is not None and operator_key == api_key:
            raise ValueError("--admin-key must differ from the API key agents use")
        if max_groups is not None and max_groups < 1:
            raise ValueError(f"--max-groups must be >= 1, got {max_groups}")
        urls = [check_url(u) for u in engine_urls]
        setup = setup_from_config(config)

        async def serve() -> None:
            if repair_log:
                await asyncio.to_thread(_repair, state_dir)
            await _serve(
                setup,
                urls,
                state_dir,
                host=host,
                port=port,
                api_key=api_key,
                engine_api_key=engine_api_key or api_key,
                timeouts=timeouts or ServerTimeouts(),
                max_groups=max_groups,
                admin_key=operator_key,
                caps=caps,
            )

        return serve

    return run_server_main(
        host,
        port,
        api_key,
        set_up,
        refused=(FileNotFoundError,),
        refused_serving=(StateDirBusy, LogDamaged),
    )


def _repair(state_dir: str | Path) -> None:
    from tunix_agentic.rollout.service.wal import repair_log

    done = repair_log(state_dir)
    for number, text in done.dropped:
        print(f"repair-log: dropped line {number}: {text}", file=sys.stderr)
    if done.torn_bytes:
        print(f"repair-log: cut a torn last line ({done.torn_bytes} bytes)", file=sys.stderr)
    print(f"repair-log: {state_dir}: {len(done.dropped)} damaged lines dropped", file=sys.stderr)
