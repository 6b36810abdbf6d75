"""Tests for the FrozenLake environment: maps, rules, demonstrations, and a real rollout."""

from __future__ import annotations

import numpy as np
import pytest

from tunix_agentic.agent.chat import ChatTemplate
from tunix_agentic.agent.loop import AgentConfig
from tunix_agentic.agent.tool_parser import parse_qwen3
from tunix_agentic.envs.base import Action, Task, TaskSource, env_tasks, make_env
from tunix_agentic.envs.frozenlake import (
    FrozenLakeEnv,
    FrozenLakeGame,
    FrozenLakeRules,
    FrozenLakeTasks,
    check_grid,
    map_split,
    shortest_moves,
)
from tunix_agentic.envs.tools import ToolCall
from tunix_agentic.inference import EngineConfig, JaxEngine
from tunix_agentic.models.char_tokenizer import CharTokenizer
from tunix_agentic.rollout import RolloutConfig, RolloutOrchestrator
from tunix_agentic.testing import memorize, tiny_model

TOK = CharTokenizer(128)
TEMPLATE = ChatTemplate(TOK)
SOURCE = FrozenLakeTasks()

# S at the top left, G at the bottom right; every shortest path takes 6 moves around the holes.
GRID = ("SFFH", "FHFF", "FFFH", "HFFG")


def task_of(grid, **data) -> Task:
    return Task(task_id="t", prompt="", data={"grid": grid, **data}, task_name="frozenlake")


def answer(text: str) -> Action:
    return parse_qwen3(f"<answer>{text}</answer>")


# --- maps ----------------------------------------------------------------------------------


def test_tasks_are_deterministic_and_depend_on_seed_split_and_index():
    a = [SOURCE.task(i, seed=3, split="train") for i in range(20)]
    b = [SOURCE.task(i, seed=3, split="train") for i in range(20)]
    assert a == b
    grids = {t.data["grid"] for t in a}
    assert len(grids) >= 15  # different indices give (mostly) different maps
    assert SOURCE.task(0, seed=4, split="train").data != a[0].data
    assert isinstance(SOURCE, TaskSource) and env_tasks("frozenlake") == SOURCE
    assert a[0].task_name == "frozenlake" and a[0].task_id == "frozenlake-train-3-0"


@pytest.mark.parametrize(
    "source",
    [FrozenLakeTasks(), FrozenLakeTasks(size=5, hole_prob=0.4)],
    ids=["4x4", "5x5_holes_0.4"],
)
def test_every_generated_map_is_solvable_and_well_formed(source):
    for split in ("train", "heldout"):
        for i in range(100):
            task = source.task(i, seed=0, split=split)
            grid = check_grid(task.data["grid"])
            assert len(grid) == source.size and all(len(r) == source.size for r in grid)
            path = shortest_moves(grid)
            assert path is not None and len(path) == task.answer
            assert map_split(grid) == split


def test_train_and_heldout_maps_are_disjoint():
    source = FrozenLakeTasks(size=3)  # few distinct maps: collisions would show up here
    train = {
        source.task(i, seed=s, split="train").data["grid"] for s in range(3) for i in range(300)
    }
    held = {
        source.task(i, seed=s, split="heldout").data["grid"] for s in range(3) for i in range(300)
    }
    assert len(held) > 20 and not train & held


def test_task_source_validates_its_fields():
    with pytest.raises(ValueError, match="size"):
        FrozenLakeTasks(size=2)
    with pytest.raises(ValueError, match="hole_prob"):
        FrozenLakeTasks(hole_prob=0.9)
    with pytest.raises(ValueError, match="slip_prob"):
        FrozenLakeTasks(slip_prob=1.0)
    with pytest.raises(ValueError, match="split"):
        SOURCE.task(0, seed=0, split="test")
    with pytest.raises(ValueError, match="max_actions_per_turn"):
        FrozenLakeRules(max_actions_per_turn=0)
    with pytest.raises(ValueError, match="step_penalty"):
        FrozenLakeEnv(step_penalty=-0.1)


def test_shortest_path_avoids_holes():
    path = shortest_moves(GRID)
    assert path is not None and len(path) == 6
    game = FrozenLakeGame(GRID)
    for move in path:
        assert game.tile != "H"
        game.move(move)
    assert game.tile == "G"
    assert shortest_moves(("SH", "HG")) is None  # walled in by holes
    with pytest.raises(ValueError, match="exactly one start"):
        check_grid(("SF", "FF"))
    with pytest.raises(ValueError, match="tiles"):
        check_grid(("SX", "FG"))


# --- step semantics ------------------------------------------------------------------------


