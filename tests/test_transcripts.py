"""Transcripts: which episodes are kept, what a record holds, how ``show`` prints them; the
honest names of held-out figures; the learning verdict; the environment contract at start."""

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from tunix_agentic.agent.chat import make_chat_template
from tunix_agentic.cli.main import main
from tunix_agentic.config import ConfigError, load_config
from tunix_agentic.envs.base import Environment, StepResult, register_env
from tunix_agentic.envs.calculator import ArithmeticEnv, ArithmeticTasks
from tunix_agentic.evaluation import score
from tunix_agentic.models.tokenizers import load_tokenizer
from tunix_agentic.report import write_report
from tunix_agentic.report.learning import LearningFigures, learning_verdict
from tunix_agentic.rollout.episode import Group
from tunix_agentic.rollout.transcripts import TranscriptLog, choose, episode_record
from tunix_agentic.run_setup import lr_decay_warning
from tunix_agentic.testing import TINY_RUN_OVERRIDES
from tunix_agentic.trainer import Trainer
from tunix_agentic.trajectory import Step, Trajectory

CONFIG = str(Path(__file__).parents[1] / "configs" / "calculator_tiny.yaml")
TEMPLATE = make_chat_template(load_tokenizer("builtin", "", 128))
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'


def _traj(i: int, reward: float, status: str = "ok", *, text: str = "<answer>5</answer>"):
    tok = TEMPLATE.tokenizer
    traj = Trajectory(task_id=f"t{i}", episode_id=f"e{i}", group_id="g0", reward=reward)
    traj.status = status
    traj.append_prompt(TEMPLATE.prompt_ids("Compute 2+3."))
    ids = tok.encode(CALL)
    step = Step(len(traj.token_ids), ids, [0.0] * len(ids), [3] * len(ids), "stop")
    step.action_text = CALL
    step.tool_calls = [{"name": "calculator", "seconds": 0.01, "error": False}]
    traj.append_action(step)
    traj.append_observation(TEMPLATE.observation_ids([{"role": "tool", "content": "5"}]))
    ids = tok.encode(text)
    last = Step(len(traj.token_ids), ids, [0.0] * len(ids), [4] * len(ids), "stop", done=True)
    last.action_text, last.reward = text, reward
    traj.append_action(last)
    return traj


def test_choose_keeps_the_best_the_worst_the_cut_off_and_an_infra_failure():
    trajs = [_traj(0, 0.5), _traj(1, 1.0), _traj(2, 0.0), _traj(3, 0.0, "max_tokens")]
    trajs += [_traj(i, 0.2 * (i % 5)) for i in range(4, 12)]
    lost = _traj(99, 0.0, "env_error")
    picks = choose(trajs, [lost], 6)
    why = {t.episode_id: w for t, w in picks}
    assert len(picks) == 6 and len(why) == 6  # bounded, no episode twice
    assert why["e1"] == "best" and why["e3"] == "max_tokens" and why["e99"] == "infra"
    worst = next(t for t, w in picks if w == "worst")
    assert worst.reward == 0.0 and worst.episode_id != "e3"
    assert [w for _, w in choose(trajs, [], 2)] == ["best", "worst"]
    assert choose([], [], 4) == []


def test_a_record_holds_the_turns_tool_calls_observations_and_versions():
    record = episode_record(
        _traj(0, 1.0), TEMPLATE.tokenizer.decode, _parse(), prompt="Compute 2+3.", why="best"
    )
    assert record["reward"] == 1.0 and record["status"] == "ok" and record["versions"] == [3, 4]
    first, second = record["turns"]
    assert first["tool_calls"] == [
        {
            "name": "calculator",
            "arguments": {"expression": "2+3"},
            "error": False,
            "seconds": 0.01,
        }
    ]
    assert "5" in first["observation"] and first["versions"] == [3, 3]
    assert second["text"] == "<answer>5</answer>" and second["done"]
    json.dumps(record)  # JSON-ready


def _parse():
    from tunix_agentic.agent.tool_parser import get_parser

    return get_parser("qwen3")


