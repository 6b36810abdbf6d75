"""The engine's slot table: which KV-cache slot holds what (pure Python, no JAX).

A slot is *free*, *active* (a request is decoding in it) or *parked* (a
finished request of a session left its cache there, so the session's next
turn prefills only its new tokens). Parked slots remember which weight
version made their cache and are evicted least recently used when a request
needs room.

With ``prefix_cache`` the table also remembers the prompt whose KV every
active slot holds, and keeps a freed slot's prompt until the slot is reused:
a new request then starts from the longest prefix of its prompt held in any
slot (a GRPO group's G samples share their whole prompt; episodes share a
system prompt and tool schemas). The engine copies those KV rows into the new
request's slot on device and prefills only the rest (:class:`Grant`).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Generic, TypeVar

R = TypeVar("R")


@dataclasses.dataclass
class Parked:
    """A session's cache left in a slot."""

    session_id: str
    ids: list[int]  # tokens whose KV is valid in the slot, in order from position 0
    version: int  # the weight version that made (the newest part of) it


@dataclasses.dataclass(frozen=True)
class Held:
    """Tokens whose KV a non-parked slot holds from position 0, and the version that made it."""

    ids: list[int]
    version: int


@dataclasses.dataclass(frozen=True)
class Grant:
    """A slot for a new request, and which of its prompt's KV is reused.

    ``cached`` prompt tokens are reused from slot ``source``: when ``source`` is
    ``slot`` they are already in place, otherwise the caller copies those rows
    from ``source`` first. ``wave`` orders the prefill calls of one admission
    round: a request whose source was itself admitted this round copies only
    after that source's prefill has written it (a later wave).
    """

    slot: int
    cached: int
    source: int
    wave: int = 0

    @property
    def copies(self) -> bool:
        return self.cached > 0 and self.source != self.slot


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of ``a`` and ``b``."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi - 1:  # a[:lo] == b[:lo] and a[:hi] != b[:hi]; slice compares run in C
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if a[lo:mid] == b[lo:mid] else (lo, mid)
    return lo


