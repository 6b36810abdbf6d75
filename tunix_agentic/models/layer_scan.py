"""The transformer's layers as one ``jax.lax.scan`` (``model.scan_layers``): the forward
without a KV cache (the learner's train step, reference logprobs, SFT) traces one layer
instead of ``num_layers``, so XLA compiles one loop body where it compiled every layer.

The parameter tree is not changed (``layers.0``, ``layers.1``, ...: checkpoints, Hugging
Face and GGUF loading, sharding and weight sync see the unrolled model). The layers'
weights are stacked along a new leading axis while tracing (a copy of the layers' weights
inside the program; their gradients come back stacked and are sliced per layer), and the
scan's body rebuilds one :class:`~tunix_agentic.models.transformer.Block` from a slice.
LoRA's :class:`~tunix_agentic.models.transformer.LowRank` kernels stack like any leaf.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

log = logging.getLogger(__name__)


@functools.cache
def _warn_once(message: str) -> None:
    log.warning(message)


def _signature(state: Any) -> tuple[Any, tuple[tuple[tuple[int, ...], Any], ...]]:
    """What must match for two layers' states to stack: tree structure (with any static
    LoRA scale), and every leaf's shape and dtype."""
    leaves, treedef = jax.tree.flatten(state)
    return treedef, tuple((jnp.shape(x), jnp.result_type(x)) for x in leaves)


def stack_layers(layers: Sequence[nnx.Module]) -> tuple[nnx.GraphDef, Any] | None:
    """The layers' shared graph and their states stacked along a new leading axis
    (``[num_layers, ...]`` per leaf), or None when the layers differ (graph, tree, shape
    or dtype: a LoRA adapter on some layers only, say) and cannot share one loop body."""
    splits = [nnx.split(layer) for layer in layers]
    graphdef, first = splits[0]
    signature = _signature(first)
    for g, state in splits[1:]:
        if g != graphdef or _signature(state) != signature:
            return None
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *(state for _, state in splits))
    return graphdef, stacked


def scan_blocks(
    layers: Sequence[nnx.Module],
    x: jax.Array,
    positions: jax.Array,
    *,
    remat: bool,
    segments: jax.Array | None = None,
) -> jax.Array | None:
    """``x`` ``[B, T, D]`` through every layer without a KV cache, as one scan over their
    stacked weights (``remat``: each iteration recomputed in the backward pass, keeping
    only its input, as the unrolled form's per-layer ``nnx.remat``). None when the layers
    cannot be stacked (said once): the caller runs its loop.

    Without remat the scan keeps every layer's residuals whole (``[num_layers, ...]``):
    Qwen3-0.6B's LoRA train step for one v5e chip (no remat) took 9.5 GiB of
    temporaries against 5.6 unrolled. A checkpoint policy keeping only the matmuls'
    outputs took 10.1 (it also recomputes a Pallas kernel's forward). With remat
    Qwen3-1.7B's step for a v5e-8 took less than unrolled (2026-12-07)."""
    stacked = stack_layers(layers)
    if stacked is None:
        _warn_once("model.scan_layers: the layers differ in structure; running them unrolled")
        return None
    graphdef, states = stacked

    def body(h: jax.Array, state: Any) -> tuple[jax.Array, None]:
        layer = nnx.merge(graphdef, state)
        return layer(h, positions, None, None, segments=segments)[0], None

    if remat:
        # prevent_cse is for remat outside a loop; inside scan it only blocks fusion.
        body = jax.checkpoint(body, prevent_cse=False)
    x, _ = jax.lax.scan(body, x, states)
    return x
