"""GGUF conversion on tiny models written here: a random transformers Llama / Qwen3 is
written as llama.cpp writes it (Llama's query/key rows reordered for its RoPE kernel),
converted back, and must compute transformers' logits; what cannot be carried over is
refused naming the GGUF key. (The real SmolLM2 GGUF: tests/test_real_model.py.)"""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the gguf package reads GGUF files (pip install gguf)")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tunix_agentic.cli.main import main  # noqa: E402
from tunix_agentic.models.gguf import GGUFConversionError, convert_gguf  # noqa: E402

DIMS = dict(
    vocab_size=260,
    hidden_size=48,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=12,
    initializer_range=0.2,
)
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"


def _byte_tokens() -> list[str]:
    """GPT-2's byte-to-character table: the 256 byte-level tokens, in byte order."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def _llama_cpp_order(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's q/k row order (what our converter must undo)."""
    out, inp = weight.shape
    return weight.reshape(heads, 2, out // heads // 2, inp).swapaxes(1, 2).reshape(out, inp)


def _write_gguf(model, arch: str, path) -> None:
    cfg = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(256)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_rope_freq_base(1e4)
    w.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    tokens = [*_byte_tokens(), "Ġt", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([1] * 257 + [3, 3, 3])
    w.add_token_merges(["Ġ t"])
    w.add_eos_token_id(258)
    w.add_bos_token_id(259)
    w.add_chat_template(TEMPLATE)
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    layer = {
        "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.v_proj.weight": "attn_v.weight",
        "self_attn.o_proj.weight": "attn_output.weight",
        "self_attn.q_norm.weight": "attn_q_norm.weight",
        "self_attn.k_norm.weight": "attn_k_norm.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
        "input_layernorm.weight": "attn_norm.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
    }
    for name, tensor in model.state_dict().items():
        rest = ""
        if name.startswith("model.layers."):
            _, _, i, rest = name.split(".", 3)
            target = f"blk.{i}.{layer[rest]}"
        else:
            target = names[name]
        array = tensor.numpy().astype(np.float32)
        if arch == "llama" and rest == "self_attn.q_proj.weight":
            array = _llama_cpp_order(array, cfg.num_attention_heads)
        elif arch == "llama" and rest == "self_attn.k_proj.weight":
            array = _llama_cpp_order(array, cfg.num_key_value_heads)
        w.add_tensor(target, np.ascontiguousarray(array))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _hf(arch: str):
    torch.manual_seed(0)
    if arch == "qwen3":
        config = transformers.Qwen3Config(**DIMS, tie_word_embeddings=False, rope_theta=1e4)
        return transformers.Qwen3ForCausalLM(config).eval()
    config = transformers.LlamaConfig(**DIMS, tie_word_embeddings=False, rope_theta=1e4)
    return transformers.LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("arch", ["llama", "qwen3"], ids=["llama", "qwen3"])
def test_a_converted_gguf_computes_the_original_models_logits(arch, tmp_path):
    from tunix_agentic.models.hf import load_hf_model
    from tunix_agentic.models.hf_tokenizer import HFTokenizer

    original = _hf(arch)
    _write_gguf(original, arch, tmp_path / "m.gguf")
    assert main(["convert", "--gguf", str(tmp_path / "m.gguf"), "--to", str(tmp_path / "hf")]) == 0
    ids = np.random.default_rng(0).integers(0, 256, (2, 17))
    with torch.no_grad():
        want = original(torch.tensor(ids)).logits.numpy()
        reread = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
        np.testing.assert_allclose(reread(torch.tensor(ids)).logits.numpy(), want, atol=1e-4)
    ours = load_hf_model(tmp_path / "hf")
    import jax.numpy as jnp

    got = np.asarray(ours(jnp.asarray(ids), jnp.broadcast_to(jnp.arange(17), ids.shape))[0])
    np.testing.assert_allclose(got, want, atol=1e-4)
    tok = HFTokenizer.from_dir(tmp_path / "hf")
    assert tok.eos_token == "<|im_end|>" and tok.chat_template == TEMPLATE
    assert tok.encode(" t<|im_end|>") == [256, 258]  # the merge and the special token


def test_unsupported_ggufs_are_refused_naming_the_key(tmp_path, capsys):
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "gpt2")
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GGUFConversionError, match="general.architecture='gpt2'"):
        convert_gguf(tmp_path / "m.gguf", tmp_path / "out")
    assert main(["convert", "--gguf", str(tmp_path / "m.gguf"), "--to", str(tmp_path / "o")]) == 2
    assert "general.architecture" in capsys.readouterr().err
