"""Learners: GRPO and SFT in Flax NNX + optax, with pure advantage and loss functions."""

from tunix_agentic.learners.advantages import get_advantage_fn
from tunix_agentic.learners.batching import grpo_batch, pad_rows
from tunix_agentic.learners.grpo import GRPOConfig, GRPOLearner
from tunix_agentic.learners.losses import grpo_loss
from tunix_agentic.learners.sft import SFTTrainer
from tunix_agentic.learners.state import OptimizerConfig, TrainState

__all__ = [
    "GRPOConfig",
    "GRPOLearner",
    "OptimizerConfig",
    "SFTTrainer",
    "TrainState",
    "get_advantage_fn",
    "grpo_batch",
    "grpo_loss",
    "pad_rows",
]