async def test_moves_walls_holes_and_the_goal():
    env = FrozenLakeEnv(step_penalty=0.05)
    prompt = await env.reset(task_of(GRID))
    assert "P" in prompt and "<answer>Up</answer>" in prompt
    r = await env.step(answer("up"))  # into the edge: stays put, still pays for the move
    assert not r.done and r.info["status"] == "moved" and r.info["position"] == [0, 0]
    assert "into the edge" in r.observation and r.observation.endswith("PFFH\nFHFF\nFFFH\nHFFG")
    assert r.reward == pytest.approx(-0.05)
    r = await env.step(answer("Right || Right"))
    assert r.info["position"] == [0, 2] and r.info["moves"] == ["Right", "Right"]
    assert r.observation == "Moved Right. Moved Right.\nSFPH\nFHFF\nFFFH\nHFFG"
    assert r.reward == pytest.approx(-0.1)
    r = await env.step(answer("Down || Right || Down"))  # (2, 3) is a hole
    assert r.done and r.info["status"] == "hole" and r.observation == ""
    assert r.info["position"] == [2, 3] and r.info["moves"] == ["Down", "Right", "Down"]
    assert await env.evaluate() == pytest.approx(-0.05 * 6)  # no success, only the penalties
    with pytest.raises(RuntimeError, match="after the episode ended"):
        await env.step(answer("Up"))

    await env.reset(task_of(GRID))
    assert env.step_rewards == []
    for text in ("Down", "Down", "Right || Right", "Down || Right"):
        r = await env.step(answer(text))
    assert r.done and r.info == {
        "status": "success",
        "position": [3, 3],
        "moves": ["Down", "Right"],
        "turn": 4,
        "success": True,
    }
    assert r.reward == pytest.approx(1.0 - 0.1)
    # Process rewards per step, the outcome in evaluate: the success plus every penalty.
    assert env.step_rewards == pytest.approx([-0.05, -0.05, -0.1, 0.9])
    assert await env.evaluate() == pytest.approx(1.0 - 0.05 * 6)


async def test_moves_after_the_goal_are_ignored():
    env = FrozenLakeEnv()
    await env.reset(task_of(("SG", "FF")))
    r = await env.step(answer("Right || Left || Left"))
    assert r.done and r.info["status"] == "success" and r.info["moves"] == ["Right"]
    assert await env.evaluate() == 1.0


@pytest.mark.parametrize(
    "action, why",
    [
        (Action(text="Up"), "no <answer>"),
        (Action(text="x", answer="Jump"), "unknown move 'Jump'"),
        (Action(text="x", answer=""), "unknown move ''"),
        (Action(text="x", answer="Up || Up || Up || Up"), "4 moves in one turn"),
        (Action(text="x", tool_calls=(ToolCall("calculator", {}),)), "no tools"),
        (Action(text="x", parse_errors=("bad json",)), "no tools"),
        (Action(text="x", answer="Up ||"), "unknown move ''"),
        (Action(text="x", answer="D\u00f6wn"), "unknown move 'D\\xf6wn'"),
    ],
    ids=[
        "no_answer",
        "unknown_move",
        "empty_move",
        "too_many_moves",
        "tool_call",
        "parse_error",
        "trailing_separator",
        "non_ascii_move",
    ],
)
async def test_invalid_actions_are_observations_with_a_penalty(action, why):
    env = FrozenLakeEnv(invalid_action_penalty=0.25)
    await env.reset(task_of(GRID))
    r = await env.step(action)
    assert not r.done and r.info["status"] == "invalid" and r.reward == -0.25
    assert why in r.observation and r.observation.startswith("Invalid action")
    assert r.info["position"] == [0, 0] and r.observation.endswith("PFFH\nFHFF\nFFFH\nHFFG")
    TEMPLATE.observation_ids(r.observation)  # plain ASCII: the character tokenizer encodes it
    r = await env.step(answer("Right"))  # the game goes on
    assert r.info["position"] == [0, 1]


async def test_max_turns_ends_the_episode_without_success():
    env = make_env("frozenlake", max_turns=3, invalid_action_penalty=0.0)
    await env.reset(task_of(GRID))
    statuses = []
    for text in ("Up", "nonsense", "Left"):
        r = await env.step(answer(text))
        statuses.append(r.info["status"])
    assert statuses == ["moved", "invalid", "max_turns"] and r.done and r.observation == ""
    assert await env.evaluate() == 0.0


async def test_env_refuses_misuse_and_bad_tasks():
    env = FrozenLakeEnv()
    with pytest.raises(RuntimeError, match="before reset"):
        await env.step(answer("Up"))
    with pytest.raises(TypeError, match="grid"):
        await env.reset(Task(task_id="x", prompt="p"))
    with pytest.raises(ValueError, match="same length"):
        await env.reset(task_of(["SFF", "FG"]))
    assert env.tool_schemas() == []


async def _walk_up(task: Task, turns: int = 4) -> list:
    env = FrozenLakeEnv(max_turns=turns)
    await env.reset(task)
    seen = []
    for _ in range(turns):
        r = await env.step(answer("Up"))
        seen.append((r.info["moves"], r.info["position"]))
        if r.done:
            break
    return seen


