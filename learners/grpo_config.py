"""What the GRPO learner is configured with (the ``learner:`` section of a run): the
algorithm by name, its coefficients, micro-batching, the mesh and LoRA, each checked
with an error that names the field."""

from __future__ import annotations

import dataclasses
import warnings

from tunix_agentic.learners.advantages import get_advantage_fn
from tunix_agentic.learners.configs import (
    AGGREGATIONS,
    Aggregation,
    KLEstimator,
    KLPenalty,
    LoRAConfig,
    OffPolicyMask,
    OptimizerConfig,
    OverlongMode,
    PolicyLossConfig,
    PolicyLossType,
    check_finite,
    check_overlong,
)
from tunix_agentic.mesh_config import MeshConfig
from tunix_agentic.trajectory import CONSTRAINED_TOKENS, ConstrainedTokens


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    optimizer: OptimizerConfig = OptimizerConfig(learning_rate=1e-4)
    # Advantage estimator by name (learners/advantages.py): grpo, grpo_bessel, dr_grpo, rloo
    # (within a group), reinforce, reinforce_pp, erpo (over the batch).
    advantage: str = "grpo"
    # How token losses become the batch's loss (learners/losses.py: aggregate): "token_mean"
    # (every token alike, DAPO), "seq_mean_token_mean" (per row, then over rows: GRPO),
    # "seq_mean_token_sum_norm" (token sums over rows x norm_length: Dr. GRPO).
    aggregation: Aggregation = "token_mean"
    # "ppo": token ratios (PPO / GRPO); "gspo": one sequence-level ratio per row (GSPO).
    loss_type: PolicyLossType = "ppo"
    clip_low: float = 0.2  # the ratio's trust region is [1 - clip_low, 1 + clip_high]; [0, 1)
    clip_high: float = 0.28  # >= 0; 0.28 > clip_low is DAPO's clip-higher
    dual_clip: float = 0.0  # > 1: a negative advantage's loss is capped at -c * A
    kl_coef: float = 0.0  # off by default (StarPO-S)
    kl_estimator: KLEstimator = "k3"  # k1 / k2 / k3 (Schulman 2020)
    kl_penalty: KLPenalty = "loss"  # "loss": a loss term; "reward": folded into the advantage
    # TRL's default: the k3 KL weighted by the ratio to the sampling policy.
    kl_ratio_corrected: bool = False
    entropy_coef: float = 0.0  # an entropy bonus
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
    # Beyond TIS: drop rows ("sequence") or tokens ("token", IcePop) whose learner/sampler
    # probability ratio leaves [off_policy_low, off_policy_high].
    off_policy_mask: OffPolicyMask = "none"
    off_policy_low: float = 0.5  # the kept band's lower end, in (0, 1] (IcePop's 0.5)
    off_policy_high: float = 2.0  # the kept band's upper end, >= 1 (IcePop's 2)
    # Truncated responses (DAPO): "mask" trains nothing on them; "penalty" lowers the
    # reward linearly from 0 at overlong_max_len - overlong_cache_len to -1 at max_len.
    overlong: OverlongMode = "none"
    overlong_max_len: int = 0  # "penalty": generated tokens (all turns) where it reaches -1
    overlong_cache_len: int = 0  # "penalty": tokens it takes to fall from 0 to -1; <= max_len
    # Tokens sampled under a grammar (a forced tool call, response_format: Step.constrained)
    # were drawn from the masked distribution, whose logprob is recorded. "train" (the
    # default) trains on them: the ratio to that recorded logprob is the importance
    # correction, so a token the grammar fixed (the unmasked policy gave it little) weighs
    # little and a free choice inside the structure (an argument's value) weighs fully.
    # "mask": they stay in the row as context only (loss mask 0).
    constrained_tokens: ConstrainedTokens = "train"
    # Rows are padded to this width x 1, 1.5, 2, 3, 4, 6, ... (learners/batching.py:
    # bucket_length): at most a third padding, about two compiled shapes per doubling.
    length_bucket: int = 32
    # Gradient accumulation: rows per micro-batch (0: the whole batch at once); the update
    # equals the whole batch's. The batch's row count must be a multiple of it.
    micro_batch_rows: int = 0
    remat: bool = False  # recompute each layer's activations in the backward pass
    # Collapse diagnostic (RAGEN-2): score k responses against k distinct prompts (k*k
    # forward rows, about a fifth of a small step) every mi_every-th train step, the first
    # included; mi_pairs 0 turns it off.
    mi_pairs: int = 4
    mi_every: int = 10  # the diagnostic runs every this many train steps; >= 1
    # Devices of the learner (tunix_agentic.sharding): fsdp x tp, and which devices
    # ("start:stop"); the default is one device. Colocated with the engine when both name
    # the same devices, disaggregated when they name different ones.
    mesh: MeshConfig = MeshConfig()
    # Low-rank adapters (rank > 0): only they are trained; the engine gets them merged.
    lora: LoRAConfig = LoRAConfig()

    def __post_init__(self):
        check_finite(self, "learner")
        try:
            get_advantage_fn(self.advantage)
        except ValueError as exc:
            raise ValueError(f"learner.advantage: {exc}") from None
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(
                f"learner.aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}"
            )
        self.policy_loss  # noqa: B018 - validates the loss's fields
        if self.norm_length < 0:
            raise ValueError(f"learner.norm_length must be >= 0, got {self.norm_length}")
        if not self.temperature > 0:
            raise ValueError(f"learner.temperature must be > 0, got {self.temperature}")
        check_overlong(
            self.overlong, self.overlong_max_len, self.overlong_cache_len, prefix="learner."
        )
        if self.loss_type == "gspo" and max(self.clip_low, self.clip_high) > 0.01:
            warnings.warn(
                f"learner.loss_type=gspo with clip_low={self.clip_low}, "
                f"clip_high={self.clip_high}: a sequence-level ratio rarely leaves so wide a "
                "band (GSPO uses about 3e-4 and 4e-4), so there is little trust region",
                stacklevel=2,
            )
        if self.constrained_tokens not in CONSTRAINED_TOKENS:
            raise ValueError(
                f"learner.constrained_tokens must be one of {CONSTRAINED_TOKENS}, "
                f"got {self.constrained_tokens!r}"
            )
        if self.length_bucket < 2 or self.length_bucket % 2:
            raise ValueError(
                f"learner.length_bucket must be an even number >= 2, got {self.length_bucket}"
            )
        for name in ("micro_batch_rows", "mi_pairs"):
            if getattr(self, name) < 0:
                raise ValueError(f"learner.{name} must be >= 0, got {getattr(self, name)}")
        if self.mi_pairs == 1:
            raise ValueError("learner.mi_pairs must be 0 (off) or >= 2, got 1")
        if self.mi_every < 1:
            raise ValueError(f"learner.mi_every must be >= 1, got {self.mi_every}")

    @property
    def policy_loss(self) -> PolicyLossConfig:
        return PolicyLossConfig(
            loss_type=self.loss_type,
            clip_low=self.clip_low,
            clip_high=self.clip_high,
            dual_clip=self.dual_clip,
            kl_coef=self.kl_coef,
            kl_estimator=self.kl_estimator,
            kl_ratio_corrected=self.kl_ratio_corrected,
            kl_penalty=self.kl_penalty,
            entropy_coef=self.entropy_coef,
            tis_cap=self.tis_cap,
            off_policy_mask=self.off_policy_mask,
            off_policy_low=self.off_policy_low,
            off_policy_high=self.off_policy_high,
        )

    @property
    def uses_proximal(self) -> bool:
        """The decoupled objective: the ratio is to the learner's own pre-update policy and
        the sampler's logprobs only weigh or mask (TIS, off-policy masking)."""
        return self.tis_cap > 0 or self.off_policy_mask != "none"
