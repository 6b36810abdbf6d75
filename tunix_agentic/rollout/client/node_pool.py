"""The rollout nodes a trainer's runner uses: which are up, and where a group goes.

A group goes to the node that is up with the fewest members in flight (ProRL's
min-heap, on this trainer's live counts). A node that stops answering is taken out;
its ``/health`` is asked every ``rollout.service.health_every_s`` until it answers, then
it is greeted again (a restarted node knows neither the engines nor the version) and
taken back. With no node up for ``rollout.backend_wait_s``, placing a group raises
:class:`~tunix_agentic.rollout.group.InfraFailureError`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from tunix_agentic.rollout.client.node_client import NodeClient, NodeUnavailable
from tunix_agentic.rollout.group import InfraFailureError

_log = logging.getLogger(__name__)


@dataclasses.dataclass
class NodeState:
    """One rollout node as the runner sees it: up or taken out, members it runs for us."""

    url: str
    client: NodeClient
    up: bool = True
    in_flight: int = 0  # members of groups placed here and not yet answered
    groups_done: int = 0
    taken_out: int = 0  # times it stopped answering


class NodePool:
    """The nodes at ``urls`` (their ``api_key``), over one HTTP session opened on first use.

    ``greet(node)`` tells a node taken back what it must know (raising
    :class:`~tunix_agentic.rollout.client.node_client.NodeUnavailable` if it does not
    answer); ``note(what)`` counts a fault (``nodes_taken_out``, ``nodes_taken_back``).
    """

    def __init__(
        self,
        urls: list[str],
        *,
        api_key: str | None,
        wait_s: float,
        health_every_s: float,
        greet: Callable[[NodeState], Awaitable[None]],
        note: Callable[[str], None],
    ):
        if not urls:
            raise ValueError("ServiceEpisodeRunner needs at least one node URL")
        self.urls, self.api_key = urls, api_key
        self.wait_s, self.health_every_s = wait_s, health_every_s
        self._greet, self._note = greet, note
        self.nodes: list[NodeState] = []
        self.session: aiohttp.ClientSession | None = None
        self.closed = False
        self._up_changed = asyncio.Event()
        self._watches: dict[str, asyncio.Task] = {}

    def open(self) -> None:
        """Open the HTTP session and a client per node (once; needs a running loop)."""
        if self.session is None:
            self.session = aiohttp.ClientSession()
            self.nodes = [
                NodeState(url, NodeClient(url, api_key=self.api_key, session=self.session))
                for url in self.urls
            ]

    async def stop_watching(self) -> None:
        """No node is taken back from here on (the runner is closing)."""
        self.closed = True
        watches = list(self._watches.values())
        for t in watches:
            t.cancel()
        await asyncio.gather(*watches, return_exceptions=True)
        self._watches.clear()

    async def close_session(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None

    async def place(self) -> NodeState:
        """The node that is up with the fewest members in flight; waits (up to
        ``wait_s``) while none is up, then raises InfraFailureError."""
        self.open()
        deadline = time.monotonic() + self.wait_s
        while True:
            up = [node for node in self.nodes if node.up]
            if up:
                return min(up, key=lambda node: node.in_flight)
            left = deadline - time.monotonic()
            if left <= 0:
                raise InfraFailureError(
                    f"no rollout node answered for {self.wait_s}s "
                    f"(rollout.backend_wait_s): {', '.join(self.urls)}"
                )
            self._up_changed.clear()
            try:
                async with asyncio.timeout(left):
                    await self._up_changed.wait()
            except TimeoutError:
                pass

    def take_out(self, node: NodeState, why: Exception) -> None:
        """``node`` stopped answering: no new groups go there until its /health answers."""
        if not node.up or self.closed:
            return
        node.up = False
        node.taken_out += 1
        _log.warning("rollout node %s taken out: %s", node.url, why)
        self._note("nodes_taken_out")
        self._watches[node.url] = asyncio.get_running_loop().create_task(self._watch(node))

    async def _watch(self, node: NodeState) -> None:
        """Ask a node taken out for /health until it answers, then greet it again and
        take it back."""
        while True:
            await asyncio.sleep(self.health_every_s)
            if not await node.client.health():
                continue
            try:
                await self._greet(node)
            except NodeUnavailable:
                continue
            break
        node.up = True
        self._watches.pop(node.url, None)
        _log.warning("rollout node %s taken back", node.url)
        self._note("nodes_taken_back")
        self._up_changed.set()

    def status(self) -> list[dict[str, Any]]:
        """Each node: url, up, members in flight, groups done, times taken out."""
        self.open()
        return [
            {
                "url": n.url,
                "up": n.up,
                "in_flight": n.in_flight,
                "groups_done": n.groups_done,
                "taken_out": n.taken_out,
            }
            for n in self.nodes
        ]
