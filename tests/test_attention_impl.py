"""``model.attention: dot_product`` (``jax.nn.dot_product_attention``) against the einsum
path, the reference: same logits without a cache, through the dense cache and through
paged blocks, and the same greedy tokens from the real engine in both KV layouts."""

import asyncio
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tunix_agentic.config import ConfigError, load_config
from tunix_agentic.inference import EngineConfig, SamplingParams
from tunix_agentic.models.config import ModelConfig
from tunix_agentic.models.hf import build_model, resolve_model_config, save_hf
from tunix_agentic.models.transformer import init_cache
from tunix_agentic.resume import _check_same_model
from tunix_agentic.testing import TINY, tiny_model

PROMPTS = [[3, 14, 15, 92, 65, 35, 89, 79, 32], [5, 6, 7], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39]]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=9)


@pytest.fixture(scope="module")
def models():
    """The tiny model (GQA: 4 heads over 2 kv heads) twice, same weights, each attention."""
    ref = tiny_model(seed=3)
    dot = tiny_model(seed=3, attention="dot_product")
    assert TINY.num_heads // TINY.num_kv_heads > 1
    assert ref.cfg.attention == "einsum" and dot.cfg.attention == "dot_product"
    same = jax.tree.map(
        lambda a, b: bool(jnp.array_equal(a, b)),
        nnx.state(ref, nnx.Param),
        nnx.state(dot, nnx.Param),
    )
    assert all(jax.tree.leaves(same))
    return ref, dot


def test_training_forward_matches(models):
    ref, dot = models
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, TINY.vocab_size, (3, 13)), jnp.int32)
    # Row 2 right-padded: its padding repeats the last position, as the learner's batches do.
    positions = jnp.asarray(np.minimum(np.arange(13)[None], [[12], [12], [7]]), jnp.int32)
    want, _ = ref(tokens, positions)
    got, _ = dot(tokens, positions)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_gradients_match(models):
    ref, dot = models
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 128, (2, 9)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(9), (2, 9))

    @nnx.jit
    def grads(model):
        def loss(m):
            logits, _ = m(tokens, positions)
            return jax.nn.log_softmax(logits)[..., 0].mean()

        return nnx.grad(loss)(model)

    for a, b in zip(jax.tree.leaves(grads(ref)), jax.tree.leaves(grads(dot)), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)


def test_dense_and_paged_caches_match(models):
    """Prefill two rows (one right-padded) and decode a step, through the dense cache and
    through scrambled block tables: the same logits as the einsum path's dense cache."""
    ref, dot = models
    ids = jnp.array([PROMPTS[0] + [1, 2, 3], PROMPTS[1] + [0] * 9], jnp.int32)
    lengths = jnp.array([12, 3])
    pos = jnp.where(jnp.arange(12)[None] < lengths[:, None], jnp.arange(12)[None], 32)
    tables = jnp.array([[7, 2, 9, 10], [0, 5, 10, 10]], jnp.int32)  # 10: no block
    runs = {
        "einsum dense": (ref, init_cache(TINY, 2, 32), {}),
        "dot_product dense": (dot, init_cache(TINY, 2, 32), {}),
        "dot_product paged": (dot, init_cache(TINY, 10, 8), {"tables": tables}),
    }
    steps = [
        dict(tokens=ids, positions=pos, logits_at=lengths - 1),
        dict(tokens=jnp.array([[3], [4]], jnp.int32), positions=lengths[:, None]),
    ]
    for args in steps:
        out = {}
        for name, (model, cache, extra) in runs.items():
            out[name], cache = model(cache=cache, **args, **extra)
            runs[name] = (model, cache, extra)
        for name in runs:
            np.testing.assert_allclose(
                out[name], out["einsum dense"], rtol=1e-5, atol=1e-5, err_msg=name
            )


@pytest.mark.parametrize(
    "engine_cfg",
    [
        dict(max_slots=4, max_seq_len=32, decode_steps=4),
        dict(max_slots=4, max_seq_len=32, decode_steps=4, kv_layout="paged", kv_block_size=8),
    ],
    ids=["dense", "paged"],
)
async def test_engine_greedy_outputs_identical(models, make_engine, engine_cfg):
    ref, dot = models
    outs = []
    for model in (ref, dot):
        engine = make_engine(model, EngineConfig(**engine_cfg))
        done = await asyncio.gather(*(engine.generate(p, GREEDY) for p in PROMPTS))
        outs.append([d.token_ids for d in done])
    assert outs[0] == outs[1]
    assert all(len(ids) == GREEDY.max_new_tokens for ids in outs[0])


def test_bad_value_is_a_clear_error():
    with pytest.raises(ValueError, match=r"model\.attention must be one of einsum, dot_product"):
        ModelConfig(attention="flash")
    with pytest.raises(ConfigError, match=r"model\.attention must be one of .*'splash'"):
        load_config(None, ["model.attention=splash"])
    assert load_config(None, ["model.attention=dot_product"]).model.attention == "dot_product"
    assert load_config(None).model.attention == "einsum"


def test_resume_ignores_the_attention_key():
    """Attention is how, not what: a checkpoint saved with either (or before the key
    existed) resumes with either; a shape key still has to match."""
    now = dataclasses.replace(TINY, attention="dot_product")
    saved = dataclasses.asdict(TINY)
    _check_same_model(saved, now)
    _check_same_model({k: v for k, v in saved.items() if k != "attention"}, now)
    with pytest.raises(ConfigError, match=r"model\.d_model"):
        _check_same_model({**saved, "d_model": 8}, now)


def test_a_hugging_face_model_keeps_the_configured_attention(models, tmp_path):
    """``model.source: hf`` takes its shape from config.json but keeps ``attention``."""
    ref, _ = models
    save_hf(ref, tmp_path / "hf")
    cfg = ModelConfig(source="hf", path=str(tmp_path / "hf"), attention="dot_product")
    resolved = resolve_model_config(cfg)
    assert resolved.attention == "dot_product" and resolved.d_model == TINY.d_model
    loaded = build_model(resolved)
    assert all(layer.attn.cfg.attention == "dot_product" for layer in loaded.layers)
    tokens = jnp.asarray([PROMPTS[0]], jnp.int32)
    positions = jnp.arange(len(PROMPTS[0]))[None]
    np.testing.assert_allclose(
        loaded(tokens, positions)[0], ref(tokens, positions)[0], rtol=1e-5, atol=1e-5
    )
