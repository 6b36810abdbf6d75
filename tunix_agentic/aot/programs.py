"""A run's device programs, built from its config and the model's ``config.json`` alone,
as jitted functions with abstract arguments (shapes, dtypes, shardings) ready to compile.

Each program is the one the run jits: the learner's :func:`~tunix_agentic.learners.grpo_step.train_step`
bound by :class:`~tunix_agentic.learners.grpo.GRPOLearner` (built under ``jax.eval_shape``:
no array exists), the SFT step, the engine's :func:`~tunix_agentic.inference.device_step.prefill`
and :func:`~tunix_agentic.inference.device_step.decode` jitted as its scheduler jits them,
and the weight sync's learner side. Each carries the least it must compute or move
(:class:`Minimum`), the denominator of its waste ratio.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tunix_agentic.aot.count import Workload
from tunix_agentic.aot.topology import Topology
from tunix_agentic.config import RunConfig
from tunix_agentic.inference.device_step import (
    DecodeState,
    PrefillBatch,
    RowSampling,
    StepConfig,
    prefill,
)
from tunix_agentic.inference.scheduler import jit_decode
from tunix_agentic.learners.batching import GRPOBatch, SFTBatch, bucket_length
from tunix_agentic.learners.grpo import GRPOLearner
from tunix_agentic.learners.grpo_step import sft_step
from tunix_agentic.learners.state import TrainState, make_optimizer
from tunix_agentic.models.config import ModelConfig
from tunix_agentic.models.transformer import (
    Transformer,
    cache_chunks,
    init_cache,
    init_paged_cache,
    kernel_pages,
)
from tunix_agentic.sharding import batch_sharding, cache_sharding, tree_shardings


@dataclasses.dataclass(frozen=True)
class Minimum:
    """The least a program must do, per chip: ``flops`` (its matmuls and causal attention,
    nothing recomputed but what ``remat`` recomputes) and ``bytes`` (what it must read and
    write once); ``kind`` names the one that bounds it, whose ratio is its waste line;
    ``what`` says how each was counted."""

    kind: str  # "flops" | "bytes"
    flops: float
    bytes: float
    what: str

    @property
    def value(self) -> float:
        return self.flops if self.kind == "flops" else self.bytes


@dataclasses.dataclass(frozen=True)
class Program:
    """One jitted program and its abstract arguments. ``component``: whose state it holds
    ("learner", "engine", "sync"). Its loops' trip counts are read from the compiled
    program (:mod:`~tunix_agentic.aot.loops`); ``per_step``: the program is reported per
    trip of its outermost loop, which ends on data (the decode chunk: up to
    ``engine.decode_steps`` steps, fewer once no slot is live)."""

    name: str
    fn: Any  # a jax.jit-wrapped function
    args: tuple[Any, ...]
    mesh_devices: tuple[Any, ...]
    component: str
    minimum: Minimum
    note: str = ""
    work: Workload = Workload()
    transfer_bytes: int = 0  # a sync to other chips: the bytes moved after the program
    per_step: bool = False


def _on(tree: Any, shardings: Any) -> Any:
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
    )


def _replicated(tree: Any, mesh: Mesh) -> Any:
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(
            x.shape, x.dtype, sharding=NamedSharding(mesh, PartitionSpec())
        ),
        tree,
    )


def tpu_model_config(mc: ModelConfig) -> ModelConfig:
    """``mc`` with its attention resolved for TPU where the project can resolve it
    (:func:`tunix_agentic.models.attention.resolve_attention`), else unchanged."""
    try:
        from tunix_agentic.models.attention import resolve_attention  # type: ignore[import]
    except ImportError:
        return mc
    return dataclasses.replace(mc, attention=resolve_attention(mc.attention, "tpu"))


def param_count(mc: ModelConfig) -> int:
    model = nnx.eval_shape(lambda: Transformer(mc, rngs=nnx.Rngs(0)))
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def _matmul_params(mc: ModelConfig) -> int:
    """Parameters a token multiplies by in a matmul: the weight matrices, but an untied
    embedding (a lookup); not the norms' scales (elementwise, which the op-by-op count
    of a program with loops leaves out, :mod:`~tunix_agentic.aot.ops`)."""
    model = nnx.eval_shape(lambda: Transformer(mc, rngs=nnx.Rngs(0)))
    n = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)) if x.ndim >= 2)
    return n if mc.tie_embeddings else n - mc.vocab_size * mc.d_model


def _attention_flops(mc: ModelConfig, rows: int, length: int, context: int) -> float:
    """Forward attention FLOPs: QK^T and PV over ``context`` keys for ``rows x length``
    queries (2 FLOPs a multiply-add, every head, every layer)."""
    return 4.0 * rows * length * context * mc.num_heads * mc.head_dim * mc.num_layers


def _causal_attention_flops(mc: ModelConfig, rows: int, length: int) -> float:
    """Forward attention FLOPs of ``rows`` causal rows of ``length`` tokens: query ``i``
    attends to its ``i + 1`` keys, ``length (length + 1) / 2`` pairs a row."""
    return _attention_flops(mc, rows, 1, length * (length + 1) / 2)


def shard_bytes(tree: Any) -> int:
    """Bytes per chip of abstract arrays (the largest shard of each)."""
    total = 0
    for x in jax.tree.leaves(tree):
        sharding = getattr(x, "sharding", None)
        shape = sharding.shard_shape(x.shape) if sharding is not None else x.shape
        total += int(np.prod(shape)) * x.dtype.itemsize
    return total


def learner_programs(cfg: RunConfig, mc: ModelConfig, topo: Topology) -> list[Program]:
    """The GRPO train step as :class:`~tunix_agentic.learners.grpo.GRPOLearner` jits it,
    for the recipe's rows (``groups_per_batch x group_size``, padded to the row multiple)
    and its longest row (``engine.max_seq_len`` in the learner's length bucket)."""
    lc = cfg.learner
    mesh = topo.mesh(lc.mesh, "learner.mesh")
    box: dict[str, GRPOLearner] = {}

    def build():
        learner = GRPOLearner(Transformer(mc, rngs=nnx.Rngs(0)), lc, seed=cfg.seed, mesh=mesh)
        box["learner"] = learner
        s = learner.state
        return s.params, s.opt_state, learner.ref_params, learner.base

    state = jax.eval_shape(build)
    state = _on(state, tree_shardings(state, mesh))  # GRPOLearner places them so
    learner = box["learner"]
    multiple = learner.row_multiple()
    rows = cfg.rollout.groups_per_batch * cfg.rollout.group_size
    rows = -(-rows // multiple) * multiple
    length = bucket_length(cfg.engine.max_seq_len, lc.length_bucket, geometric=True)

    def b(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=batch_sharding(mesh, len(shape)))

    batch = GRPOBatch(
        b((rows, length), jnp.int32),
        b((rows, length), jnp.float32),
        b((rows, length), jnp.float32),
        b((rows,), jnp.float32),
        b((rows,), jnp.float32),
        b((rows, length), jnp.float32),  # constrained: what a run's batches hold
    )
    n_micro = rows // (lc.micro_batch_rows or rows)
    chips = mesh.devices.size
    # Forward 2, backward 4 (2 for LoRA: no weight gradients of the frozen base); remat
    # runs each layer's forward again (2 x the layers' parameters: not the output head,
    # which is outside the rematerialised layers). A reference model (KL) one forward more.
    head = mc.vocab_size * mc.d_model
    matmul = _matmul_params(mc)
    per_token = 4 if lc.lora.enabled else 6
    flops = per_token * matmul + (2 * (matmul - head) if lc.remat else 0)
    attn = _causal_attention_flops(mc, rows, length) * (4 if lc.remat else 3)
    if state[2] is not None:  # the reference model's forward
        flops += 2 * matmul
        attn += _causal_attention_flops(mc, rows, length)
    # Bytes: the state read once and written once, the batch read once.
    params, opt_state, ref, base = state
    least_bytes = 2 * shard_bytes((params, opt_state)) + shard_bytes((ref, base, batch))
    minimum = Minimum(
        "flops",
        (flops * rows * length + attn) / chips,
        least_bytes,
        f"{per_token} x params x tokens"
        + (" (LoRA: no weight gradients)" if lc.lora.enabled else "")
        + (", the layers' forward again (remat)" if lc.remat else "")
        + (", the reference's forward" if state[2] is not None else "")
        + " + causal attention; the state read and written once",
    )
    fn = learner._step.__wrapped__  # the jit (CompileCounter.wrap keeps it as __wrapped__)
    out = [
        Program(
            f"learner.train_step[rows={rows},len={length}]",
            fn,
            (*state, batch),
            tuple(mesh.devices.flat),
            "learner",
            minimum,
            note=f"{n_micro} micro-batches of {rows // n_micro} rows",
        )
    ]
    if lc.mi_pairs > 0:
        out.append(_pair_scores_program(mc, learner, state, mesh, length))
    out.append(_sync_program(cfg, mc, topo, learner, state, mesh))
    return out


def _pair_scores_program(mc, learner: GRPOLearner, state, mesh: Mesh, length: int) -> Program:
    """The collapse diagnostic's scoring (``learner.mi_pairs > 0``, every ``mi_every``-th
    step): ``mi_pairs**2`` rows, padded like a batch, at the longest row."""
    params, _, _, base = state
    n = learner.config.mi_pairs**2
    rows = -(-n // learner.row_multiple()) * learner.row_multiple()
    ids = jax.ShapeDtypeStruct((rows, length), jnp.int32, sharding=batch_sharding(mesh, 2))
    mask = jax.ShapeDtypeStruct((rows, length), jnp.float32, sharding=batch_sharding(mesh, 2))
    chips = mesh.devices.size
    flops = 2 * _matmul_params(mc) * rows * length + _causal_attention_flops(mc, rows, length)
    return Program(
        f"learner.pair_scores[rows={rows},len={length}]",
        learner._pair_scores.__wrapped__,
        (params, base, ids, mask),
        tuple(mesh.devices.flat),
        "learner",
        Minimum(
            "flops",
            flops / chips,
            shard_bytes((params, base, ids, mask)),
            "2 x params x tokens + causal attention; the weights read once",
        ),
        note=f"every learner.mi_every={learner.config.mi_every} steps",
    )


def _sync_program(cfg, mc, topo, learner: GRPOLearner, state, mesh: Mesh) -> Program:
    """The learner's side of a weight sync (:meth:`GRPOLearner.params_for_engine`: adapters
    merged or the master copy cast to the model's dtypes), placed on the engine's shardings
    when both share chips; across chips the reshard that follows is a transfer of the
    result (``jax.device_put``), not a program."""
    params, _, _, base = state
    engine_mesh = topo.mesh(cfg.engine.mesh, "engine.mesh")
    model_params = _model_params(mc)
    same = set(engine_mesh.devices.flat) == set(mesh.devices.flat)
    target = engine_mesh if same else mesh
    out_shardings = tree_shardings(model_params, target)
    if base is not None:
        fn = jax.jit(learner._merge.__wrapped__, out_shardings=out_shardings)
        args: tuple[Any, ...] = (params, base)
    else:
        dtypes = jax.tree.map(lambda x: x.dtype, model_params)
        fn = jax.jit(
            lambda p: jax.tree.map(lambda x, dt: x.astype(dt), p, dtypes),
            out_shardings=out_shardings,
        )
        args = (params,)
    weights = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(model_params))
    chips = mesh.devices.size
    read = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(args))
    return Program(
        "weight_sync",
        fn,
        args,
        tuple(mesh.devices.flat),
        "sync",
        Minimum(
            "bytes",
            0.0,
            (read + weights) / chips,
            "read the learner's weights, write the engine's",
        ),
        note="" if same else f"then {weights / 2**30:.2f} GiB moved to the engine's chips",
        transfer_bytes=0 if same else weights,
    )


def _model_params(mc: ModelConfig) -> Any:
    model = nnx.eval_shape(lambda: Transformer(mc, rngs=nnx.Rngs(0)))
    return nnx.split(model, nnx.Param)[1]


def sft_programs(cfg: RunConfig, mc: ModelConfig, topo: Topology) -> list[Program]:
    """The SFT warm start's step (:class:`~tunix_agentic.learners.sft.SFTTrainer`: one
    chip), ``sft.batch_size`` rows of ``engine.max_seq_len`` tokens (packed rows' positions
    and segments too, at ``sft.pack``); none at ``sft.steps: 0``."""
    if cfg.sft.steps == 0:
        return []
    device = topo.devices[0]
    box: dict[str, TrainState] = {}

    def build():
        opt = make_optimizer(cfg.sft.optimizer)
        st = TrainState(
            Transformer(mc, rngs=nnx.Rngs(0)), opt, master_dtype=cfg.sft.optimizer.master_dtype
        )
        box["state"] = st
        return st.params, st.opt_state

    state = jax.eval_shape(build)
    single = jax.sharding.SingleDeviceSharding(device)
    state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=single), state)
    st = box["state"]
    rows, length = cfg.sft.batch_size, cfg.engine.max_seq_len
    ids = jax.ShapeDtypeStruct((rows, length), jnp.int32, sharding=single)
    mask = jax.ShapeDtypeStruct((rows, length), jnp.float32, sharding=single)
    # Packed rows (sft.pack) carry each segment's positions and ids; at most batch_size rows.
    packed = (
        (jax.ShapeDtypeStruct((rows, length), jnp.int32, sharding=single),) * 2
        if cfg.sft.pack
        else ()
    )
    fn = jax.jit(functools.partial(sft_step, st.graphdef, st.optimizer), donate_argnums=(0, 1))
    flops = 6 * _matmul_params(mc) * rows * length + 3 * _causal_attention_flops(mc, rows, length)
    least_bytes = 2 * shard_bytes(state) + shard_bytes((ids, mask, *packed))
    return [
        Program(
            f"sft.train_step[rows={rows},len={length}]",
            fn,
            (*state, SFTBatch(ids, mask, *packed)),
            (device,),
            "learner",
            Minimum(
                "flops",
                flops,
                least_bytes,
                "6 x params x tokens + causal attention; the state read and written once",
            ),
        )
    ]


