"""One place for sharding (tunix_agentic/sharding.py): the rules on literal shapes, then the
same train steps on 1 device and on 8 fake CPU devices (fsdp, fsdp x tp, micro-batched),
the engine serving from a sharded model, a disaggregated learner -> engine weight sync,
and two processes on 127.0.0.1 training together (CPU collectives)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from tunix_agentic.metrics import read_scalars
from tunix_agentic.models.transformer import ModelConfig, Transformer
from tunix_agentic.sharding import (
    MeshConfig,
    logical_axes,
    make_mesh,
    put_batch,
    spec_for,
    tree_shardings,
)
from tunix_agentic.testing import TINY_RUN_OVERRIDES, cli

WORKER = Path(__file__).with_name("sharding_worker.py")
ROOT = Path(__file__).resolve().parents[1]


class _Mesh:  # spec_for reads only .shape
    def __init__(self, **shape):
        self.shape = shape


def test_specs_map_logical_axes_and_replicate_what_does_not_divide():
    mesh = _Mesh(fsdp=4, tp=2)
    assert spec_for(("embed", "heads"), (64, 32), mesh) == P("fsdp", "tp")
    assert spec_for(("vocab", "embed"), (100, 64), mesh) == P("tp", "fsdp")
    assert spec_for(("vocab", "embed"), (99, 64), mesh) == P(None, "fsdp")  # 99 % 2
    assert spec_for(("embed", "mlp"), (6, 32), mesh) == P(None, "tp")  # 6 % 4
    assert spec_for((None,), (64,), mesh) == P(None)
    # A mesh axis of size 1 is not named (same layout, simpler specs).
    assert spec_for(("embed", "heads"), (64, 32), _Mesh(fsdp=4, tp=1)) == P("fsdp", None)


def test_optimizer_moments_follow_their_parameters_and_counters_replicate():
    model = Transformer(ModelConfig(), rngs=nnx.Rngs(0))
    _, params = nnx.split(model, nnx.Param)
    opt_state = optax.adamw(1e-3).init(params)
    axes = {
        jax.tree_util.keystr(path): logical_axes(path, np.ndim(leaf))
        for path, leaf in jax.tree_util.tree_leaves_with_path(opt_state)
    }
    mu_q = next(k for k in axes if ".mu" in k and "q_proj" in k)
    nu_down = next(k for k in axes if ".nu" in k and "down_proj" in k)
    count = next(k for k in axes if k.endswith(".count"))
    norm = next(k for k in axes if ".mu" in k and "final_norm" in k)
    assert axes[mu_q] == ("embed", "heads")
    assert axes[nu_down] == ("mlp", "embed")
    assert axes[count] == ()
    assert axes[norm] == (None,)
    # On a one-device mesh everything is replicated (and nothing fails).
    shardings = tree_shardings(params, make_mesh(MeshConfig()))
    assert all(s.spec == P(*([None] * len(s.spec))) for s in jax.tree.leaves(shardings))


def test_bad_mesh_configs_are_refused_with_the_field_named():
    with pytest.raises(ValueError, match="mesh.fsdp"):
        MeshConfig(fsdp=0)
    with pytest.raises(ValueError, match="mesh.tp"):
        MeshConfig(tp=0)
    with pytest.raises(ValueError, match="mesh.devices"):
        MeshConfig(devices="first four")
    with pytest.raises(ValueError, match=r"fsdp=2 x tp=1 does not fit 1 device"):
        make_mesh(MeshConfig(fsdp=2))
    assert MeshConfig().trivial and not MeshConfig(fsdp=-1).trivial
    assert make_mesh(MeshConfig(fsdp=-1)).shape == {"fsdp": len(jax.devices()), "tp": 1}


def test_a_batch_whose_rows_do_not_split_over_fsdp_is_refused():
    mesh = make_mesh(MeshConfig())
    out = put_batch({"input_ids": np.arange(6).reshape(3, 2)}, mesh)
    np.testing.assert_array_equal(np.asarray(out["input_ids"]), np.arange(6).reshape(3, 2))

    class Four:
        shape = {"fsdp": 4}

    with pytest.raises(ValueError, match="not a multiple of the mesh's fsdp size 4"):
        put_batch({"input_ids": np.zeros((6, 2))}, Four())


def _run(args: list[str], devices: int, timeout: float = 600) -> subprocess.Popen:
    env = {
        **os.environ,
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": str(ROOT),
    }
    return subprocess.Popen(
        [sys.executable, str(WORKER), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(proc: subprocess.Popen, timeout: float = 600) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    line = next(x for x in out.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def _same_training(a: dict, b: dict) -> None:
    np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(a["grad_norm"], b["grad_norm"], rtol=1e-5)
    np.testing.assert_allclose(a["params"], b["params"], atol=1e-4)
    assert a["mi"] == pytest.approx(b["mi"], abs=1e-4)


@pytest.mark.slow
def test_one_device_and_eight_fake_devices_train_and_serve_alike():
    r = _result(_run(["devices"], devices=8))
    assert r["devices"] == 8
    one = r["one"]
    assert len(one["params"]) > 10_000 and one["mi"] is not None
    for name in ("none", "fsdp8", "fsdp4_tp2", "fsdp2_micro4", "micro4_remat"):
        _same_training(r[name], one)
    _same_training(r["lora_fsdp4_tp2"], r["lora_one"])  # LoRA: a sharded base, adapters
    assert r["lora_one"]["params"] != one["params"]
    # The weights really were split: fsdp on the model dimension, tp on heads / mlp / vocab.
    assert "P('fsdp', 'tp')" in r["fsdp4_tp2"]["specs"]
    assert "P(None, 'fsdp')" in r["fsdp8"]["specs"]
    # A sharded engine (fsdp 2 x tp 2 on devices 4-7) decodes the same greedy tokens.
    assert r["engine_spec_devices"] == [4, 5, 6, 7]
    assert r["engine_sharded"] == r["engine_one"]
    # Disaggregated: learner on devices 0-3, engine on 4-7; the synced weights live on
    # the engine's devices and generate what the learner's policy generates.
    assert r["disagg_engine_devices"] == [4, 5, 6, 7]
    assert r["disagg_engine"] == r["disagg_reference"]
    assert r["disagg_engine"] != r["disagg_untrained"]  # the learner's, not its own
    m = r["master_fsdp8"]
    assert m["dtypes"] == ["float32"] and m["engine_dtypes"] == ["bfloat16"]
    assert m["sharded"] and np.isfinite(m["loss"])
    assert r["coloc_engine"] == r["disagg_reference"]  # colocated: same devices, own layout


@pytest.mark.slow
def test_a_disaggregated_run_trains_from_the_cli_on_eight_fake_devices(tmp_path):
    """As a user runs it: the engine on devices 0-3 (tp 2), the learner on 4-7 (fsdp 4),
    micro-batched; the run trains, syncs weights and evaluates."""
    run = tmp_path / "run"
    cmd = cli(
        "train",
        "--config",
        str(ROOT / "configs" / "calculator_tiny.yaml"),
        *TINY_RUN_OVERRIDES,
        "rl.steps=2",
        "sft.steps=5",
        "learner.mesh={fsdp: 4, devices: '4:8'}",
        "learner.micro_batch_rows=2",
        "engine.mesh={tp: 2, devices: '0:2'}",
        f"run_dir={run}",
    )
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
        "JAX_PLATFORMS": "cpu",
    }
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2
    scalars = read_scalars(run / "tensorboard")
    assert len(scalars["learner/loss"]) == 2
    assert "learner/collapse/mutual_information_nats" in scalars


def test_a_learner_mesh_the_machine_cannot_hold_fails_before_any_work(tmp_path):
    from tunix_agentic.config import ConfigError, load_config
    from tunix_agentic.trainer import Trainer

    config = load_config(
        ROOT / "configs" / "calculator_tiny.yaml",
        [f"learner.mesh={{fsdp: {len(jax.devices()) + 1}}}", f"run_dir={tmp_path / 'run'}"],
    )
    with pytest.raises(ConfigError, match=r"learner.mesh: mesh fsdp=\d+ x tp=1 does not fit"):
        Trainer(config, progress=False)
    assert not (tmp_path / "run" / "checkpoints").exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_train_sharded_steps_together_and_agree():
    port = _free_port()
    procs = [_run(["multihost", str(i), "2", str(port)], devices=2) for i in range(2)]
    reference = _run(["reference"], devices=1)
    results = [_result(p) for p in procs]
    ref = _result(reference)
    assert sorted(r["process"] for r in results) == [0, 1]
    for r in results:
        assert r["global_devices"] == 4 and r["local_devices"] == 2
        assert "P(None, 'fsdp')" in r["specs"]  # split across both processes' devices
        _same_training(r, ref)
    assert results[0]["params"] == results[1]["params"]  # one model, gathered on each
