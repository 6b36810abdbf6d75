"""Tests for tunix_agentic.learners.advantages: GRPO, Dr. GRPO and RLOO on literal rewards, and the registry."""

from __future__ import annotations

import numpy as np
import pytest

from tunix_agentic.learners import advantages
from tunix_agentic.learners.advantages import (
    dr_grpo,
    get_advantage_fn,
    grpo,
    register_advantage,
    rloo,
)


@pytest.mark.parametrize(
    ("fn", "rewards", "expected"),
    [
        (grpo, [1, 0, 0, 1], [1, -1, -1, 1]),
        (grpo, [0, 1, 2, 3], [-1.3416408, -0.4472136, 0.4472136, 1.3416408]),
        (grpo, [1, 0], [1, -1]),
        (dr_grpo, [1, 0, 0, 1], [0.5, -0.5, -0.5, 0.5]),
        (dr_grpo, [0, 1, 2, 3], [-1.5, -0.5, 0.5, 1.5]),
        (rloo, [1, 0, 0, 1], [2 / 3, -2 / 3, -2 / 3, 2 / 3]),
        (rloo, [0, 1, 2, 3], [-2.0, -2 / 3, 2 / 3, 2.0]),
        (rloo, [1, 0], [1, -1]),
    ],
    ids=[
        "grpo_binary",
        "grpo_ramp",
        "grpo_pair",
        "dr_binary",
        "dr_ramp",
        "rloo_binary",
        "rloo_ramp",
        "rloo_pair",
    ],
)
def test_literal_advantages(fn, rewards, expected):
    out = fn(np.asarray(rewards, np.float32))
    assert out.dtype == np.float32
    assert out.shape == (len(rewards),)
    # grpo divides by std + 1e-6, so allow that relative slack.
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_grpo_eps_is_visible():
    # std of [1, 0] is 0.5; a large eps shrinks the advantages.
    np.testing.assert_allclose(grpo(np.array([1.0, 0.0]), eps=0.5), [0.5, -0.5], rtol=1e-6)


@pytest.mark.parametrize("fn", [grpo, dr_grpo, rloo], ids=["grpo", "dr_grpo", "rloo"])
@pytest.mark.parametrize(
    "rewards", [[0, 0, 0, 0], [1, 1, 1], [0.7] * 5, [3.0]], ids=["zeros", "ones", "float", "single"]
)
def test_uniform_rewards_give_zero(fn, rewards):
    np.testing.assert_array_equal(
        fn(np.asarray(rewards, np.float32)), np.zeros(len(rewards), np.float32)
    )


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"], ids=str)
def test_get_advantage_fn_known(name):
    assert get_advantage_fn(name) is getattr(advantages, name)


def test_get_advantage_fn_unknown_raises():
    with pytest.raises(
        ValueError,
        match=r"unknown advantage estimator 'ppo'; known: \['dr_grpo', 'grpo', 'grpo_bessel', 'rloo'\]",
    ):
        get_advantage_fn("ppo")


def test_register_advantage(monkeypatch):
    monkeypatch.setattr(advantages, "ADVANTAGE_ESTIMATORS", dict(advantages.ADVANTAGE_ESTIMATORS))

    def raw(rewards):
        return np.asarray(rewards, np.float32) * 2

    register_advantage("raw", raw)
    assert get_advantage_fn("raw") is raw
    np.testing.assert_array_equal(get_advantage_fn("raw")(np.array([1.0, 0.0])), [2.0, 0.0])
    assert get_advantage_fn("grpo") is grpo  # the built-ins stay


def test_turn_advantages_add_the_standardised_process_return_to_go():
    from tunix_agentic.learners.advantages import turn_advantages

    # returns-to-go: [1, 1] and [0]; over the group's 3 steps mean 2/3, std sqrt(2)/3
    out = turn_advantages(np.array([0.5, -0.5]), [np.array([0.0, 1.0]), np.array([0.0])])
    shaped = (np.array([1.0, 1.0, 0.0]) - 2 / 3) / (np.sqrt(2) / 3 + 1e-6)
    np.testing.assert_allclose(out[0], 0.5 + shaped[:2], rtol=1e-6)
    np.testing.assert_allclose(out[1], -0.5 + shaped[2:], rtol=1e-6)
    # no process rewards: every step keeps its trajectory's advantage
    same = turn_advantages(np.array([1.0, -1.0]), [np.zeros(3), np.zeros(1)])
    assert [x.tolist() for x in same] == [[1.0, 1.0, 1.0], [-1.0]]
