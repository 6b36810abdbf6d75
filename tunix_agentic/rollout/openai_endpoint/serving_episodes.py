"""``POST /v1/episodes/{id}/reward`` and ``GET /v1/episodes/{id}``: close an episode with
its reward, read what it recorded. Both need the episode's ``X-Episode-Token`` (401
without; 404 with another). Nothing here imports JAX."""

from __future__ import annotations

from aiohttp import web

from tunix_agentic.rollout.openai_endpoint.call_path import CallPath, episode_token
from tunix_agentic.rollout.openai_endpoint.errors import EpisodeError
from tunix_agentic.rollout.openai_endpoint.protocol import (
    TOKEN_HEADER,
    EpisodeView,
    RequestError,
    RewardReply,
    RewardRequest,
    refusal,
)
from tunix_agentic.rollout.openai_endpoint.recording import episode_trajectory
from tunix_agentic.rollout.openai_endpoint.store import Episode, episode_key
from tunix_agentic.rollout.rewards import RewardError, check_reward
from tunix_agentic.rollout.wire import trajectory_to_json
from tunix_agentic.serving.http import json_error
from tunix_agentic.serving.validation import validate_body


def parse_reward(body: object, limit: float) -> RewardRequest:
    """The reward body checked, the reward finite and within ``limit``
    (``rollout.reward_limit``), or :class:`RequestError` naming the field."""
    m = validate_body(RewardRequest, body, shape='{"reward": r}', sep=": ", error=RequestError)
    try:  # within the run's range (JSON holds no numpy scalars: a float is all there is)
        reward = check_reward(m.reward, limit, "reward")
    except RewardError as exc:
        raise RequestError(f"reward: {str(exc).removeprefix('reward ')}") from None
    return m.model_copy(update={"reward": reward, "info": m.info or {}})


class OpenAIServingEpisodes:
    """The episode routes over the call path's store."""

    def __init__(self, calls: CallPath):
        self.calls = calls

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/episodes/{episode_id}/reward", self.handle_reward),
            web.get("/v1/episodes/{episode_id}", self.handle_episode),
        ]

    def _close(self, eid: str, token: str, body: RewardRequest) -> Episode:
        try:
            return self.calls.store.close(
                episode_key(eid, token), body.reward, task_id=body.task_id, info=body.info
            )
        except EpisodeError as exc:
            raise refusal(exc) from None

    async def handle_reward(self, request: web.Request) -> web.Response:
        """Close the episode with its reward (again with the same reward: the same answer)."""
        eid = request.match_info["episode_id"]
        try:
            token = episode_token(request, required=True)
            body = parse_reward(await self.calls.read_body(request), self.calls.config.reward_limit)
            episode = self._close(eid, token, body)
        except RequestError as exc:
            return json_error(exc.status, str(exc), "invalid_request_error")
        reply = RewardReply(episode_id=eid, reward=episode.reward, calls=len(episode.calls))
        return web.json_response(reply.model_dump())

    async def handle_episode(self, request: web.Request) -> web.Response:
        """What the episode recorded; once closed, its trajectory in the rollout wire format."""
        eid = request.match_info["episode_id"]
        try:
            token = episode_token(request, required=True)
        except RequestError as exc:
            return json_error(exc.status, str(exc), "invalid_request_error")
        episode = self.calls.store.get(episode_key(eid, token))
        if episode is None:
            return json_error(
                404,
                f"episode {eid!r} is not known (or expired, or {TOKEN_HEADER} is not its token)",
                "not_found",
            )
        closed = {}
        if episode.closed:
            closed["trajectory"] = trajectory_to_json(episode_trajectory(episode))
        return web.json_response(EpisodeView.of(episode, **closed).model_dump())
