"""Remote environments: an :class:`Environment` whose episodes run on an env server.

``tunix-agentic serve-env --env NAME`` serves any registered environment over HTTP
(:mod:`tunix_agentic.serving.env_server`); :class:`RemoteEnv` is its client, so
rollouts can run environments on other machines (sandboxes, simulators) while the
orchestrator stays unchanged. It is registered as ``"remote"``:
``make_env("remote", url="http://host:8100", env="arithmetic")``.

This module also holds the wire format both sides share: a task travels as
``{"type": "module:QualName", "fields": {...}}`` (a dataclass's init fields, JSON
values only), an action as ``{"text", "tool_calls": [{"name", "arguments"}],
"answer", "parse_errors"}``, a step's result as ``{"observation", "reward", "done",
"info", "messages"}``.

Failures are infrastructure failures, never a reward: an unreachable or dead server,
a timeout, or the remote environment raising makes the call raise
:class:`RemoteEnvError` (the orchestrator records ``env_error``), and a remote tool
raising :class:`~tunix_agentic.envs.tools.ToolUnavailable` raises it here too
(``tool_error``). :meth:`RemoteEnv.backend_health` tells the orchestrator whether the
server is up, so a restarted server is waited for instead of stopping the run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
from collections.abc import Mapping
from typing import Any, ClassVar

import aiohttp

from tunix_agentic.envs.base import Action, Environment, StepResult, register_env
from tunix_agentic.envs.tools import ToolCall, ToolUnavailable

# The variable serve-engine and serve-env read their key from; the client reads it too.
API_KEY_ENV = "TUNIX_AGENTIC_API_KEY"
_CLOSE_TIMEOUT_S = 5.0
_HEALTH_TIMEOUT_S = 5.0


class RemoteEnvError(RuntimeError):
    """A remote environment call failed: the server is unreachable, timed out, refused the
    request, or its environment raised. ``status`` is the HTTP status (None: no answer)."""

    def __init__(self, message: str, *, status: int | None = None):
        super().__init__(message)
        self.status = status


# ------------------------------------------------------------------------- wire format
def _json_value(value: Any, where: str) -> Any:
    """``value`` as plain JSON (mappings to objects, tuples to arrays); ValueError naming
    ``where`` for anything JSON cannot carry."""
    if value is None or isinstance(value, bool | str | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where} is {value}, which JSON cannot carry")
        return value
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"{where} has a non-string key {key!r}; JSON keys are strings")
            out[key] = _json_value(item, f"{where}[{key!r}]")
        return out
    if isinstance(value, list | tuple):
        return [_json_value(item, f"{where}[{i}]") for i, item in enumerate(value)]
    raise ValueError(
        f"{where} holds a {type(value).__name__}, which is not JSON (use str, numbers, bools, "
        "None, lists and string-keyed mappings)"
    )


def type_name(cls: type) -> str:
    """``"module:QualName"``: how a task's class is named on the wire."""
    return f"{cls.__module__}:{cls.__qualname__}"


def task_to_json(task: Any) -> dict[str, Any]:
    """A task (a dataclass instance, e.g. :class:`~tunix_agentic.envs.base.Task`) as
    ``{"type": "module:QualName", "fields": {...}}``.

    Raises ``TypeError`` for a task that is not a dataclass instance, ``ValueError``
    naming the field whose value JSON cannot carry, or for a class defined inside a
    function (the server could not find it). Tuples arrive as lists.
    """
    if not dataclasses.is_dataclass(task) or isinstance(task, type):
        raise TypeError(
            f"a remote environment's task must be a dataclass instance (such as "
            f"tunix_agentic.envs.base.Task), got {type(task).__name__}"
        )
    cls = type(task)
    if "<locals>" in cls.__qualname__:
        raise ValueError(
            f"task class {cls.__qualname__} is defined inside a function; the env server "
            "can only rebuild classes defined at a module's top level"
        )
    fields = {
        f.name: _json_value(getattr(task, f.name), f"task field {f.name!r}")
        for f in dataclasses.fields(task)
        if f.init
    }
    return {"type": type_name(cls), "fields": fields}


