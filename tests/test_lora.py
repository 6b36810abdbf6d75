"""LoRA: only adapters train, the base stays frozen, and the engine samples the merged policy."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tunix_agentic.checkpoint import Checkpointer
from tunix_agentic.cli.main import main
from tunix_agentic.config import load_config, save_config, to_dict
from tunix_agentic.export import engine_from_config, export_run, load_run_policy
from tunix_agentic.inference import EngineConfig, JaxEngine, SamplingParams
from tunix_agentic.learners.grpo import GRPOConfig, GRPOLearner
from tunix_agentic.learners.grpo_step import forward
from tunix_agentic.learners.lora import LoRAConfig, attach, init_adapters, merge
from tunix_agentic.models.hf import load_hf_model
from tunix_agentic.models.transformer import sequence_logprobs
from tunix_agentic.testing import TINY, TINY_RUN_OVERRIDES, on_policy_batch, tiny_model

REPO = Path(__file__).resolve().parents[1]


def _leaves(tree) -> dict[str, np.ndarray]:
    return {
        jax.tree_util.keystr(p): np.asarray(x)
        for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]
    }


def test_fresh_adapters_leave_the_model_unchanged_and_touch_only_their_targets():
    model = tiny_model(seed=1)
    base = nnx.state(model, nnx.Param)
    cfg = LoRAConfig(rank=2, targets=("q_proj", "down_proj"))
    adapters = init_adapters(base, cfg, jax.random.key(0))
    assert len(adapters) == 2 * model.cfg.num_layers
    assert all(np.all(np.asarray(a["b"]) == 0) for a in adapters.values())
    same = _leaves(merge(base, adapters, cfg.scale))
    for name, value in _leaves(base).items():
        np.testing.assert_array_equal(same[name], value)
    bumped = {k: {"a": v["a"], "b": jnp.ones_like(v["b"])} for k, v in adapters.items()}
    changed = {
        name
        for name, value in _leaves(merge(base, bumped, cfg.scale)).items()
        if not np.array_equal(value, _leaves(base)[name])
    }
    assert changed and all(("q_proj" in n or "down_proj" in n) and "kernel" in n for n in changed)
    with pytest.raises(ValueError, match="lora.targets"):
        LoRAConfig(rank=2, targets=("embed",))


def test_only_adapters_train_and_the_engine_samples_the_merged_policy():
    """verl #7495: rollouts kept sampling the base policy. Here the engine's outputs change
    after a LoRA update, and its logprobs are the merged policy's."""
    model = tiny_model(seed=2)
    base_before = _leaves(nnx.state(model, nnx.Param))
    config = GRPOConfig(lora=LoRAConfig(rank=4, alpha=8.0))
    learner = GRPOLearner(
        model,
        dataclasses.replace(
            config, optimizer=dataclasses.replace(config.optimizer, learning_rate=0.05)
        ),
    )
    prompt = [5, 9, 14, 3, 22]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)

    async def generate(params=None, version=0):
        engine = JaxEngine(learner.policy_model(), EngineConfig(max_slots=1, max_seq_len=64))
        try:
            if params is not None:
                await engine.update_weights(params, version)
            return await engine.generate(prompt, greedy)
        finally:
            await engine.close()

    engine_model = learner.policy_model()
    before = asyncio.run(generate())
    batch = on_policy_batch(model)
    for _ in range(8):
        out = learner.train_step(batch)
    assert np.isfinite(out["loss"])
    for name, value in _leaves(learner.base).items():  # the base is frozen
        np.testing.assert_array_equal(value, base_before[name])
    assert any(np.any(np.asarray(a["b"]) != 0) for a in learner.state.params.values())
    # The engine built before training, given the merged weights on sync, now answers otherwise.
    engine = JaxEngine(engine_model, EngineConfig(max_slots=1, max_seq_len=64))

    async def synced():
        try:
            await engine.update_weights(learner.params_for_engine(), 1)
            return await engine.generate(prompt, greedy)
        finally:
            await engine.close()

    after = asyncio.run(synced())
    assert after.token_ids != before.token_ids and after.versions == [1] * len(after.token_ids)
    ids = jnp.asarray([prompt + after.token_ids])
    want = np.asarray(sequence_logprobs(learner.policy_model(), ids))[0, len(prompt) - 1 :]
    np.testing.assert_allclose(after.logprobs, want, atol=2e-5)


