"""Supervised fine-tuning (the warm start): masked next-token cross-entropy."""

from __future__ import annotations

import functools

import jax
from flax import nnx

from tunix_agentic.compiles import CompileCounter
from tunix_agentic.learners.batching import SFTBatch
from tunix_agentic.learners.grpo_step import sft_step
from tunix_agentic.learners.state import OptimizerConfig, TrainState, make_optimizer


class SFTTrainer:
    """``train_step(SFTBatch)`` -> {"loss", "token_accuracy"}; the step is
    :func:`~tunix_agentic.learners.grpo_step.sft_step`, jitted once, donating.

    ``loss_mask[t]`` selects which tokens are targets (the assistant's turns).
    """

    def __init__(self, model: nnx.Module, optimizer: OptimizerConfig = OptimizerConfig()):
        self.state = TrainState(
            model, make_optimizer(optimizer), master_dtype=optimizer.master_dtype
        )
        self.compiles = CompileCounter()
        step = functools.partial(sft_step, self.state.graphdef, self.state.optimizer)
        self._step = self.compiles.wrap("train_step", jax.jit(step, donate_argnums=(0, 1)))

    def train_step(self, batch: SFTBatch) -> dict[str, float]:
        s = self.state
        s.params, s.opt_state, metrics = self._step(s.params, s.opt_state, batch)
        s.step += 1
        return {k: float(v) for k, v in metrics.items()}
