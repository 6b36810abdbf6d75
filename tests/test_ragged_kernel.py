"""The glue to JAX's ragged paged attention kernel (``model.attention: pallas`` over the
paged KV cache): the kernel's sequences it builds from a batch's rows (never more
queries than keys, short and padding rows included), and the attention layer it serves
against the einsum path over the same paged cache (prefill and decode, a shared prefix
block, short and padding rows).

jax 0.10.2 cannot execute the kernel on a CPU: its TPU interpret mode fails on the
kernel's reshape of a VMEM ref (pinned below, so a JAX that can run it fails that test),
and ``model.attention_interpret`` runs JAX's reference of the kernel, after the kernel's
own runtime input checks, on the same sequences the kernel is handed."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu import ragged_paged_attention as rpa

from tunix_agentic.models.attention import pages_shape, ragged_seqs
from tunix_agentic.models.config import ModelConfig
from tunix_agentic.models.transformer import Attention, init_cache, init_paged_cache
from tunix_agentic.testing import TINY

# GQA at the kernel's own head_dim (the built-in model's 10 is zero-padded to 128).
WIDE_HEADS = ModelConfig(
    vocab_size=61, d_model=24, num_layers=1, num_heads=6, num_kv_heads=2, head_dim=128, ffn_dim=40
)
SHAPES = {"builtin": TINY, "wide_heads": WIDE_HEADS}
SLOW = pytest.mark.slow  # eager calls through JAX's reference: ~20 s a shape on 2 cores
TOL = dict(rtol=2e-5, atol=2e-5)  # float32; the kernel's softmax is f32 like ours
BLOCKS, BLOCK_SIZE, NONE = 10, 8, 10  # NONE: past the pool, no block


def _sequences(seqs) -> list[tuple[int, int]]:
    """The kernel's (q_len, kv_len) for each sequence it runs."""
    cu, kv = np.asarray(seqs.cu_q_lens), np.asarray(seqs.kv_lens)
    return [(int(cu[i + 1] - cu[i]), int(kv[i])) for i in range(int(seqs.num_seqs[0]))]


def test_the_kernels_sequences_are_each_rows_real_tokens_packed():
    # Rows: a 12-token prefill, a short row of 3 at 8 (behind a shared prefix), a padding
    # row, a short row of 1 at 0 (fewer keys than the chunk's 12 slots).
    start = jnp.array([0, 8, 32, 0], jnp.int32)
    real = jnp.array([12, 3, 0, 1], jnp.int32)
    tables = jnp.arange(16, dtype=jnp.int32).reshape(4, 4)
    seqs = jax.jit(ragged_seqs, static_argnums=3)(start, real, tables, 12)
    none = 48  # B * T
    np.testing.assert_array_equal(seqs.cu_q_lens, [0, 12, 15, 16, 16])
    np.testing.assert_array_equal(seqs.num_seqs, [3])
    np.testing.assert_array_equal(seqs.kv_lens, [12, 11, 1, 1])  # the padding row last
    np.testing.assert_array_equal(seqs.tables[:, 0], [0, 4, 12, 8])
    np.testing.assert_array_equal(seqs.slots[0], np.arange(12))
    np.testing.assert_array_equal(seqs.slots[1], [12, 13, 14] + [none] * 9)
    np.testing.assert_array_equal(seqs.slots[2], [none] * 12)
    np.testing.assert_array_equal(seqs.slots[3], [15] + [none] * 11)


def test_a_batch_of_padding_rows_is_one_padding_query_over_one_key():
    seqs = ragged_seqs(
        jnp.full(3, 32, jnp.int32), jnp.zeros(3, jnp.int32), jnp.zeros((3, 2), jnp.int32), 1
    )
    assert _sequences(seqs) == [(1, 1)]
    np.testing.assert_array_equal(seqs.slots, [[3]] * 3)  # no row reads it


@pytest.mark.parametrize("t", [1, 5, 16], ids=["decode", "chunk5", "chunk16"])
def test_no_sequence_has_more_queries_than_keys(t):
    """The kernel's precondition (JAX checks it only in dynamic_validate_inputs) over
    random mixes of full, short, padding and late-starting rows."""
    rng = np.random.default_rng(t)
    seqs_of = jax.jit(ragged_seqs, static_argnums=3)
    for _ in range(50):
        b = int(rng.integers(1, 6))
        real = rng.integers(0, t + 1, b) * (rng.random(b) < 0.7)
        start = np.where(real > 0, rng.integers(0, 20, b), 40)
        seqs = seqs_of(
            jnp.asarray(start, jnp.int32),
            jnp.asarray(real, jnp.int32),
            jnp.zeros((b, 8), jnp.int32),
            t,
        )
        pairs = _sequences(seqs)
        assert all(1 <= q <= kv for q, kv in pairs), (start, real, pairs)
        if real.any():  # each row with tokens is one sequence of exactly its tokens
            assert sorted(q for q, _ in pairs) == sorted(int(r) for r in real if r)
        else:
            assert pairs == [(1, 1)]
        assert int(seqs.cu_q_lens[-1]) <= b * t


