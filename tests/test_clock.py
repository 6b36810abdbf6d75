"""The engine clock alone: busy, host-gap and idle seconds from given event times."""

from tunix_agentic.inference.clock import EngineClock


def test_busy_gap_and_idle_sum_to_the_wall_time():
    clock = EngineClock(now=0.0)
    clock.account(dispatched=1.0, done=3.0)  # 1 s host gap, 2 s busy
    clock.idle_from(3.0)
    clock.work_arrived(5.0)  # 2 s idle
    clock.account(dispatched=5.5, done=6.0)  # 0.5 s gap, 0.5 s busy
    reading = clock.reading(now=6.0)
    assert reading == {"busy_s": 2.5, "sched_gap_s": 1.5, "idle_s": 2.0}
    assert sum(reading.values()) == 6.0


def test_a_call_queued_behind_another_is_busy_from_the_previous_completion():
    clock = EngineClock(now=0.0)
    assert clock.account(dispatched=0.0, done=2.0) == 2.0
    assert clock.account(dispatched=1.0, done=3.0) == 1.0  # queued at 1, ran 2 -> 3
    assert clock.reading(now=3.0) == {"busy_s": 3.0, "sched_gap_s": 0.0, "idle_s": 0.0}


def test_the_idle_period_under_way_counts_in_a_reading():
    clock = EngineClock(now=0.0)
    clock.idle_from(1.0)
    assert clock.reading(now=4.0)["idle_s"] == 3.0
    clock.work_arrived(2.0)
    assert clock.reading(now=4.0)["idle_s"] == 1.0
