"""The engine's device step: pure prefill and decode functions over typed state.

Everything the device computes for the engine is here, and nothing else is.
Both functions are pure: they take the parameters, the KV cache and the
per-slot :class:`DecodeState` and return new ones (the engine jits them with
the cache and the state donated, and the :class:`StepConfig` static).

- :func:`prefill` runs the new tokens of a batch of prompts through the model,
  writes their KV into the slots they were given, samples each row's first
  token and sets those slots' decode state, so the next decode continues from
  there without the host in between.
- :func:`decode` runs ``decode_steps`` steps over every slot in one
  ``lax.scan``; slots marked ``stop`` write nowhere (their position is pushed
  past the cache, where writes are dropped).

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


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """The static half of both calls: the model's graph and the engine's shapes."""

    graphdef: Any  # nnx.GraphDef of the Transformer
    max_seq_len: int
    decode_steps: int


@struct.dataclass
class DecodeState:
    """Per-slot decode state; lives on the device between calls."""

    tokens: jax.Array  # [S] int32: each slot's last sampled token (the next input)
    positions: jax.Array  # [S] int32: where that token goes; max_seq_len: stopped
    keys: jax.Array  # [S, 2] uint32: each slot's PRNG key

    @classmethod
    def fresh(cls, num_slots: int, max_seq_len: int) -> DecodeState:
        """Every slot stopped (positions past the cache)."""
        return cls(
            tokens=jnp.zeros(num_slots, jnp.int32),
            positions=jnp.full(num_slots, max_seq_len, jnp.int32),
            keys=jnp.zeros((num_slots, 2), jnp.uint32),
        )


@struct.dataclass
class RowSampling:
    """How each row samples (one row per slot in decode, per prompt in prefill)."""

    temperature: jax.Array  # [R] float32; 0: greedy
    top_k: jax.Array  # [R] int32; 0: off
    top_p: jax.Array  # [R] float32; 1: off

    @classmethod
    def host(cls, rows: int) -> RowSampling:
        """Host (numpy) arrays of neutral values, to be filled row by row."""
        return cls(
            temperature=np.ones(rows, np.float32),
            top_k=np.zeros(rows, np.int32),
            top_p=np.ones(rows, np.float32),
        )

    def set_row(self, row: int, temperature: float, top_k: int, top_p: float) -> None:
        """Fill one row of host arrays (only on :meth:`host` instances)."""
        self.temperature[row], self.top_k[row], self.top_p[row] = temperature, top_k, top_p

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

    @classmethod
    def host(cls, rows: int, length: int, *, num_slots: int, max_seq_len: int) -> PrefillBatch:
        """Host (numpy) arrays of ``rows`` padding rows, to be filled row by row."""
        return cls(
            ids=np.zeros((rows, length), np.int32),
            positions=np.full((rows, length), max_seq_len, np.int32),
            slots=np.full(rows, num_slots, np.int32),
            last_index=np.zeros(rows, np.int32),
            next_position=np.zeros(rows, np.int32),
            keys=np.zeros((rows, 2), np.uint32),
            sampling=RowSampling.host(rows),
        )


def prefill(
    step: StepConfig, params: Any, cache: Any, state: DecodeState, batch: PrefillBatch
) -> tuple[Any, DecodeState, jax.Array, jax.Array]:
    """Prefill ``batch`` into its slots; returns (cache, state, tokens [R], logprobs [R])."""
    model = nnx.merge(step.graphdef, params)
    logits, cache = model(
        batch.ids, batch.positions, cache, batch.slots, logits_at=batch.last_index
    )
    keys, use = split_keys(batch.keys)
    s = batch.sampling
    tokens, logprobs = sample(logits, use, s.temperature, s.top_k, s.top_p)
    # The admitted slots' decode state, set on device: the next chunk continues from it.
    state = DecodeState(
        tokens=state.tokens.at[batch.slots].set(tokens, mode="drop"),
        positions=state.positions.at[batch.slots].set(batch.next_position, mode="drop"),
        keys=state.keys.at[batch.slots].set(keys, mode="drop"),
    )
    return cache, state, tokens, logprobs


def decode(
    step: StepConfig,
    params: Any,
    cache: Any,
    state: DecodeState,
    stop: jax.Array,  # [S] bool: slots that decode no further
    sampling: RowSampling,
) -> tuple[Any, DecodeState, jax.Array, jax.Array]:
    """``decode_steps`` steps over every slot; returns (cache, state, tokens [T, S],
    logprobs [T, S])."""
    model = nnx.merge(step.graphdef, params)
    limit = step.max_seq_len
    positions = jnp.where(stop, limit, state.positions)  # a stopped slot writes nowhere

    def one(carry, _):
        cache, tokens, positions, keys = carry
        logits, cache = model(tokens[:, None], positions[:, None], cache)
        keys, use = split_keys(keys)
        new_tokens, logprobs = sample(
            logits[:, 0], use, sampling.temperature, sampling.top_k, sampling.top_p
        )
        positions = jnp.minimum(positions + 1, limit)
        return (cache, new_tokens, positions, keys), (new_tokens, logprobs)

    (cache, tokens, positions, keys), (out_tokens, out_logprobs) = jax.lax.scan(
        one, (cache, state.tokens, positions, state.keys), None, length=step.decode_steps
    )
    return cache, DecodeState(tokens, positions, keys), out_tokens, out_logprobs
