"""Tests for tunix_agentic.config: YAML loading, dotted overrides, validation and round trips."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from tunix_agentic.config import (
    RLConfig,
    RunConfig,
    apply_overrides,
    from_dict,
    load_config,
    save_config,
    to_dict,
)
from tunix_agentic.learners.state import OptimizerConfig

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "configs" / "calculator_tiny.yaml"


def test_defaults():
    cfg = load_config(None)
    assert cfg == RunConfig()
    assert cfg.rl.steps == 60
    assert cfg.rollout.group_size == 8
    assert cfg.learner.optimizer == OptimizerConfig(learning_rate=1e-4)
    assert cfg.sft.optimizer == OptimizerConfig(learning_rate=3e-3, warmup_steps=50)


def test_load_yaml_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        "seed: 7\n"
        "run_dir: runs/x\n"
        "model: {d_model: 32, num_layers: 1}\n"
        "rollout:\n  group_size: 4\n  filter_uniform_groups: false\n"
        "learner:\n  aggregation: seq_mean_token_mean\n  optimizer: {learning_rate: 0.01, warmup_steps: 5}\n"
        "rl: {steps: 3, eval_temperature: 1}\n"
    )
    cfg = load_config(path)
    assert cfg.seed == 7
    assert cfg.run_dir == "runs/x"
    assert (cfg.model.d_model, cfg.model.num_layers, cfg.model.num_heads) == (32, 1, 4)
    assert cfg.rollout.group_size == 4
    assert cfg.rollout.filter_uniform_groups is False
    assert cfg.learner.aggregation == "seq_mean_token_mean"
    assert cfg.learner.optimizer == OptimizerConfig(learning_rate=0.01, warmup_steps=5)
    assert cfg.rl == RLConfig(steps=3, eval_temperature=1.0)
    assert isinstance(cfg.rl.eval_temperature, float)  # int in YAML, float in the config
    assert cfg.engine == RunConfig().engine  # untouched sections keep defaults


def test_empty_yaml_file_gives_defaults(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert load_config(str(path)) == RunConfig()


def test_overrides_applied_with_types(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("rl: {steps: 3}\nrollout: {group_size: 2}\n")
    cfg = load_config(
        path,
        [
            "rl.steps=20",
            "rollout.group_size=4",
            "learner.optimizer.learning_rate=0.001",
            "rollout.filter_uniform_groups=false",
            "agent.context_rule=append_only",
            "seed=3",
        ],
    )
    assert cfg.rl.steps == 20 and type(cfg.rl.steps) is int
    assert cfg.rollout.group_size == 4
    assert cfg.learner.optimizer.learning_rate == 0.001
    assert type(cfg.learner.optimizer.learning_rate) is float
    assert cfg.rollout.filter_uniform_groups is False
    assert cfg.agent.context_rule == "append_only"
    assert cfg.seed == 3
    assert cfg.sft.optimizer.learning_rate == 3e-3  # the other optimizer is untouched


def test_later_override_wins():
    assert load_config(None, ["rl.steps=1", "rl.steps=2"]).rl.steps == 2


def test_apply_overrides_does_not_mutate_input():
    data = {"rl": {"steps": 3}}
    out = apply_overrides(data, ["rl.steps=5", "rollout.group_size=2"])
    assert data == {"rl": {"steps": 3}}
    assert out == {"rl": {"steps": 5}, "rollout": {"group_size": 2}}


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("rl.stepz=3", "rl.stepz"),
        ("learner.optimizer.lr=0.1", "learner.optimizer.lr"),
        ("trainer.steps=3", "trainer"),
        ("rl.steps=abc", "rl.steps"),
        ("rl.steps=1.5", "rl.steps"),
        ("rl.steps=true", "rl.steps"),
        ("rollout.filter_uniform_groups=3", "rollout.filter_uniform_groups"),
        ("run_dir=5", "run_dir"),
        ("rl=5", "rl"),
        ("rollout.group_size=0", "rollout.group_size"),
        ("model.num_heads=3", "model.num_heads"),
        ("model.head_dim=15", "model.head_dim"),
        ("learner.aggregation=sum", "learner.aggregation"),
        ("rl.eval_temperature=-1", "rl.eval_temperature"),
        ("env.tool_timeout_s=0", "env.tool_timeout_s"),
        ("agent.temperature=0.7", "learner.temperature"),
    ],
    ids=[
        "unknown_key",
        "unknown_nested_key",
        "unknown_section",
        "int_given_string",
        "int_given_float",
        "int_given_bool",
        "bool_given_int",
        "str_given_int",
        "section_given_scalar",
        "group_size_zero",
        "heads_not_multiple_of_kv_heads",
        "odd_head_dim",
        "unknown_aggregation",
        "negative_temperature",
        "zero_timeout",
        "temperature_mismatch",
    ],
)
def test_invalid_override_names_key(override, key):
    with pytest.raises(ValueError, match=re.escape(key)):
        load_config(None, [override])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("rl.steps", "must look like key.path=value"),
        ("rl..steps=3", "has an empty key"),
        ("=3", "has an empty key"),
    ],
    ids=["no_equals", "empty_segment", "empty_path"],
)
def test_malformed_override(override, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        load_config(None, [override])


def test_override_through_a_scalar_is_not_a_section(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("seed: 1\n")
    with pytest.raises(ValueError, match="'seed' is not a section"):
        load_config(path, ["seed.x=1"])


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ValueError, match=re.escape(f"config file {str(missing)!r} does not exist")):
        load_config(missing)


def test_yaml_top_level_list(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- rl\n- steps\n")
    with pytest.raises(ValueError, match="must hold a mapping at the top level"):
        load_config(path)


def test_unknown_key_in_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("rollout:\n  groupsize: 4\n")
    with pytest.raises(ValueError, match=re.escape("unknown config key 'rollout.groupsize'")):
        load_config(path)


def _non_default() -> RunConfig:
    return load_config(
        None,
        [
            "seed=11",
            "model.num_layers=1",
            "rollout.group_size=3",
            "learner.advantage=rloo",
            "learner.clip_high=0.3",
            "learner.optimizer.learning_rate=0.002",
            "sft.tool_fraction=0.5",
            "rl.checkpoint_every=10",
            "engine.session_reuse=false",
        ],
    )


@pytest.mark.parametrize("cfg", [RunConfig(), _non_default()], ids=["defaults", "non_default"])
def test_to_dict_from_dict_round_trip(cfg):
    data = to_dict(cfg)
    assert isinstance(data["learner"]["optimizer"], dict)
    assert from_dict(RunConfig, data) == cfg


def test_to_dict_is_plain():
    data = to_dict(RunConfig())
    assert data["rl"] == {
        "steps": 60,
        "eval_tasks": 200,
        "eval_temperature": 0.0,
        "checkpoint_every": 10,
        "keep_checkpoints": 3,
        "eval_every": 0,
        "eval_priority": "high",
    }
    assert yaml.safe_load(yaml.safe_dump(data)) == data  # only plain YAML types


@pytest.mark.parametrize("cfg", [RunConfig(), _non_default()], ids=["defaults", "non_default"])
def test_save_then_load(tmp_path, cfg):
    path = tmp_path / "saved.yaml"
    save_config(cfg, path)
    assert load_config(path) == cfg


def test_configs_are_frozen():
    cfg = RunConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.seed = 1  # type: ignore[misc]


@pytest.mark.skipif(not SHIPPED.is_file(), reason="configs/calculator_tiny.yaml not written yet")
def test_shipped_calculator_tiny_loads():
    cfg = load_config(SHIPPED)
    assert isinstance(cfg, RunConfig)
    assert load_config(SHIPPED, ["rl.steps=2"]).rl.steps == 2


def test_exponent_floats_without_a_dot_are_numbers():
    cfg = load_config(None, ["learner.optimizer.learning_rate=1e-3"])
    assert cfg.learner.optimizer.learning_rate == pytest.approx(1e-3)


def test_cli_finds_the_default_config_outside_the_repository(tmp_path, monkeypatch):
    from tunix_agentic.cli.main import _default_config

    monkeypatch.chdir(tmp_path)  # no configs/ here: the checkout's copy is the default
    found = _default_config()
    assert found is not None and Path(found).name == "calculator_tiny.yaml"
    assert load_config(found) == load_config(SHIPPED)


def test_a_run_of_another_environment_is_named_after_it():
    """``env.name=countdown`` on the default recipe trains into ``runs/countdown``, not the
    recipe's ``runs/calculator_tiny``; a run_dir given, or a resume's, still wins."""
    recipe = Path(__file__).resolve().parents[1] / "configs" / "calculator_tiny.yaml"
    assert load_config(recipe).run_dir == "runs/calculator_tiny"
    assert load_config(recipe, ["env.name=countdown"]).run_dir == "runs/countdown"
    given = ["env.name=countdown", "run_dir=runs/mine"]
    assert load_config(recipe, given).run_dir == "runs/mine"
    assert load_config(recipe, ["rl.steps=3"]).run_dir == "runs/calculator_tiny"
