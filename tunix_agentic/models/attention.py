"""How attention is computed (``model.attention``): the name a run resolves to for its
platform, and the glue to the attention kernels JAX ships.

- ``einsum``: the transformer's own grouped einsums with an f32 softmax; the reference.
- ``dot_product``: ``jax.nn.dot_product_attention`` with ``implementation=None`` (XLA).
- ``cudnn``: ``jax.nn.dot_product_attention(implementation="cudnn")`` (GPU; bf16/fp16
  only, anything else falls back to ``einsum`` with a warning when traced).
- ``pallas``: JAX's TPU Pallas kernels. Over the paged KV cache (``engine.kv_layout:
  paged``) prefill and decode run ``ragged_paged_attention``; training (no cache) runs
  splash attention (causal). A dense KV cache has no TPU kernel here and keeps the einsum
  path. Both kernels want a head_dim that is a multiple of 128: a smaller one is padded
  with zeros (exact, more bytes).
- ``auto``: ``pallas`` on TPU, ``cudnn`` on GPU, ``einsum`` on CPU.

The resolved name alone selects the code path (no backend check while tracing), so a
program for a TPU can be built and compiled on a CPU host (``aot``).

``ModelConfig.attention_interpret`` runs the ``pallas`` path on any platform for tests:
splash attention in Pallas TPU interpret mode, and ragged paged attention through JAX's
own reference of that kernel (``ref_ragged_paged_attention``, eager calls only), on the
very sequences the kernel would be handed and after the kernel's own runtime input
checks (``dynamic_validate_inputs``: every sequence's queries at most its keys, among
others). jax 0.10.2 cannot execute the ragged kernel on a CPU: in TPU interpret mode
(``pltpu.force_tpu_interpret_mode``) its reshape of a VMEM ref fails with
``AttributeError: 'ReshapeTransform' object has no attribute 'indices'``, and the older
discharge interpreter fails on ``'TypedInt' object has no attribute 'shape'``;
tests/test_ragged_kernel.py pins the first, so a JAX that runs the kernel is noticed.
"""

from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import PartitionSpec as P

from tunix_agentic.models.config import ATTENTION_IMPLS

log = logging.getLogger(__name__)

PLATFORMS = ("tpu", "gpu", "cpu")
_AUTO = {"tpu": "pallas", "gpu": "cudnn", "cpu": "einsum"}
_NEEDS = {"pallas": "tpu", "cudnn": "gpu"}
LANES = 128  # the TPU kernels' head_dim and sequence tile


def resolve_attention(requested: str, platform: str, *, interpret: bool = False) -> str:
    """The attention path a run takes on ``platform`` ("tpu", "gpu" or "cpu") for the
    configured ``model.attention``: ``auto`` picks the platform's kernels; a forced name
    is kept, or a ValueError naming ``model.attention`` when it cannot run there
    (``interpret``: the TPU kernels run anywhere, in Pallas interpret mode)."""
    if requested not in ATTENTION_IMPLS:
        raise ValueError(
            f"model.attention must be one of {', '.join(ATTENTION_IMPLS)}, got {requested!r}"
        )
    if platform not in PLATFORMS:
        raise ValueError(f"unknown platform {platform!r}: one of {', '.join(PLATFORMS)}")
    if requested == "auto":
        return _AUTO[platform]
    need = _NEEDS.get(requested)
    if need is not None and need != platform and not (requested == "pallas" and interpret):
        hint = " (or model.attention_interpret=true, slow, for tests)" if need == "tpu" else ""
        raise ValueError(
            f"model.attention={requested} needs a {need.upper()}, this run's platform is "
            f"{platform}: use auto or einsum{hint}"
        )
    return requested


def target_platform() -> str:
    """The platform programs are built for: the default device's when one is set (``with
    jax.default_device(topology.devices[0])`` builds for a TPU from a CPU host), else
    ``jax.default_backend()``."""
    device = jax.config.jax_default_device
    if isinstance(device, str):
        return device
    return device.platform if device is not None else jax.default_backend()


