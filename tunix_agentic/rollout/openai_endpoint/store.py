"""The endpoint's open and closed episodes, within bounds (host-side, no JAX).

An episode is the pair of its id and its token (``X-Episode-Id``, ``X-Episode-Token``):
only the token's holder continues, reads, rewards or closes it, and the store files it
under a hash of both (:func:`episode_key`). :class:`EpisodeStore` opens an episode at its
first recorded call, closes it with its reward, hands closed ones to whoever groups them,
and holds all of them within :class:`EpisodeLimits`; what it refuses it raises as the
typed errors of :mod:`~.errors`. The bounds in detail: ``docs/reference/openai_routes.md``.
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
from typing import Any

from tunix_agentic.rollout.openai_endpoint.errors import (
    EpisodeClosed,
    EpisodeEmpty,
    EpisodeFull,
    EpisodeUnknown,
    TooManyOpen,
)
from tunix_agentic.rollout.openai_endpoint.recording import Call, Episode, finished_turns


@dataclasses.dataclass(frozen=True)
class EpisodeLimits:
    """Bounds of :class:`EpisodeStore`: open episodes (overall, per client; claimed members
    of external groups are not counted), each one's calls and token ids, how long an idle
    one lives, and how many closed ones wait to be taken, for how long."""

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


TOKEN_PATTERN = re.compile(r"[A-Za-z0-9._~+/=-]{16,200}")


def new_token() -> str:
    """An unguessable episode token (or id part): 192 random bits."""
    return secrets.token_urlsafe(24)


def episode_key(episode_id: str, token: str) -> str:
    """What the store files an episode under: the id namespaced by its token (hashed, so
    a dictionary lookup's timing says nothing about a token)."""
    return hashlib.sha256(f"{episode_id}\0{token}".encode()).hexdigest()


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
            raise EpisodeClosed(
                f"X-Episode-Id: episode {episode_id!r} is "
                + (f"withdrawn: {why}" if why else "closed")
            )
        if len(episode.calls) >= self.limits.max_calls:
            raise EpisodeFull(
                f"X-Episode-Id: episode {episode_id!r} holds {len(episode.calls)} calls, "
                f"the limit (close it with a reward)"
            )
        episode.touched = time.monotonic()
        episode.in_flight += 1
        return episode

    def _check_caps(self, client: str) -> None:
        unreserved = len(self.open) - sum(1 for k in self.reserved if k in self.open)
        if unreserved >= self.limits.max_open:
            raise TooManyOpen(
                f"X-Episode-Id: {unreserved} episodes are open, the node's cap "
                "(episodes.max_open); close some with POST /v1/episodes/{id}/reward"
            )
        if self._per_client[client] >= self.limits.max_open_per_client:
            raise TooManyOpen(
                f"X-Episode-Id: this client holds {self._per_client[client]} open episodes, "
                "the per-client cap (episodes.max_open_per_client); close some with "
                "POST /v1/episodes/{id}/reward"
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
            raise EpisodeClosed(
                f"X-Episode-Id: episode {episode.episode_id!r} was "
                + (f"withdrawn ({why})" if why else "closed")
                + " while this call ran (not recorded)"
            )
        if episode.num_tokens + call.num_tokens > self.limits.max_tokens:
            raise EpisodeFull(
                f"X-Episode-Id: episode {episode.episode_id!r} would hold more than "
                f"{self.limits.max_tokens} token ids (not recorded; close it with a reward)"
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
            raise EpisodeEmpty("the claimed episode has no recorded call")
        if episode is None:
            raise EpisodeUnknown(
                "episode not known (or expired, or X-Episode-Token is not its token)"
            )
        eid = episode.episode_id
        size = len(json.dumps(info, separators=(",", ":")))
        if size > self.limits.max_info_bytes:
            raise EpisodeFull(
                f"info: {size:,} bytes of JSON; at most {self.limits.max_info_bytes:,}"
            )
        if episode.closed:
            if episode.info.get("withdrawn"):
                raise EpisodeClosed(f"episode {eid!r} is withdrawn: {episode.info['withdrawn']}")
            if episode.reward != reward:
                raise EpisodeClosed(
                    f"reward: episode {eid!r} was closed with reward {episode.reward}"
                )
            return episode
        if not finished_turns(episode):
            what = "finished call (its calls were cut)" if episode.calls else "recorded call"
            raise EpisodeEmpty(f"episode {eid!r} has no {what}")
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
