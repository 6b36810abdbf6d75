"""The GRPO learner: one jitted, donating train step over padded, masked arrays.

The step optionally splits the batch's rows into micro-batches and accumulates their
gradients (``learner.micro_batch_rows``): every loss term is row-local and weighed by
whole-batch normalisers (:func:`~tunix_agentic.learners.losses.aggregation_weights`), so
the update equals the whole batch's. With a mesh (:mod:`tunix_agentic.sharding`) the
parameters and optimizer state are sharded by the logical-axis rules and the rows over
``fsdp``.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from tunix_agentic.compiles import CompileCounter
from tunix_agentic.learners.advantages import get_advantage_fn
from tunix_agentic.learners.batching import GRPOBatch, pad_batch_rows
from tunix_agentic.learners.diagnostics import cross_pairs, mi_from_scores
from tunix_agentic.learners.grpo_config import GRPOConfig
from tunix_agentic.learners.grpo_step import StepSpec, full_params, pair_scores, train_step
from tunix_agentic.learners.lora import init_adapters
from tunix_agentic.learners.memory import fit_micro_batch, free_bytes
from tunix_agentic.learners.state import TrainState, make_optimizer
from tunix_agentic.sharding import (
    make_mesh,
    put_batch,
    replicated,
    shard_tree,
    tree_shardings,
)


class GRPOLearner:
    """Holds the policy's train state; ``train_step(batch)`` returns float metrics.

    ``batch`` (a :class:`~tunix_agentic.learners.batching.GRPOBatch`) comes from
    :func:`tunix_agentic.learners.batching.grpo_batch`; the step is the pure
    :func:`tunix_agentic.learners.grpo_step.train_step`. With ``kl_coef >
    0`` a frozen copy of the initial parameters serves as the reference policy. With
    ``lora.rank > 0`` the model's parameters are frozen (``base``) and only adapters are
    trained (``state.params``); :meth:`params_for_engine` returns them merged.

    ``mesh`` (default: from ``config.mesh``; none for one device): shard parameters,
    optimizer state and reference by :mod:`tunix_agentic.sharding`'s rules and the batch's
    rows over ``fsdp`` (the row count must then be a multiple of the fsdp size, and of
    ``micro_batch_rows``; :meth:`row_multiple`).
    """

    def __init__(
        self,
        model: nnx.Module,
        config: GRPOConfig = GRPOConfig(),
        *,
        seed: int = 0,
        mesh: Mesh | None = None,
    ):
        self.config = config
        if mesh is None and not config.mesh.trivial:
            mesh = make_mesh(config.mesh)
        self.mesh = mesh
        optimizer = make_optimizer(config.optimizer)
        self.base = None
        if config.lora.enabled:
            _, base = nnx.split(model, nnx.Param)
            self.base = jax.tree.map(jnp.copy, base)
            if mesh is not None:
                self.base = shard_tree(self.base, mesh)
            adapters = init_adapters(self.base, config.lora, jax.random.key(seed))
            self.state = TrainState(model, optimizer, trainable=adapters, mesh=mesh)
        else:
            self.state = TrainState(
                model, optimizer, master_dtype=config.optimizer.master_dtype, mesh=mesh
            )
        step_kwargs: dict[str, Any] = {}
        if mesh is not None:
            step_kwargs["out_shardings"] = (
                tree_shardings(self.state.params, mesh),
                tree_shardings(self.state.opt_state, mesh),
                replicated(mesh),
            )
        # The KL reference: the policy as it starts. Under LoRA that is the frozen base itself
        # (fresh adapters add nothing; neither is donated, so no copy is needed).
        self.ref_params = None
        if config.kl_coef > 0:
            self.ref_params = self.base if self.base is not None else self.state.params_copy()
        self.advantage_fn = get_advantage_fn(config.advantage)
        self.spec = StepSpec(self.state.graphdef, config, self.state.optimizer)
        # Compilations per jitted function (tests pin them): "train_step", "pair_scores".
        self.compiles = CompileCounter()
        step = functools.partial(train_step, self.spec)
        self._step = self.compiles.wrap(
            "train_step",
            jax.jit(step, donate_argnums=(0, 1), static_argnames=("micro",), **step_kwargs),
        )
        # Per batch shape (rows, width): the micro-batch that fits, the rows padded to a
        # multiple of it, and the step compiled for them (learners/memory.py).
        self._fitted: dict[tuple[int, int], tuple[int, int, Any]] = {}
        self._merge = jax.jit(functools.partial(full_params, lora=config.lora))
        self._pair_scores = self.compiles.wrap(
            "pair_scores",
            jax.jit(
                functools.partial(pair_scores, self.spec),
                **({"out_shardings": replicated(mesh)} if mesh is not None else {}),
            ),
        )

    def row_multiple(self) -> int:
        """A batch's row count must be a multiple of this (micro-batches, fsdp shards)."""
        fsdp = self.mesh.shape["fsdp"] if self.mesh is not None else 1
        return math.lcm(fsdp, self.config.micro_batch_rows or 1)

    def collapse_metrics(self, batch: GRPOBatch, pad_id: int = 0) -> dict[str, float]:
        """RAGEN-2's mutual-information proxy on up to ``mi_pairs`` responses of distinct
        prompts: how well each response picks out its own prompt under the current policy
        (:mod:`tunix_agentic.learners.diagnostics`). Empty when fewer than two distinct
        prompts have responses."""
        k = self.config.mi_pairs
        ids, mask = np.asarray(batch.input_ids), np.asarray(batch.loss_mask)
        seen, keep = set(), []
        for i in range(ids.shape[0]):
            on = np.flatnonzero(mask[i] > 0)
            if on.size and (prompt := ids[i, : on[0]].tobytes()) not in seen:
                seen.add(prompt)
                keep.append(i)
            if len(keep) == k:
                break
        if len(keep) < 2:
            return {}
        # Padded like training rows (few compiled shapes), rows to a multiple of the fsdp
        # size so they split over the mesh like a batch.
        pair_ids, pair_mask = cross_pairs(
            ids[keep], mask[keep], len(keep), pad_id, self.config.length_bucket, geometric=True
        )
        n = len(keep) * len(keep)
        rows = -(-n // self.row_multiple()) * self.row_multiple()
        pair_ids = np.pad(pair_ids, ((0, rows - n), (0, 0)), constant_values=pad_id)
        pair_mask = np.pad(pair_mask, ((0, rows - n), (0, 0)))
        if self.mesh is not None:
            pair_ids, pair_mask = put_batch((pair_ids, pair_mask), self.mesh)
        scores = np.asarray(self._pair_scores(self.state.params, self.base, pair_ids, pair_mask))[
            :n
        ].reshape(len(keep), len(keep))
        return {f"collapse/{k}": float(v) for k, v in mi_from_scores(scores).items()}

    def train_step(self, batch: GRPOBatch, *, pad_id: int = 0) -> dict[str, float]:
        """One update (:func:`~tunix_agentic.learners.grpo_step.train_step`, jitted and
        donating); float metrics, the collapse diagnostic's included on every
        ``mi_every``-th step (the first included)."""
        s = self.state
        due = self.config.mi_pairs and s.step % self.config.mi_every == 0
        extra = self.collapse_metrics(batch, pad_id) if due else {}
        shape = tuple(np.shape(batch.input_ids))
        if shape not in self._fitted:
            self._fitted[shape] = self._fit(batch, pad_id)
        _, rows, step = self._fitted[shape]
        batch = self._placed(pad_batch_rows(batch, rows, pad_id))
        s.params, s.opt_state, metrics = step(
            s.params, s.opt_state, self.ref_params, self.base, batch
        )
        s.step += 1
        return {**{k: float(v) for k, v in metrics.items()}, **extra}

    def _placed(self, batch: GRPOBatch) -> GRPOBatch:
        return batch if self.mesh is None else put_batch(batch, self.mesh)

    def _fit(self, batch: GRPOBatch, pad_id: int) -> tuple[int, int, Any]:
        """The step for ``batch``'s shape, compiled at the largest micro-batch (from
        ``micro_batch_rows``, or the whole batch, halving) whose memory fits the devices'
        (:func:`~tunix_agentic.learners.memory.fit_micro_batch`)."""
        rows, width = np.shape(batch.input_ids)
        s = self.state
        devices = self.mesh.devices.flat if self.mesh is not None else jax.devices()[:1]

        def rows_for(micro: int) -> int:  # the rows padded to a multiple of the micro-batch
            return -(-rows // micro) * micro if micro < rows else rows

        def compile_for(micro: int) -> Any:
            placed = self._placed(pad_batch_rows(batch, rows_for(micro), pad_id))
            with self.compiles.counting("train_step"):
                lowered = self._step.__wrapped__.lower(
                    s.params, s.opt_state, self.ref_params, self.base, placed, micro=micro
                )
                return lowered.compile()

        micro, step = fit_micro_batch(
            compile_for,
            rows=rows,
            width=width,
            start=self.config.micro_batch_rows or rows,
            multiple=self.row_multiple(),
            free=free_bytes(list(devices)),
        )
        return micro, rows_for(micro), step

    def params_for_engine(self) -> Any:
        """The policy's full parameters, fresh arrays (LoRA adapters merged in)."""
        if self.base is None:
            return self.state.params_for_model()
        return self._merge(self.state.params, self.base)

    def policy_model(self) -> nnx.Module:
        """A module of the current policy (a copy; LoRA adapters merged in)."""
        return nnx.merge(self.state.graphdef, self.params_for_engine())

    def checkpoint_params(self) -> Any:
        """What a checkpoint holds besides the optimizer state: the parameters, or under
        LoRA the frozen base and the adapters (the base may differ from its source, e.g.
        after a warm start)."""
        if self.base is None:
            return self.state.params
        return {"base": self.base, "adapters": self.state.params}

    def load_checkpoint(self, params: Any, opt_state: Any | None, step: int) -> None:
        """Restore what :meth:`checkpoint_params` saved."""
        if self.base is not None:
            self.base, params = params["base"], params["adapters"]
            if self.mesh is not None:
                self.base = shard_tree(self.base, self.mesh)
            if self.ref_params is not None:
                self.ref_params = self.base  # the base the run's adapters were trained on
        if self.mesh is not None:
            params = shard_tree(params, self.mesh)
            if opt_state is not None:
                opt_state = shard_tree(opt_state, self.mesh)
        self.state.load(params, opt_state, step)
