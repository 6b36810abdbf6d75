"""Learners: GRPO and SFT in Flax NNX + optax, with pure advantage and loss functions."""

from learners.advantages import get_advantage_fn
from learners.batching import grpo_batch, pad_rows
from learners.grpo import GRPOConfig, GRPOLearner
from learners.losses import grpo_loss
from learners.sft import SFTTrainer
from learners.state import OptimizerConfig, TrainState

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
