"""The run's config as TensorBoard HParams, read back with TensorBoard's own loader."""

from __future__ import annotations

from tensorboard.backend.event_processing import event_accumulator
from tensorboard.plugins.hparams import metadata

from tunix_agentic.config import load_config, to_dict
from tunix_agentic.metrics import MetricsRecorder
from tunix_agentic.metrics.hparams import scalar_leaves, write_hparams


def test_scalar_leaves_flatten_by_dotted_path():
    tree = {"a": 1, "b": {"c": 0.5, "d": {"e": "x", "f": True}}, "g": None, "h": [1, 2]}
    assert scalar_leaves(tree) == {"a": 1, "b.c": 0.5, "b.d.e": "x", "b.d.f": True}


def _session_start(log_dir):
    acc = event_accumulator.EventAccumulator(str(log_dir), size_guidance={"tensors": 0})
    acc.Reload()
    content = acc.PluginTagToContent(metadata.PLUGIN_NAME)
    assert set(content) == {metadata.SESSION_START_INFO_TAG}
    return metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])


def test_run_config_read_back_as_hparams(tmp_path):
    cfg = load_config(None, ["rl.steps=7", "metrics.layout=false"])
    with MetricsRecorder(tmp_path) as rec:
        written = write_hparams(rec, to_dict(cfg), 0, trial_id="run-a")
    info = _session_start(tmp_path)
    assert info.group_name == "run-a"
    hp = info.hparams
    assert set(hp) == set(written) and "seed" in hp
    assert hp["rl.steps"].number_value == 7
    assert hp["metrics.layout"].bool_value is False
    lr = cfg.learner.optimizer.learning_rate
    assert hp["learner.optimizer.learning_rate"].number_value == lr
    assert hp["rollout.group_size"].number_value == cfg.rollout.group_size
    assert isinstance(cfg.run_dir, str) and hp["run_dir"].string_value == cfg.run_dir
    assert "metrics.wandb.project" not in hp  # unset: left out
