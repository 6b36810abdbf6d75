"""The slot table alone: free, active and parked slots, without JAX."""

import pytest

from tunix_agentic.inference.slots import Parked, SlotTable


def test_free_slots_then_none():
    table = SlotTable(2)
    a, _ = table.acquire(None, [1, 2])
    table.activate(a, "req-a")
    b, _ = table.acquire(None, [3])
    table.activate(b, "req-b")
    assert {a, b} == {0, 1} and table.acquire(None, [4]) == (None, 0)
    assert table.owner(a) == "req-a"
    table.release(a)
    assert table.owner(a) is None and table.acquire(None, [5]) == (a, 0)


def test_a_session_gets_its_parked_slot_and_cached_prefix():
    table = SlotTable(3)
    slot, _ = table.acquire("s1", [1, 2, 3])
    table.activate(slot, "turn-1")
    table.release(slot, Parked("s1", [1, 2, 3, 7], version=0))
    assert table.parked[slot].ids == [1, 2, 3, 7]
    # The next turn extends the history: everything parked is reused.
    assert table.acquire("s1", [1, 2, 3, 7, 9, 9]) == (slot, 4)
    table.release(slot, Parked("s1", [1, 2, 3], version=0))
    # A diverged history: the same slot, nothing reused.
    assert table.acquire("s1", [1, 5, 5, 5]) == (slot, 0)


@pytest.mark.parametrize("reuse", [True, False], ids=["reuse", "no_reuse"])
def test_parking_follows_session_reuse(reuse):
    table = SlotTable(1, session_reuse=reuse)
    slot, _ = table.acquire("s", [1])
    table.release(slot, Parked("s", [1], version=0))
    assert (slot in table.parked) is reuse and (slot in table.free) is not reuse


def test_parked_slots_are_evicted_least_recently_used():
    table = SlotTable(2)
    for session in ("old", "new"):
        slot, _ = table.acquire(session, [1])
        table.release(slot, Parked(session, [1], version=0))
    old_slot = next(s for s, p in table.parked.items() if p.session_id == "old")
    assert table.acquire(None, [9]) == (old_slot, 0)
    assert [p.session_id for p in table.parked.values()] == ["new"]


def test_a_weight_update_frees_caches_made_by_other_versions():
    table = SlotTable(3)
    for session, version in (("a", 1), ("b", 2), ("c", 1)):
        slot, _ = table.acquire(session, [1])
        table.release(slot, Parked(session, [1], version=version))
    assert table.drop_parked_except(2) == 2
    assert [p.session_id for p in table.parked.values()] == ["b"]
    assert len(table.free) == 2
