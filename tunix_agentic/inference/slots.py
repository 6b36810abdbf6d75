"""The engine's slot table: which KV-cache slot holds what (pure Python, no JAX).

A slot is *free*, *active* (a request is decoding in it) or *parked* (a
finished request of a session left its cache there, so the session's next
turn prefills only its new tokens). Parked slots remember which weight
version made their cache and are evicted least recently used when a request
needs room.
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


class SlotTable(Generic[R]):
    """Free, active and parked slots of one engine; owned by the scheduler thread."""

    def __init__(self, num_slots: int, *, session_reuse: bool = True):
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.num_slots = num_slots
        self.session_reuse = session_reuse
        self.free: list[int] = list(range(num_slots))
        self.active: dict[int, R] = {}
        self.parked: OrderedDict[int, Parked] = OrderedDict()  # LRU order: oldest first

    def acquire(self, session_id: str | None, prompt: list[int]) -> tuple[int | None, int]:
        """A slot for a new request and how many of its prompt tokens are cached there.

        The session's parked slot if it has one (its cache counts when the
        prompt extends it), else a free slot, else the least recently used
        parked one; ``(None, 0)`` when every slot is active.
        """
        if self.session_reuse and session_id is not None:
            for slot, parked in self.parked.items():
                if parked.session_id != session_id:
                    continue
                del self.parked[slot]
                n = len(parked.ids)
                if n < len(prompt) and prompt[:n] == parked.ids:
                    return slot, n
                return slot, 0  # same session, diverged history: reuse the slot, recompute
        if self.free:
            return self.free.pop(), 0
        if self.parked:
            slot, _ = self.parked.popitem(last=False)  # evict the least recently used
            return slot, 0
        return None, 0

    def activate(self, slot: int, request: R) -> None:
        self.active[slot] = request

    def owner(self, slot: int) -> R | None:
        """The request decoding in ``slot``, if any."""
        return self.active.get(slot)

    def release(self, slot: int, park: Parked | None = None) -> None:
        """End the slot's request: park its cache for the session, or free the slot."""
        self.active.pop(slot, None)
        if park is not None and self.session_reuse:
            self.parked[slot] = park
        else:
            self.free.append(slot)

    def drop_parked_except(self, version: int) -> int:
        """Free every parked cache made by another weight version; returns how many."""
        stale = [slot for slot, parked in self.parked.items() if parked.version != version]
        for slot in stale:
            del self.parked[slot]
            self.free.append(slot)
        return len(stale)