def task_from_json(body: Any, allowed: Mapping[str, type]) -> Any:
    """The task :func:`task_to_json` wrote, rebuilt as an instance of one of the ``allowed``
    classes (by wire name). ValueError saying what is wrong otherwise."""
    if not isinstance(body, Mapping):
        raise ValueError("task must be an object with 'type' and 'fields'")
    name, fields = body.get("type"), body.get("fields")
    if not isinstance(name, str) or not isinstance(fields, Mapping):
        raise ValueError("task must be an object with a string 'type' and an object 'fields'")
    cls = allowed.get(name)
    if cls is None:
        raise ValueError(
            f"task type {name!r} is not accepted by this server (accepted: "
            f"{', '.join(sorted(allowed)) or 'none'}; a dataclass of the environment's module "
            "or of a module imported with --import)"
        )
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(fields) - names)
    if unknown:
        raise ValueError(f"task type {name!r} has no field(s) {', '.join(unknown)}")
    try:
        return cls(**fields)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"cannot build a {name} from these fields: {exc}") from None


def action_to_json(action: Action) -> dict[str, Any]:
    """An :class:`Action` as JSON; ValueError if a tool call's arguments are not JSON."""
    return {
        "text": action.text,
        "tool_calls": [
            {"name": c.name, "arguments": _json_value(c.arguments, f"arguments of {c.name!r}")}
            for c in action.tool_calls
        ],
        "answer": action.answer,
        "parse_errors": list(action.parse_errors),
    }


def action_from_json(body: Any) -> Action:
    """The :class:`Action` :func:`action_to_json` wrote; ValueError naming a bad field."""
    if not isinstance(body, Mapping):
        raise ValueError("action must be a JSON object")
    text, answer = body.get("text", ""), body.get("answer")
    calls, errors = body.get("tool_calls", []), body.get("parse_errors", [])
    if not isinstance(text, str):
        raise ValueError("action 'text' must be a string")
    if answer is not None and not isinstance(answer, str):
        raise ValueError("action 'answer' must be a string or null")
    if not isinstance(errors, list) or not all(isinstance(e, str) for e in errors):
        raise ValueError("action 'parse_errors' must be a list of strings")
    if not isinstance(calls, list):
        raise ValueError("action 'tool_calls' must be a list")
    tool_calls = []
    for i, call in enumerate(calls):
        if not isinstance(call, Mapping) or not isinstance(call.get("name"), str):
            raise ValueError(f"action 'tool_calls[{i}]' needs a string 'name'")
        arguments = call.get("arguments", {})
        if not isinstance(arguments, dict):
            raise ValueError(f"action 'tool_calls[{i}].arguments' must be an object")
        tool_calls.append(ToolCall(name=call["name"], arguments=arguments))
    return Action(
        text=text, tool_calls=tuple(tool_calls), answer=answer, parse_errors=tuple(errors)
    )


def step_result_to_json(result: StepResult) -> dict[str, Any]:
    """A :class:`StepResult` as JSON; ``info`` values JSON cannot carry become their text."""
    return {
        "observation": result.observation,
        "reward": float(result.reward),
        "done": bool(result.done),
        # Diagnostics only: round-trip through JSON with str() for anything exotic.
        "info": json.loads(json.dumps(result.info, default=str)),
        "messages": None
        if result.messages is None
        else json.loads(json.dumps(result.messages, default=str)),
    }


def step_result_from_json(body: Any) -> StepResult:
    """The :class:`StepResult` :func:`step_result_to_json` wrote; ValueError if malformed."""
    if not isinstance(body, Mapping):
        raise ValueError("step result must be a JSON object")
    observation, reward, done = body.get("observation"), body.get("reward"), body.get("done")
    info, messages = body.get("info") or {}, body.get("messages")
    if not isinstance(observation, str):
        raise ValueError("step result 'observation' must be a string")
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        raise ValueError("step result 'reward' must be a number")
    if not isinstance(done, bool):
        raise ValueError("step result 'done' must be true or false")
    if not isinstance(info, dict):
        raise ValueError("step result 'info' must be an object")
    if messages is not None and not (
        isinstance(messages, list) and all(isinstance(m, dict) for m in messages)
    ):
        raise ValueError("step result 'messages' must be a list of objects or null")
    return StepResult(observation, float(reward), done, info, messages)


