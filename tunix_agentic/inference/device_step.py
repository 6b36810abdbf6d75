"""The engine's device step: pure prefill and decode functions over typed state.

Everything the device computes for the engine is here, and nothing else is.
Both functions are pure: they take the parameters, the KV cache and the
per-slot :class:`DecodeState` and return new ones (the engine jits them with
the cache and the state donated, and the :class:`StepConfig` static).

- :func:`prefill` copies each row's reused prefix from the slot that holds it
  (:func:`copy_prefixes`), runs the new tokens of a batch of prompts through the model,
  writes their KV into the slots they were given, samples each row's first
  token and sets those slots' decode state, so the next decode continues from
  there without the host in between.
- In the paged layout (``StepConfig.paged``) the cache is one block pool per layer
  and every row carries its slot's block table (:mod:`.paged`); a reused prefix's
  full blocks are shared by the host's tables, and only a partly filled block is
  copied (:func:`copy_blocks`) before the prefill.
- :func:`decode` runs up to ``decode_steps`` steps over every slot in one
  ``lax.while_loop``; slots marked ``stop`` write nowhere (their position is pushed
  past the cache, where writes are dropped). A slot also stops on device when it
  samples one of its stop ids or spends its token budget, and the loop ends as
  soon as no slot is live: a chunk queued ahead whose requests all ended in the
  chunk before it costs next to nothing (steps it skips come back as ``-1`` tokens).
  Its attention reads only the cache's first ``window`` positions (a static argument: one
  compiled decode per window bucket, :meth:`~.config.EngineConfig.window_buckets`); the
  host picks the smallest bucket that holds every live slot to the chunk's end
  (:func:`~.scheduler.chunk_window`), so short sequences do not pay for ``max_seq_len``.

Each row carries its own sampling values (:class:`RowSampling`) as arrays, so
one compiled step serves every mix of requests.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from tunix_agentic.inference.sampling import sample, split_keys
from tunix_agentic.models.transformer import map_cache_pieces

# Stop ids per row that end a request on the device itself (the host checks them all).
MAX_DEVICE_STOP_IDS = 8


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """The static half of both calls: the model's graph and the engine's shapes."""

    graphdef: Any  # nnx.GraphDef of the Transformer
    max_seq_len: int
    decode_steps: int
    paged: bool = False  # the cache is block pools read through block tables (paged.py)


@struct.dataclass
class DecodeState:
    """Per-slot decode state; lives on the device between calls."""

    tokens: jax.Array  # [S] int32: each slot's last sampled token (the next input)
    positions: jax.Array  # [S] int32: where that token goes; max_seq_len: stopped
    keys: jax.Array  # [S, 2] uint32: each slot's PRNG key
    budget: jax.Array  # [S] int32: tokens each slot may still sample

    @classmethod
    def fresh(cls, num_slots: int, max_seq_len: int) -> DecodeState:
        """Every slot stopped (positions past the cache)."""
        return cls(
            tokens=jnp.zeros(num_slots, jnp.int32),
            positions=jnp.full(num_slots, max_seq_len, jnp.int32),
            keys=jnp.zeros((num_slots, 2), jnp.uint32),
            budget=jnp.zeros(num_slots, jnp.int32),
        )


@struct.dataclass
class RowSampling:
    """How each row samples (one row per slot in decode, per prompt in prefill)."""

    temperature: jax.Array  # [R] float32; 0: greedy
    top_k: jax.Array  # [R] int32; 0: off
    top_p: jax.Array  # [R] float32; 1: off
    # [R, MAX_DEVICE_STOP_IDS] int32, -1 padded: stop ids that end the row on device
    stop_ids: jax.Array
    # [R, ceil(V / 32)] int32 bitmask of the tokens each row may sample (constrained
    # decoding); None (the usual case, and another compiled program): every token.
    allowed: jax.Array | None = None

    @classmethod
    def host(cls, rows: int) -> RowSampling:
        """Host (numpy) arrays of neutral values, to be filled row by row."""
        return cls(
            temperature=np.ones(rows, np.float32),
            top_k=np.zeros(rows, np.int32),
            top_p=np.ones(rows, np.float32),
            stop_ids=np.full((rows, MAX_DEVICE_STOP_IDS), -1, np.int32),
        )

    def set_row(
        self, row: int, temperature: float, top_k: int, top_p: float, stop_ids: tuple = ()
    ) -> None:
        """Fill one row of host arrays (only on :meth:`host` instances). Stop ids past the
        first ``MAX_DEVICE_STOP_IDS`` still end the request on the host, a chunk later."""
        self.temperature[row], self.top_k[row], self.top_p[row] = temperature, top_k, top_p
        ids = list(stop_ids)[:MAX_DEVICE_STOP_IDS]
        self.stop_ids[row] = -1
        self.stop_ids[row, : len(ids)] = ids

    def copy(self) -> RowSampling:
        return jax.tree.map(np.copy, self)


@struct.dataclass
class PrefillBatch:
    """R prompts' new tokens, padded to a bucketed length L."""

    ids: jax.Array  # [R, L] int32: new tokens, left-aligned
    positions: jax.Array  # [R, L] int32: their positions; max_seq_len on padding (dropped)
    slots: jax.Array  # [R] int32: the slot each row fills; num_slots on padding rows (dropped)
    last_index: jax.Array  # [R] int32: index in L of each row's last new token
    next_position: jax.Array  # [R] int32: position of the token sampled from it
    keys: jax.Array  # [R, 2] uint32: each row's PRNG key
    sampling: RowSampling
    # A shared prefix reused from another slot: its KV rows [0, copy_len) are copied from
    # slot copy_from into the row's slot before the new tokens run (copy_len 0: none).
    copy_from: jax.Array  # [R] int32
    copy_len: jax.Array  # [R] int32
    budget: jax.Array  # [R] int32: tokens each row may sample after its first
    # Paged layout (else zero-width / unused): each row's block table [R, W], and one block
    # copied before the prefill (copy on write of a shared prefix's partly filled block):
    # block_src -> block_dst, block_dst >= the pool's size for none.
    tables: jax.Array  # [R, W] int32
    block_src: jax.Array  # [R] int32
    block_dst: jax.Array  # [R] int32

    @classmethod
    def host(
        cls,
        rows: int,
        length: int,
        *,
        num_slots: int,
        max_seq_len: int,
        table_width: int = 0,
        num_blocks: int = 0,
    ) -> PrefillBatch:
        """Host (numpy) arrays of ``rows`` padding rows, to be filled row by row
        (``table_width``, ``num_blocks``: the paged layout's, else 0)."""
        return cls(
            ids=np.zeros((rows, length), np.int32),
            positions=np.full((rows, length), max_seq_len, np.int32),
            slots=np.full(rows, num_slots, np.int32),
            last_index=np.zeros(rows, np.int32),
            next_position=np.zeros(rows, np.int32),
            keys=np.zeros((rows, 2), np.uint32),
            sampling=RowSampling.host(rows),
            copy_from=np.zeros(rows, np.int32),
            copy_len=np.zeros(rows, np.int32),
            budget=np.zeros(rows, np.int32),
            tables=np.full((rows, table_width), num_blocks, np.int32),
            block_src=np.zeros(rows, np.int32),
            block_dst=np.full(rows, num_blocks, np.int32),
        )


