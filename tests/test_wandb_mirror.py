"""``metrics.wandb``: every scalar mirrored to an offline W&B run, read back from the run's
own ``.wandb`` file (its record log, parsed with wandb's protobufs)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tunix_agentic.config import ConfigError, load_config
from tunix_agentic.metrics.config import MetricsConfig, WandbConfig
from tunix_agentic.metrics.recorder import MetricsRecorder
from tunix_agentic.metrics.wandb_mirror import SFT_STEP_KEY, STEP_KEY, WandbMirror

CONFIG = str(Path(__file__).parents[1] / "configs" / "calculator_tiny.yaml")
_BLOCK = 32 * 1024  # the record log's block size (LevelDB's log format)


def _records(path: Path) -> list:
    """The records of a ``.wandb`` file as written so far."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    records, pos, chunk = [], 7, b""  # after the 7-byte file header
    while pos + 7 <= len(data):
        if _BLOCK - pos % _BLOCK < 7:  # a block's tail too short for a header: padding
            pos += _BLOCK - pos % _BLOCK
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        if kind == 0:
            break
        chunk += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = pb.Record()
            record.ParseFromString(chunk)
            records.append(record)
            chunk = b""
    return records


def _history(run_root: Path) -> list[dict]:
    """The logged rows of the one offline W&B run under ``run_root``. ``finish()`` returns
    before wandb's own process has written the run out: wait (bounded) for its exit
    record."""
    (path,) = run_root.glob("wandb/offline-run-*/run-*.wandb")
    deadline = time.monotonic() + 60
    while True:
        records = _records(path)
        kinds = [r.WhichOneof("record_type") for r in records]
        if "exit" in kinds or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert "exit" in kinds, kinds
    return [
        {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
        for r, kind in zip(records, kinds, strict=True)
        if kind == "history"
    ]


def test_every_write_is_mirrored_against_the_rl_step(tmp_path):
    pytest.importorskip("wandb")
    recorder = MetricsRecorder(tmp_path / "tb")
    mirror = WandbMirror(WandbConfig(project="unit"), tmp_path, {"seed": 0})
    recorder.add_write_listener(mirror)
    recorder.add_time("model_call", 0.25)
    recorder.write_step(1, {"reward": 0.5})
    recorder.write_step(2, {"reward": 0.75})
    recorder.scalars(
        {"eval/success_fraction": 0.4}, step=1
    )  # late: an evaluation that started at 1
    mirror.close()
    recorder.scalars({"after/close": 1.0}, step=3)  # kept here, not mirrored
    recorder.close()
    rows = [{k: v for k, v in r.items() if not k.startswith("_")} for r in _history(tmp_path)]
    assert [r[STEP_KEY] for r in rows] == [1, 2, 1]
    assert rows[0]["reward"] == 0.5 and rows[0]["time/model_call_s"] == 0.25
    assert rows[1]["reward"] == 0.75 and rows[2] == {"eval/success_fraction": 0.4, STEP_KEY: 1}


def test_a_run_mirrors_its_scalars_offline_into_its_dir(observed_run):
    pytest.importorskip("wandb")
    rows = _history(observed_run)
    losses = [(r[STEP_KEY], r["learner/loss"]) for r in rows if "learner/loss" in r]
    jsonl = (observed_run / "tensorboard" / "metrics.jsonl").read_text().splitlines()
    expected = [
        (r["step"], r["learner/loss"]) for r in map(json.loads, jsonl) if "learner/loss" in r
    ]
    # The same values at the same steps (the mirror gets them before float32 storage).
    assert [s for s, _ in losses] == [s for s, _ in expected] == [1, 2]
    assert [v for _, v in losses] == pytest.approx([v for _, v in expected])
    # The same names as TensorBoard's flat ones: the step's parts at their RL step, and
    # the warm start on its own axis of SFT steps.
    steps = [r for r in rows if "step_time/wall_s" in r]
    assert [r[STEP_KEY] for r in steps] == [1, 2]
    assert all("step_time/train_s" in r and "engine/host_gap_fraction" in r for r in steps)
    sft = [r for r in rows if "sft/loss" in r]
    assert [r[SFT_STEP_KEY] for r in sft] == [0, 3]  # sft.steps=4: the first and the last


@pytest.mark.parametrize(
    "override, key",
    [
        ("metrics.wandb.mode=cloud", "metrics.wandb.mode"),
        ("metrics.wandb.project=' '", "metrics.wandb.project"),
        ("metrics.latency_samples=-1", "metrics.latency_samples"),
        ("metrics.layout=maybe", "metrics.layout"),
    ],
    ids=["mode", "blank-project", "negative-samples", "layout"],
)
def test_bad_metrics_settings_name_their_key(override, key):
    with pytest.raises((ConfigError, ValueError), match=key.replace(".", r"\.")):
        load_config(CONFIG, [override])


def test_defaults_mirror_nothing():
    cfg = MetricsConfig()
    assert cfg.wandb.project is None and cfg.latency_samples == 2048 and cfg.layout
