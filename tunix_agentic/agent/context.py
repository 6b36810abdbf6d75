"""Context rules: what the model sees next, derived from the episode history.

A rule maps the trajectory so far (and the agent's ``context_window``) to the
prompt ids of the next model call. ``append_only`` (the default) sends the whole
history; ``sliding_window`` keeps the task prompt and the last ``k`` steps (each
an action and the environment's reply; Agent-R1's window), so long episodes fit
the model's context; ``as_rendered`` sends the whole history as a deployment that
re-renders the conversation shows it (Qwen3 with ``enable_thinking: false`` drops the
empty ``<think></think>`` its generation prompt put before each earlier turn). When a
step saw less than the whole history the learner trains it on exactly what it saw
(``Trajectory.learner_rows``: one row per turn). Rules are looked up by name; a user
may add one to :data:`CONTEXT_RULES`; :func:`context_rule_for` binds one to a template.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from tunix_agentic.trajectory import Trajectory

ContextRule = Callable[[Trajectory, int], list[int]]


def append_only(traj: Trajectory, window: int = 0) -> list[int]:
    """The whole history (``window`` is ignored)."""
    return traj.token_ids


def sliding_window(traj: Trajectory, window: int) -> list[int]:
    """The prompt, then the last ``window`` steps (action and observation) of the history."""
    if window < 1:
        raise ValueError(f"the sliding_window rule needs agent.context_window >= 1, got {window}")
    if len(traj.steps) <= window:
        return traj.token_ids
    start = traj.action_starts()[len(traj.steps) - window]
    return traj.token_ids[: traj.prompt_len] + traj.token_ids[start:]


def as_rendered(traj: Trajectory, window: int = 0, *, drop: Sequence[int] = ()) -> list[int]:
    """The whole history with ``drop`` cut from right before each earlier turn's action:
    ``drop`` is the template's :attr:`~tunix_agentic.agent.chat.JinjaChatTemplate.generation_only_ids`,
    what its generation prompt adds that a re-render of an earlier turn does not have, so
    the result is what a serving stack re-rendering the conversation would send (the
    history itself, and the generation prompt that ends it, are kept). ``window`` is
    ignored; with nothing to drop this is ``append_only``."""
    drop = list(drop)
    if not drop or not traj.steps:
        return traj.token_ids
    ids, n, out, pos = traj.token_ids, len(drop), [], 0
    for start in traj.action_starts():
        if start - n >= pos and ids[start - n : start] == drop:
            out += ids[pos : start - n]
            pos = start
    return out + ids[pos:]


CONTEXT_RULES: dict[str, ContextRule] = {
    "append_only": append_only,
    "sliding_window": sliding_window,
    "as_rendered": as_rendered,
}


def get_context_rule(name: str) -> ContextRule:
    try:
        return CONTEXT_RULES[name]
    except KeyError:
        raise ValueError(f"unknown context rule {name!r}; known: {sorted(CONTEXT_RULES)}") from None


def context_rule_for(name: str, template: Any) -> ContextRule:
    """The rule ``name`` for episodes framed by ``template`` (``as_rendered`` learns from it
    what a re-render drops)."""
    rule = get_context_rule(name)
    if rule is as_rendered:
        return functools.partial(as_rendered, drop=getattr(template, "generation_only_ids", ()))
    return rule
