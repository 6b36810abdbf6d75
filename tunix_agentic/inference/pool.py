"""An engine pool: one :class:`InferenceEngine` over several backends.

Backends are anything with the engine interface (:class:`InferenceEngine`):
in-process ``JaxEngine``s or HTTP ``SGLangEngine`` clients. The pool adds three things:

* **Least-loaded routing by live load.** Each request goes to the healthy
  backend with the fewest requests in flight *right now*. The counts sit in a
  min-heap keyed by ``(in_flight, stamp)`` and go down again when a request
  ends, however it ends (result, error, timeout or cancellation). Several peer
  frameworks keep a heap whose counts only ever increment, which degrades to
  round-robin and piles new work onto a backend stuck with long requests.
* **Session stickiness.** Requests that carry ``session_id`` go back to the
  backend that served that session before, while it is healthy, so its
  prefix/KV cache is reused across an episode's turns.
* **Failover and recovery.** An infrastructure failure (``EngineError``,
  ``ConnectionError``, ``OSError``, a timeout) is retried on another backend;
  ``failures_to_eject`` consecutive failures take a backend out of rotation,
  and a background task probes ejected backends and puts them back once they
  answer healthy (pushing the latest weights first if they missed an update).
  A ``ValueError`` is the caller's fault: it propagates at once, no retry.

All state lives on one asyncio event loop; nothing here blocks it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from tunix_agentic.inference.base import (
    EngineError,
    InferenceEngine,
    ServerClient,
    StreamedCount,
    TokenCallback,
    TokenOutput,
    WeightUpdate,
    summed_counters,
)
from tunix_agentic.inference.params import SamplingParams
from tunix_agentic.inference.pool_health import BackendHealth
from tunix_agentic.inference.routing import Backend, Router
from tunix_agentic.metrics.sink import NULL_METRICS, MetricsSink

logger = logging.getLogger(__name__)

# What counts as the backend's fault: retried elsewhere and counted against it.
# (asyncio.TimeoutError is TimeoutError, itself an OSError; listed for the reader.)
FAILOVER_ERRORS: tuple[type[BaseException], ...] = (
    EngineError,
    ConnectionError,
    TimeoutError,
    OSError,
)
_CLOSE_SETTLE_S = 5.0


class EnginePool:
    """Route requests over several engines: least live load, sticky sessions, failover.

    Args:
      backends: the engines to route over (the pool probes them with
        ``check_health`` and closes them with ``close``).
      names: one display name per backend (default ``backend-{i}``).
      max_attempts: backends tried per request, the first included.
      failures_to_eject: consecutive failures after which a backend gets no traffic.
      health_interval_s: how often ejected backends are probed for recovery.
      request_timeout_s: per-attempt limit on one backend; ``None`` for none.
      metrics: an optional ``MetricsRecorder`` (counts ``pool/requests``,
        ``pool/failovers``, ``pool/ejections``, ``pool/recoveries``; gauge
        ``pool/in_flight``).
      max_sessions: session pins kept; the least recently used are forgotten.
      close_backends: whether :meth:`close` also closes the backends (the
        pool owns them by default; pass False for engines shared elsewhere).

    Routing is always on the pool's own live count per backend: requests it
    sent there that are still awaiting. A session's pin wins over load while
    its backend is in rotation, since a cache hit saves a whole prefill.
    """

    def __init__(
        self,
        backends: Sequence[InferenceEngine],
        *,
        names: Sequence[str] | None = None,
        max_attempts: int = 3,
        failures_to_eject: int = 2,
        health_interval_s: float = 2.0,
        request_timeout_s: float | None = None,
        metrics: MetricsSink | None = None,
        max_sessions: int = 100_000,
        close_backends: bool = True,
    ):
        backends = list(backends)
        if not backends:
            raise ValueError("pool.backends must hold at least one engine")
        if names is None:
            names = [f"backend-{i}" for i in range(len(backends))]
        names = [str(n) for n in names]
        if len(names) != len(backends):
            raise ValueError(f"pool.names has {len(names)} entries for {len(backends)} backends")
        if len(set(names)) != len(names):
            raise ValueError(f"pool.names must be unique, got {names}")
        if max_attempts < 1:
            raise ValueError(f"pool.max_attempts must be >= 1, got {max_attempts}")
        if failures_to_eject < 1:
            raise ValueError(f"pool.failures_to_eject must be >= 1, got {failures_to_eject}")
        if not health_interval_s > 0:
            raise ValueError(f"pool.health_interval_s must be > 0, got {health_interval_s}")
        if request_timeout_s is not None and not request_timeout_s > 0:
            raise ValueError(f"pool.request_timeout_s must be > 0 or None, got {request_timeout_s}")
        if max_sessions < 1:
            raise ValueError(f"pool.max_sessions must be >= 1, got {max_sessions}")
        self.max_attempts = max_attempts
        self.failures_to_eject = failures_to_eject
        self.health_interval_s = float(health_interval_s)
        self.request_timeout_s = request_timeout_s
        self.max_sessions = max_sessions
        self.close_backends = close_backends
        self._metrics = NULL_METRICS if metrics is None else metrics

        # Assume the backends start in step; the version is known if they agree on one.
        versions = {b.version for b in backends}
        self.version: int | None = versions.pop() if len(versions) == 1 else None
        self._backends = [
            Backend(i, name, engine, weights_version=self.version)
            for i, (name, engine) in enumerate(zip(names, backends, strict=True))
        ]
        self._router = Router(self._backends, max_sessions)
        # Ejections and readmission (with the latest weights, for backends that missed them).
        self._health = BackendHealth(
            self._backends,
            failures_to_eject=failures_to_eject,
            interval_s=self.health_interval_s,
            count=self._count,
        )
        self._background: set[asyncio.Task] = set()  # weight updates being settled
        self._closed = False

    # ------------------------------------------------------------- public API
    @property
    def backends(self) -> list[InferenceEngine]:
        """The backend engines, in order."""
        return [b.engine for b in self._backends]

    def repoint(self, old: str, new: str) -> bool:
        """A backend served at URL ``old`` (an HTTP client's ``base_url``) is now at ``new``:
        point its client there and take it out of rotation until a health probe readmits
        it with the pool's latest weights (a restarted server comes back at its initial
        ones). False when no backend is at ``old``."""
        moved = False
        for b in self._backends:
            client = b.engine
            if not (isinstance(client, ServerClient) and client.base_url == old.rstrip("/")):
                continue
            client.move_to(new)
            b.weights_version = None  # unknown: readmission brings the latest
            self._health.eject(b, f"moved from {old} to {new}")
            moved = True
        if moved and not self._closed:
            self._health.ensure_watching()
        return moved

    @property
    def in_flight(self) -> int:
        """Requests currently awaiting a backend through this pool."""
        return sum(b.in_flight for b in self._backends)

    @property
    def stats(self) -> dict[str, float]:
        """The backends' counters, summed."""
        return summed_counters(b.engine.stats for b in self._backends)

    def clock(self) -> dict[str, float]:
        """The backends' busy / host-gap / idle seconds, summed (each has its own clock)."""
        return summed_counters(b.engine.clock() for b in self._backends)

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams = SamplingParams(),
        *,
        session_id: str | None = None,
        request_id: str | None = None,
        on_tokens: TokenCallback | None = None,
    ) -> TokenOutput:
        """Generate on the best backend, failing over to others on infrastructure faults
        (not once ``on_tokens`` was given ids: the caller has shown them).

        Raises ``ValueError`` (from the backend) for a bad request, and
        ``EngineError`` when every attempt failed or no healthy backend is left.
        Cancelling the caller cancels the backend request.
        """
        if self._closed:
            raise EngineError("engine pool is closed")
        self._health.ensure_watching()
        self._count("pool/requests")
        tried: set[int] = set()
        streamed = StreamedCount(on_tokens)
        errors: list[str] = []
        last_error: BaseException | None = None
        for attempt in range(self.max_attempts):
            backend = self._router.choose(session_id, tried)
            if backend is None:
                raise EngineError(self._none_left_message(errors)) from last_error
            if attempt > 0:
                self._count("pool/failovers")
            tried.add(backend.index)
            self._add_in_flight(backend, +1)
            try:
                out = await self._call(
                    backend, prompt_ids, sampling, session_id, request_id, streamed.callback
                )
            except ValueError:
                raise  # the request is bad, not the backend
            except FAILOVER_ERRORS as e:
                last_error = e
                errors.append(f"{backend.name}: {type(e).__name__}: {e}")
                self._health.record_failure(backend, e)
                if streamed.given:
                    raise EngineError(
                        f"{backend.name} failed after streaming {streamed.given} tokens "
                        f"(not retried: the caller has them): {e}"
                    ) from e
                continue
            finally:
                self._add_in_flight(backend, -1)  # also on cancellation
            backend.failures = 0
            backend.served += 1
            return out
        raise EngineError(
            f"request failed on all max_attempts={self.max_attempts} attempts ({'; '.join(errors)})"
        ) from last_error

    def update_weights(self, params: Any, version: int) -> WeightUpdate:
        """Hand new weights to every backend in rotation (call on the pool's loop).

        Returns a :class:`WeightUpdate` that resolves as soon as one backend has
        applied them (the new policy is being served), or fails with
        :class:`EngineError` once every backend has failed; the rest settle in the
        background, so a slow or hung backend never holds the learner. A backend's
        version is recorded only when it has applied them; one whose update fails (at
        once or later) is taken out of rotation, and one out of rotation gets no
        update: the health task pushes it the latest weights, and waits for them to be
        applied, before letting it back in, so no backend ever returns with old
        weights. A ``ValueError`` raised before any backend accepted the update
        (params that fit no backend) propagates and nothing changes.
        """
        version = int(version)
        loop = asyncio.get_running_loop()
        # A pool that only publishes (its engines serve others) must still probe a backend
        # it takes out, and bring it back with these weights.
        self._health.ensure_watching()
        handed: list[tuple[Backend, WeightUpdate]] = []
        errors: list[str] = []
        for b in self._backends:
            if not b.healthy:
                continue
            try:
                update = WeightUpdate.of(b.engine.update_weights(params, version), version)
            except ValueError as exc:
                if not handed:
                    raise
                self._weights_failed(b, version, exc, errors)
                continue
            except Exception as exc:
                self._weights_failed(b, version, exc, errors)
                continue
            handed.append((b, update))
        self.version = version
        self._health.latest = (params, version)
        combined = WeightUpdate(version)
        task = loop.create_task(self._settle_weights(version, handed, errors, combined))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return combined

    async def _settle_weights(
        self,
        version: int,
        handed: list[tuple[Backend, WeightUpdate]],
        errors: list[str],
        combined: WeightUpdate,
    ) -> None:
        """Record each backend's outcome of one update as it comes; ``combined`` resolves
        at the first success (or fails when none is left)."""
        applied = 0

        async def outcome(b: Backend, update: WeightUpdate):
            try:
                await update
            except Exception as exc:
                return b, exc
            return b, None

        for done in asyncio.as_completed([outcome(b, u) for b, u in handed]):
            b, error = await done
            if error is not None:
                self._weights_failed(b, version, error, errors)
                continue
            b.applied(version)
            applied += 1
            combined.set_applied()  # (from the first success on, a no-op)
        if not applied:
            reasons = "; ".join(errors) or "no backends"
            logger.error("update_weights v%d reached no backend: %s", version, reasons)
            combined.set_failed(
                EngineError(f"update_weights v{version} was applied by no backend ({reasons})")
            )

    def _weights_failed(
        self, b: Backend, version: int, error: BaseException, errors: list[str]
    ) -> None:
        logger.warning("update_weights v%d failed on %s: %r", version, b.name, error)
        errors.append(f"{b.name}: {type(error).__name__}: {error}")
        self._count("pool/weight_update_failures")
        self._health.eject(b, "update_weights failed")

    def health(self) -> dict[str, Any]:
        """``ok`` when any backend is in rotation, the pool's version, and per-backend state."""
        return {
            "ok": any(b.healthy for b in self._backends),
            "version": self.version,
            "in_flight": self.in_flight,
            "backends": [
                {
                    "name": b.name,
                    "healthy": b.healthy,
                    "in_flight": b.in_flight,
                    "failures": b.failures,
                    "served": b.served,
                    "version": b.weights_version,
                }
                for b in self._backends
            ],
        }

    async def check_health(self) -> bool:
        """Probe every backend now: readmit those that answer, eject those that do not.

        Returns True when any backend is in rotation afterwards.
        """
        await self._health.probe_and_update(self._backends)
        return any(b.healthy for b in self._backends)

    def use_tokenizer(self, tokenizer: Any, stop_ids: tuple[int, ...] | None = None) -> None:
        """Offered to every backend (HTTP clients ignore it: their servers have theirs)."""
        for b in self._backends:
            b.engine.use_tokenizer(tokenizer, stop_ids)

    async def close(self) -> None:
        """Stop the health task and, if the pool owns them, close the backends."""
        self._closed = True
        await self._health.stop()
        if not self.close_backends:
            return
        closers = [b.engine.close() for b in self._backends]
        for result in await asyncio.gather(*closers, return_exceptions=True):
            if isinstance(result, Exception):
                logger.warning("closing a pool backend failed: %r", result)
        # Closed backends resolve their pending updates (applied or failed): settle them;
        # one that never answers is not waited for past a few seconds.
        background = set(self._background)
        if background:
            _, stuck = await asyncio.wait(background, timeout=_CLOSE_SETTLE_S)
            for task in stuck:
                task.cancel()
            await asyncio.gather(*stuck, return_exceptions=True)

    # ---------------------------------------------------------------- routing
    def _add_in_flight(self, b: Backend, delta: int) -> None:
        self._router.add_in_flight(b, delta)
        self._metrics.gauge("pool/in_flight", self.in_flight)

    async def _call(
        self,
        b: Backend,
        prompt_ids: list[int],
        sampling: SamplingParams,
        session_id: str | None,
        request_id: str | None,
        on_tokens: TokenCallback | None,
    ) -> TokenOutput:
        stream = {} if on_tokens is None else {"on_tokens": on_tokens}
        call = b.engine.generate(
            prompt_ids, sampling, session_id=session_id, request_id=request_id, **stream
        )
        if self.request_timeout_s is None:
            return await call
        async with asyncio.timeout(self.request_timeout_s):
            return await call

    def _none_left_message(self, errors: list[str]) -> str:
        down = sum(not b.healthy for b in self._backends)
        msg = f"no healthy backend left ({down} of {len(self._backends)} out of rotation"
        if errors:
            msg += f"; this request failed on {'; '.join(errors)}"
        return msg + ")"

    def _count(self, name: str) -> None:
        self._metrics.count(name)
