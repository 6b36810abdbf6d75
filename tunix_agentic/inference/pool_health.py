"""Which of an engine pool's backends are in rotation, and bringing them back.

A backend that fails ``failures_to_eject`` times in a row, whose weight update fails,
or whose health probe fails is taken out of rotation (ejected). A background task
probes the ejected ones every ``interval_s`` and readmits each that answers healthy,
first pushing it the latest weights and waiting for them to be applied, so no backend
ever returns with old weights. Used by :class:`~tunix_agentic.inference.pool.EnginePool`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from tunix_agentic.inference.base import WeightUpdate
from tunix_agentic.inference.routing import Backend

logger = logging.getLogger("tunix_agentic.inference.pool")

# A health probe that hangs longer than this counts as a failed probe.
_PROBE_TIMEOUT_S = 5.0
# A recovering backend that does not apply the latest weights within this stays out.
_READMIT_WEIGHTS_TIMEOUT_S = 120.0


class BackendHealth:
    """Rotation of ``backends``: failures counted, ejections, probes and readmission.

    ``count(name)`` counts ``pool/ejections`` and ``pool/recoveries``. ``latest``: the
    weights last pushed to the pool and their version (None until a push), given to a
    backend before it is readmitted.
    """

    def __init__(
        self,
        backends: list[Backend],
        *,
        failures_to_eject: int,
        interval_s: float,
        count: Callable[[str], None],
    ):
        self.backends = backends
        self.failures_to_eject = failures_to_eject
        self.interval_s = interval_s
        self._count = count
        self.latest: tuple[Any, int] | None = None
        self._task: asyncio.Task | None = None

    def record_failure(self, b: Backend, error: BaseException) -> None:
        """One more failure in a row of ``b``; ejected at ``failures_to_eject``."""
        b.failures += 1
        logger.warning("backend %s failed (%d in a row): %r", b.name, b.failures, error)
        if b.failures >= self.failures_to_eject:
            self.eject(b, f"{b.failures} consecutive failures")

    def eject(self, b: Backend, reason: str) -> None:
        if not b.healthy:
            return
        b.healthy = False
        self._count("pool/ejections")
        logger.warning("backend %s taken out of rotation: %s", b.name, reason)

    async def readmit(self, b: Backend) -> None:
        """Put ``b`` back in rotation, first bringing its weights up to date (applied)."""
        if b.healthy:
            return
        if self.latest is not None and b.weights_version != self.latest[1]:
            params, version = self.latest
            try:
                async with asyncio.timeout(_READMIT_WEIGHTS_TIMEOUT_S):
                    await WeightUpdate.of(b.engine.update_weights(params, version), version)
            except Exception as exc:
                logger.warning("backend %s answers but could not take weights: %r", b.name, exc)
                return
            b.applied(version)
            if b.weights_version != self.latest[1]:
                return  # newer weights came meanwhile: the next probe brings those
        b.healthy = True
        b.failures = 0
        self._count("pool/recoveries")
        logger.info("backend %s back in rotation", b.name)

    async def probe(self, b: Backend) -> bool:
        """Ask one backend whether it can serve; any error or hang means no."""
        try:
            async with asyncio.timeout(_PROBE_TIMEOUT_S):
                return bool(await b.engine.check_health())
        except Exception as e:
            logger.debug("health probe of %s failed: %r", b.name, e)
            return False

    async def probe_and_update(self, backends: list[Backend]) -> None:
        """Probe ``backends``: readmit those that answer, eject those that do not."""
        results = await asyncio.gather(*(self.probe(b) for b in backends))
        await asyncio.gather(
            *(self.readmit(b) for b, ok in zip(backends, results, strict=True) if ok)
        )
        for b, ok in zip(backends, results, strict=True):
            if not ok:
                self.eject(b, "health probe failed")

    def ensure_watching(self) -> None:
        """Start the recovery task on the running loop unless it already runs there."""
        loop = asyncio.get_running_loop()
        task = self._task
        if task is None or task.done() or task.get_loop() is not loop:
            self._task = loop.create_task(self._watch(), name="engine-pool-health")

    async def stop(self) -> None:
        """Stop the recovery task (if it runs on this loop)."""
        task, self._task = self._task, None
        if task is not None and not task.done() and task.get_loop() is asyncio.get_running_loop():
            task.cancel()
            await asyncio.wait({task})

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            down = [b for b in self.backends if not b.healthy]
            if not down:
                continue
            try:
                await self.probe_and_update(down)
            except Exception:
                logger.exception("engine pool health check failed")
