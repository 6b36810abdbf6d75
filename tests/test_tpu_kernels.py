"""``model.attention``: resolution per platform, and JAX's TPU kernels (``pallas``) against
the einsum path on CPU: splash attention in Pallas interpret mode (training logits and
gradients), ragged paged attention through JAX's reference of the kernel (prefill and
decode over a paged cache whose first block two rows share), on the built-in model and a
small Qwen3-shaped one (qk_norm, GQA, head_dim 128). Then the paged decode step compiled
for a TPU v5e topology from this host: the kernel is in the program as a custom call."""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tunix_agentic.models.attention import resolve_attention
from tunix_agentic.models.config import ModelConfig
from tunix_agentic.models.transformer import (
    Transformer,
    init_cache,
    init_paged_cache,
    sequence_logprobs,
)
from tunix_agentic.sharding import (
    MeshConfig,
    batch_sharding,
    cache_sharding,
    make_mesh,
    replicated,
    tree_shardings,
)
from tunix_agentic.testing import TINY

# Qwen3's attention shape at toy width: q/k RMSNorm, 4 query heads over 2 kv heads, the
# head_dim the TPU kernels tile by (the built-in model's 16 is zero-padded to 128).
QWEN3_SMALL = ModelConfig(
    vocab_size=61,
    d_model=32,
    num_layers=1,
    num_heads=4,
    num_kv_heads=2,
    head_dim=128,
    ffn_dim=48,
    qk_norm=True,
    tie_embeddings=False,
    rope_theta=1_000_000.0,
)
SHAPES = {"builtin": TINY, "qwen3_small": QWEN3_SMALL}
TOL = dict(rtol=2e-5, atol=2e-5)  # float32; the kernels' softmax is f32 like ours


def _pair(cfg: ModelConfig):
    """The einsum model and the pallas one (interpret), same weights."""
    ref = Transformer(cfg, rngs=nnx.Rngs(3))
    pal = Transformer(
        dataclasses.replace(cfg, attention="pallas", attention_interpret=True), rngs=nnx.Rngs(3)
    )
    assert ref.cfg.attention == "einsum" and pal.cfg.attention == "pallas"
    return ref, pal


@pytest.mark.parametrize(
    "requested, platform, want",
    [
        ("auto", "tpu", "pallas"),
        ("auto", "gpu", "cudnn"),
        ("auto", "cpu", "einsum"),
        ("einsum", "tpu", "einsum"),
        ("dot_product", "gpu", "dot_product"),
        ("cudnn", "gpu", "cudnn"),
        ("pallas", "tpu", "pallas"),
    ],
    ids=lambda v: v,
)
def test_resolve_attention(requested, platform, want):
    assert resolve_attention(requested, platform) == want


def test_a_forced_name_the_platform_cannot_run_is_a_clear_error():
    with pytest.raises(ValueError, match=r"model\.attention=pallas needs a TPU.*cpu"):
        resolve_attention("pallas", "cpu")
    with pytest.raises(ValueError, match=r"model\.attention=cudnn needs a GPU.*tpu"):
        resolve_attention("cudnn", "tpu")
    with pytest.raises(ValueError, match=r"model\.attention must be one of"):
        resolve_attention("flash", "tpu")
    assert resolve_attention("pallas", "cpu", interpret=True) == "pallas"
    with pytest.raises(ValueError, match=r"model\.attention=cudnn needs a GPU"):
        Transformer(dataclasses.replace(TINY, attention="cudnn"), rngs=nnx.Rngs(0))
    # Built here (CPU), auto is the einsum path.
    auto = Transformer(dataclasses.replace(TINY, attention="auto"), rngs=nnx.Rngs(0))
    assert all(layer.attn.cfg.attention == "einsum" for layer in auto.layers)


