"""The rollout node's engines: SGLang-compatible servers by URL, added and removed while
it serves, behind an :class:`~tunix_agentic.inference.pool.EnginePool`, and the policy
version they serve: the one a trainer published (``POST /v1/policy``), to which their
replies are held, or, on a node no trainer drives (an operator's node over ``serve-engine
--params RUN``), the one they report. Nothing here imports JAX."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

from tunix_agentic.inference.base import (
    EngineError,
    PromptTooLongError,
    StreamedCount,
    TokenCallback,
    TokenOutput,
)
from tunix_agentic.inference.params import SamplingParams
from tunix_agentic.inference.pool import EnginePool
from tunix_agentic.rollout.service.engine_gate import EngineGate
from tunix_agentic.serving.client import SGLangEngine

# The APIs a node's engines may speak: SGLang's native one (SGLang, serve-engine, the
# trainer's served engine) or vLLM's (engine.backend: vllm).
ENGINE_APIS = ("sglang", "vllm")

# How a server says a prompt does not fit its context window (HTTP 400): ours
# (serve-engine) and SGLang's.
# How far a reply's policy version may run ahead of the node's published one: the trainer
# loads weights v into its engine, then tells the nodes v (POST /v1/policy) after the step.
VERSION_GRACE = 1
_RETRY_S = 0.25  # how often a request waiting for an engine looks again
_TOO_LONG = re.compile(r"leaves no room within max_seq_len|longer than the model's context length")


class EngineSet:
    """The node's engines by URL, behind an :class:`EnginePool` rebuilt when the set
    changes (requests already sent finish on the pool that sent them). Implements the
    ``generate`` the agent loop needs; an empty set answers ``EngineError``, and a prompt
    the server says does not fit its context window ``PromptTooLongError`` (the episode
    ends ``max_tokens``, as in process, instead of failing on infrastructure)."""

    def __init__(
        self,
        urls: list[str],
        *,
        api_key: str | None = None,
        request_timeout_s: float = 300.0,
        wait_s: float = 0.0,
    ):
        self.api_key = api_key
        self.request_timeout_s = request_timeout_s
        # How long a request waits for an engine when none is usable (the node sets
        # rollout.backend_wait_s): an engine restarted within it costs no episode.
        self.wait_s = wait_s
        # The version a trainer published (None before any), and its weights the node
        # pushes to an engine that lost them: (version, path).
        self.published: int | None = None
        self.weights: tuple[int, str] | None = None
        # The weights' version of the newest reply (or, before one, the engines' model
        # info at start): the policy while no trainer has published one.
        self.served_version = 0
        self._gates: dict[str, EngineGate] = {}
        self._clients: dict[str, SGLangEngine] = {}
        self._pool: EnginePool | None = None
        self._retired: set[asyncio.Task] = set()
        self._vocab_size: int | None = None
        for u in urls:
            self.add(u)

    def check_replies(self, *, vocab_size: int | None) -> None:
        """Check every engine's replies (engines added later too) against the model's
        vocabulary and the published policy version: a reply with a NaN or positive
        logprob, an id outside ``[0, vocab_size)`` or a version past :attr:`published` +
        ``VERSION_GRACE`` is that backend's infrastructure error (``BadReply``), never
        recorded. Before a trainer publishes a version, any version the engines hold is
        theirs to serve."""
        self._vocab_size = vocab_size
        for client in self._clients.values():
            client.vocab_size, client.max_version = vocab_size, self._max_version

    def _max_version(self) -> int | None:
        return None if self.published is None else self.published + VERSION_GRACE

    @property
    def policy_version(self) -> int:
        """The node's policy version: the one a trainer published, else (no trainer) the
        one the engines serve (:attr:`served_version`). Only a published version holds the
        engines to it (see :mod:`~tunix_agentic.rollout.service.engine_gate`)."""
        return self.served_version if self.published is None else self.published

    @property
    def urls(self) -> list[str]:
        return list(self._clients)

    def add(self, url: str, api: str = "sglang") -> bool:
        """Add the engine at ``url``, which speaks ``api`` (one of :data:`ENGINE_APIS`);
        False if it is already in the set."""
        url = check_url(url)
        if api not in ENGINE_APIS:
            raise ValueError(f"api must be one of {', '.join(ENGINE_APIS)}, got {api!r:.100}")
        if url in self._clients:
            return False
        if api == "vllm":
            from tunix_agentic.serving.vllm_client import VLLMEngine as client_class
        else:
            client_class = SGLangEngine
        self._clients[url] = client_class(
            url,
            api_key=self.api_key,
            request_timeout_s=self.request_timeout_s,
            vocab_size=self._vocab_size,
            max_version=self._max_version,
        )
        self._rebuild()
        return True

    def remove(self, url: str) -> bool:
        """Take the engine at ``url`` out (no new requests; closed once its requests end);
        False if it is not in the set."""
        client = self._clients.pop(url.rstrip("/"), None)
        if client is None:
            return False
        self._rebuild()
        self._spawn(self._close_when_idle(client))
        return True

    def publish(self, version: int, weights_path: str | None) -> None:
        """The trainer published ``version``, its weights at ``weights_path`` (None: not
        known here): from now on the policy version, which replies are held to. An engine
        that failed is used again once it holds them (pushed)."""
        self.published = int(version)
        self.weights = None if weights_path is None else (int(version), weights_path)

    def _gate(self, url: str) -> EngineGate:
        gate = self._gates.get(url)
        if gate is None or gate.client is not self._clients[url]:
            gate = self._gates[url] = EngineGate(
                self._clients[url], lambda: self.published, lambda: self.weights
            )
        return gate

    def _rebuild(self) -> None:
        old, urls = self._pool, list(self._clients)
        self._gates = {u: self._gate(u) for u in urls}
        self._pool = (
            EnginePool([self._gates[u] for u in urls], names=urls, close_backends=False)
            if urls
            else None
        )
        if old is not None:
            self._spawn(self._close_when_idle(old))

    def _spawn(self, coro) -> None:
        try:
            task = asyncio.get_running_loop().create_task(coro)
        except RuntimeError:  # no loop yet (built before serving): nothing is in flight
            coro.close()
            return
        self._retired.add(task)
        task.add_done_callback(self._retired.discard)

    @staticmethod
    async def _close_when_idle(engine: Any, limit_s: float = 600.0) -> None:
        deadline = time.monotonic() + limit_s
        while engine.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        await engine.close()

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams = SamplingParams(),
        *,
        session_id: str | None = None,
        request_id: str | None = None,
        on_tokens: TokenCallback | None = None,
    ) -> TokenOutput:
        deadline = time.monotonic() + self.wait_s
        streamed = StreamedCount(on_tokens)
        stream = {} if on_tokens is None else {"on_tokens": streamed.callback}
        while True:
            pool = self._pool
            if pool is None:
                raise EngineError("the rollout node has no engine (POST /v1/engines {url})")
            try:
                out = await pool.generate(
                    prompt_ids, sampling, session_id=session_id, request_id=request_id, **stream
                )
            except PromptTooLongError:
                raise
            except ValueError as exc:
                if _TOO_LONG.search(str(exc)):
                    raise PromptTooLongError(str(exc)) from exc
                raise
            except EngineError:
                # Every engine failed or is out: wait for one (the pool's health probe
                # takes it back, with the published weights) instead of failing episodes
                # (not once ids were streamed: the caller has shown them).
                if streamed.given or not await self._until_usable(deadline):
                    raise
            else:
                if out.versions:
                    self.served_version = int(out.versions[-1])
                return out

    def use_tokenizer(self, tokenizer: Any, stop_ids: tuple[int, ...] | None = None) -> None:
        """Nothing: the node's engines are servers, which constrain decoding with their own
        tokenizers."""

    async def read_served_version(self, timeout_s: float = 5.0) -> None:
        """Set :attr:`served_version` to the newest weight version the engines report
        (``model_info``); one that does not answer within ``timeout_s``, or reports no
        integer version, is left out (its first reply tells)."""

        async def held(client: Any) -> int | None:
            try:
                info = await asyncio.wait_for(client.model_info(), timeout_s)
                return int(info["weight_version"])
            except (EngineError, TimeoutError, KeyError, TypeError, ValueError):
                return None

        found = await asyncio.gather(*(held(c) for c in list(self._clients.values())))
        versions = [v for v in found if v is not None]
        if versions:
            self.served_version = max(versions)

    async def _until_usable(self, deadline: float) -> bool:
        """Wait until an engine is in rotation or ``deadline`` passes; False past it."""
        while time.monotonic() < deadline:
            await asyncio.sleep(min(_RETRY_S, max(0.0, deadline - time.monotonic())))
            pool = self._pool
            if pool is not None and pool.health()["ok"]:
                return True
        return False

    @property
    def in_flight(self) -> int:
        return sum(c.in_flight for c in self._clients.values())

    def health(self) -> list[dict[str, Any]]:
        """Each engine: url, in-flight requests, health as the pool sees it."""
        seen = {}
        if self._pool is not None:
            seen = {b["name"]: b for b in self._pool.health().get("backends", [])}
        out = []
        for u, client in self._clients.items():
            b = seen.get(u, {})
            out.append(
                {
                    "url": u,
                    "in_flight": client.in_flight,
                    "healthy": bool(b.get("healthy", client.health().get("ok", False))),
                    "status": client.health().get("status"),
                    "served": b.get("served", 0),
                }
            )
        return out

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()
        for t in list(self._retired):
            t.cancel()
        await asyncio.gather(*self._retired, return_exceptions=True)
        clients, self._clients = list(self._clients.values()), {}
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)


def check_url(url: Any) -> str:
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(f"url must be an http:// or https:// URL, got {url!r:.200}")
    return url.rstrip("/")