def _pad_last(x: jax.Array, size: int) -> jax.Array:
    """Zero-pad the last axis to ``size``."""
    extra = size - x.shape[-1]
    return x if extra == 0 else jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, extra)])


def _lanes(n: int) -> int:
    return -(-n // LANES) * LANES


# ---------------------------------------------------------------- meshes
# The mesh axes of tunix_agentic.sharding: heads over "tp", a batch's rows over "fsdp".
HEADS_AXIS, ROWS_AXIS = "tp", "fsdp"


def _mesh_of(*arrays):
    """The mesh a traced call's arrays lie on, when it has more than one device, else None.

    Mosaic kernels cannot be partitioned by XLA: on a mesh each kernel call runs under
    ``jax.shard_map``. Under jit the arrays' types carry the mesh of the arguments'
    NamedShardings (the engine and learner place weights and cache on theirs), or the one
    ``jax.set_mesh`` gives."""
    for x in arrays:
        mesh = getattr(getattr(jax.typeof(x), "sharding", None), "mesh", None)
        if mesh is not None and not mesh.empty and mesh.size > 1:
            return mesh
    mesh = jax.sharding.get_abstract_mesh()
    return None if mesh.empty or mesh.size == 1 else mesh


def _split(mesh, axis: str, size: int) -> str | None:
    """``axis`` when ``mesh`` has it over more than one device and it divides ``size``;
    else None (that dimension replicated: correct, each device computes all of it)."""
    n = dict(mesh.shape).get(axis, 1)
    return axis if n > 1 and size % n == 0 else None


# ---------------------------------------------------------------- training: splash
def _splash_kernel(heads: int, length: int, interpret: bool):
    # Built in every trace, not cached: its mask tables become arrays of the trace.
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    block = next(b for b in (512, 256, 128) if length % b == 0)
    sizes = splash.BlockSizes(
        block_q=block,
        block_kv=block,
        block_kv_compute=block,
        block_q_dkv=block,
        block_kv_dkv=block,
        block_kv_dkv_compute=block,
        block_q_dq=block,
        block_kv_dq=block,
    )
    mask = splash.MultiHeadMask([splash.CausalMask((length, length))] * heads)
    return splash.make_splash_mha(
        mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret
    )


def splash_causal(
    q: jax.Array,
    keys: jax.Array,
    values: jax.Array,
    scale: float,
    interpret: bool,
    segments: jax.Array | None = None,
) -> jax.Array:
    """Causal attention by JAX's splash attention kernel (grouped-query: ``N`` query heads
    over ``K`` kv heads). q ``[B, T, N, D]``, keys/values ``[B, K, T, D]``; returns
    ``[B, T, N, D]``. Causal by index: every row starts at position 0 (a training batch;
    right padding only changes the padded positions' outputs). T is padded to a multiple
    of 128 and D to one of 128 (zeros: exact). ``segments`` ``[B, T]``: packed rows'
    segment ids, the kernel's own ``SegmentIds`` (a token sees its segment only; causal
    by index is causal by position inside a segment)."""
    b, t, n, d = q.shape
    length, dim = _lanes(t), _lanes(d)
    if segments is not None:
        from jax.experimental.pallas.ops.tpu import splash_attention as splash

        # The lanes' padding gets a segment of its own: no real token reads it.
        ids = jnp.pad(segments.astype(jnp.int32), ((0, 0), (0, length - t)), constant_values=-1)

    def prep(x):  # [B, H, T, D] -> padded
        return _pad_last(jnp.pad(x, ((0, 0), (0, 0), (0, length - t), (0, 0))), dim)

    qh = prep((q * jnp.asarray(scale, q.dtype)).transpose(0, 2, 1, 3))
    kh, vh = prep(keys.astype(q.dtype)), prep(values.astype(q.dtype))

    def local(qh, kh, vh, *seg):  # one device's rows and heads (whole query groups)
        kernel = _splash_kernel(qh.shape[1], length, interpret)
        if not seg:
            return jax.vmap(kernel)(qh, kh, vh)
        return jax.vmap(
            lambda a, k, v, s: kernel(a, k, v, segment_ids=splash.SegmentIds(q=s, kv=s))
        )(qh, kh, vh, seg[0])

    args = (qh, kh, vh) if segments is None else (qh, kh, vh, ids)
    mesh = _mesh_of(q, keys)
    if mesh is not None:  # rows over fsdp, kv heads (and their query heads) over tp
        spec = P(_split(mesh, ROWS_AXIS, b), _split(mesh, HEADS_AXIS, keys.shape[1]))
        specs = (spec,) * 3 + ((P(spec[0]),) if segments is not None else ())
        local = jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=spec, check_vma=False)
    out = local(*args)
    return out[:, :, :t, :d].transpose(0, 2, 1, 3)


