"""The trainer's side of rollout as a service: groups run on ``serve-rollout`` nodes.

:class:`ServiceEpisodeRunner` has the ``run_group`` of
:class:`~tunix_agentic.rollout.episode.EpisodeRunner`, so the
:class:`~tunix_agentic.rollout.orchestrator.RolloutOrchestrator` keeps its task
stream, staleness pacing, filters and evaluation unchanged and only *running a
group* moves to the nodes (``orch.episodes = ServiceEpisodeRunner(...)``).

Each group is one :class:`~tunix_agentic.rollout.service.wire.GroupRequest`,
placed on the node with the fewest members in flight (ProRL's min-heap, on this
trainer's live counts) and long-polled there. Faults:

* a node that stops answering (connection refused, 5xx, a poll that overruns) is
  taken out; its unfinished groups are submitted again on the others with the
  same id and body (same task, same seeds); it is taken back when its
  ``/health`` answers;
* ``lost`` (the node restarted before the group finished): submitted again;
* no node up for ``rollout.backend_wait_s``: the run stops with
  :class:`~tunix_agentic.rollout.episode.InfraFailureError`.

Every group ends with exactly one outcome here: the first answer a
``run_group`` call gets is its result. Infrastructure failures stay out of group
statistics as in-process (``Group.dropped`` / ``Group.lost``, counted in
``stats["infra_failures"]``).

Group ids are ``{run_id}-{g|sNg}{index}-v{version}-{task_id}``: a resubmission
(failover, restart of the trainer within the run) has the same id and body, and
another run on the same nodes never meets this run's groups. Production groups
this runner returned are kept until :meth:`checkpoint_state` no longer lists
them, so a checkpoint carries the finished groups not yet trained on and a
resumed run trains on them instead of generating them again.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import aiohttp

from tunix_agentic.agent.loop import AgentConfig
from tunix_agentic.metrics.sink import MetricsSink, NullMetrics
from tunix_agentic.rollout.config import RolloutConfig
from tunix_agentic.rollout.episode import (
    PRODUCTION_STREAM,
    Group,
    InfraFailureError,
    InitResult,
)
from tunix_agentic.rollout.service.node_client import GroupNotFound, NodeClient, NodeUnavailable
from tunix_agentic.rollout.service.wire import (
    GroupRequest,
    SamplingSpec,
    SeedSpec,
    group_from_json,
    group_to_json,
)
from tunix_agentic.serving.http import API_KEY_ENV
from tunix_agentic.trajectory import Trajectory

_log = logging.getLogger(__name__)

# A long poll may take this much longer than its wait_s before the node counts as silent.
_POLL_GRACE_S = 30.0


@dataclasses.dataclass
class NodeState:
    """One rollout node as the runner sees it: up or taken out, members it runs for us."""

    url: str
    client: NodeClient
    up: bool = True
    in_flight: int = 0  # members of groups placed here and not yet answered
    groups_done: int = 0
    taken_out: int = 0  # times it stopped answering


class ServiceEpisodeRunner:
    """Runs groups on rollout nodes; a drop-in for the orchestrator's ``EpisodeRunner``.

    ``urls``: the nodes; ``api_key``: theirs (default ``$TUNIX_AGENTIC_API_KEY``).
    ``config``: the run's rollout settings (group size, seed, ``max_turns_schedule``,
    ``backend_wait_s``, ``service.poll_s`` / ``health_every_s``); ``agent_config``: the
    sampling and turn budget of production groups. ``stats``/``fail``/``metrics`` are the
    orchestrator's (see :meth:`attach`). ``run_id`` names this run's groups on the nodes
    (default: a fresh one; :meth:`restore_state` takes the checkpoint's). ``engine_urls``:
    engines every node is told to use (again after it restarts); ``own_engines``: they
    are this run's (the trainer's served engine), taken off the nodes by :meth:`close`.

    Call :meth:`close` when done (it cancels the health watches and closes the HTTP
    session); groups still running on the nodes are cancelled by the orchestrator's
    ``stop`` cancelling their ``run_group`` calls.
    """

    def __init__(
        self,
        urls: Iterable[str],
        *,
        agent_config: AgentConfig,
        config: RolloutConfig,
        api_key: str | None = None,
        metrics: MetricsSink | None = None,
        stats: dict[str, int] | None = None,
        fail: Callable[[Exception], None] | None = None,
        run_id: str | None = None,
        engine_urls: Iterable[str] = (),
        own_engines: bool = False,
        weights_of: Callable[[int], str | None] | None = None,
    ):
        urls = list(urls)
        if not urls:
            raise ValueError("ServiceEpisodeRunner needs at least one node URL")
        self.agent_config = agent_config
        self.config = config
        self.metrics = NullMetrics() if metrics is None else metrics
        self.stats = {} if stats is None else stats
        self._fail = fail or (lambda exc: None)
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.api_key = api_key or os.environ.get(API_KEY_ENV) or None
        self._urls = urls
        self.engine_urls = list(engine_urls)
        self.own_engines = own_engines
        # Where the engines loaded a version's weights from (None: unknown), told to the
        # nodes with the version so they can push it to an engine that restarted.
        self._weights_of = weights_of or (lambda version: None)
        self.nodes: list[NodeState] = []
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        self._infra_streak = 0
        self._up_changed = asyncio.Event()
        self._watches: dict[str, asyncio.Task] = {}
        self._background: set[asyncio.Task] = set()
        self.version = 0
        # Production groups returned, by index, until a checkpoint no longer lists them.
        self._finished: dict[int, Group] = {}
        # From a checkpoint: finished groups to hand back instead of running them again.
        self._restored: dict[int, Group] = {}
        # How each group ended, in order: (group id, "done" | "failed" | "cancelled" |
        # "restored"); one entry per run_group call.
        self.outcomes: list[tuple[str, str]] = []
        # Faults met: submissions again after a node stopped answering or lost a group.
        self.counts = collections.Counter()

    # ------------------------------------------------------------ set-up
    def attach(self, orchestrator: Any) -> ServiceEpisodeRunner:
        """Take ``orchestrator``'s metrics, stats and failure path, and become its episode
        runner (``orchestrator.episodes``). Returns self."""
        self.metrics = orchestrator.metrics
        self.stats = orchestrator.stats
        self._fail = orchestrator._fail
        self.version = orchestrator.version
        orchestrator.episodes = self
        return self

    def _ensure_nodes(self) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession()
            self.nodes = [
                NodeState(url, NodeClient(url, api_key=self.api_key, session=self._session))
                for url in self._urls
            ]

    async def connect(self) -> None:
        """Greet every node: hand it ``engine_urls`` (``POST /v1/engines``) and the policy
        version. A node that does not answer is taken out (and greeted when it is back)."""
        self._ensure_nodes()
        for node in self.nodes:
            try:
                await self._greet(node)
            except NodeUnavailable as exc:
                self._take_out(node, exc)

    async def _greet(self, node: NodeState) -> None:
        for url in self.engine_urls:
            await node.client.add_engine(url)
        await node.client.set_policy(self.version, self._weights_of(self.version))

    async def close(self) -> None:
        """Stop the health watches and background calls, take the run's own engines off the
        nodes that are up (best effort), close the HTTP session."""
        self._closed = True
        if self._background:  # cancellations of groups nobody waits for: let them be sent
            await asyncio.wait(set(self._background), timeout=5.0)
        pending = [*self._watches.values(), *self._background]
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        self._watches.clear()
        if self._session is not None and self.own_engines:
            await asyncio.gather(
                *(
                    _quietly(node.client.remove_engine(url))
                    for node in self.nodes
                    if node.up
                    for url in self.engine_urls
                )
            )
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def env_factory(self) -> None:
        """Environments are made on the nodes (from their run config)."""
        return None

    @env_factory.setter
    def env_factory(self, factory: Any) -> None:
        raise ValueError("with rollout.service.urls the nodes make the environments")

    # ----------------------------------------------------------- versions
    def set_version(self, version: int) -> None:
        """The learner published ``version``: tell every node that is up (in the
        background; a node taken back later is told when it is)."""
        self.version = version
        self._ensure_nodes()
        for node in self.nodes:
            if node.up:
                self._in_background(self._tell_version(node))

    async def _tell_version(self, node: NodeState) -> None:
        try:
            await node.client.set_policy(self.version, self._weights_of(self.version))
        except NodeUnavailable as exc:
            self._take_out(node, exc)

    def _in_background(self, coro) -> None:
        if self._closed:
            coro.close()
            return
        t = asyncio.get_running_loop().create_task(coro)
        self._background.add(t)
        t.add_done_callback(self._background.discard)

    # --------------------------------------------------------- checkpoint
    def checkpoint_state(self, pending: Iterable[int]) -> dict[str, Any]:
        """JSON-able: the run id and the finished groups among ``pending`` (the
        orchestrator's untrained indices); forgets the finished groups not listed."""
        pending = set(pending)
        self._finished = {i: g for i, g in self._finished.items() if i in pending}
        # Restored groups not asked for again yet are still finished and untrained.
        kept = {i: g for i, g in self._restored.items() if i in pending} | self._finished
        return {
            "run_id": self.run_id,
            "finished": [group_to_json(g) for _, g in sorted(kept.items())],
        }

    def restore_state(self, state: dict[str, Any]) -> None:
        """Continue a run from :meth:`checkpoint_state` (before production starts): the same
        group ids, and its finished groups handed back when their index runs again."""
        self.run_id = str(state["run_id"])
        self._restored = {}
        for obj in state.get("finished", []):
            group = group_from_json(obj)
            self._restored[group.index] = group

    # -------------------------------------------------------------- groups
    async def init_group(self, task: Any, size: int) -> list[InitResult]:
        raise ValueError("rollout.prefetch_groups must be 0 with rollout.service.urls")

    async def close_members(self, members: list[Any]) -> None:
        """Nothing to close here: the nodes own the environments."""

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
    ) -> Group:
        """Run group ``index`` of seed ``stream`` on ``task`` on a node, admitted under
        ``version``; waits for its one outcome (failing over between nodes)."""
        if prepared is not None:
            raise ValueError("rollout.prefetch_groups must be 0 with rollout.service.urls")
        task_id = str(getattr(task, "task_id", index))
        if stream == PRODUCTION_STREAM:
            kept = self._restored.pop(index, None)
            if kept is not None and str(getattr(kept.task, "task_id", "")) == task_id:
                self.outcomes.append((kept.group_id, "restored"))
                kept = dataclasses.replace(kept, task=task)
                self._finished[index] = kept
                return kept
        g = group_size or self.config.group_size
        if agent_config is None:
            turns = self.config.max_turns_at(version, self.agent_config.max_turns)
            agent_config = dataclasses.replace(self.agent_config, max_turns=turns)
            self.metrics.gauge("rollout/max_turns", turns)
        prefix = "g" if stream == PRODUCTION_STREAM else f"s{stream}g"
        request = GroupRequest(
            group_id=f"{self.run_id}-{prefix}{index}-v{version}-{task_id}",
            num_samples=g,
            policy_version=version,
            task=task,
            sampling=SamplingSpec(
                temperature=agent_config.temperature,
                top_p=agent_config.top_p,
                top_k=agent_config.top_k,
                max_tokens=agent_config.max_new_tokens,
            ),
            max_turns=agent_config.max_turns,
            seed=SeedSpec(run_seed=self.config.seed, stream=stream, index=index),
            agent=self.config.service.agent,
        )
        group = await self._run_request(request)
        # The orchestrator's bookkeeping is by its own index and version.
        group = dataclasses.replace(
            group, group_id=request.group_id, index=index, task=task, admitted_version=version
        )
        self._record(group)
        if stream == PRODUCTION_STREAM:
            self._finished[index] = group
        return group

    def _record(self, group: Group) -> None:
        """What the in-process runner would have counted for ``group``'s episodes; stops
        the run (InfraFailureError) after ``rollout.max_infra_failures_in_a_row`` episodes
        in a row, in completion order, ended on infrastructure faults."""
        m = self.metrics
        if group.trajectories:
            self._infra_streak = 0
        elif group.dropped:
            self._infra_streak += len(group.dropped)
            if self._infra_streak >= self.config.max_infra_failures_in_a_row:
                last = group.dropped[-1]
                self._fail(
                    InfraFailureError(
                        f"{self._infra_streak} episodes in a row failed on infrastructure on "
                        f"the rollout nodes; the last ({last.episode_id}): {last.status}: "
                        f"{last.error}"
                    )
                )
        for traj in [*group.trajectories, *group.dropped]:
            _count_episode(m, traj)
        if group.dropped:
            self.stats["infra_failures"] = self.stats.get("infra_failures", 0) + len(group.dropped)
            m.count("rollout/infra_failures", len(group.dropped))
            retries = len(group.dropped) - group.lost
            if retries > 0:
                self.stats["infra_retries"] = self.stats.get("infra_retries", 0) + retries
                m.count("rollout/infra_retries", retries)

    async def _run_request(self, request: GroupRequest) -> Group:
        """Submit ``request`` and wait for its outcome, moving it to another node whenever
        the one running it stops answering or reports it lost."""
        n = request.num_samples
        while True:
            if self._closed:
                raise RuntimeError("the rollout service client is closed")
            node = await self._place()
            node.in_flight += n
            try:
                outcome = await self._on_node(node, request)
            except NodeUnavailable as exc:
                self._take_out(node, exc)
                # A node that answered 5xx or too late may still be running it: the
                # group's outcome is the one from where it goes now.
                self._in_background(_quietly(node.client.cancel(request.group_id)))
                self._note("resubmitted")
                continue
            finally:
                node.in_flight -= n
            if outcome is None:  # lost by a restarted node: again, same id and body
                self._note("lost")
                self._note("resubmitted")
                continue
            node.groups_done += 1
            self.outcomes.append((request.group_id, outcome[0]))
            return outcome[1]

    async def _on_node(self, node: NodeState, request: GroupRequest) -> tuple[str, Group] | None:
        """One attempt on ``node``: ``(status, group)`` once it ended, None if lost (or
        unknown: a node restarted on a fresh state dir). Raises NodeUnavailable when the
        node does not answer."""
        poll = self.config.service.poll_s
        try:
            await _bounded(node.client.submit(request), poll + _POLL_GRACE_S, node)
            while True:
                got = await _bounded(
                    node.client.get(request.group_id, wait_s=poll, members=False),
                    poll + _POLL_GRACE_S,
                    node,
                )
                status = got.get("status")
                if status == "done":
                    return "done", group_from_json(got["group"])
                if status == "lost":
                    return None
                if status in ("failed", "cancelled"):
                    self._note(status)
                    return status, _failed_group(request, status, got.get("error"))
        except GroupNotFound:
            return None
        except asyncio.CancelledError:
            # Production stopped: the node need not finish what nobody will read.
            self._in_background(_quietly(node.client.cancel(request.group_id)))
            raise

    # ----------------------------------------------------------- placement
    async def _place(self) -> NodeState:
        """The node that is up with the fewest members in flight; waits (up to
        ``rollout.backend_wait_s``) while none is up."""
        self._ensure_nodes()
        deadline = time.monotonic() + self.config.backend_wait_s
        while True:
            up = [node for node in self.nodes if node.up]
            if up:
                return min(up, key=lambda node: node.in_flight)
            left = deadline - time.monotonic()
            if left <= 0:
                exc = InfraFailureError(
                    f"no rollout node answered for {self.config.backend_wait_s}s "
                    f"(rollout.backend_wait_s): {', '.join(self._urls)}"
                )
                self._fail(exc)
                raise exc
            self._up_changed.clear()
            try:
                async with asyncio.timeout(left):
                    await self._up_changed.wait()
            except TimeoutError:
                pass

    def _take_out(self, node: NodeState, why: Exception) -> None:
        """``node`` stopped answering: no new groups go there until its /health answers."""
        if not node.up or self._closed:
            return
        node.up = False
        node.taken_out += 1
        _log.warning("rollout node %s taken out: %s", node.url, why)
        self._note("nodes_taken_out")
        self._watches[node.url] = asyncio.get_running_loop().create_task(self._watch(node))

    async def _watch(self, node: NodeState) -> None:
        """Ask a node taken out for /health until it answers, then greet it again (a
        restarted node knows neither the engines nor the version) and take it back."""
        while True:
            await asyncio.sleep(self.config.service.health_every_s)
            if not await node.client.health():
                continue
            try:
                await self._greet(node)
            except NodeUnavailable:
                continue
            break
        node.up = True
        self._watches.pop(node.url, None)
        _log.warning("rollout node %s taken back", node.url)
        self._note("nodes_taken_back")
        self._up_changed.set()

    def _note(self, what: str) -> None:
        self.counts[what] += 1
        self.metrics.count(f"service/{what}")

    def status(self) -> list[dict[str, Any]]:
        """Each node: url, up, members in flight, groups done, times taken out."""
        self._ensure_nodes()
        return [
            {
                "url": n.url,
                "up": n.up,
                "in_flight": n.in_flight,
                "groups_done": n.groups_done,
                "taken_out": n.taken_out,
            }
            for n in self.nodes
        ]