def engine_programs(
    cfg: RunConfig, mc: ModelConfig, topo: Topology, *, all_shapes: bool = False
) -> list[Program]:
    """The engine's prefill and decode as its scheduler jits them (cache and state
    donated), on ``engine.mesh``: every warm-up shape with ``all_shapes``, else the
    largest prefill (most rows, longest bucket) and the decode at the longest window,
    which set the engine's peak memory and its slowest step."""
    ec = cfg.engine
    mesh = topo.mesh(ec.mesh, "engine.mesh")
    paged = ec.kv_layout == "paged"
    model = nnx.eval_shape(lambda: Transformer(mc, rngs=nnx.Rngs(0)))
    graphdef, params = nnx.split(model, nnx.Param)
    params = _on(params, tree_shardings(params, mesh))
    if paged:
        cache = jax.eval_shape(lambda: init_paged_cache(mc, ec.num_kv_blocks, ec.kv_block_size))
    else:
        chunks = cache_chunks(ec.max_seq_len, ec.window_buckets())
        cache = jax.eval_shape(lambda: init_cache(mc, ec.max_slots, ec.max_seq_len, chunks))
    kv_sharding = cache_sharding(mesh, mc.num_kv_heads, pages=paged and kernel_pages(mc))
    cache = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=kv_sharding), cache
    )
    state = _replicated(
        jax.eval_shape(lambda: DecodeState.fresh(ec.max_slots, ec.max_seq_len)), mesh
    )
    step = StepConfig(graphdef, ec.max_seq_len, ec.decode_steps, paged=paged)
    prefill_jit = jax.jit(functools.partial(prefill, step), donate_argnums=(1, 2))
    decode_jit = jit_decode(step)
    devices = tuple(mesh.devices.flat)
    chips = mesh.devices.size
    head = mc.vocab_size * mc.d_model  # the output layer (tied: the embedding, once)
    matmul = _matmul_params(mc)
    weights = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
    shape = {}
    if paged:
        shape = {"table_width": ec.blocks_per_seq, "num_blocks": ec.num_kv_blocks}
    kv_token = 2 * mc.num_layers * mc.num_kv_heads * mc.head_dim * jnp.dtype(mc.dtype).itemsize
    kv_shards = chips if mc.num_kv_heads % chips == 0 else 1
    lengths, rows_list = ec.length_buckets(), ec.row_buckets()
    windows = ec.window_buckets()
    if not all_shapes:
        lengths, rows_list, windows = lengths[-1:], rows_list[-1:], windows[-1:]
    out = []
    for length in lengths:
        for rows in rows_list:
            batch = _replicated(
                PrefillBatch.host(
                    rows, length, num_slots=ec.max_slots, max_seq_len=ec.max_seq_len, **shape
                ),
                mesh,
            )
            # Logits only at each row's last token: the output layer once a row.
            flops = 2 * (matmul - head) * rows * length + 2 * head * rows
            flops += _causal_attention_flops(mc, rows, length)
            written = rows * length * kv_token / kv_shards
            out.append(
                Program(
                    f"engine.prefill[rows={rows},len={length}]",
                    prefill_jit,
                    (params, cache, state, batch),
                    devices,
                    "engine",
                    Minimum(
                        "flops",
                        flops / chips,
                        weights / chips + written,
                        "2 x params x tokens + causal attention, logits at the last; "
                        "the weights read once, the rows' KV written once",
                    ),
                    work=Workload(kv_len=length),
                )
            )
    s = ec.max_slots
    for window in windows:
        args = (
            params,
            cache,
            state,
            _replicated(jax.ShapeDtypeStruct((s,), jnp.bool_), mesh),
            _replicated(RowSampling.host(s), mesh),
            _replicated(jax.ShapeDtypeStruct((s, shape.get("table_width", 0)), jnp.int32), mesh),
        )
        # Live KV: every slot's window, but never more than a paged pool holds.
        held = ec.num_kv_blocks * ec.kv_block_size if paged else s * window
        live_kv = min(s * window, held) * kv_token / kv_shards
        out.append(
            Program(
                f"engine.decode[slots={s},window={window}]",
                _DecodeAt(decode_jit, window),
                args,
                devices,
                "engine",
                Minimum(
                    "bytes",
                    (2 * matmul * s + _attention_flops(mc, s, 1, window)) / chips,
                    weights / chips + live_kv,
                    "2 x params a slot + attention over the window; "
                    "weights once + live KV once, a step",
                ),
                note=f"per decode step (a call runs up to {ec.decode_steps})",
                work=Workload(kv_len=window),
                per_step=True,
            )
        )
    return out


@dataclasses.dataclass(frozen=True)
class _DecodeAt:
    """The decode jit with its static window bound (``lower(*args)`` like a jit)."""

    jitted: Callable
    window: int

    def lower(self, *args):
        return self.jitted.lower(*args, self.window)