# ------------------------------------------------- paged KV: ragged paged attention
def pages_shape(num_kv_heads: int, head_dim: int, blocks: int, block_size: int) -> tuple:
    """One layer's KV pages in the kernel's own layout: ``[blocks, block_size, 2K, D']``,
    K and V of kv head ``h`` at ``2h`` and ``2h + 1``, ``D'`` the head_dim padded to the
    lanes. The cache is kept so, and the kernel reads it as it is: no copy a call."""
    return (blocks, block_size, 2 * num_kv_heads, _lanes(head_dim))


def page_slots(
    tables: jax.Array, positions: jax.Array, blocks: int, block_size: int
) -> tuple[jax.Array, jax.Array]:
    """Where each token at ``positions`` (``[B, T]``) lives through the block ``tables``
    (``[B, W]``): its block ``[B, T]`` (``blocks``, past the pool, for a position past the
    table, so a write with ``mode="drop"`` drops it) and its offset in the block."""
    width = tables.shape[1]
    index = jnp.clip(positions // block_size, 0, width - 1)
    block = jnp.take_along_axis(tables, index, axis=1)  # [B, T]
    block = jnp.where(positions < width * block_size, block, blocks)
    return block, positions % block_size


def write_pages(
    pages: jax.Array, tables: jax.Array, positions: jax.Array, k: jax.Array, v: jax.Array
) -> jax.Array:
    """Write ``k``/``v`` (``[B, T, K, D]``) at ``positions`` through the block ``tables``
    (``[B, W]``) into ``pages`` (:func:`pages_shape`); positions past the table (padding,
    stopped slots) and table entries ``>= blocks`` (no block) are dropped. Each token is
    one ``[2K, D']`` row, written in place.

    A decode step (``T == 1``) writes its ``B`` rows by ``B`` dynamic-update-slices: XLA's
    TPU scatter into the pages moves the whole array several times over (4.9 GB a decode
    step for Qwen3-0.6B's 16 slots against 0.5 GB this way, by XLA's own cost analysis
    compiled for v5e), where an update slice touches only its row."""
    n, bs, _, dim = pages.shape
    b, t, kv_heads, _ = k.shape
    block, offset = page_slots(tables, positions, n, bs)
    rows = jnp.stack([k, v.astype(k.dtype)], axis=3).reshape(b, t, 2 * kv_heads, -1)
    rows = _pad_last(rows, dim).astype(pages.dtype)
    if t != 1:
        return pages.at[block, offset].set(rows, mode="drop")
    zero = jnp.zeros((), jnp.int32)
    for i in range(b):  # unrolled: B is the engine's slot count
        where = (jnp.minimum(block[i, 0], n - 1).astype(jnp.int32), offset[i, 0].astype(jnp.int32))
        at = (*where, zero, zero)
        held = jax.lax.dynamic_slice(pages, at, (1, 1, 2 * kv_heads, dim))
        row = jnp.where(block[i, 0] < n, rows[i, 0][None, None], held)  # no block: unchanged
        pages = jax.lax.dynamic_update_slice(pages, row, at)
    return pages


@struct.dataclass
class RaggedSeqs:
    """A batch of rows as the ragged kernel's sequences: each row's real tokens packed
    contiguously (rows with tokens first, in row order), one sequence a row.

    The kernel's preconditions, held for any rows: every sequence up to ``num_seqs`` has
    ``1 <= q_len <= kv_len`` (its queries are the last ``q_len`` of its ``kv_len`` keys),
    and the packed queries fit the ``B * T`` slots. Both bounds of 1 matter: run by a
    patched TPU interpreter, the kernel hands the KV block it prefetched for a sequence
    with no key to the next sequence, and a trailing sequence with no query (after
    queries that fill whole query blocks) leaves every later heads block wrong."""

    slots: jax.Array  # [B, T] int32: each row token's slot among the packed queries; B*T: none
    kv_lens: jax.Array  # [B] int32, in the kernel's order
    tables: jax.Array  # [B, W] int32, in the kernel's order
    cu_q_lens: jax.Array  # [B + 1] int32
    num_seqs: jax.Array  # [1] int32


def ragged_seqs(start: jax.Array, real: jax.Array, tables: jax.Array, t: int) -> RaggedSeqs:
    """The kernel's sequences for rows whose first ``real`` (``[B]``) of ``t`` tokens are
    real, at positions ``start`` onwards (``[B]``), through block ``tables`` (``[B, W]``).
    A row without tokens is no sequence (past ``num_seqs``); when no row has one, row 0
    is one padding query over one key (the kernel wants a sequence), read by nobody."""
    b = real.shape[0]
    idle = jnp.all(real == 0)
    q_lens = real.at[0].add(idle.astype(real.dtype)).astype(jnp.int32)
    kv_lens = jnp.where(real > 0, start + real, 1).astype(jnp.int32)
    order = jnp.argsort((q_lens == 0).astype(jnp.int32), stable=True)  # rows with tokens first
    cu = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(q_lens[order], dtype=jnp.int32)])
    first = jnp.zeros(b, jnp.int32).at[order].set(cu[:-1])  # each row's first query slot
    token = jnp.arange(t, dtype=jnp.int32)
    slots = jnp.where(token < real[:, None], first[:, None] + token, b * t)
    return RaggedSeqs(
        slots=slots.astype(jnp.int32),
        kv_lens=kv_lens[order],
        tables=tables[order],
        cu_q_lens=cu,
        num_seqs=jnp.sum(q_lens > 0, dtype=jnp.int32)[None],
    )


