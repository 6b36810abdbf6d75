"""Supervised fine-tuning (the warm start): masked next-token cross-entropy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tunix_agentic.learners.losses import masked_cross_entropy
from tunix_agentic.learners.state import (
    OptimizerConfig,
    TrainState,
    apply_gradients,
    make_optimizer,
)
from tunix_agentic.models.transformer import sequence_logprobs


class SFTTrainer:
    """``train_step({"input_ids", "loss_mask"})`` -> {"loss", "token_accuracy"}.

    ``loss_mask[t]`` selects which tokens are targets (the assistant's turns).
    """

    def __init__(self, model: nnx.Module, optimizer: OptimizerConfig = OptimizerConfig()):
        self.state = TrainState(
            model, make_optimizer(optimizer), master_dtype=optimizer.master_dtype
        )
        self._step = jax.jit(self._step_impl, donate_argnums=(0, 1))

    def _step_impl(self, params, opt_state, batch):
        ids = batch["input_ids"]
        mask = batch["loss_mask"][:, 1:]

        def loss_fn(p):
            model = nnx.merge(self.state.graphdef, p)
            lp = sequence_logprobs(model, ids)
            return masked_cross_entropy(lp, mask), lp

        (loss, lp), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        params, opt_state = apply_gradients(self.state.optimizer, params, opt_state, grads)
        # Accuracy proxy: target's probability above one half means it is the argmax.
        acc = jnp.sum((lp > jnp.log(0.5)) * mask) / jnp.maximum(jnp.sum(mask), 1.0)
        return params, opt_state, {"loss": loss, "token_accuracy": acc}

    def train_step(self, batch: dict[str, np.ndarray]) -> dict[str, float]:
        s = self.state
        s.params, s.opt_state, metrics = self._step(s.params, s.opt_state, batch)
        s.step += 1
        return {k: float(v) for k, v in metrics.items()}
