"""Hugging Face checkpoints: a local directory in, our Transformer out, and back again.

Reads ``config.json`` and ``*.safetensors`` (one file or a sharded
``model.safetensors.index.json``) of the Qwen3 dense family or Llama 3
(``rope_scaling`` of type ``llama3`` included) into :class:`Transformer`,
tensor by tensor: each one goes from the memory-mapped file to its device, or, where
a sharding is named, each device reads only its own shard of it, so no full
host copy of the model is made.
Configurations the model cannot run exactly (biases, sliding windows, mixtures
of experts, other rope scalings) are refused with an error naming the field.

:func:`save_hf` writes the same layout back (safetensors with ``format: pt``
metadata, ``config.json``, and the tokenizer files of a source directory), so
``transformers`` and SGLang load what we train. Nothing here touches the network.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tunix_agentic.models.transformer import ModelConfig, Transformer

# What a model directory's tokenizer and generation settings live in (copied on export).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "generation_config.json",
)
_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}
_ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}


class UnsupportedCheckpointError(ValueError):
    """The checkpoint's configuration is one this model cannot run exactly."""


# ------------------------------------------------------------------ config
_MISSING = object()


def _int_field(hf: dict[str, Any], key: str, default: Any = _MISSING) -> int:
    """``hf[key]`` as a whole number >= 1 (JSON's ``32.0`` too), else
    :class:`UnsupportedCheckpointError` naming the field (``null`` takes ``default``)."""
    value = hf.get(key)
    if value is None:
        if default is _MISSING:
            raise UnsupportedCheckpointError(f"config.json: {key} is required (a whole number)")
        return default
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not whole or value < 1:
        raise UnsupportedCheckpointError(
            f"config.json: {key}={value!r} must be a whole number >= 1"
        )
    return int(value)


def _float_field(hf: dict[str, Any], key: str, default: Any = _MISSING) -> float:
    """``hf[key]`` as a finite number > 0, else :class:`UnsupportedCheckpointError` naming
    the field (``null`` or absent takes ``default``)."""
    value = hf.get(key)
    if value is None:
        if default is _MISSING:
            raise UnsupportedCheckpointError(f"config.json: {key} is required (a number > 0)")
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (math.isfinite(value) and value > 0)
    ):
        raise UnsupportedCheckpointError(
            f"config.json: {key}={value!r} must be a finite number > 0"
        )
    return float(value)


def _rope(hf: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """``(theta, scaling)`` from either layout: transformers 5 ``rope_parameters`` or the
    older ``rope_theta`` + ``rope_scaling``."""
    params = hf.get("rope_parameters")
    if params is not None and not isinstance(params, dict):
        raise UnsupportedCheckpointError(
            f"config.json: rope_parameters={params!r:.60} must be an object"
        )
    if isinstance(params, dict):
        theta = _float_field(params, "rope_theta", _float_field(hf, "rope_theta", 10_000.0))
        kind = params.get("rope_type", params.get("type", "default"))
        return theta, (None if kind == "default" else params)
    scaling = hf.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, dict):
        raise UnsupportedCheckpointError(
            f"config.json: rope_scaling={scaling!r:.60} must be an object or null"
        )
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        scaling = None if kind == "default" else scaling
    return _float_field(hf, "rope_theta", 10_000.0), scaling


