"""``model.scan_layers``: the forward without a cache as one scan over the layers' stacked
weights gives the unrolled model's logits, gradients and train steps, on the same tree."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tunix_agentic.config import load_config, resolve_model
from tunix_agentic.learners.grpo import GRPOConfig, GRPOLearner
from tunix_agentic.learners.grpo_step import forward
from tunix_agentic.learners.lora import LoRAConfig, attach, init_adapters
from tunix_agentic.models.layer_scan import stack_layers
from tunix_agentic.resume import _check_same_model
from tunix_agentic.testing import TINY, on_policy_batch, tiny_model

ROOT = Path(__file__).resolve().parents[1]
LAYERS = 3  # more than two: the scan's carry passes through a middle layer


def _pair(**overrides) -> tuple[nnx.GraphDef, nnx.GraphDef, nnx.State]:
    """The graphs of one tiny model unrolled and scanned, and its (shared) state."""
    unrolled, state = nnx.split(tiny_model(seed=5, num_layers=LAYERS, **overrides))
    scanned, _ = nnx.split(tiny_model(seed=5, num_layers=LAYERS, scan_layers=True, **overrides))
    return unrolled, scanned, state


def _ids(rows: int = 3, length: int = 13) -> jax.Array:
    rng = np.random.default_rng(0)
    return jnp.asarray(rng.integers(3, TINY.vocab_size, (rows, length)), jnp.int32)


def _flat(tree) -> dict[str, np.ndarray]:
    return {
        jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(tree)
    }


@pytest.mark.parametrize(
    "overrides",
    [{}, {"qk_norm": True, "tie_embeddings": False}],
    ids=["tied", "qk_norm_untied"],
)
def test_scanned_logits_equal_the_unrolled(overrides):
    unrolled, scanned, state = _pair(**overrides)
    ids = _ids()
    positions = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
    run = jax.jit(lambda g, s: nnx.merge(g, s)(ids, positions)[0], static_argnums=0)
    want, got = run(unrolled, state), run(scanned, state)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    # The parameter tree is the unrolled model's (checkpoints, loading, sync unchanged).
    assert jax.tree.structure(nnx.state(nnx.merge(scanned, state))) == jax.tree.structure(state)


@pytest.mark.parametrize("remat", [False, True], ids=["plain", "remat"])
def test_scanned_gradients_equal_the_unrolled(remat):
    unrolled, scanned, state = _pair()
    ids = _ids()

    def loss(graphdef, s):
        lp, _ = forward(graphdef, s, ids, 1.0, remat=remat)
        return jnp.sum(lp * jnp.linspace(0.5, 1.5, lp.shape[1]))

    grad = jax.jit(jax.value_and_grad(loss, argnums=1), static_argnums=0)
    (want, want_g), (got, got_g) = grad(unrolled, state), grad(scanned, state)
    np.testing.assert_allclose(float(got), float(want), rtol=1e-6)
    want_g, got_g = _flat(want_g), _flat(got_g)
    assert got_g.keys() == want_g.keys()
    for name, g in want_g.items():
        np.testing.assert_allclose(got_g[name], g, rtol=1e-4, atol=1e-6, err_msg=name)


def test_layers_that_differ_run_unrolled():
    """An adapter on one layer only: the layers cannot share a loop body, so the scanned
    model falls back to its loop (the same logits)."""
    unrolled, scanned, state = _pair()
    _, base = nnx.split(nnx.merge(unrolled, state), nnx.Param)
    cfg = LoRAConfig(rank=2, targets=("q_proj",))
    adapters = init_adapters(base, cfg, jax.random.key(0))
    one = {k: v for k, v in adapters.items() if k.startswith("layers/0/")}
    one = jax.tree.map(lambda x: x + 0.1, one)  # b away from zero: the adapter acts
    policy = attach(base, one, cfg.scale)
    assert stack_layers(list(nnx.merge(scanned, policy).layers)) is None
    ids = _ids()
    want, _ = forward(unrolled, policy, ids, 1.0)
    got, _ = forward(scanned, policy, ids, 1.0)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


def _train(config: GRPOConfig, scan: bool, steps: int = 2):
    """Metrics of ``steps`` train steps, the engine's weights after them, and how many
    loops the step's program holds."""
    model = tiny_model(seed=5, num_layers=LAYERS, scan_layers=scan)
    learner = GRPOLearner(model, config)
    batch = on_policy_batch(tiny_model(seed=5, num_layers=LAYERS))
    batch.loss_mask[1, 20:] = 0.0  # rows of different lengths
    s = learner.state
    step = learner._step.__wrapped__  # the jitted step inside the compile counter
    text = step.lower(s.params, s.opt_state, learner.ref_params, learner.base, batch).as_text()
    metrics = [learner.train_step(batch) for _ in range(steps)]
    return metrics, _flat(learner.params_for_engine()), text.count("stablehlo.while")


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"remat": True, "micro_batch_rows": 2},
        {"lora": LoRAConfig(rank=2, alpha=4.0)},
        {"lora": LoRAConfig(rank=2, alpha=4.0), "remat": True},
    ],
    ids=["full", "remat_micro", "lora", "lora_remat"],
)
def test_the_grpo_train_step_is_the_same_scanned(extra):
    """The learner's step (two of them: the second from moved weights) with scan on and
    off: the same metrics and the same weights for the engine. Under LoRA the attached
    ``LowRank`` kernels are stacked and scanned like any leaf."""
    config = GRPOConfig(mi_pairs=0, **extra)
    want, want_params, want_loops = _train(config, scan=False)
    got, got_params, got_loops = _train(config, scan=True)
    assert got_loops > want_loops  # the layers did run as a scan (no fallback)
    for a, b in zip(want, got, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key
    assert want[0]["grad_norm"] > 0
    for name, p in want_params.items():
        np.testing.assert_allclose(got_params[name], p, rtol=1e-5, atol=1e-6, err_msg=name)


def test_model_scan_layers_is_read_from_the_config_and_kept_for_a_model_dir():
    recipe = str(ROOT / "configs" / "qwen3_0.6b_tpu_v5e.yaml")
    model_dir = ROOT / "tests" / "data" / "model_configs" / "Qwen3-0.6B"
    cfg = resolve_model(load_config(recipe, [f"model.path={model_dir}", "model.scan_layers=true"]))
    assert cfg.model.scan_layers and cfg.model.num_layers == 28  # config.json's shape
    off = resolve_model(load_config(recipe, [f"model.path={model_dir}", "model.scan_layers=false"]))
    assert dataclasses.replace(off.model, scan_layers=True) == cfg.model
    with pytest.raises(ValueError, match="model.scan_layers"):
        load_config(recipe, [f"model.path={model_dir}", "model.scan_layers=3"])


def test_a_run_resumes_with_scan_layers_switched():
    """The parameter tree is the same either way: a checkpoint of an unrolled run resumes
    scanned, and the reverse."""
    saved = dataclasses.asdict(TINY)
    _check_same_model(saved, dataclasses.replace(TINY, scan_layers=True))
    _check_same_model({**saved, "scan_layers": True}, TINY)