class SlotTable(Generic[R]):
    """Free, active and parked slots of one engine; owned by the scheduler thread."""

    def __init__(self, num_slots: int, *, session_reuse: bool = True, prefix_cache: bool = False):
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.num_slots = num_slots
        self.session_reuse = session_reuse
        self.prefix_cache = prefix_cache
        self.free: list[int] = list(range(num_slots))
        self.active: dict[int, R] = {}
        self.parked: OrderedDict[int, Parked] = OrderedDict()  # LRU order: oldest first
        # prefix_cache: the prompt KV held by active and free slots (parked ones: ``parked``).
        self.held: dict[int, Held] = {}
        # Parked caches only their session may extend: their prompt's KV came from weights
        # replaced while the request ran (the session goes on as an in-flight request does).
        self._private: set[int] = set()
        # This admission round (:meth:`new_round`): slots granted (-> their wave), and slots
        # read as copy sources, which no grant may overwrite before the round's calls run.
        self._round: dict[int, int] = {}
        self._pinned: set[int] = set()

    def new_round(self) -> None:
        """Start an admission round: the calls of the previous one are all dispatched."""
        self._round.clear()
        self._pinned.clear()

    def acquire(self, session_id: str | None, prompt: list[int]) -> tuple[int | None, int]:
        """A slot for a new request and how many of its prompt tokens are cached there.

        The session's parked slot if it has one (its cache counts when the
        prompt extends it), else a free slot, else the least recently used
        parked one; ``(None, 0)`` when every slot is active. (:meth:`grant`
        also says where a shared prefix is copied from.)
        """
        grant = self.grant(session_id, prompt)
        return (None, 0) if grant is None else (grant.slot, grant.cached)

    def grant(self, session_id: str | None, prompt: list[int], version: int = 0) -> Grant | None:
        """A slot for a new request made at weight ``version``; None when none is available.

        Without ``prefix_cache``, only a session's own parked cache is reused, and
        only when the prompt extends it. With it, the longest prefix of ``prompt``
        held in any slot is (all but the prompt's last token, whose logits the
        prefill must compute).
        """
        slot, own = self._pick(session_id)
        if slot is None:
            return None
        if not self.prefix_cache:
            n = len(own) if own is not None else 0
            cached = n if own is not None and n < len(prompt) and prompt[:n] == own else 0
            grant = Grant(slot, cached, slot)
        else:
            grant = self._best_prefix(slot, own, prompt)
            self.held[slot] = Held(list(prompt), version)
        if grant.copies:
            self._pinned.add(grant.source)
        self._round[slot] = grant.wave
        return grant

    def _pick(self, session_id: str | None) -> tuple[int | None, list[int] | None]:
        """The slot a new request goes to, and the tokens whose KV it holds that the
        request may keep (the session's parked cache; with ``prefix_cache``, any)."""
        if self.session_reuse and session_id is not None:
            for slot, parked in self.parked.items():
                if parked.session_id == session_id:
                    if slot in self._pinned:
                        return None, None  # read by this round's copies: next round
                    del self.parked[slot]
                    self._private.discard(slot)
                    return slot, parked.ids
        free = [s for s in self.free if s not in self._pinned]
        if free:
            if not self.prefix_cache:
                slot = free[-1]
            else:  # keep what free slots hold as long as possible: empty first, then oldest
                slot = next((s for s in free if s not in self.held), free[0])
            self.free.remove(slot)
            held = self.held.pop(slot, None)
            return slot, None if held is None else held.ids
        for slot in self.parked:  # evict the least recently used
            if slot not in self._pinned:
                evicted = self.parked.pop(slot)
                shared = self.prefix_cache and slot not in self._private
                self._private.discard(slot)
                return slot, evicted.ids if shared else None
        return None, None

    def _best_prefix(self, slot: int, own: list[int] | None, prompt: list[int]) -> Grant:
        limit = len(prompt) - 1  # the last prompt token is always prefilled
        best = Grant(slot, 0, slot)
        if own is not None:
            best = Grant(slot, min(common_prefix(own, prompt), limit), slot)
        sources = [(s, p.ids) for s, p in self.parked.items() if s not in self._private]
        sources += [(s, h.ids) for s, h in self.held.items() if s != slot]
        for source, ids in sources:
            n = min(common_prefix(ids, prompt), limit)
            if n > best.cached:
                best = Grant(slot, n, source, self._round.get(source, -1) + 1)
        return best

    def activate(self, slot: int, request: R) -> None:
        self.active[slot] = request

    def owner(self, slot: int) -> R | None:
        """The request decoding in ``slot``, if any."""
        return self.active.get(slot)

    def release(self, slot: int, park: Parked | None = None) -> None:
        """End the slot's request: park its cache for the session, or free the slot
        (with ``prefix_cache`` its prompt's KV stays reusable until the slot is reused)."""
        self.active.pop(slot, None)
        if park is not None and self.session_reuse:
            if self.prefix_cache and self.held.pop(slot, None) is None:
                self._private.add(slot)  # its prompt's KV was forgotten by a weight update
            self.parked[slot] = park
        else:
            self.free.append(slot)

    def reclaimable(self, session_id: str | None = None) -> list[int]:
        """Slots whose cached KV may be dropped to make room (the paged layout's blocks),
        in the order to drop them: free slots holding a prefix (longest free first), then
        parked slots least recently used first, ``session_id``'s own last; never a slot
        this admission round reads."""
        out = [s for s in self.free if s in self.held and s not in self._pinned]
        parked = [s for s in self.parked if s not in self._pinned]
        own = [s for s in parked if self.parked[s].session_id == session_id]
        return out + [s for s in parked if s not in own] + own

    def forget(self, slot: int) -> None:
        """Drop what a free or parked slot caches: it is free and holds nothing."""
        if slot in self.active:
            raise ValueError(f"slot {slot} is active")
        if self.parked.pop(slot, None) is not None:
            self._private.discard(slot)
            self.free.append(slot)
        self.held.pop(slot, None)

    def drop_parked_except(self, version: int) -> int:
        """New weights (``version``) are in: free the parked caches made by other versions,
        and forget every shared prefix (the weights changed, whatever their version says:
        parked caches that stay serve only their own session). Returns how many parked
        slots were freed."""
        self.held.clear()
        self._private.update(self.parked)
        stale = [slot for slot, parked in self.parked.items() if parked.version != version]
        for slot in stale:
            del self.parked[slot]
            self._private.discard(slot)
            self.free.append(slot)
        return len(stale)