async def _bounded(coro, limit_s: float, node: NodeState) -> Any:
    """``await coro`` within ``limit_s``; past it the node counts as not answering."""
    try:
        async with asyncio.timeout(limit_s):
            return await coro
    except TimeoutError:
        raise NodeUnavailable(f"{node.url} did not answer within {limit_s:.0f}s") from None


async def _quietly(coro) -> None:
    try:
        await coro
    except Exception:  # best effort: the node may be gone
        pass


def _failed_group(request: GroupRequest, status: str, error: Any) -> Group:
    """A group the node ended without a result: every member lost to infrastructure
    (never scored, never trained on), its reason kept in ``dropped``."""
    _log.warning("group %s %s on its node: %s", request.group_id, status, error)
    traj = Trajectory(
        task_id=str(getattr(request.task, "task_id", request.group_id)),
        episode_id=f"{request.group_id}-{status}",
        task_name=str(getattr(request.task, "task_name", "default")),
        group_id=request.group_id,
    )
    traj.status, traj.error = "env_error", f"group {status} on its node: {error}"
    return Group(
        request.group_id,
        request.seed.index,
        request.task,
        request.policy_version,
        [],
        [traj],
        lost=request.num_samples,
    )


def _count_episode(metrics: MetricsSink, traj: Trajectory) -> None:
    """The per-episode figures the agent loop and episode runner record in process."""
    metrics.count("rollout/episodes")
    metrics.count(f"rollout/status/{traj.status}")
    for step in traj.steps:
        if "model_s" in step.timings:
            metrics.add_time("model_call", step.timings["model_s"])
        metrics.count("tokens/generated", len(step.action_ids))
        if "env_s" in step.timings:
            metrics.add_time("env_step", step.timings["env_s"])
        for call in step.tool_calls:
            metrics.add_time(f"tool/{call.get('name', '?')}", float(call.get("seconds", 0.0)))
