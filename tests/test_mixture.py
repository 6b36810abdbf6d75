import pytest

from tunix_agentic.data.mixture import TaskMixture
from tunix_agentic.data.tasks import task_iterator
from tunix_agentic.envs.calculator import ArithmeticTasks


def _mixture(weights):
    return TaskMixture(
        {
            name: task_iterator(ArithmeticTasks(), seed=i, split="train")
            for i, name in enumerate(weights)
        },
        weights,
    )


def test_quotas_are_exact_and_names_ride_with_tasks():
    mix = _mixture({"easy": 3.0, "hard": 1.0})
    tasks = [next(mix) for _ in range(40)]
    names = [t.task_name for t in tasks]
    assert names.count("easy") == 30 and names.count("hard") == 10
    for n in range(1, 41):  # within one of the quota at every prefix
        assert abs(names[:n].count("hard") - n / 4) <= 1


def test_state_round_trip_resumes_the_same_sequence():
    mix = _mixture({"a": 1.0, "b": 2.0})
    for _ in range(7):
        next(mix)
    state = mix.get_state()
    expected = [(t.task_name, t.task_id) for t in (next(mix) for _ in range(6))]
    fresh = _mixture({"a": 1.0, "b": 2.0})
    fresh.set_state(state)
    assert [(t.task_name, t.task_id) for t in (next(fresh) for _ in range(6))] == expected


@pytest.mark.parametrize(
    "weights,match",
    [({"a": 0.0}, "> 0"), ({}, "at least one")],
    ids=["zero_weight", "empty"],
)
def test_bad_mixtures(weights, match):
    with pytest.raises(ValueError, match=match):
        TaskMixture({name: iter([]) for name in weights}, weights)
    with pytest.raises(ValueError, match="exactly the sources"):
        TaskMixture({"a": iter([])}, {"b": 1.0})