def ragged_paged(
    q: jax.Array,
    positions: jax.Array,
    pages: jax.Array,
    tables: jax.Array,
    scale: float,
    interpret: bool,
) -> jax.Array:
    """Attention of ``q`` ``[B, T, N, D]`` at ``positions`` ``[B, T]`` over the paged KV
    (``pages``: :func:`pages_shape`, the new tokens already written; ``tables`` ``[B, W]``)
    by JAX's ``ragged_paged_attention``: every row one sequence, prefill chunks and decode
    steps alike. Returns ``[B, T, N, D]``.

    A row's real tokens are its leading run of consecutive positions inside the table;
    the rest is padding, whose outputs are zeros. The kernel is handed each row's real
    tokens only (:func:`ragged_seqs`): a sequence's queries are the last of its keys, and
    never more than its keys."""
    blocks, block_size, combined, _ = pages.shape
    b, t, n, _ = q.shape
    cap = tables.shape[1] * block_size
    start = positions[:, 0].astype(jnp.int32)
    run = (positions == start[:, None] + jnp.arange(t)) & (positions < cap)
    real = jnp.sum(jnp.cumprod(run.astype(jnp.int32), axis=1), axis=1, dtype=jnp.int32)  # [B]
    tables = jnp.clip(tables, 0, blocks - 1).astype(jnp.int32)  # no block: any, never read
    call = functools.partial(_ragged_local, scale=scale, interpret=interpret)
    mesh = None if interpret else _mesh_of(pages, q)
    if mesh is not None:
        # Each device: its rows (fsdp) and its kv heads' pages with their query heads (tp;
        # contiguous query heads are whole groups, contiguous K/V pairs whole kv heads).
        # The pages are whole on every row shard; each shard packs its own rows.
        rows, heads = _split(mesh, ROWS_AXIS, b), _split(mesh, HEADS_AXIS, combined // 2)
        call = jax.shard_map(
            call,
            mesh=mesh,
            in_specs=(P(rows, None, heads), P(None, None, heads), P(rows), P(rows), P(rows)),
            out_specs=P(rows, None, heads),
            check_vma=False,
        )
    return call(q, pages, start, real, tables)


def _ragged_local(q, pages, start, real, tables, *, scale: float, interpret: bool):
    """One kernel call over one device's rows: q ``[B, T, N, D]``, the pages, the rows'
    first positions and real token counts ``[B]`` and ``tables`` ``[B, W]``; returns
    ``[B, T, N, D]``, zeros at padding."""
    b, t, n, d = q.shape
    seqs = ragged_seqs(start, real, tables, t)
    flat = seqs.slots.reshape(-1)
    # The packed queries' source tokens: a slot no real token fills reads token 0.
    source = (
        jnp.zeros(b * t, jnp.int32).at[flat].set(jnp.arange(b * t, dtype=jnp.int32), mode="drop")
    )
    packed = q.reshape(b * t, n, d)[source]
    args = (
        _pad_last(packed, pages.shape[-1]).astype(pages.dtype),
        pages,
        seqs.kv_lens,
        seqs.tables,
        seqs.cu_q_lens,
        seqs.num_seqs,
    )
    out = _ragged_call(args, scale, interpret)[..., :d]  # [B*T, N, D]
    rows = out[jnp.minimum(seqs.slots, b * t - 1)]  # [B, T, N, D]
    return jnp.where((seqs.slots < b * t)[..., None, None], rows, 0).astype(q.dtype)


def _ragged_call(args, scale: float, interpret: bool) -> jax.Array:
    from jax.experimental.pallas.ops.tpu import ragged_paged_attention as rpa

    if not interpret:
        # Block sizes given: JAX's tuned table asks jax.devices() for the chip, which is
        # the host's CPU when compiling for a TPU topology from here (aot). Its defaults:
        # 32 queries a block; KV blocks of ~512 tokens here (its table's 128 pages).
        queries, tables = args[0], args[3]
        pages_per_block = min(tables.shape[1], max(1, 512 // args[1].shape[1]))
        return rpa.ragged_paged_attention(
            *args,
            sm_scale=scale,
            num_kv_pages_per_block=pages_per_block,
            num_queries_per_block=min(queries.shape[0], 32),
        )
    if any(isinstance(a, jax.core.Tracer) for a in args):
        raise ValueError(
            "model.attention_interpret runs ragged paged attention through JAX's reference "
            "of the kernel, which takes concrete arrays: call the model eagerly (no jit)"
        )
    # The kernel's own runtime checks, on the host: among them q_len <= kv_len for every
    # sequence, which the kernel itself assumes without checking.
    rpa.dynamic_validate_inputs(*args, sm_scale=scale)
    out = rpa.ref_ragged_paged_attention(*args, sm_scale=scale)  # the sequences' queries
    return jnp.pad(out, ((0, args[0].shape[0] - out.shape[0]), (0, 0), (0, 0)))


# ---------------------------------------------------------------- GPU: cuDNN
@functools.cache
def _warn_once(message: str) -> None:
    log.warning(message)


def cudnn_dtype_ok(dtype) -> bool:
    """cuDNN's fused attention takes bf16 and fp16 only."""
    return jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def fallback(reason: str) -> None:
    """Say once why ``model.attention=cudnn`` computes this call by the einsum path."""
    _warn_once(f"model.attention=cudnn: {reason}; using the einsum path")