def error_body(data: Any, text: str) -> tuple[str, str | None]:
    """``(message, exception type name)`` from an error answer ``{"error": {...}}``."""
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        err = data["error"]
        kind = err.get("type")
        return str(err.get("message", text[:1000])), kind if isinstance(kind, str) else None
    return text[:1000] or "(empty answer)", None


# ------------------------------------------------------------------------------ client
class RemoteEnv(Environment):
    """An environment served by ``tunix-agentic serve-env`` at ``url``.

    The server-side episode is created at the first :meth:`reset` (with ``env_kwargs``
    for the environment's factory) and deleted by :meth:`close`, which every owner must
    await (the orchestrator does). ``env_name``, when given, must be the environment
    the server serves (checked at creation). ``api_key`` (default:
    ``$TUNIX_AGENTIC_API_KEY`` if set) is sent as ``Authorization: Bearer KEY``.
    Each call may take ``timeout_s`` seconds; connecting, ``connect_timeout_s``.

    :meth:`tool_schemas` returns the remote environment's schemas (known after
    ``reset``); :attr:`tools` stays empty, as the tools run on the server. Every
    failure raises (see the module docstring): the episode is then an infrastructure
    failure, never a reward of 0.
    """

    # Servers (by URL) that answered 404 for an episode of this process since their health
    # was last asked (read by backend_health).
    _lost_episodes: ClassVar[set[str]] = set()

    def __init__(
        self,
        url: str,
        *,
        env_name: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        connect_timeout_s: float = 10.0,
        env_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"url must be an http:// or https:// address, got {url!r}")
        if timeout_s <= 0 or connect_timeout_s <= 0:
            raise ValueError(
                f"timeout_s and connect_timeout_s must be > 0, got {timeout_s}, {connect_timeout_s}"
            )
        self.url = url.rstrip("/")
        self.env_name = env_name
        self.timeout_s = float(timeout_s)
        self.connect_timeout_s = float(connect_timeout_s)
        self.env_kwargs = _json_value(dict(env_kwargs or {}), "env_kwargs")
        key = api_key if api_key is not None else os.environ.get(API_KEY_ENV) or None
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._session: aiohttp.ClientSession | None = None
        self._episode: str | None = None
        self._token: str | None = None  # the episode's X-Episode-Token (serve-env's answer)
        self._schemas: list[dict[str, Any]] = []

    @property
    def episode_id(self) -> str | None:
        """The server's id of this environment's episode (None before the first reset)."""
        return self._episode

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The remote environment's OpenAI function schemas (empty before ``reset``)."""
        return list(self._schemas)

    async def _call(
        self, method: str, path: str, payload: Any = None, *, timeout_s: float | None = None
    ) -> Any:
        """One request; the answer's JSON, or RemoteEnvError / ToolUnavailable."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(headers=self._headers)
        timeout = aiohttp.ClientTimeout(
            total=timeout_s or self.timeout_s, sock_connect=self.connect_timeout_s
        )
        where = f"remote environment {self.url}{path}"
        try:
            headers = {"X-Episode-Token": self._token} if self._token else None
            async with self._session.request(
                method, self.url + path, json=payload, timeout=timeout, headers=headers
            ) as resp:
                text = await resp.text()
                status = resp.status
        except TimeoutError:
            raise RemoteEnvError(f"{where} timed out after {timeout.total:g}s") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise RemoteEnvError(f"{where} is unreachable: {type(exc).__name__}: {exc}") from None
        try:
            data = json.loads(text) if text else None
        except ValueError:
            data = None
        if status != 200:
            message, kind = error_body(data, text)
            if status == 404 and self._episode and path.startswith(f"/envs/{self._episode}/"):
                RemoteEnv._lost_episodes.add(self.url)  # see backend_health
            if kind == ToolUnavailable.__name__:
                raise ToolUnavailable(f"{where}: {message}")
            raise RemoteEnvError(f"{where} answered HTTP {status}: {message}", status=status)
        return data

    async def backend_health(self) -> bool:
        """Whether the server is up: ``GET /health`` answers 200 with ``"status": "ok"``
        within ``connect_timeout_s`` (connecting) and ``_HEALTH_TIMEOUT_S``. Never raises;
        needs no episode (the orchestrator asks it after a failure, to wait out a restart).

        Also False, once, after the server answered 404 for an episode this process
        created there: it lost the episode, so it restarted (or reaped it as idle) even if
        nothing saw it down; the orchestrator then counts the failures of episodes begun
        before as that restart's, not the run's."""
        if self.url in RemoteEnv._lost_episodes:
            RemoteEnv._lost_episodes.discard(self.url)
            return False
        timeout = aiohttp.ClientTimeout(
            total=min(self.timeout_s, _HEALTH_TIMEOUT_S), sock_connect=self.connect_timeout_s
        )
        try:
            async with (
                aiohttp.ClientSession(headers=self._headers) as session,
                session.get(self.url + "/health", timeout=timeout) as resp,
            ):
                if resp.status != 200:
                    return False
                data = await resp.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
            return False
        return isinstance(data, dict) and data.get("status") == "ok"

    async def reset(self, task: Any) -> str:
        """Creates the server-side episode if need be, and resets it on ``task``
        (serialised with :func:`task_to_json`: TypeError/ValueError if it cannot be)."""
        wire_task = task_to_json(task)
        if self._episode is None:
            body = {"env": self.env_name, "kwargs": self.env_kwargs}
            data = await self._call("POST", "/envs", body)
            if not isinstance(data, dict) or not isinstance(data.get("episode_id"), str):
                raise RemoteEnvError(f"{self.url}/envs answered without an episode_id: {data!r}")
            self._episode = data["episode_id"]
            token = data.get("episode_token")
            self._token = token if isinstance(token, str) else None
        data = await self._call("POST", f"/envs/{self._episode}/reset", {"task": wire_task})
        if not isinstance(data, dict) or not isinstance(data.get("observation"), str):
            raise RemoteEnvError(f"{self.url}: reset answered without an observation: {data!r}")
        schemas = data.get("tools") or []
        self._schemas = [s for s in schemas if isinstance(s, dict)]
        self.step_rewards = []
        return data["observation"]

    def _path(self, verb: str) -> str:
        if self._episode is None:
            raise RuntimeError(f"{verb}() called before reset()")
        return f"/envs/{self._episode}/{verb}"

    async def step(self, action: Action) -> StepResult:
        """Sends ``action`` to the server's episode and returns its result."""
        data = await self._call("POST", self._path("step"), {"action": action_to_json(action)})
        try:
            result = step_result_from_json(data)
        except ValueError as exc:
            raise RemoteEnvError(f"{self.url}: malformed step result: {exc}") from None
        self.step_rewards.append(result.reward)
        return result

    async def evaluate(self) -> float:
        """The remote environment's final reward."""
        data = await self._call("POST", self._path("evaluate"))
        reward = data.get("reward") if isinstance(data, dict) else None
        if isinstance(reward, bool) or not isinstance(reward, int | float):
            raise RemoteEnvError(f"{self.url}: evaluate answered without a reward: {data!r}")
        return float(reward)

    async def close(self) -> None:
        """Deletes the server-side episode (best effort: a dead server or an episode
        already reaped is not an error) and closes the HTTP session. Idempotent."""
        episode, self._episode = self._episode, None
        try:
            if episode is not None:
                try:
                    await self._call("DELETE", f"/envs/{episode}", timeout_s=_CLOSE_TIMEOUT_S)
                except (RemoteEnvError, ToolUnavailable):
                    pass  # the server is gone or reaped it already: nothing left to free
        finally:
            self._token = None
            session, self._session = self._session, None
            if session is not None:
                await asyncio.shield(session.close())


@register_env("remote")
def remote_env(
    *,
    url: str,
    env: str | None = None,
    api_key: str | None = None,
    timeout_s: float = 120.0,
    env_kwargs: Mapping[str, Any] | None = None,
) -> RemoteEnv:
    """``make_env("remote", url=..., env=NAME, ...)``: a :class:`RemoteEnv` for the server
    at ``url`` serving ``env``; ``env_kwargs`` go to that environment's factory on the
    server (e.g. ``{"tool_timeout": 5.0}``: the run's ``env.tool_timeout_s`` is not
    forwarded, as the remote environment may not take it)."""
    return RemoteEnv(url, env_name=env, api_key=api_key, timeout_s=timeout_s, env_kwargs=env_kwargs)