def test_a_lora_run_checkpoints_resumes_and_exports_merged(tmp_path):
    config = str(REPO / "configs" / "calculator_tiny.yaml")
    run = tmp_path / "lora-run"
    overrides = [
        *TINY_RUN_OVERRIDES,
        "engine.max_seq_len=128",
        "rl.steps=2",
        "rl.checkpoint_every=1",
        "learner.lora.rank=4",
        f"run_dir={run}",
    ]
    assert main(["train", "--config", config, "--quiet", *overrides]) == 0
    cfg = load_config(run / "config.yaml")
    assert cfg.learner.lora.rank == 4
    policy, version = load_run_policy(run, cfg)
    assert version == 2
    assert main(["train", "--resume", str(run), "--quiet", "rl.steps=3"]) == 0
    policy3, version3 = load_run_policy(run, load_config(run / "config.yaml"))
    assert version3 == 3
    out = tmp_path / "export"
    assert main(["export", str(run), "--to", str(out)]) == 0
    exported = load_hf_model(out)
    ids = jnp.asarray([[2, 30, 40, 50, 60, 70]])
    np.testing.assert_allclose(
        np.asarray(sequence_logprobs(exported, ids)),
        np.asarray(sequence_logprobs(policy3, ids)),
        atol=1e-6,
    )
    del policy  # (its adapters may not have moved: this tiny run rarely scores a reward)


def test_export_and_serving_merge_trained_adapters(tmp_path):
    """A LoRA run's checkpoint holds base + adapters; what export and serve-engine read is
    the merged policy, not the base."""
    cfg = load_config(
        REPO / "configs" / "calculator_tiny.yaml",
        [
            "learner.lora.rank=2",
            f"run_dir={tmp_path}",
            *[
                f"model.{k}={v}"
                for k, v in (
                    ("d_model", TINY.d_model),
                    ("num_heads", TINY.num_heads),
                    ("num_kv_heads", TINY.num_kv_heads),
                    ("head_dim", TINY.head_dim),
                    ("ffn_dim", TINY.ffn_dim),
                )
            ],
        ],
    )
    model = tiny_model(seed=5)
    assert model.cfg == dataclasses.replace(cfg.model)
    learner = GRPOLearner(model, cfg.learner)
    rng = np.random.default_rng(0)
    learner.state.params = {  # as if trained: b no longer zero
        k: {"a": v["a"], "b": jnp.asarray(rng.normal(0, 0.5, v["b"].shape), v["b"].dtype)}
        for k, v in learner.state.params.items()
    }
    save_config(cfg, tmp_path / "config.yaml")
    ckpt = Checkpointer(tmp_path / "checkpoints")
    ckpt.save(
        4,
        learner.checkpoint_params(),
        learner.state.opt_state,
        {"version": 4, "model": to_dict(cfg.model)},
    )
    ckpt.close()
    ids = jnp.asarray([[2, 30, 40, 50, 60, 70]])
    want = np.asarray(sequence_logprobs(learner.policy_model(), ids))
    base = np.asarray(sequence_logprobs(model, ids))
    assert np.abs(want - base).max() > 1e-3  # the adapters matter
    policy, version = load_run_policy(tmp_path, cfg)
    assert version == 4
    np.testing.assert_allclose(np.asarray(sequence_logprobs(policy, ids)), want, atol=1e-6)
    export_run(tmp_path, tmp_path / "hf")
    exported = np.asarray(sequence_logprobs(load_hf_model(tmp_path / "hf"), ids))
    np.testing.assert_allclose(exported, want, atol=1e-6)
    engine, _ = engine_from_config(cfg, str(tmp_path))
    served = nnx.merge(nnx.graphdef(policy), engine.params)
    np.testing.assert_allclose(np.asarray(sequence_logprobs(served, ids)), want, atol=1e-6)
    asyncio.run(engine.close())


