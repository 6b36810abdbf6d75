"""Episodes recorded by the OpenAI endpoint: what each call saw and sampled, token for token.

An episode is the pair of its id and its token: a client's ``X-Episode-Id`` with the
``X-Episode-Token`` it chose (16-200 characters) or, when a call sends none, one the server
makes (``secrets``) and answers in the ``X-Episode-Token`` header. Only that token's holder
continues, reads, rewards or closes it: another client naming the same id with another (or
no) token gets an episode of its own, and never sees the first (its id is namespaced by
the token; the store keys episodes by a hash of both, :func:`episode_key`). Members of
external groups get a server-made id and token from their claim.

An episode is opened by the first chat call of its id and token that records, and closed
by ``POST /v1/episodes/{id}/reward``; a call that fails (no engine, a 503) opens nothing.
:class:`EpisodeStore` bounds what it holds: at most ``max_open`` open episodes and
``max_open_per_client`` per client (its API key, else its address; a new one beyond either
is refused with 429 naming the cap; claimed members of external groups are not counted,
so a flood of ad-hoc episodes cannot shut them out), each at most
``max_calls`` calls and ``max_tokens`` recorded ids (413 beyond), an open episode idle
for ``idle_timeout_s`` is dropped, and closed episodes wait to be taken
(:meth:`EpisodeStore.take_closed`) for at most ``closed_ttl_s`` seconds and
``max_closed`` episodes (the oldest go first).

:func:`episode_trajectory` turns a closed episode into the learner's
:class:`~tunix_agentic.trajectory.Trajectory`: when every call's prompt extends the
previous call's prompt + completion, one whole-history trajectory (one learner row, the
loss mask on the completions only); otherwise every call is a step with its own context
(one learner row per call). :class:`ExternalEpisodes` groups closed episodes of one task
into a :class:`~tunix_agentic.rollout.episode.Group` with ``run_group``'s signature;
:class:`EpisodeOffers` runs a node's ``"agent": "external"`` groups: their members are
claimed by outside agents, which close them with a reward.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import json
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from tunix_agentic.envs.base import Task
from tunix_agentic.rollout.episode import Group
from tunix_agentic.rollout.openai_endpoint.schema import RequestError
from tunix_agentic.rollout.service.caps import TooMany
from tunix_agentic.trajectory import Step, Trajectory


@dataclasses.dataclass(frozen=True)
class EpisodeLimits:
    """Bounds of :class:`EpisodeStore` (see the module docstring)."""

    max_open: int = 4096
    max_open_per_client: int = 1024
    max_calls: int = 256
    max_tokens: int = 1 << 20
    idle_timeout_s: float = 900.0
    max_closed: int = 4096
    closed_ttl_s: float = 3600.0
    # A reward's ``info``, as JSON: kept with the closed episode and sent with its group, so
    # bounded (4,096 closed episodes hold at most 64 MiB of it).
    max_info_bytes: int = 16 << 10

    def __post_init__(self):
        for name in (
            "max_open",
            "max_open_per_client",
            "max_calls",
            "max_tokens",
            "max_closed",
            "max_info_bytes",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"episodes.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("idle_timeout_s", "closed_ttl_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"episodes.{name} must be > 0, got {getattr(self, name)}")


@dataclasses.dataclass
class Completion:
    """One sampled choice of a call: its ids (the stop token kept), the engine's logprobs
    and per-token policy versions, and the key of the assistant message it was returned as
    (:func:`~tunix_agentic.rollout.openai_endpoint.schema.message_key`)."""

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


TOKEN_PATTERN = re.compile(r"[A-Za-z0-9._~+/=-]{16,200}")


def new_token() -> str:
    """An unguessable episode token (or id part): 192 random bits."""
    return secrets.token_urlsafe(24)


def episode_key(episode_id: str, token: str) -> str:
    """What the store files an episode under: the id namespaced by its token (hashed, so
    a dictionary lookup's timing says nothing about a token)."""
    return hashlib.sha256(f"{episode_id}\0{token}".encode()).hexdigest()


@dataclasses.dataclass
class Episode:
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

    def to_json(self) -> dict[str, Any]:
        return {
            "episode_id": self.episode_id,
            "status": "closed" if self.closed else "open",
            "reward": self.reward,
            "task_id": self.task_id,
            "info": self.info,
            "calls": [
                {
                    "prompt_ids": c.prompt_ids,
                    "policy_version": c.policy_version,
                    "cut": c.cut,
                    "choices": [
                        {
                            "completion_ids": x.token_ids,
                            "logprobs": x.logprobs,
                            "versions": x.versions,
                            "finish_reason": x.finish_reason,
                            "unoffered_tool_calls": x.unoffered_tool_calls,
                            "constrained": x.constrained,
                        }
                        for x in c.completions
                    ],
                }
                for c in self.calls
            ],
        }


class EpisodeStore:
    """Open and closed episodes by :func:`episode_key`, within :class:`EpisodeLimits`
    (single event loop). ``reserved``: keys of claimed members, exempt from the caps."""

    def __init__(self, limits: EpisodeLimits = EpisodeLimits()):
        self.limits = limits
        self.open: dict[str, Episode] = {}
        self.closed: OrderedDict[str, tuple[Episode, float]] = OrderedDict()
        self.reserved: set[str] = set()
        self.expired = 0
        # Rewarded ad-hoc episodes with a task id that nobody grouped in time (own tasks).
        self.closed_expired = 0
        self._per_client: collections.Counter[str] = collections.Counter()
        self._closed_event = asyncio.Event()

    def _drop_open(self, key: str) -> Episode | None:
        episode = self.open.pop(key, None)
        if episode is not None and episode.client:
            self._per_client[episode.client] -= 1
            if self._per_client[episode.client] <= 0:
                del self._per_client[episode.client]
        return episode

    def sweep(self) -> None:
        """Drop idle open episodes and closed ones past their time (called on each access)."""
        now = time.monotonic()
        for key in [
            key
            for key, ep in self.open.items()
            if not ep.in_flight and now - ep.touched > self.limits.idle_timeout_s
        ]:
            self._drop_open(key)
            self.expired += 1
        while self.closed and (
            len(self.closed) > self.limits.max_closed
            or now - next(iter(self.closed.values()))[1] > self.limits.closed_ttl_s
        ):
            _, (episode, _) = self.closed.popitem(last=False)
            if _groupable(episode):
                self.closed_expired += 1

    def get(self, key: str) -> Episode | None:
        """The episode filed under ``key`` (:func:`episode_key`), open or closed."""
        self.sweep()
        if key in self.open:
            return self.open[key]
        found = self.closed.get(key)
        return found[0] if found else None

    def begin_call(self, episode_id: str, token: str, client: str = "") -> Episode:
        """The episode a call records into (made now if new: it is opened only once a call
        records, :meth:`end_call`); 409 if it is closed, 429 if ``max_open`` are open or
        ``client`` holds ``max_open_per_client``, 413 if it holds ``max_calls`` calls."""
        key = episode_key(episode_id, token)
        episode = self.get(key)
        if episode is None:
            if key not in self.reserved:
                self._check_caps(client)
            else:
                client = ""
            episode = self.open[key] = Episode(episode_id, key=key, client=client)
            if client:
                self._per_client[client] += 1
        if episode.closed:
            why = episode.info.get("withdrawn")
            raise RequestError(
                f"X-Episode-Id: episode {episode_id!r} is "
                + (f"withdrawn: {why}" if why else "closed"),
                409,
            )
        if len(episode.calls) >= self.limits.max_calls:
            raise RequestError(
                f"X-Episode-Id: episode {episode_id!r} holds {len(episode.calls)} calls, "
                f"the limit (close it with a reward)",
                413,
            )
        episode.touched = time.monotonic()
        episode.in_flight += 1
        return episode

    def _check_caps(self, client: str) -> None:
        unreserved = len(self.open) - sum(1 for k in self.reserved if k in self.open)
        if unreserved >= self.limits.max_open:
            raise RequestError(
                f"X-Episode-Id: {unreserved} episodes are open, the node's cap "
                "(episodes.max_open); close some with POST /v1/episodes/{id}/reward",
                429,
            )
        if self._per_client[client] >= self.limits.max_open_per_client:
            raise RequestError(
                f"X-Episode-Id: this client holds {self._per_client[client]} open episodes, "
                "the per-client cap (episodes.max_open_per_client); close some with "
                "POST /v1/episodes/{id}/reward",
                429,
            )

    def end_call(self, episode: Episode, call: Call | None) -> None:
        """Record ``call`` (None: the call failed; an episode no call recorded into is
        forgotten); 409 if the episode closed meanwhile, 413 if the call would take it past
        ``max_tokens``."""
        episode.in_flight -= 1
        episode.touched = time.monotonic()
        if call is None:
            if not episode.calls and not episode.in_flight and not episode.closed:
                if self.open.get(episode.key) is episode:
                    self._drop_open(episode.key)
            return
        if episode.closed:
            why = episode.info.get("withdrawn")
            raise RequestError(
                f"X-Episode-Id: episode {episode.episode_id!r} was "
                + (f"withdrawn ({why})" if why else "closed")
                + " while this call ran (not recorded)",
                409,
            )
        if episode.num_tokens + call.num_tokens > self.limits.max_tokens:
            raise RequestError(
                f"X-Episode-Id: episode {episode.episode_id!r} would hold more than "
                f"{self.limits.max_tokens} token ids (not recorded; close it with a reward)",
                413,
            )
        episode.calls.append(call)

    def close(
        self, key: str, reward: float, *, task_id: str | None, info: dict[str, Any]
    ) -> Episode:
        """Close the episode filed under ``key`` with its reward; again with the same
        reward answers the same, another reward is 409; 404 for an unknown (or expired)
        episode, or a token that is not its."""
        episode = self.get(key)
        if episode is None and key in self.reserved:  # claimed, no call recorded yet
            raise RequestError("the claimed episode has no recorded call", 409)
        if episode is None:
            raise RequestError(
                "episode not known (or expired, or X-Episode-Token is not its token)", 404
            )
        eid = episode.episode_id
        size = len(json.dumps(info, separators=(",", ":")))
        if size > self.limits.max_info_bytes:
            raise RequestError(
                f"info: {size:,} bytes of JSON; at most {self.limits.max_info_bytes:,}", 413
            )
        if episode.closed:
            if episode.info.get("withdrawn"):
                raise RequestError(
                    f"episode {eid!r} is withdrawn: {episode.info['withdrawn']}", 409
                )
            if episode.reward != reward:
                raise RequestError(
                    f"reward: episode {eid!r} was closed with reward {episode.reward}", 409
                )
            return episode
        if not _turns(episode):
            what = "finished call (its calls were cut)" if episode.calls else "recorded call"
            raise RequestError(f"episode {eid!r} has no {what}", 409)
        episode.closed, episode.reward = True, reward
        episode.task_id, episode.info = task_id, info
        self._drop_open(key)
        self.closed[key] = (episode, time.monotonic())
        self._closed_event.set()
        self.sweep()
        return episode

    def withdraw(self, episode_id: str, key: str, why: str) -> None:
        """Close an episode without a reward (made if unknown): later calls and rewards for
        it are refused with a 409 saying ``why``; nobody takes it as a result."""
        self.reserved.discard(key)
        episode = self._drop_open(key) or Episode(episode_id, key=key)
        if episode.closed:
            return
        episode.closed, episode.info = True, {"withdrawn": why}
        self.closed[key] = (episode, time.monotonic())
        self.sweep()

    def take_closed(self, task_id: str | None = None, limit: int | None = None) -> list[Episode]:
        """Remove and return closed episodes (of ``task_id`` if given), oldest first."""
        self.sweep()
        taken = []
        for key, (episode, _) in list(self.closed.items()):
            if limit is not None and len(taken) >= limit:
                break
            if episode.reward is None:  # withdrawn
                continue
            if task_id is None or episode.task_id == task_id:
                taken.append(episode)
                del self.closed[key]
        return taken

    def take_group(self, size: int) -> tuple[str, list[Episode]] | None:
        """``size`` rewarded ad-hoc episodes (not claimed members) closed under one task id,
        marked ``grouped``: of the task id whose ``size``-th episode closed first (oldest first
        within it). None while no task id has ``size``. Episodes closed without a ``task_id``
        are never taken. A grouped episode stays readable by its holder until it expires."""
        self.sweep()
        by_task: dict[str, list[Episode]] = {}
        for episode, _ in self.closed.values():
            if not _groupable(episode):
                continue
            members = by_task.setdefault(episode.task_id, [])
            members.append(episode)
            if len(members) == size:
                for member in members:
                    member.grouped = True
                return episode.task_id, members
        return None

    def count_waiting(self) -> dict[str, int]:
        """Rewarded ad-hoc episodes waiting to be grouped, by task id."""
        counts: collections.Counter[str] = collections.Counter()
        for episode, _ in self.closed.values():
            if _groupable(episode):
                counts[episode.task_id] += 1
        return dict(counts)

    def own_task_counts(self) -> dict[str, int]:
        """For a node's status: episodes ``waiting`` to be grouped, over ``task_ids``, and
        those that ``expired`` ungrouped."""
        waiting = self.count_waiting()
        return {
            "waiting": sum(waiting.values()),
            "task_ids": len(waiting),
            "expired": self.closed_expired,
        }

    def count_closed(self, task_id: str) -> int:
        return sum(
            1 for ep, _ in self.closed.values() if ep.task_id == task_id and ep.reward is not None
        )

    async def wait_closed(self) -> None:
        """Until another episode closes."""
        self._closed_event.clear()
        await self._closed_event.wait()


def _groupable(episode: Episode) -> bool:
    """A rewarded ad-hoc episode with a task id that no own-task group took yet."""
    return (
        episode.reward is not None
        and bool(episode.client)
        and episode.task_id is not None
        and not episode.grouped
    )


def _turns(episode: Episode) -> list[tuple[Call, Completion]]:
    return [(call, c) for call in episode.calls if not call.cut for c in call.completions]


def episode_trajectory(episode: Episode) -> Trajectory:
    """The learner's trajectory of a closed episode (see the module docstring).

    Chained: ``token_ids`` is the first prompt, then per call its completion and the ids
    the next prompt added (the observation: not trained). Not chained: every step carries
    its call's prompt as ``context_ids``. ``reward`` is the episode's; ``task_id`` the one
    given with the reward (else the episode id). Cut calls are left out (``info``
    counts them: ``cut_calls``).
    """
    turns = _turns(episode)
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


class ExternalEpisodes:
    """Closed episodes of an outside agent as groups, in place of an ``EpisodeRunner``.

    ``run_group(task, *, index, version, group_size, ...)`` waits until ``group_size``
    episodes closed with ``task_id == task.task_id`` and returns them as one
    :class:`Group` (the agent must run the trainer's tasks and name them in its reward
    call). ``timeout_s``: give up waiting with ``TimeoutError``.
    """

    def __init__(self, store: EpisodeStore, *, group_size: int, timeout_s: float | None = None):
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        self.store, self.group_size, self.timeout_s = store, group_size, timeout_s

    async def run_group(
        self, task: Any, *, index: int, version: int, group_size: int | None = None, **_: Any
    ) -> Group:
        g = group_size or self.group_size
        task_id = str(getattr(task, "task_id", task))
        async with asyncio.timeout(self.timeout_s):
            while self.store.count_closed(task_id) < g:
                await self.store.wait_closed()
        episodes = self.store.take_closed(task_id, limit=g)
        if not isinstance(task, Task):
            task = Task(task_id=task_id, prompt="")
        return Group(
            group_id=f"openai{index}-{task_id}",
            index=index,
            task=task,
            admitted_version=version,
            trajectories=[episode_trajectory(ep) for ep in episodes],
        )


async def own_task_group(
    store: EpisodeStore, size: int, *, group_id: str, index: int, version: int
) -> Group:
    """The next group of ``size`` episodes that agents ran on tasks of their own choosing
    (a rollout node's ``"agent": "own_tasks"`` groups): ad-hoc episodes, each closed with a
    reward and a ``task_id``, grouped by task id (:meth:`EpisodeStore.take_group`); waits
    until one task id has ``size``. The group's task is a bare
    :class:`~tunix_agentic.envs.base.Task` of that id (the node never saw the task itself);
    ``version`` is the version the group was admitted under (each token keeps the version
    that sampled it)."""
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    while (picked := store.take_group(size)) is None:
        await store.wait_closed()
    task_id, episodes = picked
    task = Task(task_id=task_id, prompt="")
    trajectories = []
    for member, episode in enumerate(episodes):
        traj = episode_trajectory(episode)
        traj.group_id = group_id
        traj.info.update(member=member, source="openai-own-task")
        trajectories.append(traj)
    return Group(group_id, index, task, version, trajectories)


# ------------------------------------------------------------- outside agents
_SEED_MOD = 1 << 63


@dataclasses.dataclass
class Offer:
    """One member attempt of an external group, as an outside agent claims it: ``claim``
    is what the agent is told besides the ids (task, sampling, turn budget), ``defaults``
    the chat-call values applied where a call omits them, ``seed`` its sampling seed."""

    episode_id: str
    group_id: str
    member: int
    attempt: int
    claim: dict[str, Any]
    defaults: dict[str, Any]
    seed: int
    token: str = dataclasses.field(default_factory=new_token, repr=False)
    claimed_at: float | None = None
    claimant: str = ""  # who claimed it (the endpoint's client identity)

    @property
    def key(self) -> str:
        return episode_key(self.episode_id, self.token)


class EpisodeOffers:
    """Members of ``"agent": "external"`` groups, offered to agents running elsewhere.

    :meth:`run_group` offers a group's members under server-made ids, each with its own
    token; an agent :meth:`claim`\\ s one (oldest first; it alone learns the token), makes
    its chat calls with ``X-Episode-Id`` and ``X-Episode-Token`` (:meth:`call_defaults` fills in the
    group's sampling and a per-call seed where a call omits them) and closes it with
    ``POST /v1/episodes/{id}/reward``. The group ends when every member is closed, each as
    :func:`episode_trajectory` (task id, task name and group id the group's). A claimed
    member with no call in flight and none for ``lease_s`` (``first_call_s`` until its
    first call; checked at least that often) is withdrawn (its agent's next call or reward
    gets a 409) and counted as an infrastructure fault (``dropped``, status ``timeout``):
    offered again under a fresh id up to ``retries`` times, then ``lost``; never scored. A
    client holds at most ``max_claims_per_client`` claimed members at once (a claim past it
    is :class:`~tunix_agentic.rollout.service.caps.TooMany`), so one client cannot take
    every member and sit on them. Single event loop.
    """

    def __init__(
        self,
        store: EpisodeStore,
        *,
        lease_s: float = 300.0,
        first_call_s: float = 60.0,
        max_claims_per_client: int = 256,
    ):
        if not lease_s > 0:
            raise ValueError(f"lease_s must be > 0, got {lease_s}")
        if not first_call_s > 0:
            raise ValueError(f"first_call_s must be > 0, got {first_call_s}")
        if max_claims_per_client < 1:
            raise ValueError(f"max_claims_per_client must be >= 1, got {max_claims_per_client}")
        self.store, self.lease_s = store, lease_s
        self.first_call_s = first_call_s  # never longer than lease_s (see first_lease_s)
        self.max_claims_per_client = max_claims_per_client
        self.offers: dict[str, Offer] = {}  # offered or claimed, by episode key
        self._queue: collections.deque[Offer] = collections.deque()
        self._offered = asyncio.Event()
        self.expired = 0

    def counts(self) -> dict[str, int]:
        """Members ``offered`` (waiting for an agent) and ``claimed``; leases ``expired``."""
        claimed = sum(1 for o in self.offers.values() if o.claimed_at is not None)
        return {
            "offered": len(self.offers) - claimed,
            "claimed": claimed,
            "expired": self.expired,
        }

    @property
    def first_lease_s(self) -> float:
        """How long a claim holds before its first call: ``first_call_s``, at most ``lease_s``."""
        return min(self.first_call_s, self.lease_s)

    def claimed_by(self, client: str) -> int:
        """Members ``client`` holds claimed now."""
        return sum(
            1 for o in self.offers.values() if o.claimed_at is not None and o.claimant == client
        )

    def _check_claims(self, client: str) -> None:
        held = self.claimed_by(client)
        if held >= self.max_claims_per_client:
            raise TooMany(
                f"this client holds {held} claimed members, the node's cap per client "
                f"(--max-claims); close some (POST /v1/episodes/ID/reward) before claiming more",
                "max_claims_per_client",
            )

    async def claim(self, wait_s: float = 0.0, client: str = "") -> Offer | None:
        """The oldest offered member, now claimed by ``client``; None when none is offered
        within ``wait_s`` seconds. :class:`~tunix_agentic.rollout.service.caps.TooMany`
        when ``client`` already holds ``max_claims_per_client``."""
        self._check_claims(client)
        deadline = time.monotonic() + wait_s
        while True:
            while self._queue:
                offer = self._queue.popleft()
                if self.offers.get(offer.key) is offer:  # not withdrawn meanwhile
                    try:
                        self._check_claims(client)  # another long poll of it took one
                    except TooMany:
                        self._queue.appendleft(offer)
                        raise
                    offer.claimed_at, offer.claimant = time.monotonic(), client
                    self.store.reserved.add(offer.key)  # not under the ad-hoc caps
                    return offer
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self._offered.clear()
            try:
                async with asyncio.timeout(left):
                    await self._offered.wait()
            except TimeoutError:
                return None

    def call_defaults(self, key: str, calls: int) -> dict[str, Any]:
        """Chat-call values for call number ``calls`` of the offered episode filed under
        ``key`` ({} for any other episode): the group's sampling and a seed of this member
        and call."""
        offer = self.offers.get(key)
        if offer is None:
            return {}
        return {**offer.defaults, "seed": (offer.seed + 1024 * calls) % _SEED_MOD}

    async def run_group(
        self,
        group_id: str,
        task: Any,
        *,
        index: int,
        version: int,
        num_samples: int,
        claim: dict[str, Any],
        defaults: dict[str, Any],
        seed_of: Callable[[int, int], int],
        retries: int = 1,
        min_usable: int | None = None,
    ) -> Group:
        """Offer ``num_samples`` members of ``task`` and wait until each is closed (or lost,
        see the class docstring); ``seed_of(member, attempt)`` seeds a member's calls.
        Cancelled (the group's timeout, a DELETE): its open members are withdrawn."""
        pending: dict[str, Offer] = {}
        done: list[Trajectory] = []
        dropped: list[Trajectory] = []
        lost = 0

        def offer(member: int, attempt: int) -> None:
            eid = f"ep-{secrets.token_urlsafe(16)}"  # unguessable; the group is in the claim
            o = Offer(eid, group_id, member, attempt, claim, defaults, seed_of(member, attempt))
            pending[o.key] = self.offers[o.key] = o
            self._queue.append(o)
            self._offered.set()

        for member in range(num_samples):
            offer(member, 0)
        try:
            while pending and not (min_usable and len(done) >= min_usable):
                now, wake = time.monotonic(), self.lease_s
                for key, o in list(pending.items()):
                    episode = self.store.get(key)
                    if episode is not None and episode.closed and episode.reward is not None:
                        del pending[key], self.offers[key]
                        self.store.reserved.discard(key)
                        done.append(_member_trajectory(episode, task, group_id, o))
                        continue
                    if o.claimed_at is None:  # a claim may come any moment: look again soon
                        wake = min(wake, self.first_lease_s)
                        continue
                    if episode is not None and episode.in_flight:
                        continue
                    # Until its first call a claim holds for first_call_s only.
                    lease, name = (
                        (self.lease_s, "lease_s")
                        if episode
                        else (self.first_lease_s, "first_call_s")
                    )
                    quiet = now - max(o.claimed_at, episode.touched if episode else 0.0)
                    if quiet < lease:
                        wake = min(wake, lease - quiet)
                        continue
                    del pending[key]
                    why = f"no call for {name}={lease:g}s after its claim"
                    self._withdraw(o, why)
                    self.expired += 1
                    dropped.append(_lost_trajectory(task, group_id, o, why))
                    if o.attempt < retries:
                        offer(o.member, o.attempt + 1)
                    else:
                        lost += 1
                if pending:
                    try:
                        async with asyncio.timeout(wake):
                            await self.store.wait_closed()
                    except TimeoutError:
                        pass
        finally:
            for o in pending.values():
                self._withdraw(o, "its group ended")
        if not isinstance(task, Task) and not dataclasses.is_dataclass(task):
            task = Task(task_id=str(task), prompt="")
        return Group(group_id, index, task, version, done, dropped, lost)

    def _withdraw(self, offer: Offer, why: str) -> None:
        self.offers.pop(offer.key, None)
        self.store.withdraw(offer.episode_id, offer.key, why)
        if len(self._queue) > 2 * len(self.offers) + 64:  # withdrawn before any claim
            self._queue = collections.deque(o for o in self._queue if self.offers.get(o.key) is o)


def _member_trajectory(episode: Episode, task: Any, group_id: str, offer: Offer) -> Trajectory:
    traj = episode_trajectory(episode)
    traj.task_id = str(getattr(task, "task_id", traj.task_id))
    traj.task_name = str(getattr(task, "task_name", "default"))
    traj.group_id = group_id
    traj.info.update(member=offer.member, attempt=offer.attempt)
    return traj


def _lost_trajectory(task: Any, group_id: str, offer: Offer, why: str) -> Trajectory:
    traj = Trajectory(
        task_id=str(getattr(task, "task_id", group_id)),
        episode_id=offer.episode_id,
        task_name=str(getattr(task, "task_name", "default")),
        group_id=group_id,
        info={"source": "openai", "member": offer.member, "attempt": offer.attempt},
    )
    traj.status, traj.error = "timeout", why
    return traj
