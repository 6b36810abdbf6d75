"""A rollout node: groups submitted over HTTP, run by the EpisodeRunner against engines by URL.

``tunix-agentic serve-rollout`` serves a :class:`RolloutNode`. The run config given at
start fixes the environments (its task sources, ``env.*`` and sandbox), the tokenizer
and chat template, the agent and the rollout settings (stage pools, episode timeout,
infrastructure retries); engines are SGLang-compatible servers by URL behind an
:class:`~tunix_agentic.inference.pool.EnginePool`, added and removed at run time.

A group is ``queued`` until one of the node's ``max_groups`` slots frees (higher
``priority`` first, then submission order), ``running`` while its members go through
INIT / RUN / EVAL, then ends ``done``, ``cancelled`` or ``failed`` exactly once: the
outcome is appended to the write-ahead log (fsync) before anyone is told. A node
restarted on the same state dir answers its finished groups as before; those it had
accepted but not finished are ``lost`` (resubmit them with the same id and body).

Its HTTP API is :mod:`~tunix_agentic.rollout.service.node_http`; its engines
:mod:`~tunix_agentic.rollout.service.engines`. Nothing here imports JAX.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import dataclasses
import heapq
import itertools
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from tunix_agentic.agent.chat import ChatFormat
from tunix_agentic.agent.loop import AgentConfig
from tunix_agentic.data.run_inputs import RunInputsConfig, run_inputs
from tunix_agentic.data.sources import RunSources
from tunix_agentic.envs.base import (
    Environment,
    Task,
    available_envs,
    env_client_kwargs,
    env_tasks,
    get_env_factory,
    make_env,
    offered_keywords,
)
from tunix_agentic.envs.remote import type_name
from tunix_agentic.envs.sandbox import SandboxError, sweep_orphans
from tunix_agentic.metrics.sink import NullMetrics
from tunix_agentic.rollout.config import RolloutConfig
from tunix_agentic.rollout.episode import EpisodeRunner, Group, episode_seed
from tunix_agentic.rollout.openai_endpoint.api import CallPath, OpenAIConfig
from tunix_agentic.rollout.openai_endpoint.offers import EpisodeOffers, own_task_group
from tunix_agentic.rollout.service.caps import NodeCaps
from tunix_agentic.rollout.service.engines import EngineSet
from tunix_agentic.rollout.service.wal import OPERATOR, FinalRecord, GroupLog
from tunix_agentic.rollout.wire import (
    FINAL_STATUSES,
    MAX_NUM_SAMPLES,
    STATUSES,
    GroupRequest,
    GroupStatus,
    group_to_json,
    task_to_json,
    trajectory_from_json,
)
from tunix_agentic.trajectory import TaskLike, Trajectory, task_key

logger = logging.getLogger(__name__)

_CANCEL_WAIT_S = 60.0  # DELETE waits this long for a running group's environments to close


# ------------------------------------------------------------------ set-up
@dataclasses.dataclass(frozen=True)
class NodeSetup:
    """What a run config fixes on a node: chat template, agent and rollout settings, the
    task sources (and through them each source's environment), the model's vocabulary."""

    template: ChatFormat
    agent: AgentConfig
    rollout: RolloutConfig
    sources: RunSources
    env_name: str
    tool_timeout_s: float | None
    sandbox: Any
    seed: int
    vocab_size: int

    @property
    def max_groups(self) -> int:
        """Groups run at once: as many as fill the INIT, RUN and EVAL pools together at the
        config's group size, as in process, where a group's members move through the stages
        independently (a cap of one RUN pool's worth left half of a staleness-1 pipeline
        queued on the node while its RUN pool idled behind INIT and EVAL)."""
        r = self.rollout
        return max(1, (r.init_workers + r.run_workers + r.eval_workers) // r.group_size)

    def resolve_task(self, req: GroupRequest) -> Any:
        """The request's task: sent whole, or built from its ``task_ref`` by this node's
        sources (ValueError naming the field when the reference does not resolve)."""
        if req.task is not None:
            return copy.copy(req.task)  # its own object: environments are looked up by it
        ref, sources = req.task_ref, self.sources
        if ref.source not in sources.specs:
            raise ValueError(
                f"task_ref.source: no task source {ref.source!r} on this node "
                f"(sources: {', '.join(sources.specs)})"
            )
        source = sources.sources[ref.source]
        if ref.index >= source.num_tasks(ref.split):
            raise ValueError(
                f"task_ref.index: {ref.index} is past the {source.num_tasks(ref.split)} "
                f"{ref.split} tasks of {ref.source!r}"
            )
        # The offset shifts the source's train stream only; held-out tasks are drawn with
        # the run's seed, as the trainer's evaluation draws them.
        offset = sources.specs[ref.source].seed_offset if ref.split == "train" else 0
        seed = self.seed + offset
        task = source.task(ref.index, seed=seed, split=ref.split)
        if dataclasses.is_dataclass(task) and hasattr(task, "task_name"):
            return dataclasses.replace(task, task_name=ref.source)
        return copy.copy(task)  # its own object: environments are looked up by it

    def env_factory(self, req: GroupRequest) -> Callable[[Any], Environment]:
        """How the request's environments are made: the sources' own, or the named
        environment with only the keywords a client may set (ValueError otherwise)."""
        setup = self
        if req.env is None and not req.env_kwargs:
            return setup.sources.make_env
        name = req.env or setup.env_name
        if name not in available_envs():
            raise ValueError(
                f"env: unknown environment {name!r} (this node has {available_envs()})"
            )
        allowed = env_client_kwargs(name)
        for key in req.env_kwargs:
            if key not in allowed:
                raise ValueError(
                    f"env_kwargs.{key}: environment {name!r} takes only {sorted(allowed)} from "
                    "a client; the rest is the node operator's (serve-rollout --config)"
                )
        kwargs: dict[str, Any] = {}
        for src, spec in setup.sources.specs.items():
            if spec.env == name:
                kwargs = setup.sources.env_kwargs(src)
                break
        else:
            shared = {"tool_timeout": setup.tool_timeout_s, "sandbox": setup.sandbox}
            kwargs = offered_keywords(name, shared)
        kwargs.update(req.env_kwargs)
        return lambda _task: make_env(name, **kwargs)

    def agent_config(self, req: GroupRequest) -> AgentConfig:
        """The node's agent settings with the request's sampling and turn limits."""
        agent, s = self.agent, req.sampling
        if s.top_k is not None and s.top_k > self.vocab_size:
            raise ValueError(
                f"sampling.top_k must be at most the vocabulary size {self.vocab_size}"
            )
        turns = req.max_turns or self.rollout.max_turns_at(req.policy_version, agent.max_turns)
        changes = {
            "max_turns": turns,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": s.top_k,
            "max_new_tokens": s.max_tokens,
        }
        return dataclasses.replace(agent, **{k: v for k, v in changes.items() if v is not None})


class NodeRunConfig(RunInputsConfig, Protocol):
    """What a node reads of a :class:`~tunix_agentic.config.RunConfig` (not imported: the
    config imports this package)."""

    @property
    def rollout(self) -> RolloutConfig: ...
    @property
    def seed(self) -> int: ...


def setup_from_config(cfg: NodeRunConfig) -> NodeSetup:
    """The :class:`NodeSetup` of a loaded :class:`~tunix_agentic.config.RunConfig`, built
    as the trainer builds its own (:func:`~tunix_agentic.data.run_inputs.run_inputs`:
    tokenizer, chat template with all of ``agent``'s template options, task sources).
    ValueError naming the key when a piece cannot be built."""
    inputs = run_inputs(cfg)
    return NodeSetup(
        template=inputs.template,
        agent=cfg.agent,
        rollout=cfg.rollout,
        sources=inputs.sources,
        env_name=cfg.env.name,
        tool_timeout_s=cfg.env.tool_timeout_s,
        sandbox=cfg.env.sandbox,
        seed=cfg.seed,
        vocab_size=cfg.model.vocab_size,
    )


def openai_endpoint(setup: NodeSetup, engines: EngineSet) -> CallPath:
    """A node's OpenAI-compatible endpoint in front of its ``engines`` (routes mounted by
    :mod:`~tunix_agentic.rollout.service.node_http`): rendering with the node's chat
    template, parsing tool calls with its agent's parser, within its agent's token budget
    and its rollout's reward limit, at the policy version the engines serve."""
    return CallPath(
        engine=engines,
        chat_format=setup.template,
        version_of=lambda: engines.policy_version,
        config=OpenAIConfig(
            parser=setup.agent.parser,
            default_max_tokens=setup.agent.max_new_tokens,
            reward_limit=setup.rollout.reward_limit,
        ),
    )


def env_task_types() -> dict[str, type]:
    """The task classes a client may send, by wire name: ``envs.base.Task`` and the
    dataclasses of the modules defining the registered environments and task sources."""
    types: dict[str, type] = {type_name(Task): Task}
    modules = set()
    for name in available_envs():
        modules.add(getattr(get_env_factory(name), "__module__", None))
        source = env_tasks(name)
        if source is not None:
            modules.add(type(source).__module__)
    for module in filter(None, modules):
        for obj in vars(sys.modules.get(module, object())).values():
            if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == module:
                types[type_name(obj)] = obj
    return types


# ------------------------------------------------------------------ groups
class GroupIdConflict(Exception):
    """A submission whose group id names another request, or another client's group (the
    HTTP layer answers 409)."""


@dataclasses.dataclass
class _GroupState:
    request: GroupRequest
    body: dict[str, Any]
    seq: int
    status: GroupStatus = "queued"
    task: TaskLike | None = None
    agent: AgentConfig | None = None
    factory: Callable[[Any], Environment] | None = None
    answer: str | None = None  # the final answer as logged (JSON text), while cached
    members: str | None = None  # the learner's view of it (JSON text), built once on demand
    cursor: int | None = None
    offset: int = -1  # where the log holds its final record
    job: asyncio.Task | None = None
    cancel_requested: bool = False
    finishing: bool = False  # its outcome is being logged: past cancelling
    finished: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    submitted_at: float = dataclasses.field(default_factory=time.time)
    owner: str = OPERATOR  # who submitted it: only it and the operator may read it

    def readable_by(self, caller: str) -> bool:
        return caller == OPERATOR or caller == self.owner


def member_json(t: Trajectory) -> dict[str, Any]:
    """What the learner needs of one member, token exact: prompt and response ids, and
    over the response its loss mask, sampler logprobs and per-token policy versions;
    reward, per-step (process) rewards, status, error and timings. A response with tokens
    sampled under a grammar also lists which (``constrained``, 1 on those tokens: their
    logprobs are the masked distribution's; ``loss_mask`` trains on them, as the node's own
    learner does by default, and a reader that would rather not masks them with this)."""
    arrays = t.learner_arrays()
    p = t.prompt_len
    forced = arrays["constrained"][p:]
    member = {
        "episode_id": t.episode_id,
        "prompt_ids": [int(x) for x in t.token_ids[:p]],
        "response_ids": [int(x) for x in t.token_ids[p:]],
        "loss_mask": [int(x) for x in arrays["loss_mask"][p:]],
        "logprobs": [float(x) for x in arrays["old_logprobs"][p:]],
        "versions": [int(x) for x in arrays["versions"][p:]],
        "reward": float(t.reward),
        "step_rewards": [float(s.reward) for s in t.steps],
        "status": t.status,
        "error": t.error,
        "timings": dict(t.timings),
    }
    return member | ({"constrained": [int(x) for x in forced]} if forced.any() else {})


class _Broadcast:
    """Wakes every waiter once per :meth:`notify`: take :meth:`event` *before* looking at
    the state it announces, then wait on it (a fresh event after each notify)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def event(self) -> asyncio.Event:
        return self._event

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()


class _Answers:
    """The final answers of a node's groups: in completion order with their cursors, the
    newest ``keep`` held in memory and the others read back from the ``log`` when asked
    for (memory stays flat over a long run)."""

    def __init__(self, log: GroupLog, groups: dict[str, _GroupState], keep: int):
        self.log, self.groups, self.keep = log, groups, keep
        # (cursor, group_id, status) in completion order (a lost group run again ends twice)
        self.finals: list[tuple[int, str, GroupStatus]] = []
        # Groups whose final answer is held in memory, oldest first.
        self._cached: collections.OrderedDict[str, None] = collections.OrderedDict()

    def settle(self, st: _GroupState, rec: FinalRecord, text: str | None) -> None:
        """``st`` ended as ``rec`` says; its answer ``text`` held, if given."""
        st.status, st.cursor, st.offset = rec.status, rec.cursor, rec.offset
        st.answer = st.members = None
        if text is not None:
            self._cache(st, text)
        self.finals.append((rec.cursor, rec.group_id, rec.status))

    def _cache(self, st: _GroupState, answer: str) -> None:
        gid = st.request.group_id
        st.answer = answer
        self._cached[gid] = None
        self._cached.move_to_end(gid)
        while len(self._cached) > self.keep:
            old = self.groups.get(self._cached.popitem(last=False)[0])
            if old is not None:
                old.answer = old.members = None

    async def text(self, st: _GroupState, *, members: bool = True) -> str:
        """The JSON text of ``{group_id, status, cursor?, error?, members?, group?}``
        (``error`` once final; ``group`` once ``done``, and with ``members`` the learner's
        view of its trajectories). Read back from the log when no longer held in memory;
        the group's text is the one logged, never encoded again."""
        head = _dumps(_summary(st))
        if st.status not in FINAL_STATUSES:
            return head
        if st.answer is None:
            answer = await asyncio.to_thread(self.log.read_answer, st.offset)
            self._cache(st, _dumps(answer))
        text = st.answer
        if members and st.members is None and text.find('"group":') >= 0:
            group = json.loads(text).get("group")
            if group is not None:
                st.members = _dumps(
                    [member_json(trajectory_from_json(t)) for t in group.get("trajectories", [])]
                )
        parts = [head[:-1]]
        if members and st.members is not None:
            parts.append(f',"members":{st.members}')
        # The answer is an object that always holds "error": splice its fields in.
        return "".join(parts) + "," + text[1:]

    def done_since(self, cursor: int, limit: int, caller: str = OPERATOR) -> dict[str, Any]:
        """Final groups after ``cursor`` that ``caller`` may read, in completion order (at
        most ``limit``); the answer's ``cursor`` is past every group looked at."""
        start = _bisect_after(self.finals, cursor)
        if caller == OPERATOR:
            picked = self.finals[start : start + limit]
            last = picked[-1][0] if picked else cursor
        else:
            picked, last = [], cursor
            for c, g, s in self.finals[start:]:
                st = self.groups.get(g)
                if st is not None and st.readable_by(caller):
                    if len(picked) == limit:
                        break
                    picked.append((c, g, s))
                last = c
        groups = [{"group_id": g, "status": s, "cursor": c} for c, g, s in picked]
        return {"groups": groups, "cursor": last}


def _summary(st: _GroupState) -> dict[str, Any]:
    out: dict[str, Any] = {"group_id": st.request.group_id, "status": st.status}
    if st.cursor is not None:
        out["cursor"] = st.cursor
    return out


class RolloutNode:
    """Runs submitted groups (see the module docstring). ``await start()`` replays the
    state dir's log; ``await close()`` cancels what runs (nothing final is written for
    it: a restart reports it ``lost``) and closes engines and log. ``openai``: its
    OpenAI-compatible endpoint (default :func:`openai_endpoint`); ``offers``: its external
    groups' members, offered over that endpoint's store (default: ``caps``' claims)."""

    def __init__(
        self,
        setup: NodeSetup,
        engines: EngineSet,
        state_dir: str | Path,
        *,
        max_groups: int | None = None,
        keep_answers: int = 256,
        caps: NodeCaps | None = None,
        openai: CallPath | None = None,
        offers: EpisodeOffers | None = None,
    ):
        self.setup = setup
        self.caps = caps or NodeCaps()  # queued groups, inline task and log bytes
        self.keep_answers = keep_answers
        self.engines = engines
        self.log = GroupLog(state_dir)
        self.max_groups = max_groups or setup.max_groups
        engines.check_replies(vocab_size=setup.vocab_size)
        engines.wait_s = setup.rollout.backend_wait_s  # an engine restarting costs no episode
        self.stats: dict[str, int] = {"infra_failures": 0, "infra_retries": 0}
        self.fatal: str | None = None
        self._background: set[asyncio.Task] = set()
        self._factories: dict[int, Callable[[Any], Environment]] = {}
        self.runner = EpisodeRunner(
            engines,
            self._make_env,
            setup.template,
            setup.agent,
            setup.rollout,
            metrics=NullMetrics(),
            backend_health=None,
            spawn=self._spawn,
            fail=self._note_fatal,
            stats=self.stats,
        )
        self.groups: dict[str, _GroupState] = {}
        self.task_types = env_task_types()
        self._queue: list[tuple[int, int, str]] = []  # (-priority, seq, group_id)
        self._seq = itertools.count()
        self._running = 0
        self.answers = _Answers(self.log, self.groups, keep_answers)
        self._next_cursor = 1
        self._final_lock = asyncio.Lock()
        self.changed = _Broadcast()
        self.openai = openai or openai_endpoint(setup, engines)
        self.external = offers or EpisodeOffers(
            self.openai.store, max_claims_per_client=self.caps.max_claims_per_client
        )
        self.openai.call_defaults = self.external.call_defaults  # an offered member's sampling
        self.started_at = time.time()
        self._closing = False

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Replay the log: finished groups are served again; unfinished ones become
        ``lost`` (logged as such, so they are final with a cursor like any other).
        Sandbox directories a killed node left on this host are removed first (otherwise
        they stay until some process next starts a sandbox)."""
        try:
            swept = await asyncio.to_thread(sweep_orphans)
        except (SandboxError, OSError) as exc:  # not ours to fix: the next sandbox says so
            logger.warning("could not sweep orphaned sandboxes: %s", exc)
        else:
            if swept:
                logger.warning("removed %d sandboxes a dead process left", len(swept))
        replay = await asyncio.to_thread(self.log.open)
        if replay.torn_bytes:
            logger.warning(
                "cut a torn last line (%d bytes) off %s", replay.torn_bytes, self.log.path
            )
        for rec in replay.finals:
            st = self._replayed(rec.group_id, replay.bodies[rec.group_id])
            st.owner = replay.owners.get(rec.group_id, OPERATOR)
            self._settle(st, rec)  # answered from the log when asked for
            self.groups[rec.group_id] = st
        self._next_cursor = replay.next_cursor
        for gid in replay.unfinished:
            st = self.groups[gid] = self._replayed(gid, replay.bodies[gid])
            st.owner = replay.owners.get(gid, OPERATOR)
            await self._finish(st, "lost", error="the node restarted before the group finished")
        await self.engines.read_served_version()  # the policy until a trainer publishes one

    def _replayed(self, group_id: str, body: dict[str, Any]) -> _GroupState:
        """A logged group's state; its body is kept as logged (what a resubmission must
        equal) even when its task class is no longer importable here."""
        try:
            req = GroupRequest.from_json(body)
        except ValueError:
            n = body.get("num_samples") if isinstance(body.get("num_samples"), int) else 1
            req = GroupRequest(group_id, min(max(1, n), MAX_NUM_SAMPLES), task=Task(group_id, ""))
        return _GroupState(req, body, next(self._seq))

    async def close(self) -> None:
        self._closing = True
        jobs = [st.job for st in self.groups.values() if st.job is not None and not st.job.done()]
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
        for t in list(self._background):
            t.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.engines.close()
        self.log.close()

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def _note_fatal(self, exc: Exception) -> None:
        # In process this stops a run; a node keeps serving and says so in /v1/status.
        self.fatal = f"{type(exc).__name__}: {exc}"
        logger.error("rollout node: %s", self.fatal)

    def _make_env(self, task: TaskLike) -> Environment:
        return self._factories[id(task)](task)

    # ----------------------------------------------------------- submitting
    async def submit(self, req: GroupRequest, owner: str = OPERATOR) -> dict[str, Any]:
        """Accept ``req`` from ``owner`` (:data:`~.wal.OPERATOR` or a client's identity): its
        summary ``{group_id, status, cursor?}``. Same id and body: the same group (a ``lost``
        or ``cancelled`` one runs again: a trainer resumed, or moved it back here); another
        body, or another client's id: :class:`GroupIdConflict`. ValueError naming the field
        when the node cannot run it (unknown source or environment, refused keywords...);
        :class:`~.caps.TooMany` / :class:`~.caps.TooLarge` past one of :attr:`caps`."""
        body = req.to_json()
        known = self.groups.get(req.group_id)
        if known is not None:
            if not known.readable_by(owner):
                raise GroupIdConflict(f"group_id {req.group_id!r} is taken (use a new id)")
            if known.body != body:
                raise GroupIdConflict(
                    f"group_id {req.group_id!r} was submitted with another body "
                    "(a group id names one request; use a new id for another)"
                )
            if known.status not in ("lost", "cancelled"):
                return self.summary(known)
        self.caps.check_submit(body, len(self._queue), self.log.path)  # TooMany / TooLarge
        st = _GroupState(req, body, next(self._seq), owner=owner)
        st.task = self.setup.resolve_task(req)
        st.factory = self.setup.env_factory(req)
        st.agent = self.setup.agent_config(req)
        # Known before the log write: a concurrent submission of this id answers the same.
        previous, self.groups[req.group_id] = known, st
        try:
            await self.log.accepted(req.group_id, body, owner)
        except BaseException:
            if previous is None:
                del self.groups[req.group_id]
            else:
                self.groups[req.group_id] = previous
            raise
        heapq.heappush(self._queue, (-req.priority, st.seq, req.group_id))
        self._pump()
        return self.summary(st)

    # ------------------------------------------------------------- running
    def _pump(self) -> None:
        """Start queued groups, highest priority first, while slots are free."""
        while self._running < self.max_groups and self._queue:
            _, _, gid = heapq.heappop(self._queue)
            st = self.groups.get(gid)
            # A cancelled group stays "queued" while its final record is written (fsync):
            # never start it meanwhile (it would end a second time, "done").
            if st is None or st.status != "queued" or st.cancel_requested or st.finishing:
                continue
            st.status = "running"
            self._running += 1
            self._factories[id(st.task)] = st.factory
            st.job = asyncio.get_running_loop().create_task(self._run(st), name=f"group-{gid}")
            st.job.add_done_callback(lambda _job, st=st: self._job_done(st))

    def _job_done(self, st: _GroupState) -> None:
        # A callback, not a finally: a job cancelled before its first step runs no code.
        self._factories.pop(id(st.task), None)
        self._running -= 1
        if st.job is not None and not st.job.cancelled() and st.job.exception() is not None:
            logger.error("group %s: %r", st.request.group_id, st.job.exception())
        if not self._closing:
            self._pump()

    async def _run(self, st: _GroupState) -> None:
        req = st.request
        group: Group | None = None
        status: GroupStatus = "failed"
        error: str | None = None
        try:
            async with asyncio.timeout(req.timeout_s):
                if req.agent == "external":
                    group = await self._run_external(st)
                elif req.agent == "own_tasks":
                    group = await own_task_group(
                        self.openai.store,
                        req.num_samples,
                        group_id=req.group_id,
                        index=req.seed.index,
                        version=req.policy_version,
                    )
                else:
                    group = await self.runner.run_group(
                        st.task,
                        index=req.seed.index,
                        version=req.policy_version,
                        group_size=req.num_samples,
                        agent_config=st.agent,
                        stream=req.seed.stream,
                        run_seed=req.seed.run_seed,
                        min_usable=req.min_usable,
                    )
            status = "done"
        except TimeoutError:
            error = f"the group ran past its timeout_s={req.timeout_s:g}"
        except asyncio.CancelledError:
            if not st.cancel_requested:
                raise  # the node is stopping: nothing final (a restart says lost)
            status, error = "cancelled", "cancelled by DELETE"
        except Exception as exc:  # a bug or an environment's: this group's outcome
            error = f"{type(exc).__name__}: {exc}"
            logger.exception("group %s failed", req.group_id)
        await asyncio.shield(self._finish(st, status, group=group, error=error))

    async def _run_external(self, st: _GroupState) -> Group:
        """Offer the group's members to outside agents (``POST /v1/episodes/claim``) and
        wait until each is closed with a reward or lost (see ``EpisodeOffers``)."""
        req, seed = st.request, st.request.seed
        claim, defaults = _external_claim(st)
        return await self.external.run_group(
            req.group_id,
            st.task,
            index=seed.index,
            version=req.policy_version,
            num_samples=req.num_samples,
            claim=claim,
            defaults=defaults,
            seed_of=lambda m, a: episode_seed(seed.run_seed, seed.stream, seed.index, m, a),
            retries=self.setup.rollout.infra_retries,
            min_usable=req.min_usable,
        )

    async def _finish(
        self,
        st: _GroupState,
        status: GroupStatus,
        *,
        group: Group | None = None,
        error: str | None = None,
    ) -> None:
        """Log the outcome (fsync), then make it visible: cursor, waiters, events."""
        st.finishing = True
        answer: dict[str, Any] = {"error": error}
        if group is not None:
            try:
                answer["group"] = group_to_json(group)
            except (TypeError, ValueError) as exc:  # a task the wire cannot carry
                status, answer = "failed", {"error": f"the group cannot be sent: {exc}"}
        # Encoded once: the log's line and every answer about the group carry this text.
        text = _dumps(answer)
        async with self._final_lock:  # cursors follow the log's order
            rec = FinalRecord(st.request.group_id, status, self._next_cursor, answer)
            rec = dataclasses.replace(rec, offset=await self.log.finished(rec, text))
            self._next_cursor += 1
        self._settle(st, rec, text)

    def _settle(self, st: _GroupState, rec: FinalRecord, text: str | None = None) -> None:
        """Make ``rec`` visible; its answer is held in memory when ``text`` is given (a
        replayed one is read back from the log when first asked for)."""
        self.answers.settle(st, rec, text)
        st.finished.set()
        self.changed.notify()

    async def cancel(self, group_id: str) -> dict[str, Any] | None:
        """Cancel a group (idempotent): queued ones at once, running ones once their
        environments are closed and engine requests aborted. None if unknown."""
        st = self.groups.get(group_id)
        if st is None:
            return None
        if st.status in FINAL_STATUSES:
            return self.summary(st)
        if st.finishing or st.cancel_requested:  # ending already: wait for its outcome
            await asyncio.wait_for(st.finished.wait(), _CANCEL_WAIT_S)
            return self.summary(st)
        st.cancel_requested = True
        if st.status == "running" and st.job is not None:
            st.job.cancel()
            await asyncio.wait({st.job}, timeout=_CANCEL_WAIT_S)
        if not st.finishing:  # queued, or its job was cancelled before its first step
            await self._finish(st, "cancelled", error="cancelled by DELETE before it started")
        await asyncio.wait_for(st.finished.wait(), _CANCEL_WAIT_S)
        return self.summary(st)

    # ------------------------------------------------------------- answers
    def summary(self, st: _GroupState) -> dict[str, Any]:
        return _summary(st)

    async def answer_text(self, st: _GroupState, *, members: bool = True) -> str:
        """The JSON text of ``{group_id, status, cursor?, error?, members?, group?}`` (see
        :meth:`_Answers.text`)."""
        return await self.answers.text(st, members=members)

    async def answer(self, st: _GroupState, *, members: bool = True) -> dict[str, Any]:
        """:meth:`answer_text` as a dict."""
        return json.loads(await self.answer_text(st, members=members))

    def done_since(self, cursor: int, limit: int, caller: str = OPERATOR) -> dict[str, Any]:
        """Final groups after ``cursor`` that ``caller`` may read, in completion order (at
        most ``limit``)."""
        return self.answers.done_since(cursor, limit, caller)

    def status(self) -> dict[str, Any]:
        totals = {s: 0 for s in STATUSES}
        members_in_flight = 0
        for st in self.groups.values():
            totals[st.status] += 1
            if st.status in ("queued", "running"):
                members_in_flight += st.request.num_samples
        return {
            "policy_version": self.engines.policy_version,
            "max_groups": self.max_groups,
            "groups": totals,
            "members_in_flight": members_in_flight,
            "stages": self.runner.stage_load(),
            "engines": self.engines.health(),
            "infra_failures": self.stats.get("infra_failures", 0),
            "infra_retries": self.stats.get("infra_retries", 0),
            "fatal": self.fatal,
            "external": self.external.counts(),
            "own_tasks": self.openai.store.own_task_counts(),
            "cursor": self._next_cursor - 1,
            "uptime_s": time.time() - self.started_at,
            "pid": os.getpid(),
            "jax_loaded": "jax" in sys.modules,
        }


def _external_claim(st: _GroupState) -> tuple[dict[str, Any], dict[str, Any]]:
    """What an outside agent claiming a member of ``st``'s group is told (the claim's task,
    prompt, sampling, turn limit and policy version), and the sampling its calls get where
    they omit it (the group's agent settings)."""
    req, agent, task = st.request, st.agent, st.task
    assert agent is not None  # resolved when the group was accepted
    claim = {
        "task": task_to_json(task),
        "task_id": task_key(task).id,
        "prompt": str(getattr(task, "prompt", "")),
        "sampling": req.sampling.to_json(),
        "max_turns": agent.max_turns,
        "policy_version": req.policy_version,
    }
    defaults = {
        "temperature": agent.temperature,
        "top_p": agent.top_p,
        "top_k": agent.top_k,
        "max_tokens": agent.max_new_tokens,
    }
    return claim, defaults


def _bisect_after(finals: list[tuple[int, str, GroupStatus]], cursor: int) -> int:
    lo, hi = 0, len(finals)
    while lo < hi:
        mid = (lo + hi) // 2
        if finals[mid][0] <= cursor:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))
