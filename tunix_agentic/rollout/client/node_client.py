"""An asyncio client of one rollout node (``tunix-agentic serve-rollout``).

Errors are typed so that a caller over several nodes can tell them apart:
:class:`NodeUnavailable` (the node did not answer: connection refused or reset, a
timeout, a 5xx: fail over to another node), :class:`GroupConflict` (409: the id was
submitted with another body), :class:`GroupNotFound` (404 on a group id) and
``ValueError`` (any other 4xx: the request is wrong, retrying will not help).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp

from tunix_agentic.rollout.episode import Group
from tunix_agentic.rollout.service.admin import admin_key_for
from tunix_agentic.rollout.wire import FINAL_STATUSES, GroupRequest, group_from_json

__all__ = ["GroupConflict", "GroupNotFound", "NodeClient", "NodeUnavailable"]

# A long poll's own wait plus this is the HTTP timeout of that request.
_POLL_SLACK_S = 15.0


class NodeUnavailable(ConnectionError):
    """The node did not answer (unreachable, timed out, or a 5xx): try another node."""


class GroupConflict(ValueError):
    """409: this group id was submitted before with another body."""


class GroupNotFound(LookupError):
    """404: the node knows no group of this id."""


def _message(data: Any, text: str) -> str:
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        return str(data["error"].get("message", text))
    return text[:500]


class NodeClient:
    """Talks to the node at ``url`` (``http://host:port``).

    The admin key is sent as ``Authorization: Bearer KEY`` where one is known:
    ``admin_key``, else ``$TUNIX_AGENTIC_ADMIN_KEY``, else, for a node on this machine, the
    token it left for its own user (read at each call: a restarted node makes a new one;
    see :mod:`~tunix_agentic.rollout.service.admin`). It makes this client the node's
    operator: it may submit ``external`` / ``own_tasks`` groups and read every group, and
    it opens the operator routes (engines, policy, cancelling a group). Without one,
    ``api_key`` is sent; such a client reads the groups it submitted. ``session``: an
    ``aiohttp.ClientSession`` to share (not closed here); without one the client makes
    its own on first use and :meth:`close` closes it. ``request_timeout_s`` bounds every
    call but long polls, which get their ``wait_s`` on top.
    """

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        session: aiohttp.ClientSession | None = None,
        *,
        request_timeout_s: float = 30.0,
        admin_key: str | None = None,
    ):
        self.url = url.rstrip("/")
        self._admin_key = admin_key
        self.request_timeout_s = request_timeout_s
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._session = session
        self._owns_session = session is None

    def __repr__(self) -> str:
        return f"NodeClient({self.url!r})"

    async def close(self) -> None:
        if self._owns_session and self._session is not None:
            await self._session.close()
        self._session = None

    async def __aenter__(self) -> NodeClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
            self._owns_session = True
        return self._session

    async def _call(
        self,
        method: str,
        path: str,
        payload: Any = None,
        *,
        params: dict[str, Any] | None = None,
        timeout_s: float | None = None,
        ok: tuple[int, ...] = (200,),
    ) -> Any:
        """One call: the JSON answer, or the typed error of the status (on an operator
        route without an admin key, the node's 403 says how to get one)."""
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.request_timeout_s)
        key = admin_key_for(self.url, self._admin_key)
        # None known: the API key, which reads this client's own groups.
        headers = {"Authorization": f"Bearer {key}"} if key else self._headers
        try:
            async with self._client().request(
                method,
                self.url + path,
                json=payload,
                params=params,
                headers=headers,
                timeout=timeout,
            ) as resp:
                status, text = resp.status, await resp.text()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise NodeUnavailable(f"{self.url}{path}: {type(exc).__name__}: {exc}") from exc
        try:
            data = json.loads(text) if text else None
        except ValueError:
            data = None
        if status in ok:
            return data
        message = f"{self.url}{path}: HTTP {status}: {_message(data, text)}"
        if status >= 500:
            raise NodeUnavailable(message)
        if status == 409:
            raise GroupConflict(message)
        if status == 404 and path.startswith("/v1/groups/"):
            raise GroupNotFound(message)
        raise ValueError(message)

    # --------------------------------------------------------------- groups
    async def submit(self, req: GroupRequest) -> str:
        """``POST /v1/groups``: the group's status now (``queued``, ``running``, or final
        when the id was already done). Same id and body again: the same answer."""
        data = await self._call("POST", "/v1/groups", req.to_json(), ok=(200, 202))
        return str(data["status"])

    async def get(
        self, group_id: str, wait_s: float = 0.0, *, members: bool = True
    ) -> dict[str, Any]:
        """``GET /v1/groups/{id}?wait_s=N``: ``{group_id, status, members?, group?, error?}``,
        answered once the group is final or ``wait_s`` passed. ``members=False``: without
        the learner's view (half the bytes; :func:`group_of` needs only ``group``)."""
        params = {"wait_s": f"{wait_s:g}"} if wait_s > 0 else {}
        if not members:
            params["members"] = "false"
        return await self._call(
            "GET",
            f"/v1/groups/{group_id}",
            params=params or None,
            timeout_s=wait_s + self.request_timeout_s + _POLL_SLACK_S,
        )

    async def wait(self, group_id: str, timeout: float | None = None, *, poll_s: float = 30.0):
        """Long-poll until the group is final: its :class:`Group` when ``done``, else the
        final status (``cancelled``, ``failed``, ``lost``). ``TimeoutError`` after
        ``timeout`` seconds (None: no limit)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = poll_s if deadline is None else min(poll_s, deadline - time.monotonic())
            if left <= 0:
                raise TimeoutError(f"group {group_id!r} not final after {timeout}s")
            data = await self.get(group_id, wait_s=left, members=False)
            if data["status"] in FINAL_STATUSES:
                if data["status"] == "done":
                    return group_from_json(data["group"])
                return str(data["status"])

    async def cancel(self, group_id: str) -> str:
        """``DELETE /v1/groups/{id}`` (idempotent): the group's status after it."""
        data = await self._call("DELETE", f"/v1/groups/{group_id}")
        return str(data["status"])

    async def done_since(self, cursor: int = 0, limit: int | None = None) -> dict[str, Any]:
        """``GET /v1/groups?done_since=CURSOR``: ``{groups: [{group_id, status, cursor}],
        cursor}``, finished groups in completion order after ``cursor``; pass the answer's
        ``cursor`` next time."""
        params = {"done_since": str(cursor)}
        if limit is not None:
            params["limit"] = str(limit)
        return await self._call("GET", "/v1/groups", params=params)

    # ------------------------------------------------------------- the node
    async def set_policy(self, version: int, weights_path: str | None = None) -> int:
        """``POST /v1/policy {version, weights_path}``: the node's policy version after it.
        ``weights_path``: where the engines loaded it from (the node pushes it to an engine
        that restarted), None when not known."""
        body: dict[str, Any] = {"version": version}
        if weights_path is not None:
            body["weights_path"] = weights_path
        data = await self._call("POST", "/v1/policy", body)
        return int(data["version"])

    async def status(self) -> dict[str, Any]:
        """``GET /v1/status``: stages, engines, totals by status, groups in flight."""
        return await self._call("GET", "/v1/status")

    async def add_engine(self, url: str, api: str = "sglang") -> dict[str, Any]:
        """``POST /v1/engines``: the node samples from the engine at ``url`` too, which
        speaks ``api`` (``sglang``: SGLang's native API, ours too; ``vllm``)."""
        body = {"url": url} if api == "sglang" else {"url": url, "api": api}
        return await self._call("POST", "/v1/engines", body)

    async def remove_engine(self, url: str) -> dict[str, Any]:
        return await self._call("DELETE", "/v1/engines", {"url": url})

    async def health(self, timeout_s: float = 5.0) -> bool:
        """``GET /health``: whether the node answers healthy (never raises)."""
        try:
            data = await self._call("GET", "/health", timeout_s=timeout_s)
        except (NodeUnavailable, ValueError, LookupError):
            return False
        except asyncio.CancelledError:
            raise
        return bool(isinstance(data, dict) and data.get("ok"))


def group_of(answer: dict[str, Any]) -> Group | None:
    """The :class:`Group` of a ``GET /v1/groups/{id}`` answer once ``done``, else None."""
    return group_from_json(answer["group"]) if answer.get("status") == "done" else None
