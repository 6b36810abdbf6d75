"""The trainer's side of rollout as a service: groups run on ``serve-rollout`` nodes.

:class:`ServiceEpisodeRunner` is a :class:`~tunix_agentic.rollout.group_runner.GroupRunner`,
as the in-process :class:`~tunix_agentic.rollout.episode.EpisodeRunner` is, so the
:class:`~tunix_agentic.rollout.orchestrator.RolloutOrchestrator` keeps its task
stream, staleness pacing, filters and evaluation unchanged and only *running a
group* moves to the nodes (``RolloutOrchestrator(ServiceEpisodeRunner(...), config)``).

Each group is one :class:`~tunix_agentic.rollout.wire.GroupRequest`,
placed on the node with the fewest members in flight (ProRL's min-heap, on this
trainer's live counts: :mod:`~tunix_agentic.rollout.client.node_pool`) and
long-polled there. Faults:

* a node that stops answering (connection refused, 5xx, a poll that overruns) is
  taken out; its unfinished groups are submitted again on the others with the
  same id and body (same task, same seeds); it is taken back when its
  ``/health`` answers;
* ``lost`` (the node restarted before the group finished): submitted again;
* no node up for ``rollout.backend_wait_s``: the run stops with
  :class:`~tunix_agentic.rollout.group.InfraFailureError`.

Every group ends with exactly one outcome here: the first answer a
``run_group`` call gets is its result. Infrastructure failures stay out of group
statistics as in-process (``Group.dropped`` / ``Group.lost``, counted in
``stats["infra_failures"]``).

Group ids are ``{run_id}-{g|sNg}{index}-v{version}-{task_id}-{tag}``, ``tag`` an HMAC of
the rest under the run's secret key (kept in its checkpoint): a resubmission (failover,
restart of the trainer within the run, a resumed run) has the same id and body, another
run on the same nodes never meets this run's groups, and nobody who sees one of its ids
(an agent claiming a member) can foresee the next to take it first. Production groups
this runner returned are kept until :meth:`checkpoint_state` no longer lists
them, so a checkpoint carries the finished groups not yet trained on and a
resumed run trains on them instead of generating them again.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import hmac
import logging
import secrets
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from tunix_agentic.agent.loop import AgentConfig
from tunix_agentic.metrics.sink import MetricsSink, NullMetrics
from tunix_agentic.rollout.client.node_client import GroupNotFound, NodeUnavailable
from tunix_agentic.rollout.client.node_pool import NodePool, NodeState
from tunix_agentic.rollout.config import RolloutConfig
from tunix_agentic.rollout.group import (
    PRODUCTION_STREAM,
    Group,
    InfraFailureError,
    InitResult,
    RunnerHooks,
)
from tunix_agentic.rollout.wire import (
    GroupRequest,
    SamplingSpec,
    SeedSpec,
    group_from_json,
    group_to_json,
)
from tunix_agentic.serving.http import resolve_api_key
from tunix_agentic.trajectory import TaskLike, Trajectory, task_key

_log = logging.getLogger(__name__)

# A long poll may take this much longer than its wait_s before the node counts as silent.
_POLL_GRACE_S = 30.0


class ServiceEpisodeRunner:
    """Runs groups on rollout nodes: the orchestrator's
    :class:`~tunix_agentic.rollout.group_runner.GroupRunner` with ``rollout.service.urls``.

    ``urls``: the nodes; ``api_key``: theirs (default ``$TUNIX_AGENTIC_API_KEY``);
    ``version``: the policy version :meth:`connect` tells them.
    ``config``: the run's rollout settings (group size, seed, ``max_turns_schedule``,
    ``backend_wait_s``, ``service.poll_s`` / ``health_every_s``); ``agent_config``: the
    sampling and turn budget of production groups. ``stats``/``fail``/``metrics``: the
    bookkeeping of a runner used on its own; an orchestrator hands over its own
    (:meth:`bind`). ``run_id`` names this run's groups on the nodes (default: a fresh
    one; :meth:`restore_state` takes the checkpoint's). ``engine_urls``:
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
        version: int = 0,
        api_key: str | None = None,
        metrics: MetricsSink | None = None,
        stats: dict[str, int] | None = None,
        fail: Callable[[Exception], None] | None = None,
        run_id: str | None = None,
        engine_urls: Iterable[str] = (),
        own_engines: bool = False,
        weights_of: Callable[[int], str | None] | None = None,
        engine_api: str = "sglang",
    ):
        self.agent_config = agent_config
        self.config = config
        self.metrics = NullMetrics() if metrics is None else metrics
        self.stats = {} if stats is None else stats
        self._fail = fail or (lambda exc: None)
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.id_key: str | None = secrets.token_hex(16)  # the tags' key; None: no tags
        self.api_key = resolve_api_key(api_key)
        self.engine_urls, self.engine_api = list(engine_urls), engine_api  # "sglang" or "vllm"
        self.own_engines = own_engines
        # Where a version's weights were loaded from (None: unknown), for the nodes to push.
        self._weights_of = weights_of or (lambda version: None)
        self.pool = NodePool(
            list(urls),
            api_key=self.api_key,
            wait_s=config.backend_wait_s,
            health_every_s=config.service.health_every_s,
            greet=self._greet,
            note=self._note,
        )
        self._closed = False
        self._connected = False
        self._infra_streak = 0
        self._background: set[asyncio.Task] = set()
        self.version = version  # the policy version the nodes are told (connect, set_version)
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
    def bind(self, hooks: RunnerHooks) -> None:
        """Take an orchestrator's metrics, stats and failure path (before any group runs)."""
        self.metrics, self.stats, self._fail = hooks.metrics, hooks.stats, hooks.fail

    @property
    def nodes(self) -> list[NodeState]:
        """The nodes, up or taken out (once a group or :meth:`connect` opened them)."""
        return self.pool.nodes

    async def connect(self) -> None:
        """Greet every node: hand it ``engine_urls`` (``POST /v1/engines``) and the policy
        version. A node that does not answer is taken out (and greeted when it is back)."""
        self.pool.open()
        self._connected = True
        for node in self.nodes:
            try:
                await self._greet(node)
            except NodeUnavailable as exc:
                self.pool.take_out(node, exc)

    def replace_engine(self, old: str, new: str) -> None:
        """The engine at ``old`` is now at ``new`` (restarted elsewhere): the nodes that are
        up swap it (in the background); a node greeted later is handed ``new``."""
        if old in self.engine_urls:
            self.engine_urls = [new if u == old else u for u in self.engine_urls]
            for node in self.nodes if self._connected else []:
                if node.up:
                    self._in_background(_swap_engine(self.pool, node, old, new, self.engine_api))

    async def _greet(self, node: NodeState) -> None:
        for url in self.engine_urls:
            await node.client.add_engine(url, self.engine_api)
        await node.client.set_policy(self.version, self._weights_of(self.version))

    async def close(self) -> None:
        """Stop the health watches and background calls, take the run's own engines off the
        nodes that are up (best effort), close the HTTP session."""
        self._closed = self.pool.closed = True
        if self._background:  # cancellations of groups nobody waits for: let them be sent
            await asyncio.wait(set(self._background), timeout=5.0)
        pending = list(self._background)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await self.pool.stop_watching()
        if self.pool.session is not None and self.own_engines:
            await asyncio.gather(
                *(
                    _quietly(node.client.remove_engine(url))
                    for node in self.nodes
                    if node.up
                    for url in self.engine_urls
                )
            )
        await self.pool.close_session()

    # ----------------------------------------------------------- versions
    def set_version(self, version: int) -> None:
        """The learner published ``version``: once connected, tell every node that is up
        (in the background; a node taken back later is told when it is, and a version
        the nodes were told already is not told again). Before :meth:`connect` the version
        is only kept: connecting tells it."""
        if version == self.version and self._connected:
            return
        self.version = version
        if not self._connected:
            return
        for node in self.nodes:
            if node.up:
                self._in_background(self._tell_version(node))

    async def _tell_version(self, node: NodeState) -> None:
        try:
            await node.client.set_policy(self.version, self._weights_of(self.version))
        except NodeUnavailable as exc:
            self.pool.take_out(node, exc)

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
            "id_key": self.id_key,
            "finished": [group_to_json(g) for _, g in sorted(kept.items())],
        }

    def restore_state(self, state: dict[str, Any]) -> None:
        """Continue a run from :meth:`checkpoint_state` (before production starts): the same
        group ids, and its finished groups handed back when their index runs again."""
        self.run_id = str(state["run_id"])
        self.id_key = state.get("id_key")  # None in an older checkpoint: its untagged ids
        self._restored = {}
        for obj in state.get("finished", []):
            group = group_from_json(obj)
            self._restored[group.index] = group

    def group_id(self, name: str) -> str:
        """The id of this run's group ``name`` (:func:`tagged_id`)."""
        return tagged_id(self.run_id, name, self.id_key)

    # -------------------------------------------------------------- groups
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
        """Run group ``index`` of seed ``stream`` on ``task`` on a node, admitted under
        ``version``; waits for its one outcome (failing over between nodes). ``run_seed``
        (default ``rollout.seed``) and ``min_usable`` go to the node with the group."""
        if prepared is not None:
            raise ValueError("rollout.prefetch_groups must be 0 with rollout.service.urls")
        task_id = task_key(task).id
        if stream == PRODUCTION_STREAM:
            kept = self._restored.pop(index, None)
            if kept is not None and task_key(kept.task).id == task_id:
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
        # Agents on their own tasks make training groups only: evaluation runs the node's
        # agent loop on the run's held-out tasks.
        kind = self.config.service.agent
        if kind == "own_tasks" and stream != PRODUCTION_STREAM:
            kind = "builtin"
        request = _request(
            self.group_id(f"{prefix}{index}-v{version}-{task_id}"),
            task,
            g,
            version,
            agent_config,
            SeedSpec(self.config.seed if run_seed is None else run_seed, stream, index),
            kind=kind,
            min_usable=min_usable,
        )
        group = await self._run_request(request)
        # The orchestrator's bookkeeping is by its own index and version; an own-task
        # group's task is the one its agents ran, not the one submitted.
        group = dataclasses.replace(
            group,
            group_id=request.group_id,
            index=index,
            task=group.task if kind == "own_tasks" else task,
            admitted_version=version,
        )
        self._record(group)
        if stream == PRODUCTION_STREAM:
            self._finished[index] = group
        return group

    def _record(self, group: Group) -> None:
        """What the in-process runner would have counted for ``group``'s episodes; stops
        the run (InfraFailureError) after ``rollout.max_infra_failures_in_a_row`` episodes
        in a row, in completion order, ended on infrastructure faults."""
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
        _count_group(self.metrics, self.stats, group)

    async def _run_request(self, request: GroupRequest) -> Group:
        """Submit ``request`` and wait for its outcome, moving it to another node whenever
        the one running it stops answering or reports it lost."""
        n = request.num_samples
        while True:
            if self._closed:
                raise RuntimeError("the rollout service client is closed")
            try:
                node = await self.pool.place()
            except InfraFailureError as exc:
                self._fail(exc)
                raise
            node.in_flight += n
            try:
                outcome = await self._on_node(node, request)
            except NodeUnavailable as exc:
                self.pool.take_out(node, exc)
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

    def _note(self, what: str) -> None:
        self.counts[what] += 1
        self.metrics.count(f"service/{what}")

    def status(self) -> list[dict[str, Any]]:
        """Each node: url, up, members in flight, groups done, times taken out."""
        return self.pool.status()