def config_from_hf(hf: dict[str, Any], *, dtype: str | None = None) -> ModelConfig:
    """Our :class:`ModelConfig` for a Hugging Face ``config.json`` (as a dict).

    ``dtype`` overrides the checkpoint's (``torch_dtype`` / ``dtype``; float32 if none).
    Raises :class:`UnsupportedCheckpointError` naming the first field we cannot honour.
    """
    kind = hf.get("model_type")
    if kind not in _ARCHITECTURES:
        raise UnsupportedCheckpointError(
            f"model_type={kind!r} is not supported (supported: {', '.join(_ARCHITECTURES)})"
        )

    def refuse(field: str, why: str) -> None:
        raise UnsupportedCheckpointError(f"{kind} checkpoint: {field}={hf.get(field)!r}: {why}")

    if hf.get("attention_bias"):
        refuse("attention_bias", "attention projections with biases are not supported")
    if hf.get("mlp_bias"):
        refuse("mlp_bias", "MLP biases are not supported")
    if hf.get("use_sliding_window") or (hf.get("sliding_window") is not None and kind == "llama"):
        refuse("use_sliding_window", "sliding-window attention is not supported")
    layer_types = hf.get("layer_types") or []
    if any(t != "full_attention" for t in layer_types):
        refuse("layer_types", "only full attention in every layer is supported")
    for moe in ("num_experts", "num_local_experts", "moe_intermediate_size"):
        if hf.get(moe):
            refuse(moe, "mixtures of experts are not supported")
    if hf.get("hidden_act", "silu") != "silu":
        refuse("hidden_act", "only SiLU (SwiGLU) MLPs are supported")
    theta, scaling = _rope(hf)
    rope: dict[str, Any] = {"rope_theta": theta}
    if scaling is not None:
        rope_type = scaling.get("rope_type", scaling.get("type"))
        if rope_type != "llama3":
            raise UnsupportedCheckpointError(
                f"{kind} checkpoint: rope scaling of type {rope_type!r} is not supported "
                "(supported: default, llama3)"
            )
        rope.update(
            rope_scaling="llama3",
            rope_scaling_factor=_float_field(scaling, "factor"),
            rope_low_freq_factor=_float_field(scaling, "low_freq_factor", 1.0),
            rope_high_freq_factor=_float_field(scaling, "high_freq_factor", 4.0),
            rope_original_max_len=_int_field(scaling, "original_max_position_embeddings"),
        )
    dtype = dtype or str(hf.get("dtype") or hf.get("torch_dtype") or "float32")
    if dtype not in _DTYPES:
        raise UnsupportedCheckpointError(f"dtype {dtype!r}: use one of {', '.join(_DTYPES)}")
    heads = _int_field(hf, "num_attention_heads")
    hidden = _int_field(hf, "hidden_size")
    tied = hf.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise UnsupportedCheckpointError(
            f"config.json: tie_word_embeddings={tied!r} must be true or false"
        )
    try:
        return ModelConfig(
            vocab_size=_int_field(hf, "vocab_size"),
            d_model=hidden,
            num_layers=_int_field(hf, "num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=_int_field(hf, "num_key_value_heads", heads),
            head_dim=_int_field(hf, "head_dim", hidden // heads),
            ffn_dim=_int_field(hf, "intermediate_size"),
            norm_eps=_float_field(hf, "rms_norm_eps", 1e-6),
            qk_norm=kind == "qwen3",
            tie_embeddings=tied,
            dtype=dtype,
            **rope,
        )
    except ValueError as exc:  # the shapes disagree (heads and kv heads, an odd head_dim)
        raise UnsupportedCheckpointError(f"config.json: {exc}") from None


def config_to_hf(cfg: ModelConfig, *, max_position_embeddings: int = 32_768) -> dict[str, Any]:
    """The ``config.json`` for ``cfg``: Qwen3 when it has q/k norms, else Llama."""
    kind = "qwen3" if cfg.qk_norm else "llama"
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling == "llama3":
        rope = {
            "rope_type": "llama3",
            "rope_theta": cfg.rope_theta,
            "factor": cfg.rope_scaling_factor,
            "low_freq_factor": cfg.rope_low_freq_factor,
            "high_freq_factor": cfg.rope_high_freq_factor,
            "original_max_position_embeddings": cfg.rope_original_max_len,
        }
    out = {
        "architectures": [_ARCHITECTURES[kind]],
        "model_type": kind,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.ffn_dim,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.norm_eps,
        "max_position_embeddings": max_position_embeddings,
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": False,
        "rope_parameters": rope,
        # The older spelling too, for readers before transformers 5 (SGLang, vLLM).
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None if rope["rope_type"] == "default" else rope,
        "dtype": cfg.dtype,
        "torch_dtype": cfg.dtype,
    }
    if kind == "llama":
        out["mlp_bias"] = False
    return out


# ------------------------------------------------------------- weight names
def weight_names(cfg: ModelConfig) -> Iterator[tuple[tuple[Any, ...], str, bool]]:
    """``(our parameter path, HF tensor name, transposed)`` for every parameter.

    HF linear weights are ``[out, in]``; ours (``nnx.Linear.kernel``) are ``[in, out]``.
    """
    yield ("embed", "embedding"), "model.embed_tokens.weight", False
    for i in range(cfg.num_layers):
        hf = f"model.layers.{i}."
        for ours in ("q_proj", "k_proj", "v_proj", "o_proj"):
            yield ("layers", i, "attn", ours, "kernel"), f"{hf}self_attn.{ours}.weight", True
        if cfg.qk_norm:
            yield ("layers", i, "attn", "q_norm", "scale"), f"{hf}self_attn.q_norm.weight", False
            yield ("layers", i, "attn", "k_norm", "scale"), f"{hf}self_attn.k_norm.weight", False
        for ours in ("gate_proj", "up_proj", "down_proj"):
            yield ("layers", i, "mlp", ours, "kernel"), f"{hf}mlp.{ours}.weight", True
        yield ("layers", i, "input_norm", "scale"), f"{hf}input_layernorm.weight", False
        yield (
            ("layers", i, "post_attn_norm", "scale"),
            f"{hf}post_attention_layernorm.weight",
            False,
        )
    yield ("final_norm", "scale"), "model.norm.weight", False
    if not cfg.tie_embeddings:
        yield ("lm_head", "kernel"), "lm_head.weight", True


def _tensor_files(directory: Path) -> dict[str, Path]:
    """HF tensor name -> the safetensors file holding it."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: directory / file for name, file in weight_map.items()}
    single = directory / "model.safetensors"
    files = [single] if single.is_file() else sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors under {directory}")
    from safetensors import safe_open

    out: dict[str, Path] = {}
    for file in files:
        with safe_open(str(file), framework="flax") as f:
            out.update({name: file for name in f.keys()})
    return out


def resolve_model_config(cfg: ModelConfig) -> ModelConfig:
    """``cfg`` with its shape read from ``cfg.path`` when ``cfg.source == "hf"``
    (source, path, dtype and how it runs kept: attention, attention_interpret,
    scan_layers); a built-in config unchanged."""
    if cfg.source != "hf":
        return cfg
    return dataclasses.replace(
        read_hf_config(cfg.path, dtype=cfg.dtype),
        attention=cfg.attention,
        attention_interpret=cfg.attention_interpret,
        scan_layers=cfg.scan_layers,
    )


def build_model(cfg: ModelConfig, *, seed: int = 0) -> Transformer:
    """The run's model: loaded from ``cfg.path`` (source hf) or freshly initialised."""
    if cfg.source == "hf":
        return load_hf_model(
            cfg.path, dtype=cfg.dtype, attention=cfg.attention, scan_layers=cfg.scan_layers
        )
    return Transformer(cfg, rngs=nnx.Rngs(seed))


# ------------------------------------------------------------------ loading
def read_hf_config(path: str | Path, *, dtype: str | None = None) -> ModelConfig:
    """The :class:`ModelConfig` of a HF model directory (``source="hf"``, ``path`` set)."""
    directory = Path(path)
    config = directory / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"{directory} has no config.json (not a Hugging Face model dir)")
    cfg = config_from_hf(json.loads(config.read_text()), dtype=dtype)
    return dataclasses.replace(cfg, source="hf", path=str(path))


def is_hf_dir(path: str | Path) -> bool:
    """Whether ``path`` looks like a Hugging Face model directory."""
    p = Path(path)
    return (p / "config.json").is_file() and any(p.glob("*.safetensors"))


def load_hf_model(
    path: str | Path,
    *,
    dtype: str | None = None,
    sharding: Callable[[tuple[Any, ...], tuple[int, ...]], jax.sharding.Sharding] | None = None,
    attention: str = "einsum",
    scan_layers: bool = False,
) -> Transformer:
    """A :class:`Transformer` with the weights of the HF model directory ``path``.

    ``dtype`` casts the weights (norm scales stay float32, as the model keeps
    them); ``sharding(param_path, shape)`` places each parameter (default: the
    default device; see :func:`first_axis_sharding`); ``attention`` is the model's
    ``model.attention`` and ``scan_layers`` its ``model.scan_layers``. Tensors are read
    one at a time from the memory-mapped files; with a sharding, shard by shard.
    """
    cfg = dataclasses.replace(
        read_hf_config(path, dtype=dtype), attention=attention, scan_layers=scan_layers
    )
    abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    return nnx.merge(graphdef, load_hf_params(path, state, cfg=cfg, sharding=sharding))


def load_hf_params(
    path: str | Path,
    params_like: Any,
    *,
    cfg: ModelConfig | None = None,
    sharding: Callable[[tuple[Any, ...], tuple[int, ...]], jax.sharding.Sharding] | None = None,
) -> Any:
    """``params_like`` (an ``nnx.State`` of the model's parameters; arrays or shapes)
    filled with the HF directory's tensors, each cast to the dtype it has there.

    Without ``sharding`` a tensor goes where the one it replaces lives (an array of
    ``params_like``), else to the default device. Raises
    :class:`UnsupportedCheckpointError` for a missing tensor or a shape that differs.
    """
    from safetensors import safe_open

    directory = Path(path)
    cfg = cfg or read_hf_config(directory)
    params_like = jax.tree.map(lambda x: x, params_like)  # a new tree: the caller's is not touched
    pure = nnx.to_pure_dict(params_like)
    files = _tensor_files(directory)
    names = list(weight_names(cfg))
    missing = [hf for _, hf, _ in names if hf not in files]
    if missing:
        raise UnsupportedCheckpointError(
            f"{directory}: {len(missing)} tensors the model needs are missing, e.g. {missing[:3]}"
        )
    handles: dict[Path, Any] = {}
    try:
        for ours, hf, transposed in names:
            file = files[hf]
            if file not in handles:
                handles[file] = safe_open(str(file), framework="flax").__enter__()
            node = _parent(pure, ours)
            like = node[ours[-1]]
            want = tuple(like.shape)
            stored = handles[file].get_slice(hf)
            shape = tuple(stored.get_shape())
            if (shape[::-1] if transposed else shape) != want:
                raise UnsupportedCheckpointError(
                    f"{hf}: shape {shape} does not match the model (expected "
                    f"{want[::-1] if transposed else want})"
                )
            if sharding is not None:
                node[ours[-1]] = _read_sharded(
                    stored, transposed, want, like.dtype, sharding(ours, want)
                )
                continue
            tensor = handles[file].get_tensor(hf)
            tensor = (tensor.T if transposed else tensor).astype(like.dtype)
            if isinstance(like, jax.Array):
                tensor = jax.device_put(tensor, like.sharding)
            node[ours[-1]] = tensor
    finally:
        for handle in handles.values():
            handle.__exit__(None, None, None)
    nnx.replace_by_pure_dict(params_like, pure)
    return params_like


def _parent(tree: dict, path: tuple[Any, ...]) -> dict:
    """The dict of a nested pure-dict ``tree`` that holds the leaf at ``path``."""
    for key in path[:-1]:
        tree = tree[key]
    return tree


def _read_sharded(
    stored: Any, transposed: bool, shape: tuple[int, ...], dtype: Any, target: Any
) -> jax.Array:
    """One parameter placed on ``target``, each device reading only its shard of the file."""

    def shard(index: tuple[slice, ...]) -> np.ndarray:
        part = stored[index[::-1] if transposed else index]
        part = part.T if transposed else part
        return np.asarray(part.astype(dtype))

    return jax.make_array_from_callback(shape, target, shard)


def first_axis_sharding(
    mesh: jax.sharding.Mesh, axis: str
) -> Callable[[tuple[Any, ...], tuple[int, ...]], jax.sharding.Sharding]:
    """A simple placement for :func:`load_hf_model`: each matrix split along its first
    dimension over mesh axis ``axis`` when it divides evenly, everything else replicated."""
    from jax.sharding import NamedSharding, PartitionSpec

    size = mesh.shape[axis]

    def place(path: tuple[Any, ...], shape: tuple[int, ...]) -> jax.sharding.Sharding:
        if len(shape) >= 2 and shape[0] % size == 0:
            return NamedSharding(mesh, PartitionSpec(axis))
        return NamedSharding(mesh, PartitionSpec())

    return place


# ------------------------------------------------------------------- saving
def save_hf(
    model: Transformer,
    out_dir: str | Path,
    *,
    tokenizer_dir: str | Path | None = None,
    dtype: str | None = None,
    max_shard_bytes: int = 4 * 2**30,
    base_config: dict[str, Any] | None = None,
) -> Path:
    """Write ``model`` as a Hugging Face directory: ``config.json``, safetensors (sharded
    with an index past ``max_shard_bytes``), and ``tokenizer_dir``'s tokenizer files.

    ``dtype`` casts every tensor on the way out (default: the model's dtype).
    ``base_config``: the ``config.json`` the model came from; its other fields
    (``max_position_embeddings``, token ids, ...) are kept, the shape is ours.
    """
    out = Path(out_dir)
    cfg = model.cfg
    dtype = dtype or cfg.dtype
    save_hf_weights(
        nnx.state(model, nnx.Param), cfg, out, dtype=dtype, max_shard_bytes=max_shard_bytes
    )
    base_config = dict(base_config or {})
    hf_config = {
        **base_config,
        **config_to_hf(
            dataclasses.replace(cfg, dtype=dtype),
            max_position_embeddings=int(base_config.get("max_position_embeddings", 32_768)),
        ),
    }
    (out / "config.json").write_text(json.dumps(hf_config, indent=2))
    if tokenizer_dir is not None:
        for name in TOKENIZER_FILES:
            src = Path(tokenizer_dir) / name
            if src.is_file() and src.resolve() != (out / name).resolve():
                shutil.copy(src, out / name)
    return out


def save_hf_weights(
    params: Any,
    cfg: ModelConfig,
    out_dir: str | Path,
    *,
    dtype: str | None = None,
    max_shard_bytes: int = 4 * 2**30,
) -> Path:
    """Write ``params`` (a model's ``nnx.Param`` state, or its pure dict) as Hugging Face
    safetensors under ``out_dir``, named as ``cfg``'s model names them: ``model.safetensors``,
    or shards with an index past ``max_shard_bytes``. Only the tensors (what an inference
    server reloads in place); :func:`save_hf` adds ``config.json`` and the tokenizer."""
    from safetensors.flax import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dtype = dtype or cfg.dtype
    pure = nnx.to_pure_dict(params) if isinstance(params, nnx.State) else params
    shards: list[dict[str, jax.Array]] = [{}]
    size = 0
    for ours, hf, transposed in weight_names(cfg):
        array = jnp.asarray(_parent(pure, ours)[ours[-1]])
        if transposed:
            array = array.T
        array = array.astype(dtype)
        if size and size + array.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][hf] = array
        size += array.nbytes
    for stale in out.glob("model*.safetensors*"):
        stale.unlink()
    metadata = {"format": "pt"}  # transformers refuses safetensors files without it
    if len(shards) == 1:
        save_file(shards[0], str(out / "model.safetensors"), metadata=metadata)
        return out
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / name), metadata=metadata)
        weight_map.update(dict.fromkeys(shard, name))
    total = sum(a.nbytes for shard in shards for a in shard.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return out
