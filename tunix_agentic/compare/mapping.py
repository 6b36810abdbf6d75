"""How a run's GRPO settings map onto TRL's ``GRPOConfig``, and what cannot be mapped.

:func:`trl_mapping` reads a :class:`~tunix_agentic.config.RunConfig` and returns the
keyword arguments for ``trl.GRPOConfig`` (TRL 1.16) with, for each, the field of ours it
comes from, plus the known semantic differences that apply to this run, by name. Nothing
here imports TRL or torch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tunix_agentic.config import RunConfig

# Our learner.aggregation -> TRL's loss_type (single process, one optimizer step per
# generation batch, so TRL's "dapo" and "bnpo" both normalise by the batch's token count).
LOSS_TYPES = {
    "token_mean": "dapo",
    "seq_mean_token_mean": "grpo",
    "seq_mean_token_sum_norm": "dr_grpo",
}
# Our learner.advantage -> TRL's scale_rewards (both centre on the group mean).
SCALE_REWARDS = {"grpo": "group", "grpo_bessel": "group", "dr_grpo": "none"}

# Every difference we know of, by name: what a gap between the two sides may come from.
KNOWN_DIFFERENCES = {
    "bessel_std": "advantages: our 'grpo' divides by the population std of the group (ddof=0) "
    "+ 1e-6, TRL by the Bessel-corrected std (ddof=1) + 1e-4 (ours 'grpo_bessel' matches "
    "the std); advantages differ by sqrt((G-1)/G), the loss scales with them",
    "advantage_epsilon": "advantages: std + 1e-6 (ours) vs std + 1e-4 (TRL)",
    "masked_rows": "seq_mean_token_mean / TRL 'grpo': we average over rows that have trained "
    "tokens, TRL over all rows (a row with no trained token adds 0 and still counts)",
    "dr_grpo_normaliser": "seq_mean_token_sum_norm / TRL 'dr_grpo': we divide by (rows with "
    "tokens) x (learner.norm_length, or the padded width when 0), TRL by (all rows) x "
    "max_completion_length",
    "kl_estimator": "TRL's KL term is k3 added to the loss; learner.kl_estimator / kl_penalty "
    "other than k3 / loss have no TRL equivalent",
    "advantage_estimator": "TRL only centres on the group mean (scale_rewards group|none); "
    "this advantage estimator has no TRL equivalent",
    "single_turn": "TRL plays the single-turn form of the task: one completion, scored by our "
    "environment's reward for that completion (no tool is run, no second turn)",
    "lr_schedule": "our warmup/cosine schedule is approximated by TRL's lr_scheduler_type",
    "lora": "LoRA adapters on our side map to a peft LoraConfig on TRL's",
    "off_policy": "truncated importance sampling / off-policy masks / dual clip have no "
    "mapping: TRL runs without them",
    "entropy_bonus": "the entropy bonus is a token mean on both sides, applied after the "
    "policy term's aggregation on TRL's",
}


@dataclasses.dataclass(frozen=True)
class Mapped:
    """One TRL argument and the setting of ours it comes from."""

    trl: str
    value: Any
    ours: str


@dataclasses.dataclass(frozen=True)
class TRLMapping:
    """``GRPOConfig`` arguments for TRL and the named differences that apply to this run."""

    args: tuple[Mapped, ...]
    differences: tuple[str, ...]  # names in KNOWN_DIFFERENCES
    lora: dict[str, Any] | None  # peft LoraConfig arguments, or None for full fine-tuning

    def kwargs(self) -> dict[str, Any]:
        return {m.trl: m.value for m in self.args}

    def loss_semantics_match(self, batch_has_empty_rows: bool) -> bool:
        """Whether our loss and TRL's are the same function of one batch (same
        advantages, old and reference logprobs fed to both)."""
        if {"kl_estimator", "off_policy", "entropy_bonus"} & set(self.differences):
            return False
        if "dr_grpo_normaliser" in self.differences:
            return False
        return not ("masked_rows" in self.differences and batch_has_empty_rows)

    def lines(self) -> list[str]:
        """The mapping as printable lines (``trl_arg = value  <- our.field``)."""
        out = [f"{m.trl} = {m.value!r}  <- {m.ours}" for m in self.args]
        if self.lora:
            out.append(f"peft LoraConfig{self.lora!r}  <- learner.lora")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "args": {m.trl: {"value": m.value, "ours": m.ours} for m in self.args},
            "lora": self.lora,
            "differences": {name: KNOWN_DIFFERENCES[name] for name in self.differences},
        }


def trl_mapping(cfg: RunConfig) -> TRLMapping:
    """TRL's ``GRPOConfig`` arguments for ``cfg`` (one optimizer step per batch of
    ``groups_per_batch`` prompts x ``group_size`` completions, ``rl.steps`` steps).

    Raises ``ValueError`` naming the field when a setting cannot be played by TRL at all
    (an aggregation TRL has no loss type for).
    """
    lr, ro, ag, opt = cfg.learner, cfg.rollout, cfg.agent, cfg.learner.optimizer
    if lr.aggregation not in LOSS_TYPES:
        raise ValueError(
            f"learner.aggregation={lr.aggregation!r} has no TRL loss_type; "
            f"comparable: {sorted(LOSS_TYPES)}"
        )
    diffs: list[str] = []
    loss_type = LOSS_TYPES[lr.aggregation]
    max_len = ag.max_new_tokens
    if loss_type == "grpo":
        diffs.append("masked_rows")
    if loss_type == "dr_grpo" and lr.norm_length != max_len:
        diffs.append("dr_grpo_normaliser")
    scale = SCALE_REWARDS.get(lr.advantage)
    if scale is None:
        diffs.append("advantage_estimator")
        scale = "group"
    if lr.advantage == "grpo":
        diffs.append("bessel_std")
    if scale == "group":
        diffs.append("advantage_epsilon")
    if lr.kl_coef > 0 and (lr.kl_estimator != "k3" or lr.kl_penalty != "loss"):
        diffs.append("kl_estimator")
    if lr.tis_cap > 0 or lr.off_policy_mask != "none" or lr.dual_clip > 0:
        diffs.append("off_policy")
    if lr.entropy_coef > 0:
        diffs.append("entropy_bonus")
    if ag.max_turns > 1:
        diffs.append("single_turn")
    schedule = "constant"
    if opt.decay_steps:
        schedule = "cosine"
        diffs.append("lr_schedule")
    elif opt.warmup_steps:
        schedule = "constant_with_warmup"
    args = [
        Mapped("seed", cfg.seed, "seed"),
        Mapped("num_generations", ro.group_size, "rollout.group_size"),
        Mapped(
            "per_device_train_batch_size",
            ro.group_size * ro.groups_per_batch,
            "rollout.group_size x rollout.groups_per_batch",
        ),
        Mapped("gradient_accumulation_steps", 1, "(one update per batch)"),
        Mapped("steps_per_generation", 1, "(one update per batch)"),
        Mapped("num_iterations", 1, "(one update per batch)"),
        Mapped("max_steps", cfg.rl.steps, "rl.steps"),
        # The dataset holds our train stream's first tasks in order: unshuffled, TRL's step k
        # draws the prompts our step k draws (ours may take a step's groups in the order
        # they finish, within rollout.max_staleness).
        Mapped("shuffle_dataset", False, "(our task stream's order)"),
        Mapped("learning_rate", opt.learning_rate, "learner.optimizer.learning_rate"),
        Mapped("lr_scheduler_type", schedule, "learner.optimizer.warmup_steps / decay_steps"),
        Mapped("warmup_steps", opt.warmup_steps, "learner.optimizer.warmup_steps"),
        Mapped("weight_decay", opt.weight_decay, "learner.optimizer.weight_decay"),
        Mapped("adam_beta1", opt.b1, "learner.optimizer.b1"),
        Mapped("adam_beta2", opt.b2, "learner.optimizer.b2"),
        Mapped("max_grad_norm", opt.max_grad_norm, "learner.optimizer.max_grad_norm"),
        Mapped("loss_type", loss_type, "learner.aggregation"),
        Mapped("scale_rewards", scale, "learner.advantage"),
        Mapped("epsilon", lr.clip_low, "learner.clip_low"),
        Mapped("epsilon_high", lr.clip_high, "learner.clip_high"),
        Mapped("beta", lr.kl_coef, "learner.kl_coef"),
        Mapped("use_bias_correction_kl", lr.kl_ratio_corrected, "learner.kl_ratio_corrected"),
        Mapped(
            "importance_sampling_level",
            "sequence" if lr.loss_type == "gspo" else "token",
            "learner.loss_type",
        ),
        Mapped("entropy_coef", lr.entropy_coef, "learner.entropy_coef"),
        Mapped("mask_truncated_completions", lr.overlong == "mask", "learner.overlong"),
        # TRL's GRPOConfig turns activation recomputation on by default; ours is off.
        Mapped("gradient_checkpointing", lr.remat, "learner.remat"),
        Mapped("max_completion_length", max_len, "agent.max_new_tokens"),
        Mapped("temperature", ag.temperature, "agent.temperature"),
        Mapped("top_p", ag.top_p, "agent.top_p"),
        Mapped("top_k", ag.top_k, "agent.top_k"),
    ]
    lora = None
    if lr.lora.enabled:
        diffs.append("lora")
        lora = {
            "r": lr.lora.rank,
            "lora_alpha": lr.lora.alpha,
            "target_modules": list(lr.lora.targets),  # HF module names already
            "lora_dropout": 0.0,
        }
    return TRLMapping(tuple(args), tuple(diffs), lora)
