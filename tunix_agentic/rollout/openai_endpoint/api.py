"""The OpenAI-compatible endpoint's routes: :func:`add_openai_routes` mounts them on an
aiohttp app, :func:`openai_routes` is their table (a rollout node mounts it).

Every route's handler runs over one :class:`~.call_path.CallPath` (the engine, the chat
template and the recorded episodes): ``/v1/models`` (:mod:`~.serving_models`),
``/v1/chat/completions`` (:mod:`~.serving_chat`), ``/v1/episodes/{id}`` and its
``/reward`` (:mod:`~.serving_episodes`) and ``/v1/responses`` (:mod:`~.serving_responses`).
What each route takes and answers: ``docs/reference/openai_routes.md``. The app's API-key
guard and error middleware (:func:`tunix_agentic.serving.http.api_key_guard`) apply as to
its other routes. Host-side only: nothing here imports JAX.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from tunix_agentic.agent.chat import ChatFormat
from tunix_agentic.inference.base import InferenceEngine
from tunix_agentic.rollout.openai_endpoint.call_path import CallPath
from tunix_agentic.rollout.openai_endpoint.config import OpenAIConfig
from tunix_agentic.rollout.openai_endpoint.serving_chat import OpenAIServingChat
from tunix_agentic.rollout.openai_endpoint.serving_episodes import OpenAIServingEpisodes
from tunix_agentic.rollout.openai_endpoint.serving_models import OpenAIServingModels
from tunix_agentic.rollout.openai_endpoint.serving_responses import OpenAIServingResponses

__all__ = ["CallPath", "OpenAIConfig", "add_openai_routes", "openai_routes"]


def add_openai_routes(
    app: web.Application,
    *,
    engine: InferenceEngine,
    chat_format: ChatFormat,
    version_of: Callable[[], int | None] | None = None,
    config: OpenAIConfig = OpenAIConfig(),
) -> CallPath:
    """Mount the endpoint's routes on ``app`` (before it starts); returns the call path,
    whose ``store`` holds the recorded episodes.

    ``engine``: any :class:`~tunix_agentic.inference.base.InferenceEngine` (an EnginePool, a
    JaxEngine, an SGLang client). ``chat_format``: the run's template (the built-in
    :class:`~tunix_agentic.agent.chat.ChatTemplate` is served through its Jinja twin).
    ``version_of()``: the policy version now (recorded per call; per-token versions come
    from the engine)."""
    if engine is not None:  # (None: a test of what is refused before any engine is asked)
        # An in-process engine given no tokenizer yet takes the template's, so that
        # tool_choice and response_format can be enforced (read on first use).
        engine.use_tokenizer(chat_format.tokenizer, chat_format.stop_ids)
    calls = CallPath(engine=engine, chat_format=chat_format, version_of=version_of, config=config)
    app.add_routes(openai_routes(calls))
    return calls


def openai_routes(calls: CallPath) -> list[web.RouteDef]:
    """The endpoint's route table over ``calls``: every route, in the order it is mounted."""
    handlers = (
        OpenAIServingModels(calls),
        OpenAIServingChat(calls),
        OpenAIServingEpisodes(calls),
        OpenAIServingResponses(calls),
    )
    return [route for handler in handlers for route in handler.routes()]
