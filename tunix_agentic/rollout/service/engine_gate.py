"""A rollout node's guard on one engine's weights: an engine that failed is used again
only once it holds the published policy version.

An engine server SIGKILLed and started again on its port answers ``/health`` at once,
with the weights it was started with (random ones, version 0). The node's
:class:`~tunix_agentic.inference.pool.EnginePool` takes a backend back on its health
probe alone; :class:`EngineGate` stands between them: after a failed request (refused
connection, 5xx, timeout), or a reply sampled by weights more than one version behind
the published one, the engine is *distrusted*: its requests fail at once (the pool takes
it out of rotation), and its health probe succeeds only once it holds the published
weights. The node pushes them itself when the trainer named them with the version
(``POST /v1/policy {"version", "weights_path"}``: the directory the trainer's own client
had the engines load, ``rollout.service.weights_dir``); otherwise it waits until the
engine reports the published version (the trainer's pool pushes it when it notices).
A node no trainer published a version to (``published()`` None: an operator's node over
``serve-engine --params RUN``) has no version to hold its engines to: it serves what they
hold, and an engine that failed is used again once it answers. Nothing here imports JAX.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from tunix_agentic.inference.base import EngineError, TokenCallback, TokenOutput
from tunix_agentic.inference.params import SamplingParams

logger = logging.getLogger(__name__)

# A reply whose newest token is this many versions or more behind the version published
# when the request was sent comes from an engine that lost its weights (one version
# behind is an engine still loading the newest, which the trainer announces once any
# engine applied it).
STALE_AFTER = 2


class EngineGate:
    """One engine client (an ``SGLangEngine``) as the node's pool sees it: everything is
    the client's but ``generate`` and ``check_health`` (see the module docstring).
    ``published()``: the version a trainer published to the node (None before any);
    ``weights()``: ``(version, path)`` of the published weights on a filesystem the engine
    reads, or None when not known."""

    def __init__(
        self,
        client: Any,
        published: Callable[[], int | None],
        weights: Callable[[], tuple[int, str] | None],
    ):
        self.client = client
        self._published = published
        self._weights = weights
        self.distrusted: str | None = None  # why, while it is not used

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams = SamplingParams(),
        *,
        session_id: str | None = None,
        request_id: str | None = None,
        on_tokens: TokenCallback | None = None,
    ) -> TokenOutput:
        if self.distrusted is not None:
            published = self._published()
            until = (
                "it answers again"
                if published is None
                else f"it holds the published weights v{published}"
            )
            raise EngineError(f"{self.client.name}: not used until {until} ({self.distrusted})")
        sent_under = self._published()
        try:
            stream = {} if on_tokens is None else {"on_tokens": on_tokens}
            out = await self.client.generate(
                prompt_ids, sampling, session_id=session_id, request_id=request_id, **stream
            )
        except EngineError as exc:
            self._distrust(f"a request failed: {exc}")
            raise
        if sent_under is None:  # no trainer: whatever the engine holds is the policy
            return out
        held = max(out.versions, default=sent_under)
        if held <= sent_under - STALE_AFTER:
            self._distrust(f"it answered with weights v{held}")
            raise EngineError(
                f"{self.client.name} answered with weights v{held}, published v{sent_under}: "
                "its reply is dropped and it is not used until it holds the published weights"
            )
        return out

    def _distrust(self, why: str) -> None:
        if self.distrusted is None:
            logger.warning("engine %s: %s; used again once it holds the weights", self.name, why)
        self.distrusted = why

    async def check_health(self) -> bool:
        """The server answers and, if distrusted, now holds the published weights (pushed
        here when known)."""
        if not await self.client.check_health():
            return False
        if self.distrusted is None:
            return True
        return await self._sync()

    async def _sync(self) -> bool:
        published, weights = self._published(), self._weights()
        if published is None:  # no version to wait for: it answers, so it is used again
            self.distrusted = None
            return True
        try:
            if weights is not None and weights[0] == published:
                await self.client.update_weights_from_disk(weights[1], published)
                logger.warning(
                    "engine %s: loaded the published weights v%d from %s",
                    self.name,
                    published,
                    weights[1],
                )
            else:
                held = _version((await self.client.model_info()).get("weight_version"))
                if held < published:
                    return False  # the trainer's pool brings it up to date
        except (EngineError, ValueError) as exc:
            logger.warning("engine %s answers but cannot take the weights yet: %s", self.name, exc)
            return False
        self.distrusted = None
        return True


def _version(raw: Any) -> int:
    try:
        return int(raw)
    except (TypeError, ValueError):
        return -1
