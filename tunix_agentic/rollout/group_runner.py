"""The one seam between the orchestrator and whatever runs its groups.

A :class:`GroupRunner` runs one group of episodes on a task and returns a
:class:`~tunix_agentic.rollout.episode.Group`. Two implement it: the in-process
:class:`~tunix_agentic.rollout.episode.EpisodeRunner` (environments and the agent loop
here) and :class:`~tunix_agentic.rollout.client.runner.ServiceEpisodeRunner` (groups on
``serve-rollout`` nodes). The
:class:`~tunix_agentic.rollout.orchestrator.RolloutOrchestrator` receives one
(``RolloutOrchestrator.in_process`` builds the in-process one) and keeps the task
stream, staleness pacing, filters and evaluation the same whichever it is; it hands the
runner its bookkeeping once, as :class:`~tunix_agentic.rollout.group.RunnerHooks`
(:meth:`GroupRunner.bind`), and tells it each published version through the protocol,
never through the runner's type.

What only some runners can do is an optional protocol of its own, which the orchestrator
asks for with ``isinstance``: :class:`PrefetchingRunner` (environments made here, so a
group can be INIT'ed ahead of admission) and :class:`CheckpointingRunner` (state that
rides in the orchestrator's checkpoint).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol, runtime_checkable

from tunix_agentic.agent.loop import AgentConfig
from tunix_agentic.envs.base import Environment
from tunix_agentic.rollout.group import PRODUCTION_STREAM, Group, InitResult, RunnerHooks
from tunix_agentic.trajectory import TaskLike


class GroupRunner(Protocol):
    """Runs groups of episodes for a :class:`~tunix_agentic.rollout.orchestrator.RolloutOrchestrator`.

    ``agent_config``: the sampling and turn budget of production groups (settable).
    """

    agent_config: AgentConfig

    def bind(self, hooks: RunnerHooks) -> None:
        """Take the orchestrator's bookkeeping (before any group runs)."""
        ...

    async def run_group(
        self,
        task: TaskLike,
        *,
        index: int,
        version: int,
        group_size: int | None = None,
        agent_config: AgentConfig | None = None,
        prepared: list[InitResult] | None = None,
        stream: int = PRODUCTION_STREAM,
        run_seed: int | None = None,
        min_usable: int | None = None,
    ) -> Group:
        """Run group ``index`` of seed ``stream`` on ``task``, admitted under ``version``.

        ``prepared``: its members already INIT'ed (:meth:`PrefetchingRunner.init_group`;
        only a runner that has it is given any); without an ``agent_config`` the turn
        budget follows ``rollout.max_turns_schedule``; ``run_seed`` (default
        ``rollout.seed``) seeds the members' sampling; with ``min_usable``, the members
        left once that many ended usable are cancelled.
        """
        ...

    def set_version(self, version: int) -> None:
        """The learner published ``version``."""
        ...

    async def close(self) -> None:
        """Let go of what the runner holds (connections, background calls)."""
        ...


@runtime_checkable
class PrefetchingRunner(Protocol):
    """A :class:`GroupRunner` that makes the environments here, and so can INIT a group's
    members before admission (``rollout.prefetch_groups``).

    ``env_factory``: what makes each episode's environment (settable).
    """

    env_factory: Callable[..., Environment]

    async def init_group(self, task: TaskLike, size: int) -> list[InitResult]:
        """INIT ``size`` members of a group of ``task`` ahead of admission."""
        ...

    async def close_members(self, members: list[InitResult | BaseException]) -> None:
        """Close the environments of INIT results never run."""
        ...


@runtime_checkable
class CheckpointingRunner(Protocol):
    """A :class:`GroupRunner` with state of its own that a checkpoint keeps (rollout nodes:
    the run's group ids and the finished groups not yet trained on)."""

    def checkpoint_state(self, pending: Iterable[int]) -> dict[str, Any] | None:
        """What a checkpoint keeps of this runner, given the group indices not yet trained
        on (``pending``); None: nothing."""
        ...

    def restore_state(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`checkpoint_state` (before production starts)."""
        ...
