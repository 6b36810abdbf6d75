"""Decoder-only transformer in Flax NNX (Qwen3/Llama shape) with a functional KV cache.

RMSNorm, rotary position embeddings, grouped-query attention (optional q/k
RMSNorm as in Qwen3), SwiGLU MLP, optionally tied embeddings. The KV cache is
not module state: it is a tuple of ``(k, v)`` arrays per layer, passed in and
returned, so the inference engine can keep it on device across jitted calls and
index it by slot. One code path serves training (no cache), prefill and decode.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tunix_agentic.models import attention as attn_impl
from tunix_agentic.models.config import ModelConfig  # noqa: F401  (re-exported)
from tunix_agentic.models.layer_scan import scan_blocks

# A cache is one (k, v) pair per layer; each is [slots, kv_heads, max_len, head_dim], or a
# tuple of such arrays that split max_len into pieces (a chunked cache: cache_chunks); a
# pallas model's paged cache is one array per layer (init_paged_cache).
KVCache = tuple[Any, ...]


def rope_frequencies(cfg: ModelConfig) -> np.ndarray:
    """The rotary inverse frequencies, ``[head_dim / 2]`` float32 (a trace-time constant).

    ``theta ** (-2i / d)``; with ``rope_scaling="llama3"``, components whose
    wavelength exceeds ``original_max_len / low_freq_factor`` are slowed down by
    ``factor``, those shorter than ``original_max_len / high_freq_factor`` are
    kept, and those between are blended linearly in ``original_max_len / wavelength``.
    """
    d = cfg.head_dim
    inv = cfg.rope_theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    if cfg.rope_scaling == "llama3":
        wavelength = 2 * np.pi / inv
        ratio = cfg.rope_original_max_len / wavelength  # how many waves fit the old context
        lo, hi = cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
        blend = np.clip((ratio - lo) / (hi - lo), 0.0, 1.0)  # 0: long wave, 1: short wave
        inv = (1 - blend) * inv / cfg.rope_scaling_factor + blend * inv
    return inv.astype(np.float32)


def rope(x: jax.Array, positions: jax.Array, inv_freq: np.ndarray) -> jax.Array:
    """Rotary embedding (rotate-half convention, as in HF Llama/Qwen). x: [B, T, H, D]."""
    freq = jnp.asarray(inv_freq)  # [D/2]
    angles = positions[..., None].astype(jnp.float32) * freq  # [B, T, D/2]
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LowRank:
    """A frozen kernel ``w [in, out]`` with a LoRA adapter (``a [in, r]``, ``b [r, out]``)
    applied beside it: a linear layer holding one computes ``x @ w + scale * (x @ a) @ b``
    (Hu et al. 2021, eq. 3) instead of multiplying by a merged ``w + scale * a @ b``.

    The learner's loss puts these in place of the adapted kernels
    (:func:`tunix_agentic.learners.lora.attach`): no weight-sized merged copy is built per
    micro-batch, and the backward pass computes the adapters' gradients from ``x`` and
    ``x @ a`` instead of a full ``[in, out]`` weight gradient first."""

    w: jax.Array
    a: jax.Array
    b: jax.Array
    scale: float = dataclasses.field(metadata=dict(static=True))


def _dot(x: jax.Array, w: jax.Array, transpose: bool, out=None) -> jax.Array:
    return jax.lax.dot_general(
        x, w, (((1,), (1 if transpose else 0,)), ((), ())), preferred_element_type=out
    )


def _matmul_2d(x: jax.Array, w, dtype, transpose: bool) -> jax.Array:
    if isinstance(w, LowRank):
        return _low_rank_2d(x, w, dtype)
    dtype = dtype or w.dtype  # the layer's compute dtype, as nnx.Linear / Embed promote
    y = _dot(x.reshape(-1, x.shape[-1]).astype(dtype), w.astype(dtype), transpose)
    return y.reshape(*x.shape[:-1], y.shape[-1])


def _low_rank_2d(x: jax.Array, w: LowRank, dtype) -> jax.Array:
    """``x @ w.w + scale * (x @ a) @ b`` in the layer's compute dtype, the thin products
    summed in float32 and rounded once (the adapters are float32; their inputs round)."""
    dtype = dtype or w.w.dtype
    x2 = x.reshape(-1, x.shape[-1]).astype(dtype)
    y = _dot(x2, w.w.astype(dtype), False, jnp.float32)
    h = _dot(x2, w.a.astype(dtype), False, jnp.float32)  # [N, r]
    y = y + _dot(h.astype(dtype), w.b.astype(dtype), False, jnp.float32) * w.scale
    return y.astype(dtype).reshape(*x.shape[:-1], y.shape[-1])


def dense(layer: nnx.Linear, x: jax.Array) -> jax.Array:
    """``layer(x)`` (a bias-free linear layer) as one 2-D matmul over the flattened leading
    dimensions. Same values; XLA on CPU computes the weight gradient of a 2-D matmul
    without the layout copies it makes for a contraction over two batch dimensions (the
    train step ran about 1.3x faster at the peers' benchmark shapes). A kernel that is a
    :class:`LowRank` (LoRA in training) is applied with its adapter beside it."""
    return _matmul_2d(x, layer.kernel.get_value(), layer.dtype, transpose=False)


def dense_t(embed: nnx.Embed, x: jax.Array) -> jax.Array:
    """``embed.attend(x)`` (tied embeddings' logits, ``x @ table.T``) as one 2-D matmul;
    see :func:`dense`."""
    return _matmul_2d(x, embed.embedding[...], embed.dtype, transpose=True)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, *, eps: float, rngs: nnx.Rngs):
        del rngs
        self.scale = nnx.Param(jnp.ones((dim,), jnp.float32))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        xf = x.astype(jnp.float32)
        xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        return (xf * self.scale[...]).astype(x.dtype)


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        dt = cfg.jnp_dtype
        lin = dict(use_bias=False, dtype=dt, param_dtype=dt, rngs=rngs)
        self.q_proj = nnx.Linear(cfg.d_model, cfg.num_heads * cfg.head_dim, **lin)
        self.k_proj = nnx.Linear(cfg.d_model, cfg.num_kv_heads * cfg.head_dim, **lin)
        self.v_proj = nnx.Linear(cfg.d_model, cfg.num_kv_heads * cfg.head_dim, **lin)
        self.o_proj = nnx.Linear(cfg.num_heads * cfg.head_dim, cfg.d_model, **lin)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, eps=cfg.norm_eps, rngs=rngs)
            self.k_norm = RMSNorm(cfg.head_dim, eps=cfg.norm_eps, rngs=rngs)

    def __call__(self, x, positions, cache, rows, tables=None, window=None, segments=None):
        cfg = self.cfg
        b, t, _ = x.shape
        q = dense(self.q_proj, x).reshape(b, t, cfg.num_heads, cfg.head_dim)
        k = dense(self.k_proj, x).reshape(b, t, cfg.num_kv_heads, cfg.head_dim)
        v = dense(self.v_proj, x).reshape(b, t, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        inv_freq = rope_frequencies(cfg)
        q = rope(q, positions, inv_freq)
        k = rope(k, positions, inv_freq)
        scale = cfg.head_dim**-0.5
        if cache is None:
            keys, values = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, K, S, D]
            if cfg.attention == "pallas":  # JAX's splash attention kernel, causal by index
                out = attn_impl.splash_causal(
                    q, keys, values, scale, cfg.attention_interpret, segments
                )
                return dense(self.o_proj, out.reshape(b, t, -1)), None
            key_pos = positions  # [B, S]
            new_cache = None
        elif tables is not None and cfg.attention == "pallas":
            # JAX's ragged paged attention over pages kept in its own layout (one array).
            new_cache = attn_impl.write_pages(cache, tables, positions, k, v)
            out = attn_impl.ragged_paged(
                q, positions, new_cache, tables, scale, cfg.attention_interpret
            )
            return dense(self.o_proj, out.reshape(b, t, -1)), new_cache
        elif tables is not None:
            new_cache = _paged_write(cache, tables, positions, k, v)
            # Keys and values stay in blocks ([B, W, K, bs, D]): no transposed copy.
            keys, values = _paged_gather(new_cache, tables, window)
            span = keys.shape[1] * keys.shape[3]
            key_pos = jnp.broadcast_to(jnp.arange(span), (b, span))
        else:
            # The cache is kv-head major ([slots, K, S, D]) so attention contracts it
            # without a transposed copy of the whole cache on every decode step; each of K
            # and V is one array or a tuple of pieces along S (see cache_chunks).
            k_cache, v_cache = cache
            r = (jnp.arange(b) if rows is None else rows)[:, None]
            new_cache = (_write(k_cache, r, positions, k), _write(v_cache, r, positions, v))
            keys, values = (_read(side, rows, window) for side in new_cache)
            span = sum(x.shape[2] for x in keys) if isinstance(keys, tuple) else keys.shape[2]
            key_pos = jnp.broadcast_to(jnp.arange(span), (b, span))
        mask = key_pos[:, None, :] <= positions[:, :, None]  # [B, T, S], causal by position
        if segments is not None:  # packed rows: each segment sees only itself
            mask &= segments[:, None, :] == segments[:, :, None]
        if cfg.attention in ("dot_product", "cudnn"):
            out = _dot_product(q, keys, values, mask, scale, cfg.attention, cache is None)
            if out is not None:  # None: cuDNN cannot take this call (said once), einsum
                return dense(self.o_proj, out.reshape(b, t, -1)), new_cache
        groups = cfg.num_heads // cfg.num_kv_heads
        qg = q.reshape(b, t, cfg.num_kv_heads, groups, cfg.head_dim).transpose(
            0, 2, 3, 1, 4
        )  # [B,K,G,T,D]
        if not isinstance(keys, tuple) and keys.ndim == 5:
            # Paged blocks: contract (block, offset) as the one key axis.
            scores = jnp.einsum("bkgtd,bwksd->bkgtws", qg, keys.astype(q.dtype))
            scores = scores.reshape(*scores.shape[:4], -1).astype(jnp.float32)
        else:  # in pieces of at most KEY_SPAN positions
            keys, values = _pieces(keys), _pieces(values)
            scores = jnp.concatenate(
                [jnp.einsum("bkgtd,bksd->bkgts", qg, x.astype(q.dtype)) for x in keys], axis=-1
            ).astype(jnp.float32)
        scores = jnp.where(mask[:, None, None], scores * scale, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
        if not isinstance(values, tuple):
            blocks = probs.reshape(*probs.shape[:4], values.shape[1], values.shape[3])
            out = jnp.einsum("bkgtws,bwksd->bkgtd", blocks, values.astype(q.dtype))
        else:
            out = sum(
                jnp.einsum("bkgts,bksd->bkgtd", probs[..., a : a + x.shape[2]], x.astype(q.dtype))
                for x, a in zip(values, _starts(values), strict=True)
            )
        out = out.transpose(0, 3, 1, 2, 4).reshape(b, t, -1)
        return dense(self.o_proj, out), new_cache


# The einsum path contracts keys in pieces of at most this many positions. XLA's dot on
# CPU falls off a cliff past 512 keys: a 16-step decode chunk of 64 slots at the peers'
# toy dims took ~2.0 s at 544 and at 576 keys against ~0.6 s at 512 (a 2-core machine),
# and ~0.6 s at 576 in two pieces (512 + 64). Elsewhere: one more dot a piece.
KEY_SPAN = 512


def _key_spans(n: int) -> list[tuple[int, int]]:
    """``[start, end)`` pieces of ``n`` key positions, each at most :data:`KEY_SPAN`."""
    return [(a, min(a + KEY_SPAN, n)) for a in range(0, n, KEY_SPAN)]


def _pieces(x) -> tuple[jax.Array, ...]:
    """Keys or values ``[B, K, S, D]`` as pieces along S of at most :data:`KEY_SPAN`: a
    chunked cache's own pieces as they are, else slices of the one array (copies)."""
    if isinstance(x, tuple):
        return x
    return tuple(x[:, :, a:e] for a, e in _key_spans(x.shape[2]))


def _starts(pieces: tuple[jax.Array, ...]) -> list[int]:
    """The position each piece of a chunked cache's K or V starts at (axis 2 runs on)."""
    return [int(a) for a in np.cumsum([0] + [x.shape[2] for x in pieces])[:-1]]


def cache_chunks(max_len: int, cuts: Sequence[int] = ()) -> tuple[int, ...]:
    """The sizes of a dense cache's pieces along the position axis (``init_cache(chunks=)``):
    cut at every one of ``cuts`` below ``max_len`` (the engine's decode windows) and at every
    multiple of :data:`KEY_SPAN`.

    A decode step reads the pieces that hold its window, each a whole array: no sliced copy
    of the cache per layer per step, which a window or a key span of one array costs (the
    copy is the bulk of the step: at the peers' toy dims, 64 slots, a decode step's
    attention over 384 of 576 positions took ~16 ms sliced from one array against ~6 ms
    read as whole pieces, a 2-core machine)."""
    ends = {c for c in cuts if 0 < c < max_len} | set(range(KEY_SPAN, max_len, KEY_SPAN))
    ends = sorted(ends | {max_len})
    return tuple(e - a for a, e in zip([0, *ends[:-1]], ends, strict=True))


def _write(side, r: jax.Array, positions: jax.Array, new: jax.Array):
    """Write ``new`` ([B, T, K, D]) at rows ``r`` ([B, 1]) and ``positions`` ([B, T]) of one
    side (K or V) of a dense cache, an array or a tuple of pieces; positions past the
    cache (padding, stopped slots) are dropped, never clamped onto real rows."""
    # Indexed by (row, kv head, position), each update one head_dim vector: a scatter whose
    # window is only the minor axis, which XLA on TPU does in place in the cache's own
    # layout. With (row, position) indices and a [K, D] window it wanted K and D adjacent
    # and copied every piece into and out of that layout on every decode step.
    heads = jnp.arange(new.shape[2])[None, None, :]  # [1, 1, K]
    if not isinstance(side, tuple):
        return side.at[r[..., None], heads, positions[..., None]].set(
            new.astype(side.dtype), mode="drop"
        )
    out = []
    for piece, start in zip(side, _starts(side), strict=True):
        n = piece.shape[2]
        local = positions - start
        local = jnp.where((local >= 0) & (local < n), local, n)  # another piece's: dropped
        out.append(
            piece.at[r[..., None], heads, local[..., None]].set(
                new.astype(piece.dtype), mode="drop"
            )
        )
    return tuple(out)


def _read(side, rows: jax.Array | None, window: int | None):
    """One side of a dense cache as attention reads it: the ``rows`` it attends from (all
    when None) and positions ``[0, window)`` (a chunked cache: the pieces that hold them,
    whole; the rest of the last is masked by position)."""
    if not isinstance(side, tuple):
        x = side if rows is None else side[rows]
        return x if window is None or window >= x.shape[2] else x[:, :, :window]
    return tuple(
        piece if rows is None else piece[rows]
        for piece, start in zip(side, _starts(side), strict=True)
        if window is None or start < window
    )


def map_cache_pieces(fn: Callable[[jax.Array, int], jax.Array], cache: KVCache) -> KVCache:
    """``fn(array, start)`` over every array of a dense cache: each layer's K and V, or
    each of their pieces, with the position its axis 2 starts at."""

    def side(x):
        if not isinstance(x, tuple):
            return fn(x, 0)
        return tuple(fn(p, a) for p, a in zip(x, _starts(x), strict=True))

    return tuple((side(k), side(v)) for k, v in cache)


def _dot_product(q, keys, values, mask, scale, impl="dot_product", causal=False):
    """``model.attention: dot_product`` or ``cudnn``: ``jax.nn.dot_product_attention``
    with the einsum path's scale and mask, ``implementation=None`` (JAX picks; XLA in jax
    0.10 on every platform, softmax in f32 like ours) or ``"cudnn"``. q ``[B, T, N, D]``;
    keys/values as ``__call__`` holds them: ``[B, K, S, D]`` (training, dense cache; a
    chunked cache's pieces are joined first) or ``[B, W, K, bs, D]`` (paged blocks); mask
    ``[B, T, S]``. Returns ``[B, T, N, D]``, or None where cuDNN cannot take the call
    (not bf16/fp16, or JAX refuses its shapes: said once, the caller uses einsum).
    ``causal`` (training, cuDNN): its causal mask by index instead of ours by position.

    The function wants keys ``[B, S, K, D]``. In training that undoes ``__call__``'s own
    transpose (XLA folds the two). The dense cache and the paged blocks are transposed into
    that layout: a copy of every row's keys and values per layer per call (per decode
    step), which the einsum path avoids by contracting them in place."""
    if impl == "cudnn" and not attn_impl.cudnn_dtype_ok(q.dtype):
        attn_impl.fallback(f"cuDNN takes bf16/fp16, the model computes in {q.dtype}")
        return None

    def key_major(x):
        if isinstance(x, tuple):  # a chunked cache's pieces, joined
            x = jnp.concatenate(x, axis=2)
        if x.ndim == 5:  # [B, W, K, bs, D] -> [B, W*bs, K, D]: position w*bs+s
            bsz, w, k, bs, d = x.shape
            return x.transpose(0, 1, 3, 2, 4).reshape(bsz, w * bs, k, d)
        return x.transpose(0, 2, 1, 3)  # [B, K, S, D] -> [B, S, K, D]

    cudnn = impl == "cudnn"
    try:
        return jax.nn.dot_product_attention(
            q,
            key_major(keys).astype(q.dtype),
            key_major(values).astype(q.dtype),
            mask=None if cudnn and causal else mask[:, None],  # [B, 1, T, S]: every head
            scale=scale,
            is_causal=cudnn and causal,
            implementation="cudnn" if cudnn else None,
        )
    except (ValueError, NotImplementedError, TypeError) as e:
        if not cudnn:
            raise
        attn_impl.fallback(str(e).splitlines()[0] if str(e) else type(e).__name__)
        return None


def _paged_write(cache, tables, positions, k, v):
    """Write ``k``/``v`` ([B, T, K, D]) at ``positions`` through the block ``tables``
    ([B, blocks_per_seq]) into the block pools ([N, K, block_size, D]); return the new
    pools. Positions past the table (padding, stopped slots) and table entries ``>= N``
    (no block) are dropped."""
    k_pool, v_pool = cache
    n, _, bs, _ = k_pool.shape
    block, offset = attn_impl.page_slots(tables, positions, n, bs)
    block, offset = block[..., None], offset[..., None]
    heads = jnp.arange(k.shape[2])[None, None, :]
    # Indexed by (block, kv head, offset): a head_dim window, in place (see _write).
    k_pool = k_pool.at[block, heads, offset].set(k.astype(k_pool.dtype), mode="drop")
    v_pool = v_pool.at[block, heads, offset].set(v.astype(v_pool.dtype), mode="drop")
    return k_pool, v_pool


def _paged_gather(pools, tables, window=None):
    """Each row's keys and values gathered block by block ([B, blocks, K, block_size, D]:
    position ``w * block_size + s`` at ``[:, w, :, s]``; attention contracts both axes, so
    no transposed copy). ``window``: only the blocks of positions ``[0, window)``."""
    k_pool, v_pool = pools
    n, _, bs, _ = k_pool.shape
    if window is not None:
        tables = tables[:, : -(-window // bs)]
    # Entries without a block read a clipped one: positions past the row's end, masked.
    safe = jnp.clip(tables, 0, n - 1)
    return k_pool[safe], v_pool[safe]


class MLP(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        dt = cfg.jnp_dtype
        lin = dict(use_bias=False, dtype=dt, param_dtype=dt, rngs=rngs)
        self.gate_proj = nnx.Linear(cfg.d_model, cfg.ffn_dim, **lin)
        self.up_proj = nnx.Linear(cfg.d_model, cfg.ffn_dim, **lin)
        self.down_proj = nnx.Linear(cfg.ffn_dim, cfg.d_model, **lin)

    def __call__(self, x):
        return dense(self.down_proj, jax.nn.silu(dense(self.gate_proj, x)) * dense(self.up_proj, x))


class Block(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.input_norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps, rngs=rngs)
        self.attn = Attention(cfg, rngs=rngs)
        self.post_attn_norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps, rngs=rngs)
        self.mlp = MLP(cfg, rngs=rngs)

    def __call__(self, x, positions, cache, rows, tables=None, window=None, segments=None):
        h, new_cache = self.attn(
            self.input_norm(x), positions, cache, rows, tables, window, segments
        )
        x = x + h
        x = x + self.mlp(self.post_attn_norm(x))
        return x, new_cache


class Transformer(nnx.Module):
    """Causal LM. ``__call__`` returns ``(logits, new_cache)``.

    - tokens, positions: ``[B, T]`` int32. Positions drive both RoPE and the
      causal mask, so right padding needs no extra mask; padding written into a
      cache should carry a position ``>= max_len`` so that it is dropped.
    - cache: ``None`` for a plain forward, else a ``KVCache`` whose rows are the
      engine's slots; ``rows`` ``[B]`` says which slot each batch row updates
      (``None``: batch row i is slot i).
    - tables: optional ``[B, blocks_per_seq]`` int32 block tables; then the cache is paged
      (per layer ``[blocks, kv_heads, block_size, head_dim]`` K and V pools, or one array
      in the kernel's layout for ``pallas``: :func:`init_paged_cache`, see
      :mod:`tunix_agentic.inference.paged`) and row ``b`` reads and writes position ``p``
      in block ``tables[b, p // block_size]``; ``rows`` is not used.
    - window: optional static int; attention reads only cache positions ``[0, window)``
      (every position the batch attends to must lie below it; the engine's decode picks
      the smallest bucket that holds its live slots). Writes are not limited by it.
    - logits_at: optional ``[B]`` index; then only those positions' logits are
      computed (``[B, V]``), which is all prefill needs.
    - segments: optional ``[B, T]`` int32 segment ids of packed rows (training without a
      cache only): a token attends only to the tokens of its own segment, causally. Each
      segment's positions restart at 0 (:func:`tunix_agentic.learners.batching.pack_sft_rows`).
    - remat: recompute each layer's activations in the backward pass instead of
      keeping them (``jax.checkpoint`` per layer; training without a cache only):
      activation memory of one layer instead of all, for about one more forward.

    With ``cfg.scan_layers`` the forward without a cache runs the layers as one
    ``jax.lax.scan`` over their weights stacked while tracing
    (:mod:`tunix_agentic.models.layer_scan`): the same values and parameter tree, one
    layer to compile instead of ``num_layers``. Prefill and decode stay unrolled.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        # model.attention resolved for the platform it is built for (models/attention.py):
        # "auto" becomes the platform's kernels, a forced name that cannot run is an error.
        resolved = attn_impl.resolve_attention(
            cfg.attention, attn_impl.target_platform(), interpret=cfg.attention_interpret
        )
        cfg = dataclasses.replace(cfg, attention=resolved)
        self.cfg = cfg
        dt = cfg.jnp_dtype
        self.embed = nnx.Embed(
            cfg.vocab_size,
            cfg.d_model,
            dtype=dt,
            param_dtype=dt,
            embedding_init=nnx.initializers.normal(stddev=0.02),
            rngs=rngs,
        )
        self.layers = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
        self.final_norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps, rngs=rngs)
        if not cfg.tie_embeddings:
            self.lm_head = nnx.Linear(
                cfg.d_model, cfg.vocab_size, use_bias=False, dtype=dt, param_dtype=dt, rngs=rngs
            )

    def __call__(
        self,
        tokens,
        positions,
        cache: KVCache | None = None,
        rows=None,
        logits_at=None,
        remat: bool = False,
        tables=None,
        window: int | None = None,
        segments=None,
    ):
        if segments is not None and cache is not None:
            raise ValueError("segments (packed rows) are for a forward without a KV cache")
        x = self.embed(tokens)
        scanned = None
        if self.cfg.scan_layers and cache is None:
            scanned = scan_blocks(list(self.layers), x, positions, remat=remat, segments=segments)
        if scanned is None:
            x, new_cache = self._unrolled(
                x, positions, cache, rows, remat, tables, window, segments
            )
        else:
            x, new_cache = scanned, None
        x = self.final_norm(x)
        if logits_at is not None:
            x = jnp.take_along_axis(x, logits_at[:, None, None], axis=1)[:, 0]  # [B, D]
        if self.cfg.tie_embeddings:
            logits = dense_t(self.embed, x)
        else:
            logits = dense(self.lm_head, x)
        return logits.astype(jnp.float32), new_cache

    def _unrolled(self, x, positions, cache, rows, remat, tables, window, segments=None):
        """The layers as a Python loop: ``(x, new_cache)`` (None without a cache)."""
        new_cache = []
        for i, layer in enumerate(self.layers):
            if remat and cache is None:
                x, layer_cache = nnx.remat(_train_block)(layer, x, positions, segments), None
            else:
                layer_kv = None if cache is None else cache[i]
                x, layer_cache = layer(x, positions, layer_kv, rows, tables, window, segments)
            new_cache.append(layer_cache)
        return x, (None if cache is None else tuple(new_cache))


def _train_block(layer: Block, x: jax.Array, positions: jax.Array, segments=None) -> jax.Array:
    return layer(x, positions, None, None, segments=segments)[0]


def init_cache(
    cfg: ModelConfig, slots: int, max_len: int, chunks: Sequence[int] | None = None
) -> KVCache:
    """Zeroed KV cache for ``slots`` sequences of up to ``max_len`` tokens (also the paged
    layout's pools: ``slots`` blocks of ``max_len`` = block_size tokens).

    ``chunks``: the sizes (summing to ``max_len``) of pieces along the position axis
    (:func:`cache_chunks`); then each layer's K and V are tuples of ``[slots, kv_heads,
    size, head_dim]`` arrays, which hold the same values as one array and read faster."""
    sizes = (max_len,) if chunks is None else tuple(chunks)
    if sum(sizes) != max_len or min(sizes) < 1:
        raise ValueError(f"cache chunks {sizes} must be positive and sum to {max_len}")

    def side():
        arrays = tuple(
            jnp.zeros((slots, cfg.num_kv_heads, n, cfg.head_dim), cfg.jnp_dtype) for n in sizes
        )
        return arrays[0] if chunks is None else arrays

    return tuple((side(), side()) for _ in range(cfg.num_layers))


def kernel_pages(cfg: ModelConfig) -> bool:
    """Whether ``cfg``'s paged KV cache is kept in the ragged paged attention kernel's
    layout (one array per layer: :func:`init_paged_cache`; its sharding:
    ``cache_sharding(..., pages=True)``): for ``attention: pallas``."""
    return cfg.attention == "pallas"


def init_paged_cache(cfg: ModelConfig, blocks: int, block_size: int) -> KVCache:
    """Zeroed paged KV pools of ``blocks`` blocks of ``block_size`` tokens per layer
    (:mod:`tunix_agentic.inference.paged`): a ``(K, V)`` pair of ``[blocks, kv_heads,
    block_size, head_dim]`` arrays, or, for ``attention: pallas``, one array in the ragged
    paged attention kernel's layout (:func:`tunix_agentic.models.attention.pages_shape`),
    which the kernel reads without a copy."""
    if not kernel_pages(cfg):
        return init_cache(cfg, blocks, block_size)
    shape = attn_impl.pages_shape(cfg.num_kv_heads, cfg.head_dim, blocks, block_size)
    return tuple(jnp.zeros(shape, cfg.jnp_dtype) for _ in range(cfg.num_layers))


def token_logprobs(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """log p(target) per position. logits [B, T, V], targets [B, T] -> [B, T]."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]


def sequence_logprobs(
    model: Transformer, input_ids: jax.Array, positions=None, segments=None
) -> jax.Array:
    """Per-token logprobs of ``input_ids[:, 1:]`` under ``model``: [B, T] -> [B, T-1].
    ``positions`` (default ``0..T-1`` on every row) and ``segments``: packed rows'."""
    b, t = input_ids.shape
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    logits, _ = model(input_ids, positions, segments=segments)
    return token_logprobs(logits[:, :-1], input_ids[:, 1:])


def count_params(model: nnx.Module) -> int:
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