async def _bounded(coro, limit_s: float, node: NodeState) -> Any:
    """``await coro`` within ``limit_s``; past it the node counts as not answering."""
    try:
        async with asyncio.timeout(limit_s):
            return await coro
    except TimeoutError:
        raise NodeUnavailable(f"{node.url} did not answer within {limit_s:.0f}s") from None


async def _swap_engine(pool: NodePool, node: NodeState, old: str, new: str, api: str) -> None:
    await _quietly(node.client.remove_engine(old))
    try:
        await node.client.add_engine(new, api)
    except NodeUnavailable as exc:  # taken out: greeted with ``new`` when it is back
        pool.take_out(node, exc)


async def _quietly(coro) -> None:
    try:
        await coro
    except Exception:  # best effort: the node may be gone
        pass


def tagged_id(run_id: str, name: str, key: str | None) -> str:
    """``{run_id}-{name}-{tag}``, ``tag`` an HMAC of the rest under ``key`` (None: no tag):
    only the key's holder makes it."""
    base = f"{run_id}-{name}"
    if key is None:
        return base
    return f"{base}-{hmac.new(key.encode(), base.encode(), hashlib.sha256).hexdigest()[:16]}"


def _failed_group(request: GroupRequest, status: str, error: Any) -> Group:
    """A group the node ended without a result: every member lost to infrastructure
    (never scored, never trained on), its reason kept in ``dropped``."""
    _log.warning("group %s %s on its node: %s", request.group_id, status, error)
    key = task_key(request.task)
    traj = Trajectory(
        task_id=key.id,
        episode_id=f"{request.group_id}-{status}",
        task_name=key.name,
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


def _request(
    group_id: str,
    task: TaskLike,
    size: int,
    version: int,
    agent: AgentConfig,
    seed: SeedSpec,
    *,
    kind: str,
    min_usable: int | None,
) -> GroupRequest:
    """The body of group ``group_id``: ``size`` members on ``task`` under ``version`` with
    ``agent``'s sampling and turns, seeded by ``seed``, run by the node's ``kind`` of agent."""
    return GroupRequest(
        group_id=group_id,
        num_samples=size,
        policy_version=version,
        task=task,
        sampling=SamplingSpec(
            temperature=agent.temperature,
            top_p=agent.top_p,
            top_k=agent.top_k,
            max_tokens=agent.max_new_tokens,
        ),
        max_turns=agent.max_turns,
        seed=seed,
        min_usable=min_usable,
        agent=kind,
    )


def _count_group(metrics: MetricsSink, stats: dict[str, int], group: Group) -> None:
    """The per-episode figures of ``group`` and its infrastructure failures and retries, as
    the in-process runner counts them."""
    for traj in [*group.trajectories, *group.dropped]:
        _count_episode(metrics, traj)
    if group.dropped:
        stats["infra_failures"] = stats.get("infra_failures", 0) + len(group.dropped)
        metrics.count("rollout/infra_failures", len(group.dropped))
        retries = len(group.dropped) - group.lost
        if retries > 0:
            stats["infra_retries"] = stats.get("infra_retries", 0) + retries
            metrics.count("rollout/infra_retries", retries)


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
