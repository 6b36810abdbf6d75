"""Parameters, optimizer state and step of one trainable model, kept functional.

The NNX model is split once into a static graph definition and a parameter
pytree; jitted steps take and return the pytrees (donated), which keeps the
train step pure and makes checkpointing and weight sync plain tree operations.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh

from tunix_agentic.learners.configs import OptimizerConfig  # noqa: F401  (re-exported)
from tunix_agentic.sharding import shard_tree, tree_shardings


def make_optimizer(cfg: OptimizerConfig) -> optax.GradientTransformation:
    lr: Any = cfg.learning_rate
    if cfg.decay_steps:
        lr = optax.warmup_cosine_decay_schedule(
            0.0 if cfg.warmup_steps else cfg.learning_rate,
            cfg.learning_rate,
            cfg.warmup_steps,
            cfg.warmup_steps + cfg.decay_steps,
            end_value=cfg.learning_rate * cfg.final_lr_fraction,
        )
    elif cfg.warmup_steps:
        lr = optax.linear_schedule(0.0, cfg.learning_rate, cfg.warmup_steps)
    return optax.chain(
        optax.clip_by_global_norm(cfg.max_grad_norm),
        optax.adamw(lr, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay),
    )


class TrainState:
    """graphdef + params + optimizer state + step for one model."""

    def __init__(
        self,
        model: nnx.Module,
        optimizer: optax.GradientTransformation,
        *,
        trainable: Any = None,
        master_dtype: str = "",
        mesh: Mesh | None = None,
    ):
        """``trainable``: the tree to optimise instead of the model's parameters (LoRA
        adapters); ``params`` then holds it, and ``graphdef`` still the model's graph.
        ``master_dtype="float32"``: the parameters are kept (and optimised) in float32;
        :meth:`params_for_model` gives them back in the model's own dtypes. ``mesh``: the
        parameters are sharded first (:mod:`tunix_agentic.sharding`), then cast, and the
        optimizer state is created sharded."""
        self.graphdef, params = nnx.split(model, nnx.Param)
        self.model_dtypes = jax.tree.map(lambda x: x.dtype, params)
        params = params if trainable is None else trainable
        if mesh is not None:  # sharded before the float32 copy and the moments exist
            params = shard_tree(params, mesh)
        if trainable is None and master_dtype:
            params = jax.tree.map(lambda x: x.astype(master_dtype), params)  # keeps shardings
        self.params = params
        self.optimizer = optimizer
        if mesh is None:
            self.opt_state = optimizer.init(params)
        else:  # born sharded: the moments never exist whole on one device
            shardings = tree_shardings(jax.eval_shape(optimizer.init, params), mesh)
            self.opt_state = jax.jit(optimizer.init, out_shardings=shardings)(params)
        self.step = 0

    def model(self) -> nnx.Module:
        """A module view of the current parameters (shares no buffers that a step donates)."""
        return nnx.merge(self.graphdef, self.params_for_model())

    def params_copy(self) -> Any:
        """A copy of the parameters that stays valid after the next (donating) step."""
        return jax.tree.map(jnp.copy, self.params)

    def params_for_model(self) -> Any:
        """A copy of the parameters in the model's own dtypes (a float32 master copy cast
        back), valid after the next (donating) step."""
        return jax.tree.map(lambda x, dt: jnp.array(x, dtype=dt), self.params, self.model_dtypes)

    def load(self, params: Any, opt_state: Any | None, step: int) -> None:
        self.params = params
        if opt_state is not None:
            self.opt_state = opt_state
        self.step = int(step)


def apply_gradients(optimizer: optax.GradientTransformation, params, opt_state, grads):
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state