async def test_slippery_ice_is_reproducible_from_the_task_seed():
    source = FrozenLakeTasks(slip_prob=0.5)
    tasks = [source.task(i, seed=0, split="train") for i in range(6)]
    assert all(t.data["slip_prob"] == 0.5 for t in tasks)
    walks = [await _walk_up(t) for t in tasks]
    assert walks == [await _walk_up(t) for t in tasks]  # same task, same slips
    taken = {d for walk in walks for moves, _ in walk for d in moves}
    assert taken & {"Left", "Right"}  # with half the moves slipping, some went sideways
    # Without slipping, "Up" only ever goes up.
    plain = [await _walk_up(FrozenLakeTasks().task(i, seed=0, split="train")) for i in range(6)]
    assert {d for walk in plain for moves, _ in walk for d in moves} == {"Up"}


# --- demonstrations -------------------------------------------------------------------------


def demo_ids(task: Task, messages: list[dict]) -> tuple[list[int], list[float]]:
    """Token ids and loss mask of a demonstration, framed as a rollout frames it."""
    ids = TEMPLATE.prompt_ids(task.prompt)
    mask = [0.0] * len(ids)
    for m in messages:
        seg = (
            TEMPLATE.assistant_ids(m["content"])
            if m["role"] == "assistant"
            else TEMPLATE.observation_ids([m])
        )
        ids += seg
        mask += [1.0 if m["role"] == "assistant" else 0.0] * len(seg)
    return ids, mask


@pytest.mark.parametrize("slip_prob", [0.0, 0.3], ids=["ice", "slippery"])
async def test_demonstrations_reach_the_goal_when_replayed(slip_prob):
    source = FrozenLakeTasks(slip_prob=slip_prob)
    rng = np.random.default_rng(0)
    for i in range(25):
        task = source.task(i, seed=1, split="train")
        demo = source.demonstration(task, rng=rng, use_tools=False)
        assert [m["role"] for m in demo[::2]] == ["assistant"] * ((len(demo) + 1) // 2)
        assert len(demo[::2]) == task.answer  # one move per turn, a shortest path
        env = FrozenLakeEnv(max_turns=50)
        await env.reset(task)
        for k, message in enumerate(demo[::2]):
            r = await env.step(parse_qwen3(message["content"]))
            if k + 1 < len(demo[::2]):
                # The demonstration shows exactly what the environment answers.
                assert not r.done and demo[2 * k + 1] == {"role": "user", "content": r.observation}
        assert r.done and r.info["status"] == "success" and await env.evaluate() == 1.0
        demo_ids(task, demo)  # every prompt and observation encodes with the built-in tokenizer


# --- a real rollout -------------------------------------------------------------------------


async def test_memorized_walk_solves_its_map_through_the_orchestrator():
    source = FrozenLakeTasks(size=3)
    task = next(
        t for t in (source.task(i, seed=0, split="train") for i in range(50)) if t.answer == 2
    )
    demo = source.demonstration(task, rng=np.random.default_rng(0), use_tools=False)
    ids, mask = demo_ids(task, demo)
    model = memorize(tiny_model(seed=1), [(ids, mask)], steps=120)
    engine = JaxEngine(model, EngineConfig(max_slots=4, max_seq_len=512, decode_steps=8))
    agent = AgentConfig(max_turns=4, max_new_tokens=24, temperature=0.0)
    orch = RolloutOrchestrator.in_process(
        engine,
        FrozenLakeEnv,
        TEMPLATE,
        agent,
        RolloutConfig(group_size=2, groups_per_batch=1, filter_uniform_groups=False),
    )
    try:
        (group,) = await orch.run_tasks([task], group_size=2)
    finally:
        await engine.close()
    assert not group.dropped and len(group.trajectories) == 2
    for traj in group.trajectories:
        assert traj.status == "ok" and traj.reward == 1.0 and len(traj.steps) == 2
        # Token for token, the episode is the demonstration the policy learned.
        assert traj.learner_arrays()["input_ids"].tolist() == ids
        assert [s.reward for s in traj.steps] == [0.0, 1.0] and traj.steps[-1].done


# --- learning ---------------------------------------------------------------------------------


@pytest.mark.heavy  # ~14-17 min on a 2-core CPU, a quarter of CI's budget: `pytest -m heavy`
def test_a_short_rl_run_raises_the_success_rate(tmp_path):
    """configs/frozenlake_tiny.yaml as shipped (SFT on shortest walks, 40 GRPO steps): the
    success rate of the episodes RL trains on rises from its first ten steps to its last
    ten (640 fresh train-split episodes each). Held-out success is printed, not asserted:
    16 held-out maps per evaluation here (its seeds are apart from training's, so the
    count changes nothing trained), too few to tell a few points apart."""
    from pathlib import Path

    from tunix_agentic.metrics import read_scalars
    from tunix_agentic.trainer import train

    config = Path(__file__).parents[1] / "configs" / "frozenlake_tiny.yaml"
    result = train(str(config), [f"run_dir={tmp_path}", "rl.eval_tasks=16"], progress=False)
    success = [v for _, v in read_scalars(tmp_path / "tensorboard")["rollout/success_fraction"]]
    assert len(success) == 40
    first, last = float(np.mean(success[:10])), float(np.mean(success[-10:]))
    print(f"rollout success {first:.3f} -> {last:.3f}; {result.summary()}")
    assert last > first + 0.03, (first, last)
