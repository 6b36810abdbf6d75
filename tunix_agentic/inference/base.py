"""The engine contract: token ids in, token ids with logprobs out.

Every engine (the in-process JAX engine, the SGLang HTTP client, a pool of
either) implements :class:`InferenceEngine`, so agents never know which one
they talk to. Generated ids are never decoded and re-encoded on their way to
the learner.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from tunix_agentic.inference.params import SamplingParams

TokenCallback = Callable[[list[int]], None]
"""Streaming: ``generate(..., on_tokens=f)`` calls ``f(ids)`` on the caller's event loop
with the ids sampled since the last call, in order, while the request runs. They are
provisional: the returned :class:`TokenOutput` is what counts (a stop string may cut it
shorter than what was streamed). Engines that cannot stream call it once with the whole
output before returning."""


class EngineError(RuntimeError):
    """The engine could not serve a request (an infrastructure fault, not the policy's)."""


class PromptTooLongError(ValueError):
    """The prompt does not fit the engine's context window."""


@dataclasses.dataclass
class TokenOutput:
    """What one generate call produced.

    ``finish_reason``: "stop" (a stop token, kept as the last id), "length"
    (max_new_tokens or the context window) or "abort". ``versions[i]`` is the
    policy version that sampled ``token_ids[i]``.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    matched_stop: int | None = None
    versions: list[int] = dataclasses.field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    latency_s: float = 0.0


class WeightUpdate:
    """What ``update_weights`` returns: a handle that resolves once the backend applied
    the weights (to their version), or raises :class:`EngineError` if it could not.

    ``await update`` on an event loop; ``update.result(timeout)`` from plain threads.
    Nothing needs to wait on it: generation goes on with the old weights until the
    new ones are in (no drain). Thread-safe: engines complete it from their own threads.
    """

    def __init__(self, version: int):
        self.version = int(version)
        self.future: concurrent.futures.Future = concurrent.futures.Future()
        # Running: a waiter that gives up (a timeout, a cancelled handler) cancels its own
        # wait, never the update, which the engine still resolves.
        self.future.set_running_or_notify_cancel()

    # -------------------------------------------------------- constructors
    @classmethod
    def applied(cls, version: int) -> WeightUpdate:
        """A handle that is already resolved (the weights are in)."""
        update = cls(version)
        update.set_applied()
        return update

    @classmethod
    def failed(cls, version: int, error: BaseException) -> WeightUpdate:
        update = cls(version)
        update.set_failed(error)
        return update

    @classmethod
    def of(cls, result: Any, version: int) -> WeightUpdate:
        """Normalise what a backend's ``update_weights`` returned: a handle, an awaitable
        (an asyncio task or future) or ``None`` (a backend that applies synchronously)."""
        if isinstance(result, WeightUpdate):
            return result
        if result is None:
            return cls.applied(version)
        if isinstance(result, asyncio.Future):  # tasks included
            update = cls(version)
            result.add_done_callback(lambda done: update._copy_from(done))
            return update
        raise TypeError(f"update_weights returned {type(result).__name__}, not a WeightUpdate")

    @classmethod
    def all(cls, updates: Iterable[WeightUpdate], version: int) -> WeightUpdate:
        """Resolves when every one of ``updates`` has; raises the first failure."""
        updates = list(updates)
        combined = cls(version)
        if not updates:
            combined.set_applied()
            return combined
        left = [len(updates)]
        lock = threading.Lock()

        def one_done(fut: concurrent.futures.Future) -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if combined.future.done():
                return
            error = fut.exception()  # (never cancelled: see __init__)
            if error is not None:
                combined.set_failed(error)
            elif last:
                combined.set_applied()

        for update in updates:
            update.future.add_done_callback(one_done)
        return combined

    # ------------------------------------------------------------ completing
    def set_applied(self) -> None:
        _set(self.future, result=self.version)

    def set_failed(self, error: BaseException) -> None:
        _set(self.future, exception=error)

    def _copy_from(self, done: asyncio.Future) -> None:
        if done.cancelled():
            self.set_failed(EngineError(f"the update to version {self.version} was cancelled"))
        elif done.exception() is not None:
            self.set_failed(done.exception())
        else:
            self.set_applied()

    # --------------------------------------------------------------- waiting
    def done(self) -> bool:
        return self.future.done()

    def result(self, timeout: float | None = None) -> int:
        """Block until resolved (not on an event loop's thread): the version, or raise."""
        return self.future.result(timeout)

    def __await__(self):
        return asyncio.shield(asyncio.wrap_future(self.future)).__await__()

    def __repr__(self) -> str:
        state = "pending"
        if self.future.done():
            state = "failed" if self.future.exception() is not None else "applied"
        return f"WeightUpdate(version={self.version}, {state})"


def _set(future: concurrent.futures.Future, *, result: Any = None, exception=None) -> None:
    """Resolve ``future`` unless something else already did (races are benign here)."""
    try:
        if exception is not None:
            future.set_exception(exception)
        else:
            future.set_result(result)
    except concurrent.futures.InvalidStateError:
        pass


@runtime_checkable
class InferenceEngine(Protocol):
    """What every engine offers: the JAX engine, the SGLang client, a pool or a cross-policy
    mix of them. Callers need nothing else (no ``getattr`` for optional parts)."""

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams = ...,
        *,
        session_id: str | None = None,
        request_id: str | None = None,
        on_tokens: TokenCallback | None = None,
    ) -> TokenOutput:
        """Sample a completion of ``prompt_ids``; ``on_tokens`` streams its ids as they come
        (:data:`TokenCallback`). Cancelling the caller aborts the request."""
        ...

    def update_weights(self, params: Any, version: int) -> WeightUpdate:
        """Hand over new weights; generation continues meanwhile. The handle resolves
        when this engine generates with them."""
        ...

    @property
    def version(self) -> int | None:
        """The weight version generated with now (``None``: unknown, as in a pool whose
        backends disagree until its first update)."""
        ...

    @property
    def in_flight(self) -> int:
        """Requests sent to this engine and not yet answered."""
        ...

    @property
    def stats(self) -> dict[str, float]:
        """Counters of the work done so far (``generated_tokens``, ...; an in-process
        engine adds its clock's seconds). Keys vary by engine; missing means not measured."""
        ...

    def clock(self) -> dict[str, float]:
        """Busy / host-gap / idle seconds so far (``busy_s``, ``sched_gap_s``, ``idle_s``);
        differences of two readings split the wall time between them. Empty where the
        engine cannot see its device (an HTTP client)."""
        ...

    def health(self) -> dict[str, Any]:
        """The engine's state now, without I/O; ``ok`` says whether it can serve."""
        ...

    async def check_health(self) -> bool:
        """Probe the engine now (an HTTP client asks its server); True if it can serve."""
        ...

    def use_tokenizer(self, tokenizer: Any, stop_ids: tuple[int, ...] | None = None) -> None:
        """Offer the model's tokenizer for constrained decoding (``SamplingParams.constraint``;
        ``stop_ids``: where a complete grammar may end, default the tokenizer's). An engine
        that samples in this process takes the first one offered and keeps it (the trainer's
        before the template's of a server or endpoint it is mounted on); an HTTP client
        ignores it (its server has its own); a pool or mix offers it to every member."""
        ...

    async def close(self) -> None:
        """Stop serving and release what the engine holds; requests in flight end."""
        ...


@runtime_checkable
class ServerClient(InferenceEngine, Protocol):
    """An engine that is the HTTP client of one server (the SGLang and vLLM clients): where
    the server is, and where it last loaded weights from. A pool moves such a backend when
    its server restarts elsewhere; a trainer names the weights to a rollout node."""

    base_url: str

    @property
    def weights_path(self) -> Path | None:
        """The directory the server last loaded (:attr:`version`'s weights); None before."""
        ...

    def move_to(self, base_url: str) -> None:
        """The server is now at ``base_url``; its health and weights are unknown until it
        answers again."""
        ...


def summed_counters(parts: Iterable[dict[str, float]]) -> dict[str, float]:
    """Key-wise sum of several engines' :attr:`~InferenceEngine.stats` or clock readings."""
    out: dict[str, float] = {}
    for part in parts:
        for k, v in part.items():
            out[k] = out.get(k, 0) + v
    return out


class StreamedCount:
    """Wraps an ``on_tokens`` callback and counts what it was given: a layer that retries a
    request on another backend must not once ids were streamed (the caller has shown them)."""

    def __init__(self, on_tokens: TokenCallback | None):
        self.given = 0
        self._on_tokens = on_tokens
        self.callback: TokenCallback | None = None if on_tokens is None else self._call

    def _call(self, ids: list[int]) -> None:
        self.given += len(ids)
        self._on_tokens(ids)  # type: ignore[misc]
