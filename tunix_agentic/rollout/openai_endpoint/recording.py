"""What the endpoint records of an episode, and the trajectory it becomes (no JAX).

A :class:`Call` holds the prompt ids the engine saw and each choice's ids, logprobs and
per-token policy versions (:class:`Completion`); an :class:`Episode` holds its calls and,
once closed, its reward. :func:`episode_trajectory` turns a closed episode into the
learner's :class:`~tunix_agentic.trajectory.Trajectory`: when every call's prompt extends
the previous call's prompt + completion, one whole-history trajectory (one learner row,
the loss mask on the completions only); otherwise every call is a step with its own
context (one learner row per call).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from tunix_agentic.trajectory import Step, Trajectory


@dataclasses.dataclass
class Completion:
    """One sampled choice of a call: its ids (the stop token kept), the engine's logprobs
    and per-token policy versions, and the key of the assistant message it was returned as
    (:func:`~tunix_agentic.rollout.openai_endpoint.protocol.message_key`)."""

    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str
    message_key: str
    ended_turn: bool  # whether the last id ends the assistant's turn (a stop token)
    unoffered_tool_calls: int = 0  # calls to tools the request did not offer (left as text)
    constrained: bool = False  # sampled under a grammar: not trained on (Step.constrained)


@dataclasses.dataclass
class Call:
    """One recorded chat call: the prompt ids the engine saw and its choices. A ``cut``
    call's client left before it had the whole reply (a closed connection: the engine's
    request was aborted, its ids are not kept, or the reply was being sent): it is shown
    in the recording, never trained on, and no later call continues it."""

    message_keys: list[str]  # of the request's messages, to find the call a later one extends
    prompt_ids: list[int]
    completions: list[Completion]
    policy_version: int | None
    model_s: float = 0.0
    cut: bool = False

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + sum(len(c.token_ids) for c in self.completions)


@dataclasses.dataclass
class Episode:
    """One episode: its id, the key the store files it under, who opened it, its calls and,
    once closed, its reward, task id and info (where it is in its life: :mod:`~.store`)."""

    episode_id: str
    key: str = ""  # episode_key(episode_id, token)
    client: str = ""  # who opened it (per-client cap); "" for a claimed member
    calls: list[Call] = dataclasses.field(default_factory=list)
    closed: bool = False
    reward: float | None = None
    task_id: str | None = None
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    touched: float = dataclasses.field(default_factory=time.monotonic)
    grouped: bool = False  # taken into an own-task group (still readable by its holder)
    in_flight: int = 0

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.calls)


def finished_turns(episode: Episode) -> list[tuple[Call, Completion]]:
    """Every choice of the calls its client did not cut, with its call."""
    return [(call, c) for call in episode.calls if not call.cut for c in call.completions]


def episode_trajectory(episode: Episode) -> Trajectory:
    """The learner's trajectory of a closed episode (see the module docstring).

    Chained: ``token_ids`` is the first prompt, then per call its completion and the ids
    the next prompt added (the observation: not trained). Not chained: every step carries
    its call's prompt as ``context_ids``. ``reward`` is the episode's; ``task_id`` the one
    given with the reward (else the episode id). Cut calls are left out (``info``
    counts them: ``cut_calls``).
    """
    turns = finished_turns(episode)
    if not episode.closed or not turns:
        raise ValueError(f"episode {episode.episode_id!r} is not closed with finished calls")
    history: list[int] = []
    chained = True
    for i, (call, c) in enumerate(turns):
        if i and call.prompt_ids[: len(history)] != history:
            chained = False
            break
        history = call.prompt_ids + c.token_ids
    traj = Trajectory(
        task_id=episode.task_id or episode.episode_id,
        episode_id=episode.episode_id,
        reward=float(episode.reward or 0.0),
        info={"source": "openai", "calls": len(episode.calls), **episode.info},
    )
    cut = sum(call.cut for call in episode.calls)
    if cut:
        traj.info["cut_calls"] = cut
    traj.append_prompt(turns[0][0].prompt_ids)
    for i, (call, c) in enumerate(turns):
        if chained and i:
            traj.append_observation(call.prompt_ids[len(traj.token_ids) :])
        traj.append_action(
            Step(
                context_len=len(call.prompt_ids),
                action_ids=list(c.token_ids),
                logprobs=list(c.logprobs),
                versions=list(c.versions),
                finish_reason=c.finish_reason,
                timings={"model_s": call.model_s},
                context_ids=None if chained else list(call.prompt_ids),
                constrained=c.constrained,
            )
        )
    traj.timings["model_s"] = sum(call.model_s for call in episode.calls)
    return traj