def test_adapters_stay_float32_on_a_bfloat16_model_so_small_steps_count():
    model = tiny_model(seed=3, dtype="bfloat16")
    config = GRPOConfig(lora=LoRAConfig(rank=2))
    learner = GRPOLearner(
        model,
        dataclasses.replace(
            config, optimizer=dataclasses.replace(config.optimizer, learning_rate=1e-5)
        ),
    )
    assert all(a["a"].dtype == jnp.float32 for a in learner.state.params.values())
    learner.train_step(on_policy_batch(model))
    assert any(np.any(np.asarray(a["b"]) != 0) for a in learner.state.params.values())
    assert learner.params_for_engine()["embed"]["embedding"].dtype == jnp.bfloat16
    with pytest.raises(ValueError, match="match no kernel"):
        merge(learner.base, {"layers/0/attn/nope/kernel": {"a": 0, "b": 0}}, 1.0)


def _lora_loss_and_grads(form, dtype: str = "float32", remat: bool = False):
    """The summed logprobs of a fixed batch under ``form`` (``merge`` or ``attach``) of a
    tiny model's base and non-zero adapters, and their gradients by the adapters."""
    model = tiny_model(seed=4, dtype=dtype)
    graphdef, base = nnx.split(model, nnx.Param)
    cfg = LoRAConfig(rank=3, alpha=6.0, targets=("q_proj", "v_proj", "up_proj", "down_proj"))
    adapters = init_adapters(base, cfg, jax.random.key(1))
    adapters = {  # trained-looking adapters: b away from zero
        k: {"a": v["a"], "b": 0.3 * jax.random.normal(jax.random.key(i), v["b"].shape)}
        for i, (k, v) in enumerate(sorted(adapters.items()))
    }
    ids = jnp.asarray(np.random.default_rng(0).integers(3, TINY.vocab_size, (3, 11)), jnp.int32)

    def loss(ad):
        lp, _ = forward(graphdef, form(base, ad, cfg.scale), ids, 1.0, remat=remat)
        return jnp.sum(lp * jnp.linspace(0.5, 1.5, lp.shape[1]))

    return jax.value_and_grad(loss), adapters


@pytest.mark.parametrize("remat", [False, True], ids=["plain", "remat"])
def test_adapters_beside_the_kernel_give_the_merged_policys_loss_and_gradients(remat):
    """The learner's loss applies each adapter beside its frozen kernel (``attach``); its
    loss and adapter gradients equal those through the merged kernels (``merge``, what
    the engine samples), float32, to rounding."""
    fn, adapters = _lora_loss_and_grads(merge, remat=remat)
    want, want_grads = jax.jit(fn)(adapters)
    fn, _ = _lora_loss_and_grads(attach, remat=remat)
    got, got_grads = jax.jit(fn)(adapters)
    np.testing.assert_allclose(float(got), float(want), rtol=1e-5)
    for name, g in _leaves(want_grads).items():
        assert np.abs(g).max() > 0, name  # every adapter moves the loss
        np.testing.assert_allclose(_leaves(got_grads)[name], g, rtol=2e-4, atol=2e-6)
    base_loss = jax.jit(fn)(jax.tree.map(jnp.zeros_like, adapters))[0]
    assert abs(float(base_loss) - float(want)) > 1e-3  # the adapters change the policy


def test_the_attached_step_holds_no_float32_copy_of_the_weights():
    """On a bfloat16 model the merged form's loss builds a float32 array of every adapted
    kernel's shape (the upcast merge); the attached form builds none."""
    shape = f"f32[{TINY.d_model},{TINY.ffn_dim}]"  # up_proj's kernel: [in, out]
    for form, expect in ((merge, True), (attach, False)):
        fn, adapters = _lora_loss_and_grads(form, dtype="bfloat16")
        assert (shape in str(jax.make_jaxpr(fn)(adapters))) is expect, form.__name__
