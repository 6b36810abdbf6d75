"""The one seam between the orchestrator and whatever runs its groups.

A :class:`GroupRunner` runs one group of episodes on a task and returns a
:class:`~tunix_agentic.rollout.episode.Group`. Two implement it: the in-process
:class:`~tunix_agentic.rollout.episode.EpisodeRunner` (environments and the agent loop
here) and :class:`~tunix_agentic.rollout.client.runner.ServiceEpisodeRunner` (groups on
``serve-rollout`` nodes). The
:class:`~tunix_agentic.rollout.orchestrator.RolloutOrchestrator` receives one (or builds
the in-process one) and keeps the task stream, staleness pacing, filters and evaluation
the same whichever it is; it hands the runner its bookkeeping once, as
:class:`~tunix_agentic.rollout.group.RunnerHooks` (:meth:`GroupRunner.bind`), and tells it each published version and
checkpoint through the protocol, never through the runner's type.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from tunix_agentic.agent.loop import AgentConfig
from tunix_agentic.envs.base import Environment
from tunix_agentic.rollout.group import PRODUCTION_STREAM, Group, InitResult, RunnerHooks


class GroupRunner(Protocol):
    """Runs groups of episodes for a :class:`~tunix_agentic.rollout.orchestrator.RolloutOrchestrator`.

    ``agent_config``: the sampling and turn budget of production groups (settable).
    ``env_factory``: what makes each episode's environment here, or None where the
    environments are made elsewhere (on rollout nodes; setting one there raises
    ``ValueError``).
    """

    agent_config: AgentConfig

    @property
    def env_factory(self) -> Callable[..., Environment] | None: ...

    def bind(self, hooks: RunnerHooks) -> None:
        """Take the orchestrator's bookkeeping (before any group runs)."""
        ...

    async def run_group(
        self,
        task: Any,
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

        ``prepared``: its members already INIT'ed (:meth:`init_group`); without an
        ``agent_config`` the turn budget follows ``rollout.max_turns_schedule``;
        ``run_seed`` (default ``rollout.seed``) seeds the members' sampling; with
        ``min_usable``, the members left once that many ended usable are cancelled.
        """
        ...

    async def init_group(self, task: Any, size: int) -> list[InitResult]:
        """INIT ``size`` members of a group of ``task`` ahead of admission (``ValueError``
        where environments are made elsewhere)."""
        ...

    async def close_members(self, members: list[InitResult | BaseException]) -> None:
        """Close the environments of INIT results never run."""
        ...

    def set_version(self, version: int) -> None:
        """The learner published ``version``."""
        ...

    def checkpoint_state(self, pending: Iterable[int]) -> dict[str, Any] | None:
        """What a checkpoint keeps of this runner, given the group indices not yet trained
        on (``pending``); None: nothing."""
        ...

    def restore_state(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`checkpoint_state` (before production starts)."""
        ...

    async def close(self) -> None:
        """Let go of what the runner holds (connections, background calls)."""
        ...