def test_show_prints_a_steps_episodes_and_names_the_steps_it_has(tmp_path, capsys):
    log = TranscriptLog(tmp_path, TEMPLATE, "qwen3")
    groups = [Group("g0", 0, None, 3, [_traj(0, 1.0), _traj(1, 0.0, "max_tokens")])]
    log.write_step(4, groups)
    log.write_step(5, groups)
    assert main(["show", str(tmp_path), "--step", "4"]) == 0
    out = capsys.readouterr().out
    assert "2 episodes kept of RL step 4" in out
    assert 'tool call calculator({"expression": "2+3"}): ran' in out
    assert "reward 1 | status ok | policy v3-v4 | chosen: best" in out
    assert "status max_tokens" in out and "environment answered:" in out
    assert main(["show", str(tmp_path), "--task", "t1"]) == 0  # the last step by default
    out = capsys.readouterr().out
    assert "1 episodes kept of RL step 5" in out and "task t1" in out and "task t0" not in out
    assert main(["show", str(tmp_path), "--task", "t7"]) == 2  # the kept ones listed
    assert "no kept episode of that task at step 5; kept there: t0, t1" in capsys.readouterr().err
    assert main(["show", str(tmp_path), "--step", "9"]) == 2
    assert "RL steps with transcripts: 4-5" in capsys.readouterr().err
    assert main(["show", str(tmp_path), "--heldout"]) == 2
    assert "no transcripts of held-out evaluations" in capsys.readouterr().err


