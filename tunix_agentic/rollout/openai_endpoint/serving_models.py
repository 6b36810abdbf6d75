"""``GET /v1/models`` (and ``/v1/models/{id}``): the served policy, ``id`` the configured
``model_name`` and ``policy_version`` the weights' version now; another name is OpenAI's
404 (``model_not_found``). Nothing here imports JAX."""

from __future__ import annotations

from aiohttp import web

from tunix_agentic.rollout.openai_endpoint.call_path import CallPath, check_model
from tunix_agentic.rollout.openai_endpoint.protocol import ModelCard, ModelList, RequestError
from tunix_agentic.serving.http import json_error


class OpenAIServingModels:
    """The model routes: one model, the policy."""

    def __init__(self, calls: CallPath):
        self.calls = calls

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/v1/models", self.handle_models),
            web.get("/v1/models/{model_id}", self.handle_models),
        ]

    async def handle_models(self, request: web.Request) -> web.Response:
        """The served model (the list of it, without a name)."""
        calls = self.calls
        model = ModelCard(
            id=calls.config.model_name, created=calls.created, policy_version=calls.version_of()
        )
        wanted = request.match_info.get("model_id")
        if wanted is None:
            return web.json_response(ModelList(data=[model]).model_dump())
        try:
            check_model(wanted, calls.config.model_name)
        except RequestError as exc:
            return json_error(exc.status, str(exc), "invalid_request_error", exc.code)
        return web.json_response(model.model_dump())