def test_jax_cannot_run_the_ragged_kernel_on_cpu_yet():
    """jax 0.10.2's TPU interpret mode refuses the kernel (it reshapes a VMEM ref), so
    ``model.attention_interpret`` runs JAX's reference of it. When this test fails, the
    installed JAX may run the kernel itself: make ``attention._ragged_call`` use it under
    ``force_tpu_interpret_mode`` and this file's layer tests check the kernel."""
    k_heads, dim = 1, 128
    args = (
        jnp.zeros((8, 2, dim), jnp.float32),
        jnp.zeros(pages_shape(k_heads, dim, 4, 4), jnp.float32),
        jnp.array([4, 4], jnp.int32),  # kv_lens
        jnp.array([[0], [1]], jnp.int32),  # tables
        jnp.array([0, 4, 8], jnp.int32),  # cu_q_lens
        jnp.array([2], jnp.int32),  # num_seqs
    )
    kernel = dict(num_kv_pages_per_block=1, num_queries_per_block=8)
    try:
        with pytest.raises(jax.errors.JaxRuntimeError, match="'ReshapeTransform' object has no"):
            with pltpu.force_tpu_interpret_mode(pltpu.InterpretParams()):
                jax.block_until_ready(rpa.ragged_paged_attention(*args, **kernel))
    finally:
        pltpu.reset_tpu_interpret_mode_state()  # a failed interpretation keeps its state


def _layers(cfg: ModelConfig):
    """The einsum attention layer and the pallas one (interpret), same weights."""
    ref = Attention(cfg, rngs=nnx.Rngs(3))
    pal = Attention(
        dataclasses.replace(cfg, attention="pallas", attention_interpret=True), rngs=nnx.Rngs(3)
    )
    return ref, pal


def _pages_as_kv(pages: jax.Array, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's pages ``[blocks, bs, 2K, D']`` as the einsum path's K and V pools."""
    k, v = pages[:, :, 0::2, :head_dim], pages[:, :, 1::2, :head_dim]
    return np.asarray(k.transpose(0, 2, 1, 3)), np.asarray(v.transpose(0, 2, 1, 3))


# Each step: positions (past the table: padding) and block tables, one row each; two
# shapes of call ([3, 12] chunks, [4, 1] decode steps) so eager calls compile little.
# A prefills 12 tokens into blocks [7, 2] beside a short row (3 tokens into block 4, fewer
# keys than the chunk's slots) and a padding row; then B reuses A's first block (8 shared
# tokens) and prefills 3 more into its own block 5, beside a padding row and a 1-token
# row; then A, B and the short row decode a step beside a stopped row; then all stop.
PAD = 40
STEPS = [
    dict(
        positions=[list(range(12)), [0, 1, 2] + [PAD] * 9, [PAD] * 12],
        tables=[[7, 2, NONE], [4, NONE, NONE], [NONE] * 3],
    ),
    dict(
        positions=[[8, 9, 10] + [PAD] * 9, [PAD] * 12, [3] + [PAD] * 11],
        tables=[[7, 5, NONE], [NONE] * 3, [4, NONE, NONE]],
    ),
    dict(
        positions=[[12], [11], [4], [PAD]],
        tables=[[7, 2, NONE], [7, 5, NONE], [4, NONE, NONE], [NONE] * 3],
    ),
    dict(positions=[[PAD]] * 4, tables=[[7, 2, NONE], [7, 5, NONE], [4, NONE, NONE], [NONE] * 3]),
]


@pytest.mark.parametrize(
    "shape", ["builtin", pytest.param("wide_heads", marks=SLOW)], ids=["builtin", "wide_heads"]
)
def test_the_pallas_layer_matches_einsum_over_a_paged_cache(shape):
    """Every step's outputs at real tokens equal the einsum path's, padding outputs are
    zeros, and the kernel's pages hold the einsum path's K and V (up to rounding: that
    path is jitted)."""
    cfg = SHAPES[shape]
    ref, pal = _layers(cfg)
    einsum = nnx.jit(lambda layer, *args: layer(*args))  # the pallas path eagerly (see top)
    rng = np.random.default_rng(1)
    ref_cache = init_cache(cfg, BLOCKS, BLOCK_SIZE)[0]
    pal_cache = init_paged_cache(pal.cfg, BLOCKS, BLOCK_SIZE)[0]
    for i, step in enumerate(STEPS):
        positions = jnp.asarray(step["positions"], jnp.int32)
        tables = jnp.asarray(step["tables"], jnp.int32)
        x = jnp.asarray(rng.normal(size=(*positions.shape, cfg.d_model)), jnp.float32)
        want, ref_cache = einsum(ref, x, positions, ref_cache, None, tables)
        got, pal_cache = pal(x, positions, pal_cache, None, tables)
        real = np.asarray(positions) < PAD
        np.testing.assert_allclose(got[real], want[real], **TOL, err_msg=f"step {i}")
        # Padding attends to nothing: zeros, through the bias-free output projection.
        np.testing.assert_array_equal(got[~real], 0.0, err_msg=f"step {i}")
        for a, b in zip(_pages_as_kv(pal_cache, cfg.head_dim), ref_cache, strict=True):
            np.testing.assert_allclose(a, b, **TOL, err_msg=f"step {i}")