def test_show_prints_control_characters_as_escapes_not_as_commands(tmp_path, capsys):
    """The model's text, a tool's output and a task id may hold terminal escapes (a window
    title, the clipboard by OSC 52, clearing the screen): shown as ``\\xNN``."""
    traj = _traj(0, 1.0)
    traj.task_id = "t\x1b]0;owned\x07"
    traj.steps[-1].action_text = "\x1b]52;c;aGk=\x07<answer>5</answer>\x1b[2J\x9b\x7f"
    TranscriptLog(tmp_path, TEMPLATE, "qwen3").write_step(1, [Group("g0", 0, None, 0, [traj])])
    assert main(["show", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert not any(c in out for c in "\x1b\x07\x9b\x7f")
    assert "\\x1b]52;c;aGk=\\x07<answer>5</answer>\\x1b[2J\\x9b\\x7f" in out
    assert "t\\x1b]0;owned\\x07" in out


def test_success_rate_and_mean_reward_are_told_apart():
    """A shaped reward: the success rate counts episodes above 0, the mean reward averages."""
    trajs = [_traj(0, 0.5), _traj(1, 0.0), _traj(2, 1.0), _traj(3, 0.1)]
    ev = score([Group("g", 0, None, 0, trajs, lost=1)])
    assert ev.success == pytest.approx(3 / 5)  # the lost episode counts as a failure
    assert ev.reward == pytest.approx(1.6 / 4)  # over the scored episodes


def _metrics(run: Path, rewards: list[float], heldout: list[tuple[int, float]], cut: int):
    (run / "tensorboard").mkdir(parents=True)
    (run / "config.yaml").write_text("rollout:\n  groups_per_batch: 4\n")
    lines = [{"step": s, "wall_time": 0.0, "eval/success_fraction": v} for s, v in heldout]
    for step, r in enumerate(rewards, 1):
        lines.append(
            {
                "step": step,
                "wall_time": 0.0,
                "step_time/wall_s": 1.0,
                "rollout/reward_mean": r,
                "count/rollout/groups_filtered_total": 4.0 * step,
                "count/rollout/episodes_total": 32.0 * step,
                "count/rollout/status/max_tokens_total": float(cut * step),
            }
        )
    text = "".join(json.dumps(line) + "\n" for line in lines)
    (run / "tensorboard" / "metrics.jsonl").write_text(text)


@pytest.mark.parametrize(
    "rewards, heldout, kind",
    [
        ([0.2, 0.4, 0.6], [(0, 0.30), (3, 0.10)], "not learning"),
        ([0.2, 0.2, 0.2], [(0, 0.30), (3, 0.60)], "learning"),
        ([0.1, 0.3, 0.6], [], "learning"),
        ([0.3, 0.3, 0.3], [(0, 0.30), (3, 0.31)], "not learning"),
    ],
    ids=["heldout-falls", "heldout-rises", "no-heldout-reward-rises", "flat"],
)
def test_the_report_names_a_run_that_does_not_learn(tmp_path, rewards, heldout, kind):
    run = tmp_path / "run"
    _metrics(run, rewards, heldout, cut=4)
    report = write_report(run)
    assert report.learning.kind == kind
    text = report.markdown.read_text()
    assert f"## Learning: {kind}" in text
    # 3 steps x 4 groups trained, 12 filtered: half; 12 of 96 episodes cut at the limit.
    assert "50 % of the groups (12) were dropped as uniform" in text
    assert "12 % of the episodes (12) were cut at the token limit" in text
    if heldout and heldout[-1][1] < heldout[0][1]:
        assert "held-out success fell" in report.learning.advice
    # The command to read the episodes is ready to paste: this run, a step it has.
    show = f"tunix-agentic show {run} --heldout --step 3" if heldout else f"show {run} --step 3"
    assert show in report.learning.advice


def test_no_verdict_without_data():
    assert learning_verdict(LearningFigures(0, 0.0, 0.0)).kind == "no-data"


def test_a_decay_longer_than_the_run_is_named_with_the_setting_that_fits(caplog):
    cfg = load_config(CONFIG, ["sft.steps=400"])
    message = lr_decay_warning("sft", 400, cfg.sft.optimizer)
    assert "over 2000 steps" in message and "sft.steps=400" in message
    assert "sft.optimizer.decay_steps=350" in message
    assert lr_decay_warning("sft", 2000, cfg.sft.optimizer) is None  # the config's own
    assert lr_decay_warning("sft", 0, cfg.sft.optimizer) is None
    fitted = load_config(CONFIG, ["sft.steps=400", "sft.optimizer.decay_steps=350"])
    assert lr_decay_warning("sft", 400, fitted.sft.optimizer) is None
    with caplog.at_level(logging.WARNING, logger="tunix_agentic.run_setup"):
        Trainer(load_config(CONFIG, [*TINY_RUN_OVERRIDES, "sft.steps=40"]), progress=False)
    assert "but sft.steps=40" in caplog.text


class _StepReturnsTuple(ArithmeticEnv):
    async def step(self, action):  # the mistake: a gym-style tuple
        return "", 0.0, True, {}


class _ResetReturnsDict(Environment):
    async def reset(self, task):  # the mistake: a dict instead of the prompt text
        return {"prompt": task.prompt}

    async def step(self, action):
        return StepResult("", 0.0, True)


register_env("_test_step_tuple", tasks=ArithmeticTasks())(_StepReturnsTuple)
register_env("_test_reset_dict", tasks=ArithmeticTasks())(_ResetReturnsDict)


@pytest.mark.parametrize(
    "env, method, expected, line",
    [
        ("_test_step_tuple", "_StepReturnsTuple.step", "expected StepResult", "async def step"),
        ("_test_reset_dict", "_ResetReturnsDict.reset", "expected str", "async def reset"),
    ],
    ids=["step-returns-tuple", "reset-returns-dict"],
)
def test_a_broken_environment_contract_stops_at_start_naming_the_file_and_line(
    tmp_path, env, method, expected, line
):
    overrides = [*TINY_RUN_OVERRIDES, "sft.steps=0", f"env.name={env}", f"run_dir={tmp_path}"]
    with pytest.raises(ConfigError) as info:
        Trainer(load_config(CONFIG, overrides), progress=False)
    message = str(info.value)
    assert method in message and expected in message
    lines = Path(__file__).read_text().splitlines()
    number = next(i for i, text in enumerate(lines, 1) if method.split(".")[0] in text)
    number = next(i for i, text in enumerate(lines, 1) if i > number and line in text)
    assert f"{__file__}:{number}" in message


def test_records_are_bounded_per_step(tmp_path):
    log = TranscriptLog(tmp_path, TEMPLATE, "qwen3")
    trajs = [_traj(i, float(np.float32(i % 3) / 2)) for i in range(20)]
    records = log.write_step(1, [Group("g0", 0, None, 0, trajs)])
    assert len(records) == 6
    lines = (tmp_path / "transcripts" / "step_000001.jsonl").read_text().splitlines()
    assert [json.loads(line)["episode_id"] for line in lines] == [r["episode_id"] for r in records]