def copy_prefixes(cache: Any, batch: PrefillBatch) -> Any:
    """Copy each row's shared prefix (KV rows ``[0, copy_len)`` of slot ``copy_from``) into
    its slot; the whole cache pass is skipped when no row copies."""

    def copy(cache):
        def one(x, start):  # [S, K, T, D], positions [start, start + T)
            src = x[jnp.clip(batch.copy_from, 0, x.shape[0] - 1)]  # [R, K, T, D]
            dst = x[jnp.clip(batch.slots, 0, x.shape[0] - 1)]
            take = start + jnp.arange(x.shape[2])[None, :] < batch.copy_len[:, None]  # [R, T]
            rows = jnp.where(take[:, None, :, None], src, dst)
            return x.at[batch.slots].set(rows, mode="drop")  # padding rows: dropped

        return map_cache_pieces(one, cache)

    return jax.lax.cond(jnp.any(batch.copy_len > 0), copy, lambda c: c, cache)


def copy_blocks(cache: Any, batch: PrefillBatch) -> Any:
    """Paged layout: copy block ``block_src`` to ``block_dst`` in every layer's pools
    (rows whose ``block_dst`` is past the pool copy nothing); skipped when no row copies."""

    def copy(cache):
        def one(x):  # [N, K, bs, D]
            src = x[jnp.clip(batch.block_src, 0, x.shape[0] - 1)]
            return x.at[batch.block_dst].set(src, mode="drop")

        return jax.tree.map(one, cache)

    n = jax.tree.leaves(cache)[0].shape[0]
    return jax.lax.cond(jnp.any(batch.block_dst < n), copy, lambda c: c, cache)


