"""Learners: GRPO and SFT in Flax NNX + optax, with pure advantage and loss functions.

The names below load on first use (:mod:`tunix_agentic.lazy`): importing a config module
of this package (``configs``, ``grpo_config``) never loads JAX."""

from tunix_agentic.lazy import lazy_exports

_API = {
    "GRPOConfig": "tunix_agentic.learners.grpo_config",
    "GRPOLearner": "tunix_agentic.learners.grpo",
    "OptimizerConfig": "tunix_agentic.learners.configs",
    "SFTTrainer": "tunix_agentic.learners.sft",
    "TrainState": "tunix_agentic.learners.state",
    "get_advantage_fn": "tunix_agentic.learners.advantages",
    "grpo_batch": "tunix_agentic.learners.batching",
    "grpo_loss": "tunix_agentic.learners.losses",
    "pad_rows": "tunix_agentic.learners.batching",
}
__all__ = sorted(_API)
__getattr__, __dir__ = lazy_exports(__name__, _API, globals())
