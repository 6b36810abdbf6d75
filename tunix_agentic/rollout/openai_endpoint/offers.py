"""Groups of recorded episodes for a rollout node (host-side, no JAX).

:class:`EpisodeOffers` runs a node's ``"agent": "external"`` groups: their members are
offered under server-made ids, claimed by outside agents and closed with a reward.
:func:`own_task_group` groups the closed episodes of agents that chose their own tasks by
task id; :class:`ExternalEpisodes` waits for episodes closed on the trainer's tasks. Each
member becomes its trajectory (:func:`~.recording.episode_trajectory`). Single event loop.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import secrets
import time
from collections.abc import Callable
from typing import Any

from tunix_agentic.envs.base import Task
from tunix_agentic.rollout.episode import Group
from tunix_agentic.rollout.openai_endpoint.errors import TooManyClaims
from tunix_agentic.rollout.openai_endpoint.recording import Episode, episode_trajectory
from tunix_agentic.rollout.openai_endpoint.store import EpisodeStore, episode_key, new_token
from tunix_agentic.trajectory import TaskLike, Trajectory, task_key


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
        self, task: TaskLike, *, index: int, version: int, group_size: int | None = None, **_: Any
    ) -> Group:
        g = group_size or self.group_size
        task_id = task_key(task).id
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
    is :class:`~.errors.TooManyClaims`), so one client cannot take
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
            raise TooManyClaims(
                f"this client holds {held} claimed members, the node's cap per client "
                f"(--max-claims); close some (POST /v1/episodes/ID/reward) before claiming more"
            )

    async def claim(self, wait_s: float = 0.0, client: str = "") -> Offer | None:
        """The oldest offered member, now claimed by ``client``; None when none is offered
        within ``wait_s`` seconds. :class:`~.errors.TooManyClaims`
        when ``client`` already holds ``max_claims_per_client``."""
        self._check_claims(client)
        deadline = time.monotonic() + wait_s
        while True:
            while self._queue:
                offer = self._queue.popleft()
                if self.offers.get(offer.key) is offer:  # not withdrawn meanwhile
                    try:
                        self._check_claims(client)  # another long poll of it took one
                    except TooManyClaims:
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
        task: TaskLike,
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


def _member_trajectory(episode: Episode, task: TaskLike, group_id: str, offer: Offer) -> Trajectory:
    traj = episode_trajectory(episode)
    key = task_key(task)
    traj.task_id, traj.task_name = key.id, key.name
    traj.group_id = group_id
    traj.info.update(member=offer.member, attempt=offer.attempt)
    return traj


def _lost_trajectory(task: TaskLike, group_id: str, offer: Offer, why: str) -> Trajectory:
    key = task_key(task)
    traj = Trajectory(
        task_id=key.id,
        episode_id=offer.episode_id,
        task_name=key.name,
        group_id=group_id,
        info={"source": "openai", "member": offer.member, "attempt": offer.attempt},
    )
    traj.status, traj.error = "timeout", why
    return traj
