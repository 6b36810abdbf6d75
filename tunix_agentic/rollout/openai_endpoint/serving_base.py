"""The template method of the model-calling routes (as SGLang's ``serving_base.py``).

:meth:`OpenAIServing.handle` runs one request through the shared
:class:`~.call_path.CallPath` and turns what can go wrong into the answer: a refused
request is a JSON error (or, once a stream began, the stream's last event), a client
that left gets nothing more. A route's handler (:mod:`~.serving_chat`,
:mod:`~.serving_responses`) supplies the hooks: how its body becomes a chat request, what
shows the reply while it is sampled, and how a served call is framed. Nothing here
imports JAX.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
from collections.abc import Collection
from typing import Any, Protocol

from aiohttp import web

from tunix_agentic.rollout.openai_endpoint.call_path import CallPath, ClientGone, ServedCall
from tunix_agentic.rollout.openai_endpoint.live import LiveStream
from tunix_agentic.rollout.openai_endpoint.protocol import ChatCompletionRequest, RequestError
from tunix_agentic.serving.http import json_error


class LiveWriter(Protocol):
    """Writes the pieces a :class:`~.live.LiveStream` shows; opens its response (``stream``)
    at the first one."""

    stream: web.StreamResponse | None

    async def write(self, piece: str) -> None: ...


@dataclasses.dataclass
class Exchange:
    """One request's state between :meth:`OpenAIServing.handle` and its route's hooks: the
    answer's ``headers``, what shows the reply while it is sampled (``writer``, ``live``)
    and the streamed reply once ``sent``. A route keeps its own state in a subclass."""

    request: web.Request
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    writer: LiveWriter | None = None
    live: LiveStream | None = None
    sent: web.StreamResponse | None = None

    @property
    def begun(self) -> web.StreamResponse | None:
        """The stream the client has begun reading while the reply was sampled."""
        return self.writer.stream if self.writer is not None else None


class OpenAIServing(abc.ABC):
    """A model-calling route over the shared call path ``calls``."""

    def __init__(self, calls: CallPath):
        self.calls = calls

    @abc.abstractmethod
    def routes(self) -> list[web.RouteDef]: ...

    def exchange(self, request: web.Request) -> Exchange:
        """A request's state (a route with state of its own returns its subclass)."""
        return Exchange(request)

    @abc.abstractmethod
    def parse(self, ex: Exchange, body: Any) -> tuple[ChatCompletionRequest, Collection[str]]:
        """The chat request ``body`` means and the chat fields it gave; RequestError else."""

    @abc.abstractmethod
    def live_writer(self, ex: Exchange, chat: ChatCompletionRequest) -> LiveWriter | None:
        """What writes the reply's first pieces while it is sampled (None: not streamed)."""

    @abc.abstractmethod
    async def stream_reply(self, ex: Exchange, served: ServedCall) -> web.StreamResponse | None:
        """Send the recorded call as a stream, after what ``ex.live`` showed (None: the
        request is not streamed). A write to a gone client raises ``ConnectionError``."""

    @abc.abstractmethod
    def whole_reply(self, ex: Exchange, served: ServedCall) -> web.Response:
        """The answer to a request that is not streamed."""

    @abc.abstractmethod
    async def fail_stream(self, ex: Exchange, exc: RequestError) -> web.StreamResponse:
        """End the stream ``ex.begun`` with the error ``exc`` (the call failed after it began)."""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """The template method: serve the call, then answer (see the module docstring)."""
        ex = self.exchange(request)

        def show_live(chat: ChatCompletionRequest) -> LiveStream | None:
            writer = self.live_writer(ex, chat)
            shown = None if writer is None else self.calls.live_stream(chat, writer.write)
            if shown is not None:
                ex.writer, ex.live = writer, shown
            return shown

        async def deliver(served: ServedCall) -> None:  # after the call is recorded
            ex.sent = await self.stream_reply(ex, served)

        try:
            served = await self.calls.serve_call(
                request,
                lambda body: self.parse(ex, body),
                ex.headers,
                deliver=deliver,
                live=show_live,
            )
        except RequestError as exc:
            if ex.begun is not None:  # the stream had begun: end it so
                return await self.fail_stream(ex, exc)
            return json_error(exc.status, str(exc), "invalid_request_error", exc.code)
        except ClientGone:  # nobody reads what is answered now
            return ex.sent or web.Response(status=499)
        except asyncio.CancelledError:
            if ex.live is not None and ex.live.gone:  # our own cancel: the client left
                asyncio.current_task().uncancel()
                return ex.begun or web.Response(status=499)
            raise
        return ex.sent or self.whole_reply(ex, served)
