"""The group filter and the staleness pacer on their own: plain objects, no engine, no loop."""

from __future__ import annotations

import dataclasses

import numpy as np

from tunix_agentic.rollout.grouping import GroupFilter, StalenessPacer


@dataclasses.dataclass
class G:
    index: int
    admitted_version: int = 0
    reward_list: tuple[float, ...] = (0.0, 1.0)
    min_version: int = 0

    @property
    def rewards(self) -> np.ndarray:
        return np.asarray(self.reward_list, np.float32)


def test_filter_keeps_signal_and_counts_filtered_groups_in_a_row():
    f = GroupFilter(group_size=4)
    assert f.verdict(G(0, reward_list=(1, 1, 1, 1))) == "filtered"
    assert f.verdict(G(1, reward_list=(0, 0, 0, 0))) == "filtered"
    assert f.filtered_in_a_row == 2
    assert f.verdict(G(2, reward_list=(0, 1, 0, 0))) == "keep" and f.filtered_in_a_row == 0
    assert f.verdict(G(3, reward_list=(1,))) == "too_small"  # three members lost
    assert f.filtered_in_a_row == 0  # too small is not "no signal"
    assert GroupFilter(group_size=1).verdict(G(4, reward_list=(1,))) == "filtered"
    assert GroupFilter(group_size=1, uniform=False).verdict(G(4, reward_list=(1,))) == "keep"


def test_filter_reward_std_floor():
    f = GroupFilter(group_size=3, uniform=False, min_reward_std=0.3)
    assert f.verdict(G(0, reward_list=(1.0, 1.0, 0.0))) == "keep"  # std 0.47
    assert f.verdict(G(1, reward_list=(0.0, 0.0, 0.5))) == "filtered"  # std 0.24
    assert f.verdict(G(2, reward_list=(1.0, 1.0, 1.0))) == "filtered"  # std 0


def test_pacer_admits_up_to_the_staleness_bound():
    p = StalenessPacer(groups_per_batch=2, max_staleness=1)
    admitted = 0
    while p.may_admit():
        p.admitted(p.version)
        admitted += 1
    assert admitted == 4  # batches for versions 0 and 1: the second is one step stale
    p.finished(0, G(0))
    p.finished(0, G(1))
    assert not p.may_admit()  # finished but not taken: still queued
    assert p.next_ready(2).index == 0 and p.next_ready(1).index == 1
    p.batch_done()
    assert not p.may_admit()  # the learner has not published version 1 yet
    p.set_version(1)
    assert p.may_admit() and p.running == 2 and p.ready == 0


def test_pacer_resumed_at_a_version_paces_from_it():
    p = StalenessPacer(groups_per_batch=2, max_staleness=0)
    p.set_version(5)
    assert p.batches_taken == 5 and p.may_admit()
    p.admitted(5)
    p.admitted(5)
    assert not p.may_admit()


def test_pacer_holds_a_slot_for_a_running_straggler_and_spots_stale_groups():
    p = StalenessPacer(groups_per_batch=1, max_staleness=1)
    p.admitted(0)  # the straggler: admitted under version 0
    p.admitted(0)
    p.finished(0, G(1, admitted_version=0))
    p.set_version(1)
    # The finished group is urgent itself (admitted at 0 <= 1 - 1): it may be taken.
    assert p.next_ready(1).index == 1
    p.admitted(1)
    p.finished(1, G(2, admitted_version=1, min_version=1))
    # Index 2 is not urgent, and the one batch slot is needed by the running version-0 group.
    assert p.urgent_running() == 1 and p.next_ready(1) is None
    p.finished(0, G(0, admitted_version=0))
    assert p.next_ready(1).index == 0  # oldest admission first
    p.set_version(3)
    assert p.too_stale(G(5, min_version=1)) and not p.too_stale(G(6, min_version=2))


def test_pacer_refuses_to_finish_a_group_it_never_admitted():
    """The orchestrator once released a group under a version read later than its admission
    (a version published in between): counts went {0: 1, 1: -1} and get_batch waited forever
    for a phantom straggler. The pacer now refuses such a release."""
    p = StalenessPacer(groups_per_batch=1, max_staleness=1)
    p.admitted(0)
    p.set_version(1)
    try:
        p.finished(1, G(0))
    except RuntimeError as exc:
        assert "version 1" in str(exc)
    else:
        raise AssertionError("finishing under a version never admitted must raise")
    p.finished(0, G(0))
    assert p.running == 0 and p.urgent_running() == 0 and p.next_ready(1).index == 0
