"""The learners' settings as configured (optimizer, LoRA, policy loss, overlong rows): plain
Python, no JAX, so a run config loads where JAX is not wanted (rollout nodes). The
modules that use them (state, lora, losses, batching) re-export them."""

from __future__ import annotations

import dataclasses
import math
from typing import Literal, get_args


def check_finite(cfg: object, section: str) -> None:
    """ValueError naming the first float field of ``cfg`` that is NaN or infinite (a
    range check alone lets NaN through: every comparison with it is false)."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{section}.{f.name} must be a finite number, got {value}")


# The optimizer's master copy of low-precision weights: none (""), or float32.
MasterDtype = Literal["", "float32"]


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    learning_rate: float = 3e-4  # AdamW's peak learning rate; > 0
    weight_decay: float = 0.0  # AdamW's decoupled weight decay, on every trained parameter
    max_grad_norm: float = 1.0  # gradients are clipped to this global L2 norm first; > 0
    # Steps over which the learning rate rises linearly from 0 to learning_rate; 0: none.
    warmup_steps: int = 0
    # > 0: after the warm-up, a cosine decay to ``learning_rate * final_lr_fraction`` over
    # this many steps (then constant); 0: constant after the warm-up.
    decay_steps: int = 0
    # The decay's end as a fraction of learning_rate, in [0, 1]; used only with decay_steps.
    final_lr_fraction: float = 0.0
    b1: float = 0.9  # Adam's decay rate of the gradient's moving average
    b2: float = 0.99  # Adam's decay rate of the squared gradient's moving average
    # "float32": keep a float32 master copy of bfloat16/float16 weights (the optimizer's
    # state too); the model still computes in its own dtype and the engine gets its dtype
    # back. "": train the weights in their own dtype (small steps round away in bf16).
    master_dtype: MasterDtype = ""

    def __post_init__(self):
        check_finite(self, "optimizer")
        if not self.learning_rate > 0:
            raise ValueError(f"optimizer.learning_rate must be > 0, got {self.learning_rate}")
        if self.weight_decay < 0:
            raise ValueError(f"optimizer.weight_decay must be >= 0, got {self.weight_decay}")
        if not self.max_grad_norm > 0:
            raise ValueError(f"optimizer.max_grad_norm must be > 0, got {self.max_grad_norm}")
        if self.warmup_steps < 0 or self.decay_steps < 0:
            raise ValueError(
                "optimizer.warmup_steps and optimizer.decay_steps must be >= 0, got "
                f"{self.warmup_steps} and {self.decay_steps}"
            )
        if self.master_dtype not in get_args(MasterDtype):
            raise ValueError(
                f"optimizer.master_dtype must be '' or 'float32', got {self.master_dtype!r}"
            )
        if not 0.0 <= self.final_lr_fraction <= 1.0:
            raise ValueError(
                f"optimizer.final_lr_fraction must be in [0, 1], got {self.final_lr_fraction}"
            )


ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
    """``rank`` 0 turns LoRA off (full fine-tuning)."""

    rank: int = 0  # the adapters' rank r; 0: off
    alpha: float = 16.0  # the adapters' output is scaled by alpha / rank; > 0
    # The linear layers that get adapters: a non-empty subset of q_proj, k_proj, v_proj,
    # o_proj, gate_proj, up_proj, down_proj.
    targets: tuple[str, ...] = ALL_LINEAR

    def __post_init__(self):
        if self.rank < 0:
            raise ValueError(f"lora.rank must be >= 0, got {self.rank}")
        if not self.alpha > 0:
            raise ValueError(f"lora.alpha must be > 0, got {self.alpha}")
        unknown = set(self.targets) - set(ALL_LINEAR)
        if unknown or not self.targets:
            raise ValueError(
                f"lora.targets must be a non-empty subset of {ALL_LINEAR}, got {self.targets}"
            )

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


# The closed choices of the learner's losses (each is an if/else in learners/losses.py, not
# a registry), and the names the validation messages list.
Aggregation = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
PolicyLossType = Literal["ppo", "gspo"]
KLEstimator = Literal["k1", "k2", "k3"]
KLPenalty = Literal["loss", "reward"]
OffPolicyMask = Literal["none", "sequence", "token"]
AGGREGATIONS: tuple[Aggregation, ...] = get_args(Aggregation)
POLICY_LOSS_TYPES: tuple[PolicyLossType, ...] = get_args(PolicyLossType)
KL_ESTIMATORS: tuple[KLEstimator, ...] = get_args(KLEstimator)
KL_PENALTIES: tuple[KLPenalty, ...] = get_args(KLPenalty)
OFF_POLICY_MASKS: tuple[OffPolicyMask, ...] = get_args(OffPolicyMask)


@dataclasses.dataclass(frozen=True)
class PolicyLossConfig:
    """The knobs of :func:`policy_loss` (hashable: a static argument under jit).

    The defaults reproduce the plain clipped surrogate of :func:`grpo_loss`.

    - ``loss_type``: "ppo" (token ratios) or "gspo" (one sequence ratio per row).
    - ``clip_low``/``clip_high``: the ratio's trust region ``[1 - low, 1 + high]``.
    - ``dual_clip``: c > 1 caps a negative-advantage token's loss at ``-c * A``; 0 is off.
    - ``kl_coef``/``kl_estimator``/``kl_ratio_corrected``/``kl_penalty``: the KL to a
      reference policy, as a loss term ("loss") or folded into the advantage by the caller
      with :func:`kl_penalized_advantages` ("reward").
    - ``entropy_coef``: an entropy bonus (the loss subtracts ``coef * entropy``).
    - ``tis_cap``: truncated importance weights ``min(p_prox / p_behaviour, tis_cap)``.
    - ``off_policy_mask``/``off_policy_low``/``off_policy_high``: drop whole rows
      ("sequence") or tokens ("token", IcePop) whose proximal/behaviour ratio leaves
      ``[off_policy_low, off_policy_high]``.
    """

    loss_type: PolicyLossType = "ppo"
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float = 0.0
    kl_coef: float = 0.0
    kl_estimator: KLEstimator = "k3"
    kl_ratio_corrected: bool = False
    kl_penalty: KLPenalty = "loss"
    entropy_coef: float = 0.0
    tis_cap: float = 0.0
    off_policy_mask: OffPolicyMask = "none"
    off_policy_low: float = 0.5
    off_policy_high: float = 2.0

    def __post_init__(self):
        check_finite(self, "learner")
        for field, known in (
            ("loss_type", POLICY_LOSS_TYPES),
            ("kl_estimator", KL_ESTIMATORS),
            ("kl_penalty", KL_PENALTIES),
            ("off_policy_mask", OFF_POLICY_MASKS),
        ):
            if getattr(self, field) not in known:
                raise ValueError(
                    f"learner.{field} must be one of {known}, got {getattr(self, field)!r}"
                )
        if not 0 <= self.clip_low < 1:
            raise ValueError(f"learner.clip_low must be in [0, 1), got {self.clip_low}")
        if self.clip_high < 0:
            raise ValueError(f"learner.clip_high must be >= 0, got {self.clip_high}")
        if self.dual_clip != 0 and not self.dual_clip > 1:
            raise ValueError(f"learner.dual_clip must be 0 (off) or > 1, got {self.dual_clip}")
        if self.kl_coef < 0:
            raise ValueError(f"learner.kl_coef must be >= 0, got {self.kl_coef}")
        if self.entropy_coef < 0:
            raise ValueError(f"learner.entropy_coef must be >= 0, got {self.entropy_coef}")
        if self.tis_cap < 0 or 0 < self.tis_cap < 1:
            raise ValueError(f"learner.tis_cap must be 0 (off) or >= 1, got {self.tis_cap}")
        if not 0 < self.off_policy_low <= 1:
            raise ValueError(f"learner.off_policy_low must be in (0, 1], got {self.off_policy_low}")
        if self.off_policy_high < 1:
            raise ValueError(f"learner.off_policy_high must be >= 1, got {self.off_policy_high}")


# Truncated responses (DAPO): trained on as they are, masked out, or penalised.
OverlongMode = Literal["none", "mask", "penalty"]
OVERLONG_MODES: tuple[OverlongMode, ...] = get_args(OverlongMode)


def check_overlong(overlong: str, max_len: int, cache_len: int, prefix: str = "") -> None:
    """ValueError unless ``overlong`` is a known mode whose penalty settings are DAPO's
    (``0 < cache_len <= max_len``); ``prefix`` names the config section in the message."""
    if overlong not in OVERLONG_MODES:
        raise ValueError(f"unknown {prefix}overlong mode {overlong!r}; known: {OVERLONG_MODES}")
    if overlong == "penalty" and not 0 < cache_len <= max_len:
        raise ValueError(
            f"{prefix}overlong='penalty' needs 0 < overlong_cache_len <= overlong_max_len, "
            f"got {cache_len} and {max_len}"
        )
