"""The GRPO learner: one jitted, donating train step over padded, masked arrays."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tunix_agentic.learners.advantages import get_advantage_fn
from tunix_agentic.learners.lora import LoRAConfig, init_adapters
from tunix_agentic.learners.lora import merge as lora_merge
from tunix_agentic.learners.losses import AGGREGATIONS, grpo_loss
from tunix_agentic.learners.state import (
    OptimizerConfig,
    TrainState,
    apply_gradients,
    make_optimizer,
)
from tunix_agentic.models.transformer import token_logprobs


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    optimizer: OptimizerConfig = OptimizerConfig(learning_rate=1e-4)
    advantage: str = "grpo"
    aggregation: str = "token_mean"
    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_coef: float = 0.0
    # TRL's default: the k3 KL weighted by the ratio to the sampling policy.
    kl_ratio_corrected: bool = False
    # Dr. GRPO's constant for seq_mean_token_sum_norm (e.g. agent.max_new_tokens x turns);
    # 0: the batch's padded width, which moves with its length bucket.
    norm_length: int = 0
    temperature: float = 1.0  # must match the sampling temperature, so ratios start at 1
    task_normalize: bool = False  # AgentRL task advantage normalisation across the batch
    # With one learner row per step (a sliding-window context): add each step's standardised
    # process return-to-go (StepResult rewards) to the trajectory's advantage.
    turn_advantage: bool = False
    # Truncated importance sampling: > 0 turns on the decoupled objective (ratio to the
    # learner's own pre-update policy, per-token weight min(p_prox / p_sampler, tis_cap)).
    tis_cap: float = 0.0
    # Low-rank adapters (rank > 0): only they are trained; the engine gets them merged.
    lora: LoRAConfig = LoRAConfig()

    def __post_init__(self):
        try:
            get_advantage_fn(self.advantage)
        except ValueError as exc:
            raise ValueError(f"learner.advantage: {exc}") from None
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(
                f"learner.aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}"
            )
        if not 0 <= self.clip_low < 1 or self.clip_high < 0:
            raise ValueError("learner.clip_low must be in [0, 1) and learner.clip_high >= 0")
        if self.tis_cap < 0 or 0 < self.tis_cap < 1:
            raise ValueError(f"learner.tis_cap must be 0 (off) or >= 1, got {self.tis_cap}")
        if self.kl_coef < 0:
            raise ValueError(f"learner.kl_coef must be >= 0, got {self.kl_coef}")
        if self.norm_length < 0:
            raise ValueError(f"learner.norm_length must be >= 0, got {self.norm_length}")
        if not self.temperature > 0:
            raise ValueError(f"learner.temperature must be > 0, got {self.temperature}")


class GRPOLearner:
    """Holds the policy's train state; ``train_step(batch)`` returns float metrics.

    ``batch`` comes from :func:`tunix_agentic.learners.batching.grpo_batch`. With ``kl_coef >
    0`` a frozen copy of the initial parameters serves as the reference policy. With
    ``lora.rank > 0`` the model's parameters are frozen (``base``) and only adapters are
    trained (``state.params``); :meth:`params_for_engine` returns them merged.
    """

    def __init__(self, model: nnx.Module, config: GRPOConfig = GRPOConfig(), *, seed: int = 0):
        self.config = config
        optimizer = make_optimizer(config.optimizer)
        self.base = None
        if config.lora.enabled:
            _, base = nnx.split(model, nnx.Param)
            self.base = jax.tree.map(jnp.copy, base)
            adapters = init_adapters(self.base, config.lora, jax.random.key(seed))
            self.state = TrainState(model, optimizer, trainable=adapters)
        else:
            self.state = TrainState(model, optimizer, master_dtype=config.optimizer.master_dtype)
        # The KL reference: the policy as it starts. Under LoRA that is the frozen base itself
        # (fresh adapters add nothing; neither is donated, so no copy is needed).
        self.ref_params = None
        if config.kl_coef > 0:
            self.ref_params = self.base if self.base is not None else self.state.params_copy()
        self.advantage_fn = get_advantage_fn(config.advantage)
        self.compiles = 0
        self._step = jax.jit(self._step_impl, donate_argnums=(0, 1))
        self._merge = jax.jit(self._full)

    def _full(self, params, base):
        """The policy's full parameter tree: ``params`` itself, or base + merged adapters."""
        if base is None:
            return params
        return lora_merge(base, params, self.config.lora.scale)

    def _logprobs(self, params, input_ids):
        model = nnx.merge(self.state.graphdef, params)
        b, t = input_ids.shape
        positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        logits, _ = model(input_ids, positions)
        logits = logits[:, :-1] / self.config.temperature
        return logits, token_logprobs(logits, input_ids[:, 1:])

    def _step_impl(self, params, opt_state, ref_params, base, batch):
        self.compiles += 1  # counted while tracing only
        cfg = self.config
        ids = batch["input_ids"]
        mask = batch["loss_mask"][:, 1:]
        old = batch["old_logprobs"][:, 1:]
        ref = None
        if ref_params is not None:
            ref = jax.lax.stop_gradient(self._logprobs(ref_params, ids)[1])
        behaviour = None
        if cfg.tis_cap > 0:  # the sampler's logprobs weigh; the ratio is to our own policy
            behaviour = old
            old = jax.lax.stop_gradient(self._logprobs(self._full(params, base), ids)[1])

        def loss_fn(p):
            logits, lp = self._logprobs(self._full(p, base), ids)
            loss, aux = grpo_loss(
                lp,
                old,
                batch["advantages"],
                mask,
                clip_low=cfg.clip_low,
                clip_high=cfg.clip_high,
                aggregation=cfg.aggregation,
                ref_logprobs=ref,
                kl_coef=cfg.kl_coef,
                behaviour_logprobs=behaviour,
                tis_cap=cfg.tis_cap,
                norm_length=cfg.norm_length,
                kl_ratio_corrected=cfg.kl_ratio_corrected,
            )
            probs = jax.nn.softmax(logits, axis=-1)
            entropy = -jnp.sum(probs * jax.nn.log_softmax(logits, axis=-1), axis=-1)
            aux["entropy"] = jnp.sum(entropy * mask) / jnp.maximum(jnp.sum(mask), 1.0)
            return loss, aux

        (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        aux["grad_norm"] = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads)))
        params, opt_state = apply_gradients(self.state.optimizer, params, opt_state, grads)
        return params, opt_state, {"loss": loss, **aux}

    def train_step(self, batch: dict[str, np.ndarray]) -> dict[str, float]:
        s = self.state
        s.params, s.opt_state, metrics = self._step(
            s.params, s.opt_state, self.ref_params, self.base, batch
        )
        s.step += 1
        return {k: float(v) for k, v in metrics.items()}

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
            if self.ref_params is not None:
                self.ref_params = self.base  # the base the run's adapters were trained on
        self.state.load(params, opt_state, step)
