"""The one place that decides how arrays are laid out across devices.

A mesh has two axes: ``fsdp`` (fully sharded data parallel: the batch's rows and
each weight's model dimension are split over it) and ``tp`` (tensor parallel:
heads, the MLP's hidden units and the vocabulary are split over it). Which
array dimension goes on which mesh axis is written once, in two tables:

- :data:`PARAM_AXES`: each parameter's *logical* axes, by the last two names of
  its path (``("q_proj", "kernel") -> ("embed", "heads")``). The same names
  match the optimizer's moments, a float32 master copy and a reference copy,
  whose paths end the same way; anything not in the table (norm scales, LoRA
  adapters, step counters) is replicated.
- :data:`DEFAULT_RULES`: logical axis -> mesh axis.

A dimension that the mesh axis does not divide evenly stays replicated, so any
model runs on any mesh (only its memory saving shrinks). The learner
(:class:`tunix_agentic.learners.grpo.GRPOLearner`) and the engine
(:class:`tunix_agentic.inference.engine.JaxEngine`) both take a mesh and place
their arrays with :func:`shard_tree`; weight sync to an engine on other
devices is a ``jax.device_put`` to the engine's shardings (:func:`reshard`).

Multi-host: call :func:`initialize_distributed` in every process before
building anything; ``jax.devices()`` is then every process's devices and
:func:`make_mesh` spans them all.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from tunix_agentic.mesh_config import MeshConfig, _parse_range  # noqa: F401  (re-exported)

AXES = ("fsdp", "tp")

# (module name, parameter name) -> the logical axis of each dimension.
PARAM_AXES: dict[tuple[str, str], tuple[str | None, ...]] = {
    ("embed", "embedding"): ("vocab", "embed"),
    ("lm_head", "kernel"): ("embed", "vocab"),
    ("q_proj", "kernel"): ("embed", "heads"),
    ("k_proj", "kernel"): ("embed", "kv_heads"),
    ("v_proj", "kernel"): ("embed", "kv_heads"),
    ("o_proj", "kernel"): ("heads", "embed"),
    ("gate_proj", "kernel"): ("embed", "mlp"),
    ("up_proj", "kernel"): ("embed", "mlp"),
    ("down_proj", "kernel"): ("mlp", "embed"),
}

# Logical axis -> mesh axis (None: replicated).
DEFAULT_RULES: dict[str, str | None] = {
    "batch": "fsdp",  # a batch's rows (learner rows, engine slots)
    "embed": "fsdp",  # FSDP: every weight's model dimension
    "vocab": "tp",
    "heads": "tp",
    "kv_heads": "tp",
    "mlp": "tp",
}


_ONE_DEVICE = MeshConfig()


def make_mesh(cfg: MeshConfig = _ONE_DEVICE, devices: Sequence[Any] | None = None) -> Mesh:
    """A ``(fsdp, tp)`` mesh over ``devices`` (default: ``cfg.devices`` of ``jax.devices()``)."""
    if devices is None:
        devices = jax.devices()
        if cfg.devices:
            devices = devices[_parse_range(cfg.devices)]
    devices = list(devices)
    fsdp = len(devices) // cfg.tp if cfg.fsdp == -1 else cfg.fsdp
    if fsdp < 1 or fsdp * cfg.tp != len(devices):
        raise ValueError(
            f"mesh fsdp={cfg.fsdp} x tp={cfg.tp} does not fit {len(devices)} device(s)"
            + (f" (mesh.devices={cfg.devices!r})" if cfg.devices else "")
        )
    grid = np.asarray(devices, dtype=object).reshape(fsdp, cfg.tp)
    return Mesh(grid, AXES, axis_types=(AxisType.Auto, AxisType.Auto))


def _names(path: tuple[Any, ...]) -> list[str]:
    out = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                out.append(str(getattr(key, attr)))
                break
        else:
            out.append(str(key))
    return out


def logical_axes(path: tuple[Any, ...], ndim: int) -> tuple[str | None, ...]:
    """A leaf's logical axes from its path (a key path of ``jax.tree_util``); unknown
    leaves get ``None`` on every dimension (replicated)."""
    names = _names(path)
    while names and names[-1] == "value":  # an nnx Variable's array
        names.pop()
    axes = PARAM_AXES.get(tuple(names[-2:])) if len(names) >= 2 else None
    if axes is None or len(axes) != ndim:
        return (None,) * ndim
    return axes


def spec_for(
    axes: Sequence[str | None],
    shape: Sequence[int],
    mesh: Mesh,
    rules: Mapping[str, str | None] = DEFAULT_RULES,
) -> PartitionSpec:
    """The partition spec of one array: each logical axis mapped by ``rules``; a mesh
    axis used twice, or one that does not divide its dimension, leaves it replicated."""
    out: list[str | None] = []
    used: set[str] = set()
    for axis, size in zip(axes, shape, strict=True):
        mesh_axis = rules.get(axis) if axis is not None else None
        if (
            mesh_axis is None
            or mesh_axis in used
            or mesh.shape[mesh_axis] == 1
            or size % mesh.shape[mesh_axis]
        ):
            out.append(None)
            continue
        used.add(mesh_axis)
        out.append(mesh_axis)
    return PartitionSpec(*out)


def tree_shardings(tree: Any, mesh: Mesh, rules: Mapping[str, str | None] = DEFAULT_RULES) -> Any:
    """A ``NamedSharding`` for every array leaf of ``tree`` (parameters, optimizer state,
    master or reference copies), by :data:`PARAM_AXES` and ``rules``."""

    def one(path, leaf):
        shape = np.shape(leaf)
        return NamedSharding(mesh, spec_for(logical_axes(path, len(shape)), shape, mesh, rules))

    return jax.tree_util.tree_map_with_path(one, tree)


def shard_tree(tree: Any, mesh: Mesh, rules: Mapping[str, str | None] = DEFAULT_RULES) -> Any:
    """``tree`` placed on ``mesh`` (fresh arrays where the placement changes)."""
    return jax.device_put(tree, tree_shardings(tree, mesh, rules))


def reshard(tree: Any, like: Any) -> Any:
    """``tree`` moved to the shardings of ``like`` (a tree of arrays or ShapeDtypeStructs
    of the same structure): weight sync between a learner and an engine on different
    devices or meshes."""
    return jax.device_put(tree, jax.tree.map(lambda x: x.sharding, like))


def cache_sharding(mesh: Mesh, num_kv_heads: int, *, pages: bool = False) -> NamedSharding:
    """An engine's KV cache (``[slots, kv_heads, max_len, head_dim]`` per layer, or with
    ``pages`` the ragged paged attention kernel's ``[blocks, block_size, 2 x kv_heads,
    head_dim]``): kv-heads over ``tp`` where it divides them, the rest replicated."""
    if pages:  # K/V pairs adjacent: a contiguous split keeps each kv head's pair whole
        spec = spec_for((None, None, "kv_heads", None), (1, 1, num_kv_heads, 1), mesh)
    else:
        spec = spec_for((None, "kv_heads", None, None), (1, num_kv_heads, 1, 1), mesh)
    return NamedSharding(mesh, spec)


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Rows over ``fsdp``, everything else replicated."""
    return NamedSharding(mesh, PartitionSpec("fsdp", *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def put_batch(batch: Any, mesh: Mesh) -> Any:
    """A host batch (a pytree of arrays, rows first: a ``GRPOBatch``, a dict, a tuple)
    placed with rows over ``fsdp``; each row count must be a multiple of the mesh's
    ``fsdp`` size. Every process passes the same global batch (multi-host: each keeps only
    its devices' rows)."""
    fsdp = mesh.shape["fsdp"]

    def place(path, value):
        arr = np.asarray(value)
        if arr.shape[0] % fsdp:
            raise ValueError(
                f"batch{jax.tree_util.keystr(path)} has {arr.shape[0]} rows, not a multiple "
                f"of the mesh's fsdp size {fsdp} (pad the rows: learner num_rows)"
            )
        sharding = batch_sharding(mesh, arr.ndim)
        return jax.make_array_from_callback(arr.shape, sharding, lambda idx, a=arr: a[idx])

    return jax.tree_util.tree_map_with_path(place, batch)


def initialize_distributed(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> None:
    """Join a multi-process JAX job (``jax.distributed.initialize``).

    Arguments default to ``TUNIX_COORDINATOR`` (host:port), ``TUNIX_NUM_PROCESSES``
    and ``TUNIX_PROCESS_ID``; on TPU pods and SLURM JAX finds them itself when all
    are unset. On CPU the processes talk through gloo collectives.
    """
    coordinator = coordinator or os.environ.get("TUNIX_COORDINATOR")
    if num_processes is None and "TUNIX_NUM_PROCESSES" in os.environ:
        num_processes = int(os.environ["TUNIX_NUM_PROCESSES"])
    if process_id is None and "TUNIX_PROCESS_ID" in os.environ:
        process_id = int(os.environ["TUNIX_PROCESS_ID"])
    # CPU devices need a collectives backend to talk across processes (no effect on
    # accelerators).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=coordinator, num_processes=num_processes, process_id=process_id
    )
