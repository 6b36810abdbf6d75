"""The transformer's shape as configured (``model:`` of a run): plain Python, no JAX, so a
run config loads where JAX is not wanted (rollout nodes)."""

from __future__ import annotations

import dataclasses
import math
from typing import Literal, get_args

# The closed choices of `model:` settings (each one described at its field below).
ModelDtype = Literal["float32", "bfloat16", "float16"]
RopeScaling = Literal["none", "llama3"]
AttentionImpl = Literal["einsum", "dot_product", "auto", "cudnn", "pallas"]
ModelSource = Literal["builtin", "hf"]
MODEL_DTYPES: tuple[ModelDtype, ...] = get_args(ModelDtype)
ROPE_SCALINGS: tuple[RopeScaling, ...] = get_args(RopeScaling)
ATTENTION_IMPLS: tuple[AttentionImpl, ...] = get_args(AttentionImpl)
MODEL_SOURCES: tuple[ModelSource, ...] = get_args(ModelSource)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape of the transformer. Frozen and hashable, so it can be a jit static.

    ``source: builtin`` (the default): the fields below define a fresh model and
    the run uses the built-in character tokenizer. ``source: hf``: ``path`` is a
    local Hugging Face model directory; its ``config.json`` fills in the shape
    (:func:`tunix_agentic.models.hf.resolve_model_config`), its weights are
    loaded, its tokenizer and chat template are used; ``dtype`` still applies.
    """

    # Token ids the embedding holds; builtin: at least the character tokenizer's own count
    # (ids past it pad the table and decode to "").
    vocab_size: int = 128
    d_model: int = 64  # width of the embedding and the residual stream
    num_layers: int = 2  # transformer blocks
    num_heads: int = 4  # query heads per layer
    num_kv_heads: int = 2  # key/value heads (grouped-query attention); divides num_heads
    head_dim: int = 16  # width of one head; even (RoPE rotates pairs)
    ffn_dim: int = 192  # hidden units of each block's SwiGLU MLP
    rope_theta: float = 10_000.0  # RoPE base: frequency i is rope_theta ** (-2i / head_dim)
    norm_eps: float = 1e-6  # epsilon of every RMSNorm
    qk_norm: bool = False  # RMSNorm on each head's queries and keys before RoPE (Qwen3)
    tie_embeddings: bool = True  # the output layer reuses the embedding table (no lm_head)
    # Weights, activations and KV cache: "float32", "bfloat16" or "float16" (norm scales and
    # logits stay float32); with source hf the loaded weights are cast to it.
    dtype: ModelDtype = "float32"
    # RoPE frequency scaling: "none", or "llama3" (Llama 3.1+: long wavelengths divided by
    # rope_scaling_factor, short ones kept, a smooth blend between; see rope_frequencies).
    rope_scaling: RopeScaling = "none"
    rope_scaling_factor: float = 8.0  # "llama3": what the long wavelengths are multiplied by
    # "llama3": wavelengths longer than rope_original_max_len / this are scaled.
    rope_low_freq_factor: float = 1.0
    # "llama3": wavelengths shorter than rope_original_max_len / this are kept; those between
    # the two bounds are blended linearly.
    rope_high_freq_factor: float = 4.0
    rope_original_max_len: int = 8192  # "llama3": the pre-training context, in tokens
    # How attention is computed; the weights, shapes and checkpoints are the same either way.
    # "einsum" (the default): our grouped einsums with an f32 softmax, the reference the
    # tests compare against. "dot_product": jax.nn.dot_product_attention with
    # implementation=None (XLA in jax 0.10, f32 softmax). "cudnn": the same function with
    # implementation="cudnn" (GPU; bf16/fp16, else the einsum path, with a warning).
    # "pallas": JAX's TPU kernels: ragged_paged_attention over the paged KV cache
    # (engine.kv_layout: paged; a dense cache keeps the einsum path) and splash attention in
    # training. "auto": pallas on TPU, cudnn on GPU, einsum on CPU, resolved when the model
    # is built (tunix_agentic/models/attention.py); a forced name the platform cannot run
    # is an error then.
    attention: AttentionImpl = "einsum"
    # Run "pallas" off TPU for tests: splash attention in Pallas interpret mode, ragged
    # paged attention by JAX's reference of it (eager calls only). Slow; never for a run.
    attention_interpret: bool = False
    # Run the layers of the forward without a KV cache (training, reference logprobs, SFT)
    # as one jax.lax.scan over their weights stacked while tracing: one layer for XLA to
    # compile instead of num_layers (a TPU train step compiles in a fraction of the CPU
    # time). Same values and parameter tree; prefill and decode stay unrolled.
    scan_layers: bool = False
    # "builtin": a fresh model of the shape above and the character tokenizer; "hf": path's
    # config.json (the shape), weights, tokenizer and chat template.
    source: ModelSource = "builtin"
    path: str = ""  # a local Hugging Face model directory, for source hf

    def __post_init__(self):
        for name in (
            "vocab_size",
            "d_model",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "ffn_dim",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"model.{name} must be positive, got {getattr(self, name)}")
        for name in ("rope_theta", "norm_eps"):  # NaN passes any comparison: say finite
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"model.{name} must be a finite number > 0, got {value}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"model.num_heads ({self.num_heads}) must be a multiple of "
                f"model.num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"model.head_dim must be even for RoPE, got {self.head_dim}")
        if self.source not in MODEL_SOURCES:
            raise ValueError(f"model.source must be 'builtin' or 'hf', got {self.source!r}")
        if self.source == "hf" and not self.path:
            raise ValueError("model.source=hf needs model.path (a local Hugging Face model dir)")
        if self.rope_scaling not in ROPE_SCALINGS:
            raise ValueError(
                f"model.rope_scaling must be 'none' or 'llama3', got {self.rope_scaling!r}"
            )
        if self.rope_scaling == "llama3" and not (
            self.rope_scaling_factor > 0
            and self.rope_high_freq_factor > self.rope_low_freq_factor > 0
            and self.rope_original_max_len > 0
        ):
            raise ValueError(
                "model.rope_scaling=llama3 needs rope_scaling_factor > 0, "
                "rope_high_freq_factor > rope_low_freq_factor > 0 and rope_original_max_len > 0"
            )
        if self.attention not in ATTENTION_IMPLS:
            raise ValueError(
                f"model.attention must be one of {', '.join(ATTENTION_IMPLS)}, "
                f"got {self.attention!r}"
            )
        if self.dtype not in MODEL_DTYPES:
            raise ValueError(
                f"model.dtype must be float32, bfloat16 or float16, got {self.dtype!r}"
            )

    @property
    def jnp_dtype(self):
        import jax.numpy as jnp  # only the model needs it; the config loads without JAX

        return jnp.dtype(self.dtype)