def prefill(
    step: StepConfig, params: Any, cache: Any, state: DecodeState, batch: PrefillBatch
) -> tuple[Any, DecodeState, jax.Array, jax.Array]:
    """Prefill ``batch`` into its slots; returns (cache, state, tokens [R], logprobs [R])."""
    model = nnx.merge(step.graphdef, params)
    if step.paged:
        cache = copy_blocks(cache, batch)
        logits, cache = model(
            batch.ids, batch.positions, cache, logits_at=batch.last_index, tables=batch.tables
        )
    else:
        cache = copy_prefixes(cache, batch)
        logits, cache = model(
            batch.ids, batch.positions, cache, batch.slots, logits_at=batch.last_index
        )
    keys, use = split_keys(batch.keys)
    s = batch.sampling
    tokens, logprobs = sample(logits, use, s.temperature, s.top_k, s.top_p, s.allowed)
    # The admitted slots' decode state, set on device: the next chunk continues from it
    # (a row whose first token already ends it starts stopped).
    ended = _ended(tokens, batch.budget, s.stop_ids)
    next_position = jnp.where(ended, step.max_seq_len, batch.next_position)
    state = DecodeState(
        tokens=state.tokens.at[batch.slots].set(tokens, mode="drop"),
        positions=state.positions.at[batch.slots].set(next_position, mode="drop"),
        keys=state.keys.at[batch.slots].set(keys, mode="drop"),
        budget=state.budget.at[batch.slots].set(batch.budget, mode="drop"),
    )
    return cache, state, tokens, logprobs


def _ended(tokens: jax.Array, budget: jax.Array, stop_ids: jax.Array) -> jax.Array:
    """[R] bool: rows whose request ends with the token just sampled."""
    return (budget <= 0) | jnp.any(tokens[:, None] == stop_ids, axis=1)


def decode(
    step: StepConfig,
    params: Any,
    cache: Any,
    state: DecodeState,
    stop: jax.Array,  # [S] bool: slots that decode no further
    sampling: RowSampling,
    tables: jax.Array,  # [S, W] int32: each slot's block table (paged layout; else W = 0)
    window: int | None = None,  # static: attend over positions [0, window) (None: all)
) -> tuple[Any, DecodeState, jax.Array, jax.Array]:
    """Up to ``decode_steps`` steps over every slot, until none is live; returns (cache,
    state, tokens [T, S], logprobs [T, S]); the rows of steps not run hold token -1.

    ``window`` must hold every position a live slot feeds in this chunk (the caller's
    bound: its position now plus ``decode_steps``); stopped slots are not bounded by it
    (their writes are dropped and their outputs unused)."""
    model = nnx.merge(step.graphdef, params)
    limit, t = step.max_seq_len, step.decode_steps
    positions = jnp.where(stop, limit, state.positions)  # a stopped slot writes nowhere
    s = positions.shape[0]

    def live(carry):
        i, _, _, positions, *_ = carry
        return (i < t) & jnp.any(positions < limit)

    def one(carry):
        i, cache, tokens, positions, keys, budget, out_tokens, out_logprobs = carry
        paged = tables if step.paged else None
        logits, cache = model(
            tokens[:, None], positions[:, None], cache, tables=paged, window=window
        )
        keys, use = split_keys(keys)
        new_tokens, logprobs = sample(
            logits[:, 0],
            use,
            sampling.temperature,
            sampling.top_k,
            sampling.top_p,
            sampling.allowed,
        )
        budget = budget - 1
        ended = _ended(new_tokens, budget, sampling.stop_ids)
        positions = jnp.where(ended, limit, jnp.minimum(positions + 1, limit))
        out_tokens = out_tokens.at[i].set(new_tokens)
        out_logprobs = out_logprobs.at[i].set(logprobs.astype(jnp.float32))
        return i + 1, cache, new_tokens, positions, keys, budget, out_tokens, out_logprobs

    init = (
        jnp.int32(0),
        cache,
        state.tokens,
        positions,
        state.keys,
        state.budget,
        jnp.full((t, s), -1, jnp.int32),
        jnp.zeros((t, s), jnp.float32),
    )
    _, cache, tokens, positions, keys, budget, out_tokens, out_logprobs = jax.lax.while_loop(
        live, one, init
    )
    return cache, DecodeState(tokens, positions, keys, budget), out_tokens, out_logprobs
