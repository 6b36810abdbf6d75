"""Hugging Face checkpoints against transformers itself (test-only: torch CPU + transformers).

Tiny random Qwen3 (tied and untied embeddings) and Llama 3 (llama3 rope scaling)
models are built with transformers and saved to a temp dir; our loader reads
them. fp32 logits agree to 1e-4, our KV-cache decode equals our full forward,
what we export loads back in transformers with the same logits, and our
engine's greedy generation equals transformers' token for token.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from tunix_agentic.inference import EngineConfig, JaxEngine, SamplingParams
from tunix_agentic.models.hf import (
    UnsupportedCheckpointError,
    config_from_hf,
    load_hf_model,
    read_hf_config,
    save_hf,
)
from tunix_agentic.models.transformer import init_cache

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

DIMS = dict(
    vocab_size=97,
    hidden_size=48,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    initializer_range=0.2,  # logits far from uniform, so greedy choices are clear-cut
)


def _hf_model(kind: str, tied: bool):
    torch.manual_seed(0)
    if kind == "qwen3":
        config = transformers.Qwen3Config(**DIMS, tie_word_embeddings=tied, rope_theta=1e4)
        model = transformers.Qwen3ForCausalLM(config)
    else:
        scaling = {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,  # small, so the blend covers real bands
        }
        config = transformers.LlamaConfig(
            **DIMS, tie_word_embeddings=tied, rope_theta=5e5, rope_scaling=scaling
        )
        model = transformers.LlamaForCausalLM(config)
    return model.eval()


CASES = [("qwen3", True), ("qwen3", False), ("llama", False)]


@pytest.fixture(
    scope="module", params=CASES, ids=lambda c: f"{c[0]}-{'tied' if c[1] else 'untied'}"
)
def checkpoint(request, tmp_path_factory):
    kind, tied = request.param
    hf = _hf_model(kind, tied)
    path = tmp_path_factory.mktemp(f"{kind}-{tied}")
    hf.save_pretrained(path)  # safetensors
    return kind, hf, path


def _hf_logits(hf, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.tensor(ids)).logits.float().numpy()


def _our_logits(model, ids: np.ndarray) -> np.ndarray:
    positions = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
    return np.asarray(model(jnp.asarray(ids), positions)[0])


def _hf_greedy(hf, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt]),
            max_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def _engine_greedy(model, prompt: list[int], n: int) -> list[int]:
    async def run():
        engine = JaxEngine(model, EngineConfig(max_slots=1, max_seq_len=64, decode_steps=4))
        try:
            return await engine.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=n))
        finally:
            await engine.close()

    return asyncio.run(run()).token_ids


def test_logits_match_transformers(checkpoint):
    kind, hf, path = checkpoint
    model = load_hf_model(path, dtype="float32")
    cfg = model.cfg
    assert cfg.qk_norm == (kind == "qwen3")
    assert cfg.rope_scaling == ("llama3" if kind == "llama" else "none")
    ids = np.random.default_rng(0).integers(0, DIMS["vocab_size"], (2, 40))
    ours, theirs = _our_logits(model, ids), _hf_logits(hf, ids)
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)
    assert np.abs(theirs).max() > 1.0  # not a vacuous match of near-zero logits


def test_kv_cache_decode_equals_the_full_forward(checkpoint):
    _, _, path = checkpoint
    model = load_hf_model(path, dtype="float32")
    ids = np.random.default_rng(1).integers(0, DIMS["vocab_size"], (1, 24))
    full = _our_logits(model, ids)[0]
    cache = init_cache(model.cfg, 1, 64)
    prompt = 10
    logits, cache = model(
        jnp.asarray(ids[:, :prompt]), jnp.arange(prompt)[None], cache, logits_at=jnp.array([9])
    )
    steps = [np.asarray(logits[0])]
    for t in range(prompt, ids.shape[1]):
        logits, cache = model(jnp.asarray(ids[:, t : t + 1]), jnp.array([[t]]), cache)
        steps.append(np.asarray(logits[0, 0]))
    np.testing.assert_allclose(np.stack(steps), full[prompt - 1 :], atol=1e-4, rtol=0)


def test_export_loads_back_in_transformers(checkpoint, tmp_path):
    _, hf, path = checkpoint
    model = load_hf_model(path, dtype="float32")
    source = json.loads((path / "config.json").read_text())
    out = save_hf(model, tmp_path / "export", base_config=source)
    written = json.loads((out / "config.json").read_text())
    assert written["max_position_embeddings"] == source["max_position_embeddings"]
    again = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    ids = np.random.default_rng(2).integers(0, DIMS["vocab_size"], (1, 30))
    np.testing.assert_allclose(_hf_logits(again, ids), _hf_logits(hf, ids), atol=1e-5, rtol=0)
    # What we export, transformers generates from exactly as our engine does.
    prompt = [7, 3, 61, 12, 40]
    assert _engine_greedy(model, prompt, 16) == _hf_greedy(again, prompt, 16)
    # And our loader reads our export to the same config.
    assert read_hf_config(out) == dataclasses.replace(model.cfg, path=str(out))


def test_sharded_export_round_trips(checkpoint, tmp_path):
    _, _, path = checkpoint
    model = load_hf_model(path, dtype="float32")
    out = save_hf(model, tmp_path / "sharded", max_shard_bytes=20_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    back = load_hf_model(out, dtype="float32")
    ids = np.random.default_rng(3).integers(0, DIMS["vocab_size"], (1, 12))
    np.testing.assert_array_equal(_our_logits(back, ids), _our_logits(model, ids))


def test_engine_greedy_generation_equals_transformers(checkpoint):
    _, hf, path = checkpoint
    model = load_hf_model(path, dtype="float32")
    prompt = [5, 17, 33, 2, 71, 8]
    assert _engine_greedy(model, prompt, 20) == _hf_greedy(hf, prompt, 20)


def test_bfloat16_load_stays_close_to_fp32(checkpoint):
    _, hf, path = checkpoint
    model = load_hf_model(path, dtype="bfloat16")
    assert model.embed.embedding.dtype == jnp.bfloat16
    assert model.final_norm.scale.dtype == jnp.float32  # norms stay fp32
    ids = np.random.default_rng(4).integers(0, DIMS["vocab_size"], (1, 16))
    ours, theirs = _our_logits(model, ids), _hf_logits(hf, ids)
    # bf16 keeps 8 mantissa bits: the documented tolerance is 5 % of the logit range.
    assert np.abs(ours - theirs).max() < 0.05 * (theirs.max() - theirs.min())


@pytest.mark.parametrize(
    "change,field",
    [
        ({"attention_bias": True}, "attention_bias"),
        ({"use_sliding_window": True}, "use_sliding_window"),
        ({"num_experts": 8}, "num_experts"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),
        ({"model_type": "mistral"}, "mistral"),
        # Values of the wrong type or range, each named (before: a traceback or a silent run).
        ({"num_attention_heads": 0}, "num_attention_heads=0"),
        ({"vocab_size": None}, "vocab_size is required"),
        ({"rms_norm_eps": float("nan")}, "rms_norm_eps=nan"),
        ({"hidden_size": 32.7}, "hidden_size=32.7"),
        ({"intermediate_size": True}, "intermediate_size=True"),
        ({"rope_parameters": "x"}, "rope_parameters='x'"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": -1}}, "rope_theta=-1"),
        ({"tie_word_embeddings": "yes"}, "tie_word_embeddings"),
        ({"num_key_value_heads": 3}, "num_kv_heads"),
    ],
    ids=[
        "attention_bias",
        "sliding_window",
        "experts",
        "gelu",
        "yarn",
        "mistral",
        "zero_heads",
        "null_vocab",
        "nan_eps",
        "fractional_width",
        "bool_ffn",
        "rope_string",
        "negative_theta",
        "string_tie",
        "heads_not_a_multiple",
    ],
)
def test_unsupported_configs_are_refused_by_name(change, field):
    base = transformers.Qwen3Config(**DIMS).to_dict()
    with pytest.raises(UnsupportedCheckpointError, match=field):
        config_from_hf({**base, **change})


def test_missing_tensors_are_named(checkpoint, tmp_path):
    _, _, path = checkpoint
    from safetensors.flax import load_file, save_file

    tensors = load_file(str(path / "model.safetensors"))
    del tensors["model.norm.weight"]
    broken = tmp_path / "broken"
    broken.mkdir()
    save_file(tensors, str(broken / "model.safetensors"), metadata={"format": "pt"})
    (broken / "config.json").write_text((path / "config.json").read_text())
    with pytest.raises(UnsupportedCheckpointError, match="model.norm.weight"):
        load_hf_model(broken)


def test_loading_onto_a_mesh_reads_shards_and_keeps_the_logits(checkpoint, tmp_path):
    """Four CPU devices (a subprocess: the device count is fixed when JAX starts): every
    matrix whose first dimension divides is split over them, and the logits are the
    single-device ones."""
    _, _, path = checkpoint
    ids = np.random.default_rng(5).integers(0, DIMS["vocab_size"], (1, 12))
    want = _our_logits(load_hf_model(path, dtype="float32"), ids)
    np.save(tmp_path / "ids.npy", ids)
    probe = f"""
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh
from tunix_agentic.models.hf import first_axis_sharding, load_hf_model
mesh = Mesh(np.array(jax.devices()), ("fsdp",))
model = load_hf_model({str(path)!r}, dtype="float32", sharding=first_axis_sharding(mesh, "fsdp"))
kernel = model.layers[0].mlp.gate_proj.kernel[...]
assert len(kernel.sharding.device_set) == 4 and kernel.addressable_shards[0].data.shape[0] == kernel.shape[0] // 4
ids = jnp.asarray(np.load({str(tmp_path / "ids.npy")!r}))
np.save({str(tmp_path / "got.npy")!r}, np.asarray(model(ids, jnp.arange(ids.shape[1])[None])[0]))
"""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    subprocess.run([sys.executable, "-c", probe], check=True, env=env, timeout=300)
    np.testing.assert_allclose(np.load(tmp_path / "got.npy"), want, atol=1e-5, rtol=0)
