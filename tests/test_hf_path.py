"""The real-model path end to end on CPU: a trained built-in agent exported to Hugging Face
layout, loaded by transformers (same logits, same token ids), trained further through
``model.source: hf`` (its HF tokenizer and Jinja chat template), exported again, served."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tunix_agentic.cli.main import main
from tunix_agentic.config import ConfigError, load_config
from tunix_agentic.export import engine_from_config
from tunix_agentic.inference import SamplingParams
from tunix_agentic.models.char_tokenizer import CharTokenizer
from tunix_agentic.models.hf import load_hf_model, save_hf
from tunix_agentic.serving import SGLangEngine, start_server
from tunix_agentic.testing import TINY_RUN_OVERRIDES
from tunix_agentic.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]
CONFIG = str(REPO / "configs" / "calculator_tiny.yaml")
RUN = [*TINY_RUN_OVERRIDES, "engine.max_seq_len=128", "rl.steps=1", "rl.checkpoint_every=0"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("builtin") / "run"
    assert main(["train", "--config", CONFIG, "--quiet", f"run_dir={run}", *RUN]) == 0
    return run


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("export") / "hf"
    assert main(["export", str(trained), "--to", str(out)]) == 0
    return out


def test_the_export_is_a_hugging_face_model_directory(exported):
    names = {p.name for p in exported.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    assert json.loads((exported / "config.json").read_text())["model_type"] == "llama"


def test_transformers_loads_the_export_with_our_logits_and_ids(trained, exported):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(exported).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(exported))
    text = "<|im_start|>user\nCompute 12 * 7.<|im_end|>\n<|im_start|>assistant\n"
    ids = CharTokenizer(128).encode(text)
    assert tok(text, add_special_tokens=False)["input_ids"] == ids
    ours = load_hf_model(exported)
    logits = np.asarray(ours(jnp.asarray([ids]), jnp.arange(len(ids))[None])[0])
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits.numpy()
    np.testing.assert_allclose(logits, want, atol=1e-4, rtol=0)


def test_training_continues_through_the_hf_path_and_exports_again(exported, tmp_path):
    run = tmp_path / "hf-run"
    overrides = [
        *RUN,
        f"run_dir={run}",
        "model.source=hf",
        f"model.path={exported}",
        "sft.steps=0",  # the export is already warm-started
    ]
    cfg = load_config(CONFIG, overrides)
    assert cfg.model.source == "hf" and cfg.model.d_model == 32  # the shape came from config.json
    trainer = Trainer(cfg, progress=False)
    assert type(trainer.tokenizer).__name__ == "HFTokenizer"
    assert type(trainer.template).__name__ == "JinjaChatTemplate"
    result = trainer.run()
    assert result.steps == 1 and (run / "checkpoints").is_dir()
    again = tmp_path / "hf-again"
    assert main(["export", str(run), "--to", str(again), "--dtype", "bfloat16"]) == 0
    assert json.loads((again / "config.json").read_text())["dtype"] == "bfloat16"
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(again)
    assert str(model.dtype) == "torch.bfloat16"


def test_a_missing_or_unsupported_model_dir_is_a_config_error(tmp_path, exported):
    with pytest.raises(ConfigError, match="model.path"):
        load_config(CONFIG, ["model.source=hf", f"model.path={tmp_path / 'none'}"])
    bad = tmp_path / "bad"
    bad.mkdir()
    config = json.loads((exported / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "attention_bias": True}))
    with pytest.raises(ConfigError, match="attention_bias"):
        load_config(CONFIG, ["model.source=hf", f"model.path={bad}"])
    assert main(["export", str(tmp_path), "--to", str(tmp_path / "x")]) == 2


async def test_serve_an_hf_dir_and_follow_training_by_path(exported, trained, tmp_path):
    """serve-engine --params HF_DIR serves it; /update_weights_from_disk loads an HF dir."""
    cfg = load_config(CONFIG, [*RUN])
    engine, info = engine_from_config(cfg, str(exported))
    assert engine.model_config.d_model == 32 and info["model_path"] == str(exported.absolute())
    # Another policy, written as an HF dir inside the allowed directory.
    other = load_hf_model(exported)
    state = nnx.state(other, nnx.Param)
    nnx.update(other, jax.tree.map(lambda x: x * 1.5, state))
    allowed = tmp_path / "weights"
    save_hf(other, allowed / "v1")
    runner, port = await start_server(engine, model_info=info, weight_dirs=[allowed])
    client = SGLangEngine(f"http://127.0.0.1:{port}")
    try:
        prompt = CharTokenizer(128).encode("<|im_start|>user\nCompute 3 * 4.<|im_end|>\n")
        greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
        before = await client.generate(prompt, greedy)
        async with aiohttp.ClientSession() as session:
            body = {"model_path": str(allowed / "v1"), "weight_version": "7"}
            async with session.post(
                f"http://127.0.0.1:{port}/update_weights_from_disk", json=body
            ) as resp:
                out = await resp.json()
        assert resp.status == 200 and out["success"], out
        after = await client.generate(prompt, greedy)
        assert after.versions == [7] * len(after.token_ids)
        assert after.token_ids != before.token_ids  # the new policy answers
    finally:
        await client.close()
        await runner.cleanup()
        await engine.close()


QWEN3_DIMS = {  # config.json fields of Qwen3-0.6B and -1.7B (public model cards)
    "0.6b": dict(hidden_size=1024, intermediate_size=3072, num_attention_heads=16),
    "1.7b": dict(hidden_size=2048, intermediate_size=6144, num_attention_heads=16),
}


@pytest.mark.parametrize(
    "recipe,size",
    [
        ("qwen3_0.6b_gpu", "0.6b"),
        ("qwen3_1.7b_gpu", "1.7b"),
        ("qwen3_0.6b_tpu_v5e", "0.6b"),
        ("qwen3_1.7b_tpu_v5e8", "1.7b"),
        ("math_python_qwen3_0.6b_gpu", "0.6b"),
        ("swe_lite_qwen3_1.7b_gpu", "1.7b"),
    ],
    ids=lambda v: str(v),
)
def test_the_real_model_recipes_load_and_take_their_shape_from_the_model_dir(
    recipe, size, tmp_path
):
    config = {
        "model_type": "qwen3",
        "vocab_size": 151936,
        "num_hidden_layers": 28,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        **QWEN3_DIMS[size],
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    cfg = load_config(REPO / "configs" / f"{recipe}.yaml", [f"model.path={tmp_path}"])
    assert cfg.model.source == "hf" and cfg.model.vocab_size == 151936
    assert cfg.model.d_model == config["hidden_size"] and cfg.model.qk_norm
    # bf16 compute; full fine-tuning keeps a float32 master copy (LoRA adapters are f32).
    assert cfg.model.dtype == "bfloat16" and cfg.sft.steps == 0
    assert cfg.learner.lora.enabled or cfg.learner.optimizer.master_dtype == "float32"
    assert cfg.engine.max_seq_len >= cfg.agent.max_new_tokens
    if cfg.learner.mesh.devices:  # a multi-chip recipe: its meshes fit the devices named
        for mesh in (cfg.learner.mesh, cfg.engine.mesh):
            start, stop = map(int, mesh.devices.split(":"))
            assert mesh.fsdp * mesh.tp == stop - start
        rows = cfg.rollout.group_size * cfg.rollout.groups_per_batch
        assert rows % (cfg.learner.mesh.fsdp * cfg.learner.micro_batch_rows) == 0