@pytest.mark.parametrize("shape", SHAPES, ids=list(SHAPES))
def test_splash_training_logits_and_gradients_match(shape):
    ref, pal = _pair(SHAPES[shape])
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, ref.cfg.vocab_size, (2, 11)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(11), (2, 11))

    def loss(m):
        logits, _ = m(tokens, positions)
        return jax.nn.log_softmax(logits)[..., 0].mean(), logits

    forward = nnx.jit(lambda m: loss(m)[1])
    np.testing.assert_allclose(forward(pal), forward(ref), **TOL)
    if shape != "builtin":  # the backward kernels on one shape: interpret mode is slow
        return
    grads = nnx.jit(lambda m: nnx.grad(loss, has_aux=True)(m)[0])
    g_ref, g_pal = grads(ref), grads(pal)
    for a, b in zip(jax.tree.leaves(g_ref), jax.tree.leaves(g_pal), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)


def test_splash_packed_rows_match():
    """Packed rows (the warm start's: two segments and padding in a row, positions from 0
    in each) through splash with the kernel's segment ids equal the einsum path's mask."""
    ref, pal = _pair(TINY)
    rng = np.random.default_rng(2)
    tokens = jnp.asarray(rng.integers(0, TINY.vocab_size, (2, 13)), jnp.int32)
    segments = jnp.asarray([[1] * 6 + [2] * 5 + [0] * 2, [1] * 9 + [2] * 4], jnp.int32)
    positions = jnp.asarray([[*range(6), *range(5), 0, 1], [*range(9), *range(4)]], jnp.int32)
    forward = nnx.jit(lambda m: m(tokens, positions, segments=segments)[0])
    np.testing.assert_allclose(forward(pal), forward(ref), **TOL)
    # The segments reach the kernel: without them the second segments read the first.
    unpacked = nnx.jit(lambda m: m(tokens, positions)[0])(pal)
    assert not np.allclose(unpacked[:, 6:11], forward(ref)[:, 6:11], **TOL)


@pytest.mark.slow  # eager model calls (JAX's reference of the kernel): ~20-45 s each
@pytest.mark.parametrize("shape", SHAPES, ids=list(SHAPES))
def test_ragged_paged_prefill_and_decode_match(shape):
    """Row A prefills 12 tokens into blocks [7, 2]; row B then reuses A's first block (8
    tokens, shared) and prefills 3 more into its own block 5, beside a padding row; then
    both decode a step. Every call's logits equal the einsum path's over the same
    paged cache (which tests/test_attention_impl.py checks against the dense cache)."""
    cfg = SHAPES[shape]
    ref, pal = _pair(cfg)
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, cfg.vocab_size, 12)
    none = 10  # past the pool of 10 blocks: no block
    steps = [
        dict(
            tokens=[prompt],
            positions=[np.arange(12)],
            tables=[[7, 2, none, none]],
            logits_at=[11],
        ),
        dict(  # B: A's prompt up to 8, then its own 3 tokens; a padding row beside it
            tokens=[[*rng.integers(0, cfg.vocab_size, 3), 0], [0, 0, 0, 0]],
            positions=[[8, 9, 10, 32], [32, 32, 32, 32]],
            tables=[[7, 5, none, none], [none] * 4],
            logits_at=[2, 0],
        ),
        dict(
            tokens=[[4], [9]],
            positions=[[12], [11]],
            tables=[[7, 2, none, none], [7, 5, none, none]],
        ),
    ]
    # The einsum path's K and V pools; the kernel's one array in its own layout.
    caches = [init_cache(cfg, 10, 8), init_paged_cache(pal.cfg, 10, 8)]
    for i, step in enumerate(steps):
        args = {k: jnp.asarray(np.asarray(v), jnp.int32) for k, v in step.items()}
        out = []
        for j, model in enumerate((ref, pal)):  # the pallas path eagerly: JAX's reference
            logits, caches[j] = model(
                args["tokens"],
                args["positions"],
                caches[j],
                **{k: args[k] for k in ("tables", "logits_at") if k in args},
            )
            out.append(logits)
        real = slice(None) if i != 1 else slice(0, 1)  # step 1's second row is padding
        np.testing.assert_allclose(out[1][real], out[0][real], **TOL, err_msg=f"step {i}")


def test_paged_decode_compiles_to_the_tpu_kernel():
    """With libtpu installed (no TPU needed): the paged decode step of a pallas model,
    built and compiled for v5e 2x4 from shapes alone, holds a ``tpu_custom_call``."""
    pytest.importorskip("libtpu")
    from jax.experimental import topologies

    # Other processes on this host may hold libtpu's lockfile; compiling needs no chip.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    topo = topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x4")
    cfg = dataclasses.replace(QWEN3_SMALL, dtype="bfloat16", attention="auto")
    sds = jax.ShapeDtypeStruct
    with jax.default_device(topo.devices[0]):
        abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
        assert abstract.cfg.attention == "pallas"  # auto, built for the TPU
        graphdef, state = nnx.split(abstract)

        def decode(state, tokens, positions, cache, tables):
            return nnx.merge(graphdef, state)(tokens, positions, cache, tables=tables)

        pages = sds((16, 16, 2 * cfg.num_kv_heads, cfg.head_dim), jnp.bfloat16)
        rows = sds((4, 1), jnp.int32)
        lowered = jax.jit(decode).lower(state, rows, rows, (pages,), sds((4, 4), jnp.int32))
        text = lowered.compile().as_text()
    assert "tpu_custom_call" in text
    assert "ragged_paged_attention" in text


def _v5e_devices():
    pytest.importorskip("libtpu")
    from jax.experimental import topologies

    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    return topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x4").devices


def test_paged_decode_on_a_tp_mesh_compiles_to_the_tpu_kernel():
    """On an engine mesh of 2 x 2 v5e chips (rows over fsdp, kv heads over tp) the pallas
    paged decode step compiles: the kernel runs under shard_map (XLA cannot partition a
    Mosaic kernel), once per chip on its own kv head's pages."""
    devices = _v5e_devices()
    mesh = make_mesh(MeshConfig(fsdp=2, tp=2), devices[:4])
    cfg = dataclasses.replace(QWEN3_SMALL, dtype="bfloat16", attention="auto")
    with jax.default_device(devices[0]):
        abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
        graphdef, state = nnx.split(abstract)
        state = jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
            state,
            tree_shardings(state, mesh),
        )

        def decode(state, tokens, positions, cache, tables):
            return nnx.merge(graphdef, state)(tokens, positions, cache, tables=tables)

        rep = replicated(mesh)
        pages = jax.ShapeDtypeStruct(
            (16, 16, 2 * cfg.num_kv_heads, cfg.head_dim),
            jnp.bfloat16,
            sharding=cache_sharding(mesh, cfg.num_kv_heads, pages=True),
        )
        rows = jax.ShapeDtypeStruct((4, 1), jnp.int32, sharding=rep)
        tables = jax.ShapeDtypeStruct((4, 4), jnp.int32, sharding=rep)
        lowered = jax.jit(decode).lower(state, rows, rows, (pages,), tables)
        text = lowered.compile().as_text()
    assert "tpu_custom_call" in text
    assert "ragged_paged_attention" in text
    # Each chip's kernel sees one kv head's pages: [blocks, block_size, 2 x 1, head_dim].
    assert "bf16[16,16,2,128]" in text


def test_splash_training_on_a_mesh_compiles_to_the_tpu_kernel():
    """The learner's splash attention on a 2 x 2 v5e mesh (rows over fsdp, heads over
    tp): forward and backward compile, the kernel under shard_map."""
    devices = _v5e_devices()
    mesh = make_mesh(MeshConfig(fsdp=2, tp=2), devices[:4])
    cfg = dataclasses.replace(QWEN3_SMALL, dtype="bfloat16", attention="auto")
    with jax.default_device(devices[0]):
        abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
        graphdef, state = nnx.split(abstract)
        state = jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
            state,
            tree_shardings(state, mesh),
        )

        def loss(state, tokens):
            return jnp.mean(sequence_logprobs(nnx.merge(graphdef, state), tokens))

        tokens = jax.ShapeDtypeStruct((4, 128), jnp.int32, sharding=batch_sharding(mesh))
        text = jax.jit(jax.grad(loss)).lower(state, tokens).compile().as_text()
    assert "tpu_custom_call" in text
